"""``profile``: the online objective priced by an offline latency profile, corrected online.

For the batch size B and each candidate K::

    goodput(K) = B * E(K) / (profile_ms(B, K, context) * factor(B, K))

``E(K)`` comes from the shared acceptance estimator (as in ``online``); ``profile_ms`` is the
profile's target + draft forward model (:meth:`~..profile.Profile.step_ms`, ``context`` the
batch's summed context lengths). ``factor`` is the online correction: after every timed step,
``factor(bucket(B), K) <- EWMA(0.2) of clamp(observed / predicted, 0.1, 10)`` with
``bucket(B)`` the power of two >= B; an unseen (bucket, K) uses the factor of K in the
nearest bucket(s) that ran K (mean on a tie), then the bucket's mean factor, then the mean over everything,
then 1.

Decision rule as ``online`` (switch only past ``hysteresis``, at most ``max_gamma_step`` per
decision), but exploration is cheap: every ``round(1 / exploration)``-th decision runs a
neighbour of the held K, alternately one deeper (the next position's acceptance and its
correction) and one shallower (its correction); the profile prices the rest. A held K = 0
probes K = 1, so speculation always resumes. A profile's ``batch_gamma_policy`` (schema_version 1 profiles carry one) is the
preferred K for the batch bucket: the policy keeps it unless another K is better by more than
``hysteresis``. ``initial_gamma`` is the starting K. No warm-up is needed for the cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..observations import BatchView, Decision, StepResult
from ..profile import Profile, load_profile
from .base import Policy, PolicyContext
from .registry import register_policy

CORRECTION_WEIGHT = 0.2
CLAMP = (0.1, 10.0)


def _bucket(b: int) -> int:
    return 1 << max(0, (b - 1).bit_length())


class ProfilePolicy(Policy):
    name = "profile"

    def __init__(self, profile: Profile, kmax: int, min_gamma: int = 0, source: str | None = None) -> None:
        if not 0 <= min_gamma <= kmax:
            raise ValueError(f"policy 'profile': min_gamma={min_gamma} not in [0, {kmax}]")
        if profile.max_speculative_tokens is not None and profile.max_speculative_tokens < kmax:
            raise ValueError(
                f"policy 'profile': profile {source or ''} key 'max_speculative_tokens' = "
                f"{profile.max_speculative_tokens} is smaller than kmax={kmax}"
            )
        self.profile = profile
        self.source = source
        self.kmax = kmax
        self.candidates = list(range(min_gamma, kmax + 1))
        start = profile.initial_gamma if profile.initial_gamma is not None else kmax
        self.held = min(max(start, min_gamma), kmax)
        self.n = 0
        self.probes = 0
        self.factors: dict[tuple[int, int], float] = {}  # (bucket, K) -> correction
        self._by_k: dict[int, dict[int, float]] = {}  # K -> bucket -> correction
        self._by_b: dict[int, dict[int, float]] = {}  # bucket -> K -> correction
        # context lengths only matter when a component has a context coefficient
        self._uses_context = profile.target.alpha != 0.0 or profile.draft.alpha != 0.0
        # (batch, context, draft_min_steps) -> the profile's uncorrected cost per candidate
        self._base: dict[tuple[int, float, int], list[float]] = {}

    # ------------------------------------------------------------------ correction
    def factor(self, bucket: int, k: int) -> float:
        return self._factors(bucket, (k,))[0]

    def _factors(self, bucket: int, ks: list[int] | tuple[int, ...]) -> list[float]:
        """:meth:`factor` for several K of one bucket (the fallbacks computed once)."""
        factors = self.factors
        by_k = self._by_k
        out = []
        same_b_mean = overall = None
        bits = bucket.bit_length()
        for k in ks:
            f = factors.get((bucket, k))
            if f is None:
                by_bucket = by_k.get(k)
                if by_bucket:  # the nearest batch bucket(s) that ran this K
                    dist = min(abs(bk.bit_length() - bits) for bk in by_bucket)
                    near = [v for bk, v in by_bucket.items() if abs(bk.bit_length() - bits) == dist]
                    f = sum(near) / len(near)
                else:
                    if same_b_mean is None:
                        same_b = self._by_b.get(bucket)
                        same_b_mean = sum(same_b.values()) / len(same_b) if same_b else math.nan
                    if same_b_mean == same_b_mean:  # not NaN: the bucket ran some K
                        f = same_b_mean
                    elif factors:
                        if overall is None:
                            overall = sum(factors.values()) / len(factors)
                        f = overall
                    else:
                        f = 1.0
            out.append(f)
        return out

    def observe(self, result: StepResult, ctx: PolicyContext) -> None:
        ms = result.wall_ms
        b = result.batch_size
        # the correction is per K: a step that verified one K and drafted another is neither
        if ms is None or b <= 0 or result.drafted_k != result.k_verified:
            return
        context = 0
        counted = ctx.step_counts
        if result.drafted is None and not result.results:
            return
        if counted is not None and counted[0] is result:  # the controller counted already
            drafted = counted[1]
        elif result.drafted is not None:
            drafted = int(np.sum(result.drafted))
        else:
            drafted = sum([r.drafted for r in result.results])
        if self._uses_context:
            if result.drafted is None:
                context = sum([r.context_len for r in result.results])
            elif result.context_lens is not None:
                context = int(np.sum(result.context_lens))
        predicted = self.profile.step_ms(
            b, result.k_verified, context, batched_tokens=b + drafted,
            draft_steps=result.k_verified if result.num_draft_steps is None else result.num_draft_steps,
        )
        if predicted <= 0 or not math.isfinite(ms):
            return
        ratio = min(max(ms / predicted, CLAMP[0]), CLAMP[1])
        key = (_bucket(b), result.k_verified)
        old = self.factors.get(key)
        new = ratio if old is None else old + CORRECTION_WEIGHT * (ratio - old)
        self.factors[key] = new
        self._by_k.setdefault(key[1], {})[key[0]] = new
        self._by_b.setdefault(key[0], {})[key[1]] = new

    # ------------------------------------------------------------------ policy
    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        n = self.n
        self.n += 1
        b = len(batch.req_ids)
        cands = self.candidates
        est = ctx.acceptance.estimate()
        if ctx.exploration > 0:
            spacing = max(1, round(1.0 / ctx.exploration))
            if n % spacing == spacing - 1:
                # a neighbour of the held K, alternately one deeper (the next position's
                # acceptance and correction) and one shallower (that K's correction)
                self.probes += 1
                up = self.probes % 2 == 1 or self.held == cands[0]
                k = min(self.held + 1, cands[-1]) if up else self.held - 1
                return Decision(k, None, self.name, f"probe k={k} (every {spacing})", est, None)
        if b == 0:
            return Decision(self.held, None, self.name, "empty batch: hold", est, None)
        context = float(sum(batch.context_lens)) if batch.context_lens and self._uses_context else 0.0
        expected = ctx.acceptance.expected_committed()
        bucket = _bucket(b)
        dmin = ctx.cost.draft_min_steps
        key = (b, context, dmin)
        base = self._base.get(key)
        if base is None:  # the profile is immutable: its prices are cached per (B, context)
            if len(self._base) > 256:
                self._base.clear()
            step_ms = self.profile.step_ms
            base = self._base[key] = [step_ms(b, k, context, draft_steps=max(k, dmin)) for k in cands]
        costs = [c * f for c, f in zip(base, self._factors(bucket, cands))]
        gp = [b * expected[k] / c if c > 0 else math.inf for k, c in zip(cands, costs)]
        lo = cands[0]
        best = max(range(len(gp)), key=gp.__getitem__) + lo  # the first (smallest K) on a tie
        preferred = self.profile.preferred_gamma(b)
        anchor = self.held
        if preferred is not None and lo <= preferred <= cands[-1]:
            anchor = preferred
        g_anchor = gp[anchor - lo]
        if best == anchor or gp[best - lo] <= g_anchor * (1.0 + ctx.hysteresis):
            target = anchor
            why = f"hold k={anchor}" + (" (profile batch policy)" if anchor == preferred else "")
        else:
            target = best
            why = f"best k={best} +{gp[best - lo] / g_anchor - 1.0:.1%} over k={anchor}" if g_anchor > 0 else f"best k={best}"
        step = ctx.max_gamma_step
        k = self.held + max(-step, min(step, target - self.held))
        if k != target:
            why += f", stepping {self.held}->{k}"
        self.held = k
        return Decision(k, None, self.name, why + " (profile)", est, costs[k - lo])

    def describe(self) -> dict:
        return {"name": self.name, "profile": self.source, "schema_version": self.profile.schema_version}


def _factory(arg: str | None, kmax: int, cfg: Mapping[str, Any]) -> Policy:
    path = arg or cfg.get("profile")
    if not path:
        raise ValueError(
            "policy 'profile' needs a latency profile: 'profile:PATH' or the adaptive_profile option "
            "(write one with vllm-hust-vspec-fit-profile)"
        )
    return ProfilePolicy(load_profile(path), kmax, int(cfg.get("min_gamma", 0)), source=str(path))


register_policy("profile", _factory)
