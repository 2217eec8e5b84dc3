"""What online believed against what the fixed Ks measured (tools/paired_beliefs.py)."""

from __future__ import annotations

import pytest

from vllm_hust_vspec.tools.bench_paired import Window
from vllm_hust_vspec.tools.paired_beliefs import beliefs, decisions_by_window, markdown

pytestmark = pytest.mark.unit


def _w(policy, window, rows, server_round=1, workload="mixed", conc=1):
    steps = sum(r[1] for r in rows)
    return Window(workload, conc, 0, server_round, window, 1, policy, steps,
                  sum(r[2] for r in rows), sum(r[3] for r in rows), 1.0, 0.3, by_batch=tuple(rows))


def _decision(step, batch, k, costs, accept, goodput):
    return {"step": step, "batch": batch, "k": k, "policy": "online", "reason": "best",
            "est_accept": accept, "est_costs": costs, "est_goodput": goodput}


def _cell():
    """fixed:1 at 30 ms and 1.7 tokens a step, fixed:2 at 34 ms and 2.0 (the best: 0.0588
    against 0.0567 tok/ms); online prices K = 1 at 32 ms and K = 2 at 41 and holds K = 1."""
    windows = [_w("fixed:1", 1, [(1, 10, 17, 300.0)]), _w("fixed:2", 2, [(1, 10, 20, 340.0)]),
               _w("online", 3, [(1, 10, 17, 300.0)])]
    costs = [None, 32.0, 41.0]
    d = _decision(10, 1, 1, costs, [0.75, 0.6], [None, 1.75 / 32.0, 2.2 / 41.0])
    other = _decision(11, 2, 1, costs, [0.75, 0.6], [None, 0.1, 0.1])  # no batch-2 steps
    records = [{"step": 1, "drafted": 0, "accepted": 0, "ms": None},
               _decision(1, 1, 1, None, [0.6, 0.57], None),  # a fixed window's decision
               {"window": 1, "by_batch": [[1, 10, 17, 300.0]]},
               {"window": 2, "by_batch": [[1, 10, 20, 340.0]]},
               d, other, {"window": 3, "by_batch": [[1, 10, 17, 300.0]]}]
    return windows, records


def test_decisions_are_the_ones_before_their_window_record():
    _windows, records = _cell()
    got = decisions_by_window(records)
    assert [len(got[w]) for w in (1, 2, 3)] == [1, 0, 2]
    assert got[3][0]["step"] == 10


def test_prices_and_the_loss_they_cause_against_the_fixed_ks():
    windows, records = _cell()
    (row,) = beliefs(windows, {1: records})
    assert (row.workload, row.concurrency, row.batch, row.decisions, row.ks) == ("mixed", 1, 1, 1, [1, 2])
    assert row.priced_vs_measured == pytest.approx([32 / 30, 41 / 34])
    assert row.shape_error == pytest.approx(abs(__import__("math").log(41 / 32 * 30 / 34)))
    best = 20 / 340
    assert row.chosen == pytest.approx((17 / 300) / best)  # it ranked K = 1 first
    assert row.acceptance_only == pytest.approx(1.0)  # 2.2 / 34 > 1.75 / 30: K = 2
    assert row.cost_only == pytest.approx((17 / 300) / best)  # 2.0 / 41 < 1.7 / 32: K = 1
    text = markdown([row])
    assert "| mixed@1 | 1 | 1 | 1 | 1: 1.07, 2: 1.21 | 0.123 | 0.963 | 1.000 | 0.963 | - |" in text


def test_a_batch_a_fixed_k_served_too_little_is_left_out():
    windows, records = _cell()
    windows[1] = _w("fixed:2", 2, [(1, 4, 8, 136.0)])  # 4 steps < MIN_STEPS
    assert beliefs(windows, {1: records}) == []
    assert markdown([]).startswith("No cell")


def test_a_step_that_drafted_another_k_than_the_step_before_is_a_switch():
    """Online held K = 1 at step 9 and drafted K = 2 at step 10, which took 40.8 ms: 1.2 x
    fixed K = 2's 34 ms step; a step after a request joined is no switch."""
    windows, records = _cell()
    held = _decision(9, 1, 1, [None, 32.0, 41.0], [0.75, 0.6], [None, 0.06, 0.05])
    switch = _decision(10, 1, 2, [None, 32.0, 41.0], [0.75, 0.6], [None, 0.05, 0.06])
    records = records[:4] + [held, {"step": 9, "drafted": 1, "accepted": 1, "ms": 30.0},
                             switch, {"step": 10, "drafted": 1, "accepted": 0, "ms": 40.8},
                             records[-1]]
    (row,) = beliefs(windows, {1: records})
    assert (row.decisions, row.switches) == (2, 1)
    assert row.switch_cost == pytest.approx(1.2)
    assert markdown([row]).rstrip().endswith("| 1.20 (1) |")
    switch["joining"] = 1
    (row,) = beliefs(windows, {1: records})
    assert (row.switches, row.switch_cost) == (0, None)
