"""A picture and a short summary of one decision trace (``--adaptive-trace-file``).

``vllm-hust-vspec-bench trace DECISIONS.jsonl`` prints the summary and writes a PNG beside
the trace; ``bench ab`` does the same for every plugin server and links them from its
``report.md``.  Panels, one x axis (the engine step):

1. K per step, with the spread of the per-request K_i (min..max) and the K = 0 stretches
   shaded;
2. the batch size the decision was made for;
3. the acceptance estimate per draft position (``est_accept``);
4. the estimated step cost of each decision beside the measured one of its step;
5. goodput: the decision's estimate (batch x expected committed tokens / estimated cost)
   and the measured one (committed tokens / measured ms, over a rolling window).

Steps are paired by number: a decision and the result record of the same step.  The
measured cost of a step that also ran prefill is null in the trace and left out.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from collections.abc import Sequence
from typing import Any

from vllm_hust_vspec import checks
from vllm_hust_vspec.adaptive import estimators
from vllm_hust_vspec.adaptive.trace import TRACE_NAME, is_decision, is_result
from vllm_hust_vspec.errors import VspecError

PANELS = ("K and K_i", "batch size", "acceptance estimate", "step cost", "goodput")
ROLLING = 16  # steps in the measured goodput's rolling window


class TracePictureError(VspecError, ValueError):
    """A decision trace that cannot be read; names the file and the line."""


@dataclasses.dataclass(frozen=True)
class Trace:
    path: pathlib.Path
    headers: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    results: list[dict[str, Any]]
    drafter: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # K = 0 skips
    # the paired comparison's windows (--adaptive-compare, runtime/rotation.py)
    windows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # every record above in the file's order (a window's decisions come before its record)
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def load(path: str | pathlib.Path) -> Trace:
    path = pathlib.Path(path)
    headers, decisions, results, drafter, windows, records = [], [], [], [], [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TracePictureError(str(path), None, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TracePictureError(str(path), None, checks.not_utf8(exc)) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TracePictureError(where, None, f"not JSON ({exc.msg})") from None
        except checks.PARSER_LIMITS as exc:
            raise TracePictureError(where, None, f"not JSON ({checks.parser_limit(exc)})") from None
        if not isinstance(rec, dict):
            raise TracePictureError(where, None, "not a JSON object")
        if rec.get("trace") == TRACE_NAME:
            headers.append(rec)
        elif is_decision(rec):
            decisions.append(_checked(rec, where, _DECISION_FIELDS))
        elif is_result(rec):
            results.append(_checked(rec, where, _RESULT_FIELDS))
        elif isinstance(rec.get("drafter"), dict):
            _checked(rec["drafter"], where, _DRAFTER_FIELDS, prefix="drafter.")
            drafter.append(rec)
        elif "window" in rec:
            windows.append(_checked(rec, where, _WINDOW_FIELDS))
        else:
            raise TracePictureError(f"{path}:{n}", None, "neither a header, a decision, a "
                                    "result, a drafter nor a window record")
        records.append(rec)
    if not headers:
        raise TracePictureError(str(path), None, f"no {TRACE_NAME!r} header: not a decision trace")
    return Trace(path, headers, decisions, results, drafter, windows, records)


# The fields the summary and the picture read, per record kind: (key, kind, required).
# int: an integer in [0, 2**53] (``step``: any sign), so that sums and means stay floats;
# num: a finite number; int_map: an object of such integers (``k_i``); nums: a list of
# numbers; nums_or_null: a list of numbers or nulls; any: present, any value.
_MAX_INT = 2**53
_DECISION_FIELDS = (("step", "step", True), ("k", "int", True), ("batch", "int", True),
                    ("k_i", "int_map", False), ("est_accept", "nums", False),
                    ("est_cost_ms", "num", False), ("est_costs", "nums_or_null", False),
                    ("est_goodput", "nums_or_null", False))
_RESULT_FIELDS = (("step", "step", True), ("drafted", "int", True), ("accepted", "int", True),
                  ("ms", "num", False))
_DRAFTER_FIELDS = (("skipped", "int", True), ("caught_up", "int", True))
_WINDOW_FIELDS = (("policy", "any", True), ("tokens", "int", True), ("ms", "num", True))


def _checked(rec: dict[str, Any], where: str, fields: Sequence[tuple[str, str, bool]],
             prefix: str = "") -> dict[str, Any]:
    """``rec`` when every field the summary reads has its type (null allowed where the
    field is optional); else one :class:`TracePictureError` naming the line and the key."""
    for key, kind, required in fields:
        name = prefix + key
        if key not in rec:
            if required:
                raise TracePictureError(where, name, "missing")
            continue
        value = rec[key]
        if value is None and not required:
            continue
        if kind == "any":
            continue
        if kind == "step":
            checks.integer(value, where, name, minimum=-_MAX_INT, maximum=_MAX_INT,
                           error=TracePictureError)
        elif kind == "int":
            checks.integer(value, where, name, minimum=0, maximum=_MAX_INT, error=TracePictureError)
        elif kind == "num":
            checks.number(value, where, name, error=TracePictureError)
        elif kind == "int_map":
            checks.mapping(value, where, name, error=TracePictureError)
            for sub, v in value.items():
                checks.integer(v, where, f"{name}.{sub}", minimum=0, maximum=_MAX_INT,
                               error=TracePictureError)
        else:
            if not isinstance(value, list):
                raise TracePictureError(where, name, f"must be a list of numbers, got {value!r}")
            for i, v in enumerate(value):
                if v is None and kind == "nums_or_null":
                    continue
                checks.number(v, where, f"{name}[{i}]", error=TracePictureError)
    return rec


# --------------------------------------------------------------------------- figures

def expected_committed(est_accept: Sequence[float], k: int) -> float:
    """1 + sum over positions j <= k of the probability that drafts 1..j all survive."""
    return estimators.expected_committed(list(est_accept)[:k])[-1]


def _k_range(d: dict[str, Any]) -> tuple[int, int]:
    values = list(d["k_i"].values()) if d.get("k_i") else [d["k"]]
    return min(values), max(values)


def _stretches(ks: Sequence[int]) -> list[int]:
    """Lengths of the runs of consecutive K = 0 decisions."""
    out, run = [], 0
    for k in ks:
        if k == 0:
            run += 1
        elif run:
            out.append(run)
            run = 0
    return out + ([run] if run else [])


def summary(trace: Trace) -> dict[str, Any]:
    """The figures the picture shows, as numbers (what the text summary prints)."""
    ds, rs = trace.decisions, trace.results
    ks = [int(d["k"]) for d in ds]
    batch = {int(d["step"]): int(d["batch"]) for d in ds}
    hist: dict[int, int] = {}
    for k in ks:
        hist[k] = hist.get(k, 0) + 1
    drafted = sum(int(r["drafted"]) for r in rs)
    accepted = sum(int(r["accepted"]) for r in rs)
    timed = [r for r in rs if r.get("ms") is not None and int(r["step"]) in batch]
    committed = sum(batch[int(r["step"])] + int(r["accepted"]) for r in timed)
    timed_ms = sum(float(r["ms"]) for r in timed)
    measured = {int(r["step"]): float(r["ms"]) for r in timed}
    ratios = [float(d["est_cost_ms"]) / measured[int(d["step"])] for d in ds
              if d.get("est_cost_ms") is not None and measured.get(int(d["step"]), 0) > 0]
    stretches = _stretches(ks)
    policies = sorted({str(d["policy"]) for d in ds})
    return {
        "trace": str(trace.path), "policies": policies, "decisions": len(ds),
        "results": len(rs), "k_hist": dict(sorted(hist.items())),
        "mean_k": statistics.fmean(ks) if ks else 0.0,
        "k0_share": hist.get(0, 0) / len(ks) if ks else 0.0,
        "k0_stretches": len(stretches), "longest_k0_stretch": max(stretches, default=0),
        "mean_batch": statistics.fmean(batch.values()) if batch else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "drafted": drafted, "accepted": accepted,
        "measured_goodput_tok_s": 1000.0 * committed / timed_ms if timed_ms > 0 else None,
        "timed_steps": len(timed),
        "median_est_over_measured_cost": statistics.median(ratios) if ratios else None,
        "drafter_steps_skipped": sum(int(r["drafter"]["skipped"]) for r in trace.drafter),
        "drafter_tokens_caught_up": sum(int(r["drafter"]["caught_up"]) for r in trace.drafter),
        "window_tok_s": _window_speeds(trace.windows),
        "belief": belief(trace),
    }


def belief(trace: Trace) -> list[dict[str, Any]]:
    """What the controller believed against what the engine did, per batch size and K:
    the median predicted step cost and goodput of K at that batch (every decision that
    weighed K, ``est_costs`` / ``est_goodput``) beside the median measured ms and tokens per
    ms of the steady steps at that K (decided K, the step before also K, timed: they
    verify and draft K).  Rows only where both sides have data."""
    ds = trace.decisions
    by_step = {int(d["step"]): d for d in ds}
    ms_of = {int(r["step"]): r for r in trace.results if r.get("ms") is not None}
    est_c: dict[tuple[int, int], list[float]] = {}
    est_g: dict[tuple[int, int], list[float]] = {}
    for d in ds:
        costs = d.get("est_costs")
        if not costs:
            continue
        gps = d.get("est_goodput") or [None] * len(costs)
        for k, (c, g) in enumerate(zip(costs, gps)):
            if c is not None:
                est_c.setdefault((int(d["batch"]), k), []).append(float(c))
            if g is not None:
                est_g.setdefault((int(d["batch"]), k), []).append(float(g))
    meas_ms: dict[tuple[int, int], list[float]] = {}
    meas_g: dict[tuple[int, int], list[float]] = {}
    for step, d in by_step.items():
        prev, r = by_step.get(step - 1), ms_of.get(step)
        if r is None or prev is None or prev["k"] != d["k"] or d.get("k_i"):
            continue
        key = (int(d["batch"]), int(d["k"]))
        ms = float(r["ms"])
        meas_ms.setdefault(key, []).append(ms)
        if ms > 0:
            meas_g.setdefault(key, []).append((int(d["batch"]) + int(r["accepted"])) / ms)
    rows = []
    for key in sorted(set(est_c) & set(meas_ms)):
        b, k = key
        rows.append({"batch": b, "k": k, "decisions": len(est_c[key]),
                     "steady_steps": len(meas_ms[key]),
                     "est_ms": round(statistics.median(est_c[key]), 3),
                     "measured_ms": round(statistics.median(meas_ms[key]), 3),
                     "est_tok_per_ms": (round(statistics.median(est_g[key]), 4)
                                        if key in est_g else None),
                     "measured_tok_per_ms": round(statistics.fmean(meas_g[key]), 4)
                     if key in meas_g else None})
    return rows


def belief_text(rows: Sequence[dict[str, Any]]) -> str:
    """The belief rows as a table (empty when the trace has no ``est_costs``)."""
    if not rows:
        return ""
    lines = ["  believed vs measured, per batch and K (median ms; tokens/ms, measured: mean "
             "over steady steps):",
             "    batch  K  est ms  meas ms  est/meas  est tok/ms  meas tok/ms  steps"]
    for r in rows:
        ratio = r["est_ms"] / r["measured_ms"] if r["measured_ms"] else float("nan")
        eg = "-" if r["est_tok_per_ms"] is None else f"{r['est_tok_per_ms']:.4f}"
        mg = "-" if r["measured_tok_per_ms"] is None else f"{r['measured_tok_per_ms']:.4f}"
        lines.append(f"    {r['batch']:5d} {r['k']:2d} {r['est_ms']:7.2f} {r['measured_ms']:8.2f} "
                     f"{ratio:9.2f} {eg:>11} {mg:>12} {r['steady_steps']:6d}")
    return "\n".join(lines)


def _window_speeds(windows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each compared policy's pooled speed over its windows (tokens / measured ms)."""
    tokens: dict[str, int] = {}
    ms: dict[str, float] = {}
    for w in windows:
        p = str(w["policy"])
        tokens[p] = tokens.get(p, 0) + int(w["tokens"])
        ms[p] = ms.get(p, 0.0) + float(w["ms"])
    return {p: round(1000.0 * tokens[p] / ms[p], 2) for p in tokens if ms[p] > 0}


def summary_text(s: dict[str, Any]) -> str:
    goodput = s["measured_goodput_tok_s"]
    ratio = s["median_est_over_measured_cost"]
    return "\n".join([
        f"decision trace {s['trace']}: policy {', '.join(s['policies']) or '-'}, "
        f"{s['decisions']} decisions, {s['results']} results",
        f"  K: mean {s['mean_k']:.2f}, histogram {s['k_hist']}, K = 0 on "
        f"{100 * s['k0_share']:.1f}% of decisions ({s['k0_stretches']} stretches, longest "
        f"{s['longest_k0_stretch']})",
        f"  batch: mean {s['mean_batch']:.1f}; acceptance {s['acceptance_rate']:.3f} "
        f"({s['accepted']}/{s['drafted']} drafts)",
        f"  measured goodput: {'n/a' if goodput is None else f'{goodput:.1f} tok/s'} over "
        f"{s['timed_steps']} timed steps; estimated / measured step cost: median "
        f"{'n/a' if ratio is None else f'{ratio:.2f}'}",
        f"  drafter: {s['drafter_steps_skipped']} K = 0 steps without a forward, "
        f"{s['drafter_tokens_caught_up']} tokens caught up",
    ] + ([] if not s["window_tok_s"] else [
        "  compared windows, tok/s: " + ", ".join(f"{p} {v:.1f}"
                                                  for p, v in s["window_tok_s"].items())])
        + ([belief_text(s["belief"])] if s.get("belief") else []))


# --------------------------------------------------------------------------- picture

def plot(trace: Trace, path: str | pathlib.Path, s: dict[str, Any] | None = None) -> list[str]:
    """Write the PNG (``s``: the trace's :func:`summary`, for the title); returns the panel
    titles (one per axis drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = trace.decisions
    steps = [int(d["step"]) for d in ds]
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9.0, 11.0), sharex=True)
    _panel_k(axes[0], ds, steps)
    axes[1].step(steps, [int(d["batch"]) for d in ds], where="post", color="tab:gray")
    _panel_acceptance(axes[2], ds, steps)
    _panel_cost(axes[3], trace, steps)
    _panel_goodput(axes[4], trace)
    for ax, title in zip(axes, PANELS):
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    axes[1].set_ylabel("requests")
    axes[-1].set_xlabel("engine step")
    s = summary(trace) if s is None else s
    fig.suptitle(f"{pathlib.Path(trace.path).name}: {', '.join(s['policies'])}, mean K "
                 f"{s['mean_k']:.2f}, K = 0 on {100 * s['k0_share']:.0f}% of steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    titles = [ax.get_title(loc="left") for ax in axes]
    plt.close(fig)
    return titles


def _panel_k(ax: Any, ds: list[dict[str, Any]], steps: list[int]) -> None:
    lo, hi = zip(*(_k_range(d) for d in ds)) if ds else ((), ())
    ax.fill_between(steps, lo, hi, step="post", alpha=0.3, color="tab:blue", label="K_i range")
    ax.step(steps, [int(d["k"]) for d in ds], where="post", color="tab:blue", label="K")
    for d, nxt in zip(ds, steps[1:] + [steps[-1] + 1] if steps else []):
        if int(d["k"]) == 0:
            ax.axvspan(int(d["step"]), nxt, color="tab:red", alpha=0.12, lw=0)
    ax.set_ylabel("K")
    ax.legend(fontsize=7, loc="upper right")


def _panel_acceptance(ax: Any, ds: list[dict[str, Any]], steps: list[int]) -> None:
    width = max((len(d.get("est_accept") or ()) for d in ds), default=0)
    for j in range(width):
        ax.plot(steps, [(d.get("est_accept") or [None] * width)[j] for d in ds], lw=1,
                label=f"position {j + 1}")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("P(accept)")
    if width:
        ax.legend(fontsize=7, ncol=min(width, 4), loc="lower right")


def _panel_cost(ax: Any, trace: Trace, steps: list[int]) -> None:
    est = [(int(d["step"]), float(d["est_cost_ms"])) for d in trace.decisions
           if d.get("est_cost_ms") is not None]
    meas = [(int(r["step"]), float(r["ms"])) for r in trace.results if r.get("ms") is not None]
    if est:
        ax.plot(*zip(*est), lw=1, color="tab:orange", label="estimated")
    if meas:
        ax.plot(*zip(*meas), ".", ms=2, color="tab:green", label="measured")
    ax.set_ylabel("ms per step")
    ax.legend(fontsize=7, loc="upper right")


def _panel_goodput(ax: Any, trace: Trace) -> None:
    est = [(int(d["step"]), 1000.0 * int(d["batch"])
            * expected_committed(d.get("est_accept") or (), int(d["k"])) / float(d["est_cost_ms"]))
           for d in trace.decisions if d.get("est_cost_ms")]
    batch = {int(d["step"]): int(d["batch"]) for d in trace.decisions}
    timed = [r for r in trace.results if r.get("ms") is not None and int(r["step"]) in batch]
    rolled = []
    for i in range(len(timed)):
        window = timed[max(0, i - ROLLING + 1):i + 1]
        ms = sum(float(r["ms"]) for r in window)
        if ms > 0:
            tokens = sum(batch[int(r["step"])] + int(r["accepted"]) for r in window)
            rolled.append((int(timed[i]["step"]), 1000.0 * tokens / ms))
    if est:
        ax.plot(*zip(*est), lw=1, color="tab:orange", label="estimated")
    if rolled:
        ax.plot(*zip(*rolled), lw=1, color="tab:green", label=f"measured ({ROLLING}-step window)")
    ax.set_ylabel("tok/s")
    ax.legend(fontsize=7, loc="upper right")


def write_picture(trace_path: str | pathlib.Path | Trace,
                  png: str | pathlib.Path | None = None) -> tuple[pathlib.Path, dict[str, Any]]:
    """Load a decision trace (or take one :func:`load` read), write its PNG (default: beside
    it, ``.png``); returns the PNG's path and the summary (with the panel titles under
    ``panels``)."""
    trace = trace_path if isinstance(trace_path, Trace) else load(trace_path)
    out = pathlib.Path(png) if png is not None else trace.path.with_suffix(".png")
    s = summary(trace)
    s["panels"] = plot(trace, out, s)
    s["png"] = str(out)
    return out, s
