"""The policy interface and the context every policy gets.

A :class:`Policy` turns a :class:`~..observations.BatchView` into a
:class:`~..observations.Decision`.  It reads the shared estimators through
:class:`PolicyContext` (acceptance per position, the online step-cost model, the
confidence map), and may keep its own state in :meth:`Policy.observe`.

Contract for implementations (also the sim helper's ``budget`` and ``profile``):
  * ``decide`` returns ``k`` in ``[ctx.min_gamma, ctx.kmax]``; when ``k_i`` is given, every
    value is in ``[0, ctx.kmax]`` and ``k == max(k_i.values())`` (the controller checks).
  * ``decide`` is called once per decision (every ``control_interval`` steps) and must be
    cheap: no per-request Python work unless the policy is per-request by nature.
  * helpers here (:func:`goodput_table`, :func:`decision`) are for reuse.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..estimators import AcceptanceEstimator, CatchUpCost, ConfidenceMap, StepCostModel
from ..observations import BatchView, Decision, StepResult


@dataclass
class PolicyContext:
    """Shared state handed to every policy call (owned by the controller)."""

    kmax: int
    min_gamma: int
    acceptance: AcceptanceEstimator
    cost: StepCostModel
    confidence_map: ConfidenceMap
    rng: np.random.Generator
    hysteresis: float = 0.01
    switch_error: float = 0.5  # online, budget: cost-error standard deviations a switch must clear
    max_gamma_step: int = 8
    exploration: float = 0.01
    warmup_samples: int = 2
    decisions: int = 0  # decisions made so far (controller-maintained)
    last_k: int | None = None  # the previous decision's batch K
    # (result, drafted total) of the StepResult being observed, set by the controller
    # before Policy.observe so policies need not count the requests again
    step_counts: tuple[StepResult, int] | None = None
    extras: dict = field(default_factory=dict)  # free slot for policies' shared data
    catch_up: CatchUpCost = field(default_factory=CatchUpCost)  # a resume's drafter pass

    @property
    def candidates(self) -> range:
        return range(self.min_gamma, self.kmax + 1)


class Policy(ABC):
    """One way of choosing K.  Subclasses set :attr:`name`."""

    name: str = ""
    # True only for the built-in policies, whose K_i are valid by construction (the
    # controller then skips the O(batch) K_i check)
    trusted: bool = False
    # True where the controller may cut the first drafts of requests that join the batch
    # (adaptive/first_drafts.py): the adaptive policies; a fixed K drafts K for everyone
    cuts_first_drafts: bool = False

    @abstractmethod
    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        """Choose the batch K (and optionally per-request K_i) for the next draft."""

    def observe(self, result: StepResult, ctx: PolicyContext) -> None:  # noqa: B027
        """Learn from one step's results (the shared estimators are already updated)."""

    def describe(self) -> dict:
        """Settings of this policy for the decision-trace header."""
        return {"name": self.name}


def decision(
    ctx: PolicyContext,
    k: int,
    policy: str,
    reason: str,
    k_i: dict[str, int] | None = None,
    batch_size: int | None = None,
) -> Decision:
    """Build a :class:`Decision` with the current estimates attached."""
    est_cost = None
    if batch_size:
        costs = ctx.cost.predict_uniform(batch_size, (k,))
        est_cost = None if costs is None else costs[0]
    return Decision(
        k=k,
        k_i=k_i,
        policy=policy,
        reason=reason,
        est_accept=ctx.acceptance.estimate(),
        est_cost_ms=est_cost,
    )


def goodput_table(
    ctx: PolicyContext, batch_size: int, ks: Sequence[int]
) -> tuple[list[float], list[float]] | None:
    """Expected committed tokens per ms for each K in ``ks`` (batch-uniform K), and the
    predicted step costs; None while the cost model has too few samples, or prices a step
    at no positive finite time (no step is free: a goodput of +inf would win every
    comparison, as it did once when a fit priced K = 0 at 0 ms)."""
    costs = ctx.cost.predict_uniform(batch_size, ks)
    if costs is None or not all(c > 0.0 and math.isfinite(c) for c in costs):
        return None
    expected = ctx.acceptance.expected_committed()
    gp = [batch_size * expected[k] / c for k, c in zip(ks, costs)]
    return gp, costs
