#!/usr/bin/env python
"""Replay online's timed steps of paired-comparison traces through today's step-cost model
and judge its prices against the fixed Ks measured in the same server.

For every online decision at a batch where each fixed K = 0..Kmax has three steady steps or
more (the step before drafted the same K) in the trace, the model (fed online's own steps
before it, as the controller's was) prices K = 0..Kmax for a uniform batch; against the
fixed Ks' median step ms at that batch it reports the K-to-K price error (the RMS of log
price - log measured, centred over the Ks) and the goodput of the K the prices would pick
with the measured tokens per step, over the best fixed K's. Compare two versions of the
model by running this under each (PYTHONPATH)::

    python scripts/replay_paired_prices.py OUT/traces/paired-r1.jsonl [...]

``--near N`` judges each decision against the fixed Ks' steady steps within N steps of it
only (the same cell's texts and minutes) instead of the whole server's: a server serves
several workloads and the machine's speed drifts, and the whole server's medians pool code's
tokens per step with mixed's: in a server of a judged run they named K = 2 the best at all
723 of online's batch-1 decisions, where the fixed Ks within 300 steps named K = 3 at 258 of
the 639 judged there, K = 2 at 268, K = 4 at 75 and K = 1 at 38.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import math
import statistics
import sys

from vllm_hust_vspec import methods
from vllm_hust_vspec.adaptive.estimators import StepCostModel
from vllm_hust_vspec.tools.trace_picture import TracePictureError, load
from vllm_hust_vspec.tools.trace_replay import trace_host

MIN_STEPS = 3  # steady steps a fixed K needs at a batch to judge a price there


def _near(cell: dict[str, list[float]], step: int, near: int | None) -> dict[str, list[float]]:
    """A (batch, K)'s steady steps within ``near`` steps of ``step`` (all of them: None)."""
    if near is None:
        return cell
    lo = bisect.bisect_left(cell["step"], step - near)
    hi = bisect.bisect_right(cell["step"], step + near)
    return {"ms": cell["ms"][lo:hi], "tok": cell["tok"][lo:hi]}


def replay(path: str, near: int | None = None) -> tuple[list[float], list[float]]:
    """(price errors, picked goodput / best) per judged online decision of one trace
    (``near``: against the fixed Ks' steady steps within that many steps of the decision)."""
    try:
        trace = load(path)
    except TracePictureError as exc:
        raise SystemExit(str(exc)) from None
    method, skip = trace_host(trace)
    res = {int(r["step"]): r for r in trace.results}
    dec = {int(d["step"]): d for d in trace.decisions}
    order = [int(d["step"]) for d in trace.decisions]
    ks = sorted({int(d["k"]) for d in dec.values() if str(d["policy"]).startswith("fixed")})
    steady: dict[tuple[int, int], dict[str, list[float]]] = collections.defaultdict(
        lambda: {"step": [], "ms": [], "tok": []})
    prev = None
    for s in order:
        d, r = dec[s], res.get(s)
        if (r is not None and r.get("ms") and str(d["policy"]).startswith("fixed")
                and prev is not None and prev["policy"] == d["policy"]):
            cell = steady[(int(d["batch"]), int(d["k"]))]
            cell["step"].append(s)
            cell["ms"].append(float(r["ms"]))
            cell["tok"].append(int(r["accepted"]) + int(d["batch"]))
        prev = d
    model = StepCostModel()
    model.draft_min_steps = methods.draft_forwards(method, 0, skip) if method else 0
    errors: list[float] = []
    picks: list[float] = []
    for s in order:
        d, r = dec[s], res.get(s)
        if d["policy"] != "online" or r is None or not r.get("ms") or int(d["batch"]) <= 0:
            continue
        b, k = int(d["batch"]), int(d["k"])
        cells = [_near(steady[(b, kk)], s, near) if (b, kk) in steady else None for kk in ks]
        if ks and model.ready and all(c and len(c["ms"]) >= MIN_STEPS for c in cells):
            pred = model.predict_uniform(b, ks)
            if pred and all(p > 0 for p in pred):
                ms = [statistics.median(c["ms"]) for c in cells]
                tok = [statistics.fmean(c["tok"]) for c in cells]
                logs = [math.log(p / m) for p, m in zip(pred, ms)]
                mu = statistics.fmean(logs)
                errors.append(math.sqrt(statistics.fmean((x - mu) ** 2 for x in logs)))
                measured = [t / m for t, m in zip(tok, ms)]
                pick = max(range(len(ks)), key=lambda i: tok[i] / pred[i])
                picks.append(measured[pick] / max(measured))
        passes = methods.draft_forwards(method, k, skip) if method else k
        model.add(b, b + int(r["drafted"]), passes, float(r["ms"]),
                  track=d.get("catch_up") is None)
    return errors, picks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="decision traces of paired servers (JSONL)")
    parser.add_argument("--near", type=int, default=None, metavar="N",
                        help="judge a decision against the fixed Ks' steady steps within N steps "
                             "of it (default: the whole server's)")
    args = parser.parse_args(argv)
    if args.near is not None and args.near < 1:
        parser.error(f"--near must be a positive number of steps, got {args.near}")
    every_e: list[float] = []
    every_p: list[float] = []
    for path in args.traces:
        e, p = replay(path, args.near)
        every_e += e
        every_p += p
        print(f"{path}: {len(e)} decisions judged" + (
            f", K-to-K price error {statistics.fmean(e):.2%}, picked K's goodput / best fixed "
            f"{statistics.fmean(p):.4f}" if e else ""))
    if len(args.traces) > 1 and every_e:
        print(f"all: {len(every_e)} decisions, K-to-K price error {statistics.fmean(every_e):.2%}, "
              f"picked K's goodput / best fixed {statistics.fmean(every_p):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
