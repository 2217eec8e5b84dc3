"""Record a real run in the simulator's trace format (``vllm-hust-vspec-sim TRACE``).

The run must be at fixed Kmax.  For each request the recorder keeps, at every engine step
that produced tokens for it, the output position ``t`` the step started at and the number
``a`` of draft tokens accepted there; when the request finishes it appends one line::

    {"id": ..., "arrival_s": ..., "accept_len": [a_0, a_1, ...]}   # len = output length

Treatment of positions (documented contract, so replay at ``--policy fixed:Kmax`` advances
exactly as the run did and reproduces its committed and accepted token counts):

* a step that started at ``t`` and accepted ``a`` drafts sets ``accept_len[t] = a``
  (``a <= drafted <= Kmax``, so replay advances ``min(Kmax, a) + 1 = a + 1``);
* a step that advanced by a NON-drafted step (the prefill step that emits the first token,
  or a step where the drafter proposed nothing, e.g. an n-gram miss) sets ``accept_len[t] = 0``
  (replay advances 1);
* the positions ``t + j`` (1 <= j <= a) the run skipped over get ``a - j``: a greedy drafter
  started there would propose the same tokens, of which ``a - j`` match (a lower bound when
  every draft was accepted);
* the last step may accept past the request's end (vLLM drafts beyond max_tokens); replay
  truncates at the end exactly as vLLM truncates the output.

Line 1 (the header) carries ``cost``, fitted by least squares from the measured step times;
it is rewritten in place after every finished request (it is padded to a fixed width), so
the file is complete whenever the engine core is killed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from vllm_hust_vspec.adaptive.costmodel import nnls

logger = logging.getLogger("vllm_hust_vspec")

HEADER_BYTES = 2048  # line 1 is padded with spaces to this width (newline included)
FORMAT = "vspec-trace"
VERSION = 1


@dataclass
class _Request:
    arrival_s: float
    events: list[tuple[int, int]] = field(default_factory=list)  # (position, accepted)


def accept_lengths(events: list[tuple[int, int]], length: int) -> list[int]:
    """``accept_len`` of one request from its (position, accepted) events (see the module
    docstring for the treatment of skipped and non-drafted positions)."""
    out = [0] * length
    for t, a in sorted(events):
        if t >= length:
            continue
        out[t] = a
        for j in range(1, a + 1):
            if t + j < length:
                out[t + j] = a - j
    for t, a in events:  # events win over fill-ins (a later event sits at t + a + 1)
        if t < length:
            out[t] = a
    return out


def fit_cost(samples: list[tuple[int, int, int, float]], draft_min_steps: int) -> dict:
    """Fit the header's roofline to ``(batch, draft_depth, verify_tokens, ms)`` samples.

    Model fitted (non-negative least squares): ``ms = bias + target_token_ms * T +
    max(K, draft_min_steps) * draft_token_ms * B``; the memory-bound terms are 0, which is
    the same formula with ``target_mem_ms = draft_mem_ms = 0``.  Samples of one draft depth
    fit no drafter term (its cost goes to the other two).  ``noise`` is the standard
    deviation of ``log(ms / predicted)``."""
    cost = {"bias_ms": 0.0, "target_mem_ms": 0.0, "target_token_ms": 0.0, "draft_mem_ms": 0.0,
            "draft_token_ms": 0.0, "draft_min_steps": int(draft_min_steps), "noise": 0.0}
    if not samples:
        return cost
    arr = np.asarray(samples, dtype=float)
    b, k, t, ms = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
    if len(samples) < 3:
        cost["bias_ms"] = float(np.mean(ms))
        return cost
    depth = np.maximum(k, draft_min_steps)
    columns = [np.ones_like(ms), t]
    # at one draft depth (a fixed-K run) the drafter's column is a multiple of the verified
    # tokens' (T = (K + 1) * B when every request drafts K): the fit could then put the whole
    # step on the drafter and leave a K = 0 step costing nothing.  Fit the drafter only when
    # the samples hold two depths or more.
    fit_draft = len(np.unique(depth)) > 1
    if fit_draft:
        columns.append(depth * b)
    a = np.column_stack(columns)
    coef = nnls(a, ms)
    pred = a @ coef
    cost["bias_ms"] = round(float(coef[0]), 6)
    cost["target_token_ms"] = round(float(coef[1]), 6)
    cost["draft_token_ms"] = round(float(coef[2]), 6) if fit_draft else 0.0
    ok = (pred > 0) & (ms > 0)
    if ok.sum() >= 2:
        cost["noise"] = round(float(min(1.0, np.std(np.log(ms[ok] / pred[ok])))), 6)
    if not all(math.isfinite(v) for v in cost.values()):
        raise ValueError(f"cost fit failed on {len(samples)} samples")
    return cost


class SimTraceRecorder:
    """Writes the trace file; thread-safe; one per engine."""

    def __init__(self, path: str, kmax: int, max_num_seqs: int, draft_min_steps: int,
                 seed: int = 0, meta: dict | None = None) -> None:
        self.path = path
        self.kmax = kmax
        self.max_num_seqs = max_num_seqs
        self.draft_min_steps = draft_min_steps
        self.seed = seed
        self.meta = meta or {}
        self.samples: list[tuple[int, int, int, float]] = []
        self._requests: dict[str, _Request] = {}
        self._t0: float | None = None
        self._lock = threading.Lock()
        self.written = 0
        self.failed: OSError | None = None  # the write error that stopped the recording
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._end = HEADER_BYTES
        self._write_header()

    # ------------------------------------------------------------------ events
    def step_sample(self, batch: int, draft_depth: int, verify_tokens: int, ms: float) -> None:
        with self._lock:
            self.samples.append((batch, draft_depth, verify_tokens, ms))

    def on_step(self, req_id: str, arrival_time: float, position: int, accepted: int) -> None:
        with self._lock:
            req = self._requests.get(req_id)
            if req is None:
                if self._t0 is None:
                    self._t0 = arrival_time
                req = _Request(arrival_s=max(0.0, arrival_time - self._t0))
                self._requests[req_id] = req
            req.events.append((position, accepted))

    def finish(self, req_id: str, length: int) -> None:
        with self._lock:
            req = self._requests.pop(req_id, None)
            if req is None or length <= 0:
                return
            if self.failed is not None:
                return
            line = json.dumps({"id": req_id, "arrival_s": round(req.arrival_s, 6),
                               "accept_len": accept_lengths(req.events, length)})
            data = (line + "\n").encode()
            try:
                os.pwrite(self._fd, data, self._end)
                self._end += len(data)
                self.written += 1
                self._write_header()
            except OSError as exc:  # while serving: a warning, the recording stops
                self.failed = exc
                logger.warning("vllm-hust-vspec: simulator trace %s: write failed (%s); the "
                               "recording stops at %d requests, serving goes on",
                               self.path, exc, self.written)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # ------------------------------------------------------------------ header
    def header(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "kmax": self.kmax,
                "max_num_seqs": self.max_num_seqs,
                "cost": fit_cost(self.samples, self.draft_min_steps), "seed": self.seed,
                "meta": self.meta}

    def _write_header(self) -> None:
        text = json.dumps(self.header())
        if len(text) + 1 > HEADER_BYTES:
            doc = self.header()
            doc.pop("meta")
            text = json.dumps(doc)
        data = text.ljust(HEADER_BYTES - 1).encode() + b"\n"
        os.pwrite(self._fd, data, 0)
