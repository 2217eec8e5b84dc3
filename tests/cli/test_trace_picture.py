"""``vllm-hust-vspec-bench trace``: a decision trace as a PNG and a summary.

The trace comes from the real controller (the ``sweep`` policy, which forces K = 0
stretches, and the online step-cost estimate under ``online``), written the way the
engine runtime writes it; the command runs as a subprocess."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.controller import Controller, ControllerConfig
from vllm_hust_vspec.adaptive.observations import BatchView, StepResult

pytestmark = pytest.mark.cli

KMAX = 4


def _trace(path, policy: str, **extra) -> None:
    ctl = Controller(ControllerConfig(kmax=KMAX, policy=policy, trace=True, **extra))
    rng = np.random.default_rng(0)
    lines = [ctl.trace_header(host={"host": "test"})]
    ids = tuple(f"r{i}" for i in range(4))
    for step in range(1, 61):
        b = 4 if step < 40 else 2
        d = ctl.decide(BatchView(step=step, req_ids=ids[:b]))
        drafted = np.full(b, d.k)
        accepted = rng.integers(0, d.k + 1, size=b)
        ms = None if step % 10 == 0 else 10.0 + 2.0 * d.k * b
        ctl.observe(StepResult(step, b, d.k, (), ms, max(d.k, 1), drafted=drafted,
                               accepted=accepted))
        lines += ctl.drain_records()
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.bench", "trace", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("policy, extra", [("sweep", {"sweep": (0, 0, 0, 2, 4, 3)}),
                                           ("online", {})])
def test_the_picture_has_its_panels_and_the_summary_matches_the_trace(tmp_path, policy, extra):
    trace = tmp_path / "decisions.jsonl"
    _trace(trace, policy, **extra)
    proc = _run(str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    png = tmp_path / "decisions.png"
    assert s["png"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert s["panels"] == ["K and K_i", "batch size", "acceptance estimate", "step cost",
                           "goodput"]
    recs = [json.loads(line) for line in trace.read_text().splitlines()[1:]]
    ds = [r for r in recs if "policy" in r]
    rs = [r for r in recs if "drafted" in r]
    ks = [d["k"] for d in ds]
    assert s["decisions"] == len(ds) == 60 and s["results"] == len(rs) == 60
    assert s["k_hist"] == {str(k): ks.count(k) for k in sorted(set(ks))}
    assert s["mean_k"] == pytest.approx(statistics.fmean(ks))
    assert s["k0_share"] == pytest.approx(ks.count(0) / 60)
    assert s["acceptance_rate"] == pytest.approx(sum(r["accepted"] for r in rs)
                                                 / sum(r["drafted"] for r in rs))
    batch = {d["step"]: d["batch"] for d in ds}
    timed = [r for r in rs if r["ms"] is not None]
    assert s["timed_steps"] == len(timed) == 54
    assert s["measured_goodput_tok_s"] == pytest.approx(
        1000 * sum(batch[r["step"]] + r["accepted"] for r in timed) / sum(r["ms"] for r in timed))
    if policy == "sweep":
        assert (s["k0_stretches"], s["longest_k0_stretch"]) == (10, 3)
    text = _run(str(trace), "--png", str(tmp_path / "other.png"))
    assert text.returncode == 0 and (tmp_path / "other.png").exists()
    assert f"policy {policy}, 60 decisions, 60 results" in text.stdout


def test_a_file_that_is_no_decision_trace_is_one_clear_error(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"format": "vspec-trace", "version": 1}\n')
    proc = _run(str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("error:") == 1 and str(bad) in proc.stderr
    bad.write_text('{"trace": "vspec-decisions", "version": 1}\nnot json\n')
    proc = _run(str(bad))
    assert proc.returncode == 2 and f"{bad}:2: not JSON" in proc.stderr


def test_the_summary_sets_what_online_believed_beside_what_the_steps_measured(tmp_path):
    """Every online decision weighs each K (``est_costs``); the summary's belief rows put
    their median beside the steady steps' measured ms (here exactly 10 + 2 K B), and a
    paired comparison's window records give each policy's pooled speed."""
    trace = tmp_path / "decisions.jsonl"
    _trace(trace, "online")
    recs = [json.loads(line) for line in trace.read_text().splitlines()[1:]]
    windows = [{"window": 1, "round": 1, "policy": "fixed:2", "steps": 3, "tokens": 30,
                "ms": 20.0, "batch": 4.0},
               {"window": 2, "round": 1, "policy": "online", "steps": 3, "tokens": 24,
                "ms": 20.0, "batch": 4.0},
               {"window": 3, "round": 2, "policy": "fixed:2", "steps": 3, "tokens": 10,
                "ms": 20.0, "batch": 4.0}]
    with open(trace, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(w) + "\n" for w in windows)
    proc = _run(str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["window_tok_s"] == {"fixed:2": 1000.0, "online": 1200.0}
    ds = {r["step"]: r for r in recs if "est_accept" in r}
    timed = {r["step"] for r in recs if "drafted" in r and r["ms"] is not None}
    est: dict = {}
    for d in ds.values():
        for k, c in enumerate(d.get("est_costs") or ()):
            if c is not None:
                est.setdefault((d["batch"], k), []).append(c)
    steady = {(d["batch"], d["k"]) for st, d in ds.items() if st in timed and not d["k_i"]
              and st - 1 in ds and ds[st - 1]["k"] == d["k"]}
    rows = {(r["batch"], r["k"]): r for r in s["belief"]}
    assert rows and set(rows) == set(est) & steady
    for (b, k), r in rows.items():
        assert r["measured_ms"] == pytest.approx(10.0 + 2.0 * k * b)
        assert r["est_ms"] == pytest.approx(statistics.median(est[(b, k)]), abs=1e-3)
    text = _run(str(trace))
    assert "believed vs measured, per batch and K" in text.stdout
    assert "compared windows, tok/s: fixed:2 1000.0, online 1200.0" in text.stdout


def _per_pass_ms(b: int, t: int, passes: int) -> float:
    """A host whose drafter pass costs a fixed 3.5 ms plus 0.3 ms a request."""
    return 12.0 + 0.25 * max(t, 6) + passes * (3.5 + 0.3 * b)


def test_replay_cost_prices_each_step_from_the_steps_before_it(tmp_path):
    """``--replay-cost``: the controller's step-cost model replayed over a trace's timed
    steps (a sweep over K at batches 1, 4 and 16; the drafter passes the draft model runs,
    none at K = 0 with the skip) recovers the host's cost, and names the first predictions
    that were off: those at batch 4 from batch 1 alone, where a verified token and a drafter
    pass cannot be told apart (T = 1 + D), but not K = 4 there, priced after K = 0..3 had run
    at batch 4 (the batch's factor, ``StepCostModel.batch_factor``: 41.5 ms for 30.1 at
    K = 3, within 35 % at K = 4); from batches 1 and 4 it prices batch 16."""
    ctl = Controller(ControllerConfig(kmax=KMAX, policy="sweep", sweep=(0, 1, 2, 3, 4), trace=True))
    lines = [ctl.trace_header(host={"host": "test", "method": "draft_model"})]
    ids = tuple(f"r{i}" for i in range(16))
    step = 0
    for b in (1, 4, 16):
        for _ in range(40):
            step += 1
            d = ctl.decide(BatchView(step=step, req_ids=ids[:b]))
            drafted = np.full(b, d.k)
            ctl.observe(StepResult(step, b, d.k, (), _per_pass_ms(b, b + int(drafted.sum()), d.k),
                                   d.k, drafted=drafted, accepted=np.zeros(b, dtype=int)))
            lines += ctl.drain_records()
    trace = tmp_path / "decisions.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in lines))
    proc = _run(str(trace), "--json", "--replay-cost")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)["cost_replay"]
    assert rep["timed_steps"] == 120 and rep["predicted"] == 120 - 4  # ready after 4 samples
    assert rep["coef"]["c_p"] == pytest.approx(3.5, rel=0.02)
    assert rep["coef"]["c_d"] == pytest.approx(0.3, rel=0.02)
    assert rep["coef"]["c_t"] == pytest.approx(0.25, rel=0.02)
    assert rep["rmse_ms"] < 0.05 and rep["median_abs_err"] < 0.01
    # 15 cells, the first 4 (batch 1, K = 0..3) timed before the model was ready
    assert rep["first_cells"] == 11
    assert [(f["batch"], f["k"]) for f in rep["first_off"]] == [
        (4, 0), (4, 1), (4, 2), (4, 3)]
    assert all(f["pred_ms"] > f["ms"] for f in rep["first_off"])  # all overpriced
    text = _run(str(trace), "--replay-cost", "--png", str(tmp_path / "r.png"))
    assert text.returncode == 0 and "cost model replay: 120 timed steps" in text.stdout
    assert "off at first sight: batch 4 K 1 (step 42)" in text.stdout
