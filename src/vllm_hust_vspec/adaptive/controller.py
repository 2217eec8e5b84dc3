"""The controller: ``observe(step_result)`` / ``decide(batch) -> Decision``.

One :class:`Controller` per engine (the process that schedules).  It owns the shared
estimators (:mod:`.estimators`), one policy (:mod:`.policies`), the optional per-request
stop, the control interval and the decision trace records.

Usage (the plugin; the simulator does the same)::

    ctl = Controller(ControllerConfig(kmax=4, policy="online"))
    d = ctl.decide(BatchView(step=s, req_ids=ids))      # K for the next draft
    ...
    ctl.observe(StepResult(step=s, batch_size=B, k_verified=K, results=..., wall_ms=ms))

Knobs (``ControllerConfig``; each knob's default and range are those of its option in the
``controller`` group of ``settings.py``, read from the schema; build one from settings with
:meth:`ControllerConfig.from_settings` and a plain mapping of option names):

* ``min_gamma``/``kmax``: the K range (min 0 allowed); ``control_interval``: steps between
  decisions (the previous decision is repeated in between, its K_i re-mapped to the batch);
* ``hysteresis``, ``switch_error``, ``max_gamma_step``, ``exploration``, ``warmup_samples``: online policy;
* ``ewma_weight``: decay of the acceptance estimator; ``window``: step-cost samples kept;
* ``stop``/``stop_threshold``/``stop_entropy``: per-request stop (:mod:`.policies.stop`);
* ``trace``: keep decision-trace records for :meth:`Controller.drain_records`.

Cost: observe()+decide() is a few tens of microseconds at batch 256 (tests/unit/
test_decide_speed.py) when the engine passes the per-request counts as arrays
(``StepResult(drafted=..., accepted=..., confidences=...)`` with ``results=()``, as the
plugin's engine does); one :class:`RequestResult` per request costs ~13 microseconds more to
count at batch 256 (and the confidence map reads their tuples in Python).  Per-request
K_i come back as a :class:`~.observations.KiArray` from the per-request policies: read them
in batch order with :func:`~.observations.ki_array`.
Online-policy guarantees count *policy decisions*, i.e. steps / ``control_interval``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .. import settings as schema

from .estimators import (
    AcceptanceEstimator,
    ConfidenceMap,
    StepCostModel,
    position_counts,
    position_counts_arrays,
)
from ..names import ENTROPY_TOPK, MAX_ENTROPY, STOP_MODES
from .first_drafts import FirstDraftDepth
from .observations import BatchView, Decision, StepResult
from .policies.base import PolicyContext
from .policies.registry import make_policy
from .policies.stop import StopRule
from .trace import decision_record, header_record, result_record


def _opt(name: str) -> Any:
    """A field backed by the settings option ``name``: its default IS the option's default
    in the schema (:data:`vllm_hust_vspec.settings.OPTIONS`), the one source of truth."""
    return field(default=schema.option(name).default, metadata={"option": name})


@dataclass
class ControllerConfig:
    kmax: int
    policy: str = _opt("adaptive_policy")  # NAME or NAME:ARG ("fixed:3", "schedule:1-4:4", ...)
    min_gamma: int = _opt("adaptive_min_gamma")
    control_interval: int = _opt("adaptive_control_interval")
    hysteresis: float = _opt("adaptive_hysteresis")
    switch_error: float = _opt("adaptive_switch_error")
    max_gamma_step: int = _opt("adaptive_max_gamma_step")
    ewma_weight: float = _opt("adaptive_ewma_weight")
    exploration: float = _opt("adaptive_online_exploration")
    warmup_samples: int = _opt("adaptive_online_warmup_samples")
    window: int = _opt("adaptive_online_window")
    stop: str = _opt("adaptive_stop")
    stop_threshold: float = _opt("adaptive_stop_threshold")
    stop_entropy: float = _opt("adaptive_stop_entropy")  # nats (see .policies.stop)
    seed: int = 0
    fixed_gamma: int | None = _opt("adaptive_fixed_gamma")
    # the schedule policy's table: text ('1-4:4,5-32:2') or the host's (lo, hi, K) rows
    schedule: str | tuple[tuple[int, int, int], ...] | None = _opt("adaptive_schedule")
    sweep: tuple[int, ...] | None = _opt("adaptive_sweep")
    profile: str | None = _opt("adaptive_profile")  # latency profile path (profile policy)
    cost_table: str | None = None  # cost table path (budget policy)
    start_gamma: int | None = None  # online: the K held before warm-up ends (default kmax)
    trace: bool = False  # keep decision-trace records (drain_records)
    # passed to policy factories; "acceptance" / "cost" sub-dicts tune the estimators
    # (AcceptanceEstimator / StepCostModel keyword arguments)
    extra: dict[str, Any] = field(default_factory=dict)

    # settings.py option name -> field (from the fields' metadata, set below the class)
    SETTINGS_MAP: ClassVar[dict[str, str]]

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], kmax: int, **overrides: Any):
        """Build from a mapping of settings option names (``adaptive_*``); options not in
        the mapping or ``None`` keep this class's defaults."""
        kw: dict[str, Any] = {}
        for opt, fld in cls.SETTINGS_MAP.items():
            v = settings.get(opt)
            if v is not None:
                kw[fld] = tuple(v) if fld == "sweep" else v
        kw.update(overrides)
        return cls(kmax=kmax, **kw)

    def validate(self) -> None:
        """One clear ValueError naming the field for a bad value.  The ranges are the
        options' ranges in the settings schema."""
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"controller config: {name}={getattr(self, name)!r} {why}")

        if not isinstance(self.kmax, int) or self.kmax < 0:
            raise bad("kmax", "must be an integer >= 0")
        if not isinstance(self.min_gamma, int) or not 0 <= self.min_gamma <= self.kmax:
            raise bad("min_gamma", f"must be in [0, kmax={self.kmax}]")
        for f in _RANGED_FIELDS:
            opt = schema.option(f.metadata["option"])
            value = getattr(self, f.name)
            if value is None:
                continue
            if (opt.minimum is not None and value < opt.minimum) or (
                opt.maximum is not None and value > opt.maximum
            ):
                hint = ""
                if f.name == "stop_entropy":
                    hint = (f" nats (ln {ENTROPY_TOPK} = {MAX_ENTROPY:g} is the most a "
                            f"top-{ENTROPY_TOPK} entropy can be)")
                if opt.maximum is None:
                    raise bad(f.name, f"must be >= {opt.minimum:g}")
                raise bad(f.name, f"must be in {opt.range_label()}{hint}")
        if self.stop not in STOP_MODES:
            raise bad("stop", f"must be one of {', '.join(STOP_MODES)}")

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out.get("sweep") is not None:
            out["sweep"] = list(out["sweep"])
        if isinstance(out.get("schedule"), tuple):
            out["schedule"] = [list(e) for e in out["schedule"]]
        return out


ControllerConfig.SETTINGS_MAP = {
    f.metadata["option"]: f.name for f in dataclasses.fields(ControllerConfig) if "option" in f.metadata
}
# numeric fields checked against their option's [minimum, maximum] (min_gamma also needs kmax)
_RANGED_FIELDS = tuple(
    f for f in dataclasses.fields(ControllerConfig)
    if "option" in f.metadata and f.name not in ("min_gamma", "fixed_gamma", "sweep")
    and schema.option(f.metadata["option"]).type in ("int", "float")
)


class Controller:
    """observe()/decide() for one engine; see the module docstring."""

    def __init__(self, config: ControllerConfig) -> None:
        config.validate()
        self.config = config
        kmax = config.kmax
        self.kmax = kmax
        self.acceptance = AcceptanceEstimator(
            kmax, weight=config.ewma_weight, **config.extra.get("acceptance", {})
        )
        self.cost = StepCostModel(window=config.window, **config.extra.get("cost", {}))
        self.confidence_map = ConfidenceMap()
        self.ctx = PolicyContext(
            kmax=kmax,
            min_gamma=config.min_gamma,
            acceptance=self.acceptance,
            cost=self.cost,
            confidence_map=self.confidence_map,
            rng=np.random.default_rng(config.seed),
            hysteresis=config.hysteresis,
            switch_error=config.switch_error,
            max_gamma_step=config.max_gamma_step,
            exploration=config.exploration,
            warmup_samples=config.warmup_samples,
        )
        cfg = dict(config.extra)
        cfg.update(
            min_gamma=config.min_gamma,
            fixed_gamma=config.fixed_gamma,
            schedule=config.schedule,
            sweep=config.sweep,
            profile=config.profile,
            cost_table=config.cost_table,
            seed=config.seed,
            start_gamma=config.start_gamma,
            window=config.window,
            ewma_weight=config.ewma_weight,
        )
        self.policy = make_policy(config.policy, kmax, **cfg)
        self.stop = (
            StopRule(config.stop, config.stop_threshold, config.stop_entropy)
            if config.stop != "off" else None
        )
        self._trusted = bool(getattr(type(self.policy), "trusted", False))
        # the joiners' first drafts: cut by the adaptive policies only (a fixed K drafts K
        # for every request, as vLLM does)
        self.first_drafts = (FirstDraftDepth(kmax, config.ewma_weight)
                             if getattr(type(self.policy), "cuts_first_drafts", False) else None)
        policy_conf = bool(getattr(self.policy, "uses_confidences", False))
        # the confidence map is read by the budget policy and the survival stop only
        self._want_confidence_map = policy_conf or config.stop == "survival"
        self._want_conf = self._want_confidence_map or config.stop == "confidence"
        self._interval = config.control_interval
        self._trace = config.trace
        self._last: Decision | None = None
        self._records: list[dict[str, Any]] = []
        self._draft_min_known = False  # set_draft_min_steps, or learnt from a K = 0 step
        # stats
        self.k_hist = [0] * (kmax + 1)
        self.decisions = 0
        self.steps = 0
        self.committed = 0
        self.requests = 0
        self.accepted_total = 0
        self.drafted_total = 0
        self.timed_ms = 0.0
        self.timed_committed = 0

    @property
    def wants_confidences(self) -> bool:
        """True when the policy or the stop uses draft confidences (and the confidence map is
        kept): the engine asks its drafters for them only then."""
        return self._want_conf

    @property
    def wants_entropies(self) -> bool:
        """True when the stop rule reads the drafts' top-k entropies (``stop="entropy"``):
        the engine fills ``BatchView.entropies`` only then."""
        return self.stop is not None and self.stop.mode == "entropy"

    # ------------------------------------------------------------------ host facts
    def set_draft_min_steps(self, passes: int) -> None:
        """The drafter's forward passes in a step that drafts K = 0 (a fact of the host's
        method, ``methods.draft_forwards(method, 0)``); without it the controller learns it
        from the first timed step that drafted K = 0."""
        self.cost.draft_min_steps = int(passes)
        self._draft_min_known = True

    @property
    def needs_cost_table(self) -> bool:
        """True when the policy prices steps from a cost table it does not have yet (the
        ``budget`` policy without ``budget:PATH``): the start-up cost table goes in."""
        return (getattr(self.policy, "name", None) == "budget"
                and getattr(self.policy, "table", None) is None)

    @property
    def uses_step_costs(self) -> bool:
        """True when the policy prices K with the online step-cost model (``online``;
        ``budget`` outside its cost table): the start-up cost probe seeds it."""
        return bool(getattr(self.policy, "uses_step_costs", False))

    def seed_step_costs(self, samples: Any) -> None:
        """Step times measured before the first decision (the start-up cost probe):
        ``(batch, verify tokens, drafter passes, ms)`` each, the step-cost model's prior
        (:meth:`~.estimators.StepCostModel.seed`: they price K and age like served steps,
        and the first served step of a cell replaces them)."""
        if self.decisions or self.steps:
            raise RuntimeError("vllm-hust-vspec: step costs are seeded only before the first step")
        for batch, verify, passes, ms in samples:
            self.cost.seed(int(batch), int(verify), int(passes), float(ms))

    def use_cost_table(self, table: Any) -> None:
        """Give the policy its one immutable cost table, before the first step."""
        if self.decisions or self.steps:
            raise RuntimeError("vllm-hust-vspec: a cost table is installed only before the first step")
        self.policy.table = table
        self.config.cost_table = table.source

    # ------------------------------------------------------------------ observe
    def observe(self, result: StepResult) -> None:
        """Learn from one step's verification results (they may describe a decision made a
        step or more earlier)."""
        res = result.results
        kmax = self.kmax
        if result.drafted is not None and result.accepted is not None:
            tried, acc, dsum, asum = position_counts_arrays(result.drafted, result.accepted, kmax)
            n = len(result.drafted)
        elif res:
            tried, acc, dsum, asum = position_counts(res, kmax)
            n = len(res)
        else:
            tried = None
            dsum = asum = n = 0
        # the policy may reuse the drafted total (see PolicyContext.step_counts)
        self.ctx.step_counts = (result, dsum) if tried is not None and (
            result.drafted is None or result.accepted is not None) else None
        est_tried, est_acc = (tried, acc) if tried is not None else (None, None)
        first = None
        if result.first is not None and result.drafted is not None and tried is not None:
            first = np.asarray(result.first, dtype=bool)
            if first.shape != (n,):
                raise ValueError(f"StepResult.first has shape {first.shape}, drafted ({n},)")
            if not first.any():
                first = None
        if first is not None:
            drafted, accepted = np.asarray(result.drafted), np.asarray(result.accepted)
            # a request's first verification (the drafts its prefill step made) is kept out
            # of the acceptance estimate: measured on the CPU host's fixtures, those drafts
            # are accepted at 6 % a token against 43 % later (transformers and vLLM alike),
            # and a burst of 16 arrivals put 16-64 such trials in one step, pulled position
            # 1 from ~0.65 to 0.30-0.45 and held K = 0 at batch 16 for up to 180 decisions
            keep = ~first
            est_tried, est_acc, _, _ = position_counts_arrays(drafted[keep], accepted[keep], kmax)
            if self.first_drafts is not None:
                self.first_drafts.observe(drafted[first], accepted[first])
        if est_tried is not None and kmax and est_tried[0]:
            self.acceptance.update_counts(est_tried, est_acc)
        else:
            self.acceptance.decay_only()
        if self._want_confidence_map:
            if result.confidences is not None and result.drafted is not None:
                self.confidence_map.update_arrays(result.confidences, result.drafted, result.accepted)
            elif res and res[0].confidences is not None:
                self.confidence_map.update(res)
        b = result.batch_size
        ms = result.wall_ms
        if result.catch_up is not None and b > 0:
            # a resume: its time beyond the price of its K is the catch-up's
            tokens, resume_ms = result.catch_up
            d = result.num_draft_steps
            price = self.cost.predict(b, b + dsum, result.drafted_k if d is None else d)
            if price is not None:
                self.ctx.catch_up.add(int(tokens), float(resume_ms) - price)
        if ms is not None and b > 0:
            # the drafter passes of THIS step: they drafted k_drafted (the verified drafts
            # were made by the step before, at k_verified)
            k_drafted = result.drafted_k
            d = result.num_draft_steps
            if d is None:
                d = k_drafted
            elif k_drafted == 0 and not self._draft_min_known:
                self.cost.draft_min_steps = d
                self._draft_min_known = True
            self.cost.add(b, b + dsum, d, ms, track=result.catch_up is None)
            self.timed_ms += ms
            self.timed_committed += n + asum
        self.steps += 1
        self.committed += n + asum
        self.requests += n
        self.accepted_total += asum
        self.drafted_total += dsum
        self.policy.observe(result, self.ctx)
        self.ctx.step_counts = None
        if self._trace:
            firsts = None
            if first is not None:
                firsts = (int(drafted[first].sum()), int(accepted[first].sum()))
            self._records.append(result_record(result, dsum, asum, firsts))

    # ------------------------------------------------------------------ decide
    def decide(self, batch: BatchView) -> Decision:
        """K (and optionally K_i) for the requests of ``batch``."""
        ctx = self.ctx
        last = self._last
        if last is not None and ctx.decisions % self._interval != 0:
            d = self._repeat(last, batch)
        else:
            d = self.policy.decide(batch, ctx)
            if self.stop is not None:
                d = self.stop.apply(d, batch, ctx)
            self._check(d)
            if batch.joining and self.first_drafts is not None:
                k_first = self.first_drafts.depth(d.k, self.acceptance.estimate())
                if k_first is not None:
                    d = dataclasses.replace(d, k_first=k_first)
            self._last = d
        ctx.decisions += 1
        ctx.last_k = d.k
        self.k_hist[d.k] += 1
        self.decisions += 1
        if self._trace:
            rec = decision_record(batch.step, time.time(), len(batch.req_ids), d)
            if batch.catch_up_tokens:
                rec["catch_up"] = int(batch.catch_up_tokens)  # what K > 0 would catch up
            if batch.joining:
                rec["joining"] = int(batch.joining)  # requests prefilling beside the batch
                if d.k_first is not None:
                    rec["k_first"] = d.k_first  # their first drafts' depth
            self._records.append(rec)
        return d

    def _repeat(self, last: Decision, batch: BatchView) -> Decision:
        k_i = None
        if last.k_i is not None:
            prev = last.k_i
            k = last.k
            k_i = {r: prev.get(r, k) for r in batch.req_ids}
        return Decision(
            k=last.k, k_i=k_i, policy=last.policy, reason="hold (control interval)",
            est_accept=last.est_accept, est_cost_ms=last.est_cost_ms,
        )

    def _check(self, d: Decision) -> None:
        if not self.config.min_gamma <= d.k <= self.kmax:
            raise ValueError(
                f"policy {d.policy!r} chose K={d.k} outside [{self.config.min_gamma}, "
                f"{self.kmax}]"
            )
        if d.k_i is not None and not self._trusted and len(d.k_i):
            # built-in policies construct valid K_i; others are checked in full
            m = max(d.k_i.values())
            if m != d.k or min(d.k_i.values()) < 0:
                raise ValueError(
                    f"policy {d.policy!r}: per-request K_i (max {m}) do not match batch "
                    f"K={d.k}"
                )

    # ------------------------------------------------------------------ tracing / stats
    def trace_header(
        self, settings: Mapping[str, Any] | None = None, host: Any = None
    ) -> dict[str, Any]:
        """Line 1 of the decision trace; ``settings`` defaults to this controller's config."""
        s = dict(settings) if settings is not None else self.config.as_dict()
        s.setdefault("policy_detail", self.policy.describe())
        return header_record(s, host)

    def drain_records(self) -> list[dict[str, Any]]:
        """Decision and result records produced since the last call (``trace=True``)."""
        out = self._records
        self._records = []
        return out

    last_records = drain_records

    @property
    def stats(self) -> dict[str, Any]:
        """Summary for the periodic log line."""
        n = self.decisions
        mean_k = sum(k * c for k, c in enumerate(self.k_hist)) / n if n else 0.0
        return {
            "policy": self.policy.name,
            "decisions": n,
            "steps": self.steps,
            "k_hist": {k: c for k, c in enumerate(self.k_hist) if c},
            "mean_k": mean_k,
            # committed tokens per request-step (1 + accepted)
            "mean_accepted_len": self.committed / self.requests if self.requests else 0.0,
            "acceptance_rate": (
                self.accepted_total / self.drafted_total if self.drafted_total else 0.0
            ),
            "goodput_tok_s": (
                1000.0 * self.timed_committed / self.timed_ms if self.timed_ms > 0 else None
            ),
            "est_accept": list(self.acceptance.estimate()),
            "cost_model": {
                "coef": list(self.cost.coef),
                "knees": list(self.cost.knees),
                "rmse_ms": self.cost.rmse,
                "samples": self.cost.n,
            },
        }
