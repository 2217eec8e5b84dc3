"""The engine core's /metrics feed (runtime/metrics_feed.py): what one engine step sends.

Pure Python: the records are the decision trace's own (decision, result, drafter) as the
controller writes them; the real server's /metrics is checked against a real trace in
tests/host/test_launcher_serve.py."""

from __future__ import annotations

import pytest

from vllm_hust_vspec.runtime.metric_names import DECISION_KINDS, METRICS, PREFIX
from vllm_hust_vspec.runtime.metrics_feed import (MetricsFeed, cost_state, decision_kind,
                                                  goodput_estimate)

pytestmark = pytest.mark.unit


def _decision(step, k, reason, batch=2, k_i=None, accept=(0.5, 0.5), cost=10.0, goodput=None):
    rec = {"step": step, "t": 0.0, "batch": batch, "k": k, "k_i": k_i, "policy": "online",
           "reason": reason, "est_accept": list(accept), "est_cost_ms": cost}
    if goodput is not None:
        rec["est_costs"] = [cost] * len(goodput)
        rec["est_goodput"] = list(goodput)
    return rec


def test_decision_kinds():
    assert decision_kind("warmup 1/9 k=4 on 2/2", 4, None) == "probe"
    assert decision_kind("probe k=1 on 1/4", 1, 3) == "probe"
    assert decision_kind("measure k=2: no recent step time at batch ~4", 2, 3) == "probe"
    assert decision_kind("probe +1 on budget 12/16 slots", 3, 2) == "probe"
    assert decision_kind("fallback k=0: controller fault at step 9", 0, 3) == "fallback"
    assert decision_kind("switch 3->1: +4.0% tok/ms", 1, 3) == "switch"
    assert decision_kind("budget (survival >= 0.3, depth <= 2)", 2, 3) == "switch"
    assert decision_kind("hold k=3: best k=2 only +0.5%", 3, 3) == "hold"
    assert decision_kind("fixed k=2", 2, None) == "hold"


def test_goodput_from_the_policys_own_figure_or_from_acceptance_and_cost():
    # online weighs every K: its own figure at the chosen K, tokens/ms -> tokens/s
    assert goodput_estimate(_decision(1, 1, "x", goodput=[0.2, 0.3, 0.25])) == pytest.approx(300.0)
    # otherwise: per request 1 + a1 + a1*a2 ... up to its K, over the estimated cost
    rec = _decision(1, 2, "x", batch=2, accept=(0.5, 0.4), cost=10.0)
    assert goodput_estimate(rec) == pytest.approx(1000 * 2 * (1 + 0.5 + 0.2) / 10.0)
    rec = _decision(1, 2, "x", batch=2, k_i={"a": 2, "b": 0}, accept=(0.5, 0.4), cost=10.0)
    assert goodput_estimate(rec) == pytest.approx(1000 * ((1 + 0.5 + 0.2) + 1) / 10.0)
    assert goodput_estimate(_decision(1, 2, "x", cost=None)) is None


def test_one_drain_per_step_carries_what_arrived_since_the_last():
    feed = MetricsFeed()
    assert feed.drain() is None  # nothing arrived, no state
    feed.set_state({"policy": "online", "cost": "online"})
    feed.records([_decision(1, 3, "warmup 1/3 k=3 on 2/2", batch=2),
                  _decision(2, 1, "switch 3->1", batch=2, k_i={"a": 1, "b": 0}, cost=None),
                  {"step": 1, "drafted": 6, "accepted": 2, "ms": 12.0},
                  {"step": 2, "drafter": {"skipped": 1, "caught_up": 0}},
                  {"step": 3, "drafter": {"skipped": 0, "caught_up": 7}},
                  {"step": 2, "drafted": 1, "accepted": 1, "ms": None}])
    p = feed.drain()
    assert p["k"] == [3, 1] and p["ki"] == [3, 3, 1, 0] and p["spread"] == [0, 1]
    # the warm-up is a probe, not a held K: the decision after it has nothing to switch
    # from, whatever its reason says, so it is a hold
    assert p["kinds"] == {"hold": 1, "switch": 0, "probe": 1, "fallback": 0}
    assert p["batch"] == 2 and p["accept"] == [0.5, 0.5]
    assert p["est_ms"] == 10.0  # the last estimate that existed (step 2 had none)
    assert p["meas_ms"] == 12.0 and p["timed"] == [10.0, 12.0, 1]
    assert p["skipped"] == 1 and p["caught_up"] == 7 and p["fallbacks"] == 0
    assert p["state"] == {"policy": "online", "cost": "online"}
    # the same state is not sent again; a fallback is
    feed.set_state({"policy": "online", "cost": "online"})
    assert feed.drain() is None
    feed.fallback()
    p = feed.drain()
    assert p["fallbacks"] == 1 and "state" not in p and p["k"] == []


def test_steps_held_by_admission_control_are_counted():
    feed = MetricsFeed()
    feed.records([_decision(1, 2, "fixed k=2"), {"step": 2, "admission": {"held": 5}},
                  _decision(2, 2, "fixed k=2"), {"step": 3, "admission": {"held": 1}},
                  _decision(3, 2, "fixed k=2")])
    assert feed.drain()["held"] == 2
    feed.records([_decision(4, 2, "fixed k=2")])
    assert feed.drain()["held"] == 0


def test_hold_and_switch_follow_the_held_k_not_the_probes():
    feed = MetricsFeed()
    feed.records([_decision(1, 2, "best k=2"), _decision(2, 4, "probe k=4 on 1/2"),
                  _decision(3, 2, "hold k=2: best k=3 only +0.1%"),
                  _decision(4, 3, "switch 2->3")])
    assert feed.drain()["kinds"] == {"hold": 2, "switch": 1, "probe": 1, "fallback": 0}


def test_cost_state_names_where_costs_come_from():
    class Table:
        source, cost_model, request_buckets, target_rows = "t.json", "bucketed", (1, 4, 8), (4, 16)

    class Policy:
        def __init__(self, name, table=None):
            self.name, self.table, self.source = name, table, "p.json"

    class Controller:
        def __init__(self, policy):
            self.policy = policy

    s = cost_state(Controller(Policy("budget", Table())))
    assert s == {"policy": "budget", "cost": "cost table", "source": "t.json",
                 "cost_model": "bucketed", "batch_max": 8, "rows_max": 16}
    assert cost_state(Controller(Policy("budget")))["cost"] == "online"
    assert cost_state(Controller(Policy("profile")))["source"] == "p.json"
    assert cost_state(Controller(Policy("fixed")))["cost"] == "none"


def test_metric_names_are_unique_and_prefixed():
    names = [m.full_name for m in METRICS]
    assert len(names) == len(set(names))
    assert all(n.startswith(PREFIX) and ":" not in n[len(PREFIX):] for n in names)
    assert {m.kind for m in METRICS} == {"histogram", "counter", "gauge"}
    assert DECISION_KINDS == ("hold", "switch", "probe", "fallback")
