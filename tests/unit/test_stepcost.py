"""The step-cost protocol: every step-cost model answers predict(batch, verify tokens, drafter
passes) with its own formula's number, and the grid form agrees with it."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.costmodel import AdditiveModel, CostTable
from vllm_hust_vspec.adaptive.estimators import StepCostModel
from vllm_hust_vspec.adaptive.profile import LatencyModel, Profile
from vllm_hust_vspec.adaptive.simulate import CostSpec
from vllm_hust_vspec.adaptive.stepcost import StepCost, StepCostGrid, predict_grid

pytestmark = pytest.mark.unit


def _online() -> StepCostModel:
    m = StepCostModel()
    rng = np.random.default_rng(0)
    for _ in range(64):
        b = int(rng.integers(1, 64))
        k = int(rng.integers(0, 5))
        m.add(b, b * (k + 1), max(k, 1), 3.0 + 0.05 * b * (k + 1) + 0.4 * max(k, 1) + rng.normal(0, 0.05))
    return m


def _table() -> CostTable:
    model = AdditiveModel(0.002, {1: 0.0, 4: 0.001}, {4: 0.0, 8: 0.002, 16: 0.004})
    return CostTable("additive", model, draft_width=4, request_buckets=(1, 4), target_rows=(4, 8, 16))


SPEC = CostSpec(3.0, 18.0, 0.3, 1.2, 0.05, draft_min_steps=1)
PROFILE = Profile(LatencyModel(0.0, 0.2, 5.0), LatencyModel(0.0, 0.1, 1.0), per_gamma_overhead_ms={2: 0.5})


def test_every_model_implements_the_protocol():
    for model in (_online(), _table(), SPEC, PROFILE):
        assert isinstance(model, StepCost)
    assert isinstance(_online(), StepCostGrid) and isinstance(_table(), StepCostGrid)


def test_predict_is_each_models_own_formula():
    table = _table()
    assert table.predict(4, 8, 3) == table.step_ms(4, 8) == table.predict(4, 8, 0)
    assert table.predict(8, 8, 0) is None and table.predict(4, 17, 4) is None  # outside the buckets
    assert SPEC.predict(8, 24, 2) == SPEC.step_ms(8, 2, 24)
    assert SPEC.predict(8, 8, 0) == SPEC.step_ms(8, 0, 8)  # priced at draft_min_steps passes
    assert PROFILE.predict(4, 12, 2) == PROFILE.step_ms(4, 2)
    online = _online()
    assert online.predict(8, 24, 2) == online.predict_uniform(8, [2])[0]  # draft_min_steps 0
    assert StepCostModel().predict(4, 8, 1) is None and StepCostModel().predict_grid(4, np.array([8]), np.array([1])) is None


def test_grid_agrees_with_predict():
    table = _table()
    t = np.array([[4, 8, 16, 17]])
    d = np.array([[0], [4]])
    grid = predict_grid(table, 4, t, d)
    assert grid.shape == (2, 4)
    assert grid[0, :3].tolist() == [table.step_ms(4, x) for x in (4, 8, 16)] and grid[1, 3] == np.inf
    online = _online()
    verify, passes = [8, 16, 24, 40], [1, 1, 2, 4]
    listed = online.predict_grid(8, verify, passes)
    arrays = online.predict_grid(8, np.array(verify), np.array(passes, dtype=float))
    c0, ct, cp, cd = online.coef  # fitted by the first predict_grid
    t0, b0 = online.knees
    assert listed.tolist() == arrays.tolist()  # the Python loop and numpy: the same numbers
    want = [ct * max(v, t0) + (c0 + p * (cp + cd * max(8, b0))) for v, p in zip(verify, passes)]
    assert np.allclose(arrays, want, rtol=1e-12)
    # a model without predict_grid: predict per candidate
    fallback = predict_grid(SPEC, 8, np.array([8, 16]), np.array([1, 2]))
    assert fallback.tolist() == [SPEC.predict(8, 8, 1), SPEC.predict(8, 16, 2)]
