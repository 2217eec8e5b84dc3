"""``scripts/resim_compare.py`` over ``resim_paired.py --json-out`` files of two paired traces
written here (fixed K = 0..2 and online taking turns at batch 4,
``paired_traces.rotation_trace``): the paired differences, their error over the traces, and the refusals."""

from __future__ import annotations

import json
import pathlib

import pytest
from conftest import load_script
from paired_traces import rotation_trace

pytestmark = pytest.mark.unit

resim_paired = load_script("resim_paired")
resim_compare = load_script("resim_compare")


def _two_servers(tmp_path: pathlib.Path) -> tuple[list[str], pathlib.Path]:
    """Two servers' traces (paired-r1, paired-r2) and their results.json."""
    windows = []
    paths = []
    for rnd in (1, 2):
        path = tmp_path / f"paired-r{rnd}.jsonl"
        windows += rotation_trace(path, server_round=rnd)
        paths.append(str(path))
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"paired": windows}))
    return paths, results


def _resim(paths: list[str], results: pathlib.Path, out: pathlib.Path, *args: str) -> dict:
    assert resim_paired.main([*paths, "--results", str(results), "--seeds", "2",
                              "--json-out", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_json_out_holds_every_printed_cell(tmp_path, capsys):
    paths, results = _two_servers(tmp_path)
    doc = _resim(paths, results, tmp_path / "a.json", "--policy", "fixed:0")
    out = capsys.readouterr().out
    assert doc["format"] == "vspec-resim" and doc["policy"] == "fixed:0"
    # 2 traces x 2 seeds x 2 workload cells, each K = 0's goodput ratio to K = 1 (0.875)
    assert len(doc["rows"]) == 8
    assert {(r["trace"], r["seed"], r["cell"]) for r in doc["rows"]} == {
        (p, s, c) for p in paths for s in (0, 1) for c in ("code@4", "mixed@4")}
    for row in doc["rows"]:
        assert row["ratio"] == pytest.approx(0.875, abs=0.01) and row["steps"] > 100
        assert f"{row['cell']}({row['steps']}):{row['ratio']:.3f}" in out


def test_a_change_is_the_paired_difference_with_its_error_over_the_traces(tmp_path, capsys):
    paths, results = _two_servers(tmp_path)
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    _resim(paths, results, a, "--policy", "fixed:1")
    _resim(paths, results, b, "--policy", "fixed:0")
    capsys.readouterr()
    got = resim_compare.compare(resim_compare.load(str(a)), resim_compare.load(str(b)))
    for s in (got["all"], *got["cells"].values()):
        assert s["a"] == 1.0 and s["diff"] == pytest.approx(-0.125, abs=0.01)
        # the two servers served the same steps: they moved alike, so the error is ~0
        assert s["traces"] == 2 and s["down"] == 2 and s["up"] == 0
        assert s["se"] == pytest.approx(0.0, abs=1e-9) and s["resolved"]
    assert set(got["cells"]) == {"code@4", "mixed@4"}
    assert resim_compare.main(["--base", str(a), "--change", str(b)]) == 0
    out = capsys.readouterr().out
    assert "| all | 1.0000 | 0.87" in out and "| -12." in out and "0 / 2 of 2 | resolved |" in out
    # a file against itself: no difference, nothing resolved
    assert resim_compare.main(["--base", str(a), "--change", str(a)]) == 0
    out = capsys.readouterr().out
    assert "| all | 1.0000 | 1.0000 | +0.00 | 0.00 | 0 / 0 of 2 | unresolved |" in out


def test_online_against_itself_with_another_config(tmp_path, capsys):
    """Two configurations of the policy on the same draws: the rows pair up and the
    difference is finite, whichever way it goes."""
    paths, results = _two_servers(tmp_path)
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    _resim(paths, results, a)
    _resim(paths, results, b, "--config", '{"exploration": 0.05}')
    got = resim_compare.compare(resim_compare.load(str(a)), resim_compare.load(str(b)))
    assert got["all"]["traces"] == 2 and got["all"]["se"] is not None
    assert abs(got["all"]["diff"]) < 0.1 and got["all"]["a"] != got["all"]["b"]


def test_files_that_do_not_pair_up_are_refused(tmp_path, capsys):
    paths, results = _two_servers(tmp_path)
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    _resim(paths, results, a, "--policy", "fixed:1")
    assert resim_paired.main([paths[0], "--results", str(results), "--seeds", "2",
                              "--policy", "fixed:1", "--json-out", str(b)]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    capsys.readouterr()
    for args, needle in (
            (["--base", str(a), "--change", str(b)],
             f"{a} and {b} hold different (trace, seed, cell) rows (4 only in {a}, 0 only in {b})"),
            (["--base", str(a), "--change", str(bad)], f"{bad}: not a resim_paired.py --json-out file"),
            (["--base", str(a), "--change", str(tmp_path / "none.json")], "none.json: cannot read"),
            (["--base", str(a), str(b), "--change", str(a)], f"{b}: trace {paths[0]} is in {a} too")):
        with pytest.raises(SystemExit) as exc:
            resim_compare.main(args)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("error:") == 1 and "Traceback" not in err
