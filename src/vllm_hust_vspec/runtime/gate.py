"""The decision gate: each step's K and the per-request limits K_i, from the controller.

Two places decide (see :mod:`vllm_hust_vspec.runtime.engine` for the step timeline):

* ``schedule()`` of step ``s`` asks :meth:`DecisionGate.decide` for the batch draft depth;
* with draft confidences, ``update_draft_token_ids`` of step ``s`` brings the drafts of step
  ``s`` and :meth:`DecisionGate.decide_from_drafts` makes the decision of step ``s + 1``
  there; the next :meth:`decide` takes it instead of asking the controller again.

The limits of the latest decision cut the drafts as they arrive (:meth:`trim`) and the
placeholders of async scheduling (:meth:`limit`).  Pure Python + numpy, no vLLM import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vllm_hust_vspec.adaptive.observations import BatchView, Decision, ki_array


@dataclasses.dataclass(frozen=True)
class GateDecision:
    """What one step's decision gives the host."""

    k: int  # the decided batch K, clamped to [0, Kmax]
    k_host: int  # what the host's lookup returns (Kmax for proposers that assert K == Kmax)
    limits: dict[str, int] | None  # per-request draft limits, None = none below k_host


class DecisionGate:
    def __init__(self, controller: Any, kmax: int, varies_k: bool) -> None:
        self.controller = controller
        self.kmax = kmax
        self.varies_k = varies_k
        self.limits: dict[str, int] | None = None  # the latest decision's limits
        # decided from the drafts (decide_from_drafts), for the next decide()
        self._next: tuple[Decision, dict[str, int] | None] | None = None

    def clamp(self, k: int) -> int:
        return min(max(int(k), 0), self.kmax)

    def decide(self, step: int, running: Sequence[Any],
               catch_up: Any = None) -> GateDecision:
        """The decision of step ``step``, made on the running requests that decode in it
        (a prefill that joins the step does not change K for that reason; when every
        request prefills, on all of them).  Read of each: ``request_id``, ``num_tokens``,
        ``num_computed_tokens``, ``num_output_placeholders``.  ``catch_up``: the drafter
        tokens those requests would catch up at K > 0 (a function of them), or None.
        The requests that prefill in the step (``BatchView.joining``) draft their first
        drafts at its end: their limit is the decision's ``k_first`` where it gives one."""
        # requests that prefill in this step: their prefill step drafts their first drafts
        running, joiners = split_batch(running)
        ids = tuple(r.request_id for r in running)
        if self._next is not None:  # made from the drafts' confidences
            (d, limits), self._next = self._next, None
            k = self.clamp(d.k)
        else:
            view = BatchView(step=step, req_ids=ids,
                             context_lens=tuple(int(r.num_tokens) for r in running),
                             catch_up_tokens=0 if catch_up is None else int(catch_up(running)),
                             joining=len(joiners))
            d = self.controller.decide(view)
            k = self.clamp(d.k)
            limits = None if d.k_i is None else ki_limits(d.k_i, ids, k)
        if not self.varies_k:
            # the host's proposer asserts K == Kmax: draft Kmax, verify min(K, K_i) per request
            if limits is None and k < self.kmax:
                limits = dict.fromkeys(ids, k)
            k_host = self.kmax
        else:
            k_host = k
        if joiners and d.k_first is not None and d.k_first < k:
            # the joiners' first drafts are cut (adaptive/first_drafts.py)
            limits = dict(limits) if limits else {}
            first = max(int(d.k_first), 0)
            for rid in joiners:
                limits[rid] = min(first, limits.get(rid, k))
        self.limits = limits
        return GateDecision(k=k, k_host=k_host, limits=limits)

    def decide_from_drafts(self, step: int, req_ids: Sequence[str], confidences: Any,
                           entropies: Any, requests: Mapping[str, Any]) -> None:
        """The decision of step ``step`` from the confidences of the drafts it will verify
        (requests still decoding); its K becomes that step's batch draft depth and its K_i
        cut the drafts now arriving."""
        if confidences.shape[1] == 0:
            return  # K = 0 this step: nothing to rank; schedule() decides as without
        keep = [i for i, r in enumerate(req_ids)
                if (q := requests.get(r)) is not None and not q.is_finished()
                and not q.is_prefill_chunk]
        if not keep:
            return
        if len(keep) < len(req_ids):
            confidences = confidences[keep]
            entropies = None if entropies is None else entropies[keep]
        ids = tuple(req_ids[i] for i in keep)
        view = BatchView(step=step, req_ids=ids,
                         context_lens=tuple(int(requests[r].num_tokens) for r in ids),
                         confidences=confidences, entropies=entropies)
        d = self.controller.decide(view)
        k = self.clamp(d.k)
        if d.k_i is not None:
            self.limits = ki_limits(d.k_i, ids, k)
            self._next = (d, self.limits)  # schedule() reuses these limits
        else:  # one K for every request: it is also these drafts' verify width
            self.limits = None if k >= confidences.shape[1] else dict.fromkeys(ids, k)
            self._next = (d, None)

    def force(self, limits: dict[str, int] | None) -> None:
        """Limits set from outside the controller (a forced width); forgets a pending
        decision."""
        self.limits = limits
        self._next = None

    def limit(self, req_id: str) -> int | None:
        """The latest decision's draft limit for ``req_id`` (None: no limit)."""
        return None if self.limits is None else self.limits.get(req_id)

    def trim(self, req_ids: Sequence[str], drafts: Sequence[Sequence[int]],
             width: int | None = None) -> list[list[int]] | None:
        """Each request's drafts cut to its limit, or None when nothing changes.

        ``width``: the step's K, for a host whose drafts arrive padded to Kmax (vLLM-HUST
        0.17: the drafter made ``width`` tokens, the runner's buffer holds Kmax); every row
        is cut to it as well."""
        limits = self.limits
        if limits is None and width is None:
            return None
        out, changed = [], False
        for rid, ids in zip(req_ids, drafts):
            lim = None if limits is None else limits.get(rid)
            if width is not None:
                lim = width if lim is None else min(lim, width)
            if lim is not None and len(ids) > lim:
                ids = list(ids[:lim])
                changed = True
            out.append(ids)
        return out if changed else None


def decision_batch(running: Sequence[Any]) -> list[Any]:
    """The requests a step's K is decided on: those that decode in it (a prefill that joins
    the step does not count), or all of them when every request prefills."""
    return split_batch(running)[0]


def split_batch(running: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """(:func:`decision_batch`, the ids of the requests that prefill in the step), in one
    pass over the running requests."""
    decode: list[Any] = []
    joiners: list[str] = []
    for r in running:
        if decoding(r):
            decode.append(r)
        else:
            joiners.append(r.request_id)
    return decode or list(running), joiners


def decoding(request: Any) -> bool:
    """True when ``request`` computes one new token in the step being scheduled (its
    prompt and outputs are all computed but the last), before ``_update_after_schedule``;
    a (chunked or resumed) prefill has more to compute."""
    return (request.num_computed_tokens
            >= request.num_tokens + request.num_output_placeholders - 1)


def ki_limits(k_i: Mapping[str, int], ids: tuple[str, ...], k: int) -> dict[str, int]:
    """A decision's per-request draft limits ``{req_id: min(max(K_i, 0), k)}`` for the
    requests ``ids`` (the batch it decided), built from its K_i array (one dict)."""
    return dict(zip(ids, np.clip(ki_array(k_i, ids), 0, k).tolist()))
