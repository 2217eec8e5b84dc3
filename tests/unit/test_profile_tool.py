"""vllm-hust-vspec-profile's analysis: step times from a decision trace, the joint
target/draft split, the per-batch K table and the samples that fit-profile reads."""

from __future__ import annotations

import pytest

from vllm_hust_vspec.adaptive.profile import fit_profile
from vllm_hust_vspec.tools import profile as P

pytestmark = pytest.mark.unit

# ground truth of the synthetic host (ms)
TARGET = (0.002, 0.3, 5.0)  # alpha*ctx + gamma*tokens + delta
DRAFT = (0.0005, 0.05, 1.0)


def step_ms(b: int, k: int, ctx: float) -> float:
    n = k  # draft_model: no draft forward at K = 0 (patch drafter-k0, synchronous scheduling)
    t = TARGET[0] * ctx + TARGET[1] * b * (k + 1) + TARGET[2]
    d = DRAFT[0] * ctx + DRAFT[1] * b + DRAFT[2]
    return t + n * d


def grid() -> list[dict]:
    cells = []
    for k in range(0, 5):
        for b in (1, 4, 16):
            for length in (32, 96):
                ctx = b * (40 + length / 2)
                rate = b * (1 + 0.6 * k) / (step_ms(b, k, ctx) / 1000) / (1 + 0.02 * k * b)
                cells.append({"k": k, "batch": b, "output_len": length, "context_tokens": ctx,
                              "step_ms": step_ms(b, k, ctx), "output_tokens": 1000,
                              "duration_s": 1000 / rate})
    return cells


def test_step_times_pair_decisions_with_results():
    recs = [
        {"trace": "vspec-decisions", "version": 1},
        {"step": 1, "batch": 4, "k": 2, "policy": "fixed", "reason": "fixed"},
        {"step": 1, "drafted": 8, "accepted": 3, "ms": 12.5},
        {"step": 2, "batch": 3, "k": 2, "policy": "fixed", "reason": "fixed"},  # not full
        {"step": 2, "drafted": 6, "accepted": 3, "ms": 11.0},
        {"step": 3, "batch": 4, "k": 2, "policy": "fixed", "reason": "fixed"},
        {"step": 3, "drafted": 8, "accepted": 8, "ms": None},
        {"step": 4, "batch": 4, "k": 2, "policy": "fixed", "reason": "fixed"},
        {"step": 4, "drafted": 8, "accepted": 1, "ms": 13.5},
    ]
    assert P.step_times(recs, 4, 2) == [12.5, 13.5]
    assert P.step_times(recs, 4, 3) == []


def test_joint_fit_recovers_the_components():
    coef = P.joint_fit(grid(), "draft_model")
    assert list(coef) == pytest.approx(list(TARGET) + list(DRAFT), rel=1e-6, abs=1e-6)


def test_joint_fit_refuses_a_grid_too_small():
    cells = [c for c in grid() if c["k"] == 2]
    with pytest.raises(P.ProfileToolError, match="too small to separate"):
        P.joint_fit(cells, "draft_model")


def test_pick_table_takes_the_fastest_k_per_batch():
    table = P.pick_table(grid())
    assert set(table) == {1, 4, 16}
    assert table[1] >= table[16]  # bigger batches pay more for verification
    cells = grid()
    for b, k in table.items():
        rate = {c["k"]: 0.0 for c in cells if c["batch"] == b}
        for c in cells:
            if c["batch"] == b:
                rate[c["k"]] += c["output_tokens"] / c["duration_s"]
        assert k == max(rate, key=lambda kk: (rate[kk], -kk))


def test_samples_fit_to_the_true_profile():
    table = {1: 4, 4: 2, 16: 1}
    doc = P.samples_doc(grid(), "draft_model", 4, table, 0.61)
    assert doc["batch_gamma_policy"] == {"1": 4, "4": 2, "16": 1}
    assert doc["max_speculative_tokens"] == 4 and doc["default_acceptance_rate"] == 0.61
    # the K = 0 cells ran no draft forward (drafter-k0): no draft sample from them
    assert len(doc["target_samples"]) == 30 and len(doc["draft_samples"]) == 24
    prof = fit_profile(doc, "samples")
    assert (prof.target.alpha, prof.target.gamma, prof.target.delta_ms) == pytest.approx(TARGET, rel=1e-3, abs=1e-4)
    assert (prof.draft.alpha, prof.draft.gamma, prof.draft.delta_ms) == pytest.approx(DRAFT, rel=1e-3, abs=1e-4)
    assert prof.preferred_gamma(3) == 2 and prof.preferred_gamma(64) == 1
    assert prof.step_ms(4, 2, 4 * 100) == pytest.approx(step_ms(4, 2, 400), rel=1e-3)
