"""K = 0 without a drafter pass, and exact resume (worker side: draft model, EAGLE, EAGLE-3, MTP, DFlash, DSpark).

vLLM 0.32 runs the drafter's first pass over every request even when a step drafts K = 0,
to keep the drafter's KV cache in sync with the target; so K = 0 costs one drafter forward.
Here a K = 0 step runs no drafter forward at all, and a request that drafts again has its
drafter KV made whole first: one extra drafter pass over the tokens it missed (ragged per
request, like a prefill chunk), before the host's first pass of that step.

The draft model's KV at position p depends on the tokens 0..p only (the draft model reads
token ids, not target hidden states), and its layers use the target's block table, so the
missed positions are recomputed from the request's tokens (``InputBatch.token_ids_cpu``)
into the same slots.  :class:`DrafterSync` keeps, per request, how many leading positions
hold valid drafter KV (``synced``): after a host pass it is the first position that pass
did not write (its valid inputs; the extra next-token slot is not counted, so after a
stretch of n K = 0 steps n positions are recomputed, the first to the values it had); a
new request, a cache hit on a prefix, or a request recomputed after preemption starts at 0
once any step was skipped (their blocks may have been written while the drafter sat out).
Before the first skip nothing is ever caught up: the host's own behaviour, bit for bit.

The skip itself happens one call earlier, in the runner (:func:`skipped_step`, patch
``draft-propose``): a K = 0 step never reaches the drafter.

EAGLE, EAGLE-3 and MTP read the target's hidden states: their drafter KV at position p comes
from (token p+1, the target's hidden state at p).  For them every step keeps the hidden
states the host hands the drafter in a table by KV slot (``runtime/hidden_rows.py``; on a
step the drafter sits out, the rows the host would have handed it), and the catch-up pass
feeds the missed positions their tokens shifted by one and their kept rows (EAGLE-3: through
the head's ``combine_hidden_states``, as the host's first pass does).

DFlash (and DSpark, which drafts on the DFlash proposer) keep their rows the same way, but
their drafter KV at a context position is the K/V projection of the target's hidden state
there alone (``precompute_and_store_context_kv``: no attention, no token): the catch-up writes
that K/V for the missed positions from their kept rows (through ``combine_hidden_states``, as
the host's pass does) and runs no drafter forward.  The query slots a drafting pass writes
(anchor and masks) hold nothing a later step reads before it writes them as context.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.methods import K0_CONTEXT as CONTEXT_METHODS  # context K/V only
from vllm_hust_vspec.methods import K0_HIDDEN as HIDDEN_METHODS  # read target hidden states
from vllm_hust_vspec.methods import K0_SKIPPED as SKIP_METHODS  # K = 0 runs no forward
from vllm_hust_vspec.runtime.drafter_ledger import missed_from, restarted
from vllm_hust_vspec.runtime.hidden_rows import HiddenRows, slots_of

_ATTR = "_vspec_drafter_sync"
logger = logging.getLogger("vllm_hust_vspec")


@dataclasses.dataclass
class DrafterSync:
    """Per-request drafter KV coverage of one drafter, and what skipping did."""

    enabled: bool  # the skip applies to this drafter (can_skip, adaptive_k0_drafter skip)
    synced: dict[str, int] = dataclasses.field(default_factory=dict)
    ever_skipped: bool = False
    steps_skipped: int = 0  # K = 0 steps that ran no drafter forward
    passes_caught_up: int = 0  # extra drafter passes run to resume
    tokens_caught_up: int = 0  # positions those passes recomputed
    rows: HiddenRows | None = None  # EAGLE family: the target's hidden states by KV slot
    faults: int = 0  # faults in the skip or the catch-up (the first one ends the skip)

    def gaps(self, req_ids: Sequence[str], first: np.ndarray) -> list[tuple[int, int, int]]:
        """``(row, start, end)`` for every request of this step whose drafter KV is missing
        at positions ``start..end-1`` before its first input position ``first[row]``."""
        if not self.ever_skipped:
            return []
        out = []
        for row, (rid, p0) in enumerate(zip(req_ids, first.tolist())):
            s = missed_from(self.synced.get(rid), p0)
            if s < p0:
                out.append((row, s, p0))
        return out

    def advance(self, req_ids: Sequence[str], covered: np.ndarray) -> None:
        """After a host pass: each request's drafter KV is valid below ``covered[row]``."""
        for rid, end in zip(req_ids, covered.tolist()):
            self.synced[rid] = int(end)

    def prune(self, live: Any) -> None:
        """Forget requests the runner no longer holds (finished or aborted)."""
        if len(self.synced) > 2 * max(len(live), 8):
            self.synced = {r: s for r, s in self.synced.items() if r in live}


def note_step(runner: Any, scheduler_output: Any) -> None:
    """Every step, before the drafter: the requests it (re)starts lose their account."""
    drafter = runner.__dict__.get("drafter")
    sync = drafter.__dict__.get(_ATTR) if drafter is not None else None
    if sync is not None:
        for rid in restarted(scheduler_output):
            sync.synced.pop(rid, None)


def skipped_step(runner: Any, scheduler_output: Any, inputs: dict[str, Any]) -> Any | None:
    """The drafts of a K = 0 step the drafter sits out (before the host prepares any draft
    input), or None: the host proposes as usual.  The drafts are an empty list, the host's
    list form (as the n-gram proposer's): the runner then copies no draft tensor back and
    the engine core gets no row to hand out (``scheduler.update_draft_token_ids`` sees none,
    and ``schedule()`` already emptied every scheduled request's ``spec_token_ids``).
    ``inputs``: the keyword arguments of ``propose_draft_token_ids`` (an EAGLE-family
    drafter's rows are kept from them).  Called by ``draft-propose`` on the steps that draft
    K = 0 only."""
    drafter = runner.__dict__.get("drafter")
    if getattr(drafter, "method", None) not in SKIP_METHODS:
        return None
    sync = state_of(drafter, runner)
    if not sync.enabled:
        return None
    import torch

    if sync.rows is not None:
        try:
            n = int(scheduler_output.total_num_scheduled_tokens)
            aux = inputs.get("aux_hidden_states")
            if runner.use_aux_hidden_state_outputs and aux is not None:
                hidden = torch.cat([h[:n] for h in aux], dim=-1)
            else:
                hidden = inputs["hidden_states"][:n]
            keep_rows(sync, inputs["common_attn_metadata"], hidden)
        except Exception:  # noqa: BLE001 (never take the engine down: the host's K = 0 runs)
            give_up(sync, "keeping the target's hidden states")
            return None

    sync.ever_skipped = True
    sync.steps_skipped += 1
    runner._draft_probs = None
    runner._draft_prob_req_ids = None
    return []


def state_of(drafter: Any, runner: Any) -> DrafterSync:
    sync = drafter.__dict__.get(_ATTR)
    if sync is None:
        sync = drafter.__dict__[_ATTR] = DrafterSync(enabled=False)
        try:
            enabled = (can_skip(drafter, runner)
                       and settings_mod.from_env().adaptive_k0_drafter == "skip")
            if enabled and drafter.method in HIDDEN_METHODS:
                block_size = int(runner.input_batch.block_table[0].block_size)
                sync.rows = HiddenRows(int(runner.kv_cache_config.num_blocks), block_size)
            sync.enabled = enabled
        except Exception:  # noqa: BLE001 (the host's K = 0 forward runs instead)
            give_up(sync, "setting up")
    return sync


def give_up(sync: DrafterSync, where: str) -> None:
    """A fault in the skip or the catch-up (called inside ``except``): log it once and let
    the host's own drafter run from now on, K = 0 included.  Outputs stay exact (every
    draft is verified); requests that missed positions draft from stale drafter KV until
    they finish, so their acceptance may drop."""
    logger.exception("vllm-hust-vspec: the drafter's K = 0 skip failed (%s); this worker "
                     "runs the host's drafter at every K from now on (outputs are "
                     "unchanged)", where)
    sync.enabled = False
    sync.rows = None
    sync.faults += 1


def can_skip(drafter: Any, runner: Any) -> bool:
    """The skip can apply: a draft-model, EAGLE-family or DFlash drafter, synchronous
    scheduling, no context parallelism, no M-RoPE (the catch-up writes plain positions and
    plain slots); for the EAGLE family also one drafter input slot per token (no parallel
    drafting); for both families that read hidden states the target's vocabulary, no
    multimodal inputs, one KV-cache group, and the target's own hidden states (no
    ``get_mtp_target_hidden_states`` override); for DFlash a model that stores its context
    K/V on its own (``precompute_and_store_context_kv``)."""
    config = drafter.vllm_config
    parallel = config.parallel_config
    plain = (drafter.method in SKIP_METHODS
             and not getattr(config.scheduler_config, "async_scheduling", False)
             and getattr(parallel, "decode_context_parallel_size", 1) == 1
             and getattr(parallel, "prefill_context_parallel_size", 1) == 1
             and not drafter.uses_mrope)
    if not plain or drafter.method not in HIDDEN_METHODS:
        return plain
    model = runner.get_model() if runner is not None else None
    context = drafter.method in CONTEXT_METHODS
    if context and not (hasattr(drafter.model, "precompute_and_store_context_kv")
                        and hasattr(drafter.model, "combine_hidden_states")):
        return False
    # a DFlash block's extra query slots are its own: its context is written apart from them
    return (runner is not None and (context or not drafter.needs_extra_input_slots)
            and not drafter.use_heterogeneous_vocab and not drafter.supports_mm_inputs
            and not hasattr(model, "get_mtp_target_hidden_states")
            and len(runner.input_batch.block_table.block_tables) == 1)


def keep_rows(sync: DrafterSync, cad: Any, hidden: Any) -> None:
    """Keep the target's hidden states of this step's tokens (rows of ``cad``) by KV slot:
    the slots the target wrote their KV to (``cad.slot_mapping``, which the drafter's first
    pass writes too), not recomputed from the block table (that took 1.1 ms a step at
    batch 16 for MTP)."""
    import torch

    n = int(cad.query_start_loc_cpu[cad.batch_size()])
    slots = cad.slot_mapping[:n].to(device=hidden.device, dtype=torch.int64)
    sync.rows.put(slots, hidden[:n])


def propose(original: Any, drafter: Any, runner: Any, inputs: dict[str, Any]) -> Any:
    """The drafter's ``propose`` (``inputs``: its keyword arguments) on a drafting step: a
    catch-up pass first when its requests missed positions, then the host's pass (K = 0
    steps end in the runner, :func:`skipped_step`)."""
    import torch

    if runner is None:
        return original(drafter, **inputs)
    sync = state_of(drafter, runner)
    if not sync.enabled:
        return original(drafter, **inputs)
    try:
        cad = inputs["common_attn_metadata"]
        rows = cad.batch_size()
        starts = cad.query_start_loc_cpu[: rows + 1].numpy().astype(np.int64)
        positions = inputs["target_positions"]
        if sync.rows is not None:
            keep_rows(sync, cad, inputs["target_hidden_states"])
        first = positions[torch.as_tensor(starts[:-1])].cpu().numpy().astype(np.int64)
        req_ids = list(runner.input_batch.req_ids[:rows])
        gaps = sync.gaps(req_ids, first)
        if gaps:
            catch_up(drafter, runner, cad, gaps, sync)
    except Exception:  # noqa: BLE001 (never take the engine down: the host drafts as usual)
        give_up(sync, "catching the drafter up")
        return original(drafter, **inputs)
    drafts = original(drafter, **inputs)
    covered = first + np.diff(starts)
    rejected = inputs.get("num_rejected_tokens_gpu")
    if rejected is not None:
        covered = covered - rejected[:rows].cpu().numpy().astype(np.int64)
    sync.advance(req_ids, covered)
    sync.prune(runner.requests)
    return drafts


def catch_up(drafter: Any, runner: Any, cad: Any, gaps: list[tuple[int, int, int]],
             sync: DrafterSync) -> None:
    """Run the drafter over each gap (positions ``start..end-1`` of its row), writing its KV
    into the request's slots; gaps longer than the drafter's token buffer go in several
    passes, in order."""
    pending = [list(g) for g in gaps]
    limit = int(drafter.max_num_tokens)
    one_pass = _context_pass if drafter.method in CONTEXT_METHODS else _pass
    while pending:
        batch, room = [], limit
        for g in pending:
            if room <= 0:
                break
            take = min(room, g[2] - g[1])
            batch.append((g[0], g[1], g[1] + take))
            g[1] += take
            room -= take
        pending = [g for g in pending if g[1] < g[2]]
        one_pass(drafter, runner, cad, batch, sync.rows)
        sync.passes_caught_up += 1
        sync.tokens_caught_up += sum(e - s for _, s, e in batch)


def _chunk_slots(runner: Any, cad: Any,
                 chunk: list[tuple[int, int, int]]) -> tuple[np.ndarray, Any, Any, Any]:
    """For ``chunk`` (rows of ``cad``, position ranges): the ranges' lengths, the rows'
    block tables, and each position and its KV slot (on the block table's device), in
    chunk order."""
    import torch

    block_size = int(runner.input_batch.block_table[0].block_size)
    rows = [r for r, _, _ in chunk]
    lens = np.array([e - s for _, s, e in chunk], dtype=np.int64)
    pos = np.concatenate([np.arange(s, e, dtype=np.int64) for _, s, e in chunk])
    table = cad.block_table_tensor[torch.as_tensor(rows, device=cad.block_table_tensor.device)]
    owner = torch.as_tensor(np.repeat(np.arange(len(chunk)), lens), device=table.device)
    pos_t = torch.as_tensor(pos, device=table.device)
    return lens, table, pos_t, slots_of(table, owner, pos_t, block_size)


def _pass(drafter: Any, runner: Any, cad: Any, chunk: list[tuple[int, int, int]],
          kept: HiddenRows | None) -> None:
    """One drafter forward over ``chunk`` (rows of ``cad``, position ranges), like a prefill
    chunk of those requests: causal attention over positions 0..end-1 of each.  The draft
    model reads each position's token; the EAGLE family (``kept``: its kept hidden states)
    the next token and the kept row."""
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backend import CommonAttentionMetadata

    device = drafter.input_ids.device
    tokens = runner.input_batch.token_ids_cpu
    lens, table, pos_t, slots = _chunk_slots(runner, cad, chunk)
    slots = slots.to(device)
    ends = np.array([e for _, _, e in chunk], dtype=np.int64)
    shift = 1 if kept is not None else 0
    ids = np.concatenate([tokens[r, s + shift:e + shift] for r, s, e in chunk])
    n = int(lens.sum())
    qsl = torch.as_tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    seq = torch.as_tensor(ends, dtype=torch.int32)
    meta = CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq.to(device),
        num_reqs=len(chunk), num_actual_tokens=n, max_query_len=int(lens.max()),
        max_seq_len=int(ends.max()), block_table_tensor=table.to(device), slot_mapping=slots,
        causal=True, seq_lens_cpu_upper_bound=seq, positions=pos_t.to(device))
    drafter.input_ids[:n] = torch.as_tensor(ids, device=device, dtype=drafter.input_ids.dtype)
    drafter._set_positions(n, pos_t.to(device))
    if kept is not None:
        hidden = kept.get(slots.to(drafter.hidden_states.device))
        if drafter.method == "eagle3":  # as the host's first pass (llm_base_proposer.propose)
            hidden = drafter.model.combine_hidden_states(hidden)
        drafter.hidden_states[:n] = hidden
    _, per_layer = drafter.build_per_group_and_layer_attn_metadata(meta)
    model_kwargs, _ = drafter.build_model_inputs_first_pass(n, n, None)
    with set_forward_context(per_layer, drafter.vllm_config, num_tokens=n,
                             cudagraph_runtime_mode=CUDAGraphMode.NONE,
                             slot_mapping=drafter._get_slot_mapping(n, slots)):
        drafter.model(**model_kwargs)


def _context_pass(drafter: Any, runner: Any, cad: Any, chunk: list[tuple[int, int, int]],
                  kept: HiddenRows | None) -> None:
    """DFlash: the context K/V of ``chunk``'s positions (rows of ``cad``, position ranges)
    from their kept hidden states, written into the requests' slots as the host's pass
    writes the context of its step (``precompute_and_store_context_kv``); no forward."""
    if kept is None:  # DFlash keeps its rows (HIDDEN_METHODS): a caller's error
        raise RuntimeError("the DFlash catch-up needs the kept hidden states")
    device = drafter.input_ids.device
    _, _, pos_t, slots = _chunk_slots(runner, cad, chunk)
    hidden = kept.get(slots.to(kept.table.device))
    model = drafter.model
    model.precompute_and_store_context_kv(model.combine_hidden_states(hidden.to(device)),
                                          pos_t.to(device), slots.to(device))
