"""The paired in-engine comparison of ``vllm-hust-vspec-bench ab`` (configuration ``paired``).

One plugin server runs with ``--adaptive-compare`` (the policies take turns in short windows
of decode steps, :mod:`vllm_hust_vspec.runtime.rotation`); each window's record (tokens,
cycle time) is read back from the decision trace per cell and phase.  Each rotation round
gives every policy one window under the same machine speed and load, so ratios are taken
inside a round and summarised over rounds:

* ``tok/s``: a policy's pooled speed in the cell (its tokens / its measured time);
* ``/ best fixed``: per rotation round, the policy's speed over the best fixed K's (the fixed
  policy with the highest pooled speed in the cell), median [quartiles] over the rounds, and
  the pooled ratio of each server round (min-max over the benchmark's rounds);
* for a swing cell also ``/ per-phase best``: the time the per-phase best fixed K would take
  for each phase's tokens, composed over the phases, against the policy's own.

``results.json`` holds the window records under ``"paired"``.  Pure Python (no vLLM import).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_hust_vspec import checks
from vllm_hust_vspec.errors import VspecError

WINDOW_KEYS = ("workload", "concurrency", "phase", "server_round", "window", "round", "policy",
               "steps", "tokens", "ms", "batch", "load_1m")


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

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in WINDOW_KEYS}

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
                          ms=float(rec["ms"]), batch=float(rec["batch"]), load_1m=load_1m))
    return out


def window_from_dict(rec: Any, where: str) -> Window:
    if not isinstance(rec, dict):
        raise PairedError(f"{where}: must be an object")
    missing = [k for k in WINDOW_KEYS if k not in rec and k != "load_1m"]
    if missing:
        raise PairedError(f"{where}: key '{missing[0]}' is missing")
    extra = sorted(set(rec) - set(WINDOW_KEYS))
    if extra:
        raise PairedError(f"{where}: unknown key {extra[0]!r}")
    for key in ("phase", "server_round", "window", "round", "steps", "tokens"):
        v = rec[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise PairedError(f"{where}: key '{key}' must be an integer >= 0, got {v!r}")
    for key in ("ms", "batch", "load_1m"):
        v = rec.get(key)
        if key == "load_1m" and v is None:
            continue
        if not checks.is_number(v) or v < 0:
            raise PairedError(f"{where}: key '{key}' must be a finite number >= 0, got {v!r}")
    if not isinstance(rec["policy"], str) or not rec["policy"]:
        raise PairedError(f"{where}: key 'policy' must be a non-empty string")
    return Window(**{k: rec.get(k) for k in WINDOW_KEYS})


def is_fixed(policy: str) -> bool:
    return policy.startswith("fixed:")


def _speed(ws: Sequence[Window]) -> float | None:
    ms = sum(w.ms for w in ws)
    return 1000.0 * sum(w.tokens for w in ws) / ms if ms > 0 else None


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
    speed = {p: _speed([w for w in paired if w.policy == p]) or 0.0 for p in policies}
    fixed = [p for p in policies if is_fixed(p)]
    best = max(fixed, key=lambda p: speed[p]) if fixed else None
    phases = sorted({w.phase for w in paired})
    rows = []
    for p in policies:
        ratio = q1 = q3 = lo = hi = phase_ratio = None
        per_round: list[float] = []
        if best is not None:
            for g in rounds.values():
                a, b = _speed(g[p]), _speed(g[best])
                if a is not None and b:
                    per_round.append(a / b)
            by_server = []
            for s in sorted({key[0] for key in rounds}):
                a = _speed([w for w in paired if w.policy == p and w.server_round == s])
                b = _speed([w for w in paired if w.policy == best and w.server_round == s])
                if a is not None and b:
                    by_server.append(a / b)
            if per_round:
                ratio = float(statistics.median(per_round))
                q1, q3 = _quartiles(per_round)
            if by_server:
                lo, hi = min(by_server), max(by_server)
            if len(phases) > 1:
                phase_ratio = _phase_ratio(paired, p, fixed, phases)
        rows.append(PolicyRow(policy=p, tok_s=speed[p], ratio=ratio, q1=q1, q3=q3,
                              rounds=len(per_round), server_lo=lo, server_hi=hi,
                              phase_ratio=phase_ratio))
    w0 = ws[0]
    return PairedCell(w0.workload, w0.concurrency, best, rows)


def _phase_ratio(paired: Sequence[Window], policy: str, fixed: Sequence[str],
                 phases: Sequence[int]) -> float | None:
    """A policy's speed over the per-phase best fixed K's, composed: for each phase the
    time its tokens (the policy's own) take at the best fixed K's speed of that phase."""
    own = 0.0
    oracle = 0.0
    for ph in phases:
        mine = [w for w in paired if w.policy == policy and w.phase == ph]
        tokens = sum(w.tokens for w in mine)
        speeds = [s for f in fixed
                  if (s := _speed([w for w in paired if w.policy == f and w.phase == ph]))]
        if not mine or not speeds or tokens == 0:
            return None
        own += sum(w.ms for w in mine)
        oracle += 1000.0 * tokens / max(speeds)
    return oracle / own if own > 0 else None


def summarize(ws: Sequence[Window]) -> list[PairedCell]:
    cells: dict[tuple[str, int | str], list[Window]] = {}
    for w in ws:
        cells.setdefault(w.cell, []).append(w)
    return [summarize_cell(v) for v in cells.values()]


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def markdown(ws: Sequence[Window]) -> str:
    """The paired section of the A/B report."""
    if not ws:
        return ""
    cells = summarize(ws)
    loads = sorted({w.load_1m for w in ws if w.load_1m is not None})
    load = ("" if not loads else f" Load average (1 min) before each server: "
            f"{', '.join(f'{x:.2f}' for x in loads)}.")
    lines = ["", "## Paired in-engine comparison", "",
             "One server, the policies taking turns in windows of decode steps "
             "(`--adaptive-compare`). Each cell: pooled tok/s, then `/ best fixed` as the "
             "median [quartiles] over rotation rounds (n), the pooled ratio's min-max over "
             "server rounds, and for a swing the ratio to the per-phase best fixed K." + load, "",
             "| workload | conc | best fixed | policy | tok/s | / best fixed [q1-q3] (n) "
             "| server rounds | / per-phase best |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        for r in c.rows:
            spread = ("-" if r.server_lo is None
                      else f"{r.server_lo:.3f}-{r.server_hi:.3f}")
            quart = "" if r.q1 is None else f" [{r.q1:.3f}-{r.q3:.3f}]"
            lines.append(f"| {c.workload} | {c.concurrency} | {c.best_fixed or '-'} | "
                         f"{r.policy} | {r.tok_s:.1f} | {_r(r.ratio)}{quart} ({r.rounds}) | "
                         f"{spread} | {_r(r.phase_ratio)} |")
    return "\n".join(lines) + "\n"
