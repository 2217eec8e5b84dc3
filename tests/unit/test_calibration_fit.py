"""The CPU side of the start-up calibration (startup_cost/fit.py): the held-out check on
windows whose step time follows an additive model, and the refusal of a subset that cannot
be fitted."""

from __future__ import annotations

import pytest

from vllm_hust_vspec.startup_cost.fit import Window, by_point, holdout_error, subset_problem

pytestmark = pytest.mark.unit


def _windows(noise: float = 0.0) -> list[Window]:
    # step = 10 ms + 2 ms per request + 0.5 ms per target row, three windows per point
    out, point = [], 0
    for b in (1, 2, 4):
        for w in (0, 1, 2):
            g = b * (w + 1)
            for i in range(3):
                wiggle = noise * (1 if (i + point) % 2 else -1)
                out.append(Window(point, b, g, w, i, (0.010 + 0.002 * b + 0.0005 * g) * (1 + wiggle)))
            point += 1
    return out


def test_holdout_error_of_an_exact_additive_grid_is_tiny():
    res = holdout_error("additive", _windows())
    assert res is not None and res["windows"] == 9
    assert res["median"] < 1e-3 and res["max"] < 1e-2


def test_holdout_error_sees_noise():
    res = holdout_error("additive", _windows(noise=0.05))
    assert 0.01 < res["median"] < 0.15


def test_single_window_points_have_no_holdout_and_by_point_groups():
    one = [w for w in _windows() if w.index == 0]
    assert holdout_error("additive", one) is None
    groups = by_point(_windows())
    assert len(groups) == 9 and all(len(v) == 3 for v in groups.values())


def test_subset_problem_names_why_it_cannot_be_fitted():
    assert subset_problem("additive", []) == "no point was measured"
    assert subset_problem("additive", _windows()) is None
