"""The step-cost model's per-decision reads (support, noise, the residual's ridge) computed
in Python loops over the cells, the weights and the noise kept per state of the cells
(adaptive/estimators.py): each equals its reference, the whole-array numpy computation it
replaced, after every kind of change (a new cell, a cell's new sample, a seeded cell
replaced, the cells pruned)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_hust_vspec.adaptive.estimators import PART_SD, SUPPORT_SPAN, StepCostModel

pytestmark = pytest.mark.unit


def _weights(m: StepCostModel) -> np.ndarray:
    age = (m.n - 1) - np.array(m._last)
    return np.minimum(np.array(m._cnt), m.cell_cap) * np.exp2(-age / m.window)


def _support(m: StepCostModel, batch: int, ks) -> list[float]:
    b = np.array(m._kb)
    near = (b * SUPPORT_SPAN >= batch) & (b <= batch * SUPPORT_SPAN) & ~np.array(m._seeded)
    w, d = _weights(m)[near], np.array(m._kd)[near]
    return [float(w[d == max(k, m.draft_min_steps)].sum()) for k in ks]


def _noise(m: StepCostModel) -> float:
    var = np.array(m._var)
    known = ~np.isnan(var)
    if not known.any():
        return 0.1
    w = _weights(m)[known]
    return math.sqrt(float(w @ var[known]) / float(w.sum()))


def _residual(m: StepCostModel, batch: int):
    rows = m._by_batch.get(batch)
    if not rows or not m.fitted:
        return None
    used = [i for i in rows if m._roofline(batch, m._kt[i], m._kd[i]) > 0 and m._ms[i] > 0]
    w = _weights(m)[used]
    y = np.array([math.log(m._ms[i] / m._roofline(batch, m._kt[i], m._kd[i])) for i in used])
    level = float(w @ y) / (float(w.sum()) + m.cell_prior)
    ts = sorted({m._kt[i] for i in used})
    ds = sorted({m._kd[i] for i in used})
    x = np.zeros((len(used), len(ts) + len(ds)))
    for r, i in enumerate(used):
        x[r, ts.index(m._kt[i])] = x[r, len(ts) + ds.index(m._kd[i])] = 1.0
    prior = m.cell_prior * max(1.0, (_noise(m) / PART_SD) ** 2)
    xw = x.T * w
    theta = np.linalg.solve(xw @ x + prior * np.eye(x.shape[1]), xw @ (y - level))
    return level, dict(zip(ts, theta[:len(ts)])), dict(zip(ds, theta[len(ts):]))


def _same(m: StepCostModel) -> None:
    ks = range(5)
    for batch in sorted(m._by_batch) + [3, 64]:
        assert m.support(batch, ks) == pytest.approx(_support(m, batch, ks), rel=1e-12, abs=1e-300)
        got, want = m.residual(batch), _residual(m, batch)
        assert (got is None) == (want is None)
        if got is not None:
            assert got[0] == pytest.approx(want[0], rel=1e-9, abs=1e-12)
            for part in (1, 2):
                assert got[part].keys() == want[part].keys()
                for key, v in got[part].items():
                    assert v == pytest.approx(want[part][key], rel=1e-7, abs=1e-10)
    assert m.noise() == pytest.approx(_noise(m), rel=1e-12)
    assert np.array_equal(m._weights(), _weights(m))


_STEP = st.tuples(st.sampled_from([1, 2, 4, 8, 16]), st.integers(0, 4),
                  st.floats(5.0, 80.0), st.booleans())


@settings(max_examples=40, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=120), st.integers(4, 24))
def test_the_fast_reads_equal_the_whole_array_ones_after_every_change(steps, max_cells):
    m = StepCostModel(window=16, max_cells=max_cells, refit_every=8)
    for n, (batch, k, ms, seeded) in enumerate(steps):
        if seeded and n % 3 == 0:
            m.seed(batch, batch * (1 + k), k, ms)
        else:
            m.add(batch, batch * (1 + k), k, ms * (1.0 + 0.1 * math.sin(n)))
        m.ensure_fitted()
        _same(m)


def test_the_arrays_follow_a_prune_and_refuse_a_write():
    m = StepCostModel(window=4, max_cells=4)
    for n in range(40):  # 40 cells a sample each: the oldest fade out and are pruned
        m.add(1 + n % 8, 10 + n, n % 5, 20.0 + n)
        _same(m)
    assert len(m._ms) <= 2 * m.max_cells
    with pytest.raises(ValueError):
        m._weights()[0] = 1.0  # the arrays are shared by the reads of one decision
