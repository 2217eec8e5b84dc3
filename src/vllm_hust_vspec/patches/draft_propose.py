"""Patch ``GPUModelRunner.propose_draft_token_ids``: K = 0 skips the host's draft
preparation; steps asked for draft signals arm the drafter's confidence recording.

What:   wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids``
        (CPUModelRunner inherits it).
        * On a K = 0 step that the drafter sits out (``drafter-k0``, ``eagle-k0``:
          synchronous scheduling, ``adaptive_k0_drafter`` skip), it returns no drafts (an
          empty list) at once (``runtime.drafter_sync.skipped_step``, which records
          the skip for the catch-up and, for the EAGLE family, keeps the step's target hidden
          states), without the next-token and padded-input preparation the host does before
          it calls the drafter.
        * When the step's ``SchedulerOutput`` carries the engine's request for draft signals
          (set by ``draft-confidence-request``) and the drafter is a ``SpecDecodeBaseProposer``
          (draft_model, EAGLE, EAGLE-3, MTP), the drafter records every drafting pass
          (``draft-confidence-sample``); afterwards the passes are stacked into (num_reqs, K)
          float32 arrays kept on the runner with the draft tensor they belong to, for
          ``draft-confidence-take``.  Otherwise the host runs untouched.
Why:    only the runner sees both the engine's per-step request and the drafts; the arrays
        must be aligned with the rows ``take_draft_token_ids`` returns.  A K = 0 step's
        preparation is part of what K = 0 cost over target-only.
Remove: with ``draft-confidence-sample``, ``drafter-k0`` and ``eagle-k0``.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_RUNNER = "vllm.v1.worker.gpu_model_runner"

SPEC = PatchSpec(
    name="draft-propose",
    target=Symbol(_RUNNER, "GPUModelRunner.propose_draft_token_ids",
                  params=("scheduler_output",)),
    requires=(
        Symbol(_RUNNER, "GPUModelRunner.drafter"),
        Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer"),
    ),
    process=PROCESS_WORKER,
    why="K = 0 without the host's draft preparation; draft confidences only in the steps "
        "whose engine asked for them",
    remove_when="the V1 proposers return draft confidences for greedy drafts",
)


def make(original: Any) -> Any:
    import inspect

    import torch

    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    from vllm_hust_vspec.patches import draft_confidence_signals as signals
    from vllm_hust_vspec.runtime.drafter_sync import note_step, skipped_step

    flag, records_attr, result_attr = signals.FLAG, signals.RECORDS, signals.RESULT
    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        note_step(self, scheduler_output)
        if scheduler_output.num_spec_tokens_to_schedule == 0:  # the host passes positionals
            inputs = signature.bind(self, scheduler_output, *args, **kwargs).arguments
            empty = skipped_step(self, scheduler_output, inputs)
            if empty is not None:
                return empty
        drafter = self.__dict__.get("drafter")
        if not getattr(scheduler_output, flag, False) or not isinstance(
            drafter, SpecDecodeBaseProposer
        ):
            return original(self, scheduler_output, *args, **kwargs)
        records: list = []
        drafter.__dict__[records_attr] = records
        try:
            drafts = original(self, scheduler_output, *args, **kwargs)
        finally:
            drafter.__dict__.pop(records_attr, None)
        if torch.is_tensor(drafts) and drafts.dim() == 2:
            arrays = signals.stack(records, drafts, type(drafter).__name__)
            if arrays is not None:
                self.__dict__[result_attr] = (drafts, *arrays)
        return drafts

    return propose_draft_token_ids
