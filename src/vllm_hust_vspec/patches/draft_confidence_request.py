"""Patch ``Scheduler._update_after_schedule``: ask the workers for draft confidences when the controller uses them.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler._update_after_schedule``, the last call
        of every ``schedule()`` (AsyncScheduler's override calls it); when the engine runtime
        wants draft signals (its controller uses confidences: the ``budget`` policy, a
        per-request stop, a confidence calibration) the step's
        ``SchedulerOutput`` gets ``vspec_draft_signals = True``, which every worker's
        ``draft-propose`` reads.  Otherwise nothing is set and the workers compute nothing.
Why:    the engine core owns the controller (and may switch policies in one engine), so it is
        the one to say per step whether the drafters spend time on confidences; the
        ``SchedulerOutput`` is the object that reaches every worker each step.
        (``schedule()`` itself carries the ``admission`` patch.)
Remove: with ``draft-confidence-sample``.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="draft-confidence-request",
    target=Symbol(_SCHED, "Scheduler._update_after_schedule", params=("scheduler_output",)),
    requires=(Symbol("vllm.v1.core.sched.output", "SchedulerOutput"),),
    process=PROCESS_ENGINE,
    why="tell the workers, per step, whether the controller needs draft confidences",
    remove_when="the V1 proposers return draft confidences for greedy drafts",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of

    from vllm_hust_vspec.patches.draft_confidence_signals import FLAG

    @functools.wraps(original)
    def _update_after_schedule(self: Any, scheduler_output: Any, *args: Any,
                               **kwargs: Any) -> Any:
        out = original(self, scheduler_output, *args, **kwargs)
        runtime = runtime_of(self)
        if runtime is not None and runtime.wants_draft_signals:
            setattr(scheduler_output, FLAG, True)
        return out

    return _update_after_schedule
