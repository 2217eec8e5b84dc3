"""``budget``: the DSpark verify-budget rule (per-request K_i from a global slot budget).

Each running request ``i`` has a survival per draft position ``j``::

    s_i(j) = prod_{m<=j} c_i(m)

where ``c_i(m)`` is the request's draft confidence for position ``m`` mapped through the
online :class:`~..estimators.ConfidenceCalibrator` when the batch carries confidences, else
the estimated conditional acceptance ``a_m`` (then every request has the same curve).
All ``(request, position)`` slots are admitted globally in order of decreasing survival
(a request's slots come in position order because its survival never rises). Admitting
``b`` slots costs a step with ``T = B + b`` verified tokens and is expected to commit
``B + sum of their survivals`` tokens. The policy picks the budget with the most expected
committed tokens per ms of step cost, from the cost table when one is configured
(``budget:PATH`` or ``cost_table``; full-step cost by (B, G = T) as in DSpark, whose drafter
always runs the full width), else from the controller's online step-cost model.

On hosts where the drafter runs only ``max K_i`` passes (vLLM; the online model prices
``D = max(K, draft_min_steps)`` passes for the whole batch) one deep slot makes every
request pay for the extra passes, so the admission is done under every draft-depth cap
``D = 0..kmax`` (slots deeper than ``D`` skipped) and the best (cap, budget) pair wins; with a
cost table the cap does not change the cost and the plain DSpark rule results.
``K_i`` = admitted slots of request ``i``; ``K = max K_i``.

The selection (cap, survival threshold) is held for ``RESELECT`` decisions (re-selected
at once when the batch size moves by more than 1/8, and on every probe); in between each
request's K_i still follows its own confidences (the slots above the held threshold).
The survival threshold is the marginal value of a slot, which moves slowly, and holding
it keeps observe()+decide() within 50 microseconds at batch 256 (tests/unit/
test_decide_speed.py).

Like ``online`` it warms up on uniform K (descending, ``warmup_samples`` each) so the cost
model sees every depth. Exploration is cheap: every ``round(1 / exploration)``-th decision
drafts every request one position deeper than its budget (K_i + 1), which measures the
slots the budget left out. Nothing latches: an empty budget (K = 0) gives no acceptance
data, the acceptance estimates decay back to their optimistic prior, and the next probe
drafts position 1 for everyone. ``hysteresis`` and ``max_gamma_step`` do not apply: K_i
follow the requests step by step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..costmodel import CostTable
from ..observations import BatchView, Decision
from .base import Policy, PolicyContext, decision
from .registry import register_policy

LEVELS = 64  # survival is admitted in steps of 1/LEVELS
REPRICE = 3  # candidates re-priced exactly per selection
RESELECT = 2  # decisions a selection is held (re-selected earlier when B moves > 1/8)


class BudgetPolicy(Policy):
    name = "budget"
    uses_confidences = True  # asks the controller to keep the confidence calibration

    def __init__(self, kmax: int, min_gamma: int = 0, cost_table: CostTable | None = None) -> None:
        if not 0 <= min_gamma <= kmax:
            raise ValueError(f"policy 'budget': min_gamma={min_gamma} not in [0, {kmax}]")
        if cost_table is not None and cost_table.draft_width < kmax:
            raise ValueError(
                f"policy 'budget': cost table {cost_table.source or ''} field 'draft_width' = "
                f"{cost_table.draft_width} is smaller than kmax={kmax}"
            )
        self.kmax = kmax
        self.min_gamma = min_gamma
        self.table = cost_table
        self.candidates = list(range(min_gamma, kmax + 1))
        self.n = 0
        self._pos_cache: dict[int, np.ndarray] = {}
        self._draft_cache: dict[int, np.ndarray] = {}
        self._caps = np.arange(kmax + 1)
        self._upper = np.triu(np.ones((kmax, kmax)))  # x @ upper = cumulative sum along rows
        self._cap_rows = np.tril(np.ones((kmax + 1, kmax)), -1)  # row D: 1 at positions < D
        self._rank_cum = np.triu(np.ones((LEVELS, LEVELS)))  # x @ it: cumsum over ranks
        self._pos_cum = self._cap_rows  # it @ x: sum over the positions < D
        self._sel: tuple[int, int, int, int, float, float, str] | None = None  # see _select

    # ------------------------------------------------------------------ helpers
    def _survival(self, batch: BatchView, ctx: PolicyContext) -> np.ndarray:
        """Survival per (request, position), shape (B, kmax), from the calibrated
        confidences (the estimated acceptance where a request has none)."""
        b = len(batch.req_ids)
        kmax = self.kmax
        conf = batch.confidences
        table = ctx.calibration.table_array()
        nb = len(table)
        if isinstance(conf, np.ndarray):
            if conf.ndim != 2 or conf.shape[0] != b:
                raise ValueError(f"policy 'budget': confidences of shape {conf.shape} for a batch of {b}")
            width = min(conf.shape[1], kmax)
            # calibration bin of every confidence; out-of-range (and NaN) go to the end bins
            bins = (conf[:, :width] * nb).astype(np.intp)
            if width == kmax:  # survival = exp(cumulative log), the cumsum as one matmul
                log_c = np.log(np.maximum(table, 1e-300)).take(bins, mode="clip")
                return np.exp(log_c @ self._upper)
            c = table.take(bins, mode="clip")
        else:  # rows from a mapping may be short or missing (NaN): the estimate fills in
            given = _rows_from_mapping(conf, batch.req_ids, kmax)
            width = kmax
            est = np.asarray(ctx.acceptance.estimate(), dtype=float)
            known = np.isfinite(given)
            c = np.where(known, table.take((np.where(known, given, 0.0) * nb).astype(np.intp), mode="clip"),
                         est[None, :])
        if width < kmax:
            est = np.asarray(ctx.acceptance.estimate(), dtype=float)
            c = np.concatenate((c, np.repeat(est[None, width:], b, axis=0)), axis=1)
        return np.cumprod(c, axis=1)

    def _grid_costs(
        self, ctx: PolicyContext, b: int, verify: np.ndarray, draft: np.ndarray
    ) -> tuple[np.ndarray, str] | None:
        """Approximate step ms over the whole (cap, budget) grid, vectorised: the cost table,
        or the structural (roofline) part of the online model; None without a model."""
        if self.table is not None and self.table.covers(b, b):
            return self.table.step_ms_many(b, verify), "cost table"
        model = ctx.cost
        if model.predict(b, b, ctx.cost.draft_min_steps) is None:  # also refits when due
            return None
        c0, ct, cd = model.coef
        t0, b0 = model.knees
        ms = c0 + ct * np.maximum(verify, t0) + cd * draft * max(b, b0)
        return ms, "online model" if self.table is None else "online model (batch outside the cost table)"

    def _exact_ms(self, ctx: PolicyContext, b: int, verify: int, draft: int) -> float:
        """The configured model's own price of one candidate (online: with its corrections)."""
        if self.table is not None and self.table.covers(b, b):
            return self.table.step_ms(b, verify) if self.table.covers(b, verify) else math.inf
        ms = ctx.cost.predict(b, verify, draft)
        return math.inf if ms is None else ms

    # ------------------------------------------------------------------ policy
    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        n = self.n
        self.n += 1
        b = len(batch.req_ids)
        warm = len(self.candidates) * ctx.warmup_samples
        if n < warm:
            k = sorted(self.candidates, reverse=True)[n % len(self.candidates)]
            return decision(ctx, k, self.name, f"warmup {n + 1}/{warm} k={k}", batch_size=b)
        probe = False
        if ctx.exploration > 0:
            spacing = max(1, round(1.0 / ctx.exploration))
            probe = (n - warm) % spacing == spacing - 1
        if b == 0 or self.kmax == 0:
            return decision(ctx, self.min_gamma, self.name, "empty batch", batch_size=b)
        if batch.confidences is None:
            return self._uniform(b, ctx, probe)
        surv = self._survival(batch, ctx)
        kmax = self.kmax
        # survival level of every slot (level 63 = survival >= 63/64); a request's level
        # never rises with position, so "level >= threshold and position <= D" admits a
        # prefix of every request
        level = (surv * (LEVELS - 1e-9)).astype(np.intp)  # (B, kmax)
        sel = self._sel
        if sel is None or n - sel[0] >= RESELECT or abs(b - sel[1]) * 8 > sel[1] or probe:
            sel = self._select(surv, level, b, ctx, n)
            if sel is None:
                k = self.candidates[-1]
                return decision(ctx, k, self.name, "hold: no step times yet", batch_size=b)
            held = ""
        else:
            held = "held "
        _, _, cap, thr, best_ratio, best_ms, source = sel
        # K_i = admitted slots of request i = its positions <= cap at level >= thr
        # (a row sum over the first ``cap`` positions as one matmul: faster than a reduction
        # along the short axis)
        k_i_arr = ((level >= thr) @ self._cap_rows[cap]).astype(np.intp)
        if probe:  # one position deeper for everyone: measures what the budget left out
            k_i_arr += 1
            np.minimum(k_i_arr, kmax, out=k_i_arr)
        k = int(k_i_arr.max())
        if k < self.min_gamma:  # the cap is >= min_gamma, but held thresholds may admit less
            k_i_arr[k_i_arr.argmax()] = k = self.min_gamma
        k_i = dict(zip(batch.req_ids, k_i_arr.tolist()))
        return Decision(
            k=k,
            k_i=k_i,
            policy=self.name,
            reason=(
                f"{'probe +1 on ' if probe else ''}{held}budget (survival >= {thr / LEVELS:.3g}, "
                f"depth <= {cap}), confidence survival, {source}: {best_ratio:.4g} tok/ms"
            ),
            est_accept=ctx.acceptance.estimate(),
            est_cost_ms=best_ms,
        )

    def _select(
        self, surv: np.ndarray, level: np.ndarray, b: int, ctx: PolicyContext, n: int
    ) -> tuple[int, int, int, int, float, float, str] | None:
        """The best (cap D, survival level threshold) for this batch: every (request,
        position) slot is counted by (position, rank = 63 - level) in one bincount, the
        cumulative sums give admitted slots and expected accepted tokens on the whole
        (cap, rank) grid, the grid is priced by the cost model, and the REPRICE best caps are
        re-priced exactly. Returns ``(n, b, cap, threshold level, tok/ms, ms, source)``, or
        None without a cost model."""
        kmax = self.kmax
        levels = LEVELS
        key = (self._keybase(b) - level).ravel()
        cnt = np.bincount(key, minlength=kmax * levels).reshape(kmax, levels)
        tot = np.bincount(key, weights=surv.ravel(), minlength=kmax * levels).reshape(kmax, levels)
        # cumulative sums as matmuls: over ranks (@ upper-triangular ones), then over
        # positions (lower-triangular ones @, with a zero row for cap D = 0)
        ranks = self._rank_cum
        per_pos = cnt @ ranks  # slots at position D with rank <= r
        slots = self._pos_cum @ per_pos  # (cap D = 0..kmax, rank r): admitted slots
        gains = self._pos_cum @ (tot @ ranks)  # expected accepted tokens of those slots
        empty = per_pos == 0  # no slot at position D with rank <= r
        dmin = ctx.cost.draft_min_steps
        priced = self._grid_costs(ctx, b, slots + b, self._draft_col(dmin))
        if priced is None:
            return None
        ms, source = priced
        ratio = (gains + b) / ms
        # a cap D counts only if some slot at position D is admitted (else it duplicates D-1)
        np.copyto(ratio[1:], -np.inf, where=empty)
        if self.min_gamma:
            ratio[: self.min_gamma] = -np.inf
        # the best rank under each cap; the REPRICE best caps re-priced exactly by the
        # configured model (the online model corrects its roofline where it has data)
        best_rank = ratio.argmax(axis=1)
        approx = ratio[self._caps, best_rank].tolist()
        br = best_rank.tolist()
        best = (-math.inf, 0, 0, math.inf)  # (ratio, cap, rank, ms)
        for cap in sorted(range(kmax + 1), key=approx.__getitem__, reverse=True)[:REPRICE]:
            if not math.isfinite(approx[cap]):
                continue
            r = br[cap]
            c_ms = self._exact_ms(ctx, b, b + int(slots[cap, r]), max(cap, dmin))
            g = (b + float(gains[cap, r])) / c_ms
            if g > best[0]:
                best = (g, cap, r, c_ms)
        best_ratio, cap, r, best_ms = best
        self._sel = (n, b, cap, levels - 1 - r, best_ratio, best_ms, source)
        return self._sel

    def _uniform(self, b: int, ctx: PolicyContext, probe: bool) -> Decision:
        """Without confidences every request has the same survival curve, so admitting by
        survival admits whole positions: the budget is a batch-uniform K (k_i = None)."""
        kmax = self.kmax
        expected = np.asarray(ctx.acceptance.expected_committed())  # E(K), K = 0..kmax
        caps = np.arange(kmax + 1)
        dmin = ctx.cost.draft_min_steps
        priced = self._grid_costs(ctx, b, (b * (caps + 1))[None, :], np.maximum(caps, dmin)[None, :])
        if priced is None:
            k = self.candidates[-1]
            return decision(ctx, k, self.name, "hold: no step times yet", batch_size=b)
        ms, source = priced
        ratio = b * expected / ms[0]
        ratio[: self.min_gamma] = -np.inf
        best = (-math.inf, self.min_gamma, math.inf)
        for k in np.argsort(-ratio, kind="stable")[:REPRICE].tolist():
            c_ms = self._exact_ms(ctx, b, b * (k + 1), max(k, dmin))
            r = b * float(expected[k]) / c_ms
            if r > best[0]:
                best = (r, k, c_ms)
        best_ratio, k, best_ms = best
        if probe:
            k = min(k + 1, kmax)
        return Decision(
            k=k,
            k_i=None,
            policy=self.name,
            reason=(
                f"{'probe +1 on ' if probe else ''}budget {b * k}/{b * kmax} slots (uniform: estimated survival), "
                f"{source}: {best_ratio:.4g} tok/ms"
            ),
            est_accept=ctx.acceptance.estimate(),
            est_cost_ms=best_ms,
        )

    def _draft_col(self, dmin: int) -> np.ndarray:
        """Drafter passes per cap D = 0..kmax as a column, ``max(D, draft_min_steps)``."""
        col = self._draft_cache.get(dmin)
        if col is None:
            col = self._draft_cache[dmin] = np.maximum(self._caps, dmin)[:, None].astype(float)
        return col

    def _keybase(self, b: int) -> np.ndarray:
        """``position * LEVELS + LEVELS - 1`` per slot, shape (b, kmax): minus the level,
        one bincount key."""
        off = self._pos_cache.get(b)
        if off is None:
            if len(self._pos_cache) > 64:
                self._pos_cache.clear()
            off = self._pos_cache[b] = np.repeat(
                (np.arange(self.kmax) * LEVELS + LEVELS - 1)[None, :], b, axis=0
            )
        return off

    def describe(self) -> dict:
        return {
            "name": self.name,
            "cost": "cost table" if self.table is not None else "online model",
            "cost_table": None if self.table is None else self.table.source,
        }


def _bins(conf: np.ndarray, n: int) -> np.ndarray:
    """Calibration bin of each confidence (values outside [0, 1] go to the end bins)."""
    return np.minimum(np.maximum((conf * n).astype(np.int64), 0), n - 1)


def _rows_from_mapping(conf: Mapping[str, Any], req_ids: tuple[str, ...], kmax: int) -> np.ndarray:
    """Confidence rows from ``{req_id: [c_1, ...]}``; NaN rows for requests without them."""
    out = np.full((len(req_ids), kmax), np.nan)
    for i, rid in enumerate(req_ids):
        row = conf.get(rid)
        if row is None:
            continue
        vals = np.asarray(row, dtype=float)[:kmax]
        out[i, : len(vals)] = vals
    return out


def _factory(arg: str | None, kmax: int, cfg: Mapping[str, Any]) -> Policy:
    path = arg or cfg.get("cost_table")
    table = CostTable.load(path) if path else None
    return BudgetPolicy(kmax, int(cfg.get("min_gamma", 0)), table)


register_policy("budget", _factory)
