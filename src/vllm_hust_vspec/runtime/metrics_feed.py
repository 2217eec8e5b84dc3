"""The controller's state for the server's ``/metrics``, gathered in the engine core.

The feed reads the same records the decision trace gets (decisions, step results, the
drafter's K = 0 account) and, once per engine step, :meth:`MetricsFeed.drain` turns what
arrived since the last drain into one small payload of plain values.  That payload rides on
the host's own per-step ``SchedulerStats`` to the API server (:mod:`.stats_channel`), where
:mod:`.prometheus` turns it into Prometheus metrics.  Pure Python (no vLLM import).

A decision's kind (``decisions_total{reason=...}``): ``probe`` (the policy measured a K it
does not hold: warm-up, probes, measurements), ``fallback`` (the runtime's safe K after a
fault in the controller), else ``switch`` when K differs from the last decision that was not
a probe, else ``hold``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vllm_hust_vspec.adaptive.trace import is_decision, is_result
from vllm_hust_vspec.runtime.metric_names import DECISION_KINDS

_PROBE_PREFIXES = ("warmup", "probe", "measure")
_MAX_PENDING_COSTS = 64  # decisions whose step time has not come back yet, kept at most


def decision_kind(reason: str, k: int, held: int | None) -> str:
    """The kind of a decision with ``reason`` and batch K ``k``; ``held`` is the K of the last
    decision that was not a probe (None before the first)."""
    if reason.startswith("fallback"):
        return "fallback"
    if reason.startswith(_PROBE_PREFIXES):
        return "probe"
    if held is not None and k != held:
        return "switch"
    return "hold"


def request_ks(rec: Mapping[str, Any]) -> list[int]:
    """Each decode request's K in a decision record (its K_i, else the batch K)."""
    k_i = rec.get("k_i")
    if k_i:
        return [int(v) for v in k_i.values()]
    return [int(rec["k"])] * int(rec["batch"])


def goodput_estimate(rec: Mapping[str, Any]) -> float | None:
    """The goodput (tokens/s) the decision expected at its K: the policy's own figure where it
    weighed K (``est_goodput``), else the committed tokens its acceptance estimate predicts
    (per request 1 + the sum of the survival products up to its K) over its estimated step
    cost; None without a cost estimate."""
    weighed = rec.get("est_goodput")
    k = int(rec["k"])
    if weighed is not None and k < len(weighed) and weighed[k] is not None:
        return 1000.0 * float(weighed[k])
    cost = rec.get("est_cost_ms")
    if not cost:
        return None
    survival = [1.0]
    for a in rec.get("est_accept") or ():
        survival.append(survival[-1] * float(a))
    tokens = 0.0
    for ki in request_ks(rec):
        tokens += sum(survival[:min(ki, len(survival) - 1) + 1])
    return 1000.0 * tokens / float(cost)


class MetricsFeed:
    """Everything ``/metrics`` shows of one engine's controller since the last drain."""

    def __init__(self) -> None:
        self._records: list[dict[str, Any]] = []
        self._held: int | None = None
        self._costs: dict[int, float] = {}  # step -> estimated ms, until its result arrives
        self._fallbacks = 0
        self._state: dict[str, Any] = {}
        self._state_sent = True

    def records(self, records: Iterable[dict[str, Any]]) -> None:
        """Trace records (as the decision trace gets them)."""
        self._records.extend(records)

    def fallback(self) -> None:
        """The runtime switched this engine to its safe K after a fault."""
        self._fallbacks += 1

    def set_state(self, state: Mapping[str, Any]) -> None:
        """The engine's slowly changing facts (policy, cost table source and coverage); sent
        with the next payload when they changed."""
        if dict(state) != self._state:
            self._state = dict(state)
            self._state_sent = False

    def drain(self) -> dict[str, Any] | None:
        """What arrived since the last drain, as plain values; None when nothing did.

        Always: ``k`` / ``ki`` / ``spread`` (per decision: its K, every request's K, the K_i
        spread), ``kinds`` (decisions per kind), ``timed`` ([predicted ms, measured ms,
        steps] over the steps with both), ``skipped`` / ``caught_up`` (drafter), ``fallbacks``.
        The last value seen, where one arrived: ``batch``, ``accept``, ``est_ms``,
        ``goodput`` (tokens/s), ``meas_ms``; ``state`` when it changed."""
        records, self._records = self._records, []
        if not records and self._state_sent and not self._fallbacks:
            return None
        out: dict[str, Any] = {"k": [], "ki": [], "spread": [], "kinds": dict.fromkeys(DECISION_KINDS, 0),
                               "timed": [0.0, 0.0, 0], "skipped": 0, "caught_up": 0, "held": 0}
        for rec in records:
            if is_decision(rec):
                self._decision(rec, out)
            elif is_result(rec):
                self._result(rec, out)
            elif "admission" in rec:
                out["held"] += 1
            elif "drafter" in rec:
                out["skipped"] += int(rec["drafter"]["skipped"])
                out["caught_up"] += int(rec["drafter"]["caught_up"])
        out["fallbacks"] = self._fallbacks
        self._fallbacks = 0
        if not self._state_sent:
            out["state"] = self._state
            self._state_sent = True
        return out

    def _decision(self, rec: Mapping[str, Any], out: dict[str, Any]) -> None:
        k = int(rec["k"])
        kind = decision_kind(str(rec.get("reason", "")), k, self._held)
        if kind != "probe":
            self._held = k
        out["kinds"][kind] += 1
        out["k"].append(k)
        ks = request_ks(rec)
        out["ki"].extend(ks)
        out["spread"].append(max(ks) - min(ks) if ks else 0)
        out["batch"] = int(rec["batch"])
        out["accept"] = list(rec.get("est_accept") or ())
        goodput = goodput_estimate(rec)
        if goodput is not None:
            out["goodput"] = goodput
        cost = rec.get("est_cost_ms")
        if cost is not None:
            out["est_ms"] = float(cost)
            self._costs[int(rec["step"])] = float(cost)
            if len(self._costs) > _MAX_PENDING_COSTS:
                del self._costs[min(self._costs)]

    def _result(self, rec: Mapping[str, Any], out: dict[str, Any]) -> None:
        est = self._costs.pop(int(rec["step"]), None)
        ms = rec.get("ms")
        if ms is None:
            return
        out["meas_ms"] = float(ms)
        if est is not None:  # a step with both a prediction and a time
            timed = out["timed"]
            timed[0] += est
            timed[1] += float(ms)
            timed[2] += 1


def cost_state(controller: Any) -> dict[str, Any]:
    """Where a controller's step costs come from (``cost_table_info`` on ``/metrics``): the
    start-up or saved cost table (source, cost model, the largest batch and verify-row bucket
    it covers), a profile, the online model measured while serving, or none (policies that
    price nothing)."""
    policy = controller.policy
    name = str(policy.name)
    table = getattr(policy, "table", None) if name == "budget" else None
    if table is not None:
        return {"policy": name, "cost": "cost table", "source": str(table.source or ""),
                "cost_model": str(table.cost_model),
                "batch_max": max(table.request_buckets, default=0),
                "rows_max": max(table.target_rows, default=0)}
    if name == "profile":
        return {"policy": name, "cost": "profile", "source": str(policy.source or ""),
                "cost_model": "profile"}
    if name in ("online", "budget"):
        return {"policy": name, "cost": "online", "source": "measured while serving",
                "cost_model": "roofline"}
    return {"policy": name, "cost": "none", "source": "", "cost_model": ""}
