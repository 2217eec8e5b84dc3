"""Per-request stop, applicable on top of any policy.

After the policy decided (K, K_i), request i's K_i is cut to the number of leading draft
positions that pass the rule:

* ``survival``: the survival ``prod_{i<=j} p_i`` stays ``>= threshold``, where ``p_i`` is the
  request's calibrated draft confidence (:class:`~..estimators.ConfidenceCalibrator`) when
  the batch carries confidences, else the estimated conditional acceptance ``a_i`` (then the
  cut is the same for every request and only the batch K shrinks);
* ``confidence``: the raw draft confidence ``c_j`` stays ``>= threshold`` (requests without
  confidences keep their K).

The batch K becomes ``max(K_i)``; nothing is cut below ``min_gamma``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..observations import BatchView, Decision
from .base import PolicyContext

STOP_MODES = ("off", "survival", "confidence")


class StopRule:
    def __init__(self, mode: str, threshold: float) -> None:
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode {mode!r} unknown (one of {', '.join(STOP_MODES)})")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"stop threshold must be in [0, 1], got {threshold}")
        self.mode = mode
        self.threshold = threshold

    def survival_depth(self, ctx: PolicyContext) -> int:
        """Leading positions whose estimated survival is >= threshold (no confidences)."""
        s = 1.0
        depth = 0
        for a in ctx.acceptance.estimate():
            s *= a
            if s < self.threshold:
                break
            depth += 1
        return depth

    def _row_depths(self, conf: np.ndarray, ctx: PolicyContext) -> np.ndarray:
        if self.mode == "confidence":
            return np.cumprod(conf >= self.threshold, axis=1).sum(axis=1)
        table = ctx.calibration.table_array()
        n = len(table)
        bins = np.clip((conf * n).astype(np.int64), 0, n - 1)
        # survival is non-increasing along a row, so the count is the leading run
        return (np.cumprod(table[bins], axis=1) >= self.threshold).sum(axis=1)

    def apply(self, d: Decision, batch: BatchView, ctx: PolicyContext) -> Decision:
        if self.mode == "off" or d.k == 0:
            return d
        lo = ctx.min_gamma
        conf = batch.confidences
        ids = batch.req_ids
        if conf is None or not ids:
            if self.mode == "confidence":
                return d
            depth = max(self.survival_depth(ctx), lo)
            if depth >= d.k:
                return d
            k_i = None if d.k_i is None else {r: min(v, depth) for r, v in d.k_i.items()}
            return _replace(d, depth, k_i, f"{d.reason}; stop survival<{self.threshold:g}"
                            f" at k={depth}")
        if isinstance(conf, Mapping):
            width = d.k
            arr = np.zeros((len(ids), width))
            have = np.zeros(len(ids), dtype=bool)
            for i, rid in enumerate(ids):
                row = conf.get(rid)
                if row is not None:
                    m = min(len(row), width)
                    arr[i, :m] = row[:m]
                    have[i] = True
        else:
            arr = np.asarray(conf, dtype=float)[:, : d.k]
            if arr.shape[0] != len(ids):
                raise ValueError(
                    f"batch confidences have {arr.shape[0]} rows for {len(ids)} requests"
                )
            have = None
        depth = self._row_depths(arr, ctx)
        if have is not None:
            depth = np.where(have, depth, d.k)
        if d.k_i is None:
            cut = np.minimum(depth, d.k)
        else:
            cut = np.minimum(depth, np.fromiter((d.k_i[r] for r in ids), np.int64, len(ids)))
        if lo:
            cut = np.maximum(cut, lo)
        k = int(cut.max())
        return _replace(
            d, k, dict(zip(ids, cut.tolist())),
            f"{d.reason}; stop {self.mode}<{self.threshold:g}",
        )


def _replace(d: Decision, k: int, k_i: dict[str, int] | None, reason: str) -> Decision:
    return Decision(
        k=k, k_i=k_i, policy=d.policy, reason=reason, est_accept=d.est_accept,
        est_cost_ms=d.est_cost_ms,
    )
