"""Patch ``Scheduler.schedule``: admission control, the batch refills in cohorts.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler.schedule`` (AsyncScheduler inherits
        it); when ``--adaptive-refill-batch`` is set and the engine runtime decides to hold
        the waiting requests this step (:mod:`vllm_hust_vspec.runtime.admission`), the
        host's admission limit ``max_num_active_reqs`` is lowered to the slots already
        taken for this one call and restored after it, so the host admits no one; running
        requests are scheduled as always.  Unset, or nothing to hold: the host's call as is.
Why:    the host admits a waiting request whenever one slot is free; under load that mixes
        a prefill into most decode steps and moves the batch size (and with it the best K)
        a little every step.  ``max_num_active_reqs`` is the one limit the host's admission
        loop reads, and ``schedule()`` the one call around which it can change.
Remove: when vLLM's scheduler takes an admission policy (a minimum cohort with a wait bound).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="admission",
    target=Symbol(_SCHED, "Scheduler.schedule"),
    requires=(
        Symbol(_SCHED, "Scheduler.max_num_active_reqs"),
        Symbol(_SCHED, "Scheduler.waiting"),
        Symbol(_SCHED, "Scheduler.running"),
    ),
    process=PROCESS_ENGINE,
    why="hold waiting requests until a cohort of batch slots is free (--adaptive-refill-batch)",
    remove_when="vLLM's scheduler takes an admission policy with a minimum cohort",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of

    @functools.wraps(original)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        runtime = runtime_of(self)
        limit = None if runtime is None else runtime.admission_limit()
        if limit is None:
            return original(self, *args, **kwargs)
        host_limit = self.max_num_active_reqs
        self.max_num_active_reqs = limit
        try:
            return original(self, *args, **kwargs)
        finally:
            self.max_num_active_reqs = host_limit

    return schedule
