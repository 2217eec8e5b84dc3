"""The controller on the server's own ``/metrics``: a stat logger of the API server.

vLLM's front end hands every engine step's ``SchedulerStats`` to its stat loggers; the
``stat-logger`` patch adds :class:`VspecStatLogger` to them (only where the plugin is enabled
and the server logs stats: ``--disable-log-stats`` turns these metrics off with vLLM's own).
It reads the payload the engine core put on those stats (:mod:`.stats_channel`,
:mod:`.metrics_feed`) and keeps the metrics of :mod:`.metric_names` in prometheus_client's
default registry, the one vLLM's ``/metrics`` serves: no second HTTP server.  Every metric
carries vLLM's ``model_name`` and ``engine`` labels.
"""

from __future__ import annotations

import logging
from typing import Any

import prometheus_client as prom
from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.runtime.metric_names import DECISION_KINDS, METRICS, PREFIX

logger = logging.getLogger("vllm_hust_vspec")


def _unregister_ours(registry: Any) -> None:
    """Drop collectors of an earlier logger in this process (an engine built again)."""
    for collector in list(registry._collector_to_names):
        if getattr(collector, "_name", "").startswith(PREFIX):
            registry.unregister(collector)


class VspecStatLogger(AggregateStatLoggerBase):
    """The metrics of every engine this front end serves (one instance per front end)."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        self.engine_indexes = list(engine_indexes or [0])
        kmax = int(vllm_config.speculative_config.num_speculative_tokens)
        model = vllm_config.model_config.served_model_name
        self._labels = {i: (str(model), str(i)) for i in self.engine_indexes}
        lossy = bool(settings_mod.lossy_rules(settings_mod.from_env()))
        _unregister_ours(prom.REGISTRY)
        buckets = [float(k) for k in range(kmax + 1)]
        self.m: dict[str, Any] = {}
        for metric in METRICS:
            names = ["model_name", "engine", *metric.labels]
            if metric.kind == "histogram":
                self.m[metric.name] = prom.Histogram(metric.full_name, metric.help, names,
                                                     buckets=buckets)
            elif metric.kind == "counter":
                self.m[metric.name] = prom.Counter(metric.full_name, metric.help, names)
            else:
                self.m[metric.name] = prom.Gauge(metric.full_name, metric.help, names,
                                                 multiprocess_mode="mostrecent")
        for idx, lv in self._labels.items():  # counters and table gauges exist from the start
            for kind in DECISION_KINDS:
                self.m["decisions"].labels(*lv, kind)
            for name in ("k0_steps", "drafter_passes_skipped", "drafter_tokens_caught_up",
                         "admission_held_steps", "runtime_fallbacks", "timed_steps", "timed_step_cost_estimated_seconds",
                         "timed_step_cost_measured_seconds"):
                self.m[name].labels(*lv)
            for name in ("cost_table_batch_max", "cost_table_verify_rows_max"):
                self.m[name].labels(*lv).set(0)
            self.m["lossy_acceptance"].labels(*lv).set(1 if lossy else 0)
        self._info: dict[int, tuple[str, ...]] = {}
        self._failed = False

    # the host's StatLoggerBase interface
    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        payload = getattr(scheduler_stats, "vspec", None)
        if payload is None:
            return
        try:
            self.observe(payload, engine_idx)
        except Exception:  # a fault here must never take the front end down
            if not self._failed:
                self._failed = True
                logger.exception("vllm-hust-vspec: the /metrics update failed (engine %s); "
                                 "the plugin's metrics stop updating", engine_idx)

    def log_engine_initialized(self) -> None:
        pass

    def observe(self, p: dict[str, Any], engine_idx: int) -> None:
        """One engine step's payload (:meth:`MetricsFeed.drain`) into the metrics."""
        if self._failed:
            return
        lv = self._labels.get(engine_idx) or self._labels.setdefault(
            engine_idx, (next(iter(self._labels.values()))[0], str(engine_idx)))
        m = self.m
        for name, key in (("k_chosen", "k"), ("request_k", "ki"), ("request_k_spread", "spread")):
            hist = m[name].labels(*lv)
            for v in p[key]:
                hist.observe(v)
        for kind, n in p["kinds"].items():
            if n:
                m["decisions"].labels(*lv, kind).inc(n)
        k0 = sum(1 for k in p["k"] if k == 0)
        for name, n in (("k0_steps", k0), ("drafter_passes_skipped", p["skipped"]),
                        ("drafter_tokens_caught_up", p["caught_up"]),
                        ("admission_held_steps", p.get("held", 0)),
                        ("runtime_fallbacks", p["fallbacks"])):
            if n:
                m[name].labels(*lv).inc(n)
        est, meas, n = p["timed"]
        if n:
            m["timed_steps"].labels(*lv).inc(n)
            m["timed_step_cost_estimated_seconds"].labels(*lv).inc(est / 1000.0)
            m["timed_step_cost_measured_seconds"].labels(*lv).inc(meas / 1000.0)
        if "accept" in p:
            for pos, a in enumerate(p["accept"]):
                m["acceptance_estimate"].labels(*lv, str(pos)).set(a)
            m["batch_size"].labels(*lv).set(p["batch"])
        for name, key, scale in (("step_cost_estimated_seconds", "est_ms", 1e-3),
                                 ("step_cost_measured_seconds", "meas_ms", 1e-3),
                                 ("goodput_estimate_tokens_per_second", "goodput", 1.0)):
            if p.get(key) is not None:
                m[name].labels(*lv).set(p[key] * scale)
        if "state" in p:
            self._state(p["state"], engine_idx, lv)

    def _state(self, s: dict[str, Any], engine_idx: int, lv: tuple[str, ...]) -> None:
        info = self.m["cost_table_info"]
        new = tuple(str(s.get(k, "")) for k in ("policy", "cost", "source", "cost_model"))
        old = self._info.get(engine_idx)
        if old is not None and old != new:
            info.remove(*lv, *old)
        self._info[engine_idx] = new
        info.labels(*lv, *new).set(1)
        self.m["cost_table_batch_max"].labels(*lv).set(s.get("batch_max", 0))
        self.m["cost_table_verify_rows_max"].labels(*lv).set(s.get("rows_max", 0))


def with_vspec_logger(vllm_config: Any, custom: list[Any] | None) -> list[Any] | None:
    """The host's custom stat loggers plus :class:`VspecStatLogger` when the engine
    speculates (``stat-logger`` patch); unchanged otherwise."""
    if vllm_config.speculative_config is None:
        return custom
    return [*(custom or []), VspecStatLogger]
