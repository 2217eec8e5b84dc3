"""Each policy of the adaptive core, the registry and the per-request stop."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from vllm_hust_vspec.adaptive import BatchView, Controller, ControllerConfig, Decision
from vllm_hust_vspec.adaptive.policies import make_policy, policy_names, register_policy
from vllm_hust_vspec.adaptive.policies.base import Policy
from vllm_hust_vspec.adaptive.policies.online import OnlinePolicy
from vllm_hust_vspec.adaptive.policies.schedule import SchedulePolicy
from vllm_hust_vspec.adaptive.policies.stop import StopRule

pytestmark = pytest.mark.unit


def _view(n: int, step: int = 0, conf=None) -> BatchView:
    return BatchView(step, tuple(f"r{i}" for i in range(n)), None, conf)


def _ctl(policy: str, kmax: int = 4, **kw) -> Controller:
    return Controller(ControllerConfig(kmax=kmax, policy=policy, **kw))


# ----------------------------------------------------------------------------- registry


def test_registry_names_and_unknown():
    names = policy_names()
    for n in ("fixed", "schedule", "online", "sweep"):
        assert n in names
    with pytest.raises(ValueError) as exc:
        make_policy("nonsense", 4)
    msg = str(exc.value)
    assert "unknown policy 'nonsense'" in msg and "fixed" in msg and "online" in msg


def test_register_policy_custom_and_duplicate():
    class Two(Policy):
        name = "two-test"

        def decide(self, batch, ctx):
            return Decision(2, None, self.name, "two", ctx.acceptance.estimate(), None)

    def factory(arg, kmax, cfg):
        return Two()

    register_policy("two-test", factory)
    register_policy("two-test", factory)  # same factory again: idempotent
    with pytest.raises(ValueError, match="already registered"):
        register_policy("two-test", lambda a, k, c: Two())
    assert _ctl("two-test").decide(_view(3)).k == 2


# ----------------------------------------------------------------------------- fixed


def test_fixed_policy_and_errors():
    c = _ctl("fixed:3")
    d = c.decide(_view(5))
    assert (d.k, d.k_i, d.policy) == (3, None, "fixed")
    assert _ctl("fixed", fixed_gamma=1).decide(_view(2)).k == 1
    assert _ctl("fixed").decide(_view(2)).k == 4  # default: Kmax
    with pytest.raises(ValueError, match=r"K=5 is out of range \[0, 4\]"):
        _ctl("fixed:5")
    with pytest.raises(ValueError, match=r"K=0 is out of range \[1, 4\]"):
        _ctl("fixed:0", min_gamma=1)
    with pytest.raises(ValueError, match="expected an integer K, got 'x'"):
        _ctl("fixed:x")


# ----------------------------------------------------------------------------- schedule


def test_schedule_matches_vllm_lookup():
    # Expected values from vLLM 0.32 build_dynamic_sd_schedule_lookup(
    #   [(1, 4, 4), (8, 16, 2), (20, 24, 0)], max_num_seqs=40, num_speculative_tokens=4):
    # gaps carry the previous K forward, the tail keeps the last K.
    vllm = [4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0] + [0] * 15
    pol = SchedulePolicy("1-4:4,8-16:2,20-24:0", kmax=4)
    assert [pol.lookup(b) for b in range(1, 41)] == vllm
    assert pol.lookup(1000) == 0
    # a single number is a one-element range; entries may come unsorted
    pol2 = SchedulePolicy("2:1,1:3", kmax=4)
    assert [pol2.lookup(b) for b in range(1, 7)] == [3, 1, 1, 1, 1, 1]
    c = _ctl("schedule:1-4:4,5-32:2")
    assert c.decide(_view(4)).k == 4 and c.decide(_view(5)).k == 2
    assert "B=5 -> k=2" in c.decide(_view(5)).reason


def test_schedule_min_gamma_and_config_field():
    c = _ctl("schedule", schedule="1-2:3,3-8:0", min_gamma=1)
    assert c.decide(_view(2)).k == 3 and c.decide(_view(7)).k == 1


@pytest.mark.parametrize(
    "table, match",
    [
        ("2-4:2", "must start at batch size 1"),
        ("1-4:2,3-8:1", "overlaps"),
        ("1-4:9", r"K=9 for batch sizes 1-4 is out of range \[0, 4\]"),
        ("1-4", "bad entry '1-4'"),
        ("1-x:2", "bad entry '1-x:2'"),
        ("4-1:2", "bad batch-size range 4-1"),
        (" , ", "empty table"),
    ],
)
def test_schedule_bad_tables(table, match):
    with pytest.raises(ValueError, match=match):
        _ctl(f"schedule:{table}")


def test_schedule_needs_table():
    with pytest.raises(ValueError, match="needs a table"):
        _ctl("schedule")


# ----------------------------------------------------------------------------- sweep


def test_sweep_cycles_and_varies_k_i():
    c = _ctl("sweep:0,2,4")
    ks = []
    for n in range(6):
        d = c.decide(_view(6, n))
        ks.append(d.k)
        assert d.k_i["r0"] == d.k
        assert max(d.k_i.values()) == d.k
        for i in range(1, 6):
            assert d.k_i[f"r{i}"] == (n + i) % (d.k + 1)
    assert ks == [0, 2, 4, 0, 2, 4]
    assert [_ctl("sweep", kmax=2).decide(_view(1)).k for _ in range(1)] == [0]
    c2 = _ctl("sweep", kmax=2)
    assert [c2.decide(_view(1)).k for _ in range(4)] == [0, 1, 2, 0]


def test_sweep_errors_and_min_gamma():
    with pytest.raises(ValueError, match=r"K=7 is out of range \[0, 4\]"):
        _ctl("sweep:1,7")
    with pytest.raises(ValueError, match="expected an integer K"):
        _ctl("sweep:1,a")
    c = _ctl("sweep:2", min_gamma=1)
    d = c.decide(_view(5))
    assert min(d.k_i.values()) >= 1


# ----------------------------------------------------------------------------- online


def test_online_warmup_order_and_probes():
    c = _ctl("online", kmax=4, warmup_samples=2)
    ks = [c.decide(_view(1, s)).k for s in range(6)]
    assert ks == [4, 0, 2, 4, 0, 2]  # Kmax, min, middle, twice
    pol = OnlinePolicy(8, 0)
    assert pol.revisit_window(0.02) == 50 * 9
    assert pol.revisit_window(0.0) is None


def test_online_warmup_is_kmax_only_when_the_cost_model_was_seeded():
    """After the start-up cost probe every K is priced: the warm-up measures acceptance (K
    = Kmax), and the first model decision follows it."""
    c = _ctl("online", kmax=4, warmup_samples=2)
    c.seed_step_costs([(b, b * (k + 1), k, 10.0 + b * (1.0 + k)) for b in (1, 4, 16)
                       for k in range(5)])
    assert c.cost.ready and c.cost.n == 15
    ks = [c.decide(_view(1, s)) for s in range(3)]
    assert [d.k for d in ks[:2]] == [4, 4] and all("warmup" in d.reason for d in ks[:2])
    assert "warmup" not in ks[2].reason
    from vllm_hust_vspec.adaptive.observations import StepResult

    c.observe(StepResult(0, 1, 4, (), 12.0, 4, np.array([4]), np.array([2]), k_drafted=4))
    with pytest.raises(RuntimeError, match="seeded only before the first step"):
        c.seed_step_costs([(1, 2, 1, 11.0)])


def test_online_partial_probe_above_held():
    c = _ctl("online", kmax=4, warmup_samples=1, start_gamma=1)
    d = c.decide(_view(8))  # first warm-up probe: K=4 above the held K=1
    assert d.k == 4
    assert sorted(d.k_i.values()) == [1] * 6 + [4] * 2  # a quarter of the batch
    assert "on 2/8" in d.reason


def test_online_bad_start():
    with pytest.raises(ValueError, match=r"start K=9 is out of range \[0, 4\]"):
        _ctl("online:9")


# ----------------------------------------------------------------------------- stop


def _fill_acceptance(c: Controller, rates):
    c.acceptance.tried = [1e6] * len(rates)
    c.acceptance.accepted = [1e6 * r for r in rates]
    c.acceptance._est = None
    c.acceptance._expected = None


def test_stop_survival_uniform_cut():
    c = _ctl("fixed:4", stop="survival", stop_threshold=0.3)
    _fill_acceptance(c, [0.9, 0.6, 0.5, 0.5])  # survival 0.9, 0.54, 0.27, 0.135
    d = c.decide(_view(3))
    assert d.k == 2 and d.k_i is None
    assert "stop survival" in d.reason


def test_stop_confidence_per_request_mapping_and_array():
    conf = {"r0": [0.9, 0.8, 0.2, 0.9], "r1": [0.1, 0.9, 0.9, 0.9], "r2": [0.9, 0.9, 0.9, 0.9]}
    c = _ctl("fixed:4", stop="confidence", stop_threshold=0.5)
    d = c.decide(_view(4, conf=conf))  # r3 has no confidences: keeps K
    assert d.k_i == {"r0": 2, "r1": 0, "r2": 4, "r3": 4} and d.k == 4
    arr = np.array([conf["r0"], conf["r1"], conf["r2"]])
    d2 = _ctl("fixed:3", stop="confidence", stop_threshold=0.5).decide(_view(3, conf=arr))
    assert d2.k_i == {"r0": 2, "r1": 0, "r2": 3} and d2.k == 3


def test_stop_survival_with_calibrated_confidences():
    c = _ctl("fixed:4", stop="survival", stop_threshold=0.5)
    # fresh calibrator: table = bin centres, so confidence 0.95 -> 0.95, 0.75 -> 0.75
    arr = np.array([[0.95, 0.95, 0.95, 0.95], [0.75, 0.75, 0.95, 0.95]])
    d = c.decide(_view(2, conf=arr))
    # r0: 0.95^k >= 0.5 for k <= 4 (0.8145); r1: 0.75, 0.5625, 0.534, 0.507
    assert d.k_i == {"r0": 4, "r1": 4}
    c2 = _ctl("fixed:4", stop="survival", stop_threshold=0.55)
    assert c2.decide(_view(2, conf=arr)).k_i == {"r0": 4, "r1": 2}


def test_stop_respects_min_gamma_and_errors():
    c = _ctl("fixed:3", stop="confidence", stop_threshold=0.9, min_gamma=1)
    d = c.decide(_view(2, conf=np.zeros((2, 3))))
    assert d.k == 1 and set(d.k_i.values()) == {1}
    with pytest.raises(ValueError, match="stop mode 'sometimes' unknown"):
        StopRule("sometimes", 0.1)
    with pytest.raises(ValueError, match="3 rows for 2 requests"):
        _ctl("fixed:3", stop="confidence").decide(_view(2, conf=np.zeros((3, 3))))


def test_online_decisions_carry_what_it_believed_of_every_k():
    from vllm_hust_vspec.adaptive.trace import decision_record

    c = _ctl("online", kmax=3, warmup_samples=1, min_gamma=1, exploration=0.0)
    for step in range(8):
        d = c.decide(_view(2, step))
        _timed(c, step, 2, d.k, 10.0 + 2 * d.k)
    assert d.est_costs is not None and len(d.est_costs) == 3 and d.est_first_k == 1
    rec = decision_record(8, 0.0, 2, d)
    assert rec["est_costs"][0] is None and len(rec["est_costs"]) == 4
    assert rec["est_costs"][d.k] == pytest.approx(d.est_cost_ms, abs=1e-3)
    assert rec["est_goodput"][1:] == pytest.approx(list(d.est_goodput), abs=1e-4)


def _timed(c: Controller, step: int, batch: int, k: int, ms: float, accepted: int = 2) -> None:
    """One uniform step of ``batch`` requests at K = ``k`` taking ``ms``; each request
    accepts ``min(k, accepted)`` drafts."""
    from vllm_hust_vspec.adaptive.observations import StepResult

    drafted = np.full(batch, k)
    c.observe(StepResult(step, batch, k, (), ms, k, drafted, np.minimum(drafted, accepted),
                         k_drafted=k))


def _jump(exploration: float, accepted: int = 2):
    """200 decisions at batch 1 (a step costs 8 + 0.9 K ms), then 40 at batch 4 (8 + 2.3 K
    ms); every request accepts up to ``accepted`` drafts (2: K = 2 is best at both)."""
    c = _ctl("online", kmax=4, warmup_samples=1, exploration=exploration)
    step = 0
    for _ in range(200):
        d = c.decide(_view(1, step))
        _timed(c, step, 1, d.k, 8.0 + 0.9 * d.k, accepted)
        step += 1
    out = []
    for _ in range(40):
        d = c.decide(_view(4, step))
        out.append((step, d))
        _timed(c, step, 4, d.k, 8.0 + 2.3 * d.k, accepted)
        step += 1
    return c, out


def test_online_measures_where_the_batch_has_no_recent_step_times():
    """At the jump to batch 4 the cost model has no step time there: online measures at
    once, batch-wide, one K at a time (at most one step every UNCERTAIN_SPACING decisions,
    until UNCERTAIN_TIMED Ks are timed there), then holds the K that is best there (but for
    one step deeper at most: K = 2 tries no position 3, whose estimate falls back toward its
    prior twice as fast as a tried one's, and is re-tested)."""
    from vllm_hust_vspec.adaptive.policies.online import UNCERTAIN_SPACING, UNCERTAIN_TIMED

    c, out = _jump(0.01)
    measured = {s: d.k for s, d in out if d.reason.startswith("measure")}
    assert min(measured) == 200  # the first decision at batch 4
    assert all(d.k_i is None for s, d in out if s in measured)  # batch-wide: K's own time
    assert (np.diff(sorted(measured)) >= UNCERTAIN_SPACING).all()
    assert len(set(measured.values())) == len(measured) <= UNCERTAIN_TIMED
    held = [d.k for s, d in out[20:] if d.reason.startswith(("best", "hold", "switch"))]
    assert held and sum(k == 2 for k in held) >= len(held) - 1, held
    timed = c.cost.support(4, range(5))
    assert sum(x >= 0.5 for x in timed) >= UNCERTAIN_TIMED


def _seeded_batch1(true_ms, disturbed_k: int | None, accepted: int, decisions: int,
                   exploration: float = 0.01):
    """An online controller seeded with a start-up probe grid (batch 1, 4, 16; step ms
    ``true_ms(b, k)``, the batch-1 price of ``disturbed_k`` 1.6x too dear, as a disturbed
    probe window gives), then ``decisions`` at batch 1 where each request accepts up to
    ``accepted`` drafts; returns the controller and its decisions."""
    c = _ctl("online", kmax=4, warmup_samples=2, exploration=exploration)
    c.seed_step_costs([(b, b * (k + 1), k, true_ms(b, k) * (1.6 if (b, k) == (1, disturbed_k) else 1.0))
                       for b in (1, 4, 16) for k in range(5) for _ in range(2)])
    out = []
    for step in range(decisions):
        d = c.decide(_view(1, step))
        out.append(d)
        _timed(c, step, 1, d.k, true_ms(1, d.k), accepted)
    return c, out


def _probe_grid_ms(b: int, k: int) -> float:
    return 10.0 + 0.05 * b * (k + 1) + (1.0 + 0.1 * b) * k


def test_online_times_a_contender_the_seeded_probe_priced_wrong():
    """A disturbed probe window prices K = 3 at batch 1 1.6x too dear (true goodput: K = 3
    best, 4 / 13 tok/ms; K = 4 next, 4 / 14). The seeded price is a prior, not evidence: the
    policy times K = 3 while serving (a contender next to the best it believes) and holds it
    afterwards (K = 4's estimate drifts up as its unverified position decays to the prior:
    a step at K = 4 now and then). Counted as evidence, the bad price held K = 3 off until
    a probe slot, a hundred decisions later."""
    c, out = _seeded_batch1(_probe_grid_ms, disturbed_k=3, accepted=3, decisions=60)
    measured = [d.k for d in out if d.reason.startswith("measure")]
    assert 3 in measured
    held = [d.k for d in out[20:] if d.reason.startswith(("best", "hold", "switch"))]
    assert held and sum(k == 3 for k in held) >= 0.8 * len(held), [d.reason for d in out]


def test_online_on_a_seeded_model_spends_no_step_on_a_k_it_knows_to_lose():
    """A fast start: with every K priced by the start-up probe, the batch-1 warm-up is Kmax
    (acceptance), measurements time only contenders and the probe slots keep their full
    spacing: in the first 60 decisions at batch 1, where K = 0 and K = 1 are far behind, no
    step runs them, and exploration (warm-up, measurements, probes) is at most 6 steps."""
    c, out = _seeded_batch1(_probe_grid_ms, disturbed_k=None, accepted=3, decisions=60)
    assert all(d.k >= 2 for d in out), [(d.k, d.reason) for d in out if d.k < 2]
    explore = [d for d in out if d.reason.startswith(("warmup", "measure", "probe"))]
    assert len(explore) <= 6, [d.reason for d in explore]
    assert not any(d.reason.startswith("probe") for d in out)  # the first slot: 100 on
    held = [d.k for d in out[10:] if d.reason.startswith(("best", "hold", "switch"))]
    assert held and sum(k == 3 for k in held) >= 0.8 * len(held)


def _hard_then_code(seed: int, noise: float, probe_skew: float) -> list:
    """``tests/host/test_plugin_serve.py``'s two phases, simulated: 190 decisions at batch
    16 accepting 10 % (K = 0 is best), then 170 at batch 1 accepting 80 % a position (K = 4
    best: 22 % above K = 1).  A step verifies the K of the step before and drafts its own
    (one drafter pass at K = 0, as the draft-model backend runs); step times are
    lognormally ``noise`` noisy; the start-up probe's grid (batch 1, 4, 16) prices batch-1
    K >= 2 ``probe_skew`` times its cost.  Returns the batch-1 decisions."""
    from vllm_hust_vspec.adaptive.observations import StepResult

    def ms(b: int, t: int, d: int) -> float:
        return 30.0 + 0.5 * t + d * (6.0 + 0.4 * b) + (0.9 * t if b > 4 else 0.0)

    rng = np.random.default_rng(seed)
    c = _ctl("online", kmax=4)
    c.seed_step_costs([
        (b, b * (k + 1), max(k, 1),
         ms(b, b * (k + 1), max(k, 1)) * (probe_skew if b == 1 and k >= 2 else 1.0)
         * float(np.exp(rng.normal(0.0, noise))))
        for b in (1, 4, 16) for k in range(5) for _ in range(2)])
    step, prev_k, code = 0, 0, []
    for n, b, accept in ((190, 16, 0.1), (170, 1, 0.8)):
        for _ in range(n):
            d = c.decide(_view(b, step))
            ks = np.array([d.k_i[f"r{i}"] for i in range(b)]) if d.k_i else np.full(b, d.k)
            ok = rng.random((b, 4)) < accept
            acc = np.array([int(np.cumprod(ok[i, :k]).sum()) for i, k in enumerate(ks)])
            wall = ms(b, b + prev_k * b, max(d.k, 1)) * float(np.exp(rng.normal(0.0, noise)))
            c.observe(StepResult(step, b, prev_k, (), wall, max(d.k, 1), ks, acc,
                                 k_drafted=d.k))
            prev_k = d.k
            if b == 1:
                code.append(d)
            step += 1
    return code


def test_online_climbs_back_to_a_deep_k_after_a_k0_phase_at_another_batch():
    """After the batch-16 phase at K = 0, online at batch 1 comes back to a deep K: over 8
    seeds x noise 15 / 30 % x a true / 1.4x dear probe price, the second half of the batch-1
    decisions has mean K >= 1.75 in every run (the served test's bar) and >= 2.8 on
    average.  Measured before the acceptance counts' volume cap, the cost model's batch
    factor and rule 5 (settling a hold inside the error): below 1.75 in 9 of these 32 runs,
    1.01 (K = 1 held to the end) in 5; after: at least 1.86, 3.29 on average."""
    late = []
    for noise in (0.15, 0.3):
        for skew in (1.0, 1.4):
            for seed in range(8):
                code = _hard_then_code(seed, noise, skew)
                tail = code[len(code) // 2:]
                late.append((noise, skew, seed, sum(d.k for d in tail) / len(tail)))
    assert min(x[-1] for x in late) >= 1.75, [x for x in late if x[-1] < 1.75]
    assert sum(x[-1] for x in late) / len(late) >= 2.8


def test_online_settles_a_hold_inside_the_error_by_measuring_the_contender():
    """Rule 5: where rule 4 holds the K against a better-predicted contender only by the
    estimates' error and the contender's own cell is thin, the contender runs two steps
    (the second in its own cell); the held K does not change on those steps."""
    saw = False
    for seed in range(4):
        code = _hard_then_code(seed, 0.3, 1.0)
        for i, d in enumerate(code[:-1]):
            if d.reason.startswith("settle"):
                saw = True
                assert "within the estimates' error" in d.reason
                nxt = code[i + 1]
                assert nxt.k == d.k and nxt.reason.startswith(f"measure k={d.k} (2/2)")
    assert saw


def test_online_without_exploration_never_measures():
    _c, out = _jump(0.0)
    assert not any(d.reason.startswith("measure") for _s, d in out)


def test_a_measurement_that_resumes_from_k0_takes_two_steps():
    """Nothing is accepted, so online holds K = 0; a measurement of a K > 0 from there runs
    two steps (on the real engine the first also catches the drafter up and is not timed)."""
    _c, out = _jump(0.01, accepted=0)
    ds = [d for _s, d in out]
    resumes = [i for i in range(1, len(ds) - 1)
               if ds[i].reason.startswith("measure") and "(2/2)" not in ds[i].reason
               and ds[i].k > 0 and ds[i - 1].k == 0]
    assert resumes
    for i in resumes:
        assert ds[i + 1].k == ds[i].k and "(2/2)" in ds[i + 1].reason


# ----------------------------------------------------------------------------- resume price


def test_catch_up_cost_prices_tokens_from_measured_resumes():
    from vllm_hust_vspec.adaptive.estimators import CatchUpCost

    c = CatchUpCost(decay=0.5)
    assert c.price(100) is None and c.parts() is None
    c.add(100, 50.0)
    # one resume cannot tell a fixed pass from a price per token: its own size costs what it
    # cost, another size the geometric mean of "all fixed" (50) and "all per token" (200)
    assert c.price(100) == pytest.approx(50.0) and c.parts() is None
    assert c.price(400) == pytest.approx(100.0)
    assert c.price(0) == 0.0
    c.add(100, -20.0)  # faster than predicted: costs nothing, still counts its tokens
    assert c.price(100) == pytest.approx(0.5 * 50.0 / 1.5)  # decayed mean of 50 and 0
    c.add(0, 99.0)  # nothing caught up: ignored
    assert c.resumes == 2
    with pytest.raises(ValueError, match="decay"):
        CatchUpCost(decay=1.0)


def test_catch_up_cost_separates_the_extra_pass_from_the_tokens():
    """Resumes of different sizes fit ms = fixed + per_token * tokens (both >= 0)."""
    from vllm_hust_vspec.adaptive.estimators import CatchUpCost

    c = CatchUpCost(decay=0.9)
    for t in (10, 200, 50, 400, 20):
        c.add(t, 6.0 + 0.05 * t)
    fixed, per_token = c.parts()
    assert fixed == pytest.approx(6.0) and per_token == pytest.approx(0.05)
    assert c.price(1000) == pytest.approx(56.0)
    # the fresh demo server's resumes on the CPU host (tokens caught up, ms beyond the
    # step's price): the pass costs the same whatever it catches up
    demo = CatchUpCost()
    for t, ms in ((7, 8.1), (130, 4.0), (2, 5.3), (128, 11.2), (128, 3.1)):
        demo.add(t, ms)
    assert demo.parts()[1] < 0.01
    assert 3.0 < demo.price(128) < 12.0  # (per token from the first resume: 148 ms)
    # a fit with a negative fixed part goes through the origin instead
    c = CatchUpCost(decay=0.5)
    for t, ms in ((10, 0.0), (100, 50.0), (200, 110.0)):
        c.add(t, ms)
    tm = 0.25 * 10 * 0.0 + 0.5 * 100 * 50.0 + 200 * 110.0
    tt = 0.25 * 10 * 10 + 0.5 * 100 * 100 + 200 * 200
    assert c.parts() == (0.0, pytest.approx(tm / tt))


def test_catch_up_cost_fits_no_line_through_two_resumes_or_through_noise():
    """Two resumes always fit a line, and a line through noise extrapolates it: the first
    online server of a ``bench ab`` run at concurrency 16 fitted 0.5 ms a token through its
    first two resumes (5 and 18 tokens, a few ms apart by the step times' noise), priced a
    700-token catch-up at 374 ms and held K = 0 for 180 decisions; its later resumes cost
    5-20 ms beyond their step whatever they caught up (18-1457 tokens).  Until the resumes
    separate the parts by more than their noise, another size is priced between all fixed
    and all per token."""
    from vllm_hust_vspec.adaptive.estimators import CatchUpCost

    c = CatchUpCost()
    c.add(5, 4.0)
    c.add(18, 10.5)
    assert c.parts() is None
    assert c.price(700) < 80.0  # the line through the two: 354 ms
    # small resumes whose extra ms scatter by the step times' noise: no significant slope
    for t, ms in ((9, 2.0), (14, 11.0), (6, 8.0)):
        c.add(t, ms)
    assert c.parts() is None
    assert c.price(700) < 80.0
    # large resumes that cost about what the small ones cost: priced so, line or not
    c.add(690, 9.0)
    c.add(1300, 14.0)
    assert c.parts() is None or c.parts()[1] < 0.02
    assert 5.0 < c.price(700) < 25.0 and c.price(1300) < 30.0
    # a price per token well above the noise is fitted
    for t in (40, 700, 90, 1200, 300):
        c.add(t, 5.0 + 0.1 * t)
    fixed, per_token = c.parts()
    assert per_token > 0.05


def _tie_at_k0(catch_up_tokens: int, resumes: bool):
    """An online controller past warm-up at batch 16 where K = 1 is 1 % better than K = 0
    (K = 0 held); ``resumes``: a resume was measured at 0.5 ms a token."""
    from vllm_hust_vspec.adaptive.observations import StepResult

    c = _ctl("online", kmax=2, warmup_samples=1, exploration=0.0, start_gamma=0,
             hysteresis=0.001)
    b = 16
    # K = 1 costs 1.6x K = 0 and commits 1.616x the tokens (acceptance 0.616): +1 %
    c.seed_step_costs([(b, b * (k + 1), k, 30.0 * (1 + 0.6 * k)) for k in range(3)] * 4)
    c.acceptance.tried = [1e6, 1e6]
    c.acceptance.accepted = [0.616e6, 0.0]
    c.acceptance._est = None
    c.acceptance._expected = None
    if resumes:
        c.observe(StepResult(0, b, 1, (), None, 1, np.full(b, 1), np.full(b, 1), k_drafted=1,
                             catch_up=(400, 48.0 + 200.0)))
        c.acceptance.tried = [1e6, 1e6]
        c.acceptance.accepted = [0.616e6, 0.0]
        c.acceptance._est = None
        c.acceptance._expected = None
    ks = []
    for step in range(1, 8):
        view = BatchView(step=step, req_ids=tuple(f"r{i}" for i in range(b)),
                         catch_up_tokens=catch_up_tokens)
        ks.append(c.decide(view))
    return c, ks


def test_online_prices_the_catch_up_of_a_resume_from_k0():
    """At a tie between K = 0 and K = 1 the policy stays at K = 0 while a resume would first
    catch up hundreds of drafter tokens at a measured price; with nothing to catch up, or
    no resume measured yet, it takes the 1 % (the policy's own rule, unchanged)."""
    c, ds = _tie_at_k0(catch_up_tokens=800, resumes=True)
    assert c.ctx.catch_up.price(400) == pytest.approx(200.0, rel=0.05)
    exploit = [d for d in ds if not d.reason.startswith(("warmup", "probe"))]
    assert len(exploit) >= 3 and all(d.k == 0 for d in exploit), [d.reason for d in ds]
    assert all("resume" in d.reason for d in exploit)
    for tokens, resumes in ((0, True), (800, False)):
        _, ds = _tie_at_k0(catch_up_tokens=tokens, resumes=resumes)
        first = next(d for d in ds if not d.reason.startswith(("warmup", "probe")))
        assert first.k == 1 and "switch 0->1" in first.reason, [d.reason for d in ds]


def test_the_ledger_tells_what_a_resume_would_catch_up():
    from types import SimpleNamespace

    from vllm_hust_vspec.runtime.drafter_ledger import DrafterLedger

    def out(scheduled, new=()):
        return SimpleNamespace(num_scheduled_tokens=scheduled,
                               scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new],
                               scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()))

    def reqs(**n):
        return {r: SimpleNamespace(request_id=r, num_computed_tokens=v, is_finished=lambda: False)
                for r, v in n.items()}

    ledger = DrafterLedger()
    ledger.before(reqs(a=10), out({"a": 1}))
    ledger.after(1, 2, reqs(a=10))
    assert ledger.pending(reqs(a=10).values()) == 0  # nothing skipped yet
    ledger.before(reqs(a=11, b=7), out({"a": 1, "b": 7}, new=["b"]))  # K = 0; b prefills
    ledger.after(2, 0, reqs(a=11, b=7))
    # a missed position 10, b its whole prompt (0..6)
    assert ledger.pending(reqs(a=11, b=7).values()) == 1 + 7
    ledger.before(reqs(a=12, b=8), out({"a": 1, "b": 1}))
    assert ledger.after(3, 2, reqs(a=12, b=8))["drafter"]["caught_up"] == 1 + 7


def _noisy_batch16(switch_error: float, per_draft_ms: float, decisions: int = 400,
                   seed: int = 0):
    """``decisions`` decisions at a batch of 14-16 requests (drawn per step), every step
    time ``8 + B * (2.25 + per_draft_ms * K)`` ms drawn 12 % noisy (lognormal); each
    request accepts its first draft with p = 0.74 and a later one with p = 0.5 (the CPU
    host's code@16 cell: at ``per_draft_ms`` 2.035, K = 1 ties K = 0).  Returns the
    exploit decisions."""
    from vllm_hust_vspec.adaptive.observations import StepResult

    rng = np.random.default_rng(seed)
    c = _ctl("online", kmax=3, warmup_samples=1, switch_error=switch_error)
    out = []
    for step in range(decisions):
        b = int(rng.integers(14, 17))
        d = c.decide(_view(b, step))
        if d.reason.startswith(("best", "hold", "switch", "step")):
            out.append(d)
        k = d.k
        drafted = np.full(b, k)
        p = np.where(np.arange(3) == 0, 0.74, 0.5)[:k]
        ok = rng.random((b, k)) < p
        accepted = np.cumprod(ok, axis=1).sum(axis=1) if k else np.zeros(b, int)
        ms = (8.0 + b * (2.25 + per_draft_ms * k)) * float(np.exp(rng.normal(0.0, 0.12)))
        c.observe(StepResult(step, b, k, (), ms, k, drafted, accepted, k_drafted=k))
    return out


def _switches(decisions) -> int:
    return sum(1 for d in decisions if d.reason.startswith(("switch", "step")))


def test_online_holds_a_tie_inside_the_cost_models_error():
    """K = 0 and K = 1 tie at batch 14-16 and step times are 12 % noisy: with the fixed
    1 % hysteresis alone online switches on the noisy swings of the cells (measured on the
    CPU host: 28-50 switches in 230-300 decisions at batch 14-16).  Which swings cross a
    threshold depends on the last bits of numpy's float arithmetic, so the counts per seed
    differ between CPUs (seed 1 at the default 0.5 standard deviations: 15 switches on an
    AVX-512 EPYC, 27 on an AVX2-only one); over 8 seeds on the AVX2 EPYC: 373 switches with
    the fixed hysteresis alone, 341 at the default 0.5 standard deviations, 76 at one.  What
    holds on both: a margin of one standard deviation of the cost model's own error cuts
    the switches by more than 3x, the default does not add switches (within 10 %), and it
    holds some near-ties it would have taken.  Taken as the median over the seeds: one seed
    can flap on every other decision whatever the margin (seed 6: 126-172 switches at each
    of the three), and which seed does moves with any change upstream of the decisions
    (the faster decay of untried positions: sums 457 / 451 / 138 -> 392 / 455 / 138 with
    the fixed hysteresis / the default / one standard deviation, medians 30.5 / 13.5 / 2
    -> 30.5 / 23.5 / 2)."""
    default = ControllerConfig(kmax=3).switch_error
    seeds = range(8)
    sized = [_switches(_noisy_batch16(default, 2.035, seed=s)) for s in seeds]
    fixed_only = [_switches(_noisy_batch16(0.0, 2.035, seed=s)) for s in seeds]
    one_sd = [_switches(_noisy_batch16(1.0, 2.035, seed=s)) for s in seeds]
    med = statistics.median
    assert med(fixed_only) >= 3 * med(one_sd), (one_sd, fixed_only)
    assert med(sized) <= 1.1 * med(fixed_only), (sized, fixed_only)
    held = _noisy_batch16(default, 2.035, seed=0)
    assert any("within the estimates' error" in d.reason for d in held)


def test_online_still_takes_a_gain_larger_than_the_error():
    """With K = 1 at 1.1 ms a request a draft (22 % more goodput than K = 0 at batch 16, 6 %
    more than K = 2) the error-sized hysteresis does not keep online off it: K = 1 is held
    on most decisions after the first 100.  Over 8 seeds, since which noisy swing of a cell
    tips a decision toward K = 2 is one seed's luck (AVX2 EPYC, the cost model's exact
    non-negative fit: K = 1 on 77-100 % of each seed's late decisions, 94 % in all; with the
    fit that stopped at the largest feasible model 90-100 %, 96 %)."""
    shares = []
    for seed in range(8):
        late = [d.k for d in _noisy_batch16(ControllerConfig(kmax=3).switch_error, 1.1,
                                            seed=seed)[100:]]
        assert late
        shares.append(late.count(1) / len(late))
    assert sum(shares) / len(shares) >= 0.9, shares
    assert min(shares) >= 0.7, shares
