#!/usr/bin/env python
"""Print the goodput table of ``docs/controller.md``: every generated trace kind x seeds,
each policy against the best fixed K in hindsight and the expected-acceptance oracle.

    python scripts/sim_table.py                 # 7 kinds x seeds 0,1,2 (about a minute)
    python scripts/sim_table.py --seeds 5 --policies online,budget,profile

The same numbers come from ``vllm-hust-vspec-sim --generate KIND --out t.jsonl --seed S`` then
``vllm-hust-vspec-sim t.jsonl --seed S --json``. ``tests/unit/test_goodput_targets.py``
asserts the targets on the cells :func:`measure` returns.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field

from vllm_hust_vspec.adaptive.generators import KINDS, generate
from vllm_hust_vspec.adaptive.simulate import CostSpec, simulate
from vllm_hust_vspec.tools.argtypes import positive_int

# targets of issue 3 ("what it must show")
VS_ORACLE = 0.95
VS_BEST_FIXED = 0.98
SWING = 1.10  # oracle / best fixed at which the gain-capture target applies
CAPTURE = 0.70
SHOW_CAPTURE = 1.02  # the table shows the captured share from this oracle gain on


@dataclass
class Cell:
    kind: str
    seed: int
    max_num_seqs: int
    best_fixed_k: int
    best_fixed: float
    oracle: float
    tok_s: dict[str, float] = field(default_factory=dict)

    def vs_oracle(self, policy: str = "online") -> float:
        return self.tok_s[policy] / self.oracle

    def vs_fixed(self, policy: str = "online") -> float:
        return self.tok_s[policy] / self.best_fixed

    @property
    def swing(self) -> float:
        return self.oracle / self.best_fixed

    def captured(self, policy: str = "online", swing: float = SWING) -> float | None:
        """Share of the oracle's gain over the best fixed K that ``policy`` captures (only
        where the oracle beats the best fixed K by at least ``swing``)."""
        if self.swing < swing:
            return None
        return (self.tok_s[policy] - self.best_fixed) / (self.oracle - self.best_fixed)

    def failures(self) -> list[str]:
        out = []
        if self.vs_oracle() < VS_ORACLE:
            out.append(f"online/oracle {self.vs_oracle():.3f} < {VS_ORACLE}")
        if self.vs_fixed() < VS_BEST_FIXED:
            out.append(f"online/best-fixed {self.vs_fixed():.3f} < {VS_BEST_FIXED}")
        cap = self.captured()
        if cap is not None and cap < CAPTURE:
            out.append(f"online captures {cap:.0%} < {CAPTURE:.0%} of the oracle's gain")
        if self.kind == "hetero" and "budget" in self.tok_s and self.tok_s["budget"] <= self.tok_s["online"]:
            out.append("budget does not beat online on hetero")
        return out


def measure(kind: str, seed: int, policies: tuple[str, ...] = ("online",), scale: float = 1.0,
            draws: int = 1, drift: float = 0.0, drift_steps: float = CostSpec.drift_steps) -> Cell:
    """One cell; ``draws`` > 1 averages every goodput over that many step-time noise draws
    on the same trace (simulator seeds ``seed``, ``seed + 1000``, ...): one draw of a short
    cell moves online / best fixed K by a few percent (stationary-high seed 1 over 6 draws:
    0.975-0.988).  ``drift`` > 0: the machine's speed drifts while the trace is served
    (``CostSpec.speed_path``: stationary sd ``drift``, correlation ``drift_steps`` steps),
    the same path for every policy."""
    if draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}")
    trace = generate(kind, seed, scale)
    if drift > 0.0:
        cost = dataclasses.replace(trace.header.cost, drift=drift, drift_steps=drift_steps)
        trace = dataclasses.replace(trace, header=dataclasses.replace(trace.header, cost=cost))
    reports = [simulate(trace, list(policies), seed + 1000 * i) for i in range(draws)]
    for report in reports:
        assert report.oracle is not None  # every generated kind carries p
    fixed: dict[int, float] = {}
    for report in reports:
        for k, r in report.fixed.items():
            fixed[k] = fixed.get(k, 0.0) + r.tok_s / draws
    best_k = max(fixed, key=lambda k: (fixed[k], -k))  # simulate()'s rule: ties to the smaller K
    return Cell(kind, seed, trace.header.max_num_seqs, best_k, fixed[best_k],
                sum(r.oracle.tok_s for r in reports) / draws,
                {name: sum(r.policies[name].tok_s for r in reports) / draws for name in policies})


def table(cells: list[Cell], policies: tuple[str, ...]) -> str:
    others = [p for p in policies if p != "online"]
    head = ["kind", "seed", "max seqs", "best fixed K", "best fixed tok/s", "oracle tok/s", "oracle/fixed",
            "online tok/s", "online/oracle", "online/fixed", "gain captured"]
    head += [f"{p}/online" for p in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        cap = c.captured(swing=SHOW_CAPTURE)
        row = [c.kind, str(c.seed), str(c.max_num_seqs), str(c.best_fixed_k), f"{c.best_fixed:.0f}",
               f"{c.oracle:.0f}", f"{c.swing:.3f}", f"{c.tok_s['online']:.0f}", f"{c.vs_oracle():.3f}",
               f"{c.vs_fixed():.3f}", "-" if cap is None else f"{cap:.0%}"]
        row += [f"{c.tok_s[p] / c.tok_s['online']:.3f}" for p in others]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per kind (default 3)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default: all)")
    parser.add_argument("--policies", default="online,budget,profile",
                        help="comma-separated policies; online is always included (default online,budget,profile)")
    parser.add_argument("--scale", type=float, default=1.0, help="trace size multiplier (default 1.0)")
    parser.add_argument("--draws", type=positive_int, default=1,
                        help="step-time noise draws averaged per cell (default 1)")
    parser.add_argument("--drift", type=float, default=0.0, metavar="SD",
                        help="the machine's speed drifts while serving: stationary sd of its log "
                             "(the CPU host: about 0.1; default 0, none)")
    parser.add_argument("--drift-steps", type=float, default=CostSpec.drift_steps, metavar="N",
                        help=f"the drift's correlation time in steps (default {CostSpec.drift_steps:g})")
    args = parser.parse_args(argv)
    policies = tuple(dict.fromkeys(["online", *[p for p in args.policies.split(",") if p]]))
    if args.drift < 0.0 or args.drift_steps < 1.0:
        parser.error("--drift must be >= 0 and --drift-steps >= 1")
    cells = [measure(kind, seed, policies, args.scale, args.draws, args.drift, args.drift_steps)
             for kind in args.kinds.split(",") for seed in range(args.seeds)]
    print(table(cells, policies))
    failed = [(c, f) for c in cells for f in c.failures()]
    print()
    if failed:
        print(f"targets missed in {len({(c.kind, c.seed) for c, _ in failed})} of {len(cells)} cells:")
        for c, f in failed:
            print(f"- {c.kind} seed {c.seed}: {f}")
    else:
        print(f"all targets met in {len(cells)} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
