"""The start-up calibration's forced K: every request of every step drafts and verifies
``k`` tokens (the grid's "width w" is this K), whatever the controller would choose, and
each step's output is kept.

Installed in the engine runtime with ``EngineRuntime.override_k(ForcedK(...))`` and
removed with ``override_k(None)``; while installed nothing reaches the controller, the
decision trace or the simulator trace.  Pure Python (no vLLM import).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from vllm_hust_vspec.runtime.engine import has_prefill


@dataclasses.dataclass(frozen=True)
class CalibrationStep:
    """One engine step under a forced K."""

    t: float  # perf_counter() when the step's model output reached the scheduler
    batch: int  # requests scheduled
    rows: int  # tokens scheduled = target rows G (B x (K + 1) in a pure decode step)
    prefill: bool  # some request was (chunk-)prefilling


class ForcedK:
    """``k`` drafts verified per request (0 <= k <= kmax), no K_i."""

    def __init__(self, k: int, kmax: int, varies_k: bool) -> None:
        if not 0 <= k <= kmax:
            raise ValueError(f"calibration K {k} outside [0, Kmax={kmax}]")
        self.k = int(k)
        self.kmax = kmax
        self.varies_k = varies_k
        self.steps: list[CalibrationStep] = []  # the outputs seen, oldest first

    def decide(self, running: Sequence[Any]) -> tuple[int, dict[str, int] | None]:
        if self.varies_k:
            return self.k, None
        # fixed-K proposers draft Kmax: the forced K is a per-request cut
        if self.k == self.kmax:
            return self.kmax, None
        return self.kmax, {r.request_id: self.k for r in running}

    def observe(self, t_output: float, scheduler_output: Any) -> None:
        batch = len(scheduler_output.num_scheduled_tokens)
        if batch == 0:
            return
        self.steps.append(CalibrationStep(
            t=t_output, batch=batch, rows=int(scheduler_output.total_num_scheduled_tokens),
            prefill=has_prefill(scheduler_output)))
