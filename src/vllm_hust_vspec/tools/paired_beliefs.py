"""What the online controller believed against what the engine then did, per paired cell.

Sim-to-real for a paired comparison (``bench ab --configs paired``): in every cell the fixed
policies served the same texts in the same engine minutes, so their windows measure, at each
decoding batch, what a step of every K costs and how many tokens it makes.  The online
policy's decisions in that cell record what it believed at the time: the price of every K
(``est_costs``), the acceptance per draft position (``est_accept``) and the goodput it
expected (``est_goodput``).  For each cell, server and batch size this module sets the two
side by side:

- ``priced / measured``: online's median price of each K over its decisions at that batch,
  divided by the fixed K's measured step time there (a K-independent factor is the
  machine's speed between minutes; what decides K is the *shape*: how the ratios differ);
- ``shape error``: the mean ``|log|`` of online's priced K-to-K' ratios against the measured
  ones (K' the held K of the decision), over its decisions;
- ``switch steps``: the median time of online's steps that drafted another K than its step
  before, over the fixed K's step (the count in brackets);
- the goodput, against the best fixed K's, of the K its beliefs ranked first (``believed
  best``: its expected goodput, ``est_goodput``; the K it held also weighs hysteresis and
  the models' errors), of the
  K it would have chosen with the measured costs and its own acceptance estimates
  (``acceptance only``: the loss its acceptance estimates cause), and with its own prices and
  the measured tokens per step (``cost only``: the loss its prices cause).

Found with it (two paired servers of 2026-12-06, ``docs/benchmarks.md``): on mixed@1 online
held K = 1 where K = 2 was best because it priced K = 2 at 40.5 ms where K = 2 steps took
34.2 (K = 1 at 32.0 against 29.8): cost only 0.955, acceptance only 0.998.

``vllm-hust-vspec-bench paired RESULTS.json --beliefs`` prints the table; the decision traces
are read from ``traces/paired-r<server round>.jsonl`` next to the results.  Pure Python.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import pathlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_hust_vspec.adaptive.estimators import expected_committed
from .bench_paired import Window, by_cell, is_fixed
from .trace_picture import load

MIN_STEPS = 5  # measured steps a fixed K needs at a batch for the batch to be compared
ONLINE = "online"


@dataclasses.dataclass
class BeliefRow:
    workload: str
    concurrency: int | str
    server_round: int
    batch: int
    decisions: int
    ks: list[int]  # the fixed Ks measured at this batch
    priced_vs_measured: list[float]  # per K of ks: median price / measured ms
    shape_error: float  # mean |log| of priced vs measured K-to-held-K ratios
    chosen: float  # measured goodput of the K the beliefs ranked first / best fixed K's
    acceptance_only: float
    cost_only: float
    switches: int = 0  # online's timed steps that drafted another K than the step before
    switch_cost: float | None = None  # their median ms / the fixed K's measured step


def decisions_by_window(records: Iterable[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """The decision records of each window of a paired decision trace: a window's record
    follows its decisions (``runtime/rotation.py``).  A decision gets its step's measured
    time as ``"_ms"`` (the step's result record: None for a step left untimed)."""
    out: dict[int, list[Mapping[str, Any]]] = {}
    pending: list[Mapping[str, Any]] = []
    by_step: dict[int, dict[str, Any]] = {}
    for rec in records:
        if "reason" in rec:
            rec = dict(rec)
            by_step[int(rec["step"])] = rec
            pending.append(rec)
        elif "drafted" in rec and "step" in rec:
            mine = by_step.pop(int(rec["step"]), None)
            if mine is not None:
                mine["_ms"] = rec.get("ms")
        elif "window" in rec and "by_batch" in rec:
            out[int(rec["window"])] = pending
            pending = []
    return out


def _measured(windows: Sequence[Window]) -> dict[tuple[int, int], tuple[float, float]]:
    """(K, batch) -> (ms per step, tokens per request-step) of the fixed policies' windows."""
    sums: dict[tuple[int, int], list[float]] = collections.defaultdict(lambda: [0, 0.0, 0])
    for w in windows:
        if not is_fixed(w.policy):
            continue
        k = _fixed_k(w.policy)
        for b, steps, tokens, ms in w.rows():
            s = sums[(k, b)]
            s[0] += steps
            s[1] += ms
            s[2] += tokens
    return {key: (ms / n, tok / n / key[1]) for key, (n, ms, tok) in sums.items() if n >= MIN_STEPS}


def _fixed_k(policy: str) -> int:
    """``fixed:K`` -> K."""
    return int(policy.split(":", 1)[1])


def cell_beliefs(windows: Sequence[Window], decisions: Mapping[int, Sequence[Mapping[str, Any]]]
                 ) -> list[BeliefRow]:
    """The rows of one cell and server (``windows``: its paired windows, every policy)."""
    ks = sorted({_fixed_k(w.policy) for w in windows if is_fixed(w.policy)})
    if not ks:
        return []
    measured = _measured(windows)
    online = [d for w in windows if w.policy == ONLINE for d in decisions.get(w.window, ())]
    rows = []
    first = windows[0]
    for b in sorted({b for _k, b in measured}):
        if any((k, b) not in measured for k in ks):
            continue
        ms = [measured[(k, b)][0] for k in ks]
        tok = [measured[(k, b)][1] for k in ks]
        good = [t / m for t, m in zip(tok, ms)]
        best = max(good)
        mine = [d for d in online if d.get("batch") == b and d.get("est_costs")
                and all(k < len(d["est_costs"]) and d["est_costs"][k] for k in ks)]
        if not mine:
            continue
        ratios: list[list[float]] = [[] for _ in ks]
        shape, chosen, acc_only, cost_only = [], [], [], []
        for d in mine:
            price = [float(d["est_costs"][k]) for k in ks]
            for i in range(len(ks)):
                ratios[i].append(price[i] / ms[i])
            held = ks.index(d["k"]) if d["k"] in ks else 0
            shape.append(statistics.fmean(
                abs(math.log(price[i] / price[held] * ms[held] / ms[i]))
                for i in range(len(ks)) if i != held) if len(ks) > 1 else 0.0)
            expect = expected_committed(d["est_accept"][:max(ks)])
            gp = d.get("est_goodput")
            belief = ([float(gp[k]) if gp[k] is not None else -1.0 for k in ks] if gp
                      else [expect[k] / p for k, p in zip(ks, price)])
            chosen.append(good[max(range(len(ks)), key=belief.__getitem__)] / best)
            acc_only.append(good[max(range(len(ks)), key=lambda i: expect[ks[i]] / ms[i])] / best)
            cost_only.append(good[max(range(len(ks)), key=lambda i: tok[i] / price[i])] / best)
        switch = _switch_steps(mine, online, ks, ms)
        rows.append(BeliefRow(
            workload=first.workload, concurrency=first.concurrency,
            server_round=first.server_round, batch=b, decisions=len(mine), ks=list(ks),
            priced_vs_measured=[statistics.median(r) for r in ratios],
            shape_error=statistics.fmean(shape), chosen=statistics.fmean(chosen),
            acceptance_only=statistics.fmean(acc_only), cost_only=statistics.fmean(cost_only),
            switches=len(switch), switch_cost=statistics.median(switch) if switch else None))
    return rows


def _plain(d: Mapping[str, Any]) -> bool:
    """A decision of one K for the whole batch, no request joining, no drafter catch-up."""
    return not d.get("k_i") and "joining" not in d and "catch_up" not in d


def _switch_steps(mine: Sequence[Mapping[str, Any]], online: Sequence[Mapping[str, Any]],
                  ks: list[int], ms: Sequence[float]) -> list[float]:
    """Each timed step of ``mine`` that drafted another K than online's step before it
    (both plain, the same batch): its time over the fixed K's measured step (on the CPU host
    1.02-1.42 x in the servers of docs/benchmarks.md' first table, 0.90-1.31 x in the next
    run's; a one-step probe times only such steps)."""
    prev = {int(d["step"]): d for d in online}
    out = []
    for d in mine:
        p = prev.get(int(d["step"]) - 1)
        if (p is None or d.get("_ms") is None or p.get("batch") != d.get("batch")
                or p.get("k") == d.get("k") or not (_plain(d) and _plain(p)) or d["k"] not in ks):
            continue
        out.append(float(d["_ms"]) / ms[ks.index(d["k"])])
    return out


def beliefs(windows: Sequence[Window], traces: Mapping[int, Iterable[Mapping[str, Any]]]
            ) -> list[BeliefRow]:
    """Every cell's rows; ``traces`` maps a server round to its decision trace's records."""
    by_server = {rnd: decisions_by_window(recs) for rnd, recs in traces.items()}
    out = []
    for cws in by_cell(windows):  # the paired table's cells, in its order
        servers: dict[int, list[Window]] = collections.defaultdict(list)
        for w in cws:
            servers[w.server_round].append(w)
        for rnd in sorted(servers):
            decisions = by_server.get(rnd)
            if decisions is not None:
                out += cell_beliefs(servers[rnd], decisions)
    return out


def read_traces(results: pathlib.Path, rounds: Iterable[int]) -> dict[int, list[dict]]:
    """The records of each server round's decision trace, ``traces/paired-r<round>.jsonl``
    next to ``results``, in the file's order (read and checked by the trace picture's
    loader: a bad file or record is one error naming the file, line and key)."""
    return {rnd: load(results.parent / "traces" / f"paired-r{rnd}.jsonl").records
            for rnd in sorted(set(rounds))}


def markdown(rows: Sequence[BeliefRow]) -> str:
    if not rows:
        return "No cell has online decisions at a batch every fixed K served.\n"
    lines = [
        "| cell | server | batch | decisions | priced / measured step (K: ratio) | shape error "
        "| believed best | acceptance only | cost only | switch steps / fixed K's step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        priced = ", ".join(f"{k}: {v:.2f}" for k, v in zip(r.ks, r.priced_vs_measured))
        lines.append(f"| {r.workload}@{r.concurrency} | {r.server_round} | {r.batch} | "
                     f"{r.decisions} | {priced} | {r.shape_error:.3f} | {r.chosen:.3f} | "
                     f"{r.acceptance_only:.3f} | {r.cost_only:.3f} | "
                     + ("-" if r.switch_cost is None else f"{r.switch_cost:.2f} ({r.switches})")
                     + " |")
    return "\n".join(lines) + "\n"
