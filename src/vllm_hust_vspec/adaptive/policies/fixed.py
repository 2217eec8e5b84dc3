"""``fixed``: a constant K (what users run today with ``num_speculative_tokens``)."""

from __future__ import annotations

from ..observations import BatchView, Decision
from .base import Policy, PolicyContext, decision


class FixedPolicy(Policy):
    name = "fixed"
    trusted = True

    def __init__(self, k: int, kmax: int, min_gamma: int = 0) -> None:
        if not min_gamma <= k <= kmax:
            raise ValueError(
                f"policy 'fixed': K={k} is out of range [{min_gamma}, {kmax}] "
                f"(min_gamma..kmax)"
            )
        self.k = k
        self._reason = f"fixed k={k}"

    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        return decision(ctx, self.k, self.name, self._reason, batch_size=len(batch.req_ids))

    def describe(self) -> dict:
        return {"name": self.name, "k": self.k}
