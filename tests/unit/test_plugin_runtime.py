"""Pure parts of the plugin runtime: guards, settings -> controller,
recorder treatment and cost fit, trace files, process roles.  No vLLM import."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.simulate import read_trace, run_fixed
from vllm_hust_vspec.host.detect import process_label, process_roles
from vllm_hust_vspec.runtime.controller_factory import controller_config, is_fixed_at
from vllm_hust_vspec.runtime.decision_trace import DecisionTrace, trace_path
from vllm_hust_vspec.runtime.sim_trace import SimTraceRecorder, accept_lengths, fit_cost
from vllm_hust_vspec.runtime.specconfig import prepare_speculative_config
from vllm_hust_vspec.settings import Settings, SettingsError

pytestmark = pytest.mark.unit


def test_runtime_modules_import_without_vllm():
    """The pure runtime modules tested here import no vLLM (checked in a fresh interpreter:
    other tests of the same session may have imported vLLM already)."""
    code = ("import sys\n"
            "import vllm_hust_vspec.runtime.controller_factory, vllm_hust_vspec.runtime.decision_trace\n"
            "import vllm_hust_vspec.runtime.sim_trace, vllm_hust_vspec.runtime.specconfig\n"
            "assert 'vllm' not in sys.modules and 'torch' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_patch_declarations_import_without_numpy():
    """The doctor reads the catalog where only this package is installed (no numpy, no
    vLLM; tests/cli/test_manage_sh.py installs it so): the patch modules import the runtime
    inside ``make`` only."""
    code = ("import sys\n"
            "import vllm_hust_vspec.patches.catalog, vllm_hust_vspec.tools.doctor\n"
            "heavy = sorted(m for m in ('numpy', 'vllm', 'torch') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# --------------------------------------------------------------------------- guards

def _spec(method="draft_model", k=4, table=None):
    return types.SimpleNamespace(method=method, num_speculative_tokens=k,
                                 num_speculative_tokens_per_batch_size=table)


def test_dynamic_sd_turned_on():
    cfg = _spec()
    prepare_speculative_config(cfg, Settings())
    assert cfg.num_speculative_tokens_per_batch_size == [(1, 1, 4)]
    own = [(1, 4, 3), (5, 64, 1)]
    cfg = _spec(table=own)
    prepare_speculative_config(cfg, Settings())
    assert cfg.num_speculative_tokens_per_batch_size is own


@pytest.mark.parametrize("method", ["suffix", "medusa", "ngram_gpu"])
def test_fixed_k_methods_keep_static_k(method):
    cfg = _spec(method)
    prepare_speculative_config(cfg, Settings())
    assert cfg.num_speculative_tokens_per_batch_size is None


def test_refusals_name_the_problem():
    with pytest.raises(SettingsError, match="custom_class.*cannot be made adaptive"):
        prepare_speculative_config(_spec("custom_class"), Settings())
    with pytest.raises(SettingsError, match="adaptive_fixed_gamma=6 exceeds Kmax = 4"):
        prepare_speculative_config(_spec(), Settings({"adaptive_policy": "fixed",
                                                      "adaptive_fixed_gamma": 6}))
    with pytest.raises(SettingsError, match="data_parallel_size=2"):
        prepare_speculative_config(_spec(), Settings(), data_parallel_size=2)


def test_data_parallel_keeps_one_k():
    cfg = _spec()
    prepare_speculative_config(cfg, Settings({"adaptive_policy": "fixed"}), data_parallel_size=2)
    assert cfg.num_speculative_tokens_per_batch_size is None  # the host would drop it anyway


# --------------------------------------------------------------------------- controller config

def test_settings_map_to_controller_config():
    s = Settings({"adaptive_policy": "sweep", "adaptive_sweep": (0, 2, 4),
                  "adaptive_min_gamma": 0, "adaptive_hysteresis": 0.1,
                  "adaptive_online_exploration": 0.3, "adaptive_online_window": 64})
    cfg = controller_config(s, kmax=4)
    assert (cfg.policy, cfg.sweep, cfg.hysteresis, cfg.exploration, cfg.window) == (
        "sweep", (0, 2, 4), 0.1, 0.3, 64)
    fixed = controller_config(Settings({"adaptive_policy": "fixed"}), kmax=3)
    assert is_fixed_at(fixed, 3) and not is_fixed_at(fixed, 2)
    assert is_fixed_at(controller_config(Settings({"adaptive_speculation": False}), 5), 5)
    sched = controller_config(Settings({"adaptive_policy": "schedule"}), 4,
                              host_table=[(1, 4, 4), (5, 32, 2)])
    assert sched.schedule == ((1, 4, 4), (5, 32, 2))  # the host's table, as data
    with pytest.raises(SettingsError, match="needs adaptive_schedule"):
        controller_config(Settings({"adaptive_policy": "schedule"}), 4)


# --------------------------------------------------------------------------- recorder

def test_accept_lengths_treatment():
    # prefill at 0 (non-drafted), accepted 2 at 1, miss at 4, accepted 3 at 5 past the end
    events = [(0, 0), (1, 2), (4, 0), (5, 3)]
    assert accept_lengths(events, 7) == [0, 2, 1, 0, 0, 3, 2]


def test_fit_cost_recovers_the_model():
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(200):
        b = int(rng.integers(1, 9))
        k = int(rng.integers(0, 5))
        t = b * (1 + k)
        ms = 2.0 + 0.5 * t + 0.25 * max(k, 1) * b
        samples.append((b, k, t, ms))
    cost = fit_cost(samples, draft_min_steps=1)
    assert cost["bias_ms"] == pytest.approx(2.0, abs=1e-6)
    assert cost["target_token_ms"] == pytest.approx(0.5, abs=1e-6)
    assert cost["draft_token_ms"] == pytest.approx(0.25, abs=1e-6)
    assert cost["noise"] == pytest.approx(0.0, abs=1e-6)
    assert fit_cost([], 1)["bias_ms"] == 0.0


def test_fit_cost_at_one_draft_depth_keeps_a_k0_step_positive():
    """A fixed-K run (K = 4): the drafter's column is 4/5 of the verified tokens' on decode
    steps, and a slow step that verified few rows (the prompts' step) tips a fit with a
    drafter term into putting the whole cost there, pricing a K = 0 step at 0 (the recorder
    test once failed so).  One depth fits bias and per-token cost only."""
    rng = np.random.default_rng(1)
    samples = [(8, 4, 8, 300.0)]
    for b in [8] * 20 + [7, 6, 5, 4, 3, 2, 1] * 5:
        samples.append((b, 4, 5 * b, 10.0 * b * (1.0 + 0.03 * rng.standard_normal())))
    cost = fit_cost(samples, draft_min_steps=0)
    assert cost["draft_token_ms"] == 0.0
    assert cost["bias_ms"] + cost["target_token_ms"] > 0.5  # a K = 0 step at B = 1 costs
    assert cost["target_token_ms"] > 1.0


def test_recorder_file_replays_at_fixed_kmax(tmp_path):
    path = tmp_path / "rec.jsonl"
    rec = SimTraceRecorder(str(path), kmax=3, max_num_seqs=4, draft_min_steps=1)
    events = {"a": [(0, 0), (1, 3), (5, 1), (7, 2)], "b": [(0, 0), (1, 0), (2, 2)]}
    lengths = {"a": 10, "b": 4}
    for rid, evs in events.items():
        for t, a in evs:
            rec.on_step(rid, 100.0, t, a)
            rec.step_sample(2, 3, 8, 10.0 + a)
    rec.finish("a", lengths["a"])
    first_header = path.read_text().splitlines()[0]
    rec.finish("b", lengths["b"])
    rec.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and len(lines[0]) == len(first_header)
    trace = read_trace(path)
    assert trace.header.kmax == 3 and trace.header.cost.draft_min_steps == 1
    accepted = []
    result = _replay(trace, 3, accepted)
    assert result.tokens == sum(lengths.values())
    assert sum(accepted) == sum(a for evs in events.values() for _, a in evs)


def _replay(trace, k, sink):
    from vllm_hust_vspec.adaptive.simulate import run_trace

    def select(_s, running, _t):
        return np.full(len(running), k, dtype=np.int64)

    def feedback(_s, _r, _t, _ki, accepted, _ms, _k):
        sink.extend(int(a) for a in accepted)

    return run_trace(trace, select, 0, "replay", feedback=feedback)


def test_fixed_replay_helper_agrees(tmp_path):
    path = tmp_path / "rec.jsonl"
    rec = SimTraceRecorder(str(path), kmax=2, max_num_seqs=2, draft_min_steps=0)
    rec.on_step("x", 1.0, 0, 0)
    rec.on_step("x", 1.0, 1, 2)
    rec.step_sample(1, 2, 3, 5.0)
    rec.finish("x", 4)
    rec.close()
    assert run_fixed(read_trace(path), 2, 0).tokens == 4


# --------------------------------------------------------------------------- trace + roles

def test_trace_path_and_append(tmp_path):
    assert trace_path(Settings()) is None
    assert trace_path(Settings({"adaptive_trace": True}), pid=42).endswith("vspec-decisions-42.jsonl")
    p = tmp_path / "t.jsonl"
    assert trace_path(Settings({"adaptive_trace_file": str(p)})) == str(p)
    for _ in range(2):
        t = DecisionTrace(str(p))
        t.write({"step": 1})
        t.close()
    assert [json.loads(x) for x in p.read_text().splitlines()] == [{"step": 1}, {"step": 1}]


def test_process_roles():
    assert process_roles("EngineCore_DP0") == ("engine", "worker")
    assert process_roles("VllmWorker-1") == ("worker",)
    assert process_roles("MainProcess") == ("frontend", "engine", "worker")
    assert process_label("EngineCore") == "engine"
