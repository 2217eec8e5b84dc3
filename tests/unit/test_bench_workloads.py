"""A/B benchmark inputs: workloads from prompt sets, configurations, vLLM batch-size tables,
decision-trace slicing and the per-cell combination of benchmark results."""

from __future__ import annotations

import json

import pytest

from vllm_hust_vspec.tools import bench_configs as C
from vllm_hust_vspec.tools import bench_driver as D
from vllm_hust_vspec.tools import bench_workloads as W

pytestmark = pytest.mark.unit


@pytest.fixture
def prompts_dir(tmp_path):
    for name, n in (("code", 128), ("hard", 24)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            for i in range(5):
                f.write(json.dumps({"prompt": f"{name}-{i}", "output_tokens": n}) + "\n")
    return tmp_path


def test_parse_workloads():
    assert W.parse_workloads("code, swing") == ("code", "swing")
    with pytest.raises(W.WorkloadError, match="unknown workload 'nope'"):
        W.parse_workloads("code,nope")
    with pytest.raises(W.WorkloadError, match="names a workload twice"):
        W.parse_workloads("code,code")


def test_prompt_set_errors(tmp_path, prompts_dir):
    with pytest.raises(W.WorkloadError, match="prompt set 'code'.*not found"):
        W.load_prompt_sets(tmp_path / "none", ["code"])
    bad = tmp_path / "hard.jsonl"
    bad.write_text('{"prompt": "x", "output_tokens": 0}\n')
    with pytest.raises(W.WorkloadError, match=r"hard.jsonl:1: 'output_tokens'"):
        W.load_prompt_set(bad, "hard")
    bad.write_text('{"prompt": "x"\n')
    with pytest.raises(W.WorkloadError, match=r"hard.jsonl:1: invalid JSON"):
        W.load_prompt_set(bad, "hard")


def test_workload_requests(prompts_dir):
    sets = W.load_prompt_sets(prompts_dir, W.WORKLOADS)
    code = W.build_requests("code", sets, 7, 64, seed=0)
    assert len(code) == 7 and {r.source for r in code} == {"code"}
    assert {r.output_len for r in code} == {64}  # capped by --output-len
    hard = W.build_requests("hard", sets, 3, 64, seed=0)
    assert {r.output_len for r in hard} == {24}  # capped by the prompt's own output_tokens
    mixed = W.build_requests("mixed", sets, 6, 64, seed=0)
    assert [r.source for r in mixed] == ["code", "hard"] * 3
    shifting = W.build_requests("shifting", sets, 40, 64, seed=0)
    first, last = shifting[:10], shifting[-10:]
    assert sum(r.source == "hard" for r in first) < sum(r.source == "hard" for r in last)
    assert shifting[0].source == "code" and shifting[-1].source == "hard"
    assert W.build_requests("shifting", sets, 40, 64, seed=0) == shifting  # deterministic


def test_cells_and_swing_phases(prompts_dir):
    sets = W.load_prompt_sets(prompts_dir, ["code", "swing"])
    cells = W.build_cells(["code", "swing"], [1, 4], sets, per_slot=2, minimum=3, max_output=16,
                          seed=1)
    assert [c.key for c in cells] == ["code@1", "code@4", "swing@swing"]
    assert [len(p.requests) for p in cells[0].phases] == [3]  # max(1*2, 3)
    assert [len(p.requests) for p in cells[1].phases] == [8]
    swing = cells[2]
    assert [p.concurrency for p in swing.phases] == [1, 4, 16, 4, 1]
    assert swing.num_requests == 3 + 8 + 32 + 8 + 3
    assert swing.output_tokens == swing.num_requests * 16
    assert W.max_concurrency(cells) == 16


def test_parse_configs():
    got = C.parse_configs("none,fixed,native_table,online", fixed_ks=(1, 3), kmax=4)
    assert [(c.name, c.policy, c.k, c.plugin) for c in got] == [
        ("none", "none", 0, False), ("fixed-k1", "fixed", 1, False),
        ("fixed-k3", "fixed", 3, False), ("native_table", "native_table", 4, False),
        ("online", "online", 4, True)]
    assert [c.name for c in C.parse_configs("fixed:2,budget", (1,), 4)] == ["fixed-k2", "budget"]
    with pytest.raises(C.ConfigError, match="unknown configuration 'fastest'"):
        C.parse_configs("none,fastest", (1,), 4)
    with pytest.raises(C.ConfigError, match="'fixed-k1' appears twice"):
        C.parse_configs("fixed,fixed:1", (1,), 4)


def test_native_tables(tmp_path):
    assert C.table_from_text("1-2:4,3-8:2,9-16:1", "t") == [[1, 2, 4], [3, 8, 2], [9, 16, 1]]
    assert C.table_from_text("1:3,2-64:1", "t") == [[1, 1, 3], [2, 64, 1]]
    # batch_gamma_policy semantics (smallest key >= B) as vLLM's inclusive ranges
    assert C.table_from_policy({16: 1, 1: 4, 4: 3}, "p") == [[1, 1, 4], [2, 4, 3], [5, 16, 1]]
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"batch_gamma_policy": {"1": 4, "8": 2}}))
    assert C.load_native_table(str(prof)) == [[1, 1, 4], [2, 8, 2]]
    for text, msg in (("2-4:1", "must start at batch size 1"), ("1-4:1,3-8:2", "overlaps"),
                      ("1-4:x", "expected LO-HI:K"), ("1-4:-1", "out of range"), ("4-1:2", "bad batch-size range 4-1")):
        with pytest.raises(C.ConfigError, match=msg):
            C.table_from_text(text, "t")
    prof.write_text(json.dumps({"target": {}}))
    with pytest.raises(C.ConfigError, match="batch_gamma_policy' is missing"):
        C.load_native_table(str(prof))


def test_trace_slice_and_mean_k(tmp_path):
    trace = tmp_path / "t.jsonl"
    header = {"trace": "vspec-decisions", "version": 1, "settings": {}, "host": None}
    trace.write_text(json.dumps(header) + "\n")
    offset = trace.stat().st_size
    recs = [
        {"step": 1, "t": 0.1, "batch": 2, "k": 4, "k_i": None, "policy": "online", "reason": "x",
         "est_accept": [], "est_cost_ms": None},
        {"step": 1, "drafted": 8, "accepted": 5, "ms": 3.0},
        {"step": 2, "t": 0.2, "batch": 2, "k": 0, "k_i": None, "policy": "online", "reason": "x",
         "est_accept": [], "est_cost_ms": None},
        {"step": 3, "t": 0.3, "batch": 2, "k": 3, "k_i": {"a": 3, "b": 1}, "policy": "online",
         "reason": "x", "est_accept": [], "est_cost_ms": None},
    ]
    with open(trace, "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        f.write('{"step": 4, "t"')  # a line still being written
    got = D.read_trace_slice(trace, offset)
    assert len(got) == 4
    assert D.trace_mean_k(got) == pytest.approx((4 * 2 + 0 + 3 + 1) / 6)
    assert D.trace_mean_k(D.read_trace_slice(trace, 0)[:1]) is None  # header only


def test_combine_phases():
    a = {"total_output_tokens": 100, "duration": 2.0, "completed": 4, "mean_tpot_ms": 10.0,
         "spec_decode_num_drafts": 40, "spec_decode_draft_tokens": 120,
         "spec_decode_accepted_tokens": 60}
    b = {"total_output_tokens": 300, "duration": 2.0, "completed": 12, "mean_tpot_ms": 20.0,
         "spec_decode_num_drafts": 60, "spec_decode_draft_tokens": 120,
         "spec_decode_accepted_tokens": 40}
    r = D.combine([a, b], trace_k=None)
    assert r.output_tok_s == 100.0
    assert r.tpot_ms == pytest.approx((10 * 4 + 20 * 12) / 16)
    assert r.mean_accept_len == pytest.approx(1 + 100 / 100)
    assert r.mean_k == pytest.approx(240 / 100)
    assert D.combine([a], trace_k=1.5).mean_k == 1.5
    none = D.combine([{"total_output_tokens": 10, "duration": 1.0, "completed": 1,
                       "mean_tpot_ms": 5.0}], None)
    assert (none.mean_accept_len, none.mean_k) == (1.0, 0.0)
    with pytest.raises(D.DriveError, match="no output"):
        D.combine([{"total_output_tokens": 0, "duration": 1.0, "completed": 0}], None)


def test_plugin_at_a_fixed_k_is_a_configuration():
    got = C.parse_configs("none,plugin:0,plugin:2", (1, 2), 4)
    assert [(c.name, c.policy, c.k, c.plugin) for c in got] == [
        ("none", "none", 0, False), ("plugin-k0", "plugin_fixed", 0, True),
        ("plugin-k2", "plugin_fixed", 2, True)]
    with pytest.raises(C.ConfigError, match="K=5 exceeds Kmax=4"):
        C.parse_configs("plugin:5", (1,), 4)
