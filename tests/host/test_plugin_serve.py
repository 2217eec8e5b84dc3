"""A real multiprocess server with HUST_VSPEC_ENABLED=1, no launcher: it adapts in one run.

``python -m vllm.entrypoints.openai.api_server ... --speculative-config '{...}'`` with only
the env set: the front end turns dynamic-SD mode on, the engine-core process (a separate
process) applies the patches, logs the ``vllm-hust-vspec active:`` line and writes the
decision trace.  With the ``online`` policy, on ``prompts/hard.jsonl`` K falls (the draft is
rarely accepted) and on ``prompts/code.jsonl`` afterwards it comes back.  The large target
is served: with the small one, verifying 5 tokens costs the same as 1 on this CPU, so
K = Kmax is right even on hard prompts and there is nothing to adapt to.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import requests

from plugin_helpers import load_prompts, read_decisions

pytestmark = [pytest.mark.host, pytest.mark.slow]

KMAX = 4


def _wait_ready(proc, url: str, log_path, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)
    raise AssertionError(f"server not ready in {timeout} s:\n{log_path.read_text()[-4000:]}")


def _phase(url: str, model: str, prompts: list[str], max_tokens: int, rounds: int) -> int:
    def one(p: str) -> int:
        r = requests.post(url + "/v1/completions", timeout=300, json={
            "model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True})
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return sum(pool.map(one, prompts * rounds))


def _mean_k(decisions: list[dict]) -> float:
    return sum(d["k"] for d in decisions) / len(decisions)


@pytest.fixture(scope="module")
def server_run(fixtures_dir, tmp_path_factory):
    """One server run: hard prompts, then code prompts; returns what the checks need."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tmp_path = tmp_path_factory.mktemp("serve")
    trace = tmp_path / "decisions.jsonl"
    log_path = tmp_path / "server.log"
    # the large target: at batch 8 verifying extra tokens costs real time, so on hard prompts
    # (draft rarely accepted) a small K is best, while on code prompts a large K is
    model = str(fixtures_dir / "target-large")
    spec = {"method": "draft_model", "model": str(fixtures_dir / "draft"),
            "num_speculative_tokens": KMAX}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUST_VSPEC_")}
    env.update(
        HUST_VSPEC_ENABLED="1", HUST_VSPEC_ADAPTIVE_POLICY="online",
        HUST_VSPEC_ADAPTIVE_TRACE_FILE=str(trace), HUST_VSPEC_ADAPTIVE_LOG_INTERVAL="2",
        VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="1",
    )
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32",
           "--max-model-len", "512", "--max-num-seqs", "8", "--enforce-eager",
           "--speculative-config", json.dumps(spec)]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, url, log_path)
        t_hard = time.time()
        assert _phase(url, model, load_prompts(fixtures_dir, "hard"), 24, 3) > 0
        t_code = time.time()
        assert _phase(url, model, load_prompts(fixtures_dir, "code"), 64, 2) > 0
        time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"text": log_path.read_text(), "trace": trace, "pid": proc.pid,
            "t_hard": t_hard, "t_code": t_code}


def test_server_plugin_active_in_engine_core(server_run):
    text = server_run["text"]
    active = re.findall(r"vllm-hust-vspec active: (.*)", text)
    engine_lines = [a for a in active if "process=engine" in a]
    assert engine_lines, text[-4000:]
    assert "policy=online" in engine_lines[0] and f"kmax={KMAX}" in engine_lines[0]
    assert "scheduler-k" in engine_lines[0] and "draft-trim" in engine_lines[0]
    assert any("process=frontend" in a and "dynamic-sd-config" in a for a in active)
    assert "vllm-hust-vspec stats:" in text  # the periodic log line
    headers, decisions, results = read_decisions(server_run["trace"])
    assert len(headers) == 1
    assert headers[0]["host"]["pid"] != server_run["pid"]  # written by the engine-core process
    assert decisions and {d["policy"] for d in decisions} == {"online"}
    assert results and sum(r["drafted"] for r in results) > 0


def test_server_adapts_in_one_run(server_run):
    _, decisions, _ = read_decisions(server_run["trace"])
    t_hard, t_code = server_run["t_hard"], server_run["t_code"]
    hard = [d for d in decisions if t_hard <= d["t"] < t_code]
    code = [d for d in decisions if d["t"] >= t_code]
    assert len(hard) > 40 and len(code) > 40
    hard_late = hard[len(hard) // 2:]
    code_late = code[len(code) // 2:]
    print(f"mean K: hard first half {_mean_k(hard[:len(hard) // 2]):.2f}, "
          f"hard late {_mean_k(hard_late):.2f}, code late {_mean_k(code_late):.2f}; "
          f"K=0 share in hard late {sum(d['k'] == 0 for d in hard_late) / len(hard_late):.2f}")
    # K falls on hard prompts (it starts at Kmax) ...
    assert _mean_k(hard_late) < 2.0
    # ... and comes back on code prompts
    assert _mean_k(code_late) >= _mean_k(hard_late) + 1.0
