"""The start-up calibration's forced verify width: every step of every request verifies
``width`` drafts, whatever the controller would choose, and each step's output is kept.

Installed in the engine runtime with ``EngineRuntime.override_width(ForcedWidth(...))`` and
removed with ``override_width(None)``; while installed nothing reaches the controller, the
decision trace or the simulator trace.  Pure Python (no vLLM import).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from vllm_hust_vspec.runtime.engine import has_prefill


@dataclasses.dataclass(frozen=True)
class CalibrationStep:
    """One engine step under a forced width."""

    t: float  # perf_counter() when the step's model output reached the scheduler
    batch: int  # requests scheduled
    rows: int  # tokens scheduled = target rows G (B x (width + 1) in a pure decode step)
    prefill: bool  # some request was (chunk-)prefilling


class ForcedWidth:
    """``width`` drafts verified per request (0 <= width <= kmax), no K_i."""

    def __init__(self, width: int, kmax: int, varies_k: bool) -> None:
        if not 0 <= width <= kmax:
            raise ValueError(f"calibration width {width} outside [0, Kmax={kmax}]")
        self.width = int(width)
        self.kmax = kmax
        self.varies_k = varies_k
        self.steps: list[CalibrationStep] = []  # the outputs seen, oldest first

    def decide(self, running: Sequence[Any]) -> tuple[int, dict[str, int] | None]:
        if self.varies_k:
            return self.width, None
        # fixed-K proposers draft Kmax: the forced width is a per-request cut
        if self.width == self.kmax:
            return self.kmax, None
        return self.kmax, {r.request_id: self.width for r in running}

    def observe(self, t_output: float, scheduler_output: Any) -> None:
        batch = len(scheduler_output.num_scheduled_tokens)
        if batch == 0:
            return
        self.steps.append(CalibrationStep(
            t=t_output, batch=batch, rows=int(scheduler_output.total_num_scheduled_tokens),
            prefill=has_prefill(scheduler_output)))
