"""Replay a decision trace's timed steps through the online step-cost model.

Sim-to-real for the cost side: every timed step of a real run (batch B, verified tokens
T = B + drafted, drafter passes D of the step's own K, measured ms) is first predicted by a
fresh :class:`~vllm_hust_vspec.adaptive.estimators.StepCostModel` that has seen only the
steps before it, then added to it, as the controller's model saw them. The report says how
far the predictions were off, overall and on the first step of each (batch, K) (the model
extrapolating to a cell it never timed, where a wrong price makes a wrong choice), and the
coefficients of a fit over the whole trace. A trace of a paired comparison replays every
policy's steps into one model (the engine is the same).

``vllm-hust-vspec-bench trace DECISIONS.jsonl --replay-cost`` prints it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from vllm_hust_vspec import methods
from vllm_hust_vspec.adaptive.estimators import StepCostModel

from .trace_picture import Trace

OFF = math.log(1.35)  # a first prediction this far off (either way) is listed


def trace_host(trace: Trace) -> tuple[str | None, bool]:
    """The method and whether K = 0 skipped the drafter, from the first header (:func:`load`
    refuses a trace without one)."""
    head = trace.headers[0]
    method = (head.get("host") or {}).get("method")
    skip = (head.get("settings") or {}).get("adaptive_k0_drafter", "skip") == "skip"
    return method, skip


def replay_cost(trace: Trace) -> dict[str, Any]:
    """The replay's figures (see the module docstring); log errors are ``ln(pred / ms)``."""
    method, skip = trace_host(trace)
    by_step = {int(d["step"]): d for d in trace.decisions}
    model = StepCostModel()
    errors: list[float] = []
    first: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for r in trace.results:
        ms = r.get("ms")
        d = by_step.get(int(r["step"]))
        if ms is None or d is None or float(ms) <= 0:
            continue
        b, k = int(d["batch"]), int(d["k"])
        if b <= 0:
            continue
        passes = methods.draft_forwards(method, k, skip) if method else k
        t = b + int(r["drafted"])
        pred = model.predict(b, t, passes) if model.ready else None
        if pred is not None and pred > 0:
            e = math.log(pred / float(ms))
            errors.append(e)
            if (b, k) not in seen:
                first.append({"batch": b, "k": k, "step": int(r["step"]), "pred_ms": round(pred, 2),
                              "ms": round(float(ms), 2), "log_err": e})
        seen.add((b, k))
        model.add(b, t, passes, float(ms))
    model.fit()
    fe = [f["log_err"] for f in first]
    return {
        "timed_steps": model.n,
        "predicted": len(errors),
        "median_abs_err": statistics.median(abs(e) for e in errors) if errors else None,
        "first_cells": len(first),
        "first_median_abs_err": statistics.median(abs(e) for e in fe) if fe else None,
        "first_mean_err": statistics.fmean(fe) if fe else None,
        "first_off": [f for f in first if abs(f["log_err"]) > OFF],
        "coef": dict(zip(("bias_ms", "c_t", "c_p", "c_d"), (round(c, 4) for c in model.coef))),
        "knees": {"T0": round(model.knees[0], 2), "B0": round(model.knees[1], 2)},
        "rmse_ms": None if model.rmse is None else round(model.rmse, 3),
    }


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{math.expm1(e):+.1%}"


def replay_text(rep: dict[str, Any]) -> str:
    c, kn = rep["coef"], rep["knees"]
    lines = [
        f"  cost model replay: {rep['timed_steps']} timed steps, {rep['predicted']} predicted before "
        f"being seen; median error {_pct(rep['median_abs_err'])}",
        f"    first step of each (batch, K): {rep['first_cells']} cells, median error "
        f"{_pct(rep['first_median_abs_err'])}, mean bias {_pct(rep['first_mean_err'])}",
        f"    fit over the trace: {c['bias_ms']} ms + {c['c_t']} x max(T, {kn['T0']}) + D x "
        f"({c['c_p']} + {c['c_d']} x max(B, {kn['B0']})), rmse {rep['rmse_ms']} ms",
    ]
    for f in rep["first_off"]:
        lines.append(f"    off at first sight: batch {f['batch']} K {f['k']} (step {f['step']}): "
                     f"predicted {f['pred_ms']} ms, measured {f['ms']} ms")
    return "\n".join(lines)
