"""The plugin's Prometheus metrics: the one list of names, kinds, extra labels and help texts.

:mod:`.prometheus` builds them, docs/metrics.md lists them and the Grafana dashboard
(``dashboards/vllm-hust-vspec.json``) plots them; the tests check both against this list.
Pure Python.
"""

from __future__ import annotations

import dataclasses

PREFIX = "vllm_hust_vspec:"
DECISION_KINDS = ("hold", "switch", "probe", "fallback")


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # without the prefix (and, for counters, without ``_total``)
    kind: str  # "histogram", "counter" or "gauge"
    help: str
    labels: tuple[str, ...] = ()

    @property
    def full_name(self) -> str:
        return PREFIX + self.name

    @property
    def exposed(self) -> str:
        """The name a scrape shows (counters end in ``_total``; histograms are a family)."""
        return self.full_name + ("_total" if self.kind == "counter" else "")


METRICS: tuple[Metric, ...] = (
    Metric("k_chosen", "histogram",
           "K the controller chose per decode step (the batch's draft depth; 0 = no drafts)."),
    Metric("request_k", "histogram", "Each decode request's K (K_i) per decided step."),
    Metric("request_k_spread", "histogram",
           "Largest minus smallest K_i among a decided step's requests."),
    Metric("decisions", "counter",
           "Controller decisions by kind: hold, switch, probe (warm-up, probes, measurements), "
           "fallback (the safe K after a fault).", ("reason",)),
    Metric("k0_steps", "counter", "Decode steps decided at K = 0."),
    Metric("drafter_passes_skipped", "counter",
           "Drafter forward passes skipped because the step's K was 0."),
    Metric("drafter_tokens_caught_up", "counter",
           "Tokens the drafter ran to catch up when a request drafted again after K = 0."),
    Metric("admission_held_steps", "counter",
           "Decode steps in which admission control (--adaptive-refill-batch) held the "
           "waiting requests back until a cohort of batch slots was free."),
    Metric("runtime_fallbacks", "counter",
           "Faults in the controller after which the engine switched to its safe fixed K."),
    Metric("acceptance_estimate", "gauge",
           "The controller's acceptance estimate per draft position, conditional on the "
           "position before being accepted (positions from 0, as vLLM's per-position "
           "counter), at the last decision.", ("position",)),
    Metric("lossy_acceptance", "gauge",
           "1 when a lossy acceptance rule is on (eagle_relaxed_accept_topk > 1, "
           "confidence_accept_margin): output then differs from the target's; 0 when "
           "verification is strict (the default)."),
    Metric("batch_size", "gauge", "Decode requests in the last decided step."),
    Metric("step_cost_estimated_seconds", "gauge",
           "Step cost the controller predicted for the last decided step."),
    Metric("step_cost_measured_seconds", "gauge",
           "Step cost measured for the last timed step (decision to decision, prefill and "
           "catch-up steps untimed)."),
    Metric("timed_steps", "counter", "Steps with both a predicted and a measured cost."),
    Metric("timed_step_cost_estimated_seconds", "counter",
           "Sum of the predicted cost over the timed steps (divide by the measured sum: the "
           "cost model's bias)."),
    Metric("timed_step_cost_measured_seconds", "counter",
           "Sum of the measured cost over the timed steps."),
    Metric("goodput_estimate_tokens_per_second", "gauge",
           "Goodput the controller expected at the K it chose, at the last decision."),
    Metric("cost_table_info", "gauge",
           "Where the step costs come from (cost: cost table, profile, online, none), with "
           "the policy, the table's source and cost model; value 1.",
           ("policy", "cost", "source", "cost_model")),
    Metric("cost_table_batch_max", "gauge",
           "Largest batch bucket the installed cost table covers (0: no table)."),
    Metric("cost_table_verify_rows_max", "gauge",
           "Largest verify-row bucket the installed cost table covers (0: no table)."),
)
BY_NAME = {m.name: m for m in METRICS}
