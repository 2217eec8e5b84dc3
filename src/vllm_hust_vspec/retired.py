"""vSpec 0.14 options this release does not keep, each refused with what to use instead.

vSpec 0.14 (``../shared/reference/vspec-0.14-inventory.md``) had launcher flags, TOML
``[serve]`` keys and ``HUST_VSPEC_*`` variables for its own Ascend graph and kernel paths.
They mean nothing on vLLM's own graph modes, so a user who brings one gets one error that
says what it did and what to use here (vLLM's equivalent, one of ours, or nothing), from the
flag (``--x`` or ``--no-x``), the TOML key or the environment: never an unknown-argument
message, never a silent no-op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Retired:
    name: str  # the TOML [serve] key; the flag is --name-with-dashes
    reason: str
    env: tuple[str, ...] = ()  # vSpec's environment names for it

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_GRAPHS = ("vLLM captures the drafter inside its own graph modes: use --graph-mode "
           "(full-decode-only, full-and-piecewise, full) and --capture-policy or "
           "--capture-sizes; a CPU host runs eager")
_EAGLE = ("an internal switch of vSpec's Ascend EAGLE backend; here vLLM's own EAGLE / "
          "EAGLE-3 proposer runs, with the K the controller chooses: drop it")
_TRACE = ("a tensor dump of vSpec's Ascend backends; here --adaptive-trace-file records "
          "every decision and what each step then did: drop it")

RETIRED: tuple[Retired, ...] = (
    Retired("adaptive_gamma0_mode",
            "vSpec's K = 0 modes have no counterpart here: 'sticky' latched the whole cohort "
            "at K = 0 until it drained, 'sync' ran a drafter step at K = 0; here a K = 0 "
            "step runs no drafter forward and every request resumes on its own, its drafter "
            "caught up first (--adaptive-k0-drafter run keeps vLLM's K = 0 drafter forward); "
            "drop the flag", ("HUST_VSPEC_ADAPTIVE_GAMMA0_MODE",)),
    Retired("merged_full",
            "vSpec's merged FULL ACL graph of the draft model's steps on Ascend; " + _GRAPHS,
            ("HUST_VSPEC_USE_MERGED_FULL",)),
    Retired("merged_full_max_batch",
            "the largest batch of vSpec's merged FULL draft graph on Ascend; " + _GRAPHS,
            ("HUST_VSPEC_MERGED_FULL_MAX_BATCH",)),
    Retired("shared_tokenizer_padding",
            "vSpec padded the draft vocabulary to the target's on Ascend when both shared a "
            "tokenizer; vLLM's draft_model method takes a drafter that uses the target's "
            "tokenizer as it is: drop it", ("HUST_VSPEC_SHARED_TOKENIZER_PADDING",)),
    Retired("draft_parallel_graph_updates",
            "threads that updated the draft ACL graphs' parameters on Ascend; " + _GRAPHS,
            ("HUST_VSPEC_DRAFT_PARALLEL_GRAPH_UPDATES",)),
    Retired("draft_target_parallel_graph_updates",
            "threads that updated the target ACL graphs' parameters on Ascend; " + _GRAPHS,
            ("HUST_VSPEC_DRAFT_TARGET_PARALLEL_GRAPH_UPDATES",)),
    Retired("mtp_strict_graph",
            "made an MTP decode step that would run eager an error on Ascend; here the "
            "capture sizes cover every verify width the controller can choose, and "
            + _GRAPHS, ("HUST_VSPEC_MTP_STRICT_GRAPH",)),
    Retired("graph_event_ordering",
            "ordered the drafter's and the target's ACL graph events on Ascend; vLLM orders "
            "its own graph replays: drop it"),
    Retired("eagle_uniform_state_kernel",
            "an Ascend kernel for EAGLE's per-step state in vSpec's host fork; " + _EAGLE),
    Retired("eagle_spec_metadata_cache", _EAGLE),
    Retired("eagle_preserve_target_hidden", _EAGLE),
    Retired("eagle_isolate_shared_modules", _EAGLE),
    Retired("eagle_tree_graph_commit", _EAGLE),
    Retired("eagle_zero_draft_kv_first_step", _EAGLE),
    Retired("eagle_target_width",
            "vSpec's fixed target width for EAGLE, which it refused with adaptive K; here "
            "the verify width is K + 1, chosen each step: drop it"),
    Retired("eagle_tree_width",
            "tree drafting, which vSpec refused with adaptive K; here K is chosen per step "
            "on a chain of drafts, and tree drafting is not supported: drop it",
            ("HUST_VSPEC_EAGLE_TREE_WIDTH",)),
    Retired("adaptive_full_graph",
            "vSpec's adaptive K under FULL graphs (off: graph mode piecewise); here the "
            "controller runs under every graph mode vLLM runs, the capture sizes covering "
            "each verify width (--capture-policy): drop it", ("HUST_VSPEC_ADAPTIVE_FULL_GRAPH",)),
    Retired("adaptive_async",
            "vSpec's adaptive K under asynchronous scheduling (off: --no-async-scheduling); "
            "here use --async-scheduling / --no-async-scheduling (vLLM's own)",
            ("HUST_VSPEC_ADAPTIVE_ASYNC",)),
    Retired("draft_exact_repetition_topk",
            "vSpec's Triton kernels for greedy drafts under a repetition penalty on Ascend; "
            "vLLM's sampler and rejection sampler apply the penalty exactly: drop it",
            ("HUST_VSPEC_DRAFT_EXACT_REPETITION_TOPK",)),
    Retired("draft_exact_repetition_sync_proof",
            "a check of vSpec's repetition-penalty kernels on Ascend; vLLM's sampler and "
            "rejection sampler apply the penalty exactly: drop it",
            ("HUST_VSPEC_DRAFT_EXACT_REPETITION_SYNC_PROOF",)),
    Retired("draft_exact_repetition_trace", _TRACE, ("HUST_VSPEC_DRAFT_EXACT_REPETITION_TRACE",)),
    Retired("eagle_draft_trace", _TRACE),
    Retired("eagle_draft_io_trace_dir", _TRACE),
    Retired("eagle_target_hidden_trace_dir", _TRACE),
    Retired("eagle_target_argmax_trace_path", _TRACE),
    Retired("vllm_source",
            "put a vLLM source checkout on the server's path with PYTHONPATH in the TOML's "
            "[env] table, or install it in the environment the launcher runs from"),
    Retired("ascend_source",
            "put a vllm-ascend source checkout on the server's path with PYTHONPATH in the "
            "TOML's [env] table, or install it in the environment the launcher runs from"),
)

BY_FLAG: dict[str, Retired] = {r.flag: r for r in RETIRED}
BY_FLAG.update({"--no-" + r.flag[2:]: r for r in RETIRED})
BY_NAME: dict[str, Retired] = {r.name: r for r in RETIRED}
BY_ENV: dict[str, Retired] = {e: r for r in RETIRED for e in r.env}


def message(r: Retired, where: str) -> str:
    """One line: where it came from, what it was, what to use."""
    return f"{where}: a vSpec 0.14 option this release does not keep: {r.reason}"


def check_environment(environ: Mapping[str, str]) -> str | None:
    """The error for the first retired vSpec variable set in ``environ``, else None."""
    for name in sorted(environ):
        r = BY_ENV.get(name)
        if r is not None:
            return message(r, f"environment variable {name} (vSpec's {r.flag})")
    return None
