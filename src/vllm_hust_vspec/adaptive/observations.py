"""What one engine step tells the controller, and what the controller answers.

These frozen dataclasses are the contract between the controller core
(:mod:`vllm_hust_vspec.adaptive.controller`), the simulator and the vLLM plugin.

Timing semantics.  In the real engine the K decided at step ``s`` is drafted at the end of
step ``s`` and verified at step ``s + 1``, so a :class:`StepResult` describes the
verification of an *earlier* decision (``k_verified``) and the drafting of its own
(``k_drafted``, which sets ``num_draft_steps``); the two differ when K changes.  The controller never pairs a result with a decision;
its estimators learn from what was verified (per-request ``drafted``/``accepted``) and what
the step cost (``wall_ms`` with the batch size, verified tokens and drafter passes).

Acceptance semantics.  For one request, positions ``1..accepted`` were accepted and, when
``drafted > accepted``, position ``accepted + 1`` was rejected; later positions were never
reached and carry no information.  Position ``j`` was therefore *tried* (reached) iff
``drafted >= j`` and ``accepted >= j - 1``; the conditional acceptance is
``a_j = P(accept j | accepted j - 1)``.

Extensions (backward compatible):
  * ``StepResult.drafted`` / ``StepResult.accepted``: aligned 1-D integer arrays (numpy or
    sequences) of every request's drafted / accepted counts.  When both are given the
    controller counts from them (numpy) and ``results`` may be empty; this saves building
    one :class:`RequestResult` per request.  ``StepResult.confidences`` (2-D, (batch, width))
    then carries the verified drafts' confidences for the confidence map, and
    ``StepResult.context_lens`` the requests' context lengths, and ``StepResult.first``
    which rows verified a request's first drafts (made by its prefill step: kept out of the
    acceptance estimate, counted everywhere else).
  * ``BatchView.confidences`` may also be a 2-D numpy array of shape ``(batch, width)``
    aligned with ``req_ids`` (rows padded with 0.0); this avoids building a dict per step.
  * ``BatchView.entropies``: per-position draft top-k entropies for the ``entropy`` stop, in
    the same two forms as ``confidences``: the entropy in nats of the draft distribution
    renormalised over its ``names.ENTROPY_TOPK`` most likely tokens (0 = sure, at most
    ``ln(ENTROPY_TOPK)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request's verification result in one step."""

    req_id: str
    drafted: int  # draft tokens verified this step (0..Kmax); may be < K (n-gram, trimming)
    accepted: int  # accepted among them (0..drafted)
    context_len: int = 0
    # per-position draft confidences of THESE drafted tokens (len == drafted), if known
    confidences: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.accepted <= self.drafted:
            raise ValueError(
                f"request {self.req_id!r}: need 0 <= accepted <= drafted, got "
                f"accepted={self.accepted}, drafted={self.drafted}"
            )


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one engine step tells the controller."""

    step: int
    batch_size: int  # running decode requests in the step
    # the batch draft depth of the drafts verified in this step (decided for, and drafted by,
    # an earlier step; the max drafted asked)
    k_verified: int
    results: tuple[RequestResult, ...]
    wall_ms: float | None  # step wall time (None if unknown)
    # drafter forward passes in this step's wall time, for the K it drafted (vLLM 0.32 runs
    # max(K, 1) for model drafters); None: assume ``k_drafted``
    num_draft_steps: int | None = None
    # fast path (see the module docstring): aligned 1-D integer arrays of every request's
    # drafted / accepted counts, used instead of ``results`` when given
    drafted: Any = None
    accepted: Any = None
    # with the fast path: the verified drafts' confidences, a 2-D array (batch, width)
    # aligned with ``drafted`` (positions past a request's ``drafted`` are ignored)
    confidences: Any = None
    # with the fast path: the requests' context lengths, 1-D aligned with ``drafted``
    # (the ``profile`` policy's latency model has a context term)
    context_lens: Any = None
    # the batch draft depth this step drafted (decided for it; verified by the next step);
    # None: the same as ``k_verified`` (a steady K, as in the simulator)
    k_drafted: int | None = None
    # a step whose drafter first caught up tokens it missed in K = 0 steps (its ``wall_ms``
    # is None: the time is the resume's): (tokens caught up, the step's ms)
    catch_up: tuple[int, float] | None = None
    # with the fast path: 1-D bools aligned with ``drafted``, True where the verified drafts
    # were the request's first (made by its prefill step); None: none marked
    first: Any = None

    @property
    def drafted_k(self) -> int:
        """The K this step drafted (``k_drafted``, else ``k_verified``)."""
        return self.k_verified if self.k_drafted is None else self.k_drafted


@dataclass(frozen=True, slots=True)
class BatchView:
    """What ``decide()`` sees: the requests that will draft next."""

    step: int
    req_ids: tuple[str, ...]
    context_lens: tuple[int, ...] | None = None
    # optional per-request next-draft confidences: {req_id: [c_1, c_2, ...]} or a 2-D numpy
    # array aligned with req_ids (see the module docstring)
    confidences: Mapping[str, Sequence[float]] | Any | None = None
    # optional per-request next-draft top-8 entropies (nats), same forms as ``confidences``
    entropies: Mapping[str, Sequence[float]] | Any | None = None
    # drafter tokens that drafting K > 0 for the whole batch would catch up first (the
    # drafter sat out K = 0 steps, patch drafter-k0); 0 when nothing is missed
    catch_up_tokens: int = 0
    # requests that prefill in this step (beside ``req_ids``, or ``req_ids`` themselves when
    # every request prefills): their prefill step drafts their first drafts at the
    # decision's K, which ``Decision.k_first`` may cut
    joining: int = 0


class KiArray(Mapping[str, int]):
    """Per-request K_i as an integer array aligned with a batch's ``req_ids``: a read-only
    ``{req_id: K_i}`` mapping that builds no dict unless a caller looks a request up.

    Per-request policies decide a whole batch with numpy; a dict of 256 entries costs more
    to build than the decision itself (~9 microseconds), and the engine, the simulator and
    the stop rule want the values in batch order anyway: they read :attr:`array` through
    :func:`ki_array`.  Lookups by request id (``k_i[rid]``, ``items()``, ``dict(k_i)``)
    work as on a dict; the dict behind them is built once, on first use."""

    __slots__ = ("ids", "array", "_dict")

    def __init__(self, ids: tuple[str, ...], array: np.ndarray) -> None:
        if array.shape != (len(ids),):
            raise ValueError(f"K_i array of shape {array.shape} for a batch of {len(ids)} requests")
        array.flags.writeable = False  # decisions may share it (Decision.k_i is read-only)
        self.ids = ids
        self.array = array
        self._dict: dict[str, int] | None = None

    def _lookup(self) -> dict[str, int]:
        d = self._dict
        if d is None:
            d = self._dict = dict(zip(self.ids, self.array.tolist()))
        return d

    def __getitem__(self, req_id: str) -> int:
        return self._lookup()[req_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lookup())

    def __len__(self) -> int:  # request ids are unique within a batch
        return len(self.ids)

    def __repr__(self) -> str:
        return f"KiArray({self._lookup()!r})"


def ki_array(k_i: Mapping[str, int], req_ids: tuple[str, ...]) -> np.ndarray:
    """``k_i``'s values in the order of ``req_ids`` as an int64 array (no copy when ``k_i``
    is a :class:`KiArray` of that batch; KeyError names a request without a K_i)."""
    if isinstance(k_i, KiArray) and (k_i.ids is req_ids or k_i.ids == req_ids):
        return k_i.array
    return np.fromiter(map(k_i.__getitem__, req_ids), np.int64, len(req_ids))


@dataclass(frozen=True, slots=True)
class Decision:
    """The controller's answer for one step."""

    k: int  # batch K (= max of k_i when k_i is given), in [min_gamma, kmax]
    # per-request K (None: every request drafts k): a dict or a KiArray (read the values
    # in batch order with ki_array); read-only: policies may share it between decisions
    k_i: Mapping[str, int] | None
    policy: str
    reason: str  # short human-readable why (goes to the decision trace)
    est_accept: tuple[float, ...]  # conditional acceptance estimates per position 1..kmax
    est_cost_ms: float | None  # predicted step cost at k (None if no model yet)
    # what the policy believed of every K it weighed (K = first + index): its predicted
    # step cost and goodput (tokens/ms) at this batch; None when it weighed none
    est_costs: tuple[float, ...] | None = None
    est_goodput: tuple[float, ...] | None = None
    est_first_k: int = 0
    # the draft depth of the requests that prefill in this step (their first drafts,
    # adaptive/first_drafts.py); None: the decision's K
    k_first: int | None = None
