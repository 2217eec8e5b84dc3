"""The real trace recorded on the CPU host (tests/data/recorded/, docs/controller.md) stays
readable by the simulator, and replays as the run went: at fixed Kmax every request commits
its recorded output length."""

from __future__ import annotations

import pathlib

import pytest

from vllm_hust_vspec.adaptive.simulate import read_trace, run_controller, run_fixed

pytestmark = pytest.mark.unit

TRACE = pathlib.Path(__file__).resolve().parents[1] / "data" / "recorded" / "draft-large-cpu.jsonl"


def test_recorded_trace_replays_the_run():
    trace = read_trace(TRACE)
    assert trace.header.kmax == 4
    assert trace.header.meta["method"] == "draft_model"
    assert len(trace.requests) == 112
    lengths = [len(r.accept_len) for r in trace.requests]
    assert sum(lengths) == 10752 and set(lengths) == {96}
    at_kmax = run_fixed(trace, 4, seed=0)
    assert at_kmax.tokens == 10752
    assert at_kmax.mean_k == pytest.approx(4.0)
    # every policy finishes the same work on it
    online = run_controller(trace, "online", seed=0)
    assert online.tokens == 10752
    assert 0.0 < online.mean_k <= 4.0
