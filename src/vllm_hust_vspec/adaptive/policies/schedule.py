"""``schedule``: a batch-size -> K table with the semantics of vLLM's
``num_speculative_tokens_per_batch_size`` (vLLM 0.32,
``vllm/v1/spec_decode/dynamic/utils.py: build_dynamic_sd_schedule_lookup``):

* the table is a list of inclusive batch-size ranges ``LO-HI:K`` (text form
  ``'1-4:4,5-32:2'``; a single number ``'8:1'`` is the range 8-8);
* ranges must not overlap and the first must start at 1 (vLLM refuses otherwise);
* a gap between two ranges carries the previous range's K forward, and batch sizes after
  the last range use the last K (vLLM fills up to ``max_num_seqs``; we carry it to any size);
* K is capped at Kmax by vLLM; here a K above Kmax is refused as a configuration error,
  since the launcher's ``--gamma`` is Kmax and a larger K cannot have been meant.

A K below ``min_gamma`` is raised to ``min_gamma`` (the controller's range wins).
The table is parsed and checked by the one schedule parser,
:func:`vllm_hust_vspec.settings.parse_schedule` (text and the host's table alike).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...settings import parse_schedule
from ..observations import BatchView, Decision
from .base import Policy, PolicyContext, decision


class SchedulePolicy(Policy):
    name = "schedule"
    trusted = True

    def __init__(
        self, table: str | Sequence[Sequence[int]], kmax: int, min_gamma: int = 0
    ) -> None:
        self.table = parse_schedule(table, "policy 'schedule'", kmax)
        self.min_gamma = min_gamma
        # dense lookup up to the last configured batch size; beyond it: the last K
        last_end = self.table[-1][1]
        dense = [0] * (last_end + 1)
        prev_k = self.table[0][2]
        nxt = 1
        for lo, hi, k in self.table:
            for b in range(nxt, lo):  # gap: carry the previous K
                dense[b] = prev_k
            for b in range(lo, hi + 1):
                dense[b] = k
            nxt = hi + 1
            prev_k = k
        self._dense = [max(k, min_gamma) for k in dense]
        self._tail = max(self.table[-1][2], min_gamma)
        self._reasons = [f"table B={b} -> k={k}" for b, k in enumerate(self._dense)]

    def lookup(self, batch_size: int) -> int:
        """K for a batch size (batch size 0 looks up 1)."""
        b = batch_size if batch_size > 0 else 1
        return self._dense[b] if b < len(self._dense) else self._tail

    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        b = len(batch.req_ids)
        k = self.lookup(b)
        reason = self._reasons[b] if 0 < b < len(self._reasons) else f"table B={b} -> k={k}"
        return decision(ctx, k, self.name, reason, batch_size=b)

    def describe(self) -> dict:
        return {"name": self.name, "table": [list(e) for e in self.table]}
