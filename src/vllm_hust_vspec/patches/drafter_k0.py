"""Patch ``DraftModelProposer.propose``: the draft model resumes exactly after K = 0 steps.

What:   sets ``vllm.v1.spec_decode.draft_model.DraftModelProposer.propose`` (inherited from
        ``SpecDecodeBaseProposer``) to a wrapper that hands the call to
        :func:`vllm_hust_vspec.runtime.drafter_sync.propose`: before the first drafting
        step after K = 0 steps (which ``draft-propose`` ends before they reach the drafter)
        it runs one extra draft-model pass over the tokens each request missed, so its
        drafts are those of a drafter that never sat out.  The runner (for the requests'
        tokens and ids) is the caller, ``GPUModelRunner.propose_draft_token_ids``.
Why:    vLLM 0.32/0.33 run the drafter's first pass at K = 0 "to keep the drafter KV cache
        in sync" (``llm_base_proposer.py``): K = 0 cost 4-24% over target-only here.
Remove: when vLLM skips the drafter at K = 0 and catches it up itself.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_BASE = "vllm.v1.spec_decode.llm_base_proposer"
_RUNNER = "vllm.v1.worker.gpu_model_runner"

# What the catch-up pass (runtime/drafter_sync.py) reads of the host, for eagle-k0 too.
CATCH_UP_REQUIRES = (
    Symbol(_BASE, "SpecDecodeBaseProposer.build_per_group_and_layer_attn_metadata"),
    Symbol(_BASE, "SpecDecodeBaseProposer.build_model_inputs_first_pass"),
    Symbol(_BASE, "SpecDecodeBaseProposer._set_positions"),
    Symbol(_BASE, "SpecDecodeBaseProposer._get_slot_mapping"),
    Symbol(_BASE, "SpecDecodeBaseProposer.input_ids"),
    Symbol(_BASE, "SpecDecodeBaseProposer.max_num_tokens"),
    Symbol(_RUNNER, "GPUModelRunner.propose_draft_token_ids"),
    Symbol(_RUNNER, "GPUModelRunner.input_batch"),
    Symbol("vllm.v1.worker.gpu_input_batch", "InputBatch.token_ids_cpu"),
    Symbol("vllm.v1.worker.block_table", "BlockTable.block_size"),
    Symbol("vllm.v1.attention.backend", "CommonAttentionMetadata"),
    Symbol("vllm.v1.core.sched.output", "SchedulerOutput.scheduled_new_reqs"),
    Symbol("vllm.v1.core.sched.output", "CachedRequestData.resumed_req_ids"),
    Symbol("vllm.forward_context", "set_forward_context"),
)

SPEC = PatchSpec(
    name="drafter-k0",
    target=Symbol("vllm.v1.spec_decode.draft_model", "DraftModelProposer.propose",
                  params=("num_speculative_tokens", "target_token_ids", "target_positions",
                          "common_attn_metadata", "num_rejected_tokens_gpu")),
    requires=CATCH_UP_REQUIRES,
    process=PROCESS_WORKER,
    methods=("draft_model",),
    why="no drafter forward at K = 0; the missed tokens are caught up before the next draft",
    remove_when="vLLM skips the drafter at K = 0 and catches it up itself",
)


def make(original: Any) -> Any:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_hust_vspec.runtime.drafter_sync import propose

    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose_(self: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_locals.get("self")
        runner = caller if isinstance(caller, GPUModelRunner) else None
        if args:  # the host passes keywords; bind a positional call to its names
            bound = signature.bind(self, *args, **kwargs)
            kwargs = dict(bound.arguments)
            kwargs.pop(next(iter(signature.parameters)))
        return propose(original, self, runner, kwargs)

    return propose_
