"""The simulator's normative semantics on hand-made traces with hand-computed results."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.observations import Decision
from vllm_hust_vspec.adaptive.policies.base import Policy
from vllm_hust_vspec.adaptive.policies.registry import register_policy
from vllm_hust_vspec.adaptive.simulate import (
    CostSpec,
    TraceError,
    parse_trace,
    run_controller,
    run_fixed,
    run_oracle,
    run_trace,
    simulate,
)

pytestmark = pytest.mark.unit

# step ms = 1 + max(10, 1 * T) + max(K, dmin) * max(2, 0.5 * B)
COST = {
    "bias_ms": 1.0,
    "target_mem_ms": 10.0,
    "target_token_ms": 1.0,
    "draft_mem_ms": 2.0,
    "draft_token_ms": 0.5,
    "draft_min_steps": 0,
    "noise": 0.0,
}


def _trace(requests, *, kmax=2, max_num_seqs=1, cost=None, seed=0, header_extra=None):
    header = {"format": "vspec-trace", "version": 1, "kmax": kmax, "max_num_seqs": max_num_seqs,
              "cost": dict(COST, **(cost or {})), "seed": seed}
    header.update(header_extra or {})
    lines = [json.dumps(header)] + [json.dumps(r) for r in requests]
    return parse_trace(lines, "<test>")


TWO = [
    {"id": "r0", "arrival_s": 0.0, "accept_len": [2, 0, 1, 2, 0]},
    {"id": "r1", "arrival_s": 0.5, "accept_len": [1, 1]},
]


def test_cost_formula_roofline():
    spec = CostSpec(**{k: v for k, v in COST.items()})
    assert spec.step_ms(1, 0, 1) == 11.0  # memory-bound target, no draft
    assert spec.step_ms(1, 2, 3) == 15.0
    assert spec.step_ms(4, 3, 16) == 1 + 16 + 3 * 2.0  # compute-bound target
    assert spec.step_ms(8, 1, 16) == 1 + 16 + 1 * 4.0  # compute-bound draft (0.5 * 8)
    spec1 = CostSpec(**dict(COST, draft_min_steps=1))
    assert spec1.step_ms(1, 0, 1) == 13.0  # one draft forward even at K=0
    assert list(spec1.uniform_ms(1, 2)) == [13.0, 13.0, 15.0]


def test_fixed_k2_by_hand():
    # step 1: r0 t=0 acc 2 -> +3 (t=3), 15 ms; step 2: r0 t=3 acc 2 -> +3 truncated to +2, done;
    # idle: clock jumps to r1's arrival 0.5 s; step 3: r1 t=0 acc 1 -> +2, done.
    r = run_fixed(_trace(TWO), 2, seed=0)
    assert (r.tokens, r.steps, r.busy_ms, r.sum_k) == (7, 3, 45.0, 6)
    assert r.tok_s == pytest.approx(7000 / 45)
    assert r.mean_k == 2.0


def test_fixed_k0_and_k1_by_hand():
    r0 = run_fixed(_trace(TWO), 0, seed=0)
    assert (r0.tokens, r0.steps, r0.busy_ms) == (7, 7, 77.0)
    # K=1: r0 t=0 acc2 -> +2, t=2 acc1 -> +2, t=4 acc0 -> +1; r1 t=0 acc1 -> +2: 4 steps x 13 ms
    r1 = run_fixed(_trace(TWO), 1, seed=0)
    assert (r1.tokens, r1.steps, r1.busy_ms) == (7, 4, 52.0)


def test_batching_fifo_admission_and_per_request_k():
    reqs = [
        {"id": "a", "arrival_s": 0.0, "accept_len": [2, 2, 2]},
        {"id": "b", "arrival_s": 0.0, "accept_len": [0, 0]},
        {"id": "c", "arrival_s": 0.0, "accept_len": [1]},
    ]
    tr = _trace(reqs, max_num_seqs=2)
    seen = []

    def select(step, running, t):
        seen.append(([tr.requests[i].id for i in running], t.tolist()))
        return np.array([2 if tr.requests[i].id == "a" else 0 for i in running])

    r = run_trace(tr, select, seed=0, name="custom")
    # step 0: a(K2) b(K0): T = 3 + 1 = 4, K = 2, B = 2 -> 1 + 10 + 2*max(2, 1) = 15
    #   a: +3 -> done (len 3); b: +1 -> t=1
    # step 1: b(K0) c(K0) (c admitted FIFO when a left): T = 2 -> 11 ms; b done, c done
    assert seen == [(["a", "b"], [0, 0]), (["b", "c"], [1, 0])]
    assert (r.tokens, r.steps, r.busy_ms) == (6, 2, 26.0)


def test_arrival_order_is_fifo_not_file_order():
    reqs = [
        {"id": "late", "arrival_s": 1.0, "accept_len": [0]},
        {"id": "early", "arrival_s": 0.2, "accept_len": [0]},
    ]
    tr = _trace(reqs)
    order = []
    run_trace(tr, lambda s, running, t: (order.append(tr.requests[running[0]].id), np.zeros(1, int))[1], 0, "x")
    assert order == ["early", "late"]


def test_noise_one_draw_per_step_same_stream():
    tr = _trace(TWO, cost={"noise": 0.1}, seed=7)
    rng = np.random.default_rng(7)
    draws = [rng.normal(0.0, 0.1) for _ in range(7)]
    r = run_fixed(tr, 0, seed=7)
    assert r.busy_ms == pytest.approx(sum(11.0 * math.exp(d) for d in draws))
    # K=2 takes 3 steps: the first three draws of the same stream
    r2 = run_fixed(tr, 2, seed=7)
    assert r2.busy_ms == pytest.approx(sum(15.0 * math.exp(d) for d in draws[:3]))


def test_drift_one_speed_path_for_every_policy():
    """``cost.drift``: every step time is multiplied by the machine's speed factor, an AR(1)
    path of log speed from its own stream (``default_rng((seed, 1))``), step by step the
    same for every policy, on top of the step noise."""
    tr = _trace(TWO, cost={"drift": 0.1, "drift_steps": 3.0}, seed=7)
    rng = np.random.default_rng((7, 1))
    rho = math.exp(-1.0 / 3.0)
    sd = 0.1 * math.sqrt(1.0 - rho * rho)
    x, speeds = 0.0, []
    for _ in range(7):
        speeds.append(math.exp(x))
        x = rho * x + sd * rng.standard_normal()
    r = run_fixed(tr, 0, seed=7)
    assert r.busy_ms == pytest.approx(sum(11.0 * s for s in speeds))
    assert r.busy_ms != pytest.approx(77.0, rel=1e-3)  # the path moved the times
    assert run_fixed(tr, 2, seed=7).busy_ms == pytest.approx(sum(15.0 * s for s in speeds[:3]))
    # no drift: no path, and the header writes no drift keys
    assert run_fixed(_trace(TWO, seed=7), 0, seed=7).busy_ms == pytest.approx(77.0)
    assert "drift" not in CostSpec(**COST).to_dict()
    assert tr.header.cost.to_dict()["drift_steps"] == 3.0


def test_oracle_by_hand():
    # t=0: p=.9,.9: E = 1, 1.9, 2.71 over cost 11, 13, 15 -> K=2; acc 1 -> +2 (t=2)
    # t=2: p=.3,.3: E = 1, 1.3, 1.39 -> ratios .0909, .1, .0927 -> K=1; acc 0 -> +1, done
    tr = _trace([{"id": "r", "arrival_s": 0, "accept_len": [1, 0, 0],
                  "p": [[0.9, 0.9], [0.1, 0.1], [0.3, 0.3]]}])
    o = run_oracle(tr, seed=0)
    assert (o.tokens, o.steps, o.busy_ms, o.sum_k) == (3, 2, 28.0, 3)
    rep = simulate(tr, [], seed=0)
    assert rep.oracle is not None and rep.oracle.tok_s == pytest.approx(3000 / 28)
    assert rep.to_json()["oracle"] == {"tok_s": pytest.approx(3000 / 28), "mean_k": 1.5}


def test_report_schema_and_best_fixed():
    rep = simulate(_trace(TWO), ["fixed:1"], seed=0)
    doc = rep.to_json()
    assert set(doc) == {"policies", "fixed", "best_fixed_k", "oracle"}
    assert doc["oracle"] is None  # no p in the trace
    assert doc["best_fixed_k"] == 2
    assert doc["fixed"] == {"0": pytest.approx(7000 / 77), "1": pytest.approx(7000 / 52), "2": pytest.approx(7000 / 45)}
    row = doc["policies"]["fixed:1"]
    assert set(row) == {"tok_s", "vs_best_fixed", "vs_oracle", "mean_k", "decide_us"}
    assert row["tok_s"] == pytest.approx(7000 / 52)
    assert row["vs_best_fixed"] == pytest.approx(45 / 52)
    assert row["vs_oracle"] is None
    assert row["mean_k"] == 1.0
    assert row["decide_us"] > 0


class _Recorder(Policy):
    """Test policy: K_i = 2 for request 'a', 0 for the others; records what it sees."""

    name = "recorder-test"
    log: list = []

    def decide(self, batch, ctx):
        k_i = {r: (2 if r == "a" else 0) for r in batch.req_ids}
        _Recorder.log.append(("decide", batch))
        return Decision(max(k_i.values()), k_i, self.name, "test", ctx.acceptance.estimate(), None)

    def observe(self, result, ctx):
        _Recorder.log.append(("observe", result))


register_policy("recorder-test", lambda arg, kmax, cfg: _Recorder(), replace=True)


def test_controller_drive_passes_confidences_and_results():
    reqs = [
        {"id": "a", "arrival_s": 0.0, "accept_len": [1, 2, 2], "conf": [[0.9, 0.8], [0.7, 0.6], [0.5, 0.4]]},
        {"id": "b", "arrival_s": 0.0, "accept_len": [0, 0], "conf": [[0.1, 0.2], [0.3, 0.4]]},
    ]
    tr = _trace(reqs, max_num_seqs=2, cost={"draft_min_steps": 1})
    _Recorder.log.clear()
    r = run_controller(tr, "recorder-test", seed=0)
    # step 0: a K2 (acc 1 -> +2, t=2), b K0 (+1, t=1); T = 3 + 1 = 4, K=2: 1 + 10 + 2*2 = 15
    # step 1: a K2 (acc 2 -> +3 truncated to +1, done), b K0 (+1, done): 15
    assert (r.tokens, r.steps, r.busy_ms) == (5, 2, 30.0)
    kinds = [k for k, _ in _Recorder.log]
    assert kinds == ["decide", "observe", "decide", "observe"]
    view0 = _Recorder.log[0][1]
    assert view0.req_ids == ("a", "b") and view0.context_lens == (0, 0)
    assert np.allclose(view0.confidences, [[0.9, 0.8], [0.1, 0.2]])
    res0 = _Recorder.log[1][1]
    assert (res0.step, res0.batch_size, res0.k_verified, res0.wall_ms, res0.num_draft_steps) == (0, 2, 2, 15.0, 2)
    # the engine's form: per-request arrays, no RequestResult objects
    assert res0.results == ()
    assert res0.drafted.tolist() == [2, 0] and res0.accepted.tolist() == [1, 0]
    assert np.allclose(res0.confidences, [[0.9, 0.8], [0.1, 0.2]]) and res0.context_lens.tolist() == [0, 0]
    res1 = _Recorder.log[3][1]
    assert (res1.drafted.tolist(), res1.accepted.tolist(), res1.context_lens.tolist()) == ([2, 0], [2, 0], [2, 1])


def test_controller_fixed_equals_engine_fixed():
    tr = _trace(TWO, cost={"noise": 0.2}, seed=3)
    via_ctl = run_controller(tr, "fixed:1", seed=3)
    direct = run_fixed(tr, 1, seed=3)
    assert (via_ctl.tokens, via_ctl.steps) == (direct.tokens, direct.steps)
    assert via_ctl.busy_ms == pytest.approx(direct.busy_ms)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (['{"format": "other", "version": 1}'], "key 'format'"),
        (['{"format": "vspec-trace", "version": 2, "kmax": 2, "max_num_seqs": 1, "cost": {}}'], "version"),
        (['{"format": "vspec-trace", "version": 1, "max_num_seqs": 1, "cost": {}}'], "'kmax' is missing"),
        (["not json"], "<t>:1: not valid JSON"),
    ],
)
def test_bad_header(lines, needle):
    with pytest.raises(TraceError, match=needle):
        parse_trace(lines, "<t>")


def _header(**cost):
    return json.dumps({"format": "vspec-trace", "version": 1, "kmax": 2, "max_num_seqs": 1,
                       "cost": dict(COST, **cost)})


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        ([_header(bias_ms=-1.0), '{"id": "r", "arrival_s": 0, "accept_len": [0]}'], r"<t>:1: header 'cost': key 'bias_ms' must be >= 0"),
        ([_header(draft_min_steps=0.5)], "draft_min_steps"),
        ([_header(drift=-0.1)], r"header 'cost': key 'drift' must be >= 0"),
        ([_header(drift=0.1, drift_steps=0.5)], r"key 'drift_steps' must be at least 1 step"),
        ([_header(drift_sd=0.1)], r"unknown key 'drift_sd'"),
        ([_header(), '{"id": "r", "arrival_s": 0, "accept_len": [0, 3]}'], r"<t>:2: key 'accept_len\[1\]' = 3 is out of range 0..2"),
        ([_header(), '{"id": "r", "arrival_s": 0, "accept_len": [0], "p": [[0.5]]}'], r"key 'p' must have shape \[1\]\[2\]"),
        ([_header(), '{"id": "r", "arrival_s": 0, "accept_len": [0], "p": [[0.5, 1.5]]}'], "outside"),
        ([_header(), '{"id": "r", "arrival_s": 0, "accept_len": [0]}', '{"id": "r", "arrival_s": 0, "accept_len": [0]}'], "duplicate"),
        ([_header(), '{"id": "r", "arrival_s": 0, "accept_len": [0]', ], r"<t>:2: not valid JSON"),
        ([_header(), '{"id": "r", "arrival": 0, "accept_len": [0]}'], "unknown request key 'arrival'"),
        ([_header()], "no requests"),
        ([], "empty trace"),
    ],
)
def test_bad_lines(lines, needle):
    with pytest.raises(TraceError, match=needle):
        parse_trace(lines, "<t>")


def test_unknown_policy_fails_before_running():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        simulate(_trace(TWO), ["nope"])
    with pytest.raises(ValueError, match="given twice"):
        simulate(_trace(TWO), ["online", "online"])
