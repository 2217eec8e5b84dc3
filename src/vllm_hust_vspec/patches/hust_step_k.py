"""Patch ``Scheduler._update_after_schedule`` on vLLM-HUST 0.17: the per-step K.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler._update_after_schedule``, the last
        call of ``schedule()``; BEFORE the host's body (the running requests are still as
        they were scheduled) the controller decides this step's K, and the step's
        ``SchedulerOutput`` carries it in the attribute ``vspec_num_spec_tokens``
        (``runtime.hust_drafter.STEP_K_ATTR``; Kmax for a step that schedules nothing, as
        vLLM >= 0.24 does).  The workers' drafters draft that many tokens
        (``hust-draft-k``); the engine core cuts drafts and placeholders to it
        (``hust-draft-trim``, ``hust-async-placeholders``).
Why:    0.17 has no ``dynamic_sd_lookup`` and no ``SchedulerOutput.num_spec_tokens_to_schedule``.
        ``_update_after_schedule`` runs once per ``schedule()``, also under vLLM-Ascend's own
        schedulers that replace ``schedule()``, and ``SchedulerOutput`` (a dataclass)
        pickles the extra attribute to every worker, so every tensor-parallel rank drafts
        the same K.
Remove: when vLLM-HUST rebases onto vLLM >= 0.24 (then ``scheduler-k`` applies).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import FAMILY_HUST, PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="hust-step-k",
    target=Symbol(_SCHED, "Scheduler._update_after_schedule", params=("scheduler_output",)),
    requires=(
        Symbol(_SCHED, "Scheduler.schedule"),
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput"),
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput.num_scheduled_tokens"),
    ),
    process=PROCESS_ENGINE,
    family=FAMILY_HUST,
    why="decide K per step in the 0.17 engine core and carry it to every worker in "
        "SchedulerOutput",
    remove_when="vLLM-HUST rebases onto vLLM >= 0.24 (then scheduler-k applies)",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of
    from vllm_hust_vspec.runtime.hust_drafter import STEP_K_ATTR

    @functools.wraps(original)
    def _update_after_schedule(self: Any, scheduler_output: Any) -> None:
        runtime = runtime_of(self)
        if runtime is not None:
            k = runtime.decide() if scheduler_output.num_scheduled_tokens else runtime.kmax
            setattr(scheduler_output, STEP_K_ATTR, k)
        original(self, scheduler_output)

    return _update_after_schedule
