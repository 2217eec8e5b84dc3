"""Start-up calibration, the CPU side: the measured windows, the cost-model fit and the
held-out check.  Pure Python (numpy through the cost model); no vLLM.

The engine side (``driver.py``) measures :class:`Window` s; :func:`holdout_error` fits on all
windows but one per point and predicts the held-out ones (the figure the issue asks for:
median relative error of the additive model); :class:`~vllm_hust_vspec.adaptive.costmodel.CostTable` ``.fit`` then fits the table on every window.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from vllm_hust_vspec.adaptive.costmodel import AdditiveModel, SpsModel


@dataclasses.dataclass(frozen=True)
class Window:
    """One measured completion-time window of a grid point."""

    point: int  # index into grid.points()
    batch: int  # B
    rows: int  # G = B x (width + 1)
    width: int
    index: int  # window number within the point
    step_s: float  # window time / window_steps


def fit_model(cost_model: str, samples: Sequence[tuple[int, int, float]]) -> AdditiveModel | SpsModel:
    """The grid's cost model fitted on ``(B, G, seconds per step)`` samples."""
    return AdditiveModel.fit(samples) if cost_model == "additive" else SpsModel.fit(samples)


def holdout_error(cost_model: str, windows: Sequence[Window]) -> dict[str, Any] | None:
    """Fit on all windows but one per point (point ``p`` holds out its window
    ``p mod n``), predict the held-out windows; ``{'median', 'max', 'windows'}`` relative
    errors, or None when some point has a single window."""
    by_point: dict[int, list[Window]] = {}
    for w in windows:
        by_point.setdefault(w.point, []).append(w)
    if not by_point or min(len(v) for v in by_point.values()) < 2:
        return None
    held, train = [], []
    for p, ws in by_point.items():
        k = p % len(ws)
        held.append(ws[k])
        train.extend(w for j, w in enumerate(ws) if j != k)
    model = fit_model(cost_model, [(w.batch, w.rows, w.step_s) for w in train])
    errors = [abs(model.step_ms(w.batch, w.rows) / 1000.0 - w.step_s) / w.step_s for w in held]
    return {"median": float(statistics.median(errors)), "max": float(max(errors)),
            "windows": len(errors)}


def by_point(windows: Sequence[Window]) -> dict[tuple[int, int], list[float]]:
    """Per (B, G): the step times of its windows."""
    out: dict[tuple[int, int], list[float]] = {}
    for w in windows:
        out.setdefault((w.batch, w.rows), []).append(w.step_s)
    return out


def subset_problem(cost_model: str, windows: Sequence[Window]) -> str | None:
    """Why the windows measured so far cannot be fitted, or None when they can."""
    if not windows:
        return "no point was measured"
    try:
        fit_model(cost_model, [(w.batch, w.rows, w.step_s) for w in windows])
    except ValueError as exc:
        return str(exc)
    return None
