"""Decision-trace records (DESIGN 3b).  Building the dicts only; the plugin owns the file.

Line 1 (header)::

    {"trace": "vspec-decisions", "version": 1, "settings": {...}, "host": ...}

then per decision::

    {"step", "t", "batch", "k", "k_i": {req: k} | null, "policy", "reason",
     "est_accept": [...], "est_cost_ms", "est_costs"?: [ms per K], "est_goodput"?: [...]}

(``est_costs`` / ``est_goodput``: every K the policy weighed, indexed by K, null below the
first; written by the policies that weigh candidates, ``online``.)
(``joining``: requests that prefill beside the decision's batch, and ``k_first``: the
depth their first drafts were cut to, where one was: written by the controller.)

and, when that step's results arrive::

    {"step", "drafted", "accepted", "ms", "first_drafted"?, "first_accepted"?}

(``drafted``/``accepted`` are sums over the step's requests; ``ms`` may be null;
``first_*``: the part of them that verified requests' first drafts, made by their prefill
step and kept out of the acceptance estimate, where there was any).
"""

from __future__ import annotations

from typing import Any

from .observations import Decision, StepResult

TRACE_NAME = "vspec-decisions"
TRACE_VERSION = 1


def header_record(settings: dict[str, Any], host: Any = None) -> dict[str, Any]:
    return {"trace": TRACE_NAME, "version": TRACE_VERSION, "settings": settings, "host": host}


def decision_record(step: int, t: float, batch: int, d: Decision) -> dict[str, Any]:
    return {
        "step": step,
        "t": round(t, 6),
        "batch": batch,
        "k": d.k,
        "k_i": None if d.k_i is None else dict(d.k_i),
        "policy": d.policy,
        "reason": d.reason,
        "est_accept": [round(a, 4) for a in d.est_accept],
        "est_cost_ms": None if d.est_cost_ms is None else round(d.est_cost_ms, 4),
        **_weighed(d),
    }


def _weighed(d: Decision) -> dict[str, Any]:
    """The cost and goodput the policy predicted for every K it weighed, as lists indexed
    by K (null below the first K weighed): what the controller believed, beside what the
    engine then measured (``vllm-hust-vspec-bench trace``)."""
    if d.est_costs is None:
        return {}
    pad = [None] * d.est_first_k
    out: dict[str, Any] = {"est_costs": pad + [round(c, 4) for c in d.est_costs]}
    if d.est_goodput is not None:
        out["est_goodput"] = pad + [round(g, 5) for g in d.est_goodput]
    return out


def result_record(r: StepResult, drafted: int, accepted: int,
                  first: tuple[int, int] | None = None) -> dict[str, Any]:
    rec = {
        "step": r.step,
        "drafted": drafted,
        "accepted": accepted,
        "ms": None if r.wall_ms is None else round(r.wall_ms, 4),
    }
    if first is not None:  # requests' first drafts (their prefill step's) among them
        rec["first_drafted"], rec["first_accepted"] = first
    if r.catch_up is not None:  # a resume: its tokens caught up and its time
        rec["catch_up_ms"] = round(float(r.catch_up[1]), 4)
    return rec


def is_decision(rec: dict[str, Any]) -> bool:
    """A decision record (a paired comparison's window record names a policy too)."""
    return "k" in rec and "policy" in rec and "window" not in rec


def is_result(rec: dict[str, Any]) -> bool:
    return "drafted" in rec and "k" not in rec
