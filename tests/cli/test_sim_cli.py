"""``vllm-hust-vspec-sim`` as a subprocess: JSON schema, generation, one clear error + exit 2."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cli

BIN = pathlib.Path(sys.executable).parent
SIM = str(BIN / "vllm-hust-vspec-sim")
DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
KINDS = ("stationary-high", "stationary-low", "falling", "hetero", "phase", "ramp", "noisy")
HAND = [
    {"format": "vspec-trace", "version": 1, "kmax": 2, "max_num_seqs": 1,
     "cost": {"bias_ms": 1.0, "target_mem_ms": 10.0, "target_token_ms": 1.0, "draft_mem_ms": 2.0,
              "draft_token_ms": 0.5, "draft_min_steps": 0, "noise": 0.0}, "seed": 0},
    {"id": "r0", "arrival_s": 0.0, "accept_len": [2, 0, 1, 2, 0]},
    {"id": "r1", "arrival_s": 0.5, "accept_len": [1, 1]},
]


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SIM, *args], capture_output=True, text=True, timeout=300, check=False)


def _write(path: pathlib.Path, lines) -> pathlib.Path:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def test_json_schema_exact(tmp_path):
    out = sim(str(DATA / "hetero.jsonl"), "--policy", "online", "--policy", "fixed:3",
              "--policy", "schedule:1-4:4,5-64:2", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"policies", "fixed", "best_fixed_k", "oracle"}
    assert list(doc["policies"]) == ["online", "fixed:3", "schedule:1-4:4,5-64:2"]
    for row in doc["policies"].values():
        assert set(row) == {"tok_s", "vs_best_fixed", "vs_oracle", "mean_k", "decide_us"}
        assert row["tok_s"] > 0 and row["decide_us"] > 0 and 0 <= row["mean_k"] <= 8
    assert list(doc["fixed"]) == [str(k) for k in range(9)]
    best = doc["best_fixed_k"]
    assert doc["fixed"][str(best)] == max(doc["fixed"].values())
    assert doc["policies"]["fixed:3"]["tok_s"] == pytest.approx(doc["fixed"]["3"])
    assert doc["policies"]["fixed:3"]["vs_best_fixed"] == pytest.approx(doc["fixed"]["3"] / doc["fixed"][str(best)])
    assert set(doc["oracle"]) == {"tok_s", "mean_k"}
    assert doc["policies"]["online"]["vs_oracle"] == pytest.approx(doc["policies"]["online"]["tok_s"] / doc["oracle"]["tok_s"])


def test_hand_trace_numbers_and_null_oracle(tmp_path):
    path = _write(tmp_path / "hand.jsonl", HAND)
    out = sim(str(path), "--policy", "fixed:1", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["oracle"] is None and doc["policies"]["fixed:1"]["vs_oracle"] is None
    assert doc["fixed"] == {"0": pytest.approx(7000 / 77), "1": pytest.approx(7000 / 52), "2": pytest.approx(7000 / 45)}
    assert doc["best_fixed_k"] == 2


def test_default_runs_standard_policies_and_prints_table():
    out = sim(str(DATA / "ramp.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split()[:2] == ["policy", "tok/s"]
    names = [ln.split()[0] for ln in lines[2:-2]]
    assert names == ["online", "budget"]
    assert lines[-2].startswith("fixed K tok/s: 0=") and "best K=" in lines[-2]
    assert lines[-1].startswith("oracle: ")


def test_seed_changes_noise_only():
    a = json.loads(sim(str(DATA / "noisy.jsonl"), "--policy", "fixed:2", "--json", "--seed", "1").stdout)
    b = json.loads(sim(str(DATA / "noisy.jsonl"), "--policy", "fixed:2", "--json", "--seed", "2").stdout)
    c = json.loads(sim(str(DATA / "noisy.jsonl"), "--policy", "fixed:2", "--json", "--seed", "1").stdout)
    assert a["fixed"] == c["fixed"] and a["fixed"] != b["fixed"]


@pytest.mark.parametrize("kind", KINDS)
def test_generate_every_kind(tmp_path, kind):
    path = tmp_path / f"{kind}.jsonl"
    out = sim("--generate", kind, "--out", str(path), "--seed", "5", "--scale", "0.02")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"wrote {path}: {kind} seed 5")
    header = json.loads(path.read_text().splitlines()[0])
    assert header["format"] == "vspec-trace" and header["seed"] == 5
    first = json.loads(path.read_text().splitlines()[1])
    assert "p" in first and ("conf" in first) == (kind == "hetero")
    run = sim(str(path), "--policy", "fixed:1", "--json")
    assert run.returncode == 0 and json.loads(run.stdout)["oracle"] is not None


def test_shipped_traces_load():
    for kind in KINDS:
        out = sim(str(DATA / f"{kind}.jsonl"), "--policy", "fixed:0", "--json")
        assert out.returncode == 0, (kind, out.stderr)


def _bad(tmp_path, lines):
    return str(_write(tmp_path / "bad.jsonl", lines))


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: _bad(d, [HAND[0], '{"id": "r0", "arrival_s": 0.0, "accept_len": [1, 2']), r"bad.jsonl:2: not valid JSON"),
        (lambda d: _bad(d, [dict(HAND[0], format="trace"), HAND[1]]), r"bad.jsonl:1: key 'format'"),
        (lambda d: _bad(d, [dict(HAND[0], version=7), HAND[1]]), "unsupported trace version 7"),
        (lambda d: _bad(d, [dict(HAND[0], cost=dict(HAND[0]["cost"], target_token_ms=-0.3)), HAND[1]]),
         "key 'target_token_ms' must be >= 0"),
        (lambda d: _bad(d, [HAND[0], dict(HAND[1], accept_len=[0, 5])]), r"key 'accept_len\[1\]' = 5 is out of range 0..2"),
        (lambda d: str(d / "missing.jsonl"), "cannot read trace"),
    ],
)
def test_bad_trace_one_error_exit_2(tmp_path, make, needle):
    out = sim(make(tmp_path), "--json")
    assert out.returncode == 2
    assert out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-hust-vspec-sim: error: ")
    assert __import__("re").search(needle, err[0]), err[0]


@pytest.mark.parametrize(
    ("policy", "needle"),
    [
        ("bandit", "unknown policy 'bandit'"),
        ("fixed:9", "out of range"),
        ("fixed:x", "expected an integer"),
        ("budget:/nonexistent/costs.json", "cost table /nonexistent/costs.json: field '<file>'"),
    ],
)
def test_bad_policy_one_error_exit_2(tmp_path, policy, needle):
    path = _write(tmp_path / "hand.jsonl", HAND)
    out = sim(str(path), "--policy", policy)
    assert out.returncode == 2 and out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_incompatible_cost_table_for_budget(tmp_path):
    table = {
        "format": "vspec-cost-table", "version": 1, "cost_model": "sps", "draft_width": 1,
        "buckets": {"requests": [1], "target_rows": [2, 4]}, "model_id": None, "dtype": None,
        "quantization": None, "parallel": {}, "execution": {}, "host_version": None,
        "sps": {"2": 50.0, "4": 40.0},
    }
    tpath = tmp_path / "costs.json"
    tpath.write_text(json.dumps(table))
    path = _write(tmp_path / "hand.jsonl", HAND)
    out = sim(str(path), "--policy", f"budget:{tpath}")
    assert out.returncode == 2 and "field 'draft_width'" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_malformed_cost_table_for_budget(tmp_path):
    tpath = tmp_path / "costs.json"
    tpath.write_text(json.dumps({"cost_model": "linear"}))
    path = _write(tmp_path / "hand.jsonl", HAND)
    out = sim(str(path), "--policy", f"budget:{tpath}")
    assert out.returncode == 2 and out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and f"cost table {tpath}: field 'cost_model'" in err[0], err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--generate", "bursty", "--out", "x.jsonl"], "invalid choice"),
        (["--generate", "ramp"], "--generate needs --out FILE"),
        ([], "a TRACE.jsonl is required"),
        (["--seed", "-1", str(DATA / "ramp.jsonl")], "--seed must be >= 0"),
    ],
)
def test_bad_usage_exit_2(args, needle):
    out = sim(*args)
    assert out.returncode == 2 and needle in out.stderr
