"""Real starts on the CPU host: ./run.sh tiny-cpu-draft serves with the plugin active,
answers /v1/completions and /v1/chat/completions, carries the plugin flags into the
decision trace header, shows the controller on its own /metrics (checked against the
decision trace), is benchmarked by vllm-hust-vspec-bench serve, and stops cleanly;
a plain server command with HUST_VSPEC_ENABLED=1 works too."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import requests

pytestmark = [pytest.mark.host, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[2]
ACTIVE = "vllm-hust-vspec active:"
START_TIMEOUT = 300


def _env(fixtures: pathlib.Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HUST_VSPEC_", "HUST_SPECSLO_", "HUST_SPECASCEND_"))
           and k not in ("VSPEC_CONFIG", "SPECSLO_CONFIG", "SPECASCEND_CONFIG", "VLLM_PLUGINS")}
    env["VSPEC_FIXTURES"] = str(fixtures)
    env.update(extra)
    return env


class Server:
    def __init__(self, argv: list[str], env: dict[str, str], log: pathlib.Path, port: int):
        self.log_path = log
        self.port = port
        self._log = open(log, "w")
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited rc={self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise AssertionError(f"server not ready in {START_TIMEOUT}s:\n{self.log()[-4000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# Plugin options set away from their defaults: the trace header must show each of them.
PLUGIN_FLAGS = ["--gamma", "3", "--adaptive-policy", "online", "--adaptive-hysteresis", "0.07",
                "--adaptive-min-gamma", "1", "--adaptive-online-window", "64",
                "--adaptive-control-interval", "2", "--adaptive-max-gamma-step", "2",
                "--adaptive-ewma-weight", "0.1", "--adaptive-online-exploration", "0.05",
                "--adaptive-online-warmup-samples", "3", "--adaptive-log-interval", "5",
                # the start-up cost probe (~20 s) is off: test_cost_probe.py and
                # test_plugin_serve.py run it; these check the launcher, flags and metrics
                "--no-adaptive-cost-probe"]


# vSpec 0.14's server flags (issue 19 item 6), each passed on to vLLM as its own argument or
# speculative-config key: the server must start with them and vLLM must have taken each
# (--disable-log-stats, which also ends /metrics, is checked against vLLM's parser in
# test_vllm_accepts_server_args.py)
SERVER_FLAGS = ["--block-size", "32",
                "--language-model-only", "--eagle-disable-draft-torch-compile",
                "--draft-tensor-parallel-size", "1"]


@pytest.fixture(scope="module")
def run_sh_server(fixtures_dir, tmp_path_factory):
    from conftest import free_port
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    trace = tmp / "decisions.jsonl"
    argv = [str(REPO / "run.sh"), "tiny-cpu-draft", "--port", str(port), *PLUGIN_FLAGS,
            *SERVER_FLAGS, "--adaptive-trace-file", str(trace)]
    server = Server(argv, _env(fixtures_dir), tmp / "server.log", port)
    try:
        server.wait_ready()
        yield server, trace, tmp
    finally:
        rc = server.stop()
        server.rc = rc


def test_completions(run_sh_server):
    server, _, _ = run_sh_server
    r = requests.post(server.url + "/v1/completions", timeout=120, json={
        "model": "tiny-cpu-draft", "prompt": "def read_config(path):\n", "max_tokens": 16,
        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 16


def test_chat_completions(run_sh_server):
    server, _, _ = run_sh_server
    r = requests.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "tiny-cpu-draft", "messages": [{"role": "user", "content": "import os"}],
        "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_vspec_server_flags_reach_vllm(run_sh_server):
    server, _, _ = run_sh_server
    log = server.log()
    args = next(x for x in log.splitlines() if "non-default args:" in x)
    for pair in ("'block_size': 32", "'language_model_only': True"):
        assert pair in args, args
    spec = args[args.index("'speculative_config'"):]
    assert "'enforce_eager': True" in spec and "'draft_tensor_parallel_size': 1" in spec, spec


def test_plugin_active_and_flags_in_trace_header(run_sh_server):
    server, trace, _ = run_sh_server
    log = server.log()
    assert ACTIVE in log, log[-3000:]
    line = next(x for x in log.splitlines() if ACTIVE in x)
    assert "kmax=3" in line
    deadline = time.monotonic() + 30
    while not (trace.is_file() and trace.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.5)
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["trace"] == "vspec-decisions" and header["version"] == 1
    s = header["settings"]
    assert s["adaptive_hysteresis"] == pytest.approx(0.07)
    assert s["adaptive_min_gamma"] == 1
    assert s["adaptive_online_window"] == 64
    assert s["adaptive_control_interval"] == 2
    assert s["adaptive_max_gamma_step"] == 2
    assert s["adaptive_ewma_weight"] == pytest.approx(0.1)
    assert s["adaptive_online_exploration"] == pytest.approx(0.05)
    assert s["adaptive_online_warmup_samples"] == 3
    assert s["adaptive_log_interval"] == pytest.approx(5.0)
    assert s["adaptive_trace_file"] == str(trace)
    assert header["host"]["kmax"] == 3


def test_trace_header_equals_what_the_launcher_wrote(run_sh_server, fixtures_dir):
    """Every plugin option: dry-run env -> plugin reader == the running engine's header."""
    from vllm_hust_vspec import settings
    server, trace, _ = run_sh_server
    proc = subprocess.run(
        [str(REPO / "run.sh"), "tiny-cpu-draft", "--port", str(server.port), *PLUGIN_FLAGS,
         "--adaptive-trace-file", str(trace), "--dry-run", "--json"],
        cwd=REPO, env=_env(fixtures_dir), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    expected = settings.from_env(json.loads(proc.stdout)["env"]).as_dict("plugin")
    header = json.loads(trace.read_text().splitlines()[0])["settings"]
    for name, value in expected.items():
        assert header[name] == (pytest.approx(value) if isinstance(value, float) else value), name


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    """The plugin's samples on the server's /metrics: (name, labels without model_name and
    engine) -> value."""
    from prometheus_client.parser import text_string_to_metric_families
    text = requests.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm_hust_vspec:"):
                labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                      if k not in ("model_name", "engine")))
                out[(sample.name, labels)] = sample.value
    return out


def test_a_strict_server_says_so_on_metrics(run_sh_server):
    """Verification is strict unless a lossy rule is set: the gauge says 0 (1 when lossy,
    tests/unit/test_lossy_rules.py and docs/plugin.md)."""
    server, _, _ = run_sh_server
    assert _scrape(server.url)[("vllm_hust_vspec:lossy_acceptance", ())] == 0.0


def _buckets(values: list[int], kmax: int) -> dict[str, int]:
    return {f"{float(b)}": sum(1 for v in values if v <= b) for b in range(kmax + 1)}


def _hist(metrics: dict, name: str, kmax: int) -> dict[str, float]:
    return {f"{float(b)}": metrics[(name + "_bucket", (("le", f"{float(b)}"),))]
            for b in range(kmax + 1)}


def test_metrics_on_the_servers_own_endpoint_match_the_trace(run_sh_server, fixtures_dir):
    """The controller's state on the server's own /metrics (no second HTTP server): live
    while requests run, and at rest every value equals what the decision trace says."""
    from plugin_helpers import load_prompts, read_decisions, read_drafter_records

    from vllm_hust_vspec.runtime.metric_names import METRICS
    from vllm_hust_vspec.runtime.metrics_feed import decision_kind, goodput_estimate
    server, trace, _ = run_sh_server
    kmax = 3
    prompts = load_prompts(fixtures_dir, "code")[:8] + load_prompts(fixtures_dir, "prose")[:8]
    tokens = 96  # long enough that the batch outlives several scrapes (float32: ~2 s here)

    def one(prompt: str) -> int:
        r = requests.post(server.url + "/v1/completions", timeout=300, json={
            "model": "tiny-cpu-draft", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True})
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    live = []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        done = [pool.submit(one, p) for p in prompts]
        while not all(f.done() for f in done):  # scraped while the batch runs
            live.append(_scrape(server.url).get(("vllm_hust_vspec:k_chosen_count", ()), 0.0))
            time.sleep(0.05)
        assert sum(f.result() for f in done) == tokens * len(prompts)
    assert len(set(live)) >= 2, live  # the count rose between two scrapes during the run

    _, decisions, results = read_decisions(trace)
    deadline = time.monotonic() + 20  # the last steps' stats reach the front end
    while True:
        m = _scrape(server.url)
        if m.get(("vllm_hust_vspec:k_chosen_count", ())) == len(decisions):
            break
        assert time.monotonic() < deadline, (m.get(("vllm_hust_vspec:k_chosen_count", ())),
                                             len(decisions))
        time.sleep(0.5)
        _, decisions, results = read_decisions(trace)
    exposed = {name for name, _ in m}
    for metric in METRICS:  # every declared metric is on the endpoint
        assert any(n.startswith(metric.exposed) for n in exposed), metric.exposed

    ks = [d["k"] for d in decisions]
    per_request = [v for d in decisions
                   for v in (d["k_i"].values() if d["k_i"] else [d["k"]] * d["batch"])]
    spreads = [max(d["k_i"].values()) - min(d["k_i"].values()) if d["k_i"] else 0
               for d in decisions]
    assert _hist(m, "vllm_hust_vspec:k_chosen", kmax) == _buckets(ks, kmax)
    assert m[("vllm_hust_vspec:k_chosen_sum", ())] == sum(ks)
    assert _hist(m, "vllm_hust_vspec:request_k", kmax) == _buckets(per_request, kmax)
    assert _hist(m, "vllm_hust_vspec:request_k_spread", kmax) == _buckets(spreads, kmax)
    assert len(set(per_request)) >= 2  # the run did vary K
    kinds = dict.fromkeys(("hold", "switch", "probe", "fallback"), 0)
    held = None
    for d in decisions:
        kind = decision_kind(d["reason"], d["k"], held)
        kinds[kind] += 1
        held = d["k"] if kind != "probe" else held
    for kind, n in kinds.items():
        assert m[("vllm_hust_vspec:decisions_total", (("reason", kind),))] == n, kind
    assert kinds["probe"] > 0 and kinds["hold"] > 0
    assert m[("vllm_hust_vspec:k0_steps_total", ())] == ks.count(0)
    drafter = read_drafter_records(trace)
    assert m[("vllm_hust_vspec:drafter_passes_skipped_total", ())] == sum(
        r["skipped"] for r in drafter)
    assert m[("vllm_hust_vspec:drafter_tokens_caught_up_total", ())] == sum(
        r["caught_up"] for r in drafter)
    assert m[("vllm_hust_vspec:runtime_fallbacks_total", ())] == 0
    last = decisions[-1]
    for pos, a in enumerate(last["est_accept"]):
        assert m[("vllm_hust_vspec:acceptance_estimate", (("position", str(pos)),))] == \
            pytest.approx(a)
    assert m[("vllm_hust_vspec:batch_size", ())] == last["batch"]
    est = [d["est_cost_ms"] for d in decisions if d["est_cost_ms"] is not None]
    assert m[("vllm_hust_vspec:step_cost_estimated_seconds", ())] == pytest.approx(est[-1] / 1e3)
    timed = [r["ms"] for r in results if r["ms"] is not None]
    assert m[("vllm_hust_vspec:step_cost_measured_seconds", ())] == pytest.approx(timed[-1] / 1e3)
    est_by_step = {d["step"]: d["est_cost_ms"] for d in decisions}
    pairs = [(est_by_step[r["step"]], r["ms"]) for r in results
             if r["ms"] is not None and est_by_step.get(r["step"]) is not None]
    assert m[("vllm_hust_vspec:timed_steps_total", ())] == len(pairs) > 0
    assert m[("vllm_hust_vspec:timed_step_cost_estimated_seconds_total", ())] == pytest.approx(
        sum(e for e, _ in pairs) / 1e3)
    assert m[("vllm_hust_vspec:timed_step_cost_measured_seconds_total", ())] == pytest.approx(
        sum(t for _, t in pairs) / 1e3)
    goodputs = [g for g in map(goodput_estimate, decisions) if g is not None]
    assert m[("vllm_hust_vspec:goodput_estimate_tokens_per_second", ())] == pytest.approx(
        goodputs[-1])
    info = [labels for (name, labels), v in m.items()
            if name == "vllm_hust_vspec:cost_table_info" and v == 1]
    assert info == [(("cost", "online"), ("cost_model", "roofline"), ("policy", "online"),
                     ("source", "measured while serving"))]


def test_parameters_the_host_refuses_with_speculation_fail_per_request(run_sh_server):
    """min_p and logit_bias: vLLM 0.32 refuses them with speculative decoding; the plugin
    server answers that request with one 400 naming the parameter, and the next request
    is served."""
    server, _, _ = run_sh_server
    for extra, name in (({"min_p": 0.1, "temperature": 0.8}, "min_p"),
                        ({"logit_bias": {"5": 5.0}}, "logit_bias")):
        r = requests.post(server.url + "/v1/completions", timeout=120, json={
            "model": "tiny-cpu-draft", "prompt": "def f(x):\n", "max_tokens": 8, **extra})
        assert r.status_code == 400, r.text
        assert name in r.json()["error"]["message"], r.text
        ok = requests.post(server.url + "/v1/completions", timeout=120, json={
            "model": "tiny-cpu-draft", "prompt": "def f(x):\n", "max_tokens": 8,
            "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8


def test_bench_serve_against_the_server(run_sh_server, fixtures_dir):
    server, _, tmp = run_sh_server
    result_dir = tmp / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_hust_vspec.tools.bench", "serve",
         "--dataset-path", str(fixtures_dir / "prompts" / "code.jsonl"), "--num-prompts", "2",
         "--output-len", "8", "--base-url", server.url, "--backend", "openai",
         "--result-dir", str(result_dir), "--label", "tiny"],
        cwd=REPO, env=_env(fixtures_dir), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((result_dir / "tiny.json").read_text())
    assert result["completed"] == 2
    assert result["total_output_tokens"] > 0


def test_stops_cleanly(run_sh_server):
    server, _, _ = run_sh_server
    rc = server.stop()
    assert rc == 0, server.log()[-3000:]
    deadline = time.monotonic() + 20  # the engine core exits just after the API server
    while _group_alive(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(server.proc.pid), "server processes left behind"
