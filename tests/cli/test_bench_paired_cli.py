"""``vllm-hust-vspec-bench paired``: the paired tables of several ``bench ab`` results files as
one, each file's servers numbered after the files before it; the command runs as a
subprocess on results files written the way ``bench ab`` writes them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_hust_vspec.tools.bench_paired import Window
from vllm_hust_vspec.tools.bench_results import write_results

pytestmark = pytest.mark.cli


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.bench", "paired", *args],
                          capture_output=True, text=True, timeout=120)


def _windows(server_round: int, rounds: int, online: float) -> list[Window]:
    """One server's rotation rounds of code@4: fixed:0 at 800 tok/s, fixed:2 at 1000 and
    online at ``online``."""
    out = []
    for rnd in range(1, rounds + 1):
        for policy, tok_s in (("fixed:0", 800.0), ("fixed:2", 1000.0), ("online", online)):
            out.append(Window("code", 4, 0, server_round, rnd, rnd, policy, 10,
                              round(tok_s / 10.0), 100.0, 4.0, 0.3))
    return out


def _results(path, windows) -> None:
    write_results(path, "vllm-hust-vspec-bench ab --configs paired", {"kmax": 4}, [], windows)


def test_two_runs_pool_as_three_servers(tmp_path):
    """A run of two servers (online 1.1 x fixed K = 2) and one of one server (online 1.2 x):
    five rotation rounds, the servers' pooled ratios 1.1-1.2, online / fixed K = 0 the
    median of 1.375 (three rounds) and 1.5 (two)."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _results(a, _windows(1, 2, 1100.0) + _windows(2, 1, 1100.0))
    _results(b, _windows(1, 2, 1200.0))
    proc = _run(str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("## Paired in-engine comparison")
    (row,) = [line for line in proc.stdout.splitlines() if "| online |" in line]
    assert row.startswith("| code | 4 | fixed:2 | online |")
    # held out: fixed K = 2 is the pick on either half of any split, the pooled 1.139
    assert "(5) | 1.100-1.200 | 1.139 | - | - | 1.375 [1.375-1.500] |" in row
    # one file alone: its own two servers
    (row,) = [line for line in _run(str(a)).stdout.splitlines() if "| online |" in line]
    assert "1.100 [1.100-1.100] (3) | 1.100-1.100 |" in row


def test_a_file_without_paired_windows_or_unreadable_is_named(tmp_path):
    plain = tmp_path / "plain.json"
    _results(plain, [])
    proc = _run(str(plain))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"vllm-hust-vspec-bench: error: {plain}: no paired windows "
                                   "(a bench ab run without the paired configuration)")
    bad = tmp_path / "bad.json"
    doc = {"command": "x", "machine": {}, "runs": [],
           "paired": [dict(_windows(1, 1, 1000.0)[0].to_dict(), steps=-1)]}
    bad.write_text(json.dumps(doc))
    proc = _run(str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"{bad}: paired[0]: key 'steps' must be an integer >= 0" in proc.stderr
    proc = _run(str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "missing.json: cannot read" in proc.stderr


def test_beliefs_read_the_traces_next_to_the_results(tmp_path):
    """``--beliefs``: online's decisions from ``traces/paired-r1.jsonl`` against the fixed
    windows of the results file (fixed:1 30 ms a step, fixed:2 34 ms; online priced them 32
    and 41 ms); a missing trace, or a bad record in it, is one error that names it; two files
    are refused."""
    windows = [Window("mixed", 1, 0, 1, 1, 1, "fixed:1", 10, 17, 300.0, 1.0, 0.3,
                      by_batch=((1, 10, 17, 300.0),)),
               Window("mixed", 1, 0, 1, 2, 1, "fixed:2", 10, 20, 340.0, 1.0, 0.3,
                      by_batch=((1, 10, 20, 340.0),)),
               Window("mixed", 1, 0, 1, 3, 1, "online", 10, 17, 300.0, 1.0, 0.3,
                      by_batch=((1, 10, 17, 300.0),))]
    res = tmp_path / "results.json"
    _results(res, windows)
    proc = _run(str(res), "--beliefs")
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"{tmp_path / 'traces' / 'paired-r1.jsonl'}: cannot read" in proc.stderr
    decision = {"step": 5, "batch": 1, "k": 1, "policy": "online", "reason": "best k=1",
                "est_accept": [0.75, 0.6], "est_costs": [None, 32.0, 41.0],
                "est_goodput": [None, 0.0547, 0.0537]}
    (tmp_path / "traces").mkdir()
    def window(n, policy, tokens, ms):
        return {"window": n, "round": 1, "policy": policy, "steps": 10, "tokens": tokens,
                "ms": ms, "batch": 1.0, "by_batch": [[1, 10, tokens, ms]]}

    lines = [{"trace": "vspec-decisions", "version": 1, "settings": {}},
             window(1, "fixed:1", 17, 300.0), window(2, "fixed:2", 20, 340.0), decision,
             window(3, "online", 17, 300.0)]
    (tmp_path / "traces" / "paired-r1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = _run(str(res), "--beliefs")
    assert proc.returncode == 0, proc.stderr
    assert "| mixed@1 | 1 | 1 | 1 | 1: 1.07, 2: 1.21 | 0.123 | 0.963 | 1.000 | 0.963 | - |" in proc.stdout
    proc = _run(str(res), str(res), "--beliefs")
    assert proc.returncode == 2 and "reads one results file" in proc.stderr
    del decision["batch"]  # a decision without its batch: named by file, line and key
    (tmp_path / "traces" / "paired-r1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = _run(str(res), "--beliefs")
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"{tmp_path / 'traces' / 'paired-r1.jsonl'}:4" in proc.stderr and "batch" in proc.stderr


def test_a_waves_run_written_before_the_rows_is_judged_at_a_common_speed_from_its_traces(tmp_path):
    """A results file whose windows carry no ``by_k`` (written before the engine kept them)
    with its decision trace next to it: the rows are rebuilt from the trace's steps and the
    common-speed tables follow the measured ones. Online holds fixed K = 2's K at batch 4;
    round 2's online window ran 1.3 x slower (a slow spell): measured, its ratio is 0.77 in
    that round, at the common speed 1.000 in every round."""
    recs = [{"trace": "vspec-decisions", "version": 1, "settings": {}}]
    windows = []
    step = 0
    for rnd, slow in ((1, 1.0), (2, 1.3), (3, 1.0)):
        for n, (policy, k, base) in enumerate((("fixed:1", 1, 40.0), ("fixed:2", 2, 46.0),
                                               ("online", 2, 46.0)), 1):
            ms = base * (slow if policy == "online" else 1.0)
            number = 3 * (rnd - 1) + n
            for _ in range(10):
                step += 1
                recs.append({"step": step, "batch": 4, "k": k,
                             "policy": "online" if policy == "online" else "fixed",
                             "reason": "x"})
                recs.append({"step": step, "drafted": 4 * k, "accepted": 2 * k, "ms": ms})
            tokens = 10 * (4 + 2 * k)
            rec = {"window": number, "round": rnd, "policy": policy, "steps": 10,
                   "tokens": tokens, "ms": 10 * ms, "batch": 4.0,
                   "by_batch": [[4, 10, tokens, 10 * ms]], "wave_steps": 12,
                   "wave_ms": 10 * ms + 200.0}
            recs.append(rec)
            windows.append(Window("code", 4, 0, 1, number, rnd, policy, 10, tokens, 10 * ms,
                                  4.0, 0.3, ((4, 10, tokens, 10 * ms),), 12, 10 * ms + 200.0))
    res = tmp_path / "results.json"
    _results(res, windows)
    (tmp_path / "traces").mkdir()
    trace = tmp_path / "traces" / "paired-r1.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in recs))
    proc = _run(str(res))
    assert proc.returncode == 0, proc.stderr
    measured, common = proc.stdout.split("## At a common machine speed")
    head = "| code | 4 | fixed:2 | online |"
    (row,) = [line for line in measured.splitlines() if line.startswith(head)]
    assert "| 1.000 [0.885-1.000] (3) |" in row
    (row,) = [line for line in common.splitlines() if line.startswith(head)]
    median, quartiles = row.split("|")[6].split()[:2]
    # a window's speed is shrunk by one step's weight in its 10: 1.3 leaves about 1.02
    assert median == "1.000" and float(quartiles.strip("[").split("-")[0]) > 0.98
    assert "not recorded (a run before it was)" in common
    # the check: online's steps against fixed K = 2's at batch 4 and K = 2, 1.3 x in one
    # window of three (exp of the mean log: 1.091), there being no policy_ms in these records
    assert "online 1.091 (+-0.087, 3 windows)" in common
    # without the trace: the measured tables alone
    trace.unlink()
    proc = _run(str(res))
    assert proc.returncode == 0 and "common machine speed" not in proc.stdout
