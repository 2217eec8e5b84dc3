"""Patch ``Scheduler.update_draft_token_ids`` on vLLM-HUST 0.17: drafts cut to K and K_i.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler.update_draft_token_ids``; each
        request's fresh drafts are cut to the step's K (``EngineRuntime.k_step``) and to the
        K_i the controller chose for it, before the host stores them.
Why:    on 0.17 the drafts arrive Kmax wide whatever K the drafter made (``hust-draft-k``
        pads them back to the runner's Kmax buffer), so unlike ``draft-trim`` on vLLM >= 0.24
        the step's K is cut here too; the scheduler then schedules (and the rejection
        sampler verifies) only what is kept.
Remove: when vLLM-HUST rebases onto vLLM >= 0.24 (then ``draft-trim`` applies).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import FAMILY_HUST, PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="hust-draft-trim",
    target=Symbol(_SCHED, "Scheduler.update_draft_token_ids", params=("draft_token_ids",)),
    requires=(
        Symbol("vllm.v1.outputs", "DraftTokenIds.req_ids"),
        Symbol("vllm.v1.outputs", "DraftTokenIds.draft_token_ids"),
    ),
    process=PROCESS_ENGINE,
    family=FAMILY_HUST,
    why="the step's K and per-request K_i under synchronous scheduling on 0.17",
    remove_when="vLLM-HUST rebases onto vLLM >= 0.24 (then draft-trim applies)",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of

    @functools.wraps(original)
    def update_draft_token_ids(self: Any, draft_token_ids: Any) -> None:
        runtime = runtime_of(self)
        if runtime is not None:
            draft_token_ids = runtime.trimmed(draft_token_ids, width=runtime.k_step)
        return original(self, draft_token_ids)

    return update_draft_token_ids
