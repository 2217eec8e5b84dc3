"""``budget``: the DSpark verify-budget rule (per-request K_i from a global slot budget).

Each running request ``i`` has a survival per draft position ``j``::

    s_i(j) = prod_{m<=j} c_i(m)

where ``c_i(m)`` is the request's draft confidence for position ``m`` mapped through the
online :class:`~..estimators.ConfidenceMap` when the batch carries confidences (a DSpark
confidence head's too: its calibration is the map's prior, what the engine accepts corrects
it), else the estimated conditional acceptance ``a_m`` (then every request has the same
curve).
All ``(request, position)`` slots are admitted globally in order of decreasing survival
(a request's slots come in position order because its survival never rises). Admitting
``b`` slots costs a step with ``T = B + b`` verified tokens and is expected to commit
``B + sum of their survivals`` tokens. The policy picks the budget with the most expected
committed tokens per ms of step cost, from the cost table when one is configured
(``budget:PATH`` or ``cost_table``; full-step cost by (B, G = T) as in DSpark, whose drafter
always runs its full depth, the table's ``draft_width``), else from the controller's online
step-cost model; both through the step-cost protocol (:mod:`..stepcost`).

On hosts where the drafter runs only ``max K_i`` passes (vLLM; the online model prices
``D = max(K, draft_min_steps)`` passes for the whole batch) one deep slot makes every
request pay for the extra passes, so the admission is done under every draft-depth cap
``D = 0..kmax`` (slots deeper than ``D`` skipped) and the best (cap, budget) pair wins; with a
cost table the cap does not change the cost and the plain DSpark rule results.
``K_i`` = admitted slots of request ``i``; ``K = max K_i``.

The selection is a histogram: every slot falls into one of ``LEVELS`` = 64 survival levels
per position (level ``l`` holds survival in ``[(63-l)/64, (64-l)/64)``); two ``bincount``s
count the slots and sum their survivals per (position, level), and two small matmuls
(cumulative sums over positions < D and over levels) give the admitted slots and expected
tokens of every (cap D, threshold) pair; the grid is priced at once (cost table, or the
online model's roofline) and the ``REPRICE`` best caps are re-priced exactly.  The only
approximation: thresholds move in steps of 1/64 of survival (expected tokens are exact).

Selection schedule: a selection (cap, threshold) is held for ``RESELECT`` = 2 decisions;
each re-selection that confirms it (same cap, threshold within one level) doubles the hold,
up to ``MAX_HOLD`` = 16 (``MAX_HOLD_0`` = 16 for a cap of 0: nothing is drafted and a held
decision needs no survival at all).  A re-selection keeps the held cap unless another cap
is better by more than ``hysteresis`` (near-ties between two caps would otherwise flip the
cap, and reset the hold, at every re-selection).  It is re-selected at once when the batch
size moves by more than 1/8, when a new request joins the end of the batch, on every probe,
and (cap > 0) when a held decision admits more than 1/8 more or fewer slots than the
selection did; the selection made after such a drift is held ``RESELECT`` decisions (its
admitted slots are the new reference), then doubles again while confirmed.  In between,
each request's K_i still follows its own confidences: the log survival of the positions
under the held cap, one comparison with the held threshold and one matmul (the selection
is the dear part of a decision, tests/unit/test_decide_speed.py); under a held cap of 0
every K_i is 0 without a look at the confidences.  On the simulator table (hetero
budget/online 1.003 / 1.123 / 1.152, `python scripts/sim_table.py`) this schedule matches
re-selecting every 2nd decision (1.004 / 1.125 / 1.148) while re-selecting on about 7% of
the decisions of a drafting batch of 256 (tests/unit/test_decide_speed.py, cheap drafter).

Like ``online`` it warms up on uniform K (descending, ``warmup_samples`` each) so the cost
model sees every depth. Exploration is cheap: every ``round(1 / exploration)``-th decision
drafts every request one position deeper than its budget (K_i + 1), which measures the
slots the budget left out. Nothing latches: an empty budget (K = 0) gives no acceptance
data, the acceptance estimates decay back to their optimistic prior, and the next probe
drafts position 1 for everyone. ``max_gamma_step`` does not apply: K_i follow the
requests step by step (``hysteresis`` only keeps the depth cap, see above).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..costmodel import CostTable
from ..estimators import log_acceptance
from ..observations import BatchView, Decision, KiArray
from ..stepcost import StepCost, predict_grid
from .base import Policy, PolicyContext, decision
from .registry import register_policy

LEVELS = 64  # survival levels per draft position: level l holds survival in ((63-l)/64, (64-l)/64]
REPRICE = 3  # candidates re-priced exactly per selection
RESELECT = 2  # decisions a new selection is held (see the module docstring for earlier triggers)
MAX_HOLD = 16  # the hold doubles up to this while re-selections confirm the choice (depth cap > 0)
MAX_HOLD_0 = 16  # the same for a depth cap of 0 (nothing drafted: a held decision is nearly free)
_SCALE = LEVELS - 1e-9  # survival * _SCALE < LEVELS


class _Selection(NamedTuple):
    """A held (cap, survival threshold) choice of :meth:`BudgetPolicy._select`."""

    n: int  # decision index it was made at
    b: int  # batch size it was made for
    cap: int  # draft-depth cap D
    rank: int  # admitted levels 0..rank (rank LEVELS - 1: every slot under the cap)
    ratio: float  # expected committed tokens per ms
    ms: float  # its predicted step ms
    source: str  # which cost model priced it
    thr: float  # admit a slot under the cap while its log survival >= thr
    reasons: dict  # (probe, held) -> reason text, built once
    hold: int  # decisions this selection is held
    slots: int  # slots it admitted
    tail: str  # the batch's last request id (a new arrival re-selects)


class BudgetPolicy(Policy):
    name = "budget"
    uses_confidences = True  # asks the controller to keep the confidence map
    trusted = True  # K_i in [0, kmax] and K = max K_i by construction (no O(batch) check)
    cuts_first_drafts = True  # the controller may cut joiners' first drafts (first_drafts.py)
    uses_step_costs = True  # outside its cost table it prices with ctx.cost (probe-seeded)

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
        self._caps_list = list(range(kmax + 1))
        levels = LEVELS
        # per depth w: x @ upper[w] = cumulative sum along the rows of x (w columns)
        self._upper = [np.triu(np.ones((w, w))) for w in range(kmax + 1)]
        # bincount key of a slot: position * LEVELS + level, level = LEVELS - 1 - floor(s * _SCALE)
        self._key_base = np.arange(kmax) * levels + (levels - 1)
        self._pos_cum = np.tril(np.ones((kmax + 1, kmax)), -1)  # row D: 1 at positions < D
        self._rank_cum = np.triu(np.ones((levels, levels)))  # x @ it: cumsum over levels <= r
        self._ones = [np.ones(w) for w in range(kmax + 1)]
        self._caps = np.arange(kmax + 1)  # depth caps D (uniform K) 0..kmax
        self._passes: dict[int, np.ndarray] = {}  # draft_min_steps -> max(D, it) per cap, a column
        self._uniform_key: tuple[int, int] | None = None  # (B, draft_min_steps) of _uniform_args
        self._uniform_args: tuple[list[int], list[int]] = ([], [])
        self._sel: _Selection | None = None
        self._zeros: KiArray | None = None  # K_i = 0 for the last batch (a cap of 0)

    # ------------------------------------------------------------------ helpers
    def _check_shape(self, conf: Any, b: int) -> None:
        if isinstance(conf, np.ndarray) and (conf.ndim != 2 or conf.shape[0] != b):
            raise ValueError(f"policy 'budget': confidences of shape {conf.shape} for a batch of {b}")

    def _log_survival(self, batch: BatchView, ctx: PolicyContext, b: int, depth: int) -> np.ndarray:
        """Log survival per (request, position) of the first ``depth`` positions, shape
        (B, depth), from the calibrated confidences (the estimated acceptance where a
        request has none)."""
        conf = batch.confidences
        cal = ctx.confidence_map
        if isinstance(conf, np.ndarray):
            self._check_shape(conf, b)
            have = conf.shape[1]
            if have >= depth:
                return cal.log_survival(conf if have == depth else conf[:, :depth])
            log_c = np.empty((b, depth))
            log_c[:, :have] = cal.log_map(conf)
            log_c[:, have:] = log_acceptance(np.asarray(ctx.acceptance.estimate()[have:depth], dtype=float))
        else:  # rows from a mapping may be short or missing (NaN): the estimate fills in
            given = _rows_from_mapping(conf, batch.req_ids, depth)
            est = np.asarray(ctx.acceptance.estimate()[:depth], dtype=float)
            known = np.isfinite(given)
            log_c = np.where(known, cal.log_map(np.where(known, given, 0.0)), log_acceptance(est)[None, :])
        return log_c @ self._upper[depth]

    def _zero_k_i(self, ids: tuple[str, ...]) -> KiArray:
        """K_i = 0 for every request of the batch (the previous one while it is unchanged)."""
        z = self._zeros
        if z is None or not (ids is z.ids or ids == z.ids):
            z = self._zeros = KiArray(ids, np.zeros(len(ids), dtype=np.intp))
        return z

    @staticmethod
    def _threshold(rank: int) -> float:
        """Admit a slot while its log survival >= this: level <= rank, i.e. survival >=
        (LEVELS - 1 - rank) / _SCALE (every slot for the last rank)."""
        return -math.inf if rank >= LEVELS - 1 else math.log((LEVELS - 1 - rank) / _SCALE)

    def _pricing(self, ctx: PolicyContext, b: int) -> tuple[StepCost, str]:
        """The step-cost model that prices a batch of ``b`` and its name for the reasons: the
        cost table where it prices the batch (checked on the step that drafts nothing), else
        the online model (whose prices are None until it has step times)."""
        table = self.table
        if table is not None and table.predict(b, b, 0) is not None:
            return table, "cost table"
        return ctx.cost, "online model" if table is None else "online model (batch outside the cost table)"

    def _grid_costs(self, model: StepCost, b: int, slots: np.ndarray, dmin: int) -> np.ndarray | None:
        """Approximate step ms over the whole (cap D, budget) grid from the admitted slots
        (verify tokens ``b + slots``; drafter passes ``max(D, dmin)`` per row D), vectorised
        (the online model: its roofline, without the per-cell corrections)."""
        passes = self._passes.get(dmin)
        if passes is None:
            passes = self._passes[dmin] = np.maximum(self._caps, dmin)[:, None].astype(float)
        return predict_grid(model, b, slots + b, passes)

    @staticmethod
    def _exact_ms(model: StepCost, b: int, verify: int, draft: int) -> float:
        """The model's own price of one candidate (online: with its corrections)."""
        ms = model.predict(b, verify, draft)
        return math.inf if ms is None else ms

    # ------------------------------------------------------------------ policy
    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        n = self.n
        self.n += 1
        ids = batch.req_ids
        b = len(ids)
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
        chosen = self._selection(batch, ctx, n, probe)
        if chosen is None:
            k = self.candidates[-1]
            return decision(ctx, k, self.name, "hold: no step times yet", batch_size=b)
        sel, log_s, held = chosen
        k, k_i = self._admit(sel, log_s, held, probe, ids)
        return Decision(
            k=k,
            k_i=k_i,
            policy=self.name,
            reason=self._reason(sel, probe, held),
            est_accept=ctx.acceptance.estimate(),
            est_cost_ms=sel.ms,
        )

    def _selection(
        self, batch: BatchView, ctx: PolicyContext, n: int, probe: bool
    ) -> tuple[_Selection, np.ndarray | None, bool] | None:
        """The selection for this decision (the held one, or a new one when due; see the
        module docstring), the log survival of the positions under its cap (None for a cap
        of 0) and whether it is held; None without a cost model."""
        ids = batch.req_ids
        b = len(ids)
        sel = self._sel
        if (sel is None or n - sel.n >= sel.hold or abs(b - sel.b) * 8 > sel.b or probe
                or ids[-1] != sel.tail):
            log_s = self._log_survival(batch, ctx, b, self.kmax)
            sel = self._select(log_s, b, ctx, n, ids[-1])
            if sel is None:
                return None
            return sel, log_s[:, :sel.cap] if sel.cap else log_s, False
        # only the positions under the held depth cap matter (none for a cap of 0)
        if sel.cap:
            return sel, self._log_survival(batch, ctx, b, sel.cap), True
        self._check_shape(batch.confidences, b)
        return sel, None, True

    def _admit(
        self, sel: _Selection, log_s: np.ndarray | None, held: bool, probe: bool, ids: tuple[str, ...]
    ) -> tuple[int, KiArray]:
        """K and the K_i of the batch under the selection's (cap, threshold), the probe's +1
        and ``min_gamma``; flags a held selection for re-selection when the admitted slots
        drifted."""
        cap = sel.cap
        if cap:
            # K_i = admitted slots of request i (a prefix: survival never rises with depth);
            # the row sum as one matmul is faster than a reduction along the short axis
            assert log_s is not None
            k_i_arr = ((log_s >= sel.thr) @ self._ones[cap]).astype(np.intp)
            if held:
                # the admitted total drifted more than 1/8 from the selection's: re-select
                # at the next decision
                tot = int(k_i_arr.sum())
                if abs(tot - sel.slots) * 8 > sel.slots:
                    self._sel = sel._replace(hold=0)
        elif probe or self.min_gamma:
            k_i_arr = np.zeros(len(ids), dtype=np.intp)
        else:  # a depth cap of 0 and min_gamma 0: every K_i is 0
            return 0, self._zero_k_i(ids)
        if probe:  # one position deeper for everyone: measures what the budget left out
            k_i_arr += 1
            np.minimum(k_i_arr, self.kmax, out=k_i_arr)
        k = int(k_i_arr.max())
        if k < self.min_gamma:  # held thresholds (or no priced cap at all) may admit less
            k_i_arr[k_i_arr.argmax()] = k = self.min_gamma
        return k, KiArray(ids, k_i_arr)

    @staticmethod
    def _reason(sel: _Selection, probe: bool, held: bool) -> str:
        """The decision's reason (built once per selection, probe and hold)."""
        reason = sel.reasons.get((probe, held))
        if reason is None:
            surv = (LEVELS - 1 - sel.rank) / LEVELS
            reason = sel.reasons[(probe, held)] = (
                f"{'probe +1 on ' if probe else ''}{'held ' if held else ''}budget (survival >= "
                f"{surv:.3g}, depth <= {sel.cap}), confidence survival, {sel.source}: "
                f"{sel.ratio:.4g} tok/ms"
            )
        return reason

    def _select(self, log_s: np.ndarray, b: int, ctx: PolicyContext, n: int, tail: str) -> _Selection | None:
        """The best (cap D, survival level rank) for this batch: admitted slots and expected
        accepted tokens on the whole (cap, rank) grid (:meth:`_slot_grid`), the grid priced
        by the cost model, and the REPRICE best caps re-priced exactly (:meth:`_reprice`).
        None without a cost model."""
        grid = self._slot_grid(log_s)
        slots = grid[0]  # (cap D = 0..kmax, rank r): admitted slots
        dmin = ctx.cost.draft_min_steps
        model, source = self._pricing(ctx, b)
        ms = self._grid_costs(model, b, slots, dmin)
        if ms is None:
            return None
        ratio = grid[1] + b  # expected committed tokens per step
        ratio /= ms
        if self.min_gamma:
            ratio[: self.min_gamma] = -np.inf
        best_ratio, cap, r, best_ms = self._reprice(model, ctx, b, grid, ratio, dmin)
        last = self._sel
        hold = RESELECT
        if last is not None and last.cap == cap and abs(last.rank - r) <= 1:
            # confirmed (same cap, threshold within one level): hold it longer; after a
            # drift (hold cut to 0) the fresh selection's slot count is the new reference
            hold = max(RESELECT, min(2 * last.hold, MAX_HOLD if cap else MAX_HOLD_0))
        self._sel = _Selection(n, b, cap, r, best_ratio, best_ms, source, self._threshold(r), {}, hold,
                                int(slots.item(cap, r)), tail)
        return self._sel

    def _slot_grid(self, log_s: np.ndarray) -> np.ndarray:
        """(admitted slots, expected accepted tokens) per (cap D = 0..kmax, rank r), shape
        (2, kmax + 1, LEVELS): every (request, position) slot is counted, and its survival
        summed, by (position, level) in two bincounts, then cumulated (matmuls) over
        positions < D (a zero row for D = 0) and over levels <= r."""
        kmax = self.kmax
        levels = LEVELS
        surv = np.exp(log_s)
        keys = (self._key_base - (surv * _SCALE).astype(np.intp)).ravel()  # survival <= 1
        surv = surv.ravel()
        size = kmax * levels
        hist = np.stack((np.bincount(keys, minlength=size), np.bincount(keys, weights=surv, minlength=size)))
        return (self._pos_cum @ hist.reshape(2, kmax, levels)) @ self._rank_cum

    def _reprice(
        self, model: StepCost, ctx: PolicyContext, b: int, grid: np.ndarray, ratio: np.ndarray, dmin: int
    ) -> tuple[float, int, int, float]:
        """(tokens per ms, cap, rank, step ms) of the best candidate: the best rank under each
        cap on the grid, the REPRICE best caps re-priced exactly by the model (the online
        model corrects its roofline where it has data), the held cap kept within
        ``hysteresis`` and within ``switch_error`` standard deviations of the online
        model's error in the two candidates' cells (as ``online`` does: rule 4 of
        :mod:`.online`; a cost table has no error estimate).  A cap D whose position D
        admits nothing duplicates D - 1 at a higher price, so it never beats it on the grid
        (ties go to the smaller cap); it is skipped."""
        slots = grid[0]
        br = ratio.argmax(axis=1).tolist()
        approx = ratio.max(axis=1).tolist()
        best = (-math.inf, 0, LEVELS - 1, math.inf)  # (ratio, cap, rank, ms)
        last = self._sel
        kept = None  # the held cap's candidate, when it is among the re-priced ones
        cells: dict[int, tuple[int, int]] = {}  # cap -> its (verify tokens, drafter passes)
        done = 0
        for cap in sorted(self._caps_list, key=approx.__getitem__, reverse=True):
            if done == REPRICE or not math.isfinite(approx[cap]):
                break
            r = br[cap]
            s = slots.item(cap, r)
            if cap and s == slots.item(cap - 1, r):
                continue  # position `cap` admits nothing: the cap below is the same budget
            done += 1
            cells[cap] = (b + int(s), max(cap, dmin))
            c_ms = self._exact_ms(model, b, *cells[cap])
            g = (b + grid.item(1, cap, r)) / c_ms
            if g > best[0]:
                best = (g, cap, r, c_ms)
            if last is not None and cap == last.cap:
                kept = (g, cap, r, c_ms)
        if kept is None or kept[1] == best[1]:
            return best
        margin = math.log1p(-ctx.hysteresis) if ctx.hysteresis < 1.0 else -math.inf
        error = getattr(model, "cell_error", None)
        if error is not None and ctx.switch_error > 0:
            e_kept, e_best = error(b, *cells[kept[1]]), error(b, *cells[best[1]])
            margin = min(margin, -ctx.switch_error * math.sqrt(e_kept * e_kept + e_best * e_best))
        if kept[0] > 0 and math.log(kept[0] / best[0]) >= margin:
            best = kept  # another cap must beat the held one by more than both margins
        return best

    def _uniform(self, b: int, ctx: PolicyContext, probe: bool) -> Decision:
        """Without confidences every request has the same survival curve, so admitting by
        survival admits whole positions: the budget is a batch-uniform K (k_i = None)."""
        kmax = self.kmax
        expected = ctx.acceptance.expected_committed()  # E(K), K = 0..kmax
        dmin = ctx.cost.draft_min_steps
        caps = self._caps_list
        model, source = self._pricing(ctx, b)
        if self._uniform_key != (b, dmin):  # verify tokens B * (K + 1), passes max(K, dmin)
            self._uniform_key = (b, dmin)
            self._uniform_args = ([b * (k + 1) for k in caps], [max(k, dmin) for k in caps])
        ms_grid = predict_grid(model, b, *self._uniform_args)
        if ms_grid is None:
            k = self.candidates[-1]
            return decision(ctx, k, self.name, "hold: no step times yet", batch_size=b)
        ratio = [b * e / m for e, m in zip(expected, ms_grid.tolist())]
        for k in range(self.min_gamma):
            ratio[k] = -math.inf
        best = (-math.inf, self.min_gamma, math.inf)
        for k in sorted(caps, key=lambda i: -ratio[i])[:REPRICE]:
            c_ms = self._exact_ms(model, b, b * (k + 1), max(k, dmin))
            r = b * expected[k] / c_ms
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

    def describe(self) -> dict:
        return {
            "name": self.name,
            "cost": "cost table" if self.table is not None else "online model",
            "cost_table": None if self.table is None else self.table.source,
        }


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
