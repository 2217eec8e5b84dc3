"""The in-engine paired comparison (option ``adaptive_compare``): several policies take turns
inside one engine, in short windows of decode steps, so that each one's speed is measured
under the same machine speed, load and prompts as the others' (this machine's speed drifts
by tens of percent within minutes: one server per policy cannot show a few percent).

The policies run in rounds; each round gives every policy one window of
``adaptive_compare_window`` decisions, the order shifted by one each round (every policy
takes every position).  Each policy has its own controller, which decides only in its own
windows and observes only their steps (as if it served alone, with pauses).

A window's first step verifies the drafts the previous policy made: it is left out of the
measurement, and when that policy is another one, its controller learns nothing from it
(neither the time nor the acceptance of another policy's drafts: alone, it would have
verified drafts of its own depth there).  Its other steps each verify the drafts of the step
before (the same policy) and draft for the next, so a window is charged for as many drafts
as it verifies.  Steps that
also ran a prefill are left out too (their cost is the prompt's, the same whatever the
policy).  When a window is complete its record goes to the decision trace::

    {"window": n, "round": r, "policy": "fixed:2", "steps": 14, "tokens": 61,
     "ms": 301.2, "batch": 3.9, "by_batch": [[3, 2, 9, 43.0], [4, 12, 52, 258.2]]}

``tokens`` are the tokens the measured steps produced (one per decoding request plus its
accepted drafts), ``ms`` their engine cycle time (output to output; an idle wait counts as
the step's window plus the engine's usual overhead), ``batch`` the mean decoding batch, and
``by_batch`` the same sums split by the steps' decoding batch (``[batch, steps, tokens,
ms]`` rows): the comparison sets each window against what the steps of every policy made at
the same batch (windows of one round fall in different parts of a load's fill and drain).
``vllm-hust-vspec-bench ab`` (configuration ``paired``) pairs the windows of each round.
Pure Python (no vLLM import).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

SETTLE_STEPS = 1  # steps at the start of a window left out (they verify the previous policy's drafts)


@dataclasses.dataclass
class _Window:
    number: int
    round: int
    index: int  # which policy
    decisions: int = 0
    # the measured steps' sums by decoding batch: batch -> [steps, tokens, ms] (the record's
    # totals are their sums)
    by_batch: dict[int, list] = dataclasses.field(default_factory=dict)
    first_step: int | None = None  # the window's first decision (its step number)
    after: int | None = None  # the policy of the window before (None: the first window)

    def record(self, names: Sequence[str]) -> dict[str, Any]:
        rows = sorted(self.by_batch.items())
        steps = sum(n for _b, (n, _t, _ms) in rows)
        return {"window": self.number, "round": self.round, "policy": names[self.index],
                "steps": steps, "tokens": sum(t for _b, (_n, t, _ms) in rows),
                "ms": round(sum(ms for _b, (_n, _t, ms) in rows), 3),
                "batch": round(sum(b * n for b, (n, _t, _ms) in rows) / steps, 3) if steps else 0.0,
                "by_batch": [[b, n, t, round(ms, 3)] for b, (n, t, ms) in rows]}


class Rotation:
    """Which policy decides each step, and each window's measurement."""

    def __init__(self, names: Sequence[str], window: int) -> None:
        if len(names) < 2:
            raise ValueError("a paired comparison needs at least two policies")
        if window <= SETTLE_STEPS + 1:
            raise ValueError(f"window of {window} decisions leaves nothing to measure")
        self.names = tuple(names)
        self.window = int(window)
        self._current = _Window(number=1, round=1, index=0)
        self._by_step: dict[int, _Window] = {}  # decided, output not yet seen
        self._open: list[_Window] = [self._current]  # windows with steps still to come

    def decision(self, step: int) -> int:
        """Step ``step`` is being decided: the index of the policy that decides it (a new
        window begins when the current one has had its decisions)."""
        w = self._current
        if w.decisions >= self.window:
            n = w.number  # windows so far
            position = n % len(self.names)
            rnd = n // len(self.names) + 1
            index = (position + rnd - 1) % len(self.names)
            w = self._current = _Window(number=n + 1, round=rnd, index=index, after=w.index)
            self._open.append(w)
        w.decisions += 1
        if w.first_step is None:
            w.first_step = step
        self._by_step[step] = w
        return w.index

    def policy_of(self, step: int) -> int | None:
        """The policy that decided ``step`` (None when the rotation never saw it)."""
        w = self._by_step.get(step)
        return None if w is None else w.index

    def foreign(self, step: int) -> bool:
        """True for the first steps (``SETTLE_STEPS``) of a window that follows another
        policy's: they verify the drafts that policy made, so neither their time nor their
        acceptance is the deciding policy's (call before :meth:`output`)."""
        w = self._by_step.get(step)
        return (w is not None and w.first_step is not None and w.after is not None
                and w.after != w.index and step < w.first_step + SETTLE_STEPS)

    def output(self, step: int, batch: int, tokens: int, cycle_ms: float | None) -> list[dict[str, Any]]:
        """Step ``step``'s output: ``batch`` decoding requests produced ``tokens`` tokens in
        ``cycle_ms`` (None: a step with prefill, not measured).  Returns the records of the
        windows now complete."""
        w = self._by_step.pop(step, None)
        if w is None:
            return []
        settle = w.first_step is not None and step < w.first_step + SETTLE_STEPS
        if cycle_ms is not None and not settle and batch > 0:
            row = w.by_batch.setdefault(int(batch), [0, 0, 0.0])
            row[0] += 1
            row[1] += int(tokens)
            row[2] += float(cycle_ms)
        return self._complete()

    def _complete(self) -> list[dict[str, Any]]:
        done = []
        while len(self._open) > 1:
            w = self._open[0]
            if any(v is w for v in self._by_step.values()):
                break  # an output of this window is still to come
            self._open.pop(0)
            done.append(w.record(self.names))
        return done

    def forget_pending(self) -> None:
        """The engine ran steps outside the pipeline (a forced K): the decided steps whose
        outputs are pending will not be seen."""
        self._by_step.clear()
