"""Online estimators shared by the policies.

* :func:`position_counts` -- per-position (tried, accepted) counts of one step.
* :class:`AcceptanceEstimator` -- conditional acceptance ``a_j`` per draft position from
  exponentially decayed counts, with a chained prior (an untried position inherits the
  estimate of the position before it), and the expected committed tokens per request.
* :class:`StepCostModel` -- an online, structural step-cost model fitted from observed
  (batch B, verified tokens T, drafter passes D, wall ms)::

      ms = bias + c_t * max(T, T0) + D * (c_p + c_d * max(B, B0))

  a roofline (memory-bound below the knees ``T0``/``B0``, compute-bound above) with a fixed
  cost per drafter pass ``c_p`` (launch, metadata, the drafter's own lm-head), fitted by
  non-negative least squares over a window of samples with the knees chosen on a grid.
  Because it is structural it extrapolates to batch sizes and K not tried yet.
* :class:`CatchUpCost` -- what catching the drafter up after K = 0 costs: the time a
  resume step took beyond the step-cost model's price of its K, as a fixed part (the extra
  drafter pass) plus a part per token caught up.
* :class:`ConfidenceMap` -- a binned, monotone (pool-adjacent-violators) map from a
  draft confidence to the probability that the token is accepted.

Pure Python + numpy; no vLLM, no torch.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .observations import RequestResult

# ----------------------------------------------------------------------------- counting


def position_counts(
    results: Sequence[RequestResult], kmax: int
) -> tuple[list[int], list[int], int, int]:
    """Per-position counts of one step's results.

    Returns ``(tried, accepted, drafted_total, accepted_total)`` where ``tried[j-1]`` is the
    number of requests that reached position ``j`` (``drafted >= j`` and
    ``accepted >= j - 1``) and ``accepted[j-1]`` the number that accepted it.
    :class:`RequestResult` guarantees ``0 <= accepted <= drafted``; a result with
    ``drafted > kmax`` raises :class:`ValueError`.
    """
    stride = kmax + 1
    size = stride * stride
    if size <= 256:  # keys fit a byte: one list comprehension, one bincount
        try:
            keys = bytes([x.drafted * stride + x.accepted for x in results])
        except ValueError:  # a key past 255: drafted > kmax
            keys = None
        hist = None if keys is None else np.bincount(np.frombuffer(keys, np.uint8), minlength=size)
        if hist is None or len(hist) > size:
            bad = next((x for x in results if x.drafted > kmax), None)
            raise ValueError(f"bad request result {bad!r}: drafted > kmax={kmax}")
    else:
        counts = [0] * size  # counts[d * stride + a]
        try:
            for x in results:
                counts[x.drafted * stride + x.accepted] += 1
        except IndexError:
            bad = next((x for x in results if x.drafted > kmax), None)
            raise ValueError(f"bad request result {bad!r}: drafted > kmax={kmax}") from None
        hist = np.array(counts, dtype=np.int64)
    if hist[0] == len(results):  # nothing drafted (K = 0): nothing reached
        return [0] * kmax, [0] * kmax, 0, 0
    return _fold(hist, kmax)[:4]


def position_counts_arrays(drafted, accepted, kmax: int) -> tuple[list[int], list[int], int, int]:
    """:func:`position_counts` from two aligned integer arrays (the fast path).

    Validation costs two numpy calls: ``accepted`` in ``[0, kmax]`` (as unsigned, a
    negative count is huge), which makes every key ``drafted * (kmax + 1) + accepted`` with
    ``drafted`` in ``[0, kmax]`` a distinct cell of the histogram; a negative ``drafted``
    then gives a negative key (bincount refuses it), a ``drafted > kmax`` a key past the
    table, and ``accepted > drafted`` lands in a cell the fold counts as invalid."""
    d = np.asarray(drafted, dtype=np.int64)
    a = np.asarray(accepted, dtype=np.int64)
    if d.shape != a.shape or d.ndim != 1:
        raise ValueError(f"drafted/accepted arrays must be 1-D and aligned, got {d.shape}, {a.shape}")
    stride = kmax + 1
    if not len(d):
        return [0] * kmax, [0] * kmax, 0, 0
    bad = f"bad per-request counts: need 0 <= accepted <= drafted <= kmax={kmax}"
    if a.view(np.uint64).max() > kmax:
        raise ValueError(bad)
    keys = d * stride
    keys += a
    try:
        hist = np.bincount(keys, minlength=stride * stride)
    except ValueError:  # a negative key: drafted < 0
        raise ValueError(bad) from None
    if len(hist) > stride * stride:
        raise ValueError(bad)
    if hist[0] == len(d):  # nothing drafted (K = 0): nothing reached
        return [0] * kmax, [0] * kmax, 0, 0
    tried, acc, dsum, asum, invalid = _fold(hist, kmax)
    if invalid:
        raise ValueError(bad)
    return tried, acc, dsum, asum


_FOLD: dict[int, np.ndarray] = {}


def _fold_matrix(kmax: int) -> np.ndarray:
    """Integer matrix mapping the (drafted, accepted) histogram (``d * (kmax + 1) + a``) to
    ``[tried_1..tried_kmax, accepted_1..accepted_kmax, drafted_total, accepted_total,
    invalid]``: a request reaches positions ``1..min(drafted, accepted + 1)`` and accepts
    ``1..accepted``; ``invalid`` counts the cells with ``accepted > drafted``."""
    m = _FOLD.get(kmax)
    if m is None:
        stride = kmax + 1
        m = np.zeros((stride * stride, 2 * kmax + 3), dtype=np.int64)
        for d in range(stride):
            for a in range(stride):
                row = m[d * stride + a]
                if a > d:
                    row[2 * kmax + 2] = 1
                    continue
                row[: min(d, a + 1)] = 1
                row[kmax : kmax + a] = 1
                row[2 * kmax] = d
                row[2 * kmax + 1] = a
        _FOLD[kmax] = m
    return m


def _fold(hist: np.ndarray, kmax: int) -> tuple[list[int], list[int], int, int, int]:
    out = (hist @ _fold_matrix(kmax)).tolist()  # one integer matmul, Python ints out
    return out[:kmax], out[kmax : 2 * kmax], out[2 * kmax], out[2 * kmax + 1], out[2 * kmax + 2]


# ----------------------------------------------------------------------------- acceptance


def expected_committed(accept: Sequence[float]) -> list[float]:
    """``E(K) = 1 + sum_{j<=K} prod_{i<=j} a_i`` for K = 0..len(accept): the tokens a request
    commits in a step that drafts K, from the conditional acceptance per position."""
    out = [1.0]
    surv = 1.0
    for a in accept:
        surv *= a
        out.append(out[-1] + surv)
    return out


class AcceptanceEstimator:
    """Conditional acceptance per draft position from decayed counts.

    Every update multiplies all counts by ``1 - weight`` (time-based decay, also for
    positions not tried in the step, so stale deep positions fall back to their prior and
    get re-tested) and adds the step's counts.  A step without acceptance information (K =
    0, :meth:`decay_only`) decays a position only while its estimate is below its no-data
    level (``prior_mean * chain_ratio ** (j - 1)``): a pessimistic estimate falls back toward
    the prior and gets re-tested (K = 0 never latches), one above it stays where the last
    data put it (no data, no bad news).  Why: decaying every estimate toward the prior while
    K = 0 made a workload that accepts well above the prior look worse with every K = 0
    step; measured in a fresh demo server at batch 16 on code, K = 1's predicted goodput
    fell from 0.851 to 0.792 tok/ms over a 37-step K = 0 stretch while the steps said K = 1
    was 7 % better than K = 0 (0.896 against 0.839 tok/ms), and online held K = 0 for 69 of
    its decisions there.  (Positions above the held K keep decaying in :meth:`update_counts`:
    kept there, a deep position's lucky estimate from a few probe trials held K too deep in
    the simulator, online / best fixed 0.981 -> 0.978 on stationary-high.)  A position a step
    with acceptance information does not try (above its K, or past every request's first
    rejection) decays ``untried_decay`` (2) times as fast, the decay squared: a K = 1 held
    on the real engine tries no position 2, whose estimate then stayed where the last deeper
    steps' unlucky trials put it, so K = 1 stayed (a fresh demo server at code@1: position 2
    at 0.35 over 40 decisions where fixed K = 3 measured 1.14 x K = 1; a judged server at
    code@4: K = 1 on 132 of 178 decisions, position 2 at 0.45-0.47 over a 36-decision
    window, the next deeper window measured 0.54-0.63).  In one engine beside the estimator
    without it (two servers, 20 rotation rounds a cell, code and mixed at batch 1 and 4):
    1.047 on decode steps (geometric mean; every cell 1.025-1.077), 1.037 end to end;
    simulator 1.0112 -> 1.0122 (least cell 0.985 -> 0.986).  When position 1
    holds more than ``max_trials`` (decayed) trials, all counts are scaled down to that
    volume, so at large batch the memory is a few steps and at small batch it is
    ``~1 / weight`` steps.  The estimate is the posterior mean::

        a_1 = (s_1 + w0 * prior_mean) / (n_1 + w0)
        a_j = (s_j + wc * r * a_{j-1}) / (n_j + wc)          (j >= 2, r = chain_ratio)

    i.e. a position without data inherits (``chain_ratio`` times) the estimate of the
    position before it: acceptance usually falls with position, and the mild shrink keeps
    thinly observed deep positions from looking better than they are.
    """

    def __init__(
        self,
        kmax: int,
        weight: float = 0.05,
        prior_mean: float = 0.6,
        prior_strength: float = 2.0,
        chain_strength: float = 2.0,
        max_trials: float = 128.0,
        chain_ratio: float = 0.95,
        untried_decay: float = 2.0,
    ) -> None:
        if kmax < 0:
            raise ValueError(f"kmax must be >= 0, got {kmax}")
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"ewma weight must be in (0, 1], got {weight}")
        if not 0.0 <= prior_mean <= 1.0:
            raise ValueError(f"prior_mean must be in [0, 1], got {prior_mean}")
        if not untried_decay >= 1.0:
            raise ValueError(f"untried_decay must be >= 1, got {untried_decay}")
        self.kmax = kmax
        self.decay = 1.0 - weight
        self.prior_mean = prior_mean
        self.prior_strength = prior_strength
        self.chain_strength = chain_strength
        self.max_trials = max_trials
        self.chain_ratio = chain_ratio
        self.untried_decay = untried_decay
        self.tried = [0.0] * kmax
        self.accepted = [0.0] * kmax
        self.steps = 0  # updates that carried any acceptance information
        self._est: tuple[float, ...] | None = None
        self._expected: list[float] | None = None

    def _keeps(self) -> list[bool]:
        """Per position: True where its estimate is at or above what it would be with no
        data at all (``prior_mean * chain_ratio ** (j - 1)``): a K = 0 step
        (:meth:`decay_only`) leaves its counts as they are (no data, no bad news); below
        that level they decay toward it, so a pessimistic estimate is re-tested (see the
        class docstring)."""
        level = self.prior_mean
        out = []
        for e in self.estimate():
            out.append(e >= level)
            level *= self.chain_ratio
        return out

    def update_counts(self, tried: Sequence[float], accepted: Sequence[float]) -> None:
        """Decay, then add one step's per-position counts; a position the step did not try
        decays ``untried_decay`` times as fast (see the class docstring)."""
        d = self.decay
        untried = d ** self.untried_decay
        t = self.tried
        a = self.accepted
        for j in range(self.kmax):
            dj = d if tried[j] else untried
            t[j] = t[j] * dj + tried[j]
            a[j] = a[j] * dj + accepted[j]
        # keep at most max_trials at position 1: memory follows the data volume, so a batch
        # that shrank (or changed population) is tracked within a few steps ...
        cap = self.max_trials
        if self.kmax and tried[0] > 0:
            # ... and at most what 1 / weight steps of this step's volume hold: after a
            # batch of 16 (128 trials kept) a batch of 1 adds one trial a step, and the old
            # counts outweighed it for ~100 steps (in the simulator of a served test:
            # position 1 estimated 0.59 after 80 batch-1 steps that accepted 0.8)
            cap = min(cap, tried[0] / (1.0 - d))
        if self.kmax and t[0] > cap:
            f = cap / t[0]
            for j in range(self.kmax):
                t[j] *= f
                a[j] *= f
        if self.kmax and tried[0]:
            self.steps += 1
        self._est = None
        self._expected = None

    def decay_only(self) -> None:
        """A step without acceptance information (K = 0): only time passes, and only the
        positions estimated below their no-data level decay (toward it: :meth:`_keeps`)."""
        d = self.decay
        t = self.tried
        a = self.accepted
        decayed = False
        for j, keep in enumerate(self._keeps()):
            if not keep:
                t[j] *= d
                a[j] *= d
                decayed = True
        if decayed:  # else the cached estimates still hold
            self._est = None
            self._expected = None

    def estimate(self) -> tuple[float, ...]:
        """Conditional acceptance per position 1..kmax."""
        if self._est is None:
            out = []
            prev = self.prior_mean
            w = self.prior_strength
            for j in range(self.kmax):
                prev = (self.accepted[j] + w * prev) / (self.tried[j] + w)
                out.append(prev)
                w = self.chain_strength
                prev *= self.chain_ratio
            self._est = tuple(out)
        return self._est

    def expected_committed(self) -> list[float]:
        """``E(K) = 1 + sum_{j<=K} prod_{i<=j} a_i`` for K = 0..kmax (per request)."""
        if self._expected is None:
            self._expected = expected_committed(self.estimate())
        return self._expected

    def effective_trials(self) -> tuple[float, ...]:
        """Decayed number of trials per position (how much data backs each estimate)."""
        return tuple(self.tried)


# ----------------------------------------------------------------------------- step cost


def _knee_grid(lo: float, hi: float, n: int) -> np.ndarray:
    """Candidate knees: 0 (purely linear) plus a geometric grid spanning [lo, hi]."""
    lo = max(lo, 1.0)
    hi = max(hi, lo * 1.5)
    out = np.empty(n + 1)
    out[0] = 0.0
    out[1:] = lo * (hi / lo) ** _UNIT[n]
    return out


_UNIT = {n: np.linspace(0.0, 1.0, n) for n in range(2, 33)}


# the subsets of {bias, c_t, c_p, c_d} tried for non-negativity, largest first (on a tie of
# sse the larger model wins); each keeps a target term (bias or c_t): every step runs the
# target, and a model of the drafter alone prices a step that drafts nothing at 0 ms.  Why:
# 13 served steps at K = 1..4 (none at K = 0), their times near proportional to K, fitted
# ``c_p + c_d`` alone in an online server of a ``bench ab`` run; K = 0 was priced 0 ms, its
# goodput infinite, and online switched to K = 0 claiming a gain of +inf % (about 4 % of
# such 13-step draws at batch 1 fit so, ``tests/unit/test_estimators.py``)
_SUBSETS = np.array(
    sorted((m for m in itertools.product((True, False), repeat=4) if m[0] or m[1]),
           key=lambda m: -sum(m)),
    dtype=bool,
)


def _refine(grid: np.ndarray, best: float) -> np.ndarray:
    """Five knees spanning the neighbours of ``best`` in ``grid``."""
    i = int(np.searchsorted(grid, best))
    lo = grid[max(i - 1, 0)]
    hi = grid[min(i + 1, len(grid) - 1)]
    if lo <= 0.0:
        lo = min(1.0, hi)
    return np.unique(np.concatenate(([best], np.linspace(lo, hi, 5))))


def _fit_grid(
    tg: np.ndarray,
    bg: np.ndarray,
    b: np.ndarray,
    t: np.ndarray,
    d: np.ndarray,
    y: np.ndarray,
    wt: np.ndarray,
) -> tuple[float, np.ndarray | None, float, float]:
    """Best (sse, coef, T0, B0) of the weighted NNLS ``y ~ c0 + c1 max(t, T0) + c2 d +
    c3 d max(b, B0)`` over every knee pair of the grids.

    Non-negativity by subsets: the least squares of every model on a subset of the four
    coefficients at every knee pair; the least sse among the feasible ones (no negative
    coefficient) is the non-negative least squares fit at the best knees.  Why every subset:
    a fit that stopped at the largest size with a feasible fit anywhere on the grid took a
    degenerate full fit (T0 at the largest verify width, so verify tokens cost nothing, and
    6.5 ms a drafter pass) with 49 times the sse of the two-coefficient fit ``c0 + c1 t``
    (relative misfit 0.66 against 0.14); in the first online server of a ``bench ab`` run at
    concurrency 16 it priced K = 3 at batch 14 at 65-68 ms where it cost 125-135, and online
    drafted K = 3 there for 20 steps (mean K 1.27-1.59 in that server, 0.55-1.09 in the two
    later ones, whose fits stayed right)."""
    ut = np.maximum(t[None, :], tg[:, None])  # (nt, cells)
    ub = d[None, :] * np.maximum(b[None, :], bg[:, None])  # (nb, cells)
    nt, nb = len(tg), len(bg)
    wut = ut * wt
    wub = ub * wt
    wd = d * wt
    A = np.empty((nt, nb, 4, 4))
    A[..., 0, 0] = float(wt.sum())
    A[..., 0, 1] = A[..., 1, 0] = wut.sum(1)[:, None]
    A[..., 0, 2] = A[..., 2, 0] = float(wd.sum())
    A[..., 0, 3] = A[..., 3, 0] = wub.sum(1)[None, :]
    A[..., 1, 1] = (wut * ut).sum(1)[:, None]
    A[..., 1, 2] = A[..., 2, 1] = (wut @ d)[:, None]
    A[..., 1, 3] = A[..., 3, 1] = wut @ ub.T
    A[..., 2, 2] = float(wd @ d)
    A[..., 2, 3] = A[..., 3, 2] = (wub @ d)[None, :]
    A[..., 3, 3] = (wub * ub).sum(1)[None, :]
    r = np.empty((nt, nb, 4))
    r[..., 0] = float(wt @ y)
    r[..., 1] = (wut @ y)[:, None]
    r[..., 2] = float(wd @ y)
    r[..., 3] = (wub @ y)[None, :]
    syy = float(wt @ (y * y))
    # tiny ridge keeps collinear knees (flat features) solvable
    scale = np.maximum(np.diagonal(A, axis1=-2, axis2=-1), 1e-12)
    # knee pairs flattened: (pairs, 4, 4), (pairs, 4)
    A = A.reshape(nt * nb, 4, 4)
    r = r.reshape(nt * nb, 4)
    scale = scale.reshape(nt * nb, 4)
    tol = 1e-9 * max(1.0, syy)
    best: tuple[float, np.ndarray | None, float, float] = (math.inf, None, 0.0, 0.0)
    eye = np.eye(4)
    pairs = np.arange(nt * nb)  # the knee pairs a smaller model could still win at
    for j, mask in enumerate(_SUBSETS):
        Ap, rp = A[pairs], r[pairs]
        mm = mask[:, None] & mask[None, :]
        As = np.where(mm, Ap, 0.0) + np.where(mask, scale[pairs] * 1e-9, 1.0)[..., None] * eye
        rs = np.where(mask, rp, 0.0)
        x = np.linalg.solve(As, rs[..., None])[..., 0]
        feasible = (x >= -1e-12).all(-1)
        xp = np.maximum(x, 0.0)
        ax = (Ap @ xp[..., None])[..., 0]
        sse = syy - 2.0 * (xp * rp).sum(-1) + (xp * ax).sum(-1)
        if j == 0:
            # the unconstrained full model's sse bounds every smaller model's at its knees
            ax_free = (Ap @ x[..., None])[..., 0]
            bound = syy - 2.0 * (x * rp).sum(-1) + (x * ax_free).sum(-1)
        if feasible.any():
            sse_f = np.where(feasible, sse, np.inf)
            # the first knee pair within rounding of the least sse: a near-tie between knees
            # must not be decided by the BLAS kernel's summation order (another CPU, another
            # OPENBLAS_CORETYPE), or two machines learn different costs from the same samples
            near = sse_f <= sse_f.min() + tol
            i = int(np.argmax(near))
            if sse_f[i] < best[0] - tol:
                p = int(pairs[i])
                best = (float(sse_f[i]), xp[i], float(tg[p // nb]), float(bg[p % nb]))
        if j == 0:
            # where the full model is feasible no smaller one fits better; elsewhere only
            # knees whose bound beats the best so far are worth the smaller models
            pairs = pairs[~feasible & (bound < best[0] - tol)]
        if not len(pairs):
            break
    return best


SPEED_DRIFT = 0.006  # sd of the machine speed's log change from one served step to the next
SPEED_STEP_MAX = 0.3  # a step's log ratio to its cell's price counts up to this (outliers)
TRACKED_CELL_WEIGHT = 0.05  # a cell mean's least EWMA weight while the speed is tracked
SPEED_GAIN_EVERY = 32  # samples between two updates of the speed factor's gain (its noise)


def _level_gain(drift: float, noise: float) -> float:
    """The steady-state Kalman gain of a random walk of step ``drift`` seen through noise of
    sd ``noise`` (both relative): how far one step moves the speed factor."""
    if drift <= 0.0:
        return 0.0
    q = (drift / max(noise, 1e-6)) ** 2
    return min(0.5, (math.sqrt(q * q + 4.0 * q) - q) / 2.0)


SUPPORT_SPAN = 2.0  # batch sizes within this factor count as evidence for each other
PART_SD = 0.05  # expected size of what the roofline misses for one T or one D within a batch
DEFAULT_NOISE = 0.1  # relative step-time spread assumed before any cell has two samples


class StepCostModel:
    """Online roofline step-cost model (see the module docstring).

    Samples are kept per *cell* ``(B, T, D)``: the cell's mean ms (an EWMA, weight
    ``max(1/n, cell_weight)``), its count ``n`` and when it was last seen.  The fit weighs a
    cell by ``min(n, cell_cap) * 0.5 ** (age / window)`` (age in samples), so a
    configuration seen once in a probe still shapes the model next to one seen hundreds of
    times, and old configurations fade with a half-life of ``window`` samples.  A prediction
    for a cell with recent data is pulled toward the cell's own mean (weight
    ``w / (w + cell_prior)``, ``w`` the cell's fit weight): the structure extrapolates, the
    cells correct what the roofline misses near its knees.  At most
    ``max_cells`` cells are kept (the lightest are dropped at fit time, or when twice as
    many exist).

    The model is refitted lazily when :meth:`predict` needs it: after
    ``min(refit_every, max(4, n / 4))`` new samples (a fit costs a few hundred
    microseconds).  Until ``min_samples`` samples exist, :attr:`ready` is False and
    :meth:`predict` returns None.
    """

    def __init__(
        self,
        window: int = 256,
        refit_every: int = 256,
        min_samples: int = 4,
        grid: int = 10,
        cell_cap: float = 8.0,
        cell_weight: float = 0.1,
        max_cells: int = 512,
        cell_prior: float = 2.0,
        speed_drift: float = SPEED_DRIFT,
        tracked_cell_weight: float = TRACKED_CELL_WEIGHT,
    ) -> None:
        if window < 4:
            raise ValueError(f"cost window must be >= 4, got {window}")
        if not 0.0 <= speed_drift < 1.0:
            raise ValueError(f"cost speed_drift must be in [0, 1), got {speed_drift}")
        self.window = window
        self.refit_every = max(1, refit_every)
        self.min_samples = min_samples
        self.grid = grid
        self.cell_cap = cell_cap
        self.cell_weight = cell_weight
        self.max_cells = max_cells
        self.cell_prior = cell_prior
        self.speed_drift = speed_drift
        # the machine's speed now against the speed the cells' means are in (see add()):
        # every price is the cells' model times it
        self.speed = 1.0
        self._speed_gain = _level_gain(speed_drift, DEFAULT_NOISE)
        # a cell's mean follows its steps by at least this weight: with the speed tracked,
        # only what is the cell's own (slowly)
        self._floor = tracked_cell_weight if speed_drift > 0.0 else cell_weight
        # cells: key -> row; parallel lists (cheap scalar updates, one np.array per fit)
        self._cells: dict[tuple[int, int, int], int] = {}
        self._kb: list[float] = []
        self._kt: list[float] = []
        self._kd: list[float] = []
        self._ms: list[float] = []
        self._cnt: list[float] = []
        self._last: list[float] = []
        self._seeded: list[bool] = []  # the cell holds seeded samples only (see seed())
        self._var: list[float] = []  # relative variance of the cell's step times (nan: n < 2)
        self._by_batch: dict[int, list[int]] = {}  # batch -> its cells' rows (residual)
        self._residual_memo: tuple[tuple, Any] | None = None  # (state, residual) of one call
        # (samples, cells) -> the cells' fit weights / their pooled noise: every change of
        # the cells adds a sample or drops cells, so the pair names their state
        self._weights_memo: tuple[tuple[int, int], np.ndarray] | None = None
        self._noise_memo: tuple[tuple[int, int], float] | None = None
        self.n = 0  # samples ever added
        self.n_seeded = 0  # of which seeded (measured before serving, see seed())
        self._since_fit = 0
        self.coef: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # bias, c_t, c_p, c_d
        self.knees: tuple[float, float] = (0.0, 0.0)  # T0, B0
        self.rmse: float | None = None
        self.misfit = 0.0  # weighted RMS relative error of the fitted roofline over the cells
        self.fitted = False
        self.draft_min_steps = 0  # drafter passes at K = 0, learnt from observations

    # -- data
    def add(self, batch: int, verify_tokens: int, draft_steps: int, ms: float,
            track: bool = True) -> None:
        """One served step's time (``track``: it may move the speed factor; False for a
        step whose time holds more than its K's price, the drafter's catch-up of a resume).

        The machine's speed drifts while serving, the same for every K: on the CPU host a
        fixed K's step at one batch drifted by 8-15 % (sd) over a paired run against 3.5-5 %
        from one step to the next.  A step in a cell served twice or more measures that
        drift: :attr:`speed` (what every price is, over the cells' stored means) moves by
        a Kalman gain of its log ratio to the cell's price (a random walk of ``speed_drift``
        a step seen through the cells' own noise, :meth:`noise`: 0.12 at 4.5 % noise, 0.02 at
        30 %), and the step is stored divided by the speed before it.  A cell's mean then
        follows its steps by at least ``tracked_cell_weight`` (0.05), not ``cell_weight``
        (0.1): the speed takes the drift and the cells keep their levels relative to each
        other, each still following what is its own.  So a K not served for minutes is
        priced at today's speed, as the held K is, instead of at the speed of the minutes it
        was last served in.  Why: in a paired run
        on the CPU host online held K = 1 at batch 4 for 207 decisions with K = 2 priced at
        56 ms, its mean from minutes before, while K = 2 steps took 45-55 ms there (K = 1
        priced 39-42 against 38-45): K = 2 was 7 % faster.  Replayed through the online
        windows of the two paired servers of ``docs/results/paired-16rounds-avx2-
        2026-12-06.json``, the error of the K-to-K price ratios fell from 10.3 % to 7.1 % and
        the goodput of the K the prices would pick with the measured tokens per step rose
        from 0.960 to 0.972 of the best fixed K.  Why 0.05 and not 0.01: the Ks' step times
        do not drift alike (in the judged runs' swing K = 2's median over K = 1's moved from
        1.10 to 1.19 between two phases of one server), and a cell at 0.01 kept a level from
        minutes before that the one speed cannot correct.  Re-simulated on the real steps of
        17 paired servers (``scripts/resim_paired.py --json-out``, then
        ``scripts/resim_compare.py``: the same draws, the difference's error over the
        servers), online / best fixed K rose from 0.9702 to 0.9740 (+0.38 +- 0.11 points,
        14 servers up, 3 down), mixed@1 +0.78; 0.1 gave +0.79 +- 0.13 but missed the
        simulator's 0.98 target on ``stationary-high`` (0.967), where 0.05 holds it (seeds
        0-4: mean 1.0114, least 0.987, against 1.0122 and 0.986; seeds 5-9: 1.0079 and 0.982
        against 1.0083 and 0.984)."""
        if not (ms >= 0.0) or not math.isfinite(ms):
            raise ValueError(f"step time must be a finite non-negative number, got {ms!r}")
        speed = self.speed
        i = self._cells.get((batch, verify_tokens, draft_steps))
        if (track and self.speed_drift > 0.0 and i is not None and not self._seeded[i]
                and self._cnt[i] >= 2.0 and self._ms[i] > 0.0 and ms > 0.0):
            r = math.log(ms / (speed * self._ms[i]))
            r = -SPEED_STEP_MAX if r < -SPEED_STEP_MAX else min(r, SPEED_STEP_MAX)
            self.speed = speed * math.exp(self._speed_gain * r)
        self._add(batch, verify_tokens, draft_steps, ms / speed, seeded=False)
        if self.speed_drift > 0.0 and not self.n % SPEED_GAIN_EVERY:
            self._speed_gain = _level_gain(self.speed_drift, self.noise())

    def seed(self, batch: int, verify_tokens: int, draft_steps: int, ms: float) -> None:
        """One step time measured before serving (the start-up cost probe): it prices K
        like a served step (fit and cell correction) but is a prior, not evidence: a cell
        that holds only seeded samples gives no :meth:`support`, so the online policy
        still times a contending K once while serving, and the first served step of the
        cell replaces its seeded mean instead of averaging with it.  Why: a probe point is
        two windows of four steps, and in a server its batch-1 row came out non-monotone
        in K (``K0 21.7 K1 27.5 K2 23.4 K3 21.8 K4 22.4`` ms, the same shape on a second and
        a third pass of the grid); counted as evidence, a disturbed probe price of a K held
        the policy off that K until a probe slot (a clean-clone CI run held K = 1 at batch
        1 on code after a K = 0 phase, mean K 1.28 where 1.75 is due)."""
        self._add(batch, verify_tokens, draft_steps, ms, seeded=True)
        self.n_seeded += 1

    def _add(self, batch: int, verify_tokens: int, draft_steps: int, ms: float,
             seeded: bool) -> None:
        if not (ms >= 0.0) or not math.isfinite(ms):
            raise ValueError(f"step time must be a finite non-negative number, got {ms!r}")
        key = (batch, verify_tokens, draft_steps)
        i = self._cells.get(key)
        if i is not None and self._seeded[i] and not seeded:
            # the first served step of a cell the probe priced: the served time replaces it
            self._ms[i] = ms
            self._cnt[i] = 1.0
            self._last[i] = float(self.n)
            self._seeded[i] = False
            self._var[i] = math.nan
        elif i is None:
            self._cells[key] = len(self._ms)
            self._by_batch.setdefault(batch, []).append(len(self._ms))
            self._kb.append(float(batch))
            self._kt.append(float(verify_tokens))
            self._kd.append(float(draft_steps))
            self._ms.append(ms)
            self._cnt.append(1.0)
            self._last.append(float(self.n))
            self._seeded.append(seeded)
            self._var.append(math.nan)
            if len(self._ms) > 2 * self.max_cells:
                self._prune()
        else:
            n = self._cnt[i] + 1.0
            w = 1.0 / n
            if w < self._floor:
                w = self._floor
            mean = self._ms[i]
            dev = (ms - mean) / mean if mean > 0 else 0.0
            var = self._var[i]
            self._var[i] = dev * dev if var != var else var + w * (dev * dev - var)
            self._ms[i] += w * (ms - mean)
            self._cnt[i] = n
            self._last[i] = float(self.n)
        self.n += 1
        self._since_fit += 1

    @property
    def ready(self) -> bool:
        return self.n >= self.min_samples

    @property
    def cells(self) -> int:
        return len(self._cells)

    def _weights(self) -> np.ndarray:
        """Every cell's fit weight (:meth:`_cell_weight` of each), read-only: built once per
        state of the cells (the fit and the prune read it)."""
        key = (self.n, len(self._ms))
        memo = self._weights_memo
        if memo is not None and memo[0] == key:
            return memo[1]
        age = (self.n - 1) - np.array(self._last)
        w = np.minimum(np.array(self._cnt), self.cell_cap) * np.exp2(-age / self.window)
        w.flags.writeable = False
        self._weights_memo = (key, w)
        return w

    def _prune(self) -> None:
        """Keep the ``max_cells`` heaviest cells (and none that have faded out)."""
        w = self._weights()
        keep = w >= 1e-3
        if keep.sum() > self.max_cells:
            keep &= w >= np.sort(w)[-self.max_cells]
        if keep.all():
            return
        rows = np.flatnonzero(keep).tolist()
        for name in ("_kb", "_kt", "_kd", "_ms", "_cnt", "_last", "_seeded", "_var"):
            old = getattr(self, name)
            setattr(self, name, [old[r] for r in rows])
        kb, kt, kd = self._kb, self._kt, self._kd
        self._cells = {(int(kb[j]), int(kt[j]), int(kd[j])): j for j in range(len(rows))}
        self._by_batch = {}
        for j in range(len(rows)):
            self._by_batch.setdefault(int(kb[j]), []).append(j)

    def _arrays(self) -> tuple[np.ndarray, ...]:
        if len(self._ms) > self.max_cells:
            self._prune()
        w = self._weights()
        return np.array(self._kb), np.array(self._kt), np.array(self._kd), np.array(self._ms), w

    # -- fit
    def fit(self) -> None:
        """Weighted NNLS over a knee grid, then over a finer grid around the best knees;
        keeps the (knees, coef) of least squared error."""
        if not self._cells:
            return
        b, t, d, y, wt = self._arrays()
        m = float(wt.sum())
        if m <= 0:
            return
        tg = _knee_grid(float(t.min()), float(t.max()), self.grid)
        bg = _knee_grid(float(b.min()), float(b.max()), self.grid)
        best = _fit_grid(tg, bg, b, t, d, y, wt)
        if best[1] is None:
            return
        # refine: a 5 x 5 grid between the neighbours of the best knees
        tg2 = _refine(tg, best[2])
        bg2 = _refine(bg, best[3])
        fine = _fit_grid(tg2, bg2, b, t, d, y, wt)
        if fine[1] is not None and fine[0] < best[0]:
            best = fine
        sse, x, t0, b0 = best
        self.coef = (float(x[0]), float(x[1]), float(x[2]), float(x[3]))
        self.knees = (t0, b0)
        self.rmse = math.sqrt(max(sse, 0.0) / m)  # weighted, over cells
        fitted = x[0] + x[1] * np.maximum(t, t0) + d * (x[2] + x[3] * np.maximum(b, b0))
        rel = (y - fitted) / np.maximum(y, 1e-9)
        self.misfit = float(math.sqrt(float(wt @ (rel * rel)) / m))
        self.fitted = True
        self._since_fit = 0

    def _maybe_fit(self) -> None:
        # refit often while samples are few, then every ``refit_every`` samples
        due = min(self.refit_every, max(4, self.n // 4))
        if (not self.fitted or self._since_fit >= due) and self.ready:
            self.fit()

    def ensure_fitted(self) -> bool:
        """Refit when due (as :meth:`predict` does); True when a fitted model exists."""
        self._maybe_fit()
        return self.fitted

    # -- prediction
    def _roofline(self, batch: float, t: float, d: float) -> float:
        c0, ct, cp, cd = self.coef
        t0, b0 = self.knees
        return c0 + ct * (t if t > t0 else t0) + d * (cp + cd * (batch if batch > b0 else b0))

    def batch_factor(self, batch: int) -> float:
        """What the roofline misses at this batch size as a whole: the weighted geometric
        mean of ``cell mean / roofline`` over the cells of this batch (each weighs its fit
        weight), shrunk toward 1 by ``cell_prior``; 1 where the batch has no cell (the level
        of :meth:`residual`).  Why: one roofline over batch 1 and batch 16 misses one of
        them; on the real engine a step verifies the K of the step before and drafts its
        own, so a K tried for one step lands in another K's cell and its own (uniform) cell
        stays empty, priced by the roofline alone.  Measured in the simulator of a served
        test (batch 16 at K = 0, then batch 1, 15 % noisy step times): the roofline priced K
        = 2 at batch 1 at 67-71 ms where it cost 44 and K = 1's own cell 42-45, online held K
        = 1 where K = 4 was 22 % faster (late mean K 1.01 on 2 of 8 seeds; a clean-clone CI
        run held K = 1 on code at batch 1 the same way)."""
        res = self.residual(batch)
        return 1.0 if res is None else math.exp(res[0])

    def residual(self, batch: int) -> tuple[float, dict[float, float], dict[float, float]] | None:
        """What the roofline misses at this batch size, in log ratio ``ln(cell mean /
        roofline)``: the level of :meth:`batch_factor`, plus a part per verify width T and a
        part per drafter passes D fitted to what the level leaves of the batch's cells
        (each cell weighs its fit weight) by ridge least squares toward 0; None where the
        batch has no cell.  A cell without served data is priced ``roofline * exp(level +
        part(T) + part(D))`` (:meth:`_corrected`); a T or D never seen at this batch has
        part 0.  The ridge weighs ``cell_prior`` samples, times ``(noise / PART_SD) ** 2``
        where the cells' noise (:meth:`noise`) is wider than a part is expected to be: a
        one-step cell shows a part only when its noise lets it.

        Why the parts: a K tried for a step or two at a batch lands in mixed cells -- held K
        = 4, a probe of K = 3 at batch 1 times (T 5, D 3) and then (T 4, D 4), never K = 3's
        own (T 4, D 3) -- and the batch's level alone prices K = 3 along the roofline's
        slope in D, which one roofline over batch 1 and batch 16 gets wrong at one of them
        (at code@1 in a paired run K = 3 was priced above K = 4 while fixed K = 3 served
        faster).  The parts carry what the mixed cells measured to the uniform cell: in log,
        ``(4, 3) = (4, 4) + (5, 3) - (5, 4)`` before the shrinking.  Replayed through the
        online steps of a demo's paired server (each decision's prices of K = 0..4 against
        the fixed Ks' measured steps at that batch in the same server), the goodput of the K
        the prices pick with the measured tokens per step rose from 0.946 to 0.949 of the
        best; the simulator's cells (no such misfit there) are unchanged (1.0112, least
        0.985)."""
        rows = self._by_batch.get(batch)
        if not rows or not self.fitted:
            return None
        # the same batch, samples, cells and fit give the same parts: the Ks priced in one
        # decision (predict_uniform) share one fit over the batch's cells
        state = (batch, self.n, len(self._ms), self.coef, self.knees)
        memo = self._residual_memo
        if memo is not None and memo[0] == state:
            return memo[1]
        kt, kd, ms = self._kt, self._kd, self._ms
        c0, ct, cp, cd = self.coef
        t0, b0 = self.knees
        unit = cp + cd * (batch if batch > b0 else b0)  # one drafter pass at this batch
        # the ridge's normal equations built in Python (a few dozen cells, one-hot columns:
        # numpy's calls cost more than the sums), one small solve.  Why: online's decision
        # took 0.47 ms a step against a fixed K's 0.10 in a served engine (batch 4, code
        # prompts, in-process engine timed apart), most of it numpy calls over these cells
        used: list[tuple[float, float, float, float]] = []  # (T, D, ln ratio, weight)
        total = wy = 0.0
        for i in rows:
            t = kt[i]
            model = c0 + ct * (t if t > t0 else t0) + kd[i] * unit  # _roofline()
            if model <= 0.0 or ms[i] <= 0.0:
                continue
            y = math.log(ms[i] / model)
            w = self._cell_weight(i)
            used.append((t, kd[i], y, w))
            total += w
            wy += w * y
        out: tuple[float, dict[float, float], dict[float, float]] | None = None
        if used:
            level = wy / (total + self.cell_prior)
            ts = sorted({u[0] for u in used})
            ds = sorted({u[1] for u in used})
            col_t = {t: j for j, t in enumerate(ts)}
            col_d = {d: len(ts) + j for j, d in enumerate(ds)}
            size = len(ts) + len(ds)
            # a part is believed where the cells' noise lets a few samples show it: the prior
            # weighs as many samples as the noise is wider than a part's expected size
            prior = self.cell_prior * max(1.0, (self.noise() / PART_SD) ** 2)
            a = [[0.0] * size for _ in range(size)]
            for j in range(size):
                a[j][j] = prior
            rhs = [0.0] * size
            for t, d, y, w in used:
                jt, jd = col_t[t], col_d[d]
                a[jt][jt] += w
                a[jd][jd] += w
                a[jt][jd] += w
                a[jd][jt] += w
                r = w * (y - level)
                rhs[jt] += r
                rhs[jd] += r
            theta = np.linalg.solve(np.array(a), np.array(rhs)).tolist()
            out = (level, {t: theta[c] for t, c in col_t.items()},
                   {d: theta[c] for d, c in col_d.items()})
        self._residual_memo = (state, out)
        return out

    def _corrected(self, batch: int, t: int, d: int, model: float) -> float:
        """The price of a step: the model blended with the cell's own recent mean where the
        cell has served data (a cell without is priced by the model times what it misses at
        this batch for this T and D, :meth:`residual`), at today's :attr:`speed`."""
        i = self._cells.get((batch, t, d))
        if i is None or self._seeded[i]:
            res = self.residual(batch)
            if res is not None:
                model *= math.exp(res[0] + res[1].get(float(t), 0.0) + res[2].get(float(d), 0.0))
            return self.speed * model
        return self.speed * (model + (self._ms[i] - model) * self._cell_share(i))

    def cell_samples(self, batch: int, ks: Sequence[int]) -> list[float]:
        """The served samples (count capped at ``cell_cap``, aged) behind the price of each
        K of a uniform batch (:meth:`predict_uniform`'s cells); 0 for a cell without served
        data."""
        dmin = self.draft_min_steps
        out = []
        for k in ks:
            i = self._cells.get((batch, batch * (1 + k), k if k > dmin else dmin))
            out.append(0.0 if i is None or self._seeded[i] else self._cell_weight(i))
        return out

    def _cell_weight(self, i: int) -> float:
        """Cell ``i``'s fit weight: its count capped at ``cell_cap``, aged with the
        half-life ``window`` (:meth:`_weights` for one cell)."""
        n = self._cnt[i]
        if n > self.cell_cap:
            n = self.cell_cap
        return n * 2.0 ** (-((self.n - 1) - self._last[i]) / self.window)

    def _cell_share(self, i: int) -> float:
        """The share of cell ``i``'s own mean in its price: its fit weight (count capped,
        aged) against ``cell_prior``."""
        w = self._cell_weight(i)
        return w / (w + self.cell_prior)

    def predict(self, batch: int, verify_tokens: int, draft_steps: int) -> float | None:
        """Predicted ms of one step (None until :attr:`ready`); the step-cost protocol
        (:class:`~.stepcost.StepCost`), ``draft_steps`` its drafter passes."""
        self._maybe_fit()
        if not self.fitted:
            return None
        return self._corrected(batch, verify_tokens, draft_steps,
                               self._roofline(batch, verify_tokens, draft_steps))

    def predict_grid(
        self, batch: int, verify_tokens: np.ndarray | Sequence[int], draft_passes: np.ndarray | Sequence[int]
    ) -> np.ndarray | None:
        """:meth:`predict` for arrays of candidates (broadcast together): the roofline alone,
        without the per-cell corrections (None until :attr:`ready`).  Two lists of equal
        length are priced in a Python loop (faster than numpy for a handful of candidates,
        the same numbers)."""
        if not self.ensure_fitted():
            return None
        c0, ct, cp, cd = self.coef
        s = self.speed
        t0, b0 = self.knees
        unit = cp + cd * (batch if batch > b0 else b0)  # one drafter pass at this batch
        # speed * (ct * max(T, T0) + (c0 + D * unit))
        if isinstance(verify_tokens, list) and isinstance(draft_passes, list):
            return np.array([s * (ct * (t if t > t0 else t0) + (c0 + d * unit))
                             for t, d in zip(verify_tokens, draft_passes)])
        draft = np.multiply(draft_passes, unit)
        draft += c0
        ms = np.maximum(verify_tokens, t0)
        ms *= ct
        ms += draft
        ms *= s
        return ms

    def support(self, batch: int, ks: Sequence[int]) -> list[float]:
        """How much recent evidence prices each K near this batch size: the summed fit
        weight (count capped, aged) of the served cells with K's drafter passes and a batch
        within a factor ``SUPPORT_SPAN`` of ``batch``, whatever they verified (on the real
        engine a step verifies the K of the step before and drafts its own).  0 for a K
        never timed near this batch while serving (the roofline extrapolates there, or
        only the seeded prior prices it: :meth:`seed`)."""
        # a loop over the near batches' cells: a few dozen cells, where numpy's calls
        # cost more than the sums (see residual())
        by_d: dict[float, float] = {}
        seeded, kd = self._seeded, self._kd
        for b, rows in self._by_batch.items():
            if b * SUPPORT_SPAN >= batch and b <= batch * SUPPORT_SPAN:
                for i in rows:
                    if not seeded[i]:
                        d = kd[i]
                        by_d[d] = by_d.get(d, 0.0) + self._cell_weight(i)
        dmin = self.draft_min_steps
        return [by_d.get(float(k if k > dmin else dmin), 0.0) for k in ks]

    def predict_uniform(self, batch: int, ks: Sequence[int]) -> list[float] | None:
        """Predicted ms for a batch of ``batch`` requests all drafting K, for each K in ks."""
        self._maybe_fit()
        if not self.fitted:
            return None
        c0, ct, cp, cd = self.coef
        t0, b0 = self.knees
        dmin = self.draft_min_steps
        draft_unit = cp + cd * (batch if batch > b0 else b0)
        out = []
        for k in ks:
            t = batch * (1 + k)
            d = k if k > dmin else dmin
            out.append(self._corrected(batch, t, d, c0 + ct * (t if t > t0 else t0) + d * draft_unit))
        return out

    def noise(self) -> float:
        """The relative spread (sd / mean) of a step time around its cell's mean, pooled
        over the cells with two served samples or more (weighted like the fit);
        ``DEFAULT_NOISE`` while none has."""
        key = (self.n, len(self._ms))
        memo = self._noise_memo
        if memo is not None and memo[0] == key:
            return memo[1]
        total = wvar = 0.0
        for i, var in enumerate(self._var):
            if var == var:  # not nan: two samples or more
                w = self._cell_weight(i)
                total += w
                wvar += w * var
        out = math.sqrt(wvar / total) if total > 0 else DEFAULT_NOISE
        self._noise_memo = (key, out)
        return out

    def rel_error(self, batch: int, ks: Sequence[int]) -> list[float]:
        """The relative error (one standard deviation) of :meth:`predict_uniform`'s price
        of each K: a cell with served data is its mean's standard error (the cell's spread
        over its effective sample count) blended, as the prediction is, with the
        roofline's :attr:`misfit`; a K without a cell is priced by the roofline alone and
        is as wrong as the roofline is over the cells.  Why: on the CPU host at batch
        14-16 the predicted ratio of K = 1's price to K = 0's moved by 4 % (sd) from one
        decision to the next as noisy step times entered the cells, and online switched
        between K = 0 and K = 1 on 29 of its 270 decisions there, each switch claiming a
        gain of 1-9 %; the online policy switches only past this error
        (:mod:`.policies.online`, rule 4)."""
        dmin = self.draft_min_steps
        return [self.cell_error(batch, batch * (1 + k), k if k > dmin else dmin) for k in ks]

    def cell_error(self, batch: int, verify_tokens: int, draft_steps: int) -> float:
        """:meth:`rel_error` of :meth:`predict`'s price of one step (any verify width)."""
        self._maybe_fit()
        misfit = self.misfit
        i = self._cells.get((batch, verify_tokens, draft_steps))
        if i is None or self._seeded[i]:
            return misfit
        cnt = self._cnt[i]
        beta = self._cell_share(i)
        var = self._var[i]
        if var != var:  # one sample: the pooled spread
            var = self.noise() ** 2
        n_max = (2.0 - self.cell_weight) / self.cell_weight  # an EWMA's effective samples
        n_eff = cnt if cnt < n_max else n_max
        return math.sqrt(((1.0 - beta) * misfit) ** 2 + beta * beta * var / n_eff)


# ----------------------------------------------------------------------------- confidence


class CatchUpCost:
    """The price of the drafter's catch-up after K = 0 (patch ``drafter-k0``).

    A step that resumes drafting first runs the drafter over every token it missed (the
    prompts that arrived and the tokens produced while K was 0), then drafts; the engine
    leaves that step out of the step-cost model and reports ``(tokens, ms)`` instead
    (``StepResult.catch_up``).  Its cost beyond the model's price of the step's K (0 where a
    resume cost less than predicted) is the catch-up's, modelled as

        ms = fixed + per_token * tokens        (both >= 0)

    fitted by least squares over decayed sums (each new resume weighs ``1 - decay`` of what
    came before).  While the resumes measured do not separate the two parts (fewer than
    ``MIN_RESUMES``, token counts within ``SPREAD_MIN`` relative spread of each other, or a
    price per token within ``SLOPE_SE`` standard errors of 0), the price of another size is
    the geometric mean of the two readings they allow: all fixed (their mean ms whatever the
    size) and all per token (proportional to the size).

    Why the resumes must separate the parts by more than their noise: two resumes always fit
    a line.  In the first online server of a ``bench ab`` run at concurrency 16 (CPU host)
    the first two caught up 5 and 18 tokens, their extra ms a few ms apart by the step
    times' noise, and the line through them (0.5 ms a token) priced the catch-up of a
    700-token K = 0 stretch at 374 ms, 12 ms a decision over ``RESUME_HORIZON``: online held
    K = 0 for 180 decisions at batch 16.  The resumes it did make cost 5-20 ms beyond their
    step whatever they caught up (18-1457 tokens).

    Why the fixed part: on the CPU host a resume's extra pass cost 3-11 ms whether it caught
    up 2 or 130 tokens (a fresh demo server, ``./run.sh demo``), and priced per token from a
    first resume of 7 tokens (8.1 ms) the catch-up of a new request's 128 tokens came to
    193 ms; online left K = 2 for K = 0 over it at batch 1, then paid the catch-up anyway
    two steps later (25.3 ms for the step, 4 ms above its K's price).
    :meth:`price` is None until a resume has been measured."""

    SPREAD_MIN = 0.25  # relative sd of the token counts that tells the two parts apart
    MIN_RESUMES = 3  # resumes before a line is fitted (two always fit one)
    SLOPE_SE = 2.0  # standard errors the price per token must clear

    def __init__(self, decay: float = 0.8) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"catch-up decay must be in [0, 1), got {decay!r}")
        self.decay = decay
        # decayed sums: weight, weight^2, tokens, tokens^2, ms, ms^2, tokens * ms
        self._w = self._ww = self._t = self._tt = self._m = self._mm = self._tm = 0.0
        self.resumes = 0

    def add(self, tokens: int, extra_ms: float) -> None:
        if tokens <= 0 or not math.isfinite(extra_ms):
            return
        t, m, d = float(tokens), max(0.0, float(extra_ms)), self.decay
        self._w = d * self._w + 1.0
        self._ww = d * d * self._ww + 1.0
        self._t = d * self._t + t
        self._tt = d * self._tt + t * t
        self._m = d * self._m + m
        self._mm = d * self._mm + m * m
        self._tm = d * self._tm + t * m
        self.resumes += 1

    def _means(self) -> tuple[float, float]:
        """The decayed mean tokens and ms of the resumes (some must have been measured)."""
        return self._t / self._w, self._m / self._w

    def parts(self) -> tuple[float, float] | None:
        """``(fixed_ms, ms_per_token)`` once the resumes separate them, else None."""
        if self._w <= 0.0 or self.resumes < self.MIN_RESUMES:
            return None
        t_mean, m_mean = self._means()
        var_t = self._tt / self._w - t_mean * t_mean
        if var_t <= (self.SPREAD_MIN * t_mean) ** 2:
            return None
        per_token = (self._tm / self._w - t_mean * m_mean) / var_t
        if per_token <= 0.0:
            return m_mean, 0.0
        # the slope's standard error from the residuals (decayed weights: n_eff resumes)
        n_eff = self._w * self._w / self._ww
        resid = max(0.0, self._mm / self._w - m_mean * m_mean - per_token * per_token * var_t)
        se = math.sqrt(resid / ((n_eff - 2.0) * var_t)) if n_eff > 2.0 else math.inf
        if per_token <= self.SLOPE_SE * se:
            return None
        fixed = m_mean - per_token * t_mean
        if fixed < 0.0:  # through the origin
            return 0.0, self._tm / self._tt
        return fixed, per_token

    def price(self, tokens: int) -> float | None:
        """Predicted ms of catching ``tokens`` up (None: no resume measured yet)."""
        if self._w <= 0.0:
            return None
        t = max(0, int(tokens))
        if t == 0:
            return 0.0
        fit = self.parts()
        if fit is None:
            t_mean, m_mean = self._means()
            return m_mean * math.sqrt(t / t_mean)
        fixed, per_token = fit
        return fixed + per_token * t


class ConfidenceMap:
    """Binned, monotone map from a draft confidence in [0, 1] to acceptance probability.

    Counts per bin are decayed by ``1 - weight`` per step; an empty bin falls back to the
    confidence itself (prior strength ``prior_strength``).  The map is made non-decreasing
    with pool-adjacent-violators when it is refreshed (only when it is not already).
    ``max_requests`` rows per step are learnt from (a rotating subset of the batch), which
    bounds the work: :meth:`update` is a tight Python loop over them, :meth:`update_arrays`
    a few numpy calls every few steps; the table the policies read is refreshed every
    ``REFRESH_EVERY`` updates.
    """

    def __init__(
        self,
        bins: int = 10,
        weight: float = 0.02,
        prior_strength: float = 4.0,
        max_requests: int = 16,
    ) -> None:
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        self.bins = bins
        self.decay = 1.0 - weight
        self.prior_strength = prior_strength
        self.max_requests = max_requests
        # decayed counts per bin: reached (tried) and accepted; a few bins, so plain lists
        # (a step's decay and update cost less than numpy calls)
        self._tried = [0.0] * bins
        self._accepted = [0.0] * bins
        self.samples = 0
        self._offset = 0
        self._prior = ((np.arange(bins) + 0.5) / bins * prior_strength).tolist()
        self._array = (np.arange(bins) + 0.5) / bins
        self._table: list[float] = self._array.tolist()
        self._dirty = 0  # updates since the table was refreshed
        self._waited = 0  # update_arrays calls since its last update (see there)
        self._codes: dict[int, np.ndarray] = {}  # width -> outcome codes (update_arrays)
        self._log_src: np.ndarray | None = None  # the table log_table() was taken from
        self._log = np.zeros(0)
        self._upper: dict[int, np.ndarray] = {}  # width -> upper-triangular ones (log_survival)

    @property
    def tried(self) -> np.ndarray:
        """Decayed number of reached draft positions per bin (a copy)."""
        return np.array(self._tried)

    @property
    def accepted(self) -> np.ndarray:
        """Decayed number of accepted draft positions per bin (a copy)."""
        return np.array(self._accepted)

    def _bin(self, c: float) -> int:
        i = int(c * self.bins)
        return 0 if i < 0 else (self.bins - 1 if i >= self.bins else i)

    def add(self, confidence: float, accepted: bool) -> None:
        """One reached draft position (no decay, no table refresh: see :meth:`update`)."""
        i = self._bin(confidence)
        self._tried[i] += 1.0
        if accepted:
            self._accepted[i] += 1.0
        self.samples += 1

    def _subset(self, n: int, rows: int) -> tuple[int, int]:
        """The next ``min(n, rows)`` rows of a batch of ``n`` (start, count), rotating."""
        start = self._offset % n
        take = min(n, rows)
        self._offset += take
        return start, take

    def _rows(self, n: int, rows: int) -> slice | np.ndarray:
        """:meth:`_subset` as an index into arrays of the batch (a slice unless it wraps)."""
        start, take = self._subset(n, rows)
        if start + take <= n:  # a view, no copy
            return slice(start, start + take)
        return np.arange(start, start + take) % n

    def update(self, results: Sequence[RequestResult]) -> None:
        """Decay, then learn from the results that carry confidences (a tight loop over the
        bounded subset: for at most ``max_requests`` ragged rows it is faster than building
        arrays; :meth:`update_arrays` is the engine's path)."""
        n = len(results)
        if n == 0:
            return
        start, take = self._subset(n, self.max_requests)
        sub = results[start : start + take]
        if len(sub) < take:
            sub = tuple(sub) + tuple(results[: take - len(sub)])
        self._add(*self._count_rows((x.confidences, x.drafted, x.accepted) for x in sub if x.confidences), 1)

    def update_arrays(self, confidences, drafted, accepted) -> None:
        """:meth:`update` from aligned arrays: ``confidences`` of shape (batch, width) (the
        verified drafts' confidences, padding ignored), ``drafted`` and ``accepted`` 1-D
        (validated counts, ``0 <= accepted <= drafted``, as the controller passes them).

        Up to ``2 * max_requests`` requests the rows are counted in the Python loop of
        :meth:`update` (a few rows: cheaper than numpy calls).  From there on a numpy update
        costs about as much for 128 rows as for 16, so it runs once every ``period`` steps
        (``period = min(MAX_PERIOD, batch // max_requests)``) over ``period * max_requests``
        rows with the decay of ``period`` steps: the same rows per step and the same memory
        as an update every step.  Vectorised, every verified position gets an outcome code
        from a table indexed by (drafted, accepted) (not reached / rejected / accepted), and
        one bincount of ``confidence bin + bins * code`` counts them."""
        conf = np.asarray(confidences, dtype=float)
        n = len(conf)
        if n == 0:
            return
        if conf.ndim != 2:
            raise ValueError(f"confidences must be a 2-D (batch, width) array, got shape {conf.shape}")
        period = n // self.max_requests
        if period < 2:
            rows = self._rows(n, self.max_requests)
            triples = zip(conf[rows].tolist(), np.asarray(drafted)[rows].tolist(),
                          np.asarray(accepted)[rows].tolist())
            self._add(*self._count_rows(triples), 1)
            return
        self._waited += 1
        if period > MAX_PERIOD:
            period = MAX_PERIOD
        if self._waited < period:
            return
        steps = self._waited
        self._waited = 0
        rows = self._rows(n, self.max_requests * steps)
        width = conf.shape[1]
        bins = self.bins
        codes = self._codes.get(width)
        if codes is None:
            codes = self._codes[width] = _outcome_codes(width, bins)
        d = np.minimum(np.asarray(drafted)[rows], width)
        a = np.minimum(np.asarray(accepted)[rows], d)
        d *= width + 1
        d += a
        keys = (conf[rows] * bins).astype(np.intp)  # as numpy casts: truncation
        np.clip(keys, 0, bins - 1, out=keys)  # out of range (and non-finite) to the end bins
        keys += codes.take(d, axis=0)
        h = np.bincount(keys.ravel(), minlength=3 * bins).tolist()
        self._add(h[bins : 2 * bins], h[2 * bins :], steps)

    def _count_rows(self, rows) -> tuple[list[int], list[int]]:
        """Rejected and accepted positions per bin of ``(confidences, drafted, accepted)``
        rows: positions ``1..accepted`` accepted, position ``accepted + 1`` rejected when it
        was drafted (and has a confidence)."""
        bins = self.bins
        top = bins - 1
        rejected = [0] * bins
        acc = [0] * bins
        for conf, d, a in rows:
            width = len(conf)
            reach = a + 1 if d > a else d
            if reach > width:
                reach = width
            for j in range(reach):
                x = conf[j] * bins
                # as numpy's float -> int cast: truncation; non-finite values to bin 0
                i = int(x) if -9.2e18 < x < 9.2e18 else 0
                if i > top:
                    i = top
                elif i < 0:
                    i = 0
                if j < a:
                    acc[i] += 1
                else:
                    rejected[i] += 1
        return rejected, acc

    def _add(self, rejected: list[int], acc: list[int], steps: int) -> None:
        """Decay by ``steps`` steps, then add the rejected and the accepted positions."""
        f = self.decay**steps
        self._tried = [x * f + r + y for x, r, y in zip(self._tried, rejected, acc)]
        self._accepted = [x * f + y for x, y in zip(self._accepted, acc)]
        self.samples += sum(rejected) + sum(acc)
        self._dirty += 1

    def _refresh(self) -> None:
        self._dirty = 0
        w = self.prior_strength
        tw = [t + w for t in self._tried]
        vals = [(a + p) / t for a, p, t in zip(self._accepted, self._prior, tw)]
        if not all(map(operator.le, vals, vals[1:])):
            vals = _pav(vals, tw)
        self._table = vals
        self._array = np.array(vals)

    def calibrate(self, confidence: float) -> float:
        """Estimated acceptance probability of a draft token with this confidence."""
        if self._dirty:
            self._refresh()
        return self._table[self._bin(confidence)]

    def table(self) -> tuple[float, ...]:
        if self._dirty:
            self._refresh()
        return tuple(self._table)

    def table_array(self) -> np.ndarray:
        """The confidence map as a numpy array (read-only; bin i covers
        [i/bins, (i+1)/bins)).  The hot path: refreshed once per ``REFRESH_EVERY``
        updates (the counts move by ``weight`` per update, so the map moves slowly)."""
        if self._dirty >= REFRESH_EVERY:
            self._refresh()
        return self._array

    def log_table(self) -> np.ndarray:
        """:func:`log_acceptance` of :meth:`table_array` (recomputed when it is refreshed)."""
        table = self.table_array()
        if table is not self._log_src:
            self._log_src = table
            self._log = log_acceptance(table)
        return self._log

    def log_map(self, confidences: np.ndarray) -> np.ndarray:
        """The calibrated log acceptance of each confidence (out-of-range and NaN confidences
        go to the end bins)."""
        return self.log_table().take((confidences * self.bins).astype(np.intp), mode="clip")

    def log_survival(self, confidences: np.ndarray) -> np.ndarray:
        """Log survival of each row of ``confidences`` (batch, width): at position ``j`` the
        sum of the calibrated log acceptance (:meth:`log_map`) of positions ``1..j``, the
        cumulative sum as one matmul."""
        width = confidences.shape[1]
        upper = self._upper.get(width)
        if upper is None:
            upper = self._upper[width] = np.triu(np.ones((width, width)))
        return self.log_map(confidences) @ upper


REFRESH_EVERY = 2  # updates between refreshes of the table the policies read (table_array)
LOG_FLOOR = -40.0  # per-position floor of a log acceptance (finite: no 0 * inf in matmuls,
# and a survival of exp(8 * -40) stays > 0)


def log_acceptance(p) -> np.ndarray:
    """``ln(p)`` in [LOG_FLOOR, 0]."""
    return np.clip(np.log(np.maximum(p, 1e-300)), LOG_FLOOR, 0.0)
MAX_PERIOD = 8  # update_arrays at a large batch: at most one update per this many steps


def _outcome_codes(width: int, bins: int) -> np.ndarray:
    """Per (drafted, accepted) key ``d * (width + 1) + a``, the key offset of each of the
    ``width`` positions: 0 not reached, ``bins`` rejected (position ``a + 1`` when
    ``d > a``), ``2 * bins`` accepted (positions ``1..a``)."""
    stride = width + 1
    out = np.zeros((stride * stride, width), dtype=np.intp)
    for d in range(stride):
        for a in range(d + 1):
            out[d * stride + a, :a] = 2 * bins
            if d > a:
                out[d * stride + a, a] = bins
    return out


def _pav(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Pool adjacent violators: the weighted non-decreasing fit of ``values``."""
    means: list[float] = []  # one entry per pooled block
    wsum: list[float] = []
    count: list[int] = []
    for v, w in zip(values, weights):
        c = 1
        while means and means[-1] > v:  # merge the previous block into this one
            v1 = means.pop()
            w1 = wsum.pop()
            tw = w1 + w
            v = (v1 * w1 + v * w) / tw
            w = tw
            c += count.pop()
        means.append(v)
        wsum.append(w)
        count.append(c)
    out: list[float] = []
    for v, c in zip(means, count):
        out.extend([v] * c)
    return out
