"""Results of the A/B benchmark: the ``results.json`` schema, medians and spread per cell, and
the ratio tables (each configuration / ``none`` and / the best fixed K of the same cell).

``results.json``::

    {"command": str, "machine": {...},
     "runs": [{"config", "policy", "k", "workload", "concurrency", "round",
               "output_tok_s", "tpot_ms", "mean_accept_len", "mean_k", "load_1m"?}, ...],
     "paired"?: [window records of the paired configuration (.bench_paired)]}

``load_1m`` is the machine's 1-minute load average before the run's server started (after
the first server it still carries the previous server's tail; ``machine.load_1m_start``,
taken before the first server, says what else the machine was doing: above ~1.5 the run
judges nothing).

``policy`` is one of none | fixed | native_table | online | budget | plugin_fixed; ``k`` is K for
``fixed`` and ``plugin_fixed``, Kmax for the others and 0 for ``none``; ``concurrency`` is an int or ``"swing"``.  Goals are
judged on medians over rounds; spread is reported as min..max.  The ratio table says of each
cell whether it judges a goal (:func:`verdict`): at least ``MIN_ROUNDS`` rounds of every
configuration, every configuration's spread ``(max - min) / median`` at most
``SPREAD_LIMIT``, and no server started above ``LOAD_LIMIT``; otherwise the first reason it
does not.

Pure Python: no vLLM import.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_hust_vspec import checks
from vllm_hust_vspec.errors import VspecError

POLICIES = ("none", "fixed", "native_table", "online", "budget", "plugin_fixed")
RUN_KEYS = ("config", "policy", "k", "workload", "concurrency", "round", "output_tok_s",
            "tpot_ms", "mean_accept_len", "mean_k")
OPTIONAL_RUN_KEYS = ("load_1m", "settle_steps")
TOP_KEYS = ("command", "machine", "runs")
OPTIONAL_TOP_KEYS = ("paired",)


class ResultsError(VspecError, ValueError):
    """A results document does not follow the schema; the message names the run and key."""


@dataclasses.dataclass(frozen=True)
class Run:
    config: str
    policy: str
    k: int
    workload: str
    concurrency: int | str
    round: int
    output_tok_s: float
    tpot_ms: float
    mean_accept_len: float
    mean_k: float
    load_1m: float | None = None
    settle_steps: int | None = None  # decode steps until K settled (adaptive policies)

    def to_dict(self) -> dict[str, Any]:
        out = {key: getattr(self, key) for key in RUN_KEYS}
        for key in OPTIONAL_RUN_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @property
    def cell(self) -> tuple[str, int | str]:
        return (self.workload, self.concurrency)


def _number(rec: Mapping[str, Any], key: str, where: str) -> float:
    v = rec[key]
    if not checks.is_number(v) or v < 0:
        raise ResultsError(f"{where}: key '{key}' must be a finite number >= 0, got {v!r}")
    return float(v)


def run_from_dict(rec: Any, where: str) -> Run:
    if not isinstance(rec, dict):
        raise ResultsError(f"{where}: must be an object")
    missing = [k for k in RUN_KEYS if k not in rec]
    if missing:
        raise ResultsError(f"{where}: key '{missing[0]}' is missing")
    extra = sorted(set(rec) - set(RUN_KEYS) - set(OPTIONAL_RUN_KEYS))
    if extra:
        raise ResultsError(f"{where}: unknown key {extra[0]!r} (known: "
                           f"{', '.join(RUN_KEYS + OPTIONAL_RUN_KEYS)})")
    if not isinstance(rec["config"], str) or not rec["config"]:
        raise ResultsError(f"{where}: key 'config' must be a non-empty string")
    if rec["policy"] not in POLICIES:
        raise ResultsError(f"{where}: key 'policy' must be one of {', '.join(POLICIES)}, "
                           f"got {rec['policy']!r}")
    for key in ("k", "round"):
        v = rec[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ResultsError(f"{where}: key '{key}' must be an integer >= 0, got {v!r}")
    if rec["policy"] == "none" and rec["k"] != 0:
        raise ResultsError(f"{where}: key 'k' must be 0 for policy none, got {rec['k']!r}")
    conc = rec["concurrency"]
    if conc != "swing" and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise ResultsError(f"{where}: key 'concurrency' must be a positive integer or "
                           f"\"swing\", got {conc!r}")
    if not isinstance(rec["workload"], str) or not rec["workload"]:
        raise ResultsError(f"{where}: key 'workload' must be a non-empty string")
    nums = {k: _number(rec, k, where) for k in ("output_tok_s", "tpot_ms", "mean_accept_len",
                                                  "mean_k")}
    load = _number(rec, "load_1m", where) if rec.get("load_1m") is not None else None
    settle = rec.get("settle_steps")
    if settle is not None and (isinstance(settle, bool) or not isinstance(settle, int) or settle < 0):
        raise ResultsError(f"{where}: key 'settle_steps' must be an integer >= 0, got {settle!r}")
    return Run(config=rec["config"], policy=rec["policy"], k=rec["k"], workload=rec["workload"],
               concurrency=conc, round=rec["round"], load_1m=load, settle_steps=settle, **nums)


def validate_results(doc: Any, source: str = "results") -> list[Run]:
    """Check a results document against the schema; returns its runs."""
    if not isinstance(doc, dict):
        raise ResultsError(f"{source}: the root must be a JSON object")
    for key in TOP_KEYS:
        if key not in doc:
            raise ResultsError(f"{source}: key '{key}' is missing")
    extra = sorted(set(doc) - set(TOP_KEYS) - set(OPTIONAL_TOP_KEYS))
    if extra:
        raise ResultsError(f"{source}: unknown key {extra[0]!r} (known: "
                           f"{', '.join(TOP_KEYS + OPTIONAL_TOP_KEYS)})")
    if not isinstance(doc["command"], str):
        raise ResultsError(f"{source}: key 'command' must be a string")
    if not isinstance(doc["machine"], dict):
        raise ResultsError(f"{source}: key 'machine' must be an object")
    if not isinstance(doc["runs"], list):
        raise ResultsError(f"{source}: key 'runs' must be a list")
    if "paired" in doc:
        if not isinstance(doc["paired"], list):
            raise ResultsError(f"{source}: key 'paired' must be a list")
        from .bench_paired import PairedError, window_from_dict

        for i, w in enumerate(doc["paired"]):
            try:
                window_from_dict(w, f"{source}: paired[{i}]")
            except PairedError as exc:
                raise ResultsError(str(exc)) from None
    return [run_from_dict(r, f"{source}: runs[{i}]") for i, r in enumerate(doc["runs"])]


def results_doc(command: str, machine: Mapping[str, Any], runs: Iterable[Run],
                windows: Sequence[Any] = ()) -> dict[str, Any]:
    doc = {"command": command, "machine": dict(machine), "runs": [r.to_dict() for r in runs]}
    if windows:
        doc["paired"] = [w.to_dict() for w in windows]
    return doc


def write_results(path: pathlib.Path, command: str, machine: Mapping[str, Any],
                  runs: Sequence[Run], windows: Sequence[Any] = ()) -> None:
    doc = results_doc(command, machine, runs, windows)
    validate_results(doc, str(path))
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def load_results(path: pathlib.Path) -> tuple[dict[str, Any], list[Run]]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: {checks.not_utf8(exc)}") from None
    except checks.PARSER_LIMITS as exc:
        raise ResultsError(f"{path}: invalid JSON: {checks.parser_limit(exc)}") from None
    return doc, validate_results(doc, str(path))


# --------------------------------------------------------------------------- aggregation


MIN_ROUNDS = 3  # rounds a cell needs to judge a goal
SPREAD_LIMIT = 0.10  # a configuration's (max - min) / median above this judges nothing
LOAD_LIMIT = 1.5  # a server started above this 1-minute load average judges nothing


@dataclasses.dataclass(frozen=True)
class Stat:
    """Median and spread (min..max) of one quantity over rounds."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            raise ValueError("no values")
        return cls(float(statistics.median(values)), float(min(values)), float(max(values)),
                   len(values))


@dataclasses.dataclass(frozen=True)
class CellSummary:
    workload: str
    concurrency: int | str
    configs: dict[str, Stat]  # config -> output tok/s over rounds
    accept: dict[str, float]  # config -> median mean_accept_len
    mean_k: dict[str, float]  # config -> median mean_k
    best_fixed: str | None  # the fixed-K config with the highest median tok/s
    verdict: str = "yes"  # whether the cell judges a goal ("yes", or "no: " and why)

    def ratio(self, config: str, base: str | None) -> float | None:
        if base is None or base not in self.configs or config not in self.configs:
            return None
        b = self.configs[base].median
        return self.configs[config].median / b if b > 0 else None


def verdict(per_config: Mapping[str, Sequence[Run]]) -> str:
    """Whether one cell's runs judge a goal: "yes", or "no: " and the first reason (fewer
    than ``MIN_ROUNDS`` rounds, a spread above ``SPREAD_LIMIT``, a server started above
    ``LOAD_LIMIT``)."""
    for config, rs in per_config.items():
        if len(rs) < MIN_ROUNDS:
            return f"no: {config} {len(rs)} round(s)"
    for config, rs in per_config.items():
        loads = [r.load_1m for r in rs if r.load_1m is not None]
        if loads and max(loads) > LOAD_LIMIT:
            return f"no: {config} started at load {max(loads):.2f}"
    for config, rs in per_config.items():
        st = Stat.of([r.output_tok_s for r in rs])
        spread = (st.hi - st.lo) / st.median if st.median > 0 else float("inf")
        if spread > SPREAD_LIMIT:
            return f"no: {config} spread {spread:.1%}"
    return "yes"


def _cell_order(cell: tuple[str, int | str], workload_order: Sequence[str]) -> tuple[int, int]:
    w, c = cell
    wi = workload_order.index(w) if w in workload_order else len(workload_order)
    return (wi, 10**9 if c == "swing" else int(c))


def config_order(runs: Sequence[Run]) -> list[str]:
    """Configurations in the order they first appear, ``none`` first."""
    seen: list[str] = []
    for r in runs:
        if r.config not in seen:
            seen.append(r.config)
    return sorted(seen, key=lambda c: (c != "none", seen.index(c)))


def summarize(runs: Sequence[Run], workload_order: Sequence[str] = ()) -> list[CellSummary]:
    by_cell: dict[tuple[str, int | str], dict[str, list[Run]]] = {}
    policy_of: dict[str, str] = {}
    for r in runs:
        by_cell.setdefault(r.cell, {}).setdefault(r.config, []).append(r)
        policy_of[r.config] = r.policy
    order = list(workload_order) or list(dict.fromkeys(r.workload for r in runs))
    out = []
    for cell in sorted(by_cell, key=lambda c: _cell_order(c, order)):
        per = by_cell[cell]
        stats = {c: Stat.of([r.output_tok_s for r in rs]) for c, rs in per.items()}
        fixed = [c for c in per if policy_of[c] == "fixed"]
        best = max(fixed, key=lambda c: stats[c].median) if fixed else None
        out.append(CellSummary(
            workload=cell[0], concurrency=cell[1], configs=stats,
            accept={c: float(statistics.median([r.mean_accept_len for r in rs])) for c, rs in per.items()},
            mean_k={c: float(statistics.median([r.mean_k for r in rs])) for c, rs in per.items()},
            best_fixed=best, verdict=verdict(per)))
    return out


# --------------------------------------------------------------------------- tables


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def throughput_table(cells: Sequence[CellSummary], configs: Sequence[str]) -> str:
    head = "| workload | conc | " + " | ".join(configs) + " |"
    sep = "|---|---|" + "---|" * len(configs)
    rows = [head, sep]
    for c in cells:
        vals = []
        for cfg in configs:
            s = c.configs.get(cfg)
            vals.append("-" if s is None else f"{s.median:.1f} ({s.lo:.1f}-{s.hi:.1f})")
        rows.append(f"| {c.workload} | {c.concurrency} | " + " | ".join(vals) + " |")
    return "\n".join(rows)


def ratio_table(cells: Sequence[CellSummary], configs: Sequence[str]) -> str:
    """One row per cell: for each configuration ``median / none`` and ``median / best fixed K``
    (as ``a / b``), plus which fixed K was best in that cell and whether the cell judges a
    goal (:func:`verdict`)."""
    head = ("| workload | conc | best fixed | " + " | ".join(configs) + " | judged |")
    sep = "|---|---|---|" + "---|" * len(configs) + "---|"
    rows = [head, sep]
    for c in cells:
        vals = [f"{_fmt_ratio(c.ratio(cfg, 'none'))} / {_fmt_ratio(c.ratio(cfg, c.best_fixed))}"
                if cfg in c.configs else "-" for cfg in configs]
        rows.append(f"| {c.workload} | {c.concurrency} | {c.best_fixed or '-'} | "
                    + " | ".join(vals) + f" | {c.verdict} |")
    return "\n".join(rows)


def accept_table(cells: Sequence[CellSummary], configs: Sequence[str]) -> str:
    head = "| workload | conc | " + " | ".join(configs) + " |"
    sep = "|---|---|" + "---|" * len(configs)
    rows = [head, sep]
    for c in cells:
        vals = [f"{c.accept[cfg]:.2f} / {c.mean_k[cfg]:.2f}" if cfg in c.configs else "-"
                for cfg in configs]
        rows.append(f"| {c.workload} | {c.concurrency} | " + " | ".join(vals) + " |")
    return "\n".join(rows)


def settle_table(runs: Sequence[Run], workload_order: Sequence[str] = ()) -> str:
    """Decode steps until K settled, per adaptive configuration and cell: median over rounds
    (min-max); empty when no run has the figure."""
    with_settle = [r for r in runs if r.settle_steps is not None]
    if not with_settle:
        return ""
    configs = config_order(with_settle)
    order = list(workload_order) or list(dict.fromkeys(r.workload for r in runs))
    cells = sorted({r.cell for r in with_settle}, key=lambda c: _cell_order(c, order))
    rows = ["| workload | conc | " + " | ".join(configs) + " |",
            "|---|---|" + "---|" * len(configs)]
    for cell in cells:
        vals = []
        for cfg in configs:
            xs = [r.settle_steps for r in with_settle if r.cell == cell and r.config == cfg]
            vals.append("-" if not xs else f"{statistics.median(xs):.0f} ({min(xs)}-{max(xs)})")
        rows.append(f"| {cell[0]} | {cell[1]} | " + " | ".join(vals) + " |")
    return "\n".join(rows)


def markdown_report(runs: Sequence[Run], workload_order: Sequence[str] = ()) -> str:
    """The three tables of a run, in markdown."""
    cells = summarize(runs, workload_order)
    configs = config_order(runs)
    rounds = sorted({r.round for r in runs})
    loads = [r.load_1m for r in runs if r.load_1m is not None]
    load = ("" if not loads else
            f" Load average (1 min) before each server: {min(loads):.2f}-{max(loads):.2f} "
            "(after the first, the previous server's tail).")
    settle = settle_table(runs, workload_order)
    return "\n".join([
        f"Median ratios over {len(rounds)} round(s): each cell `config / none` and "
        f"`config / best fixed K of the cell`.{load} A cell judges a goal with at least "
        f"{MIN_ROUNDS} rounds of every configuration, each one's spread (max - min) / median "
        f"at most {SPREAD_LIMIT:.0%} and no server started above load {LOAD_LIMIT}.",
        "",
        ratio_table(cells, configs),
        "",
        "Output tok/s, median (min-max over rounds):",
        "",
        throughput_table(cells, configs),
        "",
        "Mean accepted length / mean K (medians):",
        "",
        accept_table(cells, configs),
        "",
    ] + ([] if not settle else [
        "Decode steps until K settled (within +-1 of the K held most in the cell's second "
        "half at the same batch size, grouped 1, 2-3, 4-7, 8-15, ..., probes aside), median "
        "(min-max) over rounds; the first cell of a server is its fresh start:",
        "",
        settle,
        "",
    ]))
