"""Patch ``Scheduler.update_draft_token_ids``: per-request draft lengths K_i (sync scheduling).

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler.update_draft_token_ids``; each
        request's fresh drafts are cut to the K_i the controller chose for it (and to the
        step's K for methods whose drafter always makes Kmax tokens).  Draft confidences the
        workers attached (``draft-confidence-take``) go to the runtime with the drafts: with
        them the K_i are chosen here, from the drafts that will be verified.
Why:    the scheduler schedules whatever list length a request carries and the rejection
        sampler is ragged, so a shorter list saves its verification.  The drafter still ran
        max K_i steps for the whole batch.
Remove: when per-request draft lengths become a host option.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="draft-trim",
    target=Symbol(_SCHED, "Scheduler.update_draft_token_ids", params=("draft_token_ids",)),
    requires=(
        Symbol("vllm.v1.outputs", "DraftTokenIds.req_ids"),
        Symbol("vllm.v1.outputs", "DraftTokenIds.draft_token_ids"),
    ),
    process=PROCESS_ENGINE,
    why="per-request draft lengths K_i under synchronous scheduling",
    remove_when="per-request draft lengths become a host option",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of

    @functools.wraps(original)
    def update_draft_token_ids(self: Any, draft_token_ids: Any) -> None:
        runtime = runtime_of(self)
        if runtime is not None:
            # with the draft confidences/entropies the workers sent (draft-confidence-take)
            draft_token_ids = runtime.trimmed(draft_token_ids)
        return original(self, draft_token_ids)

    return update_draft_token_ids
