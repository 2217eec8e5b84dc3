"""Patch ``AsyncScheduler._update_after_schedule``: per-request K_i under async scheduling.

What:   wraps ``vllm.v1.core.sched.async_scheduler.AsyncScheduler._update_after_schedule``;
        after the host set every decoding request's next-step placeholders to
        ``[-1] * num_spec_tokens_to_schedule``, requests with a smaller K_i get
        ``[-1] * K_i``.
Why:    with async scheduling the drafts never return to the engine core; the next step's
        verify width is fixed by these placeholders inside ``schedule()``.  The V1 async
        scatter and V2 ``prepare_inputs`` read ``len(scheduled spec tokens)`` drafts per row,
        so a shorter placeholder list verifies the first K_i drafts only.
Remove: when per-request draft lengths become a host option.
Note:   the CPU host forces async scheduling off, so this runs on CUDA/NPU hosts only.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_ASYNC = "vllm.v1.core.sched.async_scheduler"

SPEC = PatchSpec(
    name="async-placeholders",
    target=Symbol(_ASYNC, "AsyncScheduler._update_after_schedule",
                  params=("scheduler_output",)),
    requires=(
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput.scheduled_spec_decode_tokens"),
        Symbol("vllm.v1.request", "Request.spec_token_ids"),
        Symbol("vllm.v1.request", "Request.is_prefill_chunk"),
    ),
    process=PROCESS_ENGINE,
    why="per-request draft lengths K_i under asynchronous scheduling",
    remove_when="per-request draft lengths become a host option",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of

    @functools.wraps(original)
    def _update_after_schedule(self: Any, scheduler_output: Any) -> None:
        original(self, scheduler_output)
        runtime = runtime_of(self)
        if runtime is not None:
            runtime.cut_placeholders(scheduler_output)

    return _update_after_schedule
