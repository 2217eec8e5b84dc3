"""The ``budget`` policy (DSpark rule) and the ``profile`` policy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.controller import Controller, ControllerConfig
from vllm_hust_vspec.adaptive.costmodel import CostTableError
from vllm_hust_vspec.adaptive.estimators import AcceptanceEstimator, ConfidenceMap, StepCostModel
from vllm_hust_vspec.adaptive.generators import generate
from vllm_hust_vspec.adaptive.observations import BatchView, RequestResult, StepResult
from vllm_hust_vspec.adaptive.policies.base import PolicyContext
from vllm_hust_vspec.adaptive.policies.budget import BudgetPolicy
from vllm_hust_vspec.adaptive.policies.profile import ProfilePolicy
from vllm_hust_vspec.adaptive.policies.registry import make_policy
from vllm_hust_vspec.adaptive.profile import LatencyModel, Profile
from vllm_hust_vspec.adaptive.simulate import _Packed, run_controller

pytestmark = pytest.mark.unit

KMAX = 4


def _ctx(accept=0.7, cost_samples=None, exploration=0.0):
    acc = AcceptanceEstimator(KMAX)
    for _ in range(200):  # a well-measured conditional acceptance `accept` at every position
        acc.update_counts([100] * KMAX, [100 * accept] * KMAX)
    cost = StepCostModel()
    # truth: ms = 10 + 0.5 * T + 1 * D * B  (no knees)
    for b, t, d in cost_samples or [(b, b * (k + 1), k) for b in (1, 4, 8) for k in range(KMAX + 1)]:
        cost.add(b, t, d, 10 + 0.5 * t + 1.0 * d * b)
    return PolicyContext(kmax=KMAX, min_gamma=0, acceptance=acc, cost=cost, confidence_map=ConfidenceMap(),
                         rng=np.random.default_rng(0), exploration=exploration, warmup_samples=1)


def _warm(policy):
    policy.n = 10_000  # past warm-up
    return policy


def test_uniform_survival_matches_expected_goodput():
    ctx = _ctx(accept=0.9)
    pol = _warm(BudgetPolicy(KMAX))
    d = pol.decide(BatchView(0, ("a", "b")), ctx)
    # same curve for both requests: uniform K; check it is the best uniform K by hand
    e = [1.0]
    for a in ctx.acceptance.estimate():
        e.append(e[-1] + np.prod(ctx.acceptance.estimate()[: len(e)]))
    costs = [ctx.cost.predict(2, 2 * (k + 1), k) for k in range(KMAX + 1)]
    best = int(np.argmax([2 * e[k] / costs[k] for k in range(KMAX + 1)]))
    assert d.k_i is None and d.k == best  # batch-uniform: every request drafts K
    assert "estimated survival" in d.reason


def test_confidences_give_per_request_depths():
    ctx = _ctx(accept=0.6)
    ctx.cost = StepCostModel()  # cheap drafter passes: 10 + 0.5 T + 0.1 D B
    for b, t, dd in [(b, b * (k + 1), k) for b in (1, 3, 8) for k in range(KMAX + 1)]:
        ctx.cost.add(b, t, dd, 10 + 0.5 * t + 0.1 * dd * b)
    pol = _warm(BudgetPolicy(KMAX))
    conf = np.array([[0.97, 0.96, 0.95, 0.95], [0.05, 0.05, 0.05, 0.05], [0.9, 0.2, 0.1, 0.1]])
    d = pol.decide(BatchView(0, ("easy", "hard", "mid"), confidences=conf), ctx)
    assert d.k_i["easy"] > d.k_i["mid"] > d.k_i["hard"] == 0
    assert d.k == max(d.k_i.values())
    assert "confidence survival" in d.reason
    # the mapping form gives the same answer
    d2 = pol.decide(BatchView(1, ("easy", "hard", "mid"),
                              confidences={"easy": conf[0], "hard": conf[1], "mid": conf[2]}), ctx)
    assert d2.k_i == d.k_i


def test_depth_cap_when_draft_passes_are_expensive():
    # drafter passes cost 20 ms x B: one deep request would tax the whole batch
    samples = [(b, b * (k + 1), k) for b in (2, 4) for k in range(KMAX + 1)]
    ctx = _ctx(accept=0.6, cost_samples=samples)
    ctx.cost = StepCostModel()
    for b, t, dd in samples:
        ctx.cost.add(b, t, dd, 10 + 0.01 * t + 20.0 * dd * b)
    pol = _warm(BudgetPolicy(KMAX))
    conf = np.array([[0.99, 0.99, 0.99, 0.99], [0.3, 0.3, 0.3, 0.3]])
    d = pol.decide(BatchView(0, ("a", "b"), confidences=conf), ctx)
    assert d.k == 0 and d.k_i == {"a": 0, "b": 0}


def _table(tmp_path, theta):
    doc = {
        "format": "vspec-cost-table", "version": 1, "cost_model": "additive", "draft_width": KMAX,
        "buckets": {"requests": [1, 2, 4], "target_rows": sorted(int(g) for g in theta)},
        "model_id": "m", "dtype": "float32", "quantization": None, "parallel": {}, "execution": {},
        "host_version": "0.32.0",
        "additive": {"bias_s": 0.01, "alpha_s": {"1": 0.0, "2": 0.0, "4": 0.0}, "theta_s": theta},
    }
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    return path


def test_cost_table_prices_by_target_rows(tmp_path):
    ctx = _ctx(accept=0.8)
    conf = np.full((2, KMAX), 0.9)
    # verification is free up to 8 rows, then very expensive: the budget fills exactly 8 rows
    cheap = _table(tmp_path, {"2": 0.0, "8": 0.0, "10": 1.0})
    pol = _warm(make_policy(f"budget:{cheap}", KMAX))
    d = pol.decide(BatchView(0, ("a", "b"), confidences=conf), ctx)
    assert sum(d.k_i.values()) == 6 and "cost table" in d.reason
    # every extra row costs more than it can return: no drafting
    dear = _table(tmp_path, {"2": 0.0, "3": 1.0, "10": 2.0})
    pol = _warm(make_policy("budget", KMAX, cost_table=str(dear)))
    d = pol.decide(BatchView(0, ("a", "b"), confidences=conf), ctx)
    assert d.k_i == {"a": 0, "b": 0}


def test_bad_cost_table_is_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"cost_model": "sps"}))
    with pytest.raises(CostTableError, match="field 'draft_width'|field 'buckets'"):
        make_policy(f"budget:{path}", KMAX)
    narrow = _table(tmp_path, {"2": 0.0, "8": 0.0})
    with pytest.raises(ValueError, match="draft_width"):
        make_policy(f"budget:{narrow}", KMAX + 2)


def test_probe_goes_one_deeper_and_zero_resumes():
    ctx = _ctx(accept=0.05, exploration=0.5)  # probe every 2nd decision
    pol = BudgetPolicy(KMAX)
    pol.n = 10_000
    ds = [pol.decide(BatchView(i, ("a", "b")), ctx) for i in range(4)]
    assert [d.k for d in ds] == [1, 0, 1, 0]
    assert ds[0].reason.startswith("probe +1") and ds[0].k_i is None


def test_budget_through_controller_learns_calibration():
    ctl = Controller(ControllerConfig(kmax=KMAX, policy="budget", seed=0))
    rng = np.random.default_rng(0)
    # 16 requests: the calibration learns from up to 16 rows per step, so bin 9's estimate
    # (~50 decayed samples per 8 rows) is not at the mercy of one trajectory's noise
    ids = tuple(f"r{i}" for i in range(16))
    for step in range(300):
        conf = rng.random((16, KMAX))
        d = ctl.decide(BatchView(step, ids, confidences=conf))
        res = []
        for i, rid in enumerate(ids):
            k = d.k if d.k_i is None else d.k_i[rid]
            acc = 0
            while acc < k and rng.random() < conf[i, acc] ** 2:  # confidences over-state acceptance
                acc += 1
            res.append(RequestResult(rid, k, acc, 0, tuple(conf[i, :k])))
        ctl.observe(StepResult(step, 16, d.k, tuple(res), 10 + 0.5 * sum(1 + r.drafted for r in res), d.k))
    table = ctl.confidence_map.table()
    # learnt c**2 where the budget drafts (high confidence), not the identity prior
    # (identity prior: 0.75, 0.85, 0.95 in bins 7, 8, 9; truth c**2: ~0.56, ~0.72, ~0.90)
    # (bin 9 alone, ~75 decayed samples of p ~0.9, is within noise of its prior)
    assert table[7] < 0.68 and table[8] < 0.8 and sum(table[7:10]) / 3 < 0.8
    assert table == tuple(sorted(table))


def test_budget_beats_online_on_hetero():
    """Over seeds 0-5 of ``hetero`` (easy and hard requests in one batch, confidences that
    tell them apart) ``budget`` beats ``online`` on average and on most seeds: budget /
    online 0.997, 1.114, 1.102, 0.967, 1.057, 1.064 (geometric mean 1.049).  Not on every
    seed: on seed 3 it loses 3 %, and on seed 0 the two are within 0.3 % (1.0006 before the
    step-cost cells followed their own steps at 0.05 instead of 0.01, 0.997 after)."""
    ratios = []
    for seed in range(6):
        trace = generate("hetero", seed, scale=0.5)
        assert trace.has_conf
        pk = _Packed(trace)
        online = run_controller(trace, "online", seed, pk)
        budget = run_controller(trace, "budget", seed, pk)
        ratios.append(budget.tok_s / online.tok_s)
    assert float(np.exp(np.mean(np.log(ratios)))) > 1.03, ratios
    assert sum(r > 1.0 for r in ratios) >= 4, ratios


# ----------------------------------------------------------------------------- profile policy


def _profile(**kw):
    return Profile(LatencyModel(0.0, 0.5, 10.0), LatencyModel(0.0, 0.0, 1.0), **kw)


def test_profile_policy_picks_goodput_best_k():
    ctx = _ctx(accept=0.8)
    pol = ProfilePolicy(_profile(), KMAX)
    d = pol.decide(BatchView(0, ("a",) * 1), ctx)
    e = ctx.acceptance.expected_committed()
    ms = [10 + 0.5 * (k + 1) + 1.0 * k for k in range(KMAX + 1)]
    assert d.k == int(np.argmax([e[k] / ms[k] for k in range(KMAX + 1)])) == KMAX
    assert d.est_cost_ms == pytest.approx(ms[KMAX])


def test_profile_policy_online_correction_changes_choice():
    ctx = _ctx(accept=0.8)
    ctx.hysteresis = 0.0
    pol = ProfilePolicy(_profile(), KMAX)
    assert pol.decide(BatchView(0, ("a",)), ctx).k == KMAX
    # the host is much slower at K=KMAX than the profile says (factor clamps at 10x), and
    # exactly as the profile says at K=1
    for step in range(30):
        pol.observe(StepResult(step, 1, KMAX, (RequestResult("a", KMAX, 2, 0),), 500.0, KMAX), ctx)
        pol.observe(StepResult(step, 1, 1, (RequestResult("a", 1, 1, 0),), 10 + 0.5 * 2 + 1.0, 1), ctx)
    assert pol.factor(1, KMAX) == pytest.approx(10.0, rel=0.05)
    assert pol.factor(1, 1) == pytest.approx(1.0)
    assert pol.factor(1, 2) == pytest.approx(5.5, rel=0.05)  # unseen K: the bucket's mean
    assert pol.decide(BatchView(1, ("a",)), ctx).k == 1


def test_profile_policy_needs_a_profile_and_checks_kmax(tmp_path):
    with pytest.raises(ValueError, match="needs a latency profile"):
        make_policy("profile", KMAX)
    path = tmp_path / "p.json"
    _profile(max_speculative_tokens=2).save(path)
    with pytest.raises(ValueError, match="max_speculative_tokens"):
        make_policy(f"profile:{path}", KMAX)
    assert make_policy(f"profile:{path}", 2).name == "profile"


def test_budget_with_a_cost_table_in_the_simulator(tmp_path):
    """The table drives the simulated budget: rows priced dear -> (almost) no drafting;
    rows priced flat -> deep drafting (a DSpark table prices full steps by rows G only)."""
    trace = generate("hetero", 1, scale=0.2)
    pk = _Packed(trace)

    def run(theta_per_row: float) -> float:
        rows = list(range(1, 433))  # every row count its own bucket: no free padding
        doc = {"cost_model": "additive", "draft_width": 8,
               "buckets": {"requests": [48], "target_rows": rows},
               "model_id": None, "dtype": None, "quantization": None, "parallel": {}, "execution": {},
               "host_version": None,
               "additive": {"bias_s": 0.02, "alpha_s": {"48": 0.0},
                            "theta_s": {str(g): theta_per_row * g for g in rows}}}
        path = tmp_path / f"t{theta_per_row}.json"
        path.write_text(json.dumps(doc))
        return run_controller(trace, f"budget:{path}", 1, pk).mean_k

    assert run(0.1) < 0.3  # each verify row costs 100 ms: only warm-up and probes draft
    assert run(0.0) > 5.0  # rows are free: draft deep


def test_legacy_profile_drives_the_profile_policy(tmp_path):
    legacy = {
        "schema_version": 1, "max_speculative_tokens": KMAX, "initial_gamma": 1,
        "target": {"alpha_ms_per_context_token": 0.0, "gamma_ms_per_batched_token": 0.5, "delta_ms": 10.0},
        "draft": {"alpha_ms_per_context_token": 0.0, "gamma_ms_per_batched_token": 0.0, "delta_ms": 1.0},
        "batch_gamma_policy": {"4": 3, "64": 1},
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(legacy))
    pol = make_policy(f"profile:{path}", KMAX)
    ctx = _ctx(accept=0.8)
    assert pol.held == 1  # initial_gamma
    ctx.max_gamma_step = 8
    d = pol.decide(BatchView(0, ("a", "b")), ctx)
    # the batch policy prefers K=3 at batch 2 unless another K is better by > hysteresis
    e = ctx.acceptance.expected_committed()
    gp = [2 * e[k] / (10 + 0.5 * 2 * (k + 1) + k) for k in range(KMAX + 1)]
    best = int(np.argmax(gp))
    assert d.k == (best if gp[best] > gp[3] * (1 + ctx.hysteresis) else 3)


def _cheap_drafter_ctx():
    ctx = _ctx(accept=0.6)
    ctx.cost = StepCostModel()  # cheap drafter passes: 10 + 0.5 T + 0.1 D B
    for b, t, dd in [(b, b * (k + 1), k) for b in (1, 3, 8, 32) for k in range(KMAX + 1)]:
        ctx.cost.add(b, t, dd, 10 + 0.5 * t + 0.1 * dd * b)
    return ctx


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_histogram_selection_is_near_the_exact_rule(seed):
    """The 64-level histogram against the exact rule (every prefix of the slots sorted by
    survival, under every depth cap, priced by the same model): >= 99.5% of its
    expected committed tokens per ms."""
    ctx = _ctx(accept=0.6)
    ctx.cost = StepCostModel()  # 10 + 0.1 T + 0.05 D B: a per-request budget pays at B = 32
    for bb, t, dd in [(bb, bb * (k + 1), k) for bb in (1, 8, 32) for k in range(KMAX + 1)]:
        ctx.cost.add(bb, t, dd, 10 + 0.1 * t + 0.05 * dd * bb)
    rng = np.random.default_rng(seed)
    b = 32
    conf = rng.beta(2.0, 1.0, size=(b, KMAX))
    ids = tuple(f"r{i}" for i in range(b))
    pol = _warm(BudgetPolicy(KMAX))
    d = pol.decide(BatchView(0, ids, confidences=conf), ctx)
    table = ctx.confidence_map.table_array()
    surv = np.cumprod(table[np.minimum((conf * len(table)).astype(int), len(table) - 1)], axis=1)

    def value(k_i):
        k_i = np.asarray(k_i)
        gain = sum(surv[i, :k].sum() for i, k in enumerate(k_i))
        return (b + gain) / ctx.cost.predict(b, b + int(k_i.sum()), int(k_i.max()))

    best = value(np.zeros(b, dtype=int))
    for cap in range(1, KMAX + 1):
        order = np.sort(surv[:, :cap].ravel())[::-1]
        for n_adm in range(1, len(order) + 1):
            thr = order[n_adm - 1]
            best = max(best, value((surv[:, :cap] >= thr).sum(axis=1)))
    got = value([d.k_i[r] for r in ids])
    assert got >= 0.995 * best, (got, best)
    assert d.k > 0 and len(set(d.k_i.values())) > 1  # a per-request budget, not uniform


def test_selection_schedule_backs_off_and_reselects_on_changes():
    samples = [(b, b * (k + 1), k) for b in (2, 4) for k in range(KMAX + 1)]
    ctx = _ctx(accept=0.6, cost_samples=samples)
    ctx.cost = StepCostModel()  # expensive drafter passes: depth cap 0
    for b, t, dd in samples:
        ctx.cost.add(b, t, dd, 10 + 0.01 * t + 20.0 * dd * b)
    pol = _warm(BudgetPolicy(KMAX))
    conf = np.array([[0.99, 0.99, 0.99, 0.99], [0.3, 0.3, 0.3, 0.3]])
    fresh = [not pol.decide(BatchView(i, ("a", "b"), confidences=conf), ctx).reason.startswith("held")
             for i in range(40)]
    # held 2, 4, 8, 16 decisions while the choice (cap 0) is confirmed
    assert [i for i, f in enumerate(fresh) if f] == [0, 2, 6, 14, 30]
    # a new request at the end of the batch re-selects at once
    conf3 = np.vstack([conf, conf[:1]])
    assert not pol.decide(BatchView(40, ("a", "b", "c"), confidences=conf3), ctx).reason.startswith("held")
    assert pol.decide(BatchView(41, ("a", "b", "c"), confidences=conf3), ctx).reason.startswith("held")


def test_held_decisions_follow_confidences_and_reselect_on_drift():
    ctx = _cheap_drafter_ctx()
    pol = _warm(BudgetPolicy(KMAX))
    ids = tuple(f"r{i}" for i in range(8))
    mixed = np.tile([[0.97, 0.96, 0.95, 0.95], [0.05, 0.05, 0.05, 0.05]], (4, 1))
    d0 = pol.decide(BatchView(0, ids, confidences=mixed), ctx)
    assert not d0.reason.startswith("held") and 0 < d0.k
    # held: swap easy and hard requests -> the K_i follow the confidences, same total
    d1 = pol.decide(BatchView(1, ids, confidences=mixed[::-1].copy()), ctx)
    assert d1.reason.startswith("held")
    assert [d1.k_i[r] for r in ids] == [d0.k_i[r] for r in ids][::-1]
    pol.decide(BatchView(2, ids, confidences=mixed), ctx)  # re-selected (hold of 2)
    # held again, but every request is easy now: more slots than selected -> re-select next
    easy = np.tile(mixed[:1], (8, 1))
    d3 = pol.decide(BatchView(3, ids, confidences=easy), ctx)
    assert d3.reason.startswith("held")
    d4 = pol.decide(BatchView(4, ids, confidences=easy), ctx)
    assert not d4.reason.startswith("held")
    # the selection made after the drift is the new reference: held 2 decisions, then the
    # hold doubles while re-selections confirm it (2, 4, 8, 16, 16 with a depth cap > 0)
    fresh = [not pol.decide(BatchView(5 + i, ids, confidences=easy), ctx).reason.startswith("held")
             for i in range(48)]
    assert pol._sel.cap > 0
    assert [i for i, f in enumerate(fresh) if f] == [1, 5, 13, 29, 45]


def test_min_gamma_holds_when_no_slot_pays():
    # drafting never pays (dear drafter passes), but min_gamma = 1 forces one draft: held
    # decisions and re-selections alike keep K >= 1 (the controller would reject less)
    samples = [(b, b * (k + 1), k) for b in (2, 4) for k in range(KMAX + 1)]
    ctl = Controller(ControllerConfig(kmax=KMAX, policy="budget", min_gamma=1, exploration=0.0))
    for b, t, dd in samples * 3:
        ctl.cost.add(b, t, dd, 10 + 0.01 * t + 20.0 * dd * b)
    ctl.policy.n = 10_000
    conf = np.array([[0.99, 0.99, 0.99, 0.99], [0.3, 0.3, 0.3, 0.3]])
    ds = [ctl.decide(BatchView(i, ("a", "b"), confidences=conf)) for i in range(12)]
    assert all(d.k >= 1 and max(d.k_i.values()) == d.k for d in ds)
    assert any(d.reason.startswith("held") for d in ds)
