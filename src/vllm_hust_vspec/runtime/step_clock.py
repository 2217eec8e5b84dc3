"""The engine cycle time of a decode step, as the controller's step-cost model should see it.

The engine runtime times each step from its K decision (in ``schedule()``) to the arrival of
its model output (``update_from_output``): forward, verification and drafting.  The engine
core then spends time that every step pays whatever its K: the rest of the output handling,
the hand-over of the fresh drafts (``take_draft_token_ids`` / ``update_draft_token_ids``),
the input queue and the next ``schedule()``.  Leaving that overhead out makes each extra
draft position look relatively dearer than it is (at batch 1 on the CPU host the overhead is
~2 ms of a ~20 ms cycle), so the controller would hold K too low.

:class:`StepClock` adds the overhead back: an EWMA of the gap from one step's output to the
next decision.  A gap longer than the window before it is idle time (the engine waited for
requests), not overhead, and is ignored.  Pure Python (no vLLM import).
"""

from __future__ import annotations

GAP_WEIGHT = 0.1  # EWMA weight of a new overhead sample


class StepClock:
    def __init__(self) -> None:
        self._t_output: float | None = None
        self._last_window_ms = 0.0
        self.gap_ms = 0.0  # EWMA of the engine's per-step overhead outside the window
        self.gaps = 0  # overhead samples taken

    def decided(self, now: float) -> None:
        """A K decision at ``now`` (seconds, ``perf_counter``): closes the gap that began at
        the previous output."""
        t_out = self._t_output
        if t_out is None:
            return
        self._t_output = None
        gap_ms = (now - t_out) * 1000.0
        if 0.0 <= gap_ms <= max(self._last_window_ms, 1.0):
            self.gap_ms = gap_ms if self.gaps == 0 else self.gap_ms + GAP_WEIGHT * (gap_ms - self.gap_ms)
            self.gaps += 1

    def output(self, t_decided: float, now: float) -> float:
        """A step decided at ``t_decided`` delivered its output at ``now``: its window (ms)."""
        window_ms = (now - t_decided) * 1000.0
        self._t_output = now
        self._last_window_ms = window_ms
        return window_ms

    def cycle_ms(self, window_ms: float) -> float:
        """The step's cost for the controller: its window plus the engine's overhead."""
        return window_ms + self.gap_ms

    def reset(self) -> None:
        """Forget the open gap (e.g. after the engine ran steps the clock did not see)."""
        self._t_output = None
