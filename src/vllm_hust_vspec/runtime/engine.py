"""The engine-core side of the plugin: one :class:`EngineRuntime` per scheduler.

The patches call in here (``scheduler-k`` -> :func:`attach`; ``spec-stats`` ->
:meth:`EngineRuntime.on_verified`; ``step-output`` -> :meth:`EngineRuntime.before_output` /
:meth:`EngineRuntime.after_output`; ``draft-trim`` / ``async-placeholders`` ->
:meth:`EngineRuntime.trim_drafts` / :meth:`EngineRuntime.draft_limit`;
``draft-confidence-request`` -> :attr:`EngineRuntime.wants_draft_signals`).

Step timeline (synchronous scheduling, the CPU host): ``schedule()`` of step ``s`` asks
:class:`KLookup` for K_s (the decision is traced); the workers verify the drafts of step
``s-1`` and draft K_s tokens; ``update_from_output`` of step ``s`` brings the verification
results (drafted counts follow K_{s-1}) and the wall time from the decision to the output;
``update_draft_token_ids`` then cuts each request's new drafts to its K_i.

With draft confidences (the controller uses them: ``budget`` policy, a per-request stop; sync
scheduling; see docs/confidence.md) the decision moves to the drafts it is about:
``update_draft_token_ids`` of step ``s`` brings the drafts of step ``s`` with their confidences,
the controller decides there (one decision per step, traced as step ``s+1``), the drafts are
cut to its K_i, and ``schedule()`` of step ``s+1`` takes its K as the batch draft depth.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.adaptive.observations import BatchView, Decision, StepResult, ki_array
from vllm_hust_vspec.backends.methods import draft_forwards, varies_k
from vllm_hust_vspec.runtime.announce import announce
from vllm_hust_vspec.runtime.controller_factory import (
    build_controller,
    check_settings,
    is_fixed_at,
)
from vllm_hust_vspec.runtime.decision_trace import DecisionTrace, trace_path
from vllm_hust_vspec.runtime.recorder import TraceRecorder
from vllm_hust_vspec.runtime.step_clock import StepClock
from vllm_hust_vspec.runtime.verified import VerifiedCollector
from vllm_hust_vspec.settings import SettingsError

logger = logging.getLogger("vllm_hust_vspec")


@dataclasses.dataclass(frozen=True)
class CalibrationStep:
    """One engine step under a forced calibration width."""

    t: float  # perf_counter() when the step's model output reached the scheduler
    batch: int  # requests scheduled
    rows: int  # tokens scheduled = target rows G (B x (width + 1) in a pure decode step)
    prefill: bool  # some request was (chunk-)prefilling


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
        # draft confidences: asked of the workers only when the controller uses them, and only
        # under synchronous scheduling (where the drafts come back to the engine core)
        self._sync = not getattr(scheduler.scheduler_config, "async_scheduling", False)
        self._wants_conf = _wants_signals(self.controller) and self._sync
        # decided at update_draft_token_ids, for schedule(): the decision and its K_i limits
        self._next: tuple[Decision, dict[str, int] | None] | None = None
        # this step's verified requests, and the confidences of the drafts awaiting verification
        self._verified = VerifiedCollector()
        # confidence and entropy of verified draft positions: sums and count, accepted / rejected
        self.confidence_outcomes = self._verified.outcomes
        self.step = 0
        self._pending: collections.deque[tuple[int, int, float]] = collections.deque()
        self._k_prev = self.kmax  # the K the drafts now being verified were made with
        self._limits: dict[str, int] | None = None
        self._k_step = self.kmax
        self._positions: dict[str, tuple[Any, int]] = {}
        # accepted_by_position[j]: draft tokens accepted as output token j (0-based), j < 64
        self.accepted_by_position = [0] * 64
        self.clock = StepClock()  # step windows + the engine's per-step overhead
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
        # start-up calibration (calibration/driver.py): a forced verify width, see force_width
        self.calibration_width: int | None = None
        self.calibration_steps: list[CalibrationStep] = []
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
        self._wants_conf = _wants_signals(self.controller) and self._sync
        self._next = None

    @property
    def wants_draft_signals(self) -> bool:
        """True when this step's workers should compute draft confidences
        (``draft-confidence-request`` reads it after every ``schedule()``)."""
        return self._wants_conf and self.calibration_width is None

    # ------------------------------------------------------------------ decide
    def decide(self, batch_size: int) -> int:
        """The K of this step (asked by ``schedule()`` through :class:`KLookup`)."""
        if self.calibration_width is not None:
            return self._decide_calibrating(self.calibration_width)
        self.step += 1
        running = [r for r in self.scheduler.running]
        ids = tuple(r.request_id for r in running)
        if self._next is not None:  # made from the drafts' confidences (trim_drafts)
            (d, limits), self._next = self._next, None
            k = min(max(int(d.k), 0), self.kmax)
        else:
            view = BatchView(step=self.step, req_ids=ids,
                             context_lens=tuple(int(r.num_tokens) for r in running))
            d = self.controller.decide(view)
            k = min(max(int(d.k), 0), self.kmax)
            limits = None if d.k_i is None else _ki_limits(d.k_i, ids, k)
        if not self.varies_k:
            # the host's proposer asserts K == Kmax: draft Kmax, verify min(K, K_i) per request
            if limits is None and k < self.kmax:
                limits = {r: k for r in ids}
            k_host = self.kmax
        else:
            k_host = k
        self._limits = limits
        self._k_step = k
        now = time.perf_counter()
        self.clock.decided(now)
        self._pending.append((self.step, k, now))
        self._flush_records()
        return k_host

    def draft_limit(self, req_id: str) -> int | None:
        if self._limits is None:
            return None
        return self._limits.get(req_id)

    def trim_drafts(self, req_ids: list[str], drafts: list[list[int]], confidences: Any = None,
                    entropies: Any = None) -> list[list[int]] | None:
        """Each request's drafts cut to its K_i, or None when nothing changes.

        ``confidences`` / ``entropies`` (float32 arrays (len(req_ids), K) from the workers):
        the next step's decision is made here from them (:meth:`_decide_from_drafts`) and its
        K_i cut these drafts; the confidences of what is kept await verification."""
        signals = self._wants_conf and confidences is not None
        if self._wants_conf:
            self._verified.drop_kept()
            if signals and self.calibration_width is None:
                self._decide_from_drafts(req_ids, confidences, entropies)
        if signals:  # each request's row; what the trim below keeps is what gets verified
            self._verified.keep(req_ids, confidences, entropies)
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

    def _decide_from_drafts(self, req_ids: list[str], confidences: Any, entropies: Any) -> None:
        """The decision for the next step, from the confidences of the drafts it will verify
        (requests still decoding); its K becomes the next batch draft depth (:meth:`decide`)
        and its K_i cut the drafts now arriving."""
        if confidences.shape[1] == 0:
            return  # K = 0 this step: nothing to rank; schedule() decides as without
        requests = self.scheduler.requests
        keep = [i for i, r in enumerate(req_ids)
                if (q := requests.get(r)) is not None and not q.is_finished()
                and not q.is_prefill_chunk]
        if not keep:
            return
        if len(keep) < len(req_ids):
            confidences = confidences[keep]
            entropies = None if entropies is None else entropies[keep]
        ids = tuple(req_ids[i] for i in keep)
        view = BatchView(step=self.step + 1, req_ids=ids,
                         context_lens=tuple(int(requests[r].num_tokens) for r in ids),
                         confidences=confidences, entropies=entropies)
        d = self.controller.decide(view)
        self._flush_records()
        k = min(max(int(d.k), 0), self.kmax)
        if d.k_i is not None:
            self._limits = _ki_limits(d.k_i, ids, k)
            self._next = (d, self._limits)  # schedule() reuses these limits
        else:  # one K for every request: it is also these drafts' verify width
            self._limits = None if k >= confidences.shape[1] else dict.fromkeys(ids, k)
            self._next = (d, None)

    # ------------------------------------------------------------------ observe
    def on_verified(self, req_id: str, drafted: int, accepted: int) -> None:
        """One request's verification in this step (``spec-stats``, inside the output loop);
        :meth:`after_output` hands the step's results to the controller as arrays."""
        request = self.scheduler.requests.get(req_id)
        ctx = int(request.num_tokens) if request is not None else 0
        self._verified.add(req_id, int(drafted), int(accepted), ctx)

    def before_output(self, scheduler: Any, scheduler_output: Any, model_runner_output: Any) -> None:
        self._verified.discard()
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
        if self.calibration_width is not None:
            self._calibration_output(scheduler_output)
            return
        batch = len(scheduler_output.num_scheduled_tokens)
        if batch == 0 or not self._pending:
            return
        step, k_now, t_decided = self._pending.popleft()
        wall_ms = self.clock.output(t_decided, self._now)
        # A step that also ran prefill (new or chunked prompts) costs far more than its decode
        # width explains: keep its acceptance, but not its time, out of the step-cost model.
        # The cost the controller optimises is the whole engine cycle: the decision-to-output
        # window plus the engine's own time between an output and the next decision (output
        # processing, draft hand-over, scheduling), which every step pays whatever its K.
        timed_ms = None if _has_prefill(scheduler_output) else self.clock.cycle_ms(wall_ms)
        # the fast path: the step's per-request counts (and the verified drafts' confidences)
        # as aligned arrays; a step that verified nothing passes none, as an empty ``results``
        verified = self._verified.take()
        some = len(verified.req_ids) > 0
        k_verified = self._k_prev
        self._k_prev = k_now
        result = StepResult(step=step, batch_size=batch, k=k_verified, results=(),
                            wall_ms=timed_ms,
                            num_draft_steps=draft_forwards(self.method, k_now),
                            drafted=verified.drafted if some else None,
                            accepted=verified.accepted if some else None,
                            confidences=verified.confidences,
                            context_lens=verified.context_lens if some else None)
        self.controller.observe(result)
        self._flush_records()
        accepted = dict(zip(verified.req_ids, verified.accepted.tolist()))
        by_pos = self.accepted_by_position
        for req_id, (_request, position) in self._positions.items():
            # the accepted drafts became output tokens position .. position + a - 1
            for j in range(position, min(position + accepted.get(req_id, 0), len(by_pos))):
                by_pos[j] += 1
        if self.recorder is not None:
            self._record(scheduler, accepted, batch, batch + int(verified.drafted.sum()), k_now,
                         wall_ms)
        self._positions = {}
        self._maybe_log()

    def _record(self, scheduler: Any, accepted: dict[str, int], batch: int, verify_tokens: int,
                k_now: int, wall_ms: float) -> None:
        """The step's sample and each request's accepted drafts (``accepted``: by request id;
        ``verify_tokens``: the batch plus the drafts verified) to the trace recorder."""
        rec = self.recorder
        assert rec is not None
        rec.step_sample(batch, k_now, verify_tokens, wall_ms)
        for req_id, (request, position) in self._positions.items():
            rec.on_step(req_id, float(request.arrival_time), position, accepted.get(req_id, 0))
            if req_id not in scheduler.requests or request.is_finished():
                rec.finish(req_id, int(request.num_output_tokens))

    # ------------------------------------------------------------------ calibration
    def force_width(self, width: int) -> None:
        """Start-up calibration: verify ``width`` drafts for every request of every step
        until :meth:`release_width`, keeping every draft (no K_i).  While forced, nothing
        reaches the controller, the decision trace or the recorder; each step's output only
        appends a :class:`CalibrationStep` to :attr:`calibration_steps` (cleared here)."""
        if not 0 <= width <= self.kmax:
            raise ValueError(f"calibration width {width} outside [0, Kmax={self.kmax}]")
        self.calibration_width = int(width)
        self.calibration_steps = []
        self._limits = None

    def release_width(self) -> None:
        """End the forced width: the controller decides again, from the state it had before
        calibration (the drafts now pending were made at the host's Kmax again)."""
        self.calibration_width = None
        self.calibration_steps = []
        self._limits = None
        self._pending.clear()
        self._verified.discard()
        self._verified.drop_kept()
        self._positions = {}
        self._k_prev = self.kmax
        self._next = None
        self.clock.reset()

    def _decide_calibrating(self, width: int) -> int:
        if self.varies_k:
            self._limits = None
            return width
        # fixed-K proposers draft Kmax: the forced width is a per-request cut
        self._limits = None if width == self.kmax else {
            r.request_id: width for r in self.scheduler.running}
        return self.kmax

    def _calibration_output(self, scheduler_output: Any) -> None:
        self._verified.discard()  # nothing reaches the controller while calibrating
        self._positions = {}
        batch = len(scheduler_output.num_scheduled_tokens)
        if batch == 0:
            return
        self.calibration_steps.append(CalibrationStep(
            t=self._now, batch=batch, rows=int(scheduler_output.total_num_scheduled_tokens),
            prefill=_has_prefill(scheduler_output)))

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


def _ki_limits(k_i: Mapping[str, int], ids: tuple[str, ...], k: int) -> dict[str, int]:
    """A decision's per-request draft limits ``{req_id: min(max(K_i, 0), k)}`` for the
    requests ``ids`` (the batch it decided), built from its K_i array (one dict)."""
    return dict(zip(ids, np.clip(ki_array(k_i, ids), 0, k).tolist()))


def _wants_signals(controller: Any) -> bool:
    """True when the controller reads draft confidences or entropies (both travel together)."""
    return bool(controller.wants_confidences or controller.wants_entropies)


def _has_prefill(scheduler_output: Any) -> bool:
    """True when the step scheduled more tokens than its decodes and drafts (1 + drafts per
    running request): some request was prefilling."""
    spec = scheduler_output.scheduled_spec_decode_tokens
    decode_tokens = sum(1 + len(spec.get(r, ())) for r in scheduler_output.num_scheduled_tokens)
    return scheduler_output.total_num_scheduled_tokens > decode_tokens
