"""The in-engine paired comparison (option ``adaptive_compare``): several policies take turns
inside one engine, in short windows of decode steps, so that each one's speed is measured
under the same machine speed, load and prompts as the others' (this machine's speed drifts
by tens of percent within minutes: one server per policy cannot show a few percent).

The policies run in rounds; each round gives every policy one window of
``adaptive_compare_window`` decisions, the order shifted by one each round (every policy
takes every position).  With ``adaptive_compare_waves`` a window is a *wave* instead: a new
window begins at the first decision whose running requests are all new (every request of the
decision before has finished).  A client that sends each wave of requests once per compared
policy, waiting for it to finish (``vllm-hust-vspec-bench ab --paired-waves``), then has every
policy serve the same texts, at temperature 0 the same tokens: the windows of a round differ
only in the policy (on different texts, a batch-1 window's speed is mostly its prompt's: one
that falls into a loop accepts every draft).  Each policy has its own controller, which
decides only in its own windows and observes only their steps (as if it served alone, with
pauses).

A window's first step verifies the drafts the previous policy made: it is left out of the
measurement, and when that policy is another one, its controller learns nothing from it
(neither the time nor the acceptance of another policy's drafts: alone, it would have
verified drafts of its own depth there).  Its other steps each verify the drafts of the step
before (the same policy) and draft for the next, so a window is charged for as many drafts
as it verifies.  Steps that
also ran a prefill are left out too (their cost is the prompt's, the same whatever the
policy).  When a window is complete its record goes to the decision trace::

    {"window": n, "round": r, "policy": "fixed:2", "steps": 14, "tokens": 61,
     "ms": 301.2, "batch": 3.9, "by_batch": [[3, 2, 9, 43.0], [4, 12, 52, 258.2]],
     "by_k": [[4, 2, 10, 21.2]], "policy_ms": 0.8}

``tokens`` are the tokens the measured steps produced (one per decoding request plus its
accepted drafts), ``ms`` their engine cycle time (output to output; an idle wait counts as
the step's window plus the engine's usual overhead), ``batch`` the mean decoding batch, and
``by_batch`` the same sums split by the steps' decoding batch (``[batch, steps, tokens,
ms]`` rows): the comparison sets each window against what the steps of every policy made at
the same batch (windows of one round fall in different parts of a load's fill and drain).
``by_k`` holds the steady steps among them (verified and drafted at one K, nothing caught
up) as ``[batch, K, steps, geometric mean ms]`` rows, their time less the policy's own work
in it, and ``policy_ms`` that work over the measured steps (the deciding policy's
observation of the step before, its decision and its trace records: a cycle of the engine
pays both): steps at the same batch and K cost the same whatever the policy, so the
comparison reads from them how fast the machine ran in each window, leaving each policy's
own time as it was (``tools/paired_speed.py``).
With waves a record also has ``wave_steps`` and ``wave_ms``: every step of the wave, its
prefill steps and the first one included, the time a client waits for the wave's tokens.
Every policy of a round serves the same tokens, so the ratio of two policies' ``wave_ms``
is their end-to-end ratio, which the decode steps alone overstate when the prompts take a
large share of a wave (a batch-16 wave of the demo: 2.5-2.7 s of prefill steps against
about 2.4 s of decode steps, the prefill steps within a few percent of each other whatever
the policy).
``vllm-hust-vspec-bench ab`` (configuration ``paired``) pairs the windows of each round.
Pure Python (no vLLM import).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

SETTLE_STEPS = 1  # steps at the start of a window left out (they verify the previous policy's drafts)


def steady_rows(sums: dict[tuple[int, int], list]) -> list[list]:
    """A record's ``by_k`` rows from ``(batch, K) -> [steps, sum of ln ms]``: ``[batch, K,
    steps, geometric mean ms]``, in (batch, K) order."""
    return [[b, k, n, round(math.exp(logs / n), 4)] for (b, k), (n, logs) in sorted(sums.items())]


@dataclasses.dataclass
class _Window:
    number: int
    round: int
    index: int  # which policy
    position: int = 0  # its place in the round
    closed: bool = False  # its record was written (waves: when every request finished)
    decisions: int = 0
    # the measured steps' sums by decoding batch: batch -> [steps, tokens, ms] (the record's
    # totals are their sums)
    by_batch: dict[int, list] = dataclasses.field(default_factory=dict)
    # the steady measured steps (verified and drafted at one K, no catch-up) by (batch, K):
    # [steps, sum of ln ms]
    by_k: dict[tuple[int, int], list] = dataclasses.field(default_factory=dict)
    policy_ms: float = 0.0  # the measured steps' time spent on the policy's own work
    first_step: int | None = None  # the window's first decision (its step number)
    after: int | None = None  # the policy of the window before (None: the first window)
    # every step of the window, its prefill and settling steps included: (steps, ms)
    all_steps: int = 0
    all_ms: float = 0.0

    def record(self, names: Sequence[str], waves: bool = False) -> dict[str, Any]:
        rows = sorted(self.by_batch.items())
        steps = sum(n for _b, (n, _t, _ms) in rows)
        rec = {"window": self.number, "round": self.round, "policy": names[self.index],
               "steps": steps, "tokens": sum(t for _b, (_n, t, _ms) in rows),
               "ms": round(sum(ms for _b, (_n, _t, ms) in rows), 3),
               "batch": round(sum(b * n for b, (n, _t, _ms) in rows) / steps, 3) if steps else 0.0,
               "by_batch": [[b, n, t, round(ms, 3)] for b, (n, t, ms) in rows],
               "by_k": steady_rows(self.by_k),
               "policy_ms": round(self.policy_ms, 3)}
        if waves:  # the whole wave, prompts included: what a client waits for
            rec["wave_steps"] = self.all_steps
            rec["wave_ms"] = round(self.all_ms, 3)
        return rec


class Rotation:
    """Which policy decides each step, and each window's measurement."""

    def __init__(self, names: Sequence[str], window: int, waves: bool = False) -> None:
        if len(names) < 2:
            raise ValueError("a paired comparison needs at least two policies")
        if not waves and window <= SETTLE_STEPS + 1:
            raise ValueError(f"window of {window} decisions leaves nothing to measure")
        self.names = tuple(names)
        self.window = int(window)
        self.waves = bool(waves)
        # waves: the running requests of the last decision that had any, the prompts of the
        # current round's first wave, and each running request's prompt key
        self._last_ids: frozenset = frozenset()
        self._round_prompts: set[int] = set()
        self._keys: dict[str, int] = {}
        self._current = _Window(number=1, round=1, index=0)
        self._by_step: dict[int, _Window] = {}  # decided, output not yet seen
        self._open: list[_Window] = [self._current]  # windows with steps still to come

    def decision(self, step: int, requests: Sequence[tuple[str, Sequence[int]]] = ()) -> int:
        """Step ``step`` is being decided, for the running ``requests`` (``(request id,
        prompt token ids)`` pairs, read only with waves): the index of the policy that
        decides it.  A new window begins when the current one has had its decisions; with
        waves, when every running request is new."""
        w = self._current
        if not self.waves:
            if w.decisions >= self.window:
                n = w.number  # windows so far
                self._open_window(n % len(self.names), n // len(self.names) + 1)
        elif requests:  # nothing running yet (a wave's requests still arriving): no news
            self._wave_decision(requests)
        w = self._current
        w.decisions += 1
        if w.first_step is None:
            w.first_step = step
        self._by_step[step] = w
        return w.index

    def _open_window(self, position: int, rnd: int) -> None:
        """The next window: ``position`` in rotation round ``rnd`` (the order shifted by one
        each round)."""
        prev = self._current
        index = (position + rnd - 1) % len(self.names)
        self._current = _Window(number=prev.number + 1, round=rnd, index=index, after=prev.index,
                                position=position)
        self._open.append(self._current)

    def _wave_decision(self, requests: Sequence[tuple[str, Sequence[int]]]) -> None:
        """Waves: a decision whose running requests are all new opens a window; it is the
        next position of the current round when its prompts are ones the round's first wave
        served (a replay), else the first of a new round.  Keyed by the prompts, a round
        holds one wave's replays whatever ran before it (a warm-up, a stray request)."""
        ids = frozenset(rid for rid, _ in requests)
        w = self._current
        if w.decisions > 0 and ids.isdisjoint(self._last_ids):
            prompts = {self._prompt_key(rid, toks) for rid, toks in requests}
            replay = prompts <= self._round_prompts and w.position + 1 < len(self.names)
            if replay:
                self._open_window(w.position + 1, w.round)
            else:
                self._open_window(0, w.round + 1)
                self._round_prompts = set()
            self._keys = {rid: self._keys[rid] for rid in ids if rid in self._keys}
        self._last_ids = ids
        if self._current.position == 0:  # the round's first wave: what its replays will serve
            self._round_prompts.update(self._prompt_key(rid, toks) for rid, toks in requests)

    def _prompt_key(self, request_id: str, prompt: Sequence[int]) -> int:
        key = self._keys.get(request_id)
        if key is None:
            key = self._keys[request_id] = hash(tuple(prompt))
        return key

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

    def output(self, step: int, batch: int, tokens: int, cycle_ms: float | None,
               prefill: bool = False, steady_k: int | None = None,
               policy_ms: float = 0.0) -> list[dict[str, Any]]:
        """Step ``step``'s output: ``batch`` decoding requests produced ``tokens`` tokens in
        ``cycle_ms`` (None: not timed); a step that also ran a prefill (``prefill``) counts
        only in the wave's whole time (``wave_ms``), not in the decode measurement.
        ``steady_k``: the K of a step that verified and drafted at that one K and caught
        nothing up (None otherwise): such measured steps also go to the record's ``by_k``
        rows, from which the comparison estimates each window's machine speed.
        ``policy_ms``: the part of ``cycle_ms`` the plugin spent on the deciding policy's
        own work (its observation of the step before, its decision, its trace records),
        kept apart (``policy_ms``) and out of the ``by_k`` times.  Returns the records of the
        windows now complete."""
        w = self._by_step.pop(step, None)
        if w is None:
            return []
        if cycle_ms is not None:
            w.all_steps += 1
            w.all_ms += float(cycle_ms)
        settle = w.first_step is not None and step < w.first_step + SETTLE_STEPS
        if cycle_ms is not None and not prefill and not settle and batch > 0:
            row = w.by_batch.setdefault(int(batch), [0, 0, 0.0])
            row[0] += 1
            row[1] += int(tokens)
            row[2] += float(cycle_ms)
            own = min(max(float(policy_ms), 0.0), float(cycle_ms))
            w.policy_ms += own
            if steady_k is not None and cycle_ms - own > 0:
                cell = w.by_k.setdefault((int(batch), int(steady_k)), [0, 0.0])
                cell[0] += 1
                cell[1] += math.log(float(cycle_ms) - own)
        return self._complete()

    def _complete(self) -> list[dict[str, Any]]:
        done = []
        while len(self._open) > 1:
            w = self._open[0]
            if any(v is w for v in self._by_step.values()):
                break  # an output of this window is still to come
            self._open.pop(0)
            done.append(w.record(self.names, self.waves))
        return done

    def close(self) -> list[dict[str, Any]]:
        """Every request has finished (waves): the current window's record, if it has
        steps and no output of it is pending; the next decision opens a new window as usual
        and the closed one is never recorded again."""
        w = self._current
        if w.decisions == 0 or w.closed or any(v is w for v in self._by_step.values()):
            return []
        w.closed = True
        done = self._complete()  # the windows before it
        self._open = [v for v in self._open if v is not w]
        return done + [w.record(self.names, self.waves)]

    def forget_pending(self) -> None:
        """The engine ran steps outside the pipeline (a forced K): the decided steps whose
        outputs are pending will not be seen."""
        self._by_step.clear()
