"""The recorder writes a real run in the simulator's trace format; replay reproduces it.

A run at fixed Kmax with ``HUST_VSPEC_ADAPTIVE_RECORD_TRACE`` set; the trace file is read by
the simulator and replayed at ``fixed:Kmax``: it reproduces the run's committed tokens and
vLLM's own accepted-token counter exactly (treatment of non-drafted and skipped positions:
``vllm_hust_vspec.runtime.sim_trace``).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from plugin_helpers import close, make_llm, mixed_prompts, plugin_env
from vllm_hust_vspec.adaptive.simulate import read_trace, run_trace
from vllm_hust_vspec.settings import SettingsError

pytestmark = [pytest.mark.host, pytest.mark.slow]

KMAX = 4


def _accepted_counter(llm) -> float:
    return sum(float(m.value) for m in llm.get_metrics()
               if m.name == "vllm:spec_decode_num_accepted_tokens")


def test_recorded_run_replays_exactly(fixtures_dir, tmp_path):
    from vllm import SamplingParams

    path = tmp_path / "run.jsonl"
    prompts = mixed_prompts(fixtures_dir, 8)
    spec = {"method": "draft_model", "model": str(fixtures_dir / "draft"),
            "num_speculative_tokens": KMAX}
    # lengths differ so requests finish at different steps (one line each, written at finish)
    sps = [SamplingParams(temperature=0.0, max_tokens=24 + 4 * i, ignore_eos=True)
           for i in range(len(prompts))]
    with plugin_env(adaptive_policy="fixed", adaptive_record_trace=path):
        llm = make_llm(fixtures_dir / "target", spec, disable_log_stats=False)
        try:
            outs = llm.generate(prompts, sps, use_tqdm=False)
            accepted_vllm = _accepted_counter(llm)
            lines_before_shutdown = path.read_text().splitlines()
        finally:
            close(llm)
    committed = sum(len(o.outputs[0].token_ids) for o in outs)
    # every request is on disk before the engine shuts down
    assert len(lines_before_shutdown) == 1 + len(prompts)
    header = json.loads(lines_before_shutdown[0])
    assert header["format"] == "vspec-trace" and header["kmax"] == KMAX
    # the draft model runs no forward at K = 0 (drafter-k0, synchronous scheduling)
    assert header["max_num_seqs"] == 8 and header["cost"]["draft_min_steps"] == 0
    # the fitted step cost is positive (at a fixed K the bias and the drafter's per-pass cost
    # cannot be told apart, so only the sum is asserted): B = 1, K = KMAX
    c = header["cost"]
    step_ms = (c["bias_ms"] + max(c["target_mem_ms"], c["target_token_ms"] * (1 + KMAX))
               + KMAX * max(c["draft_mem_ms"], c["draft_token_ms"]))
    assert 1.0 < step_ms < 10_000.0

    trace = read_trace(path)
    assert sorted(len(r.accept_len) for r in trace.requests) == sorted(
        len(o.outputs[0].token_ids) for o in outs)
    accepted_replay: list[int] = []

    def select(_step, running, _t):
        return np.full(len(running), KMAX, dtype=np.int64)

    def feedback(_step, _running, _t, _ki, accepted, _ms, _k):
        accepted_replay.extend(int(a) for a in accepted)

    result = run_trace(trace, select, 0, f"fixed:{KMAX}", feedback=feedback)
    assert accepted_vllm > 0
    assert sum(accepted_replay) == accepted_vllm
    assert result.tokens == committed

    sim = shutil.which("vllm-hust-vspec-sim")
    if sim is not None:  # the simulator's CLI reads the same file
        out = subprocess.run([sim, str(path), "--policy", f"fixed:{KMAX}", "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["fixed"][str(KMAX)] > 0


def test_recorder_refuses_an_adaptive_run(fixtures_dir, tmp_path):
    spec = {"method": "draft_model", "model": str(fixtures_dir / "draft"),
            "num_speculative_tokens": KMAX}
    with plugin_env(adaptive_policy="online", adaptive_record_trace=tmp_path / "x.jsonl"):
        with pytest.raises(Exception) as err:
            make_llm(fixtures_dir / "target", spec)
    chain = [err.value] + [e for e in (err.value.__cause__, err.value.__context__) if e]
    assert any("fixed Kmax" in str(e) for e in chain), err.value
    assert isinstance(err.value, SettingsError) or "HUST_VSPEC_ADAPTIVE_POLICY" in str(err.value)
