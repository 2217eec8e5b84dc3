"""What the engine runtime writes: the decision trace, the simulator trace, the stats line,
and the per-request events that listeners (tests, tools) may follow.

The runtime hands over, per step, the controller's records (:meth:`RuntimeOutputs.records`)
and what each request that produced tokens accepted (:meth:`RuntimeOutputs.step`); this
module owns the files, the log and the ``/metrics`` feed.  Pure Python (no vLLM import).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.runtime.decision_trace import DecisionTrace, trace_path
from vllm_hust_vspec.runtime.metrics_feed import MetricsFeed
from vllm_hust_vspec.runtime.sim_trace import SimTraceRecorder

logger = logging.getLogger("vllm_hust_vspec")

# listener(request, position, accepted): ``request`` (the host's Request) produced tokens in
# a step that started at output position ``position`` and accepted ``accepted`` drafts there
RequestListener = Callable[[Any, int, int], None]


class RuntimeOutputs:
    def __init__(self, settings: settings_mod.Settings, header: dict[str, Any] | None,
                 recorder: SimTraceRecorder | None, metrics: MetricsFeed | None = None) -> None:
        path = trace_path(settings)
        self.trace = DecisionTrace(path) if path else None
        if self.trace is not None and header is not None:
            self.trace.write(header)
        self.recorder = recorder
        self.metrics = metrics  # the /metrics feed (None where the server logs no stats)
        self.listeners: list[RequestListener] = []
        self._log_interval = float(settings.adaptive_log_interval)
        self._last_log = time.monotonic()

    @property
    def wants_requests(self) -> bool:
        """True when someone follows the per-request events (their positions are read)."""
        return self.recorder is not None or bool(self.listeners)

    def records(self, records: list[dict[str, Any]]) -> None:
        """The controller's decision and result records, to the decision trace and the
        ``/metrics`` feed."""
        if self.metrics is not None:
            self.metrics.records(records)
        if self.trace is not None:
            for rec in records:
                self.trace.write(rec)

    def step(self, scheduler: Any, positions: Mapping[str, tuple[Any, int]],
             accepted: Mapping[str, int], batch: int, verify_tokens: int, k_drafted: int,
             window_ms: float) -> None:
        """One step's per-request events: ``positions`` maps each request that produced
        tokens to (request, output position at the step's start); ``accepted`` the drafts
        each accepted; the step's sample (batch, drafted K, verified rows, window) goes to
        the simulator trace."""
        for listener in self.listeners:
            for req_id, (request, position) in positions.items():
                listener(request, position, accepted.get(req_id, 0))
        rec = self.recorder
        if rec is None:
            return
        rec.step_sample(batch, k_drafted, verify_tokens, window_ms)
        for req_id, (request, position) in positions.items():
            rec.on_step(req_id, float(request.arrival_time), position, accepted.get(req_id, 0))
            if req_id not in scheduler.requests or request.is_finished():
                rec.finish(req_id, int(request.num_output_tokens))

    def maybe_log(self, stats: Callable[[], dict[str, Any]]) -> None:
        """The stats line, at most once per ``adaptive_log_interval`` seconds."""
        if self._log_interval <= 0:
            return
        now = time.monotonic()
        if now - self._last_log < self._log_interval:
            return
        self._last_log = now
        s = stats()
        goodput = s.get("goodput_tok_s")
        logger.info(
            "vllm-hust-vspec stats: policy=%s steps=%d K_hist=%s mean_K=%.2f "
            "mean_accepted_len=%.2f acceptance=%.3f goodput_est=%s tok/s fallbacks=%d",
            s["policy"], s["steps"], s["k_hist"], s["mean_k"], s["mean_accepted_len"],
            s["acceptance_rate"], "n/a" if goodput is None else f"{goodput:.1f}",
            s.get("fallbacks", 0),
        )
        if "admission_holds" in s:
            logger.info("vllm-hust-vspec admission: steps held=%d, ended by the wait bound=%d",
                        s["admission_holds"], s["admission_releases"])


def header_meta(host: str, method: str, kmax: int, max_num_seqs: int, policy: str) -> dict:
    """The engine facts in the decision trace's header."""
    return {"host": host, "method": method, "kmax": kmax, "max_num_seqs": max_num_seqs,
            "pid": os.getpid(), "policy": policy}
