"""``scripts/resim_paired.py`` on a paired trace written here: fixed K = 0..2 and online take
turns at batch 4, step times from a known roofline, every draft accepted at position 1 and
half at position 2 (so K = 1 commits the most tokens a millisecond)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from conftest import load_script

from paired_traces import rotation_trace

pytestmark = pytest.mark.unit

resim_paired = load_script("resim_paired")

B = 4


def _trace(path: pathlib.Path, policies=("fixed:0", "fixed:1", "fixed:2", "online")) -> list[dict]:
    return rotation_trace(path, policies, B)


def _ratio(out: str, policy: str) -> float:
    m = re.search(rf"batch {B}: {re.escape(policy)} / best fixed K mean ([\d.]+)", out)
    assert m, out
    return float(m.group(1))


def test_the_best_fixed_k_is_one_and_the_others_are_their_goodput_ratio(tmp_path, capsys):
    path = tmp_path / "paired-r1.jsonl"
    _trace(path)
    assert resim_paired.main([str(path), "--policy", "fixed:1", "--seeds", "2",
                              "--batches", str(B)]) == 0
    assert _ratio(capsys.readouterr().out, "fixed:1") == 1.0
    # K = 0: 4 tokens in 30 ms against K = 1's 4 * (1 + 0.98) in 52 (position 1's rate is
    # clipped at 0.98): 0.875
    assert resim_paired.main([str(path), "--policy", "fixed:0", "--seeds", "2",
                              "--batches", str(B)]) == 0
    assert _ratio(capsys.readouterr().out, "fixed:0") == pytest.approx(0.875, abs=0.01)


def test_results_json_names_the_workload_cells(tmp_path, capsys):
    """``--results``: each step is judged in its window's workload cell, here two cells of
    20 rotation rounds each, fixed K = 1 the best in both."""
    path = tmp_path / "paired-r1.jsonl"
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"paired": _trace(path)}))
    assert resim_paired.main([str(path), "--policy", "fixed:1", "--seeds", "1",
                              "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"code@4\((\d+)\):1\.000 mixed@4\(\1\):1\.000", out), out
    assert "code@4: fixed:1 / best fixed K mean 1.0000" in out
    assert "mixed@4: fixed:1 / best fixed K mean 1.0000" in out


def test_online_told_the_truth_holds_the_best_k(tmp_path, capsys):
    """With the true step times and acceptance (``--cheat both``) online is at the best
    fixed K but for its warm-up and probes; on its own estimates it is near it."""
    path = tmp_path / "paired-r1.jsonl"
    _trace(path)
    assert resim_paired.main([str(path), "--seeds", "2", "--batches", str(B),
                              "--cheat", "both", "--show-k"]) == 0
    out = capsys.readouterr().out
    assert _ratio(out, "online") > 0.98
    assert resim_paired.main([str(path), "--seeds", "2", "--batches", str(B)]) == 0
    assert 0.9 < _ratio(capsys.readouterr().out, "online") <= 1.0


def test_the_policy_chooses_among_the_ks_a_fixed_policy_timed(tmp_path, capsys):
    """A run that timed fixed K = 1 and 2 only: the re-served policy's K stays in 1..2 (a K
    no fixed policy timed has no steps to serve), every step at one of them."""
    path = tmp_path / "paired-r1.jsonl"
    _trace(path, ("fixed:1", "fixed:2", "online"))
    assert resim_paired.main([str(path), "--seeds", "1", "--batches", str(B), "--show-k"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"b4#0\((\d+)\):([\d.]+)\[(\d+),(\d+)\]", out)
    assert m, out
    assert int(m.group(3)) + int(m.group(4)) == int(m.group(1)) > 0
    assert 0.9 < float(m.group(2)) <= 1.0


def test_a_trace_without_a_header_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"step": 0, "k": 1, "batch": 1, "policy": "online"}) + "\n")
    with pytest.raises(SystemExit, match="header: not a decision trace"):
        resim_paired.main([str(path)])


@pytest.mark.parametrize(("args", "needle"), [
    (["--pool", "0"], "argument --pool: expected a positive integer, got '0'"),
    (["--seed-noise", "-1"], "argument --seed-noise: expected a number >= 0, got '-1'"),
    (["--batches", "4,x"], "argument --batches: want batch sizes, comma-separated, got '4,x'"),
    (["--extra", "[1]"], "argument --extra: want a JSON object"),
    (["--config", '{"nope": 1}'], "--policy/--config/--extra: "),
    (["--results", "/nonexistent/results.json"],
     "--results /nonexistent/results.json: cannot read: No such file or directory"),
    (["--json-out", "/nonexistent/a.json"], "--json-out /nonexistent/a.json: no directory /nonexistent"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, capsys, args, needle):
    path = tmp_path / "paired-r1.jsonl"
    _trace(path)
    with pytest.raises(SystemExit) as exc:
        resim_paired.main([str(path), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    if "--config" in args:
        assert "'nope'" in err


def test_a_results_file_without_paired_windows_is_refused(tmp_path, capsys):
    path = tmp_path / "paired-r1.jsonl"
    _trace(path)
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": []}))
    with pytest.raises(SystemExit) as exc:
        resim_paired.main([str(path), "--results", str(results)])
    assert exc.value.code == 2
    assert f"--results {results}: not a bench ab results.json with 'paired' windows" in (
        capsys.readouterr().err)
