"""Patch ``GPUModelRunner.sample_tokens``: under async scheduling, the draft confidences ride on the step's output.

What:   wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.sample_tokens`` (CPUModelRunner
        inherits it).  On a runner with ``use_async_scheduling``, when ``draft-propose`` kept
        signals for the drafts this step made (same draft tensor), the step's
        ``ModelRunnerOutput`` (the one an ``AsyncGPUModelRunnerOutput`` hands over from
        ``get_output``) gets the float32 arrays ``vspec_confidences`` / ``vspec_entropies``,
        shape (len(req_ids), K), rows aligned with its ``req_ids``.  The signals are consumed
        either way.  Synchronous runners are left to ``draft-confidence-take``.
Why:    under async scheduling the drafts stay on the worker (the engine core schedules
        placeholders and never calls ``take_draft_token_ids``), so the step's output is the
        one object that reaches the engine core, where ``update_from_output`` (``step-output``)
        gives the confidences to the runtime: the next decision reads them, and they are kept
        for the verification of these drafts in the next step.  A plain dataclass: the extra
        attributes survive the multiprocess executor's pickling.
Remove: with ``draft-confidence-sample``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_RUNNER = "vllm.v1.worker.gpu_model_runner"

logger = logging.getLogger("vllm_hust_vspec")

SPEC = PatchSpec(
    name="draft-confidence-output",
    target=Symbol(_RUNNER, "GPUModelRunner.sample_tokens", params=("grammar_output",)),
    requires=(
        Symbol(_RUNNER, "GPUModelRunner.use_async_scheduling"),
        Symbol(_RUNNER, "GPUModelRunner._draft_token_ids"),
        Symbol(_RUNNER, "AsyncGPUModelRunnerOutput._model_runner_output"),
        Symbol("vllm.v1.outputs", "ModelRunnerOutput.req_ids"),
    ),
    process=PROCESS_WORKER,
    why="carry draft confidences to the engine core under asynchronous scheduling",
    remove_when="the V1 proposers return draft confidences for greedy drafts",
)


def make(original: Any) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    from vllm_hust_vspec.patches import draft_confidence_signals as signals

    conf_attr, ent_attr = signals.CONFIDENCES, signals.ENTROPIES
    warned: list[bool] = []

    @functools.wraps(original)
    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if not getattr(self, "use_async_scheduling", False):
            return out  # draft-confidence-take hands them over with the drafts
        kept = signals.take_kept(self)
        if kept is None:
            return out  # none asked for, or the host zeroed the drafts out
        target = out if isinstance(out, ModelRunnerOutput) else getattr(
            out, "_model_runner_output", None)
        conf, ent = kept
        rows = -1 if target is None else len(target.req_ids)
        if conf.shape[0] != rows:
            # a host change, not a fault of the step: the engine runs on without them (its
            # controller decides as it does on steps that drafted nothing); never raise here,
            # a worker that raises takes the engine down
            if not warned:
                warned.append(True)
                logger.error("vllm-hust-vspec: draft-confidence-output: confidences for %d "
                             "requests, the step's output has %d (%s); no confidences reach "
                             "the engine core", conf.shape[0], rows, type(out).__name__)
            return out
        setattr(target, conf_attr, conf)
        setattr(target, ent_attr, ent)
        return out

    return sample_tokens
