"""Per-request stop, applicable on top of any policy.

After the policy decided (K, K_i), request i's K_i is cut to the number of leading draft
positions that pass the rule:

* ``survival``: the survival ``prod_{i<=j} p_i`` stays ``>= threshold``, where ``p_i`` is the
  request's calibrated draft confidence (:class:`~..estimators.ConfidenceMap`) when
  the batch carries confidences, else the estimated conditional acceptance ``a_i`` (then the
  cut is the same for every request and only the batch K shrinks);
* ``confidence``: the raw draft confidence ``c_j`` stays ``>= threshold`` (requests without
  confidences keep their K);
* ``entropy``: the draft's top-k entropy ``H_j`` (nats, ``BatchView.entropies``, k =
  :data:`~vllm_hust_vspec.names.ENTROPY_TOPK`) stays ``<= entropy_threshold``: the draft is cut
  before the first position whose entropy is above the threshold, i.e. where the drafter
  was unsure (requests without entropies keep their K).

Positions a request's row does not cover (a short mapping row, an array narrower than K)
count as confidence 0 and entropy +inf, and NaN values do not pass the ``confidence`` and
``entropy`` tests: the draft is cut there.
The batch K becomes ``max(K_i)``; nothing is cut below ``min_gamma``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ...names import ENTROPY_TOPK, MAX_ENTROPY, STOP_MODES
from ..observations import BatchView, Decision, KiArray, ki_array
from .base import PolicyContext


class StopRule:
    def __init__(self, mode: str, threshold: float, entropy_threshold: float = 1.0) -> None:
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode {mode!r} unknown (one of {', '.join(STOP_MODES)})")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"stop threshold must be in [0, 1], got {threshold}")
        if not 0.0 <= entropy_threshold <= MAX_ENTROPY:
            raise ValueError(
                f"stop entropy threshold must be in [0, {MAX_ENTROPY:g}] nats (ln {ENTROPY_TOPK}), "
                f"got {entropy_threshold}"
            )
        self.mode = mode
        self.threshold = threshold
        self.entropy_threshold = entropy_threshold
        self._log_threshold = math.log(threshold) if threshold > 0 else -math.inf
        self._ok: dict[tuple[int, int], np.ndarray] = {}  # (rows, width) -> pass buffer
        self._ki_src: Mapping[str, int] | None = None  # the policy's K_i mapping last seen ...
        self._ki_ids: tuple[str, ...] | None = None
        self._ki_arr = np.zeros(0, dtype=np.int64)  # ... and its values in batch order

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

    def _leading(self, rows: int, width: int) -> np.ndarray:
        """A (rows, width + 1) bool buffer whose last column stays False: write the pass
        test into ``[:, :width]``, and ``argmin`` along the rows is the leading run."""
        buf = self._ok.get((rows, width))
        if buf is None:
            if len(self._ok) > 64:
                self._ok.clear()
            buf = self._ok[(rows, width)] = np.zeros((rows, width + 1), dtype=bool)
        return buf

    def _row_depths(self, values: np.ndarray, ctx: PolicyContext) -> np.ndarray:
        """Leading positions of every row that pass the rule."""
        rows, width = values.shape
        buf = self._leading(rows, width)
        ok = buf[:, :width]
        if self.mode == "confidence":
            np.greater_equal(values, self.threshold, out=ok)
        elif self.mode == "entropy":
            np.less_equal(values, self.entropy_threshold, out=ok)
        else:  # survival of the calibrated confidences, as a cumulative sum of logs
            np.greater_equal(ctx.confidence_map.log_survival(values), self._log_threshold, out=ok)
        return buf.argmin(axis=1)

    def _policy_k_i(self, k_i: Mapping[str, int], ids: tuple[str, ...]) -> np.ndarray:
        """The policy's K_i in batch order (the previous array when the policy handed the
        same mapping for the same batch again)."""
        if k_i is self._ki_src and (ids is self._ki_ids or ids == self._ki_ids):
            return self._ki_arr
        arr = ki_array(k_i, ids)
        self._ki_src, self._ki_ids, self._ki_arr = k_i, ids, arr
        return arr

    def apply(self, d: Decision, batch: BatchView, ctx: PolicyContext) -> Decision:
        if self.mode == "off" or d.k == 0:
            return d
        lo = ctx.min_gamma
        values = batch.entropies if self.mode == "entropy" else batch.confidences
        ids = batch.req_ids
        if values is None or not ids:
            if self.mode != "survival":
                return d
            depth = max(self.survival_depth(ctx), lo)
            if depth >= d.k:
                return d
            k_i = None if d.k_i is None else {r: min(v, depth) for r, v in d.k_i.items()}
            return _replace(d, depth, k_i, f"{d.reason}; stop survival<{self.threshold:g}"
                            f" at k={depth}")
        width = d.k
        if isinstance(values, Mapping):
            # a short row ends the request's draft; a request without a row keeps its K
            arr = np.full((len(ids), width), math.inf if self.mode == "entropy" else 0.0)
            have = np.zeros(len(ids), dtype=bool)
            for i, rid in enumerate(ids):
                row = values.get(rid)
                if row is not None:
                    m = min(len(row), width)
                    arr[i, :m] = row[:m]
                    have[i] = True
        else:
            arr = np.asarray(values, dtype=float)
            if arr.ndim != 2 or arr.shape[0] != len(ids):
                what = "entropies" if self.mode == "entropy" else "confidences"
                raise ValueError(
                    f"batch {what} have {arr.shape[0] if arr.ndim else 0} rows for {len(ids)} "
                    f"requests (need a 2-D array (batch, width) aligned with req_ids, got shape "
                    f"{arr.shape})"
                )
            arr = arr[:, :width]
            have = None
        depth = self._row_depths(arr, ctx)
        if have is not None:
            depth = np.where(have, depth, d.k)
        if d.k_i is None:
            cut = np.minimum(depth, d.k)
        else:
            cut = np.minimum(depth, self._policy_k_i(d.k_i, ids))
        if lo:
            cut = np.maximum(cut, lo)
        k = int(cut.max())
        thr = self.entropy_threshold if self.mode == "entropy" else self.threshold
        sign = ">" if self.mode == "entropy" else "<"
        return _replace(
            d, k, KiArray(ids, cut), f"{d.reason}; stop {self.mode}{sign}{thr:g}",
        )


def _replace(d: Decision, k: int, k_i: Mapping[str, int] | None, reason: str) -> Decision:
    return Decision(
        k=k, k_i=k_i, policy=d.policy, reason=reason, est_accept=d.est_accept,
        est_cost_ms=d.est_cost_ms,
    )
