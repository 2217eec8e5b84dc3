"""The paired comparison at a common machine speed: each window's speed, read from its steady
steps, taken out of its time.

Why: the paired comparison pairs the policies inside rotation rounds, but a round's windows
still run at different machine speeds. On the CPU host (AVX2 EPYC, 2 cores) the steps of one
batch and K ran 8-10 % (sd) faster or slower from one window to the next (a few seconds
apart; lag-1 correlation 0.5-0.7), against 7-10 % for the steps inside a window, over the 21
paired servers of 2026-12-06/07; in a demo's code@4 cell online's steps at batch 4 and K = 2
took 1.09-1.19 x fixed K = 2's in each of its three rounds, and its 0.863 of fixed K = 2 was
that, not its choice (it held K = 2 on 45 of 52 decisions).

How: the engine keeps each window's steady steps (verified and drafted at one K, nothing
caught up) by (batch, K) (``by_k``: ``[batch, K, steps, geometric mean ms]``,
:mod:`vllm_hust_vspec.runtime.rotation`). Per server and cell, the log step time is fitted
as a cost per (batch, K) plus a speed effect per window, ``ln ms = c(batch, K) + u(window)``,
each window's effect shrunk toward the cell's mean by ``PRIOR_STEPS`` steps' worth of weight
(a window of two steps moves little; the windows' effects are centred to a mean of 0).
Steps at the same batch and K do the same work whatever policy decided them, so ``u`` is the
machine's speed in that window (plus whatever a policy adds to every step: below).  A
window's time at the common speed is its time over ``exp(u)`` (its every step: transitions,
resumes and prefill steps of a wave alike), and the comparison's ratios are taken again on
those times.

A policy's own work (a controller that takes longer to observe and decide than a fixed K's)
would vanish with the machine's speed if it were in the steps' times: the engine times it
(``policy_ms``: the deciding policy's observation, decision and trace records in each
cycle), keeps it out of the ``by_k`` times and the window keeps it unscaled. Anything else a
policy's steps take at the same batch and K is reported as a check (:func:`policy_effects`:
its steady steps against the fixed Ks', averaged over its windows, where each window's own
speed averages out). Records written before ``policy_ms`` count none: there a policy's own
work is taken out with the machine's speed, and the check shows it.

Measured on the 13 paired runs kept from 2026-12-06/07 (7 demos, 2 judged runs, 4 A/Bs):
the per-round ln ratio of two policies spread (sd, median over the cells and pairs of a run)
0.054-0.115 as measured and 0.034-0.081 at the common speed (docs/benchmarks.md, "At a
common machine speed"). Pure Python (no vLLM import).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vllm_hust_vspec.runtime.rotation import steady_rows

# a window of the paired comparison (tools.bench_paired.Window, a frozen dataclass; not
# imported: bench_paired imports this module for its report)
Window = Any

PRIOR_STEPS = 1.0  # a window's speed effect is shrunk toward 0 by this many steps' weight
ITERATIONS = 200  # alternating fits (converges to 1e-9 well within)
TOLERANCE = 1e-9


def _fit(groups: Sequence[Sequence[tuple[int, int, int, float]]]) -> list[float]:
    """The speed effect of each window of one server's cell, from its (batch, K, steps,
    geometric mean ms) rows: alternating least squares of ``ln ms = c(batch, K) + u`` with
    ``u`` shrunk by :data:`PRIOR_STEPS` and centred; 0 for a window without rows."""
    u = [0.0] * len(groups)
    rows = [[((b, k), n, math.log(ms)) for b, k, n, ms in g if n > 0 and ms > 0] for g in groups]
    with_rows = [i for i, r in enumerate(rows) if r]
    fitted = set(with_rows)
    if not with_rows:
        return u
    for _ in range(ITERATIONS):
        sums: dict[tuple[int, int], list[float]] = {}
        for i in with_rows:
            for key, n, y in rows[i]:
                s = sums.setdefault(key, [0.0, 0.0])
                s[0] += n * (y - u[i])
                s[1] += n
        cost = {key: s / n for key, (s, n) in sums.items()}
        new = [0.0] * len(groups)
        for i in with_rows:
            resid = sum(n * (y - cost[key]) for key, n, y in rows[i])
            new[i] = resid / (sum(n for _key, n, _y in rows[i]) + PRIOR_STEPS)
        mean = statistics.fmean(new[i] for i in with_rows)
        new = [v - mean if i in fitted else 0.0 for i, v in enumerate(new)]
        moved = max(abs(a - b) for a, b in zip(new, u))
        u = new
        if moved < TOLERANCE:
            break
    return u


def speed_effects(ws: Sequence[Window]) -> list[float]:
    """Each window's speed effect (ln of its steps' time over its cell's same batch and K at
    the common speed; 0 where it has no steady rows), fitted per (server round, cell)."""
    groups: dict[tuple[int, tuple[str, int | str]], list[int]] = {}
    for i, w in enumerate(ws):
        groups.setdefault((w.server_round, w.cell), []).append(i)
    out = [0.0] * len(ws)
    for idx in groups.values():
        for i, u in zip(idx, _fit([ws[i].by_k for i in idx])):
            out[i] = u
    return out


@dataclasses.dataclass(frozen=True)
class PolicyEffect:
    """A policy's steady steps against the fixed Ks' at the same batch and K, in the same
    server and cell: the mean over its windows of the ln ratio, its standard error over them."""

    policy: str
    effect: float
    stderr: float
    windows: int


def _cell_means(ws: Sequence[Window], keep: Callable[[Window], bool]) -> dict[tuple, float]:
    """Mean ln ms of the steady steps of the windows ``keep`` selects, by (server round,
    cell, batch, K), weighted by steps."""
    sums: dict[tuple, list[float]] = {}
    for w in ws:
        if keep(w):
            for b, k, n, ms in w.by_k:
                if n > 0 and ms > 0:
                    s = sums.setdefault((w.server_round, w.cell, b, k), [0.0, 0.0])
                    s[0] += n * math.log(ms)
                    s[1] += n
    return {key: s / n for key, (s, n) in sums.items()}


def policy_effects(ws: Sequence[Window]) -> dict[str, PolicyEffect]:
    """For each policy that is not a fixed K: each of its windows' steady steps against the
    fixed Ks' steps at the same batch and K in the same server and cell (the ln ratio,
    weighted by steps over the window's rows that have such steps), averaged over its
    windows. A window's own machine speed is noise in that figure, which averages out over
    windows; what stays is what the policy adds to every step (its decisions' time)."""
    fixed = _cell_means(ws, lambda w: w.policy.startswith("fixed:"))
    per: dict[str, list[float]] = {}
    for w in ws:
        if w.policy.startswith("fixed:"):
            continue
        num = den = 0.0
        for b, k, n, ms in w.by_k:
            ref = fixed.get((w.server_round, w.cell, b, k))
            if ref is not None and n > 0 and ms > 0:
                num += n * (math.log(ms) - ref)
                den += n
        if den > 0:
            per.setdefault(w.policy, []).append(num / den)
    return {p: PolicyEffect(p, statistics.fmean(ds),
                            statistics.stdev(ds) / math.sqrt(len(ds)) if len(ds) > 1 else 0.0,
                            len(ds))
            for p, ds in per.items()}


def has_rows(ws: Iterable[Window]) -> bool:
    return any(w.by_k for w in ws)


def policy_ms_per_step(ws: Sequence[Window]) -> dict[str, float]:
    """Each policy's own work a measured step (ms), over the windows that recorded it."""
    sums: dict[str, list[float]] = {}
    for w in ws:
        if w.policy_ms is not None and w.steps > 0:
            s = sums.setdefault(w.policy, [0.0, 0.0])
            s[0] += w.policy_ms
            s[1] += w.steps
    return {p: ms / n for p, (ms, n) in sums.items() if n > 0}


def at_common_speed(ws: Sequence[Window]) -> tuple[list[Window], dict[str, PolicyEffect]]:
    """The windows with their times (``ms``, ``by_batch``, ``wave_ms``) at their cell's
    common machine speed, the policy's own work (``policy_ms``) kept as measured; and each
    policy's other effect on its steps (:func:`policy_effects`, a check)."""
    effects = speed_effects(ws)
    out = []
    for w, u in zip(ws, effects):
        scale = math.exp(-u)
        own = min(w.policy_ms or 0.0, w.ms)  # the wave holds the measured steps: wave_ms >= ms
        ms = (w.ms - own) * scale + own
        f = ms / w.ms if w.ms > 0 else 1.0
        wave = None if w.wave_ms is None else (w.wave_ms - own) * scale + own
        out.append(dataclasses.replace(
            w, ms=ms, by_batch=tuple((b, n, t, m * f) for b, n, t, m in w.by_batch),
            wave_ms=wave))
    return out, policy_effects(ws)


def by_k_from_trace(records: Iterable[Mapping[str, Any]]) -> dict[int, list[list]]:
    """``by_k`` rows for the window records of a decision trace written before the engine
    kept them, rebuilt from its step records: window number -> rows. Only for traces of
    waves (``--paired-waves``): there a window's steps are those between the record of the
    window before it and its own. A steady step: the decision before it had the same K,
    batch and policy, its time was measured (no prefill) and it caught nothing up."""
    out: dict[int, list[list]] = {}
    decided: dict[int, Mapping[str, Any]] = {}
    cur: dict[tuple[int, int], list[float]] = {}
    for rec in records:
        if "window" in rec:
            out[int(rec["window"])] = steady_rows(cur)
            cur = {}
        elif "k" in rec and "batch" in rec and "step" in rec:
            decided[int(rec["step"])] = rec
        elif "drafted" in rec and rec.get("ms") and "catch_up_ms" not in rec:
            step = int(rec["step"])
            now, before = decided.get(step), decided.get(step - 1)
            if (now is not None and before is not None and now["k"] == before["k"]
                    and now["batch"] == before["batch"]
                    and now.get("policy") == before.get("policy")):
                cell = cur.setdefault((int(now["batch"]), int(now["k"])), [0, 0.0])
                cell[0] += 1
                cell[1] += math.log(float(rec["ms"]))
    return out


def rebuildable(ws: Sequence[Window]) -> bool:
    """True for windows of waves written before the engine kept ``by_k`` (none has rows,
    every one is a wave): :func:`with_rows` can rebuild their rows from the traces."""
    return bool(ws) and not has_rows(ws) and all(w.wave_ms is not None for w in ws)


def with_rows(ws: Sequence[Window], traces: Mapping[int, Iterable[Mapping[str, Any]]]) -> list[Window]:
    """The windows with ``by_k`` rebuilt from each server round's decision-trace records
    (``traces``: server round -> records, :func:`by_k_from_trace`)."""
    rows = {r: by_k_from_trace(recs) for r, recs in traces.items()}
    return [dataclasses.replace(w, by_k=tuple((int(b), int(k), int(n), float(ms)) for b, k, n, ms
                                              in rows.get(w.server_round, {}).get(w.window, ())))
            for w in ws]
