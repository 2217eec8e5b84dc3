"""The engine-core side of the plugin: one :class:`EngineRuntime` per scheduler.

Each patch makes one call in here: ``scheduler-k`` -> :func:`attach`; ``spec-stats`` ->
:meth:`EngineRuntime.on_verified`; ``step-output`` -> :meth:`EngineRuntime.output_step`;
``draft-trim`` -> :meth:`EngineRuntime.trimmed`; ``async-placeholders`` ->
:meth:`EngineRuntime.cut_placeholders`; ``draft-confidence-request`` ->
:attr:`EngineRuntime.wants_draft_signals`; ``admission`` -> :meth:`EngineRuntime.admission_limit`.  They find the runtime with :func:`runtime_of`.

The runtime composes parts with one job each: the decision gate
(:mod:`~vllm_hust_vspec.runtime.gate`: K, K_i limits, the decision from the drafts), the
step clock (:mod:`~vllm_hust_vspec.runtime.step_clock`: every timestamp of a step and the
K pipeline), the verified collector (:mod:`~vllm_hust_vspec.runtime.verified`) and the
outputs (:mod:`~vllm_hust_vspec.runtime.outputs`: decision trace, simulator trace, log).
The start-up calibration forces a K through :meth:`EngineRuntime.override_k` (its object
lives in ``startup_cost/``).

Step timeline (synchronous scheduling, the CPU host): ``schedule()`` of step ``s`` asks
:class:`KLookup` for K_s (the decision is traced); the workers verify the drafts of step
``s-1`` and draft K_s tokens; ``update_from_output`` of step ``s`` brings the verification
results (drafted counts follow K_{s-1}) and the wall time from the decision to the output;
``update_draft_token_ids`` then cuts each request's new drafts to its K_i.

With draft confidences (the controller uses them: ``budget`` policy, a per-request stop; see
docs/confidence.md) the decision moves to the drafts it is about:
``update_draft_token_ids`` of step ``s`` brings the drafts of step ``s`` with their confidences,
the controller decides there (one decision per step, traced as step ``s+1``), the drafts are
cut to its K_i, and ``schedule()`` of step ``s+1`` takes its K as the batch draft depth.

Asynchronous scheduling (two steps in flight): ``schedule()`` of step ``s+1`` runs before the
output of step ``s`` reaches ``update_from_output``; the drafts stay on the workers and the
verify width of each request's drafts is its placeholders, cut to K_i when its step is
scheduled (``async-placeholders``).  The confidences of the drafts of step ``s`` come with the
output of step ``s`` (``draft-confidence-output``): they are kept for the verification of those
drafts in step ``s+1``, and the next decision (step ``s+2``, traced so) is made from them, the
freshest the engine core has.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from vllm_hust_vspec import methods
from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.adaptive.observations import StepResult
from vllm_hust_vspec.host.detect import host_label, process_label, uses_v2_runner
from vllm_hust_vspec.runtime.admission import Admission, cohort_size
from vllm_hust_vspec.runtime.announce import announce, patches_in_effect
from vllm_hust_vspec.runtime.controller_factory import (build_controller, check_settings,
                                                        entry_settings, is_fixed_at)
from vllm_hust_vspec.runtime.drafter_ledger import DrafterLedger
from vllm_hust_vspec.runtime.fault import FaultGuard
from vllm_hust_vspec.runtime.gate import DecisionGate, decision_batch
from vllm_hust_vspec.runtime.metrics_feed import MetricsFeed, cost_state
from vllm_hust_vspec.runtime.outputs import RuntimeOutputs, header_meta
from vllm_hust_vspec.runtime.rotation import Rotation
from vllm_hust_vspec.runtime.sim_trace import SimTraceRecorder
from vllm_hust_vspec.runtime.specconfig import check_speculative_config
from vllm_hust_vspec.runtime.step_clock import StepClock
from vllm_hust_vspec.runtime.verified import VerifiedCollector

logger = logging.getLogger("vllm_hust_vspec")

_ATTR = "_vspec_runtime"  # the scheduler attribute that holds its runtime (runtime_of)


class KOverride(Protocol):
    """A K forced from outside the controller (the start-up calibration's
    ``startup_cost.forced.ForcedK``): while installed it decides every step and sees
    every output; nothing reaches the controller, the decision trace or the recorder."""

    def decide(self, running: Sequence[Any]) -> tuple[int, dict[str, int] | None]:
        """(K for the host's lookup, per-request limits or None) for this step."""

    def observe(self, t_output: float, scheduler_output: Any) -> None:
        """This step's output reached the scheduler at ``t_output``."""


class KLookup:
    """Stands in for ``Scheduler.dynamic_sd_lookup``: ``lookup[batch_size] -> K``.

    The host's key (``len(num_scheduled_tokens)`` so far) also counts the prefills that join
    the step; the runtime reads the running requests itself, so the key is not used."""

    def __init__(self, runtime: EngineRuntime) -> None:
        self.runtime = runtime

    def __getitem__(self, batch_size: int) -> int:
        return self.runtime.decide()

    def __len__(self) -> int:  # the host's dense table has max_num_seqs + 1 entries
        return self.runtime.max_num_seqs + 1


class EngineRuntime:
    """The plugin's state in one engine core, attached to its scheduler.

    ``scheduler`` is read for: ``vllm_config.speculative_config`` (``method``,
    ``num_speculative_tokens_per_batch_size``), ``num_spec_tokens``, ``scheduler_config``
    (``max_num_seqs``, ``async_scheduling``), ``running`` and ``requests``."""

    def __init__(self, scheduler: Any, settings: settings_mod.Settings,
                 pads_to_kmax: bool = False) -> None:
        spec = scheduler.vllm_config.speculative_config
        self.scheduler = scheduler
        self.settings = settings
        self.method = methods.served_method(spec)
        self.kmax = int(scheduler.num_spec_tokens)
        self.max_num_seqs = int(scheduler.scheduler_config.max_num_seqs)
        self.varies_k = methods.varies_k(self.method)
        if self.varies_k and methods.host_fixes_k(scheduler.vllm_config, str(spec.method)):
            # vLLM 0.33+ turned dynamic SD off for this method on its V1 runner: the host
            # would not honour a per-step K, so the plugin keeps Kmax and trims per request
            self.varies_k = False
            logger.warning(
                "vllm-hust-vspec: vLLM turns per-step K off for method %s on its V1 model "
                "runner (VllmConfig.%s): K stays Kmax=%d; the controller trims each "
                "request's verified drafts only", self.method, methods.HOST_V1_GATE,
                int(scheduler.num_spec_tokens))
        self._sync = not getattr(scheduler.scheduler_config, "async_scheduling", False)
        # vLLM's V2 model runner (0.33+ on CUDA): the worker-side patches hook V1 classes
        self.v2 = uses_v2_runner(scheduler.vllm_config)
        # drafter passes at K = 0, a fact of the method (the host runs one forward; none for
        # the draft model under synchronous scheduling, patch drafter-k0)
        self._skip_k0 = self._sync and settings.adaptive_k0_drafter == "skip"
        self.draft_min_steps = methods.draft_forwards(self.method, 0, self._skip_k0)
        # the drafter's K = 0 skips and catch-ups, for the decision trace
        self.ledger = (DrafterLedger() if self._skip_k0 and self.method in methods.K0_SKIPPED
                       else None)
        host_table = getattr(spec, "num_speculative_tokens_per_batch_size", None)
        # the paired comparison (adaptive_compare): one controller per policy, taking turns
        entries = settings_mod.compare_entries(settings)
        self.rotation = (Rotation(entries, settings.adaptive_compare_window,
                                  settings.adaptive_compare_waves) if entries
                         else None)
        # the paired comparison: the time spent on the deciding policy's own work (its
        # observation of the step before, its decision, its trace records) since the last
        # output, which the cycle ending at the next output pays (ms)
        self._policy_ms = 0.0
        self._parts = [self._parts_for(entry_settings(settings, e), host_table)
                       for e in entries]
        # draft confidences: asked of the workers only when the controller uses them, and only
        # where the V1 runner drafts (the worker patches hook it)
        if self._parts:
            self._activate(0)
            self.policy = "compare:" + ",".join(entries)
        else:
            self._controller(settings, host_table)
        self.step = 0
        # admission control (--adaptive-refill-batch): the batch refills in cohorts
        self.admission = (None if settings.adaptive_refill_batch is None else Admission(
            cohort_size(settings.adaptive_refill_batch, self.method),
            settings.adaptive_refill_max_wait_steps))
        # a fault in the controller: the engine runs on at the safe K (runtime/fault.py)
        self.fault = FaultGuard(0 if self.varies_k else self.kmax)
        self._inject_at = int(settings.adaptive_inject_fault)  # a fault drill's step (0: none)
        self.clock = StepClock(self.kmax)
        self._verified = VerifiedCollector()
        # confidence and entropy of verified draft positions: sums and count, accepted / rejected
        self.confidence_outcomes = self._verified.outcomes
        self.k_override: KOverride | None = None
        self.k_step = self.kmax  # the K the latest decision gave the host (the drafters' K)
        # the host hands drafts and placeholders over Kmax wide whatever K the drafters made
        # (vLLM-HUST 0.17, attached without a K lookup): they are cut to k_step here too
        self.pads_to_kmax = pads_to_kmax
        # where vLLM's pickled or forked engine core starts, the host info is recomputed
        self.host = host_label()
        header = self.controller.trace_header(
            settings.as_dict("plugin"),
            header_meta(self.host, self.method, self.kmax, self.max_num_seqs, self.policy))
        lossy = settings_mod.lossy_rules(settings)
        if lossy:  # only then: a strict run's header is what it always was
            header["lossy_acceptance"] = list(lossy)
        # the controller's state for /metrics, where the host sends per-step stats
        metrics = MetricsFeed() if getattr(scheduler, "log_stats", False) else None
        self.outputs = RuntimeOutputs(settings, header, self._recorder(settings), metrics)
        self._state_source: tuple[Any, bool] | None = None  # what the /metrics state reflects
        # this step's requests that produced tokens: id -> (request, output position before)
        self._positions: dict[str, tuple[Any, int]] = {}

    def _parts_for(self, settings: settings_mod.Settings,
                   host_table: Any = None) -> tuple[Any, DecisionGate, bool]:
        """A controller, its decision gate, and whether it reads draft confidences."""
        controller = build_controller(settings, self.kmax, host_table=host_table, trace=True)
        controller.set_draft_min_steps(self.draft_min_steps)
        gate = DecisionGate(controller, self.kmax, self.varies_k)
        return controller, gate, _wants_signals(controller) and not self.v2

    def _controller(self, settings: settings_mod.Settings, host_table: Any = None) -> None:
        """The one controller of an engine that compares nothing."""
        self.controller, self.gate, self._wants_conf = self._parts_for(settings, host_table)
        self.policy = self.controller.config.policy

    def _activate(self, index: int) -> None:
        """The compared policy ``index`` decides from now on."""
        self.controller, self.gate, self._wants_conf = self._parts[index]

    @property
    def skip_k0(self) -> bool:
        """The draft-model drafter sits out K = 0 steps (patch ``drafter-k0``)."""
        return self._skip_k0

    @property
    def controllers(self) -> list[Any]:
        """Every controller of this engine (one per compared policy, else the one)."""
        return [p[0] for p in self._parts] or [self.controller]

    @property
    def needs_cost_table(self) -> bool:
        """True when a controller prices steps from a cost table it does not have yet."""
        return any(c.needs_cost_table for c in self.controllers)

    def use_cost_table(self, table: Any) -> None:
        """The start-up cost table, to every controller that needs one."""
        for c in self.controllers:
            if c.needs_cost_table:
                c.use_cost_table(table)

    def _recorder(self, settings: settings_mod.Settings) -> SimTraceRecorder | None:
        if not settings.adaptive_record_trace:
            return None
        if not is_fixed_at(self.controller.config, self.kmax):
            check_settings(settings, self.kmax)  # raises the clear error
        return SimTraceRecorder(
            str(settings.adaptive_record_trace), self.kmax, self.max_num_seqs,
            draft_min_steps=self.draft_min_steps,
            meta={"method": self.method, "host": self.host},
        )

    def reconfigure(self, settings: settings_mod.Settings) -> None:
        """Replace the controller (same Kmax) by one built from ``settings`` (tests switch
        policies inside one engine; a paired comparison ends).  The trace and the recorder
        are unchanged."""
        self.rotation = None
        self._parts = []
        self._controller(settings)
        self.settings = settings

    @property
    def wants_draft_signals(self) -> bool:
        """True when this step's workers should compute draft confidences
        (``draft-confidence-request`` reads it after every ``schedule()``)."""
        return self._wants_conf and self.k_override is None and not self.fault.tripped

    # ------------------------------------------------------------------ decide
    def decide(self) -> int:
        """The K of this step for the host's lookup (asked by ``schedule()``); kept in
        :attr:`k_step` until the next decision."""
        self.k_step = self._decide()
        return self.k_step

    def _decide(self) -> int:
        running = list(self.scheduler.running)
        if self.k_override is not None:
            k_host, limits = self.k_override.decide(running)
            self.gate.force(limits)
            if k_host == 0 and self.ledger is not None:
                self.ledger.ever_skipped = True  # the workers' drafter sat this step out
            return k_host
        self.step += 1
        if not self.fault.tripped:
            try:
                if self.step == self._inject_at:
                    raise RuntimeError(f"fault injected at step {self.step} "
                                       "(adaptive_inject_fault)")
                t0 = time.perf_counter()
                if self.rotation is not None:
                    index = self.rotation.decision(self.step, [
                        (r.request_id, r.prompt_token_ids or ()) for r in running]
                        if self.rotation.waves else ())
                    if self._parts[index][0] is not self.controller:
                        self._activate(index)
                d = self.gate.decide(self.step, running,
                                     None if self.ledger is None else self.ledger.pending)
                t = time.perf_counter()
                self._flush_records()  # before the clock opens: a fault here opens no step
                self._policy_ms += (time.perf_counter() - t0) * 1000.0
                self.clock.open(self.step, d.k, t)
                return d.k_host
            except Exception:
                self._trip("decide")
        k = self.fault.safe_k
        self.gate.force(None)
        t = time.perf_counter()
        self.clock.open(self.step, k, t)
        self.outputs.records([self.fault.decision_record(
            self.step, time.time(), len(decision_batch(running)))])
        return k

    def admission_limit(self) -> int | None:
        """The admission limit of this ``schedule()`` (patch ``admission``): None keeps the
        host's; else the slots already taken (hold the waiting requests this step).  Never
        holds while a forced K runs (the start-up calibration); a fault here turns admission
        control off for the rest of the engine's life, and the host admits as it would."""
        if self.admission is None or self.k_override is not None:
            return None
        s = self.scheduler
        try:
            occupied = len(s.running) + int(getattr(s, "num_waiting_for_streaming_input", 0))
            waiting = len(s.waiting) + len(getattr(s, "kv_holding_waiting", ()))
            limit = self.admission.limit(occupied, waiting, int(s.max_num_active_reqs))
            if limit is not None:  # the step this schedule() decides (or decided from drafts)
                self.outputs.records([{"step": self.step + 1,
                                       "admission": {"held": self.admission.held_now}}])
            return limit
        except Exception:
            logger.exception("vllm-hust-vspec: admission control failed; the host admits "
                             "waiting requests as it would from now on")
            self.admission = None
            return None

    def draft_limit(self, req_id: str) -> int | None:
        return self.gate.limit(req_id)

    def cut_placeholders(self, scheduler_output: Any) -> None:
        """Async scheduling: each decoding request's draft placeholders (``spec_token_ids``,
        set by ``_update_after_schedule``) cut to min(K, its limit) (left as the host set
        them after a fault here).  K is the host's
        ``SchedulerOutput.num_spec_tokens_to_schedule`` (vLLM >= 0.24, whose placeholders
        already have that length), or :attr:`k_step` where the host sets Kmax placeholders
        (:attr:`pads_to_kmax`: vLLM-HUST 0.17)."""
        self._guarded("cut the draft placeholders", self._cut_placeholders, scheduler_output)

    def _cut_placeholders(self, scheduler_output: Any) -> None:
        k = (self.k_step if self.pads_to_kmax
             else scheduler_output.num_spec_tokens_to_schedule)
        requests = self.scheduler.requests
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests[req_id]
            if request.is_prefill_chunk:
                continue
            limit = self.gate.limit(req_id)
            n = k if limit is None else min(limit, k)
            if n < k or len(request.spec_token_ids) > n:  # 0.17: Kmax placeholders
                request.spec_token_ids = [-1] * n

    def trimmed(self, draft_token_ids: Any) -> Any:
        """The workers' drafts (``DraftTokenIds``, with the confidences the workers may have
        attached) cut to each request's limit (and to :attr:`k_step`, the K they were drafted
        for, where the host pads drafts to Kmax: :attr:`pads_to_kmax`): the same object when
        nothing is cut (nor after a fault here: the target verifies whatever was drafted)."""
        try:
            return self._trimmed(draft_token_ids, self.k_step if self.pads_to_kmax else None)
        except Exception:
            self._trip("trim the drafts")
            self._verified.drop_kept()
            return draft_token_ids

    def _trimmed(self, draft_token_ids: Any, width: int | None = None) -> Any:
        trimmed = self.trim_drafts(draft_token_ids.req_ids, draft_token_ids.draft_token_ids,
                                   getattr(draft_token_ids, "vspec_confidences", None),
                                   getattr(draft_token_ids, "vspec_entropies", None), width)
        if trimmed is None:
            return draft_token_ids
        return type(draft_token_ids)(list(draft_token_ids.req_ids), trimmed)

    def trim_drafts(self, req_ids: list[str], drafts: list[list[int]], confidences: Any = None,
                    entropies: Any = None, width: int | None = None) -> list[list[int]] | None:
        """Each request's drafts cut to its K_i, or None when nothing changes.

        ``confidences`` / ``entropies`` (float32 arrays (len(req_ids), K) from the workers):
        the next step's decision is made here from them and its K_i cut these drafts; the
        confidences of what is kept await verification."""
        self._drafts_arrived(req_ids, confidences, entropies)
        return self.gate.trim(req_ids, drafts, width)

    def _drafts_arrived(self, req_ids: list[str], confidences: Any, entropies: Any) -> None:
        """New drafts reached the engine core, with their confidences or without: the next
        decision is made from the confidences (when the controller reads them), which are
        kept for the verification of these drafts.

        Synchronous scheduling (``trim_drafts``): the drafts of step ``s`` arrive before
        ``schedule()`` of step ``s + 1``, which verifies them; the decision is that step's and
        its K_i cut them.  Asynchronous scheduling (:meth:`output_step`): they arrive with the
        output of step ``s``, after ``schedule()`` of step ``s + 1`` set their verify widths;
        the decision is the next ``schedule()``'s, made from these confidences as the freshest
        the engine core has (the drafts that step decides about are not made yet)."""
        signals = self._wants_conf and confidences is not None and not self.fault.tripped
        # new drafts replace the old ones: so do their confidences, whichever policy decides
        # now (a paired comparison's budget window kept confidences that an online window's
        # wider drafts must not meet at verification: it raised there, in the engine core)
        self._verified.drop_kept()
        if signals and self.k_override is None:
            try:
                self.gate.decide_from_drafts(self.step + 1, req_ids, confidences,
                                             entropies, self.scheduler.requests)
                self._flush_records()
            except Exception:
                self._trip("decide from the drafts")
                self.gate.force(None)
                signals = False
        if signals:  # each request's row; what its limit keeps is what gets verified
            self._verified.keep(req_ids, confidences, entropies)

    # ------------------------------------------------------------------ observe
    def on_verified(self, req_id: str, num_draft_tokens: int, num_accepted_tokens: int,
                    num_invalid_spec_tokens: Any = None) -> None:
        """One request's verification in this step (``spec-stats``, inside the output loop;
        the drafts vLLM counts invalid are not verified drafts)."""
        if not num_draft_tokens:
            return
        try:
            invalid = (num_invalid_spec_tokens or {}).get(req_id, 0)
            request = self.scheduler.requests.get(req_id)
            ctx = int(request.num_tokens) if request is not None else 0
            # vLLM counts a verification before it appends the step's tokens: one output
            # token (the prefill's) means these are the drafts the prefill step made
            first = request is not None and int(request.num_output_tokens) <= 1
            self._verified.add(req_id, int(num_draft_tokens - invalid),
                               int(num_accepted_tokens), ctx, first)
        except Exception:
            self._trip("count a verification")

    def _guarded(self, where: str, call: Any, *args: Any) -> None:
        """``call(*args)``; a fault in it falls back to the safe K instead of reaching the
        host (which would stop the engine core)."""
        try:
            call(*args)
        except Exception:
            self._trip(where)

    @contextlib.contextmanager
    def output_step(self, scheduler_output: Any, model_runner_output: Any) -> Iterator[None]:
        """Around the host's ``update_from_output``: what the step produced is read before,
        what it verified is handed to the controller after (not when the host raises)."""
        self._guarded("read the step's output", self._before_output, scheduler_output,
                      model_runner_output)
        yield
        self._guarded("take the step's results", self._after_output, scheduler_output)
        if not self._sync:  # the drafts this step made stay on the workers: their
            # confidences came with its output (draft-confidence-output); after the results,
            # whose verified drafts met the confidences kept a step ago
            self._guarded("take the drafts' confidences", self._drafts_on_output,
                          model_runner_output)

    def _drafts_on_output(self, model_runner_output: Any) -> None:
        """Async scheduling: the step's drafts, with the confidences its output carries."""
        conf = getattr(model_runner_output, "vspec_confidences", None)
        self._drafts_arrived(model_runner_output.req_ids if conf is not None else [], conf,
                             getattr(model_runner_output, "vspec_entropies", None))

    def _before_output(self, scheduler_output: Any, model_runner_output: Any) -> None:
        self._verified.discard()
        self._positions = {}
        self.clock.arrived(time.perf_counter())
        if self.ledger is not None and self.k_override is None:
            self.ledger.before(self.scheduler.requests, scheduler_output)
        sampled = model_runner_output.sampled_token_ids
        if not sampled or not self.outputs.wants_requests:
            return
        index = model_runner_output.req_id_to_index
        requests = self.scheduler.requests
        for req_id in scheduler_output.num_scheduled_tokens:
            i = index.get(req_id)
            request = requests.get(req_id)
            if i is None or request is None or i >= len(sampled) or len(sampled[i]) == 0:
                continue
            self._positions[req_id] = (request, int(request.num_output_tokens))

    def _after_output(self, scheduler_output: Any) -> None:
        if self.k_override is not None:
            self._verified.discard()  # nothing reaches the controller while a K is forced
            self._positions = {}
            self.k_override.observe(self.clock.t_arrived, scheduler_output)
            return
        batch = len(scheduler_output.num_scheduled_tokens)
        if batch == 0:
            return
        clocked = self.clock.close()
        if clocked is None:
            return
        # A step that also ran prefill (new or chunked prompts) costs far more than its decode
        # K explains: keep its acceptance, but not its time, out of the step-cost model.
        # The cost the controller optimises is the whole engine cycle: the decision-to-output
        # window plus the engine's own time between an output and the next decision (output
        # processing, draft hand-over, scheduling), which every step pays whatever its K.
        prefill = has_prefill(scheduler_output)
        timed_ms = None if prefill else self.clock.cycle_ms(clocked.window_ms)
        # A step whose drafter first caught up the tokens it missed in K = 0 steps (patch
        # drafter-k0) also ran that pass: its time is the resume's, not its K's (priced as
        # its K, every resume made K > 0 look dearer than it is and held the policy at 0).
        drafter = None
        catch_up = None
        if self.ledger is not None:
            drafter = self.ledger.after(clocked.step, clocked.k_drafted, self.scheduler.requests)
            if drafter is not None and drafter["drafter"]["caught_up"]:
                # ... but it is what a resume costs: the controller prices resumes from it
                if timed_ms is not None:
                    catch_up = (int(drafter["drafter"]["caught_up"]), timed_ms)
                timed_ms = None
        # the step's per-request counts (and the verified drafts' confidences) as aligned
        # arrays; a step that verified nothing passes none, as an empty ``results``
        verified = self._verified.take()
        some = len(verified.req_ids) > 0
        if not self.fault.tripped:
            try:
                self._observe(clocked, batch, verified, timed_ms, prefill, catch_up)
            except Exception:
                self._trip("observe")
        if (self.rotation is not None and self.rotation.waves and not self.fault.tripped
                and not self.scheduler.has_unfinished_requests()):
            # the wave is over: its window's record now, in the trace slice of the cell
            # that served it (a client reads the slice once its requests have returned)
            self.outputs.records(self.rotation.close())
        if self.fault.tripped:  # the fallback's own account of the step
            self.outputs.records([self.fault.result(
                clocked.step, batch, int(verified.drafted.sum()) if some else 0,
                int(verified.accepted.sum()) if some else 0, timed_ms)])
        if drafter is not None:
            self.outputs.records([drafter])
        if self._positions:
            accepted = dict(zip(verified.req_ids, verified.accepted.tolist()))
            self.outputs.step(self.scheduler, self._positions, accepted, batch,
                              batch + int(verified.drafted.sum()), clocked.k_drafted,
                              clocked.window_ms)
            self._positions = {}
        self.outputs.maybe_log(self._stats)

    def _observe(self, clocked: Any, batch: int, verified: Any, timed_ms: float | None,
                 prefill: bool, catch_up: tuple[int, float] | None = None) -> None:
        """The step's results to the controller that decided it (and the paired
        comparison's window account)."""
        some = len(verified.req_ids) > 0
        controller = self.controller
        if self.rotation is not None:
            index = self.rotation.policy_of(clocked.step)
            if index is not None:
                controller = self._parts[index][0]
            # the window account counts every token of the step, whoever drafted it
            tokens = batch + (int(verified.accepted.sum()) if some else 0)
            if self.rotation.foreign(clocked.step):  # asked before output() forgets the step
                # it verified the previous policy's drafts: what they cost and how well they
                # were accepted is not this policy's (runtime/rotation.py)
                timed_ms = catch_up = None
                some = False
            # a policy's windows pay its resumes: only prefill steps are left out (of the
            # decode measurement; the wave's whole time counts them)
            steady = clocked.k_verified == clocked.k_drafted and timed_ms is not None
            self.outputs.records(self.rotation.output(
                clocked.step, batch, tokens, clocked.cycle_ms, prefill=prefill,
                steady_k=clocked.k_drafted if steady else None, policy_ms=self._policy_ms))
        t0 = time.perf_counter()
        controller.observe(StepResult(
            step=clocked.step, batch_size=batch, k_verified=clocked.k_verified, results=(),
            wall_ms=timed_ms,
            num_draft_steps=methods.draft_forwards(self.method, clocked.k_drafted, self._skip_k0),
            k_drafted=clocked.k_drafted,
            drafted=verified.drafted if some else None,
            accepted=verified.accepted if some else None,
            confidences=verified.confidences if some else None,
            context_lens=verified.context_lens if some else None,
            first=verified.first if some else None, catch_up=catch_up))
        self._flush_records()
        # the next cycle pays this observation (and the next decision: _decide adds it)
        self._policy_ms = (time.perf_counter() - t0) * 1000.0

    def _trip(self, where: str) -> None:
        """A controller call raised (inside ``except``): the engine falls back to its safe K."""
        self.fault.trip(self.step, where)
        self.rotation = None
        if self.outputs.metrics is not None:
            self.outputs.metrics.fallback()

    def _stats(self) -> dict[str, Any]:
        """The stats line's fields (the fallback's once the controller failed)."""
        if not self.fault.tripped:
            try:
                admission = {} if self.admission is None else self.admission.stats
                return {**self.controller.stats, "fallbacks": 0, **admission}
            except Exception:
                self._trip("stats")
        return self.fault.stats(self.step)

    # ------------------------------------------------------------------ forced K
    def override_k(self, override: KOverride | None) -> None:
        """Install a forced K (the start-up calibration), or remove it (None):
        the controller then decides again, from the state it had before; the drafts now
        pending were made at the host's Kmax."""
        self.k_override = override
        for gate in [p[1] for p in self._parts] or [self.gate]:
            gate.force(None)
        if self.rotation is not None:
            self.rotation.forget_pending()
        self.clock.restart()
        self._verified.discard()
        self._verified.drop_kept()
        self._positions = {}

    # ------------------------------------------------------------------ output
    def publish(self, outputs: dict[int, Any]) -> None:
        """This step's controller metrics onto the host's scheduler stats in ``outputs``
        (what ``update_from_output`` returns), for the server's ``/metrics``."""
        self._guarded("publish the metrics", self._publish, outputs)

    def _publish(self, outputs: dict[int, Any]) -> None:
        feed = self.outputs.metrics
        if feed is None or self.k_override is not None:
            return
        source = (self.controller, self.fault.tripped)  # what the state is derived from
        if source != self._state_source:  # a compared policy took over, or the fault tripped
            self._state_source = source
            feed.set_state(self.fault.state if self.fault.tripped else cost_state(self.controller))
        payload = feed.drain()
        if payload is not None:
            from vllm_hust_vspec.runtime.stats_channel import with_payload

            with_payload(outputs, payload)

    def _flush_records(self) -> None:
        for controller in self.controllers:
            self.outputs.records(controller.drain_records())


def runtime_of(scheduler: Any) -> EngineRuntime | None:
    """The runtime :func:`attach` gave ``scheduler``, or None (plugin inert there)."""
    return scheduler.__dict__.get(_ATTR)


def attach(scheduler: Any, k_lookup: bool = True) -> EngineRuntime | None:
    """Give a freshly built scheduler its runtime and K lookup (``scheduler-k`` patch).

    ``k_lookup=False`` (vLLM-HUST 0.17, patch ``hust-attach``): the host has no
    ``dynamic_sd_lookup``; the speculative config is checked here instead of in the front
    end (that host has no dynamic-SD config to patch), and ``hust-step-k`` asks
    :meth:`EngineRuntime.decide` itself.

    Does nothing when the plugin is disabled in this process's env or the engine does not
    speculate.  Settings errors propagate: the engine must not start half-configured."""
    if os.environ.get(settings_mod.ENABLE_ENV) != "1":
        return None
    spec = scheduler.vllm_config.speculative_config
    if spec is None or not scheduler.num_spec_tokens:
        logger.info("vllm-hust-vspec: no speculative decoding configured; nothing to adapt")
        return None
    settings = settings_mod.from_env()
    if not k_lookup:
        check_speculative_config(
            methods.served_method(spec), spec.num_speculative_tokens, settings,
            int(getattr(scheduler.vllm_config.parallel_config, "data_parallel_size", 1)))
        check_settings(settings, spec.num_speculative_tokens, None)
    runtime = EngineRuntime(scheduler, settings, pads_to_kmax=not k_lookup)
    if not k_lookup:
        refuse_on_017(runtime)
    scheduler.__dict__[_ATTR] = runtime
    if k_lookup:
        scheduler.dynamic_sd_lookup = KLookup(runtime)
    label = process_label()
    announce(runtime.host, "engine" if label == "frontend" else label, runtime.policy,
             runtime.kmax, patches_in_effect(), settings_mod.lossy_rules(runtime.settings))
    if runtime.v2:
        v2_notes(runtime)
    if runtime.admission is not None:
        logger.info("vllm-hust-vspec admission control: waiting requests join in cohorts of "
                    "%d (%s), held at most %d steps", runtime.admission.cohort,
                    "the method's" if runtime.settings.adaptive_refill_batch == 0 else "set",
                    runtime.admission.max_wait_steps)
    return runtime


def refuse_on_017(runtime: EngineRuntime) -> None:
    """vLLM-HUST 0.17 has the per-step K, per-request K_i and observation patches only: a
    setting that needs another patch stops the engine here, naming it."""
    s = runtime.settings
    wants = []
    if s.adaptive_refill_batch is not None:
        wants.append("adaptive_refill_batch (admission control)")
    if settings_mod.lossy_rules(s):
        wants.append("lossy acceptance (" + ", ".join(settings_mod.lossy_rules(s)) + ")")
    if settings_mod.draft_head_for(s, runtime.method, "HUST_VSPEC_* settings") is not None:
        wants.append("the drafter's active vocabulary / int8 LM head")
    if any(_wants_signals(c) for c in runtime.controllers):
        wants.append(f"draft confidences (policy {runtime.policy}, adaptive_stop "
                     f"{s.adaptive_stop})")
    if runtime.needs_cost_table:
        wants.append("the start-up calibration of the budget policy's cost table")
    if wants:
        raise settings_mod.SettingsError(
            "vLLM-HUST 0.17: the plugin has per-step K, per-request K_i and the controller's "
            "observation on this host, not: " + "; ".join(wants)
            + " (these need vLLM >= 0.24)")
    if s.adaptive_cost_probe:
        logger.info("vllm-hust-vspec: vLLM-HUST 0.17: no start-up cost probe on this host; "
                    "the policies learn step costs from served steps")


def v2_notes(runtime: EngineRuntime) -> None:
    """Say, once per engine, what the plugin cannot do on vLLM's V2 model runner."""
    logger.warning(
        "vllm-hust-vspec: vLLM's V2 model runner: K is chosen per step and graphs exist for "
        "every K; V1-only here: draft confidences (the budget policy uses its uniform rule, "
        "--adaptive-stop confidence/entropy cuts nothing), the K = 0 drafter skip, the "
        "drafter's active vocabulary / int8 head and lossy acceptance")
    if any(_wants_signals(c) for c in runtime.controllers):
        logger.warning("vllm-hust-vspec: policy %s reads draft confidences, which V2 does not "
                       "return: it decides without them", runtime.policy)
    if runtime.method == "draft_model":
        logger.warning("vllm-hust-vspec: V2's draft-model speculator drafts Kmax=%d tokens "
                       "every step; the controller's K sets how many of them are verified",
                       runtime.kmax)


def _wants_signals(controller: Any) -> bool:
    """True when the controller reads draft confidences or entropies (both travel together)."""
    return bool(controller.wants_confidences or controller.wants_entropies)


def has_prefill(scheduler_output: Any) -> bool:
    """True when the step scheduled more tokens than its decodes and drafts (1 + drafts per
    running request): some request was prefilling."""
    spec = scheduler_output.scheduled_spec_decode_tokens
    decode_tokens = sum(1 + len(spec.get(r, ())) for r in scheduler_output.num_scheduled_tokens)
    return scheduler_output.total_num_scheduled_tokens > decode_tokens
