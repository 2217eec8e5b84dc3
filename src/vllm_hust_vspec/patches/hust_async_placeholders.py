"""Patch ``AsyncScheduler._update_after_schedule`` on vLLM-HUST 0.17: placeholders cut to K, K_i.

What:   wraps ``vllm.v1.core.sched.async_scheduler.AsyncScheduler._update_after_schedule``;
        after the host gave every decoding request Kmax draft placeholders, each gets
        ``[-1] * min(K, K_i)``, K being the step's (``SchedulerOutput.vspec_num_spec_tokens``,
        set by ``hust-step-k`` inside the ``super()`` call).
Why:    with async scheduling the drafts never return to the engine core; the next step's
        verify width is these placeholders, and the runner reads the first
        ``len(scheduled spec tokens)`` drafts of each Kmax-stride row.  0.17 sets Kmax
        placeholders whatever the drafter made, so the step's K is cut here too.
Remove: when vLLM-HUST rebases onto vLLM >= 0.24 (then ``async-placeholders`` applies).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import FAMILY_HUST, PROCESS_ENGINE, PatchSpec, Symbol

_ASYNC = "vllm.v1.core.sched.async_scheduler"

SPEC = PatchSpec(
    name="hust-async-placeholders",
    target=Symbol(_ASYNC, "AsyncScheduler._update_after_schedule",
                  params=("scheduler_output",)),
    requires=(
        Symbol(_ASYNC, "AsyncScheduler._spec_token_placeholders"),
        Symbol("vllm.v1.request", "Request.spec_token_ids"),
        Symbol("vllm.v1.request", "Request.is_prefill_chunk"),
    ),
    process=PROCESS_ENGINE,
    family=FAMILY_HUST,
    why="the step's K and per-request K_i under asynchronous scheduling on 0.17",
    remove_when="vLLM-HUST rebases onto vLLM >= 0.24 (then async-placeholders applies)",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of
    from vllm_hust_vspec.runtime.hust_drafter import STEP_K_ATTR

    @functools.wraps(original)
    def _update_after_schedule(self: Any, scheduler_output: Any) -> None:
        original(self, scheduler_output)
        runtime = runtime_of(self)
        k = getattr(scheduler_output, STEP_K_ATTR, None)
        if runtime is not None and k is not None:
            runtime.cut_placeholders(scheduler_output, k)

    return _update_after_schedule
