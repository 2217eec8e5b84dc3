"""The paired in-engine comparison of ``vllm-hust-vspec-bench ab`` (configuration ``paired``).

One plugin server runs with ``--adaptive-compare`` (the policies take turns in short windows
of decode steps, :mod:`vllm_hust_vspec.runtime.rotation`); each window's record (tokens,
cycle time) is read back from the decision trace per cell and phase.  Each rotation round
gives every policy one window under the same machine speed and load, so ratios are taken
inside a round and summarised over rounds:

* every speed is taken at the same decoding batch: a window's steps are split by batch
  (its ``by_batch`` rows), and its *index* is the time every policy's steps of the same
  server round took on average for its tokens at those batches, over the time it took
  (1.0: as fast as the policies' pooled steps at the same batch). Why: a cell's load fills
  and drains, and the windows of one round fall in different parts of it; in a fresh demo
  server at code@16 fixed K = 1's windows caught most of the 50 steps at batch 16 and its
  pooled speed came out 1.8 x online's and 2.4 x fixed K = 4's, of a batch mix, not of K;
* ``tok/s``: a policy's speed at the cell's batch mix (its index x the pooled speed of
  every policy's windows);
* ``/ best fixed``: per rotation round, the policy's index over the best fixed K's (the
  fixed policy with the highest pooled index in the cell), median [quartiles] over the
  rounds, and the pooled ratio of each server round (min-max over the benchmark's rounds);
* for a swing cell also ``/ per-phase best``: the time the per-phase best fixed K would take
  for each phase's tokens, composed over the phases, against the policy's own;
* ``held out``: the same two ratios with the best fixed K (of the cell, or of each phase)
  picked on one half of the rotation rounds and timed on the other, both ways, pooled over
  200 random half-splits (:func:`_held_out`). Why: picked and timed on the same windows, the
  best of several noisy fixed Ks is timed at its luckiest, and a per-phase pick (on a fifth
  of the windows) more so; in the judged run of 2026-12-07 (three servers, 18 rotation
  rounds a phase) online was 0.978 of the per-phase best picked in sample and 0.985 held
  out. The in-sample figure overstates what any fixed K chosen in advance serves, the
  held-out one understates what the truly best fixed K would (a half can pick the wrong
  one): the two bracket it;
* ``/ fixed K = 0`` where ``fixed:0`` takes turns too: per rotation round the policy's index
  over fixed K = 0's, median [quartiles]. Fixed K = 0 is the plugin drafting nothing, the
  drafter skipped (``adaptive_k0_drafter = skip``): target-only's steps inside the same
  engine, on the same texts and at the same machine speed. What it costs against a server
  without the plugin is measured apart (``scripts/bench_k0_tax.py``, docs/benchmarks.md,
  "What K = 0 costs"). Why: the plugin-off baseline (``none``) has its own server, and on
  this CPU host servers of the same configuration drew 42-65 tok/s for the same requests
  (AVX2 EPYC, 2026-12-06), so ``online / none`` across servers judged no cell.

* end to end, with ``--paired-waves``: every policy of a rotation round served the same
  requests to the same tokens, so the ratio of two policies' whole wave times (``wave_ms``:
  their prefill steps too, which the decode measurement leaves out) is their end-to-end
  ratio, per round, median [quartiles] (:func:`summarize_waves`). Why: the decode steps
  alone overstate a speed-up where the prompts take a large share of a wave; in the demo's
  batch-16 waves the prefill steps took 2.5-2.7 s against about 2.4 s of decode steps
  (within a few percent of each other whatever the policy), and with speculation a wave's
  requests finish at different steps, its last steps at small batches, which the decode
  index credits: across servers online ran 0.84-0.90 x target-only there in three demo
  runs, paired decode steps said 1.05-1.17 x fixed K = 0, whole waves 0.95.

* at a common machine speed, where the windows kept their steady steps (``by_k``): the
  tables again with each window's time at its cell's common machine speed, the policy's own
  work kept as measured (:mod:`.paired_speed`). Why: the windows of one round still ran 8-10 %
  apart in machine speed on the CPU host, which the rounds' pairing does not take out.

``results.json`` holds the window records under ``"paired"``.  Pure Python (no vLLM import).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vllm_hust_vspec import checks
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.tools import paired_speed

WINDOW_KEYS = ("workload", "concurrency", "phase", "server_round", "window", "round", "policy",
               "steps", "tokens", "ms", "batch", "load_1m", "by_batch", "wave_steps", "wave_ms",
               "by_k", "policy_ms")
# absent from records written before them (wave_*: and from windows that are not waves)
OPTIONAL_KEYS = ("load_1m", "by_batch", "wave_steps", "wave_ms", "by_k", "policy_ms")


class PairedError(VspecError, ValueError):
    """A paired window record is malformed."""


@dataclasses.dataclass(frozen=True)
class Window:
    workload: str
    concurrency: int | str
    phase: int  # the cell's phase (0 for cells of one phase)
    server_round: int  # the benchmark's round (one server each)
    window: int
    round: int  # the rotation round inside that server
    policy: str  # "fixed:2", "online", ...
    steps: int
    tokens: int
    ms: float
    batch: float
    load_1m: float | None = None  # the machine's load average before this server started
    # (batch, steps, tokens, ms) per decoding batch of the measured steps; () in records
    # written before it (the window counts as one row at its mean batch)
    by_batch: tuple[tuple[int, int, int, float], ...] = ()
    # --paired-waves: every step of the wave, prefill included (None: not a wave, or a
    # record written before them)
    wave_steps: int | None = None
    wave_ms: float | None = None
    # the steady steps (one K verified and drafted) as (batch, K, steps, geometric mean ms)
    # rows, from which tools/paired_speed.py reads the window's machine speed; () in records
    # written before them
    by_k: tuple[tuple[int, int, int, float], ...] = ()
    # the measured steps' time spent on the deciding policy's own work (None: not recorded)
    policy_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in WINDOW_KEYS}
        out["by_batch"] = [list(r) for r in self.by_batch]
        out["by_k"] = [list(r) for r in self.by_k]
        return out

    def rows(self) -> tuple[tuple[int, int, int, float], ...]:
        """The window's (batch, steps, tokens, ms) rows."""
        if self.by_batch:
            return self.by_batch
        if self.steps <= 0:
            return ()
        return ((max(1, round(self.batch)), self.steps, self.tokens, self.ms),)

    @property
    def cell(self) -> tuple[str, int | str]:
        return (self.workload, self.concurrency)


def windows_from_trace(records: Iterable[Mapping[str, Any]], workload: str,
                       concurrency: int | str, phase: int, server_round: int,
                       load_1m: float | None = None) -> list[Window]:
    """The window records of one phase's slice of a decision trace."""
    out = []
    for rec in records:
        if "window" not in rec:
            continue
        out.append(Window(workload=workload, concurrency=concurrency, phase=phase,
                          server_round=server_round, window=int(rec["window"]),
                          round=int(rec["round"]), policy=str(rec["policy"]),
                          steps=int(rec["steps"]), tokens=int(rec["tokens"]),
                          ms=float(rec["ms"]), batch=float(rec["batch"]), load_1m=load_1m,
                          by_batch=_rows(rec.get("by_batch") or (), "window record", "by_batch"),
                          wave_steps=(None if rec.get("wave_steps") is None
                                      else int(rec["wave_steps"])),
                          wave_ms=_nonneg(rec, "wave_ms", f"window record {rec['window']!r}",
                                          optional=True),
                          by_k=_rows(rec.get("by_k") or (), "window record", "by_k"),
                          policy_ms=_nonneg(rec, "policy_ms",
                                            f"window record {rec['window']!r}", optional=True)))
    return out


def _nonneg(rec: Mapping[str, Any], key: str, where: str, optional: bool = False) -> float | None:
    """``rec[key]`` as a float, refused with its place and key named unless it is a finite
    number >= 0; None for an ``optional`` key that is absent (records written before it)."""
    v = rec.get(key)
    if v is None and optional:
        return None
    if not checks.is_number(v) or v < 0:
        raise PairedError(f"{where}: key '{key}' must be a finite number >= 0, got {v!r}")
    return float(v)


_ROW_FORMS = {"by_batch": "[batch, steps, tokens, ms]", "by_k": "[batch, K, steps, ms]"}


def _rows(rows: Any, where: str, key: str) -> tuple[tuple[int, int, int, float], ...]:
    """``by_batch`` or ``by_k`` rows (three integers and a time) as tuples; a malformed row is
    refused with its place named."""
    form = _ROW_FORMS[key]
    if not isinstance(rows, (list, tuple)):
        raise PairedError(f"{where}: key '{key}' must be a list of {form}")
    out = []
    for i, row in enumerate(rows):
        ok = (isinstance(row, (list, tuple)) and len(row) == 4
              and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row[:3])
              and checks.is_number(row[3]) and row[3] >= 0)
        if not ok:
            raise PairedError(f"{where}: {key}[{i}] must be {form} "
                              f"(integers >= 0, ms a number >= 0), got {row!r}")
        out.append((int(row[0]), int(row[1]), int(row[2]), float(row[3])))
    return tuple(out)


def window_from_dict(rec: Any, where: str) -> Window:
    if not isinstance(rec, dict):
        raise PairedError(f"{where}: must be an object")
    missing = [k for k in WINDOW_KEYS if k not in rec and k not in OPTIONAL_KEYS]
    if missing:
        raise PairedError(f"{where}: key '{missing[0]}' is missing")
    extra = sorted(set(rec) - set(WINDOW_KEYS))
    if extra:
        raise PairedError(f"{where}: unknown key {extra[0]!r}")
    for key in ("phase", "server_round", "window", "round", "steps", "tokens", "wave_steps"):
        v = rec.get(key)
        if key == "wave_steps" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise PairedError(f"{where}: key '{key}' must be an integer >= 0, got {v!r}")
    for key in ("ms", "batch", "load_1m", "wave_ms", "policy_ms"):
        _nonneg(rec, key, where, optional=key in ("load_1m", "wave_ms", "policy_ms"))
    if not isinstance(rec["policy"], str) or not rec["policy"]:
        raise PairedError(f"{where}: key 'policy' must be a non-empty string")
    fields = {k: rec.get(k) for k in WINDOW_KEYS if k not in ("by_batch", "by_k")}
    return Window(**fields, by_batch=_rows(rec.get("by_batch") or (), where, "by_batch"),
                  by_k=_rows(rec.get("by_k") or (), where, "by_k"))


K0 = "fixed:0"  # the plugin drafting nothing: target-only's steps in the same engine


def is_fixed(policy: str) -> bool:
    return policy.startswith("fixed:")


def _speed(ws: Sequence[Window]) -> float | None:
    ms = sum(w.ms for w in ws)
    return 1000.0 * sum(w.tokens for w in ws) / ms if ms > 0 else None


Reference = Mapping[tuple[int, int], float]  # (server round, batch) -> tokens per ms


def _reference(ws: Sequence[Window]) -> dict[tuple[int, int], float]:
    """Tokens per ms of every window's steps at each (server round, batch)."""
    tok: dict[tuple[int, int], float] = {}
    ms: dict[tuple[int, int], float] = {}
    for w in ws:
        for b, _n, t, m in w.rows():
            key = (w.server_round, b)
            tok[key] = tok.get(key, 0.0) + t
            ms[key] = ms.get(key, 0.0) + m
    return {key: tok[key] / ms[key] for key in tok if ms[key] > 0 and tok[key] > 0}


def _times(ws: Sequence[Window], ref: Reference) -> tuple[float, float]:
    """(the time the reference takes for the windows' tokens at their batches, the time the
    windows took there)."""
    expected = 0.0
    own = 0.0
    for w in ws:
        for b, _n, t, m in w.rows():
            r = ref.get((w.server_round, b))
            if r:
                expected += t / r
                own += m
    return expected, own


def _index(ws: Sequence[Window], ref: Reference) -> float | None:
    """The windows' index: :func:`_times`' ratio (None: no measured time)."""
    expected, own = _times(ws, ref)
    return expected / own if own > 0 else None


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0])
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[0], q[2])


@dataclasses.dataclass(frozen=True)
class PolicyRow:
    policy: str
    tok_s: float  # pooled over the cell
    ratio: float | None  # median over rotation rounds of / best fixed
    q1: float | None
    q3: float | None
    rounds: int  # rotation rounds paired
    server_lo: float | None  # pooled / best fixed, min and max over server rounds
    server_hi: float | None
    phase_ratio: float | None  # swing: / the per-phase best fixed K composed
    k0: float | None = None  # median over rotation rounds of / fixed K = 0 (None: not run)
    k0_q1: float | None = None
    k0_q3: float | None = None
    held_out: float | None = None  # / the best fixed K picked on the other half of rounds
    phase_held_out: float | None = None  # swing: / the per-phase best so picked, composed


@dataclasses.dataclass(frozen=True)
class PairedCell:
    workload: str
    concurrency: int | str
    best_fixed: str | None
    rows: list[PolicyRow]

    def row(self, policy: str) -> PolicyRow | None:
        return next((r for r in self.rows if r.policy == policy), None)


def _complete_rounds(ws: Sequence[Window], policies: Sequence[str]) -> dict[tuple[int, int, int], dict[str, list[Window]]]:
    """(server round, phase, rotation round) -> policy -> windows, for the rounds in which
    every policy has measured steps."""
    groups: dict[tuple[int, int, int], dict[str, list[Window]]] = {}
    for w in ws:
        if w.steps > 0:
            groups.setdefault((w.server_round, w.phase, w.round), {}).setdefault(w.policy, []).append(w)
    return {key: g for key, g in groups.items() if all(p in g for p in policies)}


def summarize_cell(ws: Sequence[Window]) -> PairedCell:
    policies = list(dict.fromkeys(w.policy for w in ws))
    rounds = _complete_rounds(ws, policies)
    paired = [w for g in rounds.values() for v in g.values() for w in v]
    ref = _reference(paired)
    pooled = _speed(paired) or 0.0
    index = {p: _index([w for w in paired if w.policy == p], ref) or 0.0 for p in policies}
    fixed = [p for p in policies if is_fixed(p)]
    best = max(fixed, key=lambda p: index[p]) if fixed else None
    phases = sorted({w.phase for w in paired})
    zero = K0 if K0 in policies else None
    times = {key: {p: _times(g[p], ref) for p in g} for key, g in rounds.items()}

    def score(keys: Sequence[tuple[int, int, int]], f: str) -> float:
        return _pooled_index(times, keys, f) or 0.0

    picks = _held_out_picks(rounds, fixed, score, by_phase=False)
    phase_picks = _held_out_picks(rounds, fixed, score, by_phase=True) if len(phases) > 1 else []
    rows = []
    for p in policies:
        ratio = q1 = q3 = lo = hi = phase_ratio = None
        per_round = _round_ratios(times, p, best) if best is not None else []
        k0_rounds = _round_ratios(times, p, zero) if zero is not None else []
        if best is not None:
            by_server = []
            for s in sorted({key[0] for key in rounds}):
                a = _index([w for w in paired if w.policy == p and w.server_round == s], ref)
                b = _index([w for w in paired if w.policy == best and w.server_round == s], ref)
                if a is not None and b:
                    by_server.append(a / b)
            ratio, q1, q3 = _median_quartiles(per_round)
            if by_server:
                lo, hi = min(by_server), max(by_server)
            if len(phases) > 1:
                phase_ratio = _phase_ratio(paired, p, fixed, phases, ref)
        k0, k0_q1, k0_q3 = _median_quartiles(k0_rounds)
        rows.append(PolicyRow(policy=p, tok_s=index[p] * pooled, ratio=ratio, q1=q1, q3=q3,
                              rounds=len(per_round), server_lo=lo, server_hi=hi,
                              phase_ratio=phase_ratio, k0=k0, k0_q1=k0_q1, k0_q3=k0_q3,
                              held_out=_held_out(times, p, picks),
                              phase_held_out=_held_out(times, p, phase_picks)))
    w0 = ws[0]
    return PairedCell(w0.workload, w0.concurrency, best, rows)


def _median_quartiles(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """Median, first and third quartile of per-round ratios (None each without rounds)."""
    if not values:
        return None, None, None
    q1, q3 = _quartiles(values)
    return float(statistics.median(values)), q1, q3


def _round_ratios(times: Mapping[tuple[int, int, int], Mapping[str, tuple[float, float]]],
                  policy: str, other: str) -> list[float]:
    """The policy's index over ``other``'s in each rotation round (``times``: each round's
    :func:`_times` of every policy)."""
    out = []
    for key in times:
        a, b = _pooled_index(times, (key,), policy), _pooled_index(times, (key,), other)
        if a is not None and b:
            out.append(a / b)
    return out


def _phase_ratio(paired: Sequence[Window], policy: str, fixed: Sequence[str],
                 phases: Sequence[int], ref: Reference) -> float | None:
    """A policy's speed over the per-phase best fixed K's, composed: for each phase the
    time its tokens (the policy's own, at its batches) take at the best fixed K's index of
    that phase."""
    own = 0.0
    oracle = 0.0
    for ph in phases:
        expected, ms = _times([w for w in paired if w.policy == policy and w.phase == ph], ref)
        best = [i for f in fixed
                if (i := _index([w for w in paired if w.policy == f and w.phase == ph], ref))]
        if not best or ms <= 0 or expected <= 0:
            return None
        own += ms
        oracle += expected / max(best)
    return oracle / own if own > 0 else None


HELD_OUT_SPLITS = 200  # random half-splits of the rotation rounds the held-out ratios pool


def _halves(keys: Iterable[tuple[int, int, int]],
            by_phase: bool) -> list[tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]]:
    """(picking half, timed half) pairs of rotation-round keys (server round, phase,
    rotation round), ``HELD_OUT_SPLITS`` random splits (seeded: the same report every
    time) of each phase's rounds into two halves, each half timed once and picked on the
    other; with ``by_phase`` a phase at a time, else over all phases together. Empty when a
    phase has under 2 rounds. Why random: the rotation shifts the policies' order by one
    each round, so alternate rounds put a policy in alternate positions, and a split by
    parity keeps each policy to the same positions in each half (in the judged run of
    2026-12-07 the fixed K picked on one parity was the slowest on the other at batch 1:
    every fixed K measured 1.04-1.09 of it)."""
    phases: dict[int, list[tuple[int, int, int]]] = {}
    for key in sorted(keys):
        phases.setdefault(key[1], []).append(key)
    if not phases or any(len(g) < 2 for g in phases.values()):
        return []
    rng = random.Random(0)
    out = []
    for _ in range(HELD_OUT_SPLITS):
        a: list[tuple[int, int, int]] = []
        b: list[tuple[int, int, int]] = []
        for g in phases.values():
            order = rng.sample(g, len(g))
            half = len(order) // 2
            if by_phase:
                out += [(order[half:], order[:half]), (order[:half], order[half:])]
            else:
                a += order[:half]
                b += order[half:]
        if not by_phase:
            out += [(b, a), (a, b)]
    return out


def _held_out_picks(keys: Iterable[tuple[int, int, int]], fixed: Sequence[str],
                    score: Callable[[Sequence[tuple[int, int, int]], str], float],
                    by_phase: bool) -> list[tuple[list[tuple[int, int, int]], str]]:
    """(timed half, the fixed K of the highest ``score`` on the other half) for each split of
    :func:`_halves`: the same for every policy of a cell (empty without fixed Ks)."""
    if not fixed:
        return []
    return [(time_keys, max(fixed, key=lambda f: score(pick_keys, f)))
            for pick_keys, time_keys in _halves(keys, by_phase)]


def _pooled_index(times: Mapping[tuple[int, int, int], Mapping[str, tuple[float, float]]],
                  keys: Sequence[tuple[int, int, int]], policy: str) -> float | None:
    """:func:`_index` of a policy's windows in the rounds ``keys``, from each round's
    :func:`_times`."""
    expected = sum(times[k][policy][0] for k in keys)
    ms = sum(times[k][policy][1] for k in keys)
    return expected / ms if ms > 0 else None


def _held_out(times: Mapping[tuple[int, int, int], Mapping[str, tuple[float, float]]],
              policy: str, picks: Sequence[tuple[list[tuple[int, int, int]], str]]) -> float | None:
    """A policy's speed over the best fixed K picked on the other half of the rotation
    rounds (``picks``: :func:`_held_out_picks`), pooled over the splits: the time the picked
    K's index gives the policy's own tokens, over the time they took (None: no splits, or a
    half without a timed window)."""
    own = oracle = 0.0
    for time_keys, pick in picks:
        expected = sum(times[k][policy][0] for k in time_keys)
        ms = sum(times[k][policy][1] for k in time_keys)
        picked = _pooled_index(times, time_keys, pick)
        if not picked or ms <= 0:
            return None
        own += ms
        oracle += expected / picked
    return oracle / own if own > 0 else None


def combine(runs: Sequence[Sequence[Window]]) -> list[Window]:
    """The windows of several benchmark runs as one run's: each run's server rounds are
    numbered after those of the runs before it (a server round is one server), so every
    ratio stays inside one server's rotation round and the min-max covers every server."""
    out: list[Window] = []
    base = 0
    for ws in runs:
        rounds = sorted({w.server_round for w in ws})
        renumber = {r: base + i for i, r in enumerate(rounds, 1)}
        out += [dataclasses.replace(w, server_round=renumber[w.server_round]) for w in ws]
        base += len(rounds)
    return out


def by_cell(ws: Sequence[Window]) -> list[list[Window]]:
    """The windows of each cell, cells in their first window's order."""
    cells: dict[tuple[str, int | str], list[Window]] = {}
    for w in ws:
        cells.setdefault(w.cell, []).append(w)
    return list(cells.values())


def summarize(ws: Sequence[Window]) -> list[PairedCell]:
    return [summarize_cell(v) for v in by_cell(ws)]


@dataclasses.dataclass(frozen=True)
class WaveRow:
    """A policy's whole waves (prompts included) against the others' in the same rounds."""

    policy: str
    ratio: float | None  # median over rotation rounds of best fixed's wave time / its own
    q1: float | None
    q3: float | None
    rounds: int
    phase_ratio: float | None  # swing: the per-phase best fixed K's wave time / its own
    k0: float | None  # median over rotation rounds of fixed K = 0's wave time / its own
    k0_q1: float | None
    k0_q3: float | None
    held_out: float | None = None  # the wave time of the best fixed K picked on the other
    # half of the rotation rounds / its own (:func:`_held_out`)
    phase_held_out: float | None = None  # swing: the same, picked a phase at a time


@dataclasses.dataclass(frozen=True)
class WaveCell:
    workload: str
    concurrency: int | str
    best_fixed: str | None  # the fixed K with the least wave time over the complete rounds
    rows: list[WaveRow]


def summarize_waves(ws: Sequence[Window]) -> list[WaveCell]:
    """End to end, per cell: with ``--paired-waves`` every policy of a rotation round
    served the same requests to the same tokens, so the ratio of two policies' whole wave
    times (``wave_ms``: prefill steps included) is their end-to-end speed ratio; cells
    whose windows carry no wave times are left out."""
    out = []
    for cws in by_cell(ws):
        if not all(w.wave_ms for w in cws):
            continue
        policies = list(dict.fromkeys(w.policy for w in cws))
        groups: dict[tuple[int, int, int], dict[str, float]] = {}
        for w in cws:
            g = groups.setdefault((w.server_round, w.phase, w.round), {})
            g[w.policy] = g.get(w.policy, 0.0) + float(w.wave_ms or 0.0)
        rounds = {key: g for key, g in groups.items() if all(p in g for p in policies)}
        if not rounds:
            continue
        total = {p: sum(g[p] for g in rounds.values()) for p in policies}
        fixed = [p for p in policies if is_fixed(p)]
        best = min(fixed, key=total.__getitem__) if fixed else None
        phases = sorted({key[1] for key in rounds})

        def score(keys: Sequence[tuple[int, int, int]], f: str) -> float:
            return -sum(rounds[k][f] for k in keys)  # the least wave time

        picks = _held_out_picks(rounds, fixed, score, by_phase=False)
        phase_picks = (_held_out_picks(rounds, fixed, score, by_phase=True)
                       if len(phases) > 1 else [])
        rows = []
        for p in policies:
            per = [g[best] / g[p] for g in rounds.values()] if best else []
            zero = [g[K0] / g[p] for g in rounds.values()] if K0 in policies else []
            ratio, q1, q3 = _median_quartiles(per)
            k0, k0_q1, k0_q3 = _median_quartiles(zero)
            phase_ratio = None
            if fixed and len(phases) > 1:
                oracle = sum(min(sum(g[f] for key, g in rounds.items() if key[1] == ph)
                                 for f in fixed) for ph in phases)
                phase_ratio = oracle / total[p]
            rows.append(WaveRow(p, ratio, q1, q3, len(per), phase_ratio, k0, k0_q1, k0_q3,
                                _held_out_waves(rounds, p, picks),
                                _held_out_waves(rounds, p, phase_picks)))
        out.append(WaveCell(cws[0].workload, cws[0].concurrency, best, rows))
    return out


def _held_out_waves(rounds: Mapping[tuple[int, int, int], Mapping[str, float]], policy: str,
                    picks: Sequence[tuple[list[tuple[int, int, int]], str]]) -> float | None:
    """:func:`_held_out` for whole waves: the wave time of the fixed K with the least wave
    time on the other half of the rotation rounds (``picks``) over the policy's own, the
    splits pooled (None: no splits)."""
    own = oracle = 0.0
    for time_keys, pick in picks:
        own += sum(rounds[k][policy] for k in time_keys)
        oracle += sum(rounds[k][pick] for k in time_keys)
    return oracle / own if own > 0 and oracle > 0 else None


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _mq(median: float | None, q1: float | None, q3: float | None) -> str:
    """A median ratio and its quartiles (``-`` without rounds)."""
    return "-" if median is None else f"{median:.3f} [{q1:.3f}-{q3:.3f}]"


def markdown(ws: Sequence[Window]) -> str:
    """The paired section of the A/B report."""
    if not ws:
        return ""
    cells = summarize(ws)
    loads = sorted({w.load_1m for w in ws if w.load_1m is not None})
    zero = (" `/ fixed K = 0`: against the plugin drafting nothing in the same engine "
            "(target-only's steps; its cost against a server without the plugin: "
            "`scripts/bench_k0_tax.py`)." if any(w.policy == K0 for w in ws) else "")
    load = ("" if not loads else f" Load average (1 min) before each server: "
            f"{', '.join(f'{x:.2f}' for x in loads)}.")
    lines = ["", "## Paired in-engine comparison", "",
             "One server, the policies taking turns in windows of decode steps "
             "(`--adaptive-compare`), each window's speed set against every policy's steps "
             "at the same decoding batch. Each cell: tok/s at the cell's batch mix, then "
             "`/ best fixed` as the median [quartiles] over rotation rounds (n), the pooled "
             "ratio's min-max over server rounds, and for a swing the ratio to the "
             "per-phase best fixed K. `held out`: the pooled ratio to the best fixed K "
             "(per phase: to each phase's) picked on one half of the rotation rounds and "
             "timed on the other, both ways; picked and timed on the same rounds the best "
             "of several noisy fixed Ks is timed at its luckiest." + load + zero, ""]
    return "\n".join(lines + _decode_table(cells) + _wave_lines(ws)
                     + _common_speed_lines(ws)) + "\n"


def _decode_table(cells: Sequence[PairedCell]) -> list[str]:
    lines = ["| workload | conc | best fixed | policy | tok/s | / best fixed [q1-q3] (n) "
             "| server rounds | held out | / per-phase best | held out "
             "| / fixed K = 0 [q1-q3] |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        for r in c.rows:
            spread = ("-" if r.server_lo is None
                      else f"{r.server_lo:.3f}-{r.server_hi:.3f}")
            lines.append(f"| {c.workload} | {c.concurrency} | {c.best_fixed or '-'} | "
                         f"{r.policy} | {r.tok_s:.1f} | {_mq(r.ratio, r.q1, r.q3)} ({r.rounds}) | "
                         f"{spread} | {_r(r.held_out)} | {_r(r.phase_ratio)} | "
                         f"{_r(r.phase_held_out)} | {_mq(r.k0, r.k0_q1, r.k0_q3)} |")
    return lines


def _common_speed_lines(ws: Sequence[Window]) -> list[str]:
    """The decode and end-to-end tables again at each cell's common machine speed
    (:mod:`.paired_speed`), or nothing when no window kept its steady steps."""
    if not paired_speed.has_rows(ws):
        return []
    adjusted, effects = paired_speed.at_common_speed(ws)
    per_policy = ", ".join(
        f"{e.policy} {math.exp(e.effect):.3f} (+-{e.stderr:.3f}, {e.windows} windows)"
        for e in sorted(effects.values(), key=lambda e: e.policy))
    own = paired_speed.policy_ms_per_step(ws)
    own_text = ", ".join(f"{p} {ms:.3f}" for p, ms in sorted(own.items()))
    lines = ["", "## At a common machine speed", "",
             "The same rounds with each window's time taken at its cell's common machine "
             "speed: the steps a window made at one batch and K (verified and drafted at it) "
             "against every window's steps at that batch and K in the same server and cell "
             "give the window's speed, which is taken out of its time "
             "(`vllm_hust_vspec.tools.paired_speed`). The windows of one round ran 8-10 % "
             "apart in machine speed on this CPU host; the ratios below carry the policies' "
             "choices without it. The time the engine spent on each policy's own work (its "
             "observation, decision and trace records) stays in its ratios as measured: "
             f"{own_text or 'not recorded (a run before it was)'} ms a step. What else a "
             "policy's steps took: its steady steps (its own work out of them) against the "
             "fixed Ks' at the same batch and K, mean over its windows (+- standard error; "
             "each window's machine speed is noise in it): "
             f"{per_policy or 'no steps to compare'}.", ""]
    return (lines + _decode_table(summarize(adjusted))
            + _wave_lines(adjusted, "### End to end at the common speed"))


def _wave_lines(ws: Sequence[Window],
                title: str = "### End to end: whole waves, prompts included") -> list[str]:
    """The end-to-end table (whole waves, prompts included), or nothing without wave
    times."""
    cells = summarize_waves(ws)
    if not cells:
        return []
    lines = ["", title, "",
             "The same rounds, each policy's whole wave (its prefill steps too: what a client "
             "waits for) against the others' on the same requests and tokens: the decode "
             "table measures decode steps alone, and where the prompts take a large share of "
             "a wave (short outputs, a full batch) it overstates what the decode speed-up is "
             "worth end to end. `/ best fixed`: the fixed K with the least wave time; median "
             "[quartiles] over rotation rounds (n).", "",
             "| workload | conc | best fixed | policy | / best fixed [q1-q3] (n) | held out "
             "| / per-phase best | held out | / fixed K = 0 [q1-q3] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        for r in c.rows:
            lines.append(f"| {c.workload} | {c.concurrency} | {c.best_fixed or '-'} | "
                         f"{r.policy} | {_mq(r.ratio, r.q1, r.q3)} ({r.rounds}) | "
                         f"{_r(r.held_out)} | {_r(r.phase_ratio)} | {_r(r.phase_held_out)} | "
                         f"{_mq(r.k0, r.k0_q1, r.k0_q3)} |")
    return lines
