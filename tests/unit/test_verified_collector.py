"""One step's verified results as arrays (runtime/verified.py): counts, the verified drafts'
confidences gathered from the matrix kept at trim time, and the accepted/rejected outcome sums."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_hust_vspec.adaptive import Controller, ControllerConfig, RequestResult, StepResult
from vllm_hust_vspec.runtime.verified import VerifiedCollector

pytestmark = pytest.mark.unit

# the drafts of step s, as the workers sent them: 3 requests, width 4
IDS = ["a", "b", "c"]
CONF = np.array([[0.9, 0.8, 0.7, 0.6],
                 [0.5, 0.4, 0.3, 0.2],
                 [0.95, 0.85, 0.75, 0.65]], dtype=np.float32)
ENT = np.array([[0.1, 0.2, 0.3, 0.4],
                [1.1, 1.2, 1.3, 1.4],
                [0.01, 0.02, 0.03, 0.04]], dtype=np.float32)


def _kept(entropies=ENT) -> VerifiedCollector:
    c = VerifiedCollector()
    c.keep(IDS, CONF, entropies)
    return c


def test_results_come_back_as_aligned_int64_arrays_in_report_order():
    c = _kept()
    c.add("c", 3, 1, 30)
    c.add("a", 4, 4, 10)
    c.add("b", 2, 0, 20)
    assert len(c) == 3
    step = c.take()
    assert step.req_ids == ["c", "a", "b"]
    assert step.drafted.dtype == step.accepted.dtype == step.context_lens.dtype == np.int64
    assert step.drafted.tolist() == [3, 4, 2]
    assert step.accepted.tolist() == [1, 4, 0]
    assert step.context_lens.tolist() == [30, 10, 20]
    # row i is the kept row of req_ids[i]: c, a, b
    np.testing.assert_array_equal(step.confidences, CONF[[2, 0, 1]])
    assert len(c) == 0 and c.take().req_ids == []  # the next step starts empty


def test_a_request_that_drafted_nothing_needs_no_confidences():
    c = _kept()
    c.add("a", 2, 1)
    c.add("new", 0, 0)  # no kept row: its row is arbitrary, the controller ignores it
    step = c.take()
    assert step.drafted.tolist() == [2, 0]
    assert step.confidences is not None and step.confidences.shape == (2, 4)
    np.testing.assert_array_equal(step.confidences[0], CONF[0])


def test_a_verified_request_without_kept_confidences_gives_none_but_the_others_count():
    c = _kept()
    c.add("a", 2, 1)
    c.add("z", 3, 2)  # drafted without confidences
    step = c.take()
    assert step.confidences is None
    assert step.drafted.tolist() == [2, 3] and step.accepted.tolist() == [1, 2]
    # "a" still counted: position 1 accepted (0.9), position 2 rejected (0.8)
    acc, rej = c.outcomes["accepted"], c.outcomes["rejected"]
    assert acc[2] == 1 and rej[2] == 1
    assert acc[0] == pytest.approx(0.9) and rej[0] == pytest.approx(0.8)
    assert acc[1] == pytest.approx(0.1) and rej[1] == pytest.approx(0.2)


def test_no_kept_confidences_gives_none_and_no_outcomes():
    c = VerifiedCollector()
    c.add("a", 3, 2)
    step = c.take()
    assert step.confidences is None and step.drafted.tolist() == [3]
    assert c.outcomes == {"accepted": [0.0, 0.0, 0], "rejected": [0.0, 0.0, 0]}
    c = _kept()
    c.drop_kept()
    c.add("a", 3, 2)
    assert c.take().confidences is None


def test_outcome_sums_equal_a_hand_computation():
    c = _kept()
    c.add("a", 4, 2)  # accepted 0.9, 0.8; rejected 0.7
    c.add("b", 3, 0)  # rejected 0.5
    c.add("c", 2, 2)  # accepted 0.95, 0.85; nothing rejected (all drafted accepted)
    c.take()
    acc, rej = c.outcomes["accepted"], c.outcomes["rejected"]
    assert acc[2] == 4 and rej[2] == 2
    assert acc[0] == pytest.approx(0.9 + 0.8 + 0.95 + 0.85, abs=1e-6)
    assert acc[1] == pytest.approx(0.1 + 0.2 + 0.01 + 0.02, abs=1e-6)
    assert rej[0] == pytest.approx(0.7 + 0.5, abs=1e-6)
    assert rej[1] == pytest.approx(0.3 + 1.1, abs=1e-6)
    # a second step adds to the sums; without entropies only the confidences grow
    c.keep(IDS, CONF, None)
    c.add("b", 1, 1)
    c.take()
    assert acc[2] == 5 and acc[0] == pytest.approx(3.5 + 0.5, abs=1e-6)
    assert acc[1] == pytest.approx(0.33, abs=1e-6)


def test_kept_confidences_are_used_once():
    c = _kept()
    c.add("a", 1, 1)
    assert c.take().confidences is not None
    c.add("a", 1, 0)  # verified again without new drafts kept: its row was consumed
    assert c.take().confidences is None
    assert c.outcomes["accepted"][2] == 1 and c.outcomes["rejected"][2] == 0


def test_discard_forgets_the_results_but_keeps_the_drafts():
    c = _kept()
    c.add("a", 1, 1)
    c.discard()
    assert len(c) == 0
    c.add("b", 2, 1)
    step = c.take()
    assert step.req_ids == ["b"]
    np.testing.assert_array_equal(step.confidences[0], CONF[1])


def test_bad_shapes_and_too_many_drafts_raise():
    c = VerifiedCollector()
    with pytest.raises(ValueError, match="shape"):
        c.keep(IDS, CONF[:2], None)
    with pytest.raises(ValueError, match="entropies"):
        c.keep(IDS, CONF, ENT[:, :2])
    c.keep(IDS, CONF[:, :2], None)
    c.add("a", 3, 1)  # 3 drafts verified, only 2 confidences kept
    with pytest.raises(ValueError, match="verified 3 drafts"):
        c.take()


def test_controller_learns_the_same_from_the_arrays_as_from_request_results():
    """The engine's StepResult (arrays, no RequestResult) teaches the controller what one
    RequestResult per request with its verified confidences did; its calibration counts
    every reached position, as the outcome sums do."""
    c = _kept()
    counts = [("a", 4, 2), ("b", 3, 0), ("c", 2, 2)]
    for rid, d, a in counts:
        c.add(rid, d, a)
    step = c.take()
    fast, slow = (Controller(ControllerConfig(kmax=4, stop="survival")) for _ in range(2))
    fast.observe(StepResult(step=1, batch_size=3, k_verified=4, results=(), wall_ms=None,
                            drafted=step.drafted, accepted=step.accepted,
                            confidences=step.confidences))
    rows = {rid: i for i, rid in enumerate(IDS)}
    slow.observe(StepResult(step=1, batch_size=3, k_verified=4, wall_ms=None, results=tuple(
        RequestResult(rid, d, a, confidences=tuple(CONF[rows[rid], :d].tolist()))
        for rid, d, a in counts)))
    assert fast.acceptance.estimate() == pytest.approx(slow.acceptance.estimate())
    assert fast.stats["acceptance_rate"] == pytest.approx(slow.stats["acceptance_rate"])
    assert fast.confidence_map.samples == slow.confidence_map.samples
    assert fast.confidence_map.samples == c.outcomes["accepted"][2] + c.outcomes["rejected"][2] == 6
