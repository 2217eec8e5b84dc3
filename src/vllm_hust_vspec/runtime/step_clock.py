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
requests), not overhead, and is ignored.

It also owns the step pipeline: a step is opened at its decision (:meth:`StepClock.open`,
with the K it drafts) and closed when its output has been processed (:meth:`StepClock.close`),
in order; under async scheduling the next decision may come before the output.  The drafts a
step verifies were made by the step closed before it, so a closed step carries both Ks: the
one it verified and the one it drafted.  Pure Python (no vLLM import).
"""

from __future__ import annotations

import collections
import dataclasses

GAP_WEIGHT = 0.1  # EWMA weight of a new overhead sample


@dataclasses.dataclass(frozen=True)
class ClockedStep:
    """One step from its decision to its output."""

    step: int
    k_verified: int  # the K of the drafts this step verified (drafted by the previous step)
    k_drafted: int  # the K this step drafted (decided for it)
    window_ms: float  # decision -> model output
    t_output: float  # perf_counter() when the model output reached the scheduler
    # the engine cycle that ended with this output: from the previous step's output (ms);
    # when the engine sat idle in between, the window plus the usual overhead instead
    cycle_ms: float


class StepClock:
    def __init__(self, kmax: int = 0) -> None:
        self._t_output: float | None = None
        self._last_window_ms = 0.0
        self.gap_ms = 0.0  # EWMA of the engine's per-step overhead outside the window
        self.gaps = 0  # overhead samples taken
        self.kmax = kmax
        # opened steps awaiting their output: (step, K drafted, decision time)
        self._open: collections.deque[tuple[int, int, float]] = collections.deque()
        self._k_prev = kmax  # the K the drafts now awaiting verification were made with
        self.t_arrived = 0.0  # when the latest model output reached the scheduler
        self._t_closed: float | None = None  # the output of the step closed last

    # ------------------------------------------------------------------ pipeline
    def open(self, step: int, k: int, now: float) -> None:
        """Step ``step`` decided at ``now`` to draft ``k`` tokens."""
        self.decided(now)
        self._open.append((step, k, now))

    def arrived(self, now: float) -> None:
        """A model output reached the scheduler at ``now`` (before its processing)."""
        self.t_arrived = now

    def close(self) -> ClockedStep | None:
        """The oldest open step, now that its output (:meth:`arrived`) was processed; None
        when no step is open."""
        if not self._open:
            return None
        step, k, t_decided = self._open.popleft()
        window = self.output(t_decided, self.t_arrived)
        k_verified, self._k_prev = self._k_prev, k
        cycle = window + self.gap_ms
        if self._t_closed is not None:
            since = (self.t_arrived - self._t_closed) * 1000.0
            if window <= since <= window + max(window, 1.0):  # else idle in between
                cycle = since
        self._t_closed = self.t_arrived
        return ClockedStep(step=step, k_verified=k_verified, k_drafted=k, window_ms=window,
                           t_output=self.t_arrived, cycle_ms=cycle)

    def restart(self) -> None:
        """Forget the open steps and the gap: the engine ran steps outside the pipeline (a
        forced width); the drafts now pending were made at Kmax."""
        self._open.clear()
        self._k_prev = self.kmax
        self._t_closed = None
        self.reset()

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
