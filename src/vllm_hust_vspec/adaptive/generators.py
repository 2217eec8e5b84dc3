"""Synthetic trace generators for the simulator.

Every kind writes the true conditional acceptance ``p[t]`` per output position ``t`` and
samples ``accept_len[t]`` from it (position ``j`` accepted with probability ``p[t][j]`` given
``j - 1`` accepted). The acceptance model is the same for every kind::

    logit p[t][j] = logit(q_r) - decay_r * (j - 1) + s_r(t) + shift(kind, r, t)

with ``q_r`` the request's first-position acceptance, ``decay_r`` how fast acceptance falls
with draft position, ``s_r(t)`` a slowly varying AR(1) local difficulty (easy and hard
stretches of text) and ``shift`` what makes each kind different:

``stationary-high`` / ``stationary-low``
    high (q ~ 0.85) / low (q ~ 0.45) acceptance; Poisson arrivals at 1.5x the rough
    full-batch capacity (a saturated server, then the drain) at one ``max_num_seqs`` per
    seed (2, 8 or 32).
``falling``
    saturated, batch 16; acceptance falls along every request's output (the draft degrades
    as context grows).
``hetero``
    saturated, 480 requests, batch 48 (compute-bound verification, where per-request K
    matters); half the requests easy, half hard, mixed in one batch; carries an informative
    draft confidence ``conf[t][j]`` (the true ``p`` seen through logit noise, sd 0.6).
``phase``
    long requests at 0.85x capacity whose acceptance regime switches between high and low
    every 5-10 s of (estimated) wall time, i.e. every few hundred steps, for the whole batch.
``ramp``
    Poisson arrivals whose rate rises linearly to 1.4x the full-batch capacity and falls
    back to 0, so the running batch goes 1 -> max_num_seqs -> 1.
``noisy``
    Poisson arrivals at ~60% of capacity (load fluctuates), strongly varying local
    difficulty and 30% step-time noise.

The step cost is the example roofline of the trace format with every coefficient scaled by
a factor in [0.8, 1.25] per seed; ``draft_min_steps`` is 0 or 1 (vLLM 0.32 runs one draft
forward at K=0). Nothing here looks at any policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .simulate import CostSpec, Trace, TraceHeader, TraceRequest

KINDS = ("stationary-high", "stationary-low", "falling", "hetero", "phase", "ramp", "noisy")
KMAX = 8
DECIMALS = 4

_BASE_COST = {
    "bias_ms": 3.0,
    "target_mem_ms": 18.0,
    "target_token_ms": 0.3,
    "draft_mem_ms": 1.2,
    "draft_token_ms": 0.05,
}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p: float | np.ndarray) -> float | np.ndarray:
    return np.log(p) - np.log1p(-p)


def _cost(rng: np.random.Generator, noise: float) -> CostSpec:
    jitter = {k: round(v * float(rng.uniform(0.8, 1.25)), 4) for k, v in _BASE_COST.items()}
    return CostSpec(draft_min_steps=int(rng.integers(0, 2)), noise=noise, **jitter)


def _ar1(rng: np.random.Generator, n: int, rho: float, sigma: float) -> np.ndarray:
    """Stationary AR(1) with marginal std ``sigma``."""
    eps = rng.normal(0.0, sigma * math.sqrt(1.0 - rho * rho), n)
    out = np.empty(n)
    x = rng.normal(0.0, sigma)
    for i in range(n):
        x = rho * x + eps[i]
        out[i] = x
    return out


@dataclass(frozen=True)
class _Req:
    """What a kind decides for one request before positions are filled in."""

    arrival_s: float
    length: int
    q: float
    decay: float
    shift: Callable[[np.ndarray], np.ndarray] | None = None  # t -> logit shift


def _materialise(
    rng: np.random.Generator,
    specs: list[_Req],
    kmax: int,
    rho: float,
    sigma: float,
    conf_noise: float | None,
) -> list[TraceRequest]:
    out = []
    j = np.arange(kmax)
    for i, r in enumerate(specs):
        t = np.arange(r.length)
        base = _logit(min(max(r.q, 1e-3), 1 - 1e-3)) + _ar1(rng, r.length, rho, sigma)
        if r.shift is not None:
            base = base + r.shift(t)
        logits = base[:, None] - r.decay * j[None, :]
        p = np.round(_sigmoid(logits), DECIMALS)
        # accept position j+1 given j accepted; accept_len = leading successes
        success = rng.random((r.length, kmax)) < p
        accept_len = np.where(success.all(axis=1), kmax, np.argmin(success, axis=1)).astype(np.int64)
        conf = None
        if conf_noise is not None:
            conf = np.round(_sigmoid(logits + rng.normal(0.0, conf_noise, logits.shape)), DECIMALS)
        out.append(TraceRequest(f"r{i}", round(r.arrival_s, 6), accept_len, p, conf))
    return out


def _lengths(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    """Log-normal output lengths (sigma 0.5) with the given mean, at least 8 tokens."""
    sigma = 0.5
    mu = math.log(mean) - sigma * sigma / 2
    return np.maximum(8, np.round(rng.lognormal(mu, sigma, n))).astype(int)


def _capacity_rps(cost: CostSpec, batch: int, mean_len: float, q: float) -> float:
    """Rough requests/s the host sustains at a full batch of ``batch`` with K=1."""
    step_s = cost.step_ms(batch, 1, 2 * batch) / 1000.0
    return batch * (1.0 + q) / step_s / mean_len


def _saturated(
    rng: np.random.Generator, cost: CostSpec, max_num_seqs: int, mean_len: float, q: float, n: int
) -> list[tuple[float, int]]:
    """``n`` (arrival, length) pairs arriving as a Poisson stream at 1.5x the (rough) full-batch
    capacity: a steady, saturated server (full batch, a slowly growing queue) that drains
    at the end."""
    rate = 1.5 * _capacity_rps(cost, max_num_seqs, mean_len, q)
    arrivals = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    lens = _lengths(rng, n, mean_len)
    return [(float(a), int(x)) for a, x in zip(arrivals, lens)]


def _poisson_arrivals(rng: np.random.Generator, rate: Callable[[float], float], rate_max: float,
                      duration: float) -> list[float]:
    """Thinned Poisson process on [0, duration]."""
    out = []
    t = 0.0
    while True:
        t += rng.exponential(1.0 / rate_max)
        if t > duration:
            return out
        if rng.random() * rate_max <= rate(t):
            out.append(t)


@dataclass(frozen=True)
class _Layout:
    """What a kind decides for the whole trace: the batch limit, the requests and the
    local-difficulty process (AR(1) ``rho`` and ``sigma``; ``conf_noise`` None: no draft
    confidence)."""

    max_num_seqs: int
    specs: list[_Req]
    rho: float = 0.97
    sigma: float = 0.5
    conf_noise: float | None = None


def _count(n: float, scale: float) -> int:
    return max(1, int(round(n * scale)))


def _stationary(kind: str, rng: np.random.Generator, cost: CostSpec, scale: float) -> _Layout:
    hi = kind == "stationary-high"
    max_num_seqs = int(rng.choice([2, 8, 32]))
    mean_len = 320.0
    q_mean = 0.85 if hi else 0.45
    specs = []
    for a, length in _saturated(rng, cost, max_num_seqs, mean_len, q_mean, _count(8 * max_num_seqs, scale)):
        q = rng.beta(17, 3) if hi else rng.beta(9, 11)
        decay = rng.uniform(0.05, 0.2) if hi else rng.uniform(0.1, 0.35)
        specs.append(_Req(a, length, float(q), float(decay)))
    return _Layout(max_num_seqs, specs)


def _falling(kind: str, rng: np.random.Generator, cost: CostSpec, scale: float) -> _Layout:
    max_num_seqs = 16
    specs = []
    for a, length in _saturated(rng, cost, max_num_seqs, 480.0, 0.7, _count(96, scale)):
        drop = rng.uniform(2.0, 3.5)
        specs.append(
            _Req(a, length, float(rng.beta(18, 3)), float(rng.uniform(0.05, 0.2)),
                 lambda t, d=drop, L=length: -d * t / max(L - 1, 1))
        )
    return _Layout(max_num_seqs, specs)


def _hetero(kind: str, rng: np.random.Generator, cost: CostSpec, scale: float) -> _Layout:
    max_num_seqs = 48
    specs = []
    for a, length in _saturated(rng, cost, max_num_seqs, 256.0, 0.6, _count(480, scale)):
        easy = rng.random() < 0.5
        q = rng.beta(19, 2) if easy else rng.beta(2, 6)
        decay = rng.uniform(0.02, 0.15) if easy else rng.uniform(0.2, 0.5)
        specs.append(_Req(a, length, float(q), float(decay)))
    return _Layout(max_num_seqs, specs, conf_noise=0.6)


def _phase(kind: str, rng: np.random.Generator, cost: CostSpec, scale: float) -> _Layout:
    max_num_seqs = 16
    mean_len = 1200.0
    q_mean = 0.67
    n = _count(40, scale)
    rate = 0.85 * _capacity_rps(cost, max_num_seqs, mean_len, q_mean)
    arrivals = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    lens = _lengths(rng, n, mean_len)
    # regimes follow wall-clock time: a token's time is estimated from its request's
    # arrival and a nominal per-token time at a near-full batch
    tok_s = cost.step_ms(max_num_seqs, 2, 3 * max_num_seqs) / 1000.0 / (1.0 + q_mean + q_mean**2)
    horizon = float(arrivals[-1] + lens.max() * tok_s) + 1.0
    edges = np.cumsum(rng.uniform(5.0, 10.0, size=int(horizon / 5.0) + 2))
    first_high = bool(rng.random() < 0.5)
    amp = float(rng.uniform(1.2, 2.0))
    specs = []
    for i in range(n):

        def regime(t: np.ndarray, a0: float = float(arrivals[i])) -> np.ndarray:
            block = np.searchsorted(edges, a0 + t * tok_s, side="right")
            return np.where((block % 2 == 0) == first_high, amp, -amp)

        specs.append(
            _Req(float(arrivals[i]), int(lens[i]), float(rng.beta(6, 3)), float(rng.uniform(0.05, 0.25)), regime)
        )
    return _Layout(max_num_seqs, specs)


def _ramp(kind: str, rng: np.random.Generator, cost: CostSpec, scale: float) -> _Layout:
    max_num_seqs = 32
    mean_len = 256.0
    q = 0.75
    peak = 1.4 * _capacity_rps(cost, max_num_seqs, mean_len, q)
    duration = 24.0 * scale

    def rate(t: float) -> float:
        return peak * (1.0 - abs(2.0 * t / duration - 1.0))

    arrivals = _poisson_arrivals(rng, rate, peak, duration) or [0.0]
    lens = _lengths(rng, len(arrivals), mean_len)
    specs = [_Req(a, int(lens[i]), float(rng.beta(9, 3)), float(rng.uniform(0.05, 0.3)))
             for i, a in enumerate(arrivals)]
    return _Layout(max_num_seqs, specs)


def _noisy(kind: str, rng: np.random.Generator, cost: CostSpec, scale: float) -> _Layout:
    max_num_seqs = 32
    mean_len = 256.0
    lam = 0.6 * _capacity_rps(cost, max_num_seqs, mean_len, 0.65)
    duration = 14.0 * scale
    arrivals = _poisson_arrivals(rng, lambda _t: lam, lam, duration) or [0.0]
    lens = _lengths(rng, len(arrivals), mean_len)
    specs = [_Req(a, int(lens[i]), float(rng.beta(6, 3)), float(rng.uniform(0.05, 0.3)))
             for i, a in enumerate(arrivals)]
    return _Layout(max_num_seqs, specs, rho=0.8, sigma=1.2)


# kind -> its layout (each draws from the trace's generator, after the cost, in this order)
_LAYOUTS: dict[str, Callable[[str, np.random.Generator, CostSpec, float], _Layout]] = {
    "stationary-high": _stationary,
    "stationary-low": _stationary,
    "falling": _falling,
    "hetero": _hetero,
    "phase": _phase,
    "ramp": _ramp,
    "noisy": _noisy,
}


def generate(kind: str, seed: int = 0, scale: float = 1.0) -> Trace:
    """Generate a trace of ``kind`` (see :data:`KINDS`); ``scale`` multiplies its size."""
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    rng = np.random.default_rng([KINDS.index(kind), seed])
    kmax = KMAX
    noise = 0.3 if kind == "noisy" else 0.05
    cost = _cost(rng, noise)
    layout = _LAYOUTS[kind](kind, rng, cost, scale)
    requests = _materialise(rng, layout.specs, kmax, layout.rho, layout.sigma, layout.conf_noise)
    header = TraceHeader(
        kmax=kmax,
        max_num_seqs=layout.max_num_seqs,
        cost=cost,
        seed=seed,
        meta={"generator": kind, "generator_seed": seed, "scale": scale},
    )
    return Trace(header, tuple(requests), f"<generated {kind} seed={seed}>")
