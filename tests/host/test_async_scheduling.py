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
