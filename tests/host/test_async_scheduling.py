"""Asynchronous scheduling with the plugin on the real CPU host: K per step and K_i per
request through the async scheduler's draft placeholders, output exact.

vLLM turns async scheduling on by default for EAGLE, MTP and draft models on GPU hosts. The
CPU platform forces it off and cannot create the CUDA streams and events of the runner's
async path; :mod:`cpu_async` imitates those two (no-op stand-ins: CPU kernels have finished
when they return) and nothing else. The ``AsyncScheduler``, the engine core's batch queue of
two steps in flight, the runner's async input preparation (its drafts stay on the worker and
the engine core schedules placeholders) and the plugin's ``async-placeholders`` patch are the
real ones.
"""

from __future__ import annotations

import pytest

from cpu_async import async_scheduling_on_cpu
from plugin_helpers import (assert_k_varied, close, engine_spec, make_llm, plugin_env,
                            read_decisions, runtime_of)
# the same prompts, target-only baselines and exactness check as the synchronous sweep
from test_plugin_lossless import KMAX, _check, _run, baseline, prompts  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.host, pytest.mark.slow]


@pytest.mark.parametrize("method", ["draft_model", "eagle", "mtp"])
def test_lossless_with_k_changing_under_async_scheduling(fixtures_dir, baseline, prompts,
                                                         tmp_path, method):
    trace = tmp_path / "decisions.jsonl"
    model, spec = engine_spec(fixtures_dir, method, KMAX)
    with plugin_env(adaptive_policy="sweep", adaptive_trace_file=str(trace)), \
            async_scheduling_on_cpu():
        llm = make_llm(model, spec, async_scheduling=True)
        try:
            core = llm.llm_engine.engine_core.engine_core
            assert type(core.scheduler).__name__ == "AsyncScheduler"
            assert core.batch_queue is not None  # two steps in flight
            rt = runtime_of(llm)
            assert rt is not None and rt.method == method and not rt._sync
            got = _run(llm, prompts)
            accepted = rt.controller.accepted_total
        finally:
            close(llm)
    _check(fixtures_dir, baseline, prompts, method, got)
    _, decisions, results = read_decisions(trace)
    assert_k_varied(decisions, KMAX)
    assert accepted > 0 and sum(r["accepted"] for r in results) == accepted


@pytest.mark.parametrize("method", ["draft_model", "dspark"])
def test_budget_reads_the_confidences_under_async_scheduling(fixtures_dir, baseline, prompts,
                                                             tmp_path, method):
    """``budget`` with the drafts' confidences under async scheduling (issue 15, item 4): the
    drafts stay on the workers, their confidences ride on the step's output
    (``draft-confidence-output``) and reach the engine core a step after the placeholders
    that verify them were scheduled.  They are kept for that verification (the confidences of
    accepted and rejected positions are counted, and the controller's confidence map learns
    from every reached position) and the next decision reads them: per-request K_i from
    confidence survival, one decision per step, output identical to target-only.  The cost
    table is test_confidence's fixed one, so what the budget keeps depends on the
    confidences, not on this machine's timing."""
    from test_confidence import _cost_table

    from vllm_hust_vspec.settings import Settings

    trace = tmp_path / "decisions.jsonl"
    table = _cost_table(tmp_path / "table.json")
    model, spec = engine_spec(fixtures_dir, method, KMAX)
    with plugin_env(adaptive_policy="online", adaptive_trace_file=str(trace)), \
            async_scheduling_on_cpu():
        llm = make_llm(model, spec, async_scheduling=True)
        try:
            rt = runtime_of(llm)
            assert rt is not None and rt.method == method and not rt._sync
            assert rt.wants_draft_signals is False  # online reads no confidence
            # switched in place, as test_confidence does (a budget engine started as such
            # first runs the start-up cost calibration)
            rt.reconfigure(Settings({"adaptive_policy": f"budget:{table}"}))
            assert rt.wants_draft_signals is True
            got = _run(llm, prompts)
            outcomes = {k: list(v) for k, v in rt.confidence_outcomes.items()}
            learnt = rt.controller.confidence_map.samples
        finally:
            close(llm)
    _check(fixtures_dir, baseline, prompts, method, got)
    (c_acc, _, n_acc), (c_rej, _, n_rej) = outcomes["accepted"], outcomes["rejected"]
    print(f"{method} async: mean confidence accepted={c_acc / max(n_acc, 1):.3f} (n={n_acc}) "
          f"rejected={c_rej / max(n_rej, 1):.3f} (n={n_rej})")
    assert n_acc > 20 and n_rej > 5, outcomes
    assert c_acc / n_acc > c_rej / n_rej
    assert learnt == n_acc + n_rej  # every reached position, paired with its own drafts
    _, decisions, _ = read_decisions(trace)
    steps = [d["step"] for d in decisions]
    assert steps == sorted(set(steps)), "more than one decision in a step"
    from_drafts = [d for d in decisions if "confidence survival" in d["reason"]]
    mixed = [d for d in from_drafts if d["k_i"] and len(set(d["k_i"].values())) >= 2]
    print(f"{method} async: {len(decisions)} decisions, {len(from_drafts)} from the drafts' "
          f"confidences, {len(mixed)} with distinct K_i")
    assert len(from_drafts) * 2 > len(decisions), "the decisions did not read the confidences"
    assert mixed, "no step had two different per-request K_i"
