"""The start-up cost probe in a real vLLM engine core (CPU, float32, draft_model on the
large pair, the online policy).

Before the engine serves, the probe times every K at batch 1, 4 and max_num_seqs (here
8 < 16) with synthetic requests and seeds the online policy's step-cost model: the fresh
controller prices every K at those batches before its first decision, nothing of the probe
reaches the controller's counts, the decision trace, the scheduler or the KV cache, and the
engine then generates exactly the target-only tokens.
"""

from __future__ import annotations

import pytest

from plugin_helpers import (
    assert_lossless,
    capture_log,
    close,
    greedy,
    make_llm,
    mixed_prompts,
    plugin_env,
    prompt_ids,
    read_decisions,
    runtime_of,
)
from vllm_hust_vspec.startup_cost import probe

pytestmark = [pytest.mark.host, pytest.mark.exclusive]  # the probe's fit is checked against wall times

KMAX = 2
MAX_NUM_SEQS = 8
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def prompts(fixtures_dir):
    return mixed_prompts(fixtures_dir, 6)


@pytest.fixture(scope="module")
def baseline(fixtures_dir, prompts):
    with plugin_env(enabled=False):
        llm = make_llm(fixtures_dir / "target-large", max_num_seqs=MAX_NUM_SEQS)
        out = greedy(llm, prompts, MAX_TOKENS), prompt_ids(llm, prompts)
        close(llm)
    return out


@pytest.fixture(scope="module")
def probed(fixtures_dir, prompts, tmp_path_factory):
    trace = tmp_path_factory.mktemp("probe") / "decisions.jsonl"
    with capture_log() as log, plugin_env(adaptive_cost_probe=True,
                                          adaptive_trace_file=str(trace)):
        llm = make_llm(fixtures_dir / "target-large",
                       {"method": "draft_model", "model": str(fixtures_dir / "draft"),
                        "num_speculative_tokens": KMAX}, max_num_seqs=MAX_NUM_SEQS)
        rt = runtime_of(llm)
        c = rt.controller
        sched = rt.scheduler
        state = {
            "decisions": c.decisions, "steps": c.steps, "samples": c.cost.n,
            "cells": c.cost.cells, "requests": len(sched.requests),
            "kv_usage": sched.get_kv_cache_usage(), "override": rt.k_override,
            "predicted": {b: c.cost.predict_uniform(b, range(KMAX + 1))
                          for b in probe.probe_batches(MAX_NUM_SEQS)},
            "trace_lines": len(trace.read_text().splitlines()) if trace.exists() else 0,
        }
        tokens = greedy(llm, prompts, MAX_TOKENS)
        close(llm)
    return {"state": state, "tokens": tokens, "log": log, "trace": trace}


def _probe_line(log: list[str]) -> str:
    """The probe's summary line (its per-point lines say "cost probe: point ...")."""
    return next(line for line in log if "vllm-hust-vspec cost probe:" in line
                and "seeded" in line)


def test_the_probe_seeds_every_k_at_every_probed_batch(probed):
    points = len(probe.probe_batches(MAX_NUM_SEQS)) * (KMAX + 1)
    assert probe.probe_batches(MAX_NUM_SEQS) == (1, 4, 8)
    state = probed["state"]
    # two windows a point, each one sample of its (batch, verify tokens, passes) cell
    assert state["samples"] == probe.PROBE_WINDOWS * points
    assert state["cells"] == points
    line = _probe_line(probed["log"])
    assert f"{points}/{points} points" in line and "seeded 1 controller(s)" in line
    # the table the log prints is the one the model was seeded with: each probed batch's
    # predicted cost of K is near the probe's median step time of that point
    for part in line.split("ms per step ", 1)[1].split("; "):
        b = int(part.split(":")[0].removeprefix("B="))
        cells = part.split(": ", 1)[1].split()
        measured = {int(k.removeprefix("K")): float(ms) for k, ms in zip(cells[::2], cells[1::2])}
        assert sorted(measured) == list(range(KMAX + 1))
        predicted = state["predicted"][b]
        assert predicted is not None
        for k, ms in measured.items():
            assert abs(predicted[k] - ms) <= 0.3 * ms, (b, k, predicted[k], ms)


def test_nothing_of_the_probe_reaches_the_controller_the_trace_or_the_cache(probed):
    state = probed["state"]
    assert state["decisions"] == 0 and state["steps"] == 0
    assert state["requests"] == 0 and state["override"] is None
    assert state["kv_usage"] == 0.0
    assert state["trace_lines"] <= 1  # at most the header before the first request
    header, decisions, _ = read_decisions(probed["trace"])
    assert decisions, "the engine decided nothing after the probe"
    assert decisions[0]["step"] <= 2 and header


def test_the_probed_engine_is_lossless(probed, baseline, fixtures_dir):
    expected, ids = baseline
    assert_lossless(expected, probed["tokens"], ids, fixtures_dir / "target-large")
