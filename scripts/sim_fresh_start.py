#!/usr/bin/env python
"""A fresh server's first decisions at one batch size, simulated: a policy against the best
fixed K.

Each seed runs a fresh :class:`~vllm_hust_vspec.adaptive.controller.Controller` for ``--steps``
decode steps of ``--batch`` requests (1, 4 or 16) at a time, its cost model seeded as the start-up cost probe
seeds it (two noisy step times of every K at batch 1, 4 and 16), then the best fixed K on
the same seed; the ratio of their tokens per ms is one sample. Step times are the steady
medians the fixed policies' steps measured in a paired server on the AVX2 EPYC (2 cores,
float32 fixtures, 2026-12-06; ``docs/results/paired-waves-k0-avx2-2026-12-06.json``), a
step that changes K the mean of the two Ks' times, each lognormally ``--noise`` noisy and
scaled by a machine speed that holds for 60-300 steps at a time (``--drift``: the sd of its
log; 0: a steady machine). A step where some requests draft another K (an upward probe's
share) takes its batch K's time less the verify time the others save, interpolated along
the uniform row by the share of requests that draft it. Each draft position is accepted with its conditional probability
(``--accept``; default: vLLM's per-position counters on the fixtures' ``code`` set at K = 4,
docs/benchmarks.md). ``--cost``/``--acceptance`` pass keyword arguments to the estimators
(``ControllerConfig.extra``), to try a change before pairing it on the real engine::

    .venv/bin/python scripts/sim_fresh_start.py --steps 128 --seeds 64
    .venv/bin/python scripts/sim_fresh_start.py --drift 0.2 --cost '{"cell_weight": 0.02}'
    .venv/bin/python scripts/sim_fresh_start.py --batch 4 --steps 600 --drift 0.1
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from vllm_hust_vspec.adaptive.controller import Controller, ControllerConfig
from vllm_hust_vspec.adaptive.observations import BatchView, StepResult
from vllm_hust_vspec.tools.argtypes import json_object, nonneg_float, positive_int

#: steady step ms by batch and K (0..4), fixed policies, paired server, AVX2 EPYC
STEP_MS = {1: (23.7, 28.0, 32.4, 36.3, 40.3), 4: (31.1, 42.6, 48.7, 56.4, 66.5),
           16: (53.6, 84.8, 111.1, 143.0, 172.4)}
CODE_ACCEPT = (0.66, 0.45, 0.68, 0.74)


def _uniform(row: tuple[float, ...], ks: np.ndarray) -> float:
    """A step's ms where the requests draft ``ks``: the time of the largest K, less the
    verify time of the requests drafting fewer (along the row: the share drafting it)."""
    top = int(ks.max())
    low = int(ks.min())
    share = float(np.mean(ks == top))
    return row[low] + (row[top] - row[low]) * share if low != top else row[top]


def _ms(batch: int, prev: np.ndarray, ks: np.ndarray) -> float:
    """A step's ms: the engine verifies the drafts of the step before (``prev``) and drafts
    its own (``ks``); a step that changes K costs the mean of the two."""
    row = STEP_MS[batch]
    now = _uniform(row, ks)
    return now if np.array_equal(prev, ks) else 0.5 * (_uniform(row, prev) + now)


def _extra(a: argparse.Namespace) -> dict:
    """``ControllerConfig.extra`` from ``--cost`` and ``--acceptance``."""
    return {k: v for k, v in (("cost", a.cost), ("acceptance", a.acceptance)) if v}


def run(policy: str, seed: int, a: argparse.Namespace) -> tuple[float, list[int]]:
    """Tokens per ms of ``policy`` over one fresh start, and its K per decision."""
    rng = np.random.default_rng(seed)
    speed = np.random.default_rng(1000 + seed)  # the machine: the same for every policy
    levels: list[float] = []
    while len(levels) < a.steps * len(a.batch):
        levels += [a.drift * speed.standard_normal()] * int(speed.integers(60, 300))
    ctl = Controller(ControllerConfig(kmax=4, policy=policy, extra=_extra(a)))
    phases = [b for b in a.batch for _ in range(a.steps)]
    ctl.seed_step_costs([(b, b * (k + 1), max(k, 1),
                          STEP_MS[b][k] * float(np.exp(rng.normal(0.0, a.noise))))
                         for b in STEP_MS for k in range(5) for _ in range(2)])
    accept = np.array(a.accept)
    prev, tokens, ms, ks = np.zeros(1, dtype=np.int64), 0, 0.0, []
    for step, b in enumerate(phases):
        ids = tuple(f"r{i}" for i in range(b))
        if len(prev) != b:  # a new phase: the requests verify the K the batch drafted
            prev = np.full(b, int(prev.max()), dtype=np.int64)
            tokens, ms = 0, 0.0  # the ratio is the last phase's
        d = ctl.decide(BatchView(step, ids, None, None))
        k = d.k
        ki = np.array([k if d.k_i is None else d.k_i[r] for r in ids], dtype=np.int64)
        hits = np.cumprod(rng.random((b, 4)) < accept, axis=1)
        accepted = np.array([int(hits[i, :ki[i]].sum()) for i in range(b)])
        wall = _ms(b, prev, ki) * float(np.exp(rng.normal(0.0, a.noise) + levels[step]))
        ctl.observe(StepResult(step, b, int(prev.max()), (), wall, max(k, 1), ki, accepted,
                               k_drafted=k))
        prev, tokens, ms = ki, tokens + int(accepted.sum()) + b, ms + wall
        ks.append(k)
    return tokens / ms, ks


def best_fixed_k(accept, batch: int = 1) -> int:
    expected = np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(accept))))
    return int(np.argmax([expected[k] / STEP_MS[batch][k] for k in range(5)]))


def _floats(text: str) -> tuple[float, ...]:
    vals = tuple(float(x) for x in text.split(","))
    if len(vals) != 4 or not all(0.0 <= v <= 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"want 4 probabilities, got {text!r}")
    return vals


def _batches(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if not vals or any(v not in STEP_MS for v in vals):
        raise argparse.ArgumentTypeError(f"want batch sizes among {sorted(STEP_MS)}, got {text!r}")
    return vals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="online")
    p.add_argument("--batch", type=_batches, default=(1,), metavar="B[,B...]",
                   help="requests a step (the measured rows: 1, 4, 16; default 1); several: "
                        "phases of --steps each, the ratio over the last")
    p.add_argument("--steps", type=positive_int, default=128)
    p.add_argument("--seeds", type=positive_int, default=64)
    p.add_argument("--accept", type=_floats, default=CODE_ACCEPT, metavar="A1,A2,A3,A4")
    p.add_argument("--noise", type=nonneg_float, default=0.10)
    p.add_argument("--drift", type=nonneg_float, default=0.0)
    p.add_argument("--cost", type=json_object, default=None, metavar="JSON")
    p.add_argument("--acceptance", type=json_object, default=None, metavar="JSON")
    a = p.parse_args(argv)
    try:
        Controller(ControllerConfig(kmax=4, policy=a.policy, extra=_extra(a)))
    except (TypeError, ValueError) as exc:  # an unknown estimator keyword, a bad policy
        p.error(f"--policy/--cost/--acceptance: {exc}")
    best = best_fixed_k(a.accept, a.batch[-1])
    ratios, off = [], []
    for seed in range(a.seeds):
        rate, ks = run(a.policy, seed, a)
        ratios.append(rate / run(f"fixed:{best}", seed, a)[0])
        off.append(float(np.mean([k != best for k in ks[-a.steps:][10:]])))
    r = np.array(ratios)
    at = f" at batch {','.join(map(str, a.batch))}" if a.batch != (1,) else ""
    print(f"{a.policy} / fixed K = {best}{at} over {a.steps} steps, {a.seeds} seeds: mean {r.mean():.4f}"
          f" median {np.median(r):.4f} p10 {np.percentile(r, 10):.4f}; decisions 10+ off K = "
          f"{best}: {np.mean(off):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
