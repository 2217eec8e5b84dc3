"""One engine step's verification results as arrays (the controller's fast path).

The ``spec-stats`` patch reports every verified request of a step, one call each, from inside
vLLM's output loop; :class:`VerifiedCollector` appends them to plain lists and, when the step's
output is done, hands them over at once (:meth:`VerifiedCollector.take`) as aligned int64
arrays, with the verified drafts' confidences gathered from the confidence matrix the workers
sent with those drafts (:meth:`VerifiedCollector.keep`, at trim time) by one fancy index.
The engine passes them to the controller as one ``StepResult(drafted=..., accepted=...,
confidences=...)`` instead of one ``RequestResult`` per request.

It also sums the confidence and top-k entropy of the verified draft positions, split by
outcome (:attr:`VerifiedCollector.outcomes`; docs/confidence.md): for a request that drafted
``d`` and accepted ``a``, positions ``1..a`` were accepted and, when ``d > a``, position
``a + 1`` was rejected; later positions were never reached.  Pure numpy (no vLLM import).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True, slots=True)
class VerifiedStep:
    """One step's verified requests, aligned (one entry per ``spec-stats`` report)."""

    req_ids: list[str]
    drafted: np.ndarray  # int64 (n,): draft tokens verified
    accepted: np.ndarray  # int64 (n,): accepted among them
    context_lens: np.ndarray  # int64 (n,): the requests' context lengths (tokens)
    # bool (n,): the request's first verification (the drafts its prefill step made)
    first: np.ndarray
    # float (n, width): row i holds the confidences of request i's verified drafts (positions
    # past drafted[i], and the rows of requests that drafted 0, are arbitrary); None when no
    # confidences were kept or some request that drafted > 0 has none
    confidences: np.ndarray | None


class VerifiedCollector:
    """Collects one step's verification results; keeps the confidences of the drafts awaiting
    verification between the step that made them and the step that verifies them."""

    def __init__(self) -> None:
        # sums over verified positions: [confidence, entropy, count], by outcome
        self.outcomes: dict[str, list[float]] = {"accepted": [0.0, 0.0, 0],
                                                 "rejected": [0.0, 0.0, 0]}
        self._ids: list[str] = []
        self._drafted: list[int] = []
        self._accepted: list[int] = []
        self._context: list[int] = []
        self._first: list[bool] = []
        self._rows: list[int] = []  # kept-matrix row of each reported request, -1: none
        # the drafts awaiting verification: request id -> row of these matrices
        self._row_of: dict[str, int] = {}
        self._conf: np.ndarray | None = None
        self._ent: np.ndarray | None = None

    # ------------------------------------------------------------------ drafts
    def keep(self, req_ids: list[str], confidences: Any, entropies: Any) -> None:
        """The drafts now handed to the scheduler: row ``i`` of ``confidences`` (and of
        ``entropies``, or None), shape (len(req_ids), width), belongs to ``req_ids[i]``.
        Each request's drafts (after any trim) must be at most ``width`` long."""
        conf = np.asarray(confidences)
        if conf.ndim != 2 or conf.shape[0] != len(req_ids):
            raise ValueError(f"draft confidences of shape {conf.shape} for {len(req_ids)} requests")
        ent = None if entropies is None else np.asarray(entropies)
        if ent is not None and ent.shape != conf.shape:
            raise ValueError(f"draft entropies of shape {ent.shape}, confidences {conf.shape}")
        self._conf, self._ent = conf, ent
        self._row_of = dict(zip(req_ids, range(len(req_ids))))

    def drop_kept(self) -> None:
        """Forget the kept confidences (new drafts arrive without them, or none are wanted)."""
        self._conf = self._ent = None
        self._row_of = {}

    # ------------------------------------------------------------------ results
    def add(self, req_id: str, drafted: int, accepted: int, context_len: int = 0,
            first: bool = False) -> None:
        """One verified request (``spec-stats``); ``first``: its first verification (the
        drafts its prefill step made).  Its kept confidences are used once."""
        self._ids.append(req_id)
        self._drafted.append(drafted)
        self._accepted.append(accepted)
        self._context.append(context_len)
        self._first.append(first)
        self._rows.append(self._row_of.pop(req_id, -1) if self._row_of else -1)

    def discard(self) -> None:
        """Forget the results reported so far this step (the kept confidences stay)."""
        self._ids, self._drafted, self._accepted, self._context, self._first, self._rows = (
            [], [], [], [], [], [])

    def __len__(self) -> int:
        return len(self._ids)

    def take(self) -> VerifiedStep:
        """This step's results as arrays (the collector starts the next step empty), after
        adding their confidence/entropy outcomes to :attr:`outcomes`."""
        ids = self._ids
        drafted = np.array(self._drafted, dtype=np.int64)
        accepted = np.array(self._accepted, dtype=np.int64)
        context_lens = np.array(self._context, dtype=np.int64)
        first = np.array(self._first, dtype=bool)
        rows = np.array(self._rows, dtype=np.int64)
        self.discard()
        conf = self._conf
        gathered = None
        if conf is not None and len(conf) and len(ids):
            has = rows >= 0
            gathered = conf[np.where(has, rows, 0)]
            ent = None if self._ent is None else self._ent[np.where(has, rows, 0)]
            self._add_outcomes(gathered[has], None if ent is None else ent[has],
                               drafted[has], accepted[has])
            if (~has & (drafted > 0)).any():
                gathered = None  # a verified request's drafts came without confidences
        return VerifiedStep(req_ids=ids, drafted=drafted, accepted=accepted,
                            context_lens=context_lens, first=first, confidences=gathered)

    def _add_outcomes(self, conf: np.ndarray, ent: np.ndarray | None, drafted: np.ndarray,
                      accepted: np.ndarray) -> None:
        """Add the confidences (and entropies) of the accepted positions ``1..accepted`` and
        of the rejected position ``accepted + 1`` (when ``drafted > accepted``) of each row."""
        if not len(conf):
            return
        if int(drafted.max()) > conf.shape[1]:
            raise ValueError(f"a request verified {int(drafted.max())} drafts but only "
                             f"{conf.shape[1]} draft confidences were kept for it")
        acc, rej = self.outcomes["accepted"], self.outcomes["rejected"]
        took = np.arange(conf.shape[1])[None, :] < accepted[:, None]
        n_acc = int(accepted.sum())
        if n_acc:
            acc[0] += float(np.sum(conf, where=took, dtype=np.float64))
            acc[1] += 0.0 if ent is None else float(np.sum(ent, where=took, dtype=np.float64))
            acc[2] += n_acc
        stopped = np.flatnonzero(accepted < drafted)
        if len(stopped):
            at = accepted[stopped]
            rej[0] += float(np.sum(conf[stopped, at], dtype=np.float64))
            rej[1] += 0.0 if ent is None else float(np.sum(ent[stopped, at], dtype=np.float64))
            rej[2] += len(stopped)
