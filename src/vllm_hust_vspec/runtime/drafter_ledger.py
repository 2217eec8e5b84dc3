"""The engine's account of the drafter's K = 0 skips and catch-ups (the ``drafter-k0`` patch).

The drafter lives in the workers; the decision trace is written here.  The rule the worker
follows (``runtime/drafter_sync.py``) needs only what the scheduler knows, so the engine
keeps the same account: a step that drafts K = 0 runs no drafter forward; a step that drafts
K > 0 first catches each of its requests up from the first position without drafter KV to
its first input position; after a drafting step a request's drafter KV is valid below its
computed tokens.  Each step with a skip or a catch-up adds a record to the decision trace::

    {"step": s, "drafter": {"skipped": 0 | 1, "caught_up": tokens}}

``tests/host/test_k0_skip.py`` checks these counts against the worker's.  Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def restarted(scheduler_output: Any) -> set[str]:
    """The requests a step (re)starts: new ones, and ones resumed after preemption (their
    blocks are new; what the drafter had written for them is gone).  Their account starts
    again at 0 (:func:`missed_from` of None), wherever their first position is: a request
    recomputed past its old ``synced`` while the drafter sat out is caught up from 0."""
    out = {r.req_id for r in scheduler_output.scheduled_new_reqs}
    out.update(scheduler_output.scheduled_cached_reqs.resumed_req_ids)
    return out


def missed_from(synced: int | None, first: int) -> int:
    """The first position without valid drafter KV of a request whose step starts at
    ``first``, once some step was skipped: its ``synced`` count (0 when unseen), or 0 when
    it restarts below it (recomputed after preemption: its blocks are new).  The positions
    ``missed_from(...)..first-1`` are caught up.  The one rule of the worker (drafter_sync)
    and of this account."""
    s = 0 if synced is None else synced
    return 0 if s > first else s


class DrafterLedger:
    def __init__(self) -> None:
        self.synced: dict[str, int] = {}
        self.ever_skipped = False
        self.steps_skipped = 0
        self.tokens_caught_up = 0
        self._first: dict[str, int] = {}

    def pending(self, running: Any) -> int:
        """Drafter tokens a step drafting K > 0 for every one of ``running`` (requests with
        ``request_id`` and ``num_computed_tokens``) would catch up first: per request, its
        first input position (its computed tokens when the step is scheduled) less the
        first position without drafter KV.  0 until some step was skipped."""
        if not self.ever_skipped:
            return 0
        total = 0
        for r in running:
            p0 = int(r.num_computed_tokens)
            total += p0 - missed_from(self.synced.get(r.request_id), p0)
        return total

    def before(self, requests: Mapping[str, Any], scheduler_output: Any) -> None:
        """The step's requests and their first input positions (their computed tokens before
        the step: ``_update_after_schedule`` already added the scheduled ones)."""
        for rid in restarted(scheduler_output):
            self.synced.pop(rid, None)
        scheduled = scheduler_output.num_scheduled_tokens
        self._first = {}
        for rid, n in scheduled.items():
            request = requests.get(rid)
            if request is not None:
                self._first[rid] = int(request.num_computed_tokens) - int(n)

    def after(self, step: int, k_drafted: int, requests: Mapping[str, Any]) -> dict | None:
        """After the step's output: its record, or None when it skipped and caught up nothing."""
        if k_drafted == 0:
            self.ever_skipped = True
            self.steps_skipped += 1
            return {"step": step, "drafter": {"skipped": 1, "caught_up": 0}}
        caught = 0
        for rid, p0 in self._first.items():
            if self.ever_skipped:
                caught += p0 - missed_from(self.synced.get(rid), p0)
            request = requests.get(rid)
            if request is not None and not request.is_finished():
                self.synced[rid] = int(request.num_computed_tokens)
            else:
                self.synced.pop(rid, None)
        self._first = {}
        if len(self.synced) > 2 * max(len(requests), 8):
            self.synced = {r: v for r, v in self.synced.items() if r in requests}
        self.tokens_caught_up += caught
        return {"step": step, "drafter": {"skipped": 0, "caught_up": caught}} if caught else None
