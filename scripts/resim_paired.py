#!/usr/bin/env python
"""Run a policy again on a paired server's measured steps: what would it have done there.

A paired-comparison trace (``bench ab --paired-waves``) holds, in one engine, online's
decisions and every fixed K's windows on the same texts and minutes. This script serves
online's decode steps again (their batch sizes, in their order) with a fresh
:class:`~vllm_hust_vspec.adaptive.controller.Controller`, each step's time drawn from the
steady steps a fixed K measured at that batch nearest in the server's step count (one of
the ``--pool`` nearest, so the machine's drift, its slow spells and its step-to-step noise
are the real ones; ``--common-speed``: K's median near the step times the nearest fixed
steps' ratio to their own K's median, one machine speed for every K), and its acceptance from
per-position rates solved from the fixed Ks' accepted tokens over the step's workload cell
(``--results``; without it, within ``NEAR`` steps). A step that changes K costs the mean
of the two Ks' times (the engine verifies the step before's drafts); an upward probe's share
is interpolated along the batch's times. The policy chooses among the Ks a fixed policy
timed (a K none timed has no steps to serve). The best fixed K is served the same way on
the same draws, and the script prints policy / best fixed K per cell (a workload's cell with
``--results``, else a batch size's run of the timeline), so a change to an estimator or a
policy is judged on the real engine's step times, exploration included, which
``replay_paired_prices.py`` (prices only, online's own steps) cannot. The cost model is
seeded as the start-up probe seeds it: every K at batch 1, 4 and 16, two points each, the
first minutes' fixed-K medians times ``--seed-noise``.

    python scripts/resim_paired.py OUT/traces/paired-r*.jsonl --batches 4 --seeds 8
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import re
import statistics
import sys

import numpy as np

from vllm_hust_vspec import methods
from vllm_hust_vspec.adaptive.controller import Controller, ControllerConfig
from vllm_hust_vspec.adaptive.observations import BatchView, StepResult
from vllm_hust_vspec.fileio import write_atomic
from vllm_hust_vspec.tools.argtypes import json_object, nonneg_float, positive_int
from vllm_hust_vspec.tools.trace_picture import TracePictureError, load
from vllm_hust_vspec.tools.trace_replay import trace_host

NEAR = 300  # steps either side whose fixed-K steps set a step's acceptance rates
SEED_BATCHES = (1, 4, 16)
GAP = 1500  # steps without online at a batch after which it is another cell there
RESIM_FORMAT = "vspec-resim"  # --json-out's "format" (read by resim_compare.py)


def _nearest(steps: list[int], s: int, width: int, u: float) -> int:
    """Of the ``width`` entries of ``steps`` (sorted) nearest to ``s``, the index ``u``
    (uniform in [0, 1)) names."""
    i = bisect.bisect_left(steps, s)
    lo, hi = max(0, i - width // 2), min(len(steps), i + (width + 1) // 2)
    lo = max(0, min(lo, hi - width))
    return lo + int(u * (hi - lo))


class Server:
    """One paired trace's fixed-K steady steps and online's decode timeline."""

    def __init__(self, path: str, cells: dict[int, tuple[str, str]] | None = None) -> None:
        try:
            trace = load(path)
        except TracePictureError as exc:
            raise SystemExit(str(exc)) from None
        self.path = path
        method, skip = trace_host(trace)
        self.dmin = methods.draft_forwards(method, 0, skip) if method else 0
        self.passes = (lambda k: methods.draft_forwards(method, k, skip)) if method else (lambda k: k)
        res = {int(r["step"]): r for r in trace.results}
        # the step -> the window that holds it (a window record follows its steps), and
        # the window -> its workload cell (results.json), when known
        self.cell: dict[int, tuple[str, str]] = {}
        self.cell_acc: dict[tuple, list[float]] = collections.defaultdict(list)
        self._rates: dict[tuple, np.ndarray] = {}
        self.common = False  # see ms()
        self._ratio_memo: dict[int, tuple[list[int], list[float]]] = {}
        self._medians: dict[tuple[int, int, int], float] = {}
        if cells:
            pending: list[int] = []
            for rec in trace.records:
                if "window" in rec:
                    for st in pending:
                        self.cell[st] = cells.get(int(rec["window"]), ("?", "?"))
                    pending = []
                elif "policy" in rec and "k" in rec:
                    pending.append(int(rec["step"]))
        decs = sorted(trace.decisions, key=lambda d: int(d["step"]))
        self.ks = sorted({int(d["k"]) for d in decs if str(d["policy"]).startswith("fixed")})
        # (batch, K) -> step numbers, ms, accepted tokens per request
        self.pool: dict[tuple[int, int], tuple[list[int], list[float], list[float]]] = (
            collections.defaultdict(lambda: ([], [], [])))
        self.timeline: list[tuple[int, int]] = []  # online's timed decode steps: (step, batch)
        prev = None
        for d in decs:
            s, b = int(d["step"]), int(d["batch"])
            r = res.get(s)
            timed = r is not None and r.get("ms") and b > 0 and "joining" not in d
            if (timed and str(d["policy"]).startswith("fixed") and prev is not None
                    and prev["policy"] == d["policy"]):
                steps, ms, acc = self.pool[(b, int(d["k"]))]
                steps.append(s)
                ms.append(float(r["ms"]))
                acc.append(int(r["accepted"]) / b)
                if s in self.cell:  # the cell's accepted tokens per request, by K
                    self.cell_acc[(self.cell[s], b, int(d["k"]))].append(int(r["accepted"]) / b)
            if timed and d["policy"] == "online" and d.get("catch_up") is None:
                self.timeline.append((s, b))
            prev = d
        self.kmax = max(self.ks) if self.ks else 0

    def has(self, b: int) -> bool:
        return bool(self.ks) and all(len(self.pool[(b, k)][0]) >= 3 for k in self.ks)

    def ms(self, b: int, k: int, s: int, u: float, width: int) -> float:
        """A fixed K's steady step time at batch ``b``: of the ``width`` nearest to step
        ``s``, the one ``u`` (uniform in [0, 1)) names.  With :attr:`common` set: K's median
        near ``s`` times the ratio of one of the ``width`` nearest fixed steps at batch ``b``
        (any K) to its own K's median there, so that every K sees the same machine at a step
        (a K's times are not drawn from its own windows, minutes apart)."""
        if self.common:
            steps, ratios = self._ratios(b)
            return self.median(b, k, s) * ratios[_nearest(steps, s, width, u)]
        steps, ms, _ = self.pool[(b, k)]
        return ms[_nearest(steps, s, width, u)]

    def _ratios(self, b: int) -> tuple[list[int], list[float]]:
        """Every fixed K's steady steps at batch ``b``, in step order, each as its ratio to
        its K's median near it."""
        got = self._ratio_memo.get(b)
        if got is None:
            rows = sorted((st, m / self.median(b, k, st))
                          for k in self.ks for st, m in zip(*self.pool[(b, k)][:2]))
            got = self._ratio_memo[b] = ([r[0] for r in rows], [r[1] for r in rows])
        return got

    def median(self, b: int, k: int, s: int) -> float:
        """A fixed K's median steady step time at batch ``b`` within ``NEAR`` steps of ``s``
        (kept: every policy and seed serves the same steps)."""
        got = self._medians.get((b, k, s))
        if got is None:
            steps, ms, _ = self.pool[(b, k)]
            lo, hi = bisect.bisect_left(steps, s - NEAR), bisect.bisect_right(steps, s + NEAR)
            if hi - lo < 3:
                i = bisect.bisect_left(steps, s)
                lo, hi = max(0, i - 4), min(len(steps), i + 4)
            got = self._medians[(b, k, s)] = statistics.median(ms[lo:hi])
        return got

    def rates(self, b: int, s: int) -> np.ndarray:
        """Per-position conditional acceptance at step ``s`` and batch ``b``, solved from the
        fixed Ks' mean accepted tokens per request (clipped to [0.02, 0.98]): over the
        step's workload cell when the cells are known (``--results``: the workload's
        acceptance, the same all through the cell), else over the steps within ``NEAR``
        (kept, by cell or by step: every policy and seed serves the same steps)."""
        cell = self.cell.get(s)
        ks = range(1, self.kmax + 1)
        if cell is not None and all(len(self.cell_acc[(cell, b, k)]) >= 3 for k in ks):
            key: tuple = (cell, b)
            if key not in self._rates:
                self._rates[key] = self._solve(
                    [statistics.fmean(self.cell_acc[(cell, b, k)]) for k in ks])
            return self._rates[key]
        key = (b, s)
        if key not in self._rates:
            means = []
            for k in ks:
                steps, _, acc = self.pool[(b, k)]
                lo, hi = bisect.bisect_left(steps, s - NEAR), bisect.bisect_right(steps, s + NEAR)
                if hi - lo < 3:
                    lo, hi = 0, len(steps)
                means.append(statistics.fmean(acc[lo:hi]) if hi > lo else 0.0)
            self._rates[key] = self._solve(means)
        return self._rates[key]

    def _solve(self, means: list[float]) -> np.ndarray:
        """Conditional acceptance per position from the mean accepted tokens of K = 1..kmax."""
        mean = [0.0]
        for m in means:
            mean.append(max(mean[-1], m))
        out, surv = [], 1.0
        for k in range(1, self.kmax + 1):
            reach = mean[k] - mean[k - 1]  # P(position k accepted)
            a = min(0.98, max(0.02, reach / surv)) if surv > 1e-6 else 0.02
            out.append(a)
            surv *= a
        return np.array(out)


def _time(sv: Server, b: int, prev: np.ndarray, ki: np.ndarray, s: int,
          u: np.ndarray, width: int) -> float:
    def uniform(ks: np.ndarray) -> float:
        top, low = int(ks.max()), int(ks.min())
        t_top = sv.ms(b, top, s, u[top], width)
        if low == top:
            return t_top
        t_low = sv.ms(b, low, s, u[low], width)
        return t_low + (t_top - t_low) * float(np.mean(ks == top))
    now = uniform(ki)
    return now if np.array_equal(prev, ki) else 0.5 * (uniform(prev) + now)


def serve(sv: Server, policy: str, seed: int, a: argparse.Namespace, batches: set[int]):
    """cell -> [tokens, ms, steps, steps at each K] of ``policy`` over online's timeline,
    from a fresh controller; a cell is a workload's (``--results``) or a batch size's run of
    the timeline (a batch back after ``GAP`` steps without it starts another)."""
    rng = np.random.default_rng(seed)
    # the policy chooses among the Ks a fixed policy timed (a K none timed has no steps to
    # serve): K = min..max of them
    ctl = Controller(ControllerConfig(kmax=sv.kmax, policy=policy, extra=a.extra,
                                      **({"min_gamma": sv.ks[0]} if sv.ks else {}),
                                      **(a.config if not policy.startswith("fixed") else {})))
    ctl.set_draft_min_steps(sv.dmin)
    first = sv.timeline[0][0] if sv.timeline else 0
    rows = []
    for b in SEED_BATCHES:
        if not sv.has(b):
            continue
        for k in sv.ks:
            ms = sv.ms(b, k, first, float(rng.random()), 8)
            for _ in range(2):
                rows.append((b, b * (k + 1), sv.passes(k), ms * float(np.exp(rng.normal(0, a.seed_noise)))))
    if ctl.uses_step_costs:
        ctl.seed_step_costs(rows)
    now = [0, 1]  # the step and batch being decided (for --cheat)
    if a.cheat in ("cost", "both") and not policy.startswith("fixed"):
        def true_costs(b: int, ks) -> list[float]:
            return [sv.median(b, k, now[0]) for k in ks]
        ctl.cost.predict_uniform = true_costs
    if a.cheat in ("accept", "both") and not policy.startswith("fixed"):
        def true_expected() -> list[float]:
            r = sv.rates(now[1], now[0])
            return [1.0] + list(1.0 + np.cumsum(np.cumprod(r)))
        ctl.acceptance.expected_committed = true_expected
    cells: dict[tuple, list[float]] = collections.defaultdict(
        lambda: [0.0, 0.0, 0, collections.Counter()])
    prev = np.full(1, sv.ks[0] if sv.ks else 0, dtype=np.int64)
    last_seen: dict[int, int] = {}
    cell_of: dict[int, int] = collections.defaultdict(int)
    for n, (s, b) in enumerate(sv.timeline):
        if not sv.has(b):
            prev = np.full(b, int(prev.max()), dtype=np.int64)
            continue
        if s - last_seen.get(b, s) > GAP:
            cell_of[b] += 1  # the batch comes back after a while: another workload's cell
        last_seen[b] = s
        key = sv.cell.get(s) or (b, cell_of[b])
        ids = tuple(f"r{i}" for i in range(b))
        now[0], now[1] = s, b
        d = ctl.decide(BatchView(n, ids, None, None))
        ki = np.array([d.k if d.k_i is None else d.k_i[r] for r in ids], dtype=np.int64)
        if len(prev) != b:
            prev = np.full(b, int(prev.max()), dtype=np.int64)
        # the step's draws (which fixed-K time for each K, which positions accept) are the
        # same whatever the policy chose: policies are compared on common random numbers
        g = np.random.default_rng((seed, s))
        u = g.random(sv.kmax + 1)
        wall = _time(sv, b, prev, ki, s, u, a.pool)
        rate = sv.rates(b, s)
        hits = np.cumprod(g.random((b, sv.kmax)) < rate, axis=1)
        accepted = np.array([int(hits[i, :ki[i]].sum()) for i in range(b)])
        ctl.observe(StepResult(n, b, int(prev.max()), (), wall, max(int(ki.max()), sv.dmin), ki,
                               accepted, k_drafted=int(ki.max())))
        prev = ki
        if b in batches or sv.cell:
            c = cells[key]
            c[0] += float(accepted.sum() + b)
            c[1] += wall
            c[2] += 1
            c[3][int(ki.max())] += 1
    return cells


def _batches(text: str) -> set[int]:
    try:
        vals = {int(x) for x in text.split(",")}
    except ValueError:
        vals = set()
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"want batch sizes, comma-separated, got {text!r}")
    return vals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--policy", default="online")
    p.add_argument("--batches", type=_batches, default={1, 4, 16},
                   help="batch sizes judged (default 1,4,16)")
    p.add_argument("--seeds", type=positive_int, default=4)
    p.add_argument("--pool", type=positive_int, default=4,
                   help="nearest fixed-K steps a time is drawn from")
    p.add_argument("--seed-noise", type=nonneg_float, default=0.1,
                   help="sd of the log of a seeded probe point around the fixed-K median")
    p.add_argument("--min-steps", type=positive_int, default=100,
                   help="least steps a judged cell holds")
    p.add_argument("--extra", type=json_object, default={}, help="ControllerConfig.extra (JSON)")
    p.add_argument("--config", type=json_object, default={},
                   help="ControllerConfig fields for the policy (JSON), e.g. "
                        "'{\"exploration\": 0.02}'")
    p.add_argument("--cheat", choices=("cost", "accept", "both"), default=None,
                   help="diagnosis: the policy prices K with the true step times (the fixed "
                        "Ks' medians near the step) and/or the true acceptance rates")
    p.add_argument("--common-speed", action="store_true",
                   help="every K's time at a step: its median near the step times the "
                        "nearest fixed steps' ratio to theirs (one machine speed for all Ks)")
    p.add_argument("--show-k", action="store_true",
                   help="print the policy's steps at each K per cell")
    p.add_argument("--show-fixed", action="store_true",
                   help="print each fixed K / best fixed K per cell too")
    p.add_argument("--json-out", default=None, metavar="FILE",
                   help="also write every (trace, seed, cell) ratio to FILE (JSON), for "
                        "scripts/resim_compare.py: two runs on the same traces and seeds "
                        "compared on common random numbers")
    p.add_argument("--results", default=None,
                   help="the run's results.json: judge per workload cell (trace paired-rN is "
                        "server round N) instead of per batch size")
    a = p.parse_args(argv)
    try:
        Controller(ControllerConfig(kmax=4, policy=a.policy, extra=a.extra, **a.config))
    except (TypeError, ValueError) as exc:  # an unknown field or keyword, a bad policy
        p.error(f"--policy/--config/--extra: {exc}")
    if a.json_out and not os.path.isdir(os.path.dirname(a.json_out) or "."):
        # refused now, not after minutes of re-simulation
        p.error(f"--json-out {a.json_out}: no directory {os.path.dirname(a.json_out)}")
    windows: dict[int, dict[int, tuple[str, str]]] = collections.defaultdict(dict)
    if a.results:
        try:
            with open(a.results, encoding="utf-8") as f:
                for w in json.load(f)["paired"]:
                    windows[int(w["server_round"])][int(w["window"])] = (
                        str(w["workload"]), str(w["concurrency"]))
        except OSError as exc:
            p.error(f"--results {a.results}: cannot read: {exc.strerror}")
        except (ValueError, KeyError, TypeError) as exc:
            p.error(f"--results {a.results}: not a bench ab results.json with 'paired' windows "
                    f"(server_round, window, workload, concurrency): {exc!r}")
    batches = a.batches
    rows: list[dict] = []  # --json-out
    by_batch: dict = collections.defaultdict(list)
    fixed_by: dict = collections.defaultdict(list)
    for path in a.traces:
        m = re.search(r"paired-r(\d+)", path)
        sv = Server(path, windows.get(int(m.group(1))) if m and a.results else None)
        sv.common = a.common_speed
        line = []
        for seed in range(a.seeds):
            got = serve(sv, a.policy, seed, a, batches)
            fixed = {k: serve(sv, f"fixed:{k}", seed, a, batches) for k in sv.ks}
            for cell, (tok, ms, n, kcount) in sorted(got.items()):
                if ms <= 0 or n < a.min_steps:
                    continue
                best = max(fixed[k][cell][0] / fixed[k][cell][1] for k in sv.ks)
                r = (tok / ms) / best
                name = f"{cell[0]}@{cell[1]}" if a.results else f"b{cell[0]}#{cell[1]}"
                if a.show_fixed:
                    for k in sv.ks:
                        fixed_by[(name, k)].append(fixed[k][cell][0] / fixed[k][cell][1] / best)
                by_batch[name if a.results else cell[0]].append(r)
                rows.append({"trace": sv.path, "seed": seed, "cell": name, "steps": n,
                             "ratio": r})
                line.append(f"{name}({n}):{r:.3f}" + (
                    "[" + ",".join(str(kcount[k]) for k in sv.ks) + "]" if a.show_k else ""))
        print(sv.path, " ".join(line))
    if a.json_out:
        doc = {"format": RESIM_FORMAT, "version": 1, "policy": a.policy, "config": a.config,
               "extra": a.extra, "cheat": a.cheat, "common_speed": a.common_speed,
               "results": a.results, "rows": rows}
        try:
            write_atomic(a.json_out, json.dumps(doc, indent=1) + "\n")
        except OSError as exc:
            p.error(f"--json-out {a.json_out}: cannot write: {exc.strerror}")
    every = [r for v in by_batch.values() for r in v]
    if every:
        print(f"all: {a.policy} / best fixed K mean {statistics.fmean(every):.4f} "
              f"({len(every)} cells x seeds)")
    for b in sorted(by_batch, key=str):
        v = by_batch[b]
        if a.show_fixed:
            print(f"  {b} fixed Ks / best: " + " ".join(
                f"K{k} {statistics.fmean(fixed_by[(b, k)]):.3f}" for k in range(9)
                if (b, k) in fixed_by))
        print(f"{'' if a.results else 'batch '}{b}: {a.policy} / best fixed K mean {statistics.fmean(v):.4f} "
              f"median {statistics.median(v):.4f} least {min(v):.3f} ({len(v)} cells x seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
