"""Patch ``Scheduler.update_from_output``: step boundaries, wall time, finished requests.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler.update_from_output``.  Before the
        host's body: the step's wall time (from the K decision in ``schedule()`` to the
        arrival of the model output: forward, verification and drafting) and each request's
        output position.  After it: the step's results go to the controller, the decision
        trace and the recorder, and requests that finished are written out by the recorder;
        where the server logs stats, the step's controller metrics join the host's
        scheduler stats in the outputs it returns (:meth:`EngineRuntime.publish`, for
        ``/metrics``).
Why:    it is the one engine-core call that sees every step's output; the host's own stats
        are built only with log stats on and too late for a per-step controller.
Remove: when vLLM offers a per-step observer hook in the scheduler.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="step-output",
    target=Symbol(_SCHED, "Scheduler.update_from_output",
                  params=("scheduler_output", "model_runner_output")),
    requires=(
        Symbol(_SCHED, "Scheduler.requests"),
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput.num_scheduled_tokens"),
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput.total_num_scheduled_tokens"),
        Symbol("vllm.v1.core.sched.output", "SchedulerOutput.scheduled_spec_decode_tokens"),
        Symbol("vllm.v1.outputs", "ModelRunnerOutput.sampled_token_ids"),
        Symbol("vllm.v1.outputs", "ModelRunnerOutput.req_id_to_index"),
        Symbol(_SCHED, "Scheduler.log_stats"),
        Symbol("vllm.v1.engine", "EngineCoreOutputs.scheduler_stats"),
    ),
    process=PROCESS_ENGINE,
    why="step wall time and per-step results for the controller, trace, recorder and /metrics",
    remove_when="vLLM offers a per-step observer hook in the scheduler",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of

    @functools.wraps(original)
    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        runtime = runtime_of(self)
        if runtime is None:
            return original(self, scheduler_output, model_runner_output)
        with runtime.output_step(scheduler_output, model_runner_output):
            outputs = original(self, scheduler_output, model_runner_output)
        runtime.publish(outputs)
        return outputs

    return update_from_output
