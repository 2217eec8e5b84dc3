"""The step-cost protocol: what one decode step costs, whichever model prices it.

A decode step of ``batch`` requests runs ``draft_passes`` drafter passes (``max(K,
draft_min_steps)`` on hosts whose drafter runs ``K = max K_i`` passes) and verifies
``verify_tokens`` tokens (``T = sum_i (1 + K_i)``; ``batch * (K + 1)``, i.e. the verify width
``K + 1`` per request, at a batch-uniform K).  Every step-cost model answers
:meth:`StepCost.predict` for those three numbers, in ms, or None where it cannot price the
step:

* :class:`~.estimators.StepCostModel`: the online roofline the controller fits to the
  measured steps (None until it has samples);
* :class:`~.costmodel.CostTable`: the start-up cost table, full-step cost by (B, T) (the
  drafter passes do not change it: DSpark's drafter always runs its full depth; None
  outside the calibrated buckets);
* :class:`~.simulate.CostSpec`: the simulator trace header's roofline (also what
  :func:`~vllm_hust_vspec.runtime.sim_trace.fit_cost` fits, as a ``CostSpec`` dict);
* :class:`~.profile.Profile`: an offline latency profile (its context-length term at 0).

:class:`StepCostGrid` adds :meth:`~StepCostGrid.predict_grid`, the same question for
arrays of candidates at once (broadcast together), possibly approximate (the online model
leaves out the per-cell corrections of its ``predict``); :func:`predict_grid` falls back to
``predict`` per candidate for models without it.

Pure Python + numpy; imports nothing else of ours.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class StepCost(Protocol):
    """A model of the wall time of one decode step."""

    def predict(self, batch: int, verify_tokens: int, draft_passes: int, /) -> float | None:
        """Predicted ms of a step of ``batch`` requests verifying ``verify_tokens`` tokens
        after ``draft_passes`` drafter passes; None where the model cannot price it."""
        ...


@runtime_checkable
class StepCostGrid(StepCost, Protocol):
    """A step-cost model that also prices many candidates at once."""

    def predict_grid(
        self, batch: int, verify_tokens: np.ndarray, draft_passes: np.ndarray, /
    ) -> np.ndarray | None:
        """Predicted ms for every (verify tokens, drafter passes) pair of the two arrays
        (broadcast together); ``inf`` where the model cannot price one, None where it
        cannot price any step yet."""
        ...


def predict_grid(
    model: StepCost, batch: int, verify_tokens: np.ndarray, draft_passes: np.ndarray
) -> np.ndarray | None:
    """``model.predict_grid`` where the model has one, else its ``predict`` per candidate
    (``inf`` where that is None)."""
    grid = getattr(model, "predict_grid", None)
    if grid is not None:
        return grid(batch, verify_tokens, draft_passes)
    t, d = np.broadcast_arrays(np.asarray(verify_tokens), np.asarray(draft_passes))
    out = np.empty(t.shape)
    for idx in np.ndindex(t.shape):
        ms = model.predict(batch, int(t[idx]), int(d[idx]))
        out[idx] = np.inf if ms is None else ms
    return out

