"""Patch ``Scheduler.__init__``: the scheduler's K lookup becomes the controller.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler.__init__`` (AsyncScheduler inherits
        it); after the host's ``__init__`` it attaches an engine runtime (controller, decision
        trace, recorder) and replaces ``self.dynamic_sd_lookup`` with an object whose
        ``__getitem__(batch_size)`` asks the controller for this step's K (clamped to
        [0, Kmax]; Kmax for methods whose proposer asserts K == Kmax).
Why:    ``Scheduler.schedule`` reads ``self.dynamic_sd_lookup[len(num_scheduled_tokens)]``
        into ``SchedulerOutput.num_spec_tokens_to_schedule``, which every worker's drafter
        honours; replacing the lookup is the smallest hook for a per-step K.
Remove: when vLLM calls a pluggable K policy instead of a dense table.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="scheduler-k",
    target=Symbol(_SCHED, "Scheduler.__init__"),
    requires=(
        Symbol(_SCHED, "Scheduler.dynamic_sd_lookup"),
        Symbol(_SCHED, "Scheduler.schedule"),
        Symbol(_SCHED, "Scheduler.num_spec_tokens"),
        Symbol(_SCHED, "Scheduler.running"),
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput.num_spec_tokens_to_schedule"),
    ),
    process=PROCESS_ENGINE,
    why="decide K per step in the engine core; K reaches every rank via SchedulerOutput",
    remove_when="vLLM calls a pluggable K policy instead of the dynamic-SD table",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import attach

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        attach(self)

    return __init__
