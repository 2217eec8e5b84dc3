"""Patch ``DFlashProposer.propose``: DFlash and DSpark resume exactly after K = 0 steps.

What:   sets ``vllm.v1.spec_decode.dflash.DFlashProposer.propose`` (inherited from
        ``SpecDecodeBaseProposer``) to the wrapper of ``drafter-k0``, which hands the call
        to :func:`vllm_hust_vspec.runtime.drafter_sync.propose`: every drafting step keeps
        the target hidden states it hands the drafter (by KV slot,
        ``runtime/hidden_rows.py``), K = 0 steps (which ``draft-propose`` ends before they
        reach the drafter) keep theirs, and before the first drafting step after them the
        context K/V of the positions each request missed is written from the kept rows
        (``precompute_and_store_context_kv``: a DFlash drafter's K/V at a context position
        depends on the target's hidden state there alone), so the drafts are those of a
        drafter that never sat out.  A DSpark draft runs on this proposer
        (``runtime/dspark.py``).
Why:    vLLM 0.32/0.33 run the drafter once at K = 0 to store the step's context (a forward
        of the whole draft model over one query token a request); K = 0 then costs that
        forward over target-only.
Remove: when vLLM skips the drafter at K = 0 and catches it up itself.
"""

from __future__ import annotations

from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_BASE = "vllm.v1.spec_decode.llm_base_proposer"
_RUNNER = "vllm.v1.worker.gpu_model_runner"
_MODEL = "vllm.model_executor.models.qwen3_dflash"
# Applied only where the host has the V1 DFlash proposer.
HOST_MODULE = "vllm.v1.spec_decode.dflash"

SPEC = PatchSpec(
    name="dflash-k0",
    target=Symbol(HOST_MODULE, "DFlashProposer.propose",
                  params=("num_speculative_tokens", "target_token_ids", "target_positions",
                          "target_hidden_states", "common_attn_metadata",
                          "num_rejected_tokens_gpu")),
    requires=(
        Symbol(_BASE, "SpecDecodeBaseProposer.input_ids"),
        Symbol(_BASE, "SpecDecodeBaseProposer.max_num_tokens"),
        Symbol(_BASE, "SpecDecodeBaseProposer.use_heterogeneous_vocab"),
        Symbol(_MODEL, "DFlashQwen3ForCausalLM.precompute_and_store_context_kv",
               params=("context_states", "context_positions", "context_slot_mapping")),
        Symbol(_MODEL, "DFlashQwen3ForCausalLM.combine_hidden_states"),
        Symbol(_RUNNER, "GPUModelRunner.propose_draft_token_ids",
               params=("hidden_states", "aux_hidden_states", "common_attn_metadata")),
        Symbol(_RUNNER, "GPUModelRunner.input_batch"),
        Symbol(_RUNNER, "GPUModelRunner.use_aux_hidden_state_outputs"),
        Symbol("vllm.v1.worker.block_table", "BlockTable.block_size"),
        Symbol("vllm.v1.worker.block_table", "MultiGroupBlockTable.block_tables"),
        Symbol("vllm.v1.attention.backend", "CommonAttentionMetadata.slot_mapping"),
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput.scheduled_new_reqs"),
        Symbol("vllm.v1.core.sched.output", "CachedRequestData.resumed_req_ids"),
    ),
    process=PROCESS_WORKER,
    methods=("dflash", "dspark"),
    why="no drafter forward at K = 0; the missed positions' context K/V is written from the "
        "kept target hidden states before the next draft",
    remove_when="vLLM skips the drafter at K = 0 and catches it up itself",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.patches import drafter_k0

    return drafter_k0.make(original)
