"""The ``entropy`` per-request stop: a draft is cut before the first position whose top-8
entropy (nats, ``BatchView.entropies``) is above ``stop_entropy``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllm_hust_vspec import settings
from vllm_hust_vspec.adaptive import BatchView, Controller, ControllerConfig, Decision
from vllm_hust_vspec.adaptive.policies import register_policy
from vllm_hust_vspec.adaptive.policies.base import Policy
from vllm_hust_vspec.adaptive.policies.stop import StopRule
from vllm_hust_vspec.names import ENTROPY_TOPK, MAX_ENTROPY, STOP_MODES

pytestmark = pytest.mark.unit

IDS = ("a", "b", "c", "d", "e")
# entropies per request and position (threshold 1.0): a sure for 2 positions then unsure,
# b unsure at once, c sure throughout, d exactly at the threshold (kept) then just above,
# e unsure only at its last position
ENT = np.array([
    [0.1, 0.2, 1.5, 0.1],
    [1.2, 0.1, 0.1, 0.1],
    [0.5, 0.5, 0.5, 0.5],
    [1.0, 1.0, 1.0001, 0.0],
    [0.0, 0.0, 0.0, 2.0],
])
EXPECTED = {"a": 2, "b": 0, "c": 4, "d": 2, "e": 3}


def _ctl(policy: str = "fixed:4", kmax: int = 4, **kw) -> Controller:
    return Controller(ControllerConfig(kmax=kmax, policy=policy, stop="entropy", **kw))


def _topk_entropy(p: np.ndarray) -> float:
    """What the drafters report: entropy of the top-8 probabilities, renormalised."""
    top = np.sort(p)[::-1][:ENTROPY_TOPK]
    top = top / top.sum()
    return float(-(top * np.log(top)).sum())


def test_array_form_cuts_before_the_first_unsure_position():
    d = _ctl().decide(BatchView(0, IDS, entropies=ENT))
    assert d.k_i == EXPECTED
    assert d.k == 4
    assert d.reason.endswith("; stop entropy>1")


def test_mapping_form_equals_array_form_and_missing_rows_keep_k():
    rows = {r: ENT[i].tolist() for i, r in enumerate(IDS)}
    d = _ctl().decide(BatchView(0, IDS, entropies=rows))
    assert d.k_i == EXPECTED
    # without a row a request keeps its K; a short row ends the draft where it ends; NaN
    # (unknown) is not sure
    rows = {"a": [0.1, 0.2], "c": [0.1, float("nan"), 0.1, 0.1], "d": ENT[3].tolist()}
    d = _ctl().decide(BatchView(1, ("a", "b", "c", "d"), entropies=rows))
    assert d.k_i == {"a": 2, "b": 4, "c": 1, "d": 2}


def test_narrow_array_cuts_at_its_width_and_the_batch_k_follows():
    low = np.full((2, 2), 0.05)  # entropies of the first two positions only
    d = _ctl().decide(BatchView(0, ("x", "y"), entropies=low))
    assert d.k_i == {"x": 2, "y": 2} and d.k == 2
    all_unsure = np.full((2, 4), 1.9)
    d = _ctl().decide(BatchView(1, ("x", "y"), entropies=all_unsure))
    assert d.k == 0 and d.k_i == {"x": 0, "y": 0}


def test_threshold_is_configurable_and_min_gamma_holds():
    d = _ctl(stop_entropy=0.15).decide(BatchView(0, IDS, entropies=ENT))
    assert d.k_i == {"a": 1, "b": 0, "c": 0, "d": 0, "e": 3}
    d = _ctl(stop_entropy=0.0).decide(BatchView(0, IDS, entropies=ENT))
    assert d.k_i == {"a": 0, "b": 0, "c": 0, "d": 0, "e": 3}  # only entropy 0 passes
    d = _ctl(stop_entropy=MAX_ENTROPY).decide(BatchView(0, IDS, entropies=ENT))
    assert set(d.k_i.values()) == {4}  # nothing is above ln 8
    d = _ctl(min_gamma=1).decide(BatchView(0, IDS, entropies=ENT))
    assert d.k_i == {**EXPECTED, "b": 1}


def test_without_entropies_nothing_changes():
    ctl = _ctl()
    plain = Controller(ControllerConfig(kmax=4, policy="fixed:4")).decide(BatchView(0, IDS))
    for view in (BatchView(0, IDS), BatchView(0, IDS, confidences=np.zeros((5, 4)))):
        d = ctl.decide(view)
        assert (d.k, d.k_i, d.reason) == (plain.k, None, plain.reason) == (4, None, "fixed k=4")


class _PerRequest(Policy):
    name = "entropy-test-per-request"

    def decide(self, batch, ctx):
        k_i = {r: 3 if r in ("c", "e") else 1 for r in batch.req_ids}
        return Decision(3, k_i, self.name, "test", ctx.acceptance.estimate(), None)


def _per_request(arg, kmax, cfg):
    return _PerRequest()


def test_policy_k_i_are_an_upper_bound():
    register_policy(_PerRequest.name, _per_request)  # idempotent
    d = _ctl(_PerRequest.name).decide(BatchView(0, IDS, entropies=ENT))
    # min(policy K_i, entropy depth)
    assert d.k_i == {"a": 1, "b": 0, "c": 3, "d": 1, "e": 3}
    assert d.k == 3


def test_entropies_of_real_distributions():
    sure = np.array([0.97] + [0.03 / 99] * 99)
    torn = np.array([0.3, 0.3, 0.3] + [0.1 / 97] * 97)
    flat = np.full(100, 0.01)
    h = [_topk_entropy(p) for p in (sure, torn, flat)]
    assert h[0] < 0.2 and 1.0 < h[1] < 1.2 and h[2] == pytest.approx(math.log(8))
    ent = np.array([[h[0], h[0], h[1], h[0]], [h[0], h[2], h[0], h[0]]])
    d = _ctl().decide(BatchView(0, ("x", "y"), entropies=ent))
    assert d.k_i == {"x": 2, "y": 1}


def test_bad_entropies_and_thresholds():
    with pytest.raises(ValueError, match="entropies have 3 rows for 5 requests"):
        _ctl().decide(BatchView(0, IDS, entropies=np.zeros((3, 4))))
    with pytest.raises(ValueError, match="stop_entropy=2.5"):
        _ctl(stop_entropy=2.5)
    with pytest.raises(ValueError, match="stop_entropy=-0.1"):
        _ctl(stop_entropy=-0.1)
    with pytest.raises(ValueError, match="entropy threshold"):
        StopRule("entropy", 0.1, 3.0)


def test_settings_option_and_controller_flags():
    assert ENTROPY_TOPK == 8 and MAX_ENTROPY == pytest.approx(math.log(8))
    assert "entropy" in STOP_MODES and settings.option("adaptive_stop").choices == STOP_MODES
    opt = settings.option("adaptive_stop_entropy")
    assert (opt.default, opt.minimum, opt.maximum) == (1.0, 0.0, MAX_ENTROPY)
    assert opt.env == "HUST_VSPEC_ADAPTIVE_STOP_ENTROPY"
    cfg = ControllerConfig.from_settings({"adaptive_stop": "entropy", "adaptive_stop_entropy": 0.7},
                                         kmax=4)
    assert (cfg.stop, cfg.stop_entropy) == ("entropy", 0.7)
    ctl = Controller(cfg)
    assert ctl.wants_entropies and not ctl.wants_confidences
    assert ctl.decide(BatchView(0, ("a",), entropies=np.array([[0.5, 0.8, 0.6, 0.4]]))).k_i == {"a": 1}
    for mode in ("off", "survival", "confidence"):
        assert not Controller(ControllerConfig(kmax=4, stop=mode)).wants_entropies
    assert Controller(ControllerConfig(kmax=4, stop="confidence")).wants_confidences
