"""The engine-core side of the plugin: one :class:`EngineRuntime` per scheduler.

The patches call in here (``scheduler-k`` -> :func:`attach`; ``spec-stats`` ->
:meth:`EngineRuntime.on_verified`; ``step-output`` -> :meth:`EngineRuntime.before_output` /
:meth:`EngineRuntime.after_output`; ``draft-trim`` / ``async-placeholders`` ->
:meth:`EngineRuntime.trim_drafts` / :meth:`EngineRuntime.draft_limit`).

Step timeline (synchronous scheduling, the CPU host): ``schedule()`` of step ``s`` asks
:class:`KLookup` for K_s (the decision is traced); the workers verify the drafts of step
``s-1`` and draft K_s tokens; ``update_from_output`` of step ``s`` brings the verification
results (drafted counts follow K_{s-1}) and the wall time from the decision to the output;
``update_draft_token_ids`` then cuts each request's new drafts to its K_i.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Any

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.adaptive.observations import BatchView, RequestResult, StepResult
from vllm_hust_vspec.backends.methods import draft_forwards, varies_k
from vllm_hust_vspec.runtime.announce import announce
from vllm_hust_vspec.runtime.controller_factory import (
    build_controller,
    check_settings,
    is_fixed_at,
)
from vllm_hust_vspec.runtime.decision_trace import DecisionTrace, trace_path
from vllm_hust_vspec.runtime.recorder import TraceRecorder
from vllm_hust_vspec.settings import SettingsError

logger = logging.getLogger("vllm_hust_vspec")


class KLookup:
    """Stands in for ``Scheduler.dynamic_sd_lookup``: ``lookup[batch_size] -> K``."""

    def __init__(self, runtime: EngineRuntime) -> None:
        self.runtime = runtime

    def __getitem__(self, batch_size: int) -> int:
        return self.runtime.decide(batch_size)

    def __len__(self) -> int:  # the host's dense table has max_num_seqs + 1 entries
        return self.runtime.max_num_seqs + 1


class EngineRuntime:
    def __init__(self, scheduler: Any, settings: settings_mod.Settings) -> None:
        vllm_config = scheduler.vllm_config
        spec = vllm_config.speculative_config
        self.scheduler = scheduler
        self.settings = settings
        self.method = str(spec.method)
        self.kmax = int(scheduler.num_spec_tokens)
        self.max_num_seqs = int(scheduler.scheduler_config.max_num_seqs)
        self.varies_k = varies_k(self.method)
        self.controller = build_controller(
            settings, self.kmax, host_table=getattr(spec, "num_speculative_tokens_per_batch_size", None),
            trace=True,
        )
        self.policy = self.controller.config.policy
        self.step = 0
        self._pending: collections.deque[tuple[int, int, float]] = collections.deque()
        self._k_prev = self.kmax  # the K the drafts now being verified were made with
        self._limits: dict[str, int] | None = None
        self._k_step = self.kmax
        self._verified: list[RequestResult] = []
        self._positions: dict[str, tuple[Any, int]] = {}
        # accepted_by_position[j]: draft tokens accepted as output token j (0-based), j < 64
        self.accepted_by_position = [0] * 64
        self._last_log = time.monotonic()
        self._log_interval = float(settings.adaptive_log_interval)
        # where vLLM's pickled or forked engine core starts, the host info is recomputed
        from vllm_hust_vspec.host.detect import host_label

        self.host = host_label()
        path = trace_path(settings)
        self.trace = DecisionTrace(path) if path else None
        if self.trace is not None:
            self.trace.write(self.controller.trace_header(
                settings.as_dict("plugin"),
                {"host": self.host, "method": self.method, "kmax": self.kmax,
                 "max_num_seqs": self.max_num_seqs, "pid": os.getpid(),
                 "policy": self.policy},
            ))
        self.recorder: TraceRecorder | None = None
        if settings.adaptive_record_trace:
            if not is_fixed_at(self.controller.config, self.kmax):
                check_settings(settings, self.kmax)  # raises the clear error
            self.recorder = TraceRecorder(
                str(settings.adaptive_record_trace), self.kmax, self.max_num_seqs,
                draft_min_steps=draft_forwards(self.method, 0),
                meta={"method": self.method, "host": self.host},
            )

    def reconfigure(self, settings: settings_mod.Settings) -> None:
        """Replace the controller (same Kmax) by one built from ``settings``: benchmarks
        compare policies inside one engine.  The trace and the recorder are unchanged."""
        self.controller = build_controller(settings, self.kmax, trace=True)
        self.policy = self.controller.config.policy
        self.settings = settings

    # ------------------------------------------------------------------ decide
    def decide(self, batch_size: int) -> int:
        """The K of this step (asked by ``schedule()`` through :class:`KLookup`)."""
        self.step += 1
        running = [r for r in self.scheduler.running]
        ids = tuple(r.request_id for r in running)
        view = BatchView(step=self.step, req_ids=ids,
                         context_lens=tuple(int(r.num_tokens) for r in running))
        d = self.controller.decide(view)
        k = min(max(int(d.k), 0), self.kmax)
        limits = None
        if d.k_i is not None:
            limits = {r: min(max(int(v), 0), k) for r, v in d.k_i.items()}
        if not self.varies_k:
            # the host's proposer asserts K == Kmax: draft Kmax, verify min(K, K_i) per request
            if limits is None and k < self.kmax:
                limits = {r: k for r in ids}
            k_host = self.kmax
        else:
            k_host = k
        self._limits = limits
        self._k_step = k
        self._pending.append((self.step, k, time.perf_counter()))
        self._flush_records()
        return k_host

    def draft_limit(self, req_id: str) -> int | None:
        if self._limits is None:
            return None
        return self._limits.get(req_id)

    def trim_drafts(self, req_ids: list[str], drafts: list[list[int]]) -> list[list[int]] | None:
        """Each request's drafts cut to its K_i, or None when nothing changes."""
        limits = self._limits
        if limits is None:
            return None
        out, changed = [], False
        for rid, ids in zip(req_ids, drafts):
            lim = limits.get(rid)
            if lim is not None and len(ids) > lim:
                ids = list(ids[:lim])
                changed = True
            out.append(ids)
        return out if changed else None

    # ------------------------------------------------------------------ observe
    def on_verified(self, req_id: str, drafted: int, accepted: int) -> None:
        request = self.scheduler.requests.get(req_id)
        ctx = int(request.num_tokens) if request is not None else 0
        self._verified.append(RequestResult(req_id, int(drafted), int(accepted), context_len=ctx))

    def before_output(self, scheduler: Any, scheduler_output: Any, model_runner_output: Any) -> None:
        self._verified = []
        self._positions = {}
        self._now = time.perf_counter()
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        if not sampled:
            return
        for req_id in scheduler_output.num_scheduled_tokens:
            i = index.get(req_id)
            request = scheduler.requests.get(req_id)
            if i is None or request is None or i >= len(sampled) or len(sampled[i]) == 0:
                continue
            self._positions[req_id] = (request, int(request.num_output_tokens))

    def after_output(self, scheduler: Any, scheduler_output: Any) -> None:
        batch = len(scheduler_output.num_scheduled_tokens)
        if batch == 0 or not self._pending:
            return
        step, k_now, t_decided = self._pending.popleft()
        wall_ms = (self._now - t_decided) * 1000.0
        # A step that also ran prefill (new or chunked prompts) costs far more than its decode
        # width explains: keep its acceptance, but not its time, out of the step-cost model.
        timed_ms = None if _has_prefill(scheduler_output) else wall_ms
        results = tuple(self._verified)
        self._verified = []
        k_verified = self._k_prev
        self._k_prev = k_now
        result = StepResult(step=step, batch_size=batch, k=k_verified, results=results,
                            wall_ms=timed_ms,
                            num_draft_steps=draft_forwards(self.method, k_now))
        self.controller.observe(result)
        self._flush_records()
        accepted = {r.req_id: r.accepted for r in results}
        by_pos = self.accepted_by_position
        for req_id, (_request, position) in self._positions.items():
            # the accepted drafts became output tokens position .. position + a - 1
            for j in range(position, min(position + accepted.get(req_id, 0), len(by_pos))):
                by_pos[j] += 1
        if self.recorder is not None:
            self._record(scheduler, results, batch, k_now, wall_ms)
        self._positions = {}
        self._maybe_log()

    def _record(self, scheduler: Any, results: tuple[RequestResult, ...], batch: int,
                k_now: int, wall_ms: float) -> None:
        rec = self.recorder
        assert rec is not None
        accepted = {r.req_id: r.accepted for r in results}
        verify_tokens = batch + sum(r.drafted for r in results)
        rec.step_sample(batch, k_now, verify_tokens, wall_ms)
        for req_id, (request, position) in self._positions.items():
            rec.on_step(req_id, float(request.arrival_time), position, accepted.get(req_id, 0))
            if req_id not in scheduler.requests or request.is_finished():
                rec.finish(req_id, int(request.num_output_tokens))

    # ------------------------------------------------------------------ output
    def _flush_records(self) -> None:
        records = self.controller.drain_records()
        if self.trace is not None:
            for rec in records:
                self.trace.write(rec)

    def _maybe_log(self) -> None:
        if self._log_interval <= 0:
            return
        now = time.monotonic()
        if now - self._last_log < self._log_interval:
            return
        self._last_log = now
        s = self.controller.stats
        goodput = s.get("goodput_tok_s")
        logger.info(
            "vllm-hust-vspec stats: policy=%s steps=%d K_hist=%s mean_K=%.2f "
            "mean_accepted_len=%.2f acceptance=%.3f goodput_est=%s tok/s",
            s["policy"], s["steps"], s["k_hist"], s["mean_k"], s["mean_accepted_len"],
            s["acceptance_rate"], "n/a" if goodput is None else f"{goodput:.1f}",
        )


def attach(scheduler: Any) -> EngineRuntime | None:
    """Give a freshly built scheduler its runtime and K lookup (``scheduler-k`` patch).

    Does nothing when the plugin is disabled in this process's env or the engine does not
    speculate.  Settings errors propagate: the engine must not start half-configured."""
    if os.environ.get(settings_mod.ENABLE_ENV) != "1":
        return None
    spec = scheduler.vllm_config.speculative_config
    if spec is None or not scheduler.num_spec_tokens:
        logger.info("vllm-hust-vspec: no speculative decoding configured; nothing to adapt")
        return None
    runtime = EngineRuntime(scheduler, settings_mod.from_env())
    scheduler._vspec_runtime = runtime
    scheduler.dynamic_sd_lookup = KLookup(runtime)
    from vllm_hust_vspec.host.detect import process_label
    from vllm_hust_vspec.patches import registry

    label = process_label()
    announce(runtime.host, "engine" if label == "frontend" else label, runtime.policy,
             runtime.kmax, registry.applied())
    return runtime


def _has_prefill(scheduler_output: Any) -> bool:
    """True when the step scheduled more tokens than its decodes and drafts (1 + drafts per
    running request): some request was prefilling."""
    spec = scheduler_output.scheduled_spec_decode_tokens
    decode_tokens = sum(1 + len(spec.get(r, ())) for r in scheduler_output.num_scheduled_tokens)
    return scheduler_output.total_num_scheduled_tokens > decode_tokens
