"""vllm-hust-vspec-bench ab (and vllm-hust-vspec-profile): the server each configuration gets,
bad input with one clear error and no server left running, and a minimal real A/B."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from launcher_util import REPO, clean_env
from test_launcher_calibration import table as cost_table

pytestmark = pytest.mark.cli

PRESET = str(REPO / "configs" / "tiny-cpu-draft.toml")


def bench(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.bench", "ab", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def profile(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.profile", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def fake(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """Model dirs that exist (dry runs and the checks before a start need no real model) and
    a small prompt set."""
    models = tmp_path / "models"
    for name in ("target-large", "draft"):
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text("{}")  # not a model: a server dies on it
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name, n in (("code", 128), ("hard", 24)):
        (prompts / f"{name}.jsonl").write_text(
            "".join(json.dumps({"prompt": f"{name} {i}", "output_tokens": n}) + "\n"
                    for i in range(6)))
    return {"models": models, "prompts": prompts, "out": tmp_path / "out"}


def fake_env(fake: dict[str, pathlib.Path]) -> dict[str, str]:
    return clean_env(HUST_VSPEC_MODEL_DIR=str(fake["models"]))


def real_ab(fixtures_dir: pathlib.Path, out: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """One round of ``bench ab`` on the real fixtures (one warm-up request per server),
    which must succeed. The start-up cost probe (on by default, ~20 s a server that runs
    online) is off: these test the benchmark; the demo test runs the defaults."""
    env = clean_env(HUST_VSPEC_MODEL_DIR=str(fixtures_dir))
    proc = bench("--prompts-dir", str(fixtures_dir / "prompts"), "--output-dir", str(out),
                 "--rounds", "1", "--warmup-requests", "1", *args, "--", "--config", PRESET,
                 "--no-adaptive-cost-probe",
                 env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def dry_run(fake, *args: str) -> dict[str, dict]:
    proc = bench("--dry-run", "--prompts-dir", str(fake["prompts"]), "--output-dir",
                 str(fake["out"]), *args, env=fake_env(fake))
    assert proc.returncode == 0, proc.stderr
    configs: dict[str, dict] = {}
    name = None
    for line in proc.stdout.splitlines():
        m = re.match(r"\[(\S+)\] policy=(\S+) k=(\d+) plugin=(on|off)", line)
        if m:
            name = m.group(1)
            configs[name] = {"policy": m.group(2), "k": int(m.group(3)), "plugin": m.group(4)}
        elif line.startswith("  env: ") and name:
            configs[name]["env"] = dict(kv.split("=", 1) for kv in line[7:].split())
        elif line.startswith("  cmd: ") and name:
            configs[name]["cmd"] = line[7:]
    configs["_cells"] = [line.split()[1].rstrip(":") for line in proc.stdout.splitlines()
                         if line.startswith("cell ")]
    assert not fake["out"].exists()  # a dry run writes nothing
    return configs


def spec_of(cmd: str) -> dict | None:
    m = re.search(r"--speculative-config '([^']+)'", cmd)
    return None if m is None else json.loads(m.group(1))


def test_dry_run_one_launcher_resolution_per_configuration(fake):
    got = dry_run(fake, "--native-table", "1-2:4,3-8:2,9-16:1", "--",
                  "--config", PRESET, "--max-num-seqs", "16")
    assert [n for n in got if n != "_cells"] == [
        "none", "fixed-k1", "fixed-k2", "fixed-k3", "fixed-k4", "native_table", "online",
        "budget"]
    # the same host flags everywhere
    host = [re.sub(r" --speculative-config '[^']+'", "", got[n]["cmd"]) for n in got if n != "_cells"]
    assert len(set(host)) == 1 and "--max-num-seqs 16" in host[0]
    assert f"--model {fake['models']}/target-large" in host[0]
    # plugin off: the host as users run it today
    for name in ("none", "fixed-k1", "fixed-k4", "native_table"):
        env = got[name]["env"]
        assert env["HUST_VSPEC_ENABLED"] == "0"
        assert not [k for k in env if k.startswith("HUST_VSPEC_") and k != "HUST_VSPEC_ENABLED"]
    assert spec_of(got["none"]["cmd"]) is None and got["none"]["k"] == 0
    assert spec_of(got["fixed-k2"]["cmd"])["num_speculative_tokens"] == 2
    table = spec_of(got["native_table"]["cmd"])
    assert table["num_speculative_tokens"] == 4
    assert table["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 2], [9, 16, 1]]
    # plugin on
    online = got["online"]
    assert online["plugin"] == "on" and online["k"] == 4
    assert online["env"]["HUST_VSPEC_ENABLED"] == "1"
    assert online["env"]["HUST_VSPEC_ADAPTIVE_POLICY"] == "online"
    assert online["env"]["HUST_VSPEC_ADAPTIVE_TRACE_FILE"] == str(fake["out"] / "traces" / "online-r1.jsonl")
    assert spec_of(online["cmd"])["num_speculative_tokens"] == 4
    budget = got["budget"]  # calibrates its cost table at start (built-in grid)
    assert budget["plugin"] == "on" and budget["k"] == 4
    assert budget["env"]["HUST_VSPEC_ADAPTIVE_POLICY"] == "budget"
    assert spec_of(budget["cmd"])["num_speculative_tokens"] == 4
    assert got["_cells"] == ["code@1", "code@4", "code@16", "hard@1", "hard@4", "hard@16",
                             "mixed@1", "mixed@4", "mixed@16", "shifting@1", "shifting@4",
                             "shifting@16", "swing@swing"]


def test_dry_run_native_table_from_a_profile(fake, tmp_path):
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"batch_gamma_policy": {"1": 3, "4": 2, "16": 0}}))
    got = dry_run(fake, "--configs", "native_table,fixed:3", "--native-table", str(prof),
                  "--workloads", "code", "--concurrency", "2", "--", "--config", PRESET)
    spec = spec_of(got["native_table"]["cmd"])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 4, 2], [5, 16, 0]]
    assert list(got)[:2] == ["native_table", "fixed-k3"] and got["_cells"] == ["code@2"]


def test_dry_run_paired_takes_the_policies_in_turns_in_one_server(fake):
    got = dry_run(fake, "--configs", "none,paired", "--fixed-ks", "1,3", "--paired-window", "8",
                  "--workloads", "code", "--concurrency", "2", "--", "--config", PRESET)
    paired = got["paired"]
    assert paired["plugin"] == "on" and paired["policy"] == "paired"
    assert paired["env"]["HUST_VSPEC_ADAPTIVE_COMPARE"] == "fixed:1,fixed:3,online"
    assert paired["env"]["HUST_VSPEC_ADAPTIVE_COMPARE_WINDOW"] == "8"
    assert paired["env"]["HUST_VSPEC_ADAPTIVE_TRACE_FILE"].endswith("traces/paired-r1.jsonl")
    got = dry_run(fake, "--configs", "paired", "--paired-policies", "fixed:0,fixed:2,budget",
                  "--workloads", "code", "--concurrency", "2", "--", "--config", PRESET)
    assert got["paired"]["env"]["HUST_VSPEC_ADAPTIVE_COMPARE"] == "fixed:0,fixed:2,budget"
    assert got["paired"]["env"]["HUST_VSPEC_ADAPTIVE_COMPARE_WAVES"] == "0"
    got = dry_run(fake, "--configs", "paired", "--paired-waves", "--workloads", "code",
                  "--concurrency", "2", "--", "--config", PRESET)
    assert got["paired"]["env"]["HUST_VSPEC_ADAPTIVE_COMPARE_WAVES"] == "1"


def test_paired_cells_can_hold_more_waves_than_the_others(fake):
    """--paired-requests-per-slot gives the paired server alone more waves (rotation rounds)
    per cell, its first waves the other servers' texts; the others' cells stay as short."""
    proc = bench("--dry-run", "--prompts-dir", str(fake["prompts"]), "--output-dir",
                 str(fake["out"]), "--configs", "none,paired", "--paired-waves",
                 "--workloads", "code,swing", "--concurrency", "1,4", "--swing-phases", "1,2",
                 "--requests-per-slot", "1", "--min-requests", "2",
                 "--paired-requests-per-slot", "3", "--", "--config", PRESET,
                 env=fake_env(fake))
    assert proc.returncode == 0, proc.stderr
    cells = dict(re.findall(r"^cell (\S+): requests (\S+),", proc.stdout, re.M))
    paired = dict(re.findall(r"^paired cell (\S+): requests (\S+),", proc.stdout, re.M))
    assert cells == {"code@1": "2@1", "code@4": "4@4", "swing@swing": "2@1+2@2"}
    assert paired == {"code@1": "3@1", "code@4": "12@4", "swing@swing": "3@1+6@2"}
    # without it the paired server runs the same cells and the dry run lists them once
    got = dry_run(fake, "--configs", "none,paired", "--workloads", "code", "--concurrency",
                  "4", "--", "--config", PRESET)
    assert got["_cells"] == ["code@4"]


def test_budget_servers_alone_get_the_cost_table(fake, tmp_path):
    """--budget-cost-table goes to the servers that run budget (alone or in turns), never to
    online (which refuses it); a table of another width is refused before any server."""
    table = cost_table(tmp_path, 4)
    got = dry_run(fake, "--configs", "online,budget,paired", "--paired-policies",
                  "fixed:2,budget", "--budget-cost-table", str(table), "--workloads", "code",
                  "--concurrency", "2", "--", "--config", PRESET)
    key = "HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE"
    assert got["budget"]["env"][key] == str(table)
    assert got["paired"]["env"][key] == str(table)
    assert key not in got["online"]["env"]
    # without it a dry run shows the budget server calibrating (the output path is made later)
    got = dry_run(fake, "--configs", "budget", "--workloads", "code", "--concurrency", "2",
                  "--", "--config", PRESET)
    assert not [k for k in got["budget"]["env"] if k.startswith(key)]
    for args, launcher, expect in (
            (["--budget-cost-table", cost_table(tmp_path, 5, "costs-w5.json")], [],
             "field 'draft_width': table has 5 but the running width is 4"),
            (["--configs", "online", "--budget-cost-table", str(table)], [],
             "--budget-cost-table is given but no configuration runs the budget policy"),
            ([], ["--adaptive-dspark-cost-table-output", str(tmp_path / "t.json")],
             "pass a saved table as --budget-cost-table")):
        proc = bench("--prompts-dir", str(fake["prompts"]), "--output-dir", str(fake["out"]),
                     "--workloads", "code", "--concurrency", "2",
                     *(["--configs", "none,budget"] if "--configs" not in args else []), *args,
                     "--", "--config", PRESET, *launcher, env=fake_env(fake))
        assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
        assert proc.stderr.count("error:") == 1 and not fake["out"].exists()


def test_an_earlier_runs_calibration_is_not_overwritten(fake):
    """A budget calibration left in --output-dir by an earlier run: refused before any server
    (the saved table would be reused unseen, or overwritten)."""
    fake["out"].mkdir()
    (fake["out"] / "budget.cost-table.json").write_text("{}")
    proc = bench("--prompts-dir", str(fake["prompts"]), "--output-dir", str(fake["out"]),
                 "--workloads", "code", "--concurrency", "1", "--configs", "budget",
                 "--", "--config", PRESET, env=fake_env(fake))
    assert proc.returncode == 1 and proc.stderr.count("error:") == 1, proc.stderr
    assert "budget.cost-table.json exists" in proc.stderr and "--budget-cost-table" in proc.stderr
    assert "server pid" not in proc.stdout


def test_dspark_without_the_plugin_is_refused_on_the_v1_runner(fake):
    """vLLM drafts DSpark only in its V2 GPU runner: on the CPU host the plugin-off fixed K
    and native_table cannot start, and the bench says so before any server; plugin:K can."""
    (fake["models"] / "dspark").mkdir()
    (fake["models"] / "dspark" / "config.json").write_text("{}")
    dspark = str(REPO / "configs" / "tiny-cpu-dspark.toml")
    proc = bench("--prompts-dir", str(fake["prompts"]), "--workloads", "code", "--configs",
                 "none,fixed:5", "--", "--config", dspark, env=fake_env(fake))
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1, proc.stderr
    assert "configuration fixed-k5: method dspark" in proc.stderr and "plugin:K" in proc.stderr
    got = dry_run(fake, "--configs", "none,plugin:5,budget", "--workloads", "code",
                  "--concurrency", "2", "--", "--config", dspark)
    assert spec_of(got["plugin-k5"]["cmd"])["method"] == "dspark"
    assert got["plugin-k5"]["env"]["HUST_VSPEC_ADAPTIVE_FIXED_GAMMA"] == "5"


@pytest.mark.parametrize("args, message", [
    (["--paired-policies", "fixed:9,online"], "--paired-policies fixed:9: K=9 exceeds Kmax=4"),
    (["--paired-policies", "online"], "--paired-policies: give two or more"),
    (["--paired-policies", "sweep,online"], "unknown policy 'sweep'"),
    (["--paired-window", "2"], "--paired-window: 2 must be >= 4"),
    (["--configs", "none", "--paired-waves"], "--paired-waves is given but --configs has no paired"),
    (["--configs", "none", "--paired-requests-per-slot", "3"],
     "--paired-requests-per-slot is given but --configs has no paired"),
    (["--paired-requests-per-slot", "0"], "--paired-requests-per-slot"),
])
def test_bad_paired_input_is_one_error_before_any_server(fake, args, message):
    proc = bench("--configs", "paired", "--prompts-dir", str(fake["prompts"]), *args,
                 "--", "--config", PRESET, env=fake_env(fake))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stderr.count("error:") == 1 and "server pid" not in proc.stdout


@pytest.mark.slow
def test_paired_real_server(fixtures_dir, tmp_path):
    """The paired configuration on the real CPU host: fixed K = 1, fixed K = 3 and online
    take turns in one server over code at concurrency 2; results.json holds their windows,
    report.md pairs them per rotation round against the best fixed K."""
    out = tmp_path / "ab"
    real_ab(fixtures_dir, out, "--configs", "paired", "--paired-policies",
            "fixed:1,fixed:3,online", "--paired-window", "4", "--workloads", "code",
            "--concurrency", "2", "--output-len", "32", "--requests-per-slot", "4")
    doc = json.loads((out / "results.json").read_text())
    from vllm_hust_vspec.tools.bench_paired import summarize, window_from_dict
    from vllm_hust_vspec.tools.bench_results import validate_results

    assert validate_results(doc) == []  # no server-level rows: the windows are the result
    windows = [window_from_dict(w, "w") for w in doc["paired"]]
    assert {w.policy for w in windows} == {"fixed:1", "fixed:3", "online"}
    assert all(w.workload == "code" and w.concurrency == 2 for w in windows)
    assert sum(w.steps for w in windows) >= 30 and all(w.tokens >= w.steps for w in windows)
    (cell,) = summarize(windows)
    assert cell.best_fixed in ("fixed:1", "fixed:3")
    best = cell.row(cell.best_fixed)
    assert best.ratio == 1.0 and best.rounds >= 2
    online = cell.row("online")
    assert online.ratio is not None and 0.3 < online.ratio < 3.0
    # the steady steps by (batch, K), each row at a K the window's policy drafts (fixed K =
    # 1 and 3 only theirs), and the policy's own work, part of the window's time
    assert sum(1 for w in windows if w.by_k) >= len(windows) // 2
    assert all({r[1] for r in w.by_k} <= {int(w.policy[6:])} for w in windows
               if w.policy.startswith("fixed:"))
    assert all(w.policy_ms is not None and 0 < w.policy_ms < w.ms for w in windows if w.steps)
    report = (out / "report.md").read_text()
    assert "## Paired in-engine comparison" in report
    assert "## At a common machine speed" in report
    assert f"| code | 2 | {cell.best_fixed} | online |" in report
    assert "Load average (1 min) before each server" in report
    assert report.startswith("Load average (1 min) before the first server: ")
    assert isinstance(doc["machine"]["load_1m_start"], float)
    assert not (out / "ab.png").exists()  # nothing to plot without server-level rows


def _alive(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and _alive(int(entry.name)):
            out.append(int(entry.name))
    return out


@pytest.mark.parametrize("args, launcher, expect", [
    (["--workloads", "code,bogus"], [], "unknown workload 'bogus'"),
    (["--configs", "none,fastest"], [], "unknown configuration 'fastest'"),
    (["--configs", "none,native_table"], [], "native_table needs --native-table"),
    (["--native-table", "2-4:1"], [], "must start at batch size 1"),
    (["--native-table", "1-16:5"], [], "K=5 for batch sizes 1-16 exceeds Kmax 4"),
    ([], ["--max-num-seqs", "8"], "max_num_seqs is 8"),
    ([], ["--port", "9999"], "'--port'"),
    (["--concurrency", "0"], [], "--concurrency: 0 must be >= 1"),
    (["--swing-phases", "1,x"], [], "--swing-phases: 'x'"),
    (["--quiet-load", "0"], [], "--quiet-load"),
    ([], ["--confidence-accept-margin", "2"], "lossy acceptance (margin2) changes the output"),
])
def test_bad_input_one_error_nothing_started(fake, args, launcher, expect):
    table = [] if any(a.startswith("--native-table") for a in args) or "--configs" in args \
        else ["--native-table", "1-16:2"]
    proc = bench("--prompts-dir", str(fake["prompts"]), "--output-dir", str(fake["out"]),
                 *table, *args, "--", "--config", PRESET, "--max-num-seqs", "16", *launcher,
                 env=fake_env(fake))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expect in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not fake["out"].exists()  # nothing started, nothing written


def test_missing_dataset_and_missing_model(fake, tmp_path):
    (fake["prompts"] / "hard.jsonl").unlink()
    proc = bench("--prompts-dir", str(fake["prompts"]), "--workloads", "code,mixed",
                 "--configs", "none", "--", "--config", PRESET, env=fake_env(fake))
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1
    assert "prompt set 'hard'" in proc.stderr and "hard.jsonl not found" in proc.stderr
    proc = bench("--prompts-dir", str(fake["prompts"]), "--workloads", "code", "--configs", "none",
                 "--", "--config", PRESET, env=clean_env(HUST_VSPEC_MODEL_DIR=str(tmp_path / "no")))
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1
    assert "target-large" in proc.stderr and "--target-model" in proc.stderr


def test_no_launcher_arguments(fake):
    proc = bench("--prompts-dir", str(fake["prompts"]), "--configs", "none", env=fake_env(fake))
    assert proc.returncode == 2 and "launcher arguments after --" in proc.stderr


def test_server_that_fails_to_start_leaves_nothing_running(fake):
    """The model dirs hold no model: the server dies while loading; the bench reports it once,
    names the configuration and the log, and no process of it is left."""
    proc = bench("--prompts-dir", str(fake["prompts"]), "--output-dir", str(fake["out"]),
                 "--workloads", "code", "--concurrency", "1", "--configs", "fixed:2,online",
                 "--rounds", "1", "--start-timeout", "300", "--", "--config", PRESET,
                 env=fake_env(fake), timeout=400)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr
    assert "server for configuration fixed-k2 exited with code" in proc.stderr
    assert "fixed-k2-r1.server.log" in proc.stderr
    pids = [int(p) for p in re.findall(r"server pid (\d+)", proc.stdout)]
    assert len(pids) == 1  # it stopped at the first failure
    assert not _alive(pids[0])
    assert _procs_mentioning(str(fake["models"])) == []
    assert not (fake["out"] / "results.json").exists()


def test_server_not_ready_in_time_is_stopped(fixtures_dir, tmp_path):
    """A real server that is still loading when --start-timeout ends is killed, engine core and
    all."""
    out = tmp_path / "out"
    env = clean_env(HUST_VSPEC_MODEL_DIR=str(fixtures_dir))
    proc = bench("--prompts-dir", str(fixtures_dir / "prompts"), "--output-dir", str(out),
                 "--workloads", "code", "--concurrency", "1", "--configs", "none",
                 "--rounds", "1", "--start-timeout", "3", "--", "--config", PRESET,
                 env=env, timeout=200)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "was not ready after 3 s" in proc.stderr and proc.stderr.count("error:") == 1
    started = re.findall(r"server pid (\d+) port (\d+)", proc.stdout)
    assert len(started) == 1
    pid, port = int(started[0][0]), started[0][1]
    assert not _alive(pid)
    assert _procs_mentioning(f"--port {port} ") == []


@pytest.mark.slow
def test_minimal_real_ab(fixtures_dir, tmp_path):
    """One round, tiny token caps, two configurations (fixed K=2, online) over code at
    concurrency 2 and a two-phase swing: the whole pipeline on the real CPU host.  The
    target-only server (``none``) runs in the open-loop test below."""
    out = tmp_path / "ab"
    proc = real_ab(fixtures_dir, out, "--configs", "fixed:2,online", "--workloads",
                   "code,swing", "--concurrency", "2", "--swing-phases", "1,2",
                   "--output-len", "12", "--requests-per-slot", "1", "--min-requests", "2",
                   "--quiet-load", "1000")  # waits for nothing: the wiring runs
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == str(out / "results.json")
    assert sum(1 for line in lines if re.match(r"\[\d/2\] round 1/1 ", line)) == 2
    doc = json.loads((out / "results.json").read_text())
    from vllm_hust_vspec.tools.bench_results import validate_results

    runs = validate_results(doc)
    assert {(r.config, r.workload, r.concurrency) for r in runs} == {
        (c, w, n) for c in ("fixed-k2", "online") for w, n in (("code", 2), ("swing", "swing"))}
    by = {(r.config, r.workload): r for r in runs}
    for r in runs:
        assert r.output_tok_s > 0 and r.tpot_ms > 0
    fixed = by[("fixed-k2", "code")]
    assert fixed.k == 2 and fixed.mean_k == pytest.approx(2.0, abs=0.05)
    assert 1.0 < fixed.mean_accept_len <= 3.0
    online = by[("online", "code")]
    assert online.policy == "online" and online.k == 4 and 0.0 <= online.mean_k <= 4.0
    assert doc["machine"]["method"] == "draft_model" and doc["machine"]["kmax"] == 4
    assert (out / "ab.png").read_bytes()[:4] == b"\x89PNG"
    assert "| code | 2 | fixed-k2 |" in (out / "report.md").read_text()
    trace = (out / "traces" / "online-r1.jsonl").read_text().splitlines()
    assert json.loads(trace[0])["trace"] == "vspec-decisions"
    # the plugin server's picture, linked from the report with its summary
    assert (out / "traces" / "online-r1.png").read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    assert "- [online-r1](traces/online-r1.png) ([trace](traces/online-r1.jsonl))" in report
    decisions = [r for r in map(json.loads, trace) if "policy" in r and "trace" not in r]
    assert f"policy online, {len(decisions)} decisions" in report
    assert not (out / "traces" / "fixed-k2-r1.png").exists()  # plugin off: no trace
    pids = [int(p) for p in re.findall(r"server pid (\d+)", proc.stdout)]
    assert len(pids) == 2 and not any(_alive(p) for p in pids)


def test_profile_dry_run_and_bad_input(fake):
    env = fake_env(fake)
    proc = profile("--dry-run", "--prompts-dir", str(fake["prompts"]), "--gammas", "0,2",
                   "--batches", "1,4", "--", "--config", PRESET, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "K [0, 2] x batch [1, 4] x output [32, 96]; Kmax 2; 2 servers" in proc.stdout
    k0 = [line for line in proc.stdout.splitlines() if line.startswith("[k0] env:")][0]
    assert "HUST_VSPEC_ADAPTIVE_POLICY=fixed" in k0 and "HUST_VSPEC_ADAPTIVE_FIXED_GAMMA=0" in k0
    cmd = [line for line in proc.stdout.splitlines() if line.startswith("[k0] cmd:")][0]
    assert '"num_speculative_tokens":2' in cmd
    for args, expect in ((["--batches", "1,16"], "max_num_seqs is 8"),
                         (["--gammas", "x"], "--gammas: 'x'"),
                         (["--workload", "swing"], "invalid choice")):
        proc = profile("--prompts-dir", str(fake["prompts"]), *args, "--", "--config", PRESET,
                       env=env)
        assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
        assert proc.stderr.count("error:") == 1
    proc = profile("--prompts-dir", str(fake["prompts"]), "--", "--config", PRESET, "--gamma", "3",
                   env=env)
    assert proc.returncode == 2 and "'--gamma'" in proc.stderr


def run_demo(env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "run.sh"), "demo"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_demo_refuses_fixtures_without_manifest(tmp_path):
    proc = run_demo(clean_env(VSPEC_FIXTURES=str(tmp_path)), timeout=300)
    assert proc.returncode == 1
    assert f"VSPEC_FIXTURES={tmp_path} holds no manifest.json" in proc.stderr
    assert proc.stderr.count("error:") == 1 and proc.stdout == ""


@pytest.mark.slow
@pytest.mark.demo
def test_demo_end_to_end(fixtures_dir, tmp_path):
    """./run.sh demo: none and online on their own servers and the paired server (fixed
    K = 0..4 and online in turns, each serving every wave once) on code and swing; the ratio
    tables, online's ratio to fixed K = 0 in every paired cell; the PNG; results.json's path
    as the last line; no server left."""
    out = tmp_path / "demo"
    proc = run_demo(clean_env(VSPEC_FIXTURES=str(fixtures_dir), VSPEC_DEMO_DIR=str(out)),
                    timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == str(out / "results.json")
    assert any(line.startswith("| workload | conc | best fixed |") for line in lines)
    doc = json.loads((out / "results.json").read_text())
    runs = doc["runs"]
    assert {r["config"] for r in runs} == {"none", "online"}
    assert {(r["workload"], r["concurrency"]) for r in runs} == {
        ("code", 1), ("code", 4), ("code", 16), ("swing", "swing")}
    policies = ["fixed:0", "fixed:1", "fixed:2", "fixed:3", "fixed:4", "online"]
    assert {w["policy"] for w in doc["paired"]} == set(policies)
    # the paired server's waves: every rotation round of a cell is one wave's replays, each
    # policy once (the same texts)
    rounds: dict = {}
    for w in doc["paired"]:
        rounds.setdefault((w["workload"], w["concurrency"], w["round"]), []).append(w["policy"])
    assert rounds and all(sorted(p) == policies for p in rounds.values()), rounds
    # three waves (rotation rounds) in every paired cell and swing phase, where the servers
    # of none and online ran one (--paired-requests-per-slot 3)
    per_cell = collections.Counter((w, c, ph) for (w, c, _), ph in
                                   {(w["workload"], w["concurrency"], w["round"]): w["phase"]
                                    for w in doc["paired"]}.items())
    assert len(per_cell) == 3 + 5 and all(n == 3 for n in per_cell.values()), per_cell
    # online against fixed K = 0 (target-only's steps) in each of the four paired cells, as
    # measured and again at a common machine speed
    assert proc.stdout.count("## At a common machine speed") == 1
    measured_text, common_text = proc.stdout.split("## At a common machine speed")
    online_rows = [line for line in measured_text.splitlines()
                   if line.startswith(("| code |", "| swing |"))
                   and "| online |" in line and line.count("|") == 10]
    assert len(online_rows) == 4, lines
    assert all(re.search(r"\| \d\.\d{3} \[\d\.\d{3}-\d\.\d{3}\] \|$", line)
               for line in online_rows), online_rows
    # end to end (whole waves, prompts included): online against the best fixed K and
    # fixed K = 0 in each of the four cells
    assert "### End to end: whole waves, prompts included" in proc.stdout
    wave_rows = [line for line in measured_text.splitlines()
                 if line.startswith(("| code |", "| swing |"))
                 and "| online |" in line and line.count("|") == 8]
    assert len(wave_rows) == 4 and all(
        re.search(r"\| \d\.\d{3} \[\d\.\d{3}-\d\.\d{3}\] \((3|15)\) \|.*"
                  r"\| \d\.\d{3} \[\d\.\d{3}-\d\.\d{3}\] \|$", line)
        for line in wave_rows), wave_rows
    # one round judges no goal, and the ratio table says so in every cell
    judged = [line for line in lines if line.startswith(("| code |", "| swing |"))
              and line.endswith("| no: none 1 round(s) |")]
    assert len(judged) == 4, lines
    # each window's sums split by decoding batch add up to the window's own
    measured = [w for w in doc["paired"] if w["steps"]]
    assert measured and all(
        sum(r[1] for r in w["by_batch"]) == w["steps"]
        and sum(r[2] for r in w["by_batch"]) == w["tokens"] for w in measured)
    assert "## Paired in-engine comparison" in proc.stdout
    # the steady steps by batch and K (a part of the window's steps, each a time), and the
    # deciding policy's own work: some for every window, more a step for online's decisions
    # than for a fixed K's
    assert all(sum(r[2] for r in w["by_k"]) <= w["steps"] and all(r[3] > 0 for r in w["by_k"])
               for w in measured)
    assert sum(1 for w in measured if w["by_k"]) >= len(measured) // 2
    own = {}
    for w in measured:
        own.setdefault(w["policy"], [0.0, 0])
        own[w["policy"]][0] += w["policy_ms"]
        own[w["policy"]][1] += w["steps"]
    per_step = {p: ms / n for p, (ms, n) in own.items()}
    assert all(v > 0 for v in per_step.values()) and per_step["online"] > per_step["fixed:2"]
    common_rows = [line for line in common_text.splitlines()
                   if line.startswith(("| code |", "| swing |")) and "| online |" in line]
    assert len(common_rows) == 8 and all(re.search(r"\| \d\.\d{3} \[", r) for r in common_rows)
    assert re.search(r"online \d\.\d{3} ms a step", common_text)
    assert (out / "ab.png").read_bytes()[:4] == b"\x89PNG"
    pids = [int(p) for p in re.findall(r"server pid (\d+)", proc.stdout)]
    assert len(pids) == 3 and not any(_alive(p) for p in pids)


def _datasets(fixtures_dir, tmp_path):
    prompts = [json.loads(line)["prompt"]
               for line in (fixtures_dir / "prompts" / "code.jsonl").read_text().splitlines()]
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps([
        {"id": str(i), "conversations": [{"from": "human", "value": p},
                                         {"from": "gpt", "value": "a b c d e f"}]}
        for i, p in enumerate(prompts)]))
    custom = tmp_path / "c.jsonl"
    custom.write_text("".join(json.dumps({"prompt": p, "output_tokens": 6}) + "\n"
                              for p in prompts[:5]))
    return sharegpt, custom


@pytest.mark.slow
def test_the_users_own_traffic_open_loop(fixtures_dir, tmp_path):
    """--dataset with Poisson arrivals (--request-rate): a ShareGPT dataset's cells run on real
    servers and every configuration gets the same requests; vLLM's custom JSONL format is read
    by the same loader (in this process: a third server would only repeat the run)."""
    sharegpt, custom = _datasets(fixtures_dir, tmp_path)
    env = clean_env(HUST_VSPEC_MODEL_DIR=str(fixtures_dir))
    out = tmp_path / "sharegpt"
    configs = "none,fixed:2"
    proc = bench("--dataset", f"sharegpt:{sharegpt}", "--request-rate", "20", "--output-dir",
                 str(out), "--configs", configs, "--concurrency", "2", "--rounds", "1",
                 "--output-len", "8", "--requests-per-slot", "1", "--min-requests", "3",
                 "--warmup-requests", "0", "--", "--config", PRESET, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from vllm_hust_vspec.tools.bench_datasets import load
    from vllm_hust_vspec.tools.bench_results import validate_results

    runs = validate_results(json.loads((out / "results.json").read_text()))
    assert {(r.workload, r.concurrency) for r in runs} == {("dataset", 2)}
    assert len(runs) == len(configs.split(",")) and all(r.output_tok_s > 0 for r in runs)
    none = next(r for r in runs if r.config == "none")  # target-only: no draft, K = 0
    assert none.mean_accept_len == 1.0 and none.mean_k == 0.0
    logs = sorted((out / "logs").glob("*.bench.log"))
    # every configuration sent the dataset's 3 requests, open loop at the rate asked
    assert len(logs) == len(runs)
    texts = [log.read_text() for log in logs]
    for text in texts:
        assert "### dataset@2 concurrency=2 requests=3" in text
        assert "Traffic request rate: 20.0" in text
    # the custom format: every record's prompt, its own output length under the cap
    records = [json.loads(line) for line in custom.read_text().splitlines()]
    got = load(f"custom:{custom}", str(fixtures_dir / "target"), 5, 4, seed=0)
    assert sorted(p.text for p in got) == sorted(r["prompt"] for r in records)
    assert {p.output_tokens for p in got} == {4}  # 6 asked by each record, capped at 4
    got = load(f"custom:{custom}", str(fixtures_dir / "target"), 5, 64, seed=0)
    assert {p.output_tokens for p in got} == {6}


def test_a_bad_dataset_is_one_error_before_any_server(fixtures_dir, tmp_path, monkeypatch, capsys):
    """The CLI once as a subprocess (exit status 2, one error line, no server), then every
    other bad --dataset through the same ``main()`` in this process (each subprocess paid
    ~8 s of imports: 54 s for the seven cases)."""
    sharegpt, custom = _datasets(fixtures_dir, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "no prompt"}\n')
    env = clean_env(HUST_VSPEC_MODEL_DIR=str(fixtures_dir))
    cases = [
        (["--dataset", f"custom:{bad}"], f"{bad}:2: expected an object with a string 'prompt'"),
        (["--dataset", f"sharegpt:{custom}"], f"{custom}: invalid JSON"),
        (["--dataset", f"custom:{tmp_path / 'none.jsonl'}"], "not found"),
        (["--dataset", "random:x"], "expected random:INPUT_LEN,OUTPUT_LEN"),
        (["--dataset", f"custom:{custom}", "--workloads", "code"], "needs the dataset workload"),
        (["--workloads", "dataset"], "the dataset workload needs --dataset"),
        (["--dataset", f"custom:{custom}", "--request-rate", "0"], "expected a number > 0")]
    tail = ["--output-dir", str(tmp_path / "out"), "--configs", "none", "--", "--config", PRESET]
    args, expect = cases[0]
    proc = bench(*args, *tail, env=env)
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    assert proc.stderr.count("error:") == 1 and expect in proc.stderr, (args, proc.stderr)
    assert "server pid" not in proc.stdout

    from vllm_hust_vspec.tools import bench as bench_cli

    for key in [k for k in os.environ if k.startswith("HUST_VSPEC_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HUST_VSPEC_MODEL_DIR", str(fixtures_dir))
    monkeypatch.chdir(REPO)
    for args, expect in cases[1:]:
        try:
            rc = bench_cli.main(["ab", *args, *tail])
        except SystemExit as exc:  # argparse's own errors (a bad --request-rate)
            rc = exc.code
        out, err = capsys.readouterr()
        assert rc == 2, (args, out, err)
        assert err.count("error:") == 1 and expect in err, (args, err)
        assert "server pid" not in out
        assert not (tmp_path / "out").exists()