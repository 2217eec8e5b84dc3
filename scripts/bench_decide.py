#!/usr/bin/env python3
"""observe() + decide() cost per step at batch 256, kmax 8, for every policy and stop mode.

The controller's speed target is 50 microseconds per step for every policy of the registry
(``fixed``, ``schedule``, ``sweep``, ``online``, ``profile``, ``budget`` with and without
confidences) and the per-request stop modes (``survival``, ``confidence``, ``entropy``), and
for ``budget`` in its drafting regime (a cheap drafter: depth cap 3-4, per-request K_i) in
the engine's array form. This is a benchmark, not a test: a timed bound moves with whatever
else runs on the machine, so the suite (tests/unit/test_decide_speed.py) checks only what
the timed regimes do, and this script prints the figures. Run it alone on the machine::

    .venv/bin/python scripts/bench_decide.py            # table; exit 1 if a held case > 50 us
    .venv/bin/python scripts/bench_decide.py --json     # one JSON object per case

Measured as the mean over ``--steps`` steps of this thread's CPU time (so time the
scheduler gives to other processes does not count, though caches and memory bandwidth
shared with them still do), best of ``--rounds`` rounds after a warm-up round; the
per-request result objects are built outside the timed region (the engine builds them
anyway). Both input forms are covered: one RequestResult per request (with its verified
drafts' confidences where the batch has confidences), and the array form
(``StepResult.drafted`` / ``accepted`` / ``confidences``). The load average is printed.

With this harness's step cost (a drafter pass costs 12.8 ms at batch 256) ``budget`` with
confidences settles on a depth cap of 0: its rounds time the held decisions plus a
re-selection every 16th decision and on every probe
(src/vllm_hust_vspec/adaptive/policies/budget.py, "Selection schedule"). With a cheap drafter
(0.3 ms a pass, 0.02 ms a verified token) it drafts a few positions with per-request K_i from
each request's confidences, so every decision computes every request's survival under the
cap and observe() learns the confidence calibration from the verified drafts. The same steps
as 256 RequestResult objects cost ~25-30 us more (reading 256 objects to count them, ~13 us,
and the calibration's Python loop over their confidence tuples, ~13 us): that form is
printed, not held to the target. Where the batch has confidences they are informative
(position j accepted with probability c_j), so the calibration learns a real map.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np

from vllm_hust_vspec.adaptive import BatchView, Controller, ControllerConfig, RequestResult, StepResult, ki_array
from vllm_hust_vspec.adaptive.generators import generate
from vllm_hust_vspec.adaptive.simulate import profile_for_trace

B = 256
KMAX = 8
BUDGET_US = 50.0


@dataclasses.dataclass(frozen=True)
class Case:
    """One timed configuration: a policy spec, controller keywords and the harness's inputs."""

    name: str
    policy: str
    kw: dict = dataclasses.field(default_factory=dict)
    conf: bool = False  # the batch carries draft confidences
    arrays: bool = False  # steps reported in the engine's array form
    ent: bool = False  # the batch carries top-8 entropies
    cheap_draft: bool = False  # budget's drafting regime
    held: bool = True  # held to BUDGET_US (else printed only)


CASES = (
    Case("fixed", "fixed:3"),
    Case("schedule", "schedule:1-4:4,5-64:2,65-1024:1"),
    Case("sweep", "sweep"),
    Case("online", "online"),
    Case("online+stop-survival", "online", {"stop": "survival"}),
    Case("online+stop-confidence", "online", {"stop": "confidence"}, conf=True),
    Case("online+stop-survival-conf", "online", {"stop": "survival"}, conf=True),
    Case("online-arrays", "online", arrays=True),
    Case("online+stop-entropy", "online", {"stop": "entropy"}, ent=True),
    Case("profile", "profile"),
    Case("profile+stop-survival-conf", "profile", {"stop": "survival"}, conf=True),
    Case("profile+stop-entropy", "profile", {"stop": "entropy"}, ent=True),
    Case("budget", "budget"),
    Case("budget+conf", "budget", conf=True),
    Case("budget+conf-arrays", "budget", conf=True, arrays=True),
    Case("budget+conf+stop-confidence", "budget", {"stop": "confidence"}, conf=True),
    Case("budget+conf+stop-entropy", "budget", {"stop": "entropy"}, conf=True, ent=True),
    Case("budget-drafting-arrays", "budget", conf=True, arrays=True, cheap_draft=True),
    Case("budget-drafting-objects", "budget", conf=True, cheap_draft=True, held=False),
)


def run(case: Case, steps: int = 100, rounds: int = 20, profile: str | None = None,
        clock=time.thread_time_ns) -> tuple[float, list[np.ndarray]]:
    """Best mean us per step over the rounds after the first, and the K_i arrays of the last round."""
    rng = np.random.default_rng(0)
    ids = tuple(f"req-{i}" for i in range(B))
    confs = rng.random((B, KMAX)) if case.conf else None
    acc_len = rng.integers(0, KMAX + 1, size=(32, B))
    if case.conf:  # informative confidences: position j is accepted with probability c_j
        ok = rng.random((32, B, KMAX)) < confs[None]
        acc_len = np.where(ok.all(2), KMAX, ok.argmin(2))
    # top-8 entropies in [0, ln 8): about half the positions above the default 1.0 nats
    ents = rng.random((B, KMAX)) * np.log(8.0) if case.ent else None
    view = BatchView(0, ids, None, confs, ents)
    kw = dict(case.kw)
    if case.policy == "profile":
        kw["profile"] = profile
    ctl = Controller(ControllerConfig(kmax=KMAX, policy=case.policy, **kw))
    best = float("inf")
    step = 0
    # a drafter pass: 12.8 ms at batch 256 (a drafter half the target's cost per token), or
    # 0.3 ms (a cheap drafter: budget then drafts a few positions with per-request K_i)
    draft_ms = 0.3 if case.cheap_draft else max(1.2, 0.05 * B)
    token_ms = 0.02 if case.cheap_draft else 0.3
    kis: list[np.ndarray] = []
    for rnd in range(rounds):
        spent = 0
        kis = []
        for _ in range(steps):
            t0 = clock()
            d = ctl.decide(view)
            spent += clock() - t0
            ki = np.full(B, d.k) if d.k_i is None else ki_array(d.k_i, ids)
            acc = np.minimum(ki, acc_len[step % 32])
            kis.append(ki)
            ms = 3.0 + max(18.0, token_ms * (B + int(ki.sum()))) + d.k * draft_ms
            if case.arrays:
                result = StepResult(step, B, d.k, (), ms, d.k, ki, acc, confs)
            else:
                kl, al = ki.tolist(), acc.tolist()
                rows = [None] * B if confs is None else [
                    tuple(confs[i, : kl[i]].tolist()) for i in range(B)]
                result = StepResult(
                    step, B, d.k,
                    tuple(RequestResult(r, kl[i], al[i], 0, rows[i]) for i, r in enumerate(ids)),
                    ms, d.k,
                )
            t0 = clock()
            ctl.observe(result)
            spent += clock() - t0
            step += 1
        if rnd or rounds == 1:  # round 0 is warm-up (model fits while samples are few)
            best = min(best, spent / steps / 1000.0)
    return best, kis


def write_profile(path: str) -> str:
    """The profile the ``profile`` cases read (fitted to a stationary simulator trace)."""
    profile_for_trace(generate("stationary-high", 0)).save(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="steps per round (default 100)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds, the first a warm-up (default 20)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.rounds < 1:
        ap.error("--steps and --rounds must be >= 1")
    names = {c.name for c in CASES}
    wanted = [n for n in a.cases.split(",") if n]
    unknown = sorted(set(wanted) - names)
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(c.name for c in CASES)})")
    cases = [c for c in CASES if not wanted or c.name in wanted]
    over = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = write_profile(os.path.join(tmp, "profile.json"))
        if not a.json:
            print(f"# observe()+decide() at batch {B}, kmax {KMAX}: thread CPU us/step, best of "
                  f"{max(1, a.rounds - 1)} rounds of {a.steps} steps; load average {os.getloadavg()}")
        for case in cases:
            us, _ = run(case, a.steps, a.rounds, profile)
            bad = case.held and us > BUDGET_US
            if bad:
                over.append(case.name)
            if a.json:
                print(json.dumps({"case": case.name, "us_per_step": round(us, 2), "held": case.held,
                                  "bound_us": BUDGET_US, "loadavg": os.getloadavg()}))
            else:
                mark = "OVER" if bad else ("ok" if case.held else "(printed only)")
                print(f"{case.name:32s} {us:7.1f} us  {mark}")
    if over:
        print(f"over {BUDGET_US:g} us: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
