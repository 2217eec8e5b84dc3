"""The controller: config validation, knobs, control interval, trace records, stats."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from vllm_hust_vspec import settings
from vllm_hust_vspec.adaptive import (
    BatchView,
    Controller,
    ControllerConfig,
    RequestResult,
    StepResult,
)
from vllm_hust_vspec.adaptive.trace import is_decision, is_result

pytestmark = pytest.mark.unit


def _view(n: int, step: int = 0) -> BatchView:
    return BatchView(step, tuple(f"r{i}" for i in range(n)))


def _result(step: int, pairs, ms=10.0, k=None) -> StepResult:
    res = tuple(RequestResult(f"r{i}", d, a) for i, (d, a) in enumerate(pairs))
    kk = max((d for d, _ in pairs), default=0) if k is None else k
    return StepResult(step, len(res), kk, res, ms)


def test_defaults_equal_settings_schema():
    """ControllerConfig's defaults are the controller group's defaults in settings.py."""
    cfg = ControllerConfig.from_settings(settings.Settings(), kmax=5)
    plain = ControllerConfig(kmax=5)
    assert cfg == plain
    for opt, fld in ControllerConfig.SETTINGS_MAP.items():
        default = settings.option(opt).default
        if default is not None:
            assert getattr(plain, fld) == default, opt


def test_from_settings_maps_values():
    s = settings.Settings(
        {
            "adaptive_policy": "sweep",
            "adaptive_sweep": (1, 2),
            "adaptive_min_gamma": 1,
            "adaptive_hysteresis": 0.1,
            "adaptive_stop": "survival",
        }
    )
    cfg = ControllerConfig.from_settings(s, kmax=3)
    assert (cfg.policy, cfg.sweep, cfg.min_gamma, cfg.hysteresis, cfg.stop) == (
        "sweep", (1, 2), 1, 0.1, "survival")
    assert Controller(cfg).decide(_view(2)).k == 1


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("min_gamma", 5, r"min_gamma=5 must be in \[0, kmax=4\]"),
        ("control_interval", 0, "control_interval=0 must be >= 1"),
        ("hysteresis", 1.5, "hysteresis=1.5"),
        ("max_gamma_step", 0, "max_gamma_step=0"),
        ("ewma_weight", 0.0, "ewma_weight=0.0"),
        ("exploration", -0.1, "exploration=-0.1"),
        ("warmup_samples", 0, "warmup_samples=0"),
        ("window", 2, "window=2"),
        ("stop", "maybe", "stop='maybe' must be one of off, survival, confidence"),
        ("stop_threshold", 2.0, "stop_threshold=2.0"),
        ("kmax", -1, "kmax=-1"),
    ],
)
def test_config_errors(field, value, match):
    cfg = dataclasses.replace(ControllerConfig(kmax=4), **{field: value})
    with pytest.raises(ValueError, match=match):
        Controller(cfg)


def test_unknown_policy_one_error():
    with pytest.raises(ValueError, match="unknown policy 'bandit'.*known policies: .*online"):
        Controller(ControllerConfig(kmax=4, policy="bandit"))


def test_control_interval_repeats_and_remaps_k_i():
    c = Controller(ControllerConfig(kmax=4, policy="sweep:1,3", control_interval=3))
    d0 = c.decide(_view(4))
    d1 = c.decide(BatchView(1, ("r0", "r1", "new")))
    d2 = c.decide(_view(4))
    d3 = c.decide(_view(4))
    assert d0.k == d1.k == d2.k == 1 and d3.k == 3
    assert d1.reason == "hold (control interval)"
    assert d1.k_i == {"r0": d0.k_i["r0"], "r1": d0.k_i["r1"], "new": 1}


def test_observe_updates_estimates_and_stats():
    c = Controller(ControllerConfig(kmax=3, policy="fixed:3"))
    for s in range(50):
        c.decide(_view(4, s))
        c.observe(_result(s, [(3, 3), (3, 1), (3, 0), (3, 2)], ms=20.0))
    st = c.stats
    assert st["k_hist"] == {3: 50}
    assert st["mean_k"] == 3.0
    assert st["mean_accepted_len"] == pytest.approx(1 + 6 / 4)
    assert st["acceptance_rate"] == pytest.approx(6 / 12)
    assert st["goodput_tok_s"] == pytest.approx(1000 * 10 / 20.0)
    # per-position: pos1 3/4, pos2 2/3, pos3 1/2
    assert c.acceptance.estimate() == pytest.approx((0.75, 2 / 3, 0.5), abs=0.02)
    json.dumps(st)


def test_observe_array_fast_path_equals_results():
    rng = np.random.default_rng(0)
    a = Controller(ControllerConfig(kmax=4, policy="fixed:4"))
    b = Controller(ControllerConfig(kmax=4, policy="fixed:4"))
    for s in range(20):
        acc = rng.integers(0, 5, 16)
        a.observe(_result(s, [(4, int(x)) for x in acc]))
        b.observe(StepResult(s, 16, 4, (), 10.0, None, np.full(16, 4), acc))
    assert a.acceptance.estimate() == pytest.approx(b.acceptance.estimate())
    assert a.stats["mean_accepted_len"] == pytest.approx(b.stats["mean_accepted_len"])


def test_first_drafts_stay_out_of_the_acceptance_estimate_but_count_elsewhere():
    """A burst of arrivals verifies the drafts their prefill step made (accepted at 6 % a
    token on the CPU host's fixtures, 43 % later): those rows leave the acceptance estimate
    alone, and still count as verified tokens, committed tokens and in the trace."""
    def run(first):
        c = Controller(ControllerConfig(kmax=4, policy="fixed:4", trace=True))
        for s in range(40):  # steady decoding: every draft accepted
            c.observe(StepResult(s, 16, 4, (), 50.0, None, np.full(16, 4), np.full(16, 4)))
        before = c.acceptance.estimate()
        drafted, accepted = np.full(16, 4), np.zeros(16, dtype=int)
        accepted[:4] = 4  # four old requests; twelve arrivals reject their first drafts
        c.observe(StepResult(40, 16, 4, (), 50.0, None, drafted, accepted, first=first))
        return c, before, [r for r in c.drain_records() if is_result(r)][-1]

    marked = np.arange(16) >= 4
    c, before, rec = run(marked)
    assert c.acceptance.estimate()[0] >= before[0] - 0.01  # only the old four counted
    assert c.committed == 40 * 16 * 5 + 16 + 16
    assert rec["drafted"] == 64 and rec["accepted"] == 16
    assert (rec["first_drafted"], rec["first_accepted"]) == (48, 0)
    unmarked, before, rec = run(None)
    assert unmarked.acceptance.estimate()[0] < before[0] - 0.05
    assert "first_drafted" not in rec
    # every row a first verification: the estimate only decays
    c = Controller(ControllerConfig(kmax=2, policy="fixed:2"))
    c.observe(StepResult(0, 4, 2, (), 50.0, None, np.full(4, 2), np.zeros(4, dtype=int),
                         first=np.ones(4, dtype=bool)))
    assert c.acceptance.estimate() == pytest.approx(
        Controller(ControllerConfig(kmax=2, policy="fixed:2")).acceptance.estimate(), abs=0.02)
    # plain sequences work as arrays do; a mask of the wrong length is refused
    c.observe(StepResult(1, 2, 2, (), 50.0, None, [2, 2], [2, 0], first=[False, True]))
    with pytest.raises(ValueError, match="first"):
        c.observe(StepResult(2, 2, 2, (), 50.0, None, [2, 2], [2, 0], first=[True]))


def test_observe_bad_result():
    c = Controller(ControllerConfig(kmax=2))
    with pytest.raises(ValueError, match="drafted > kmax=2"):
        c.observe(_result(0, [(3, 1)]))
    with pytest.raises(ValueError, match="step time"):
        c.observe(_result(0, [(2, 1)], ms=-5.0))


@pytest.mark.parametrize("kmax", [0, 1, 8, 15, 16])
def test_observe_counts_by_hand_at_every_kmax(kmax):
    """Per-position counts from RequestResults (bytes keys up to kmax 15, a list above) and
    from arrays agree with a by-hand count; a draft past kmax is refused either way."""
    rng = np.random.default_rng(kmax)
    d = rng.integers(0, kmax + 1, 40)
    a = np.array([rng.integers(0, x + 1) for x in d])
    tried = [sum(1 for x, y in zip(d, a) if min(x, y + 1) >= j) for j in range(1, kmax + 1)]
    acc = [sum(1 for y in a if y >= j) for j in range(1, kmax + 1)]
    objs = Controller(ControllerConfig(kmax=kmax, policy="fixed:0"))
    arrs = Controller(ControllerConfig(kmax=kmax, policy="fixed:0"))
    objs.observe(_result(0, list(zip(d.tolist(), a.tolist())), k=kmax))
    arrs.observe(StepResult(0, 40, kmax, (), 10.0, None, d, a))
    for c in (objs, arrs):
        assert c.drafted_total == int(d.sum()) and c.accepted_total == int(a.sum())
        assert c.acceptance.steps == (1 if kmax and tried[0] else 0)
        if kmax:  # one update from empty counts: the decayed counts are the step's counts
            assert c.acceptance.tried == pytest.approx(tried)
            assert c.acceptance.accepted == pytest.approx(acc)
    # K = 0 everywhere: nothing reached
    zero = Controller(ControllerConfig(kmax=kmax, policy="fixed:0"))
    zero.observe(_result(0, [(0, 0)] * 5, k=0))
    assert zero.drafted_total == 0 and zero.acceptance.steps == 0
    with pytest.raises(ValueError, match=f"drafted > kmax={kmax}"):
        objs.observe(_result(1, [(0, 0), (kmax + 1, 0)]))
    with pytest.raises(ValueError, match=f"kmax={kmax}"):
        arrs.observe(StepResult(1, 2, kmax, (), 10.0, None, np.array([0, kmax + 1]), np.array([0, 0])))


def test_num_draft_steps_teaches_draft_min_steps():
    c = Controller(ControllerConfig(kmax=2))
    c.observe(StepResult(0, 2, 0, (RequestResult("a", 0, 0), RequestResult("b", 0, 0)), 5.0, 1))
    assert c.cost.draft_min_steps == 1


def test_trace_records_format():
    c = Controller(ControllerConfig(kmax=3, policy="sweep:2", trace=True))
    hdr = c.trace_header(host={"vllm": "0.32.0"})
    assert hdr["trace"] == "vspec-decisions" and hdr["version"] == 1
    assert hdr["settings"]["kmax"] == 3 and hdr["host"] == {"vllm": "0.32.0"}
    d = c.decide(_view(3, step=7))
    c.observe(_result(8, [(2, 1), (1, 1), (0, 0)], ms=12.5))
    recs = c.drain_records()
    assert len(recs) == 2 and c.drain_records() == []
    dec, res = recs
    assert is_decision(dec) and is_result(res)
    assert set(dec) == {"step", "t", "batch", "k", "k_i", "policy", "reason", "est_accept",
                        "est_cost_ms"}
    assert (dec["step"], dec["batch"], dec["k"], dec["policy"]) == (7, 3, 2, "sweep")
    assert dec["k_i"] == d.k_i and len(dec["est_accept"]) == 3
    assert res == {"step": 8, "drafted": 3, "accepted": 2, "ms": 12.5}
    for r in [hdr, *recs]:
        json.loads(json.dumps(r))


def test_no_records_without_trace():
    c = Controller(ControllerConfig(kmax=3, policy="fixed:1"))
    c.decide(_view(2))
    c.observe(_result(0, [(1, 1), (1, 0)]))
    assert c.drain_records() == []


def test_policy_invalid_k_is_refused():
    from vllm_hust_vspec.adaptive.observations import Decision
    from vllm_hust_vspec.adaptive.policies import register_policy
    from vllm_hust_vspec.adaptive.policies.base import Policy

    class Bad(Policy):
        name = "bad-k-test"

        def decide(self, batch, ctx):
            return Decision(9, None, self.name, "", (), None)

    register_policy("bad-k-test", lambda a, k, c: Bad(), replace=True)
    with pytest.raises(ValueError, match=r"chose K=9 outside \[0, 3\]"):
        Controller(ControllerConfig(kmax=3, policy="bad-k-test")).decide(_view(1))


def test_ki_array_reads_like_a_dict():
    """KiArray (per-request K_i of the budget policy and the stop rule) is a read-only
    mapping; ki_array hands back its array for the same batch and looks a plain dict up."""
    from vllm_hust_vspec.adaptive import KiArray, ki_array

    ids = ("a", "b", "c")
    k = KiArray(ids, np.array([2, 0, 3]))
    assert k == {"a": 2, "b": 0, "c": 3} and dict(k) == {"a": 2, "b": 0, "c": 3}
    assert k["c"] == 3 and k.get("z", 7) == 7 and len(k) == 3 and list(k) == list(ids)
    assert max(k.values()) == 3
    assert ki_array(k, ids) is k.array and ki_array(k, tuple(ids)).tolist() == [2, 0, 3]
    assert ki_array(k, ("c", "a")).tolist() == [3, 2]
    assert ki_array({"a": 1, "b": 4}, ("b", "a")).tolist() == [4, 1]
    with pytest.raises(KeyError):
        ki_array(k, ("a", "x"))
    with pytest.raises(ValueError):
        k.array[0] = 5  # decisions may share it
    with pytest.raises(ValueError, match="batch of 2"):
        KiArray(("a", "b"), np.array([1, 2, 3]))


def test_profile_correction_sees_context_on_both_forms():
    """A profile with a context term corrects itself by the same factor whether the step
    comes as RequestResult objects (context_len) or as arrays (context_lens)."""
    from vllm_hust_vspec.adaptive.policies.profile import ProfilePolicy
    from vllm_hust_vspec.adaptive.profile import LatencyModel, Profile

    prof = Profile(target=LatencyModel(0.01, 0.1, 5.0), draft=LatencyModel(0.0, 0.01, 0.5))
    ctx_lens = [100, 300, 500]
    # the true step: the profile's price with the real context, times 1.3
    wall = 1.3 * prof.step_ms(3, 2, sum(ctx_lens), batched_tokens=3 + 6, draft_steps=2)
    objs = StepResult(0, 3, 2, tuple(RequestResult(f"r{i}", 2, 1, c) for i, c in enumerate(ctx_lens)),
                      wall, 2)
    arrs = StepResult(0, 3, 2, (), wall, 2, drafted=np.full(3, 2), accepted=np.ones(3, int),
                      context_lens=np.array(ctx_lens))
    factors = []
    for step in (objs, arrs):
        ctl = Controller(ControllerConfig(kmax=4, policy="online"))
        pol = ProfilePolicy(prof, 4)
        pol.observe(step, ctl.ctx)
        factors.append(pol.factors)
    assert factors[0] == factors[1] and list(factors[0].values()) == [pytest.approx(1.3)]
