"""``sweep``: a deterministic K cycle for tests (forces K and K_i changes).

Decision number ``n`` (0, 1, 2, ... counted by this policy) uses ``K = ks[n % len(ks)]``
(``ks`` defaults to ``min_gamma..kmax``).  Per request, the request at index ``i`` of the
batch gets ``K_i = K`` when ``i == 0`` and ``K_i = (n + i) % (K + 1)`` otherwise, so the
batch K is always exactly ``K`` and every per-request value in ``0..K`` occurs once the
batch has more than ``K`` requests.  (With ``min_gamma > 0`` a K_i below it is raised.)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..observations import BatchView, Decision
from .base import Policy, PolicyContext, decision


class SweepPolicy(Policy):
    name = "sweep"
    trusted = True

    def __init__(self, ks: Sequence[int] | None, kmax: int, min_gamma: int = 0) -> None:
        values = list(range(min_gamma, kmax + 1)) if not ks else [int(k) for k in ks]
        for k in values:
            if not min_gamma <= k <= kmax:
                raise ValueError(
                    f"policy 'sweep': K={k} is out of range [{min_gamma}, {kmax}] "
                    f"(min_gamma..kmax)"
                )
        self.ks = values
        self.min_gamma = min_gamma
        self.n = 0
        # K_i dicts for the current batch, by (K, n mod (K+1)): shared between decisions
        # (Decision.k_i is read-only), so a steady batch costs no per-request work
        self._ids: tuple[str, ...] = ()
        self._dicts: dict[tuple[int, int], dict[str, int]] = {}

    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        n = self.n
        self.n += 1
        k = self.ks[n % len(self.ks)]
        ids = batch.req_ids
        k_i: dict[str, int] | None = None
        b = len(ids)
        if b:
            m = k + 1
            r = n % m
            if ids is not self._ids and ids != self._ids:
                self._ids = ids
                self._dicts = {}
            k_i = self._dicts.get((k, r))
            if k_i is None:
                lo = self.min_gamma
                cycle = [v if v > lo else lo for v in range(m)] * 2
                reps = -(-b // m) + 1
                values = (cycle[r:r + m] * reps)[:b]  # values[i] = (n + i) % m
                values[0] = k
                k_i = self._dicts[(k, r)] = dict(zip(ids, values))
        return decision(ctx, k, self.name, f"sweep #{n} k={k}", k_i=k_i, batch_size=len(ids))

    def describe(self) -> dict:
        return {"name": self.name, "ks": list(self.ks)}
