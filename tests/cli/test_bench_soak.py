"""vllm-hust-vspec-bench soak (issue 16 item 1): the short soak on the real CPU host.

One target-only reference server, then one plugin server per policy (``online``, and the
``sweep`` that forces every K in 0..Kmax with K = 0 stretches of 1, 8 and 64 steps), each
started through the launcher with a KV cache of 10 blocks (1,280 tokens: vLLM preempts);
32 streaming clients for 45 s per policy, mixed prompt lengths, ``max_tokens`` 1-64, stop
strings, 10% hung up mid-stream.  Every completed text must equal the reference, every
cancelled one be a prefix of it; nothing lost or answered twice; preemptions > 0; vLLM's
running and waiting counts back at 0; the engine core's RSS steady after warm-up; a fault
drill at step 500 on each server (the controller raises there) survived with one fallback.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from launcher_util import REPO, clean_env

pytestmark = [pytest.mark.cli, pytest.mark.slow]

PRESET = str(REPO / "configs" / "tiny-cpu-draft.toml")
KMAX = 4  # the preset's gamma


def soak(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.bench", "soak", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_short_soak_loses_no_token(fixtures_dir, tmp_path):
    out = tmp_path / "soak"
    proc = soak("--policies", "online,sweep", "--duration", "45", "--clients", "32",
                "--kv-blocks", "10", "--inject-fault-at", "500", "--output-dir", str(out),
                "--", "--config", PRESET, "--max-num-seqs", "16", "--", "--dtype", "float32",
                env=clean_env(HUST_VSPEC_MODEL_DIR=str(fixtures_dir)))
    doc = json.loads((out / "soak.json").read_text())
    table = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, table
    print(table)
    by_policy = {r["policy"]: r for r in doc["results"]}
    assert set(by_policy) == {"online", "sweep"}
    for policy, r in by_policy.items():
        assert all(r["checks"].values()), (policy, r["checks"])
        assert r["mismatches"] == 0 and r["lost"] == 0 and r["duplicated"] == 0
        assert r["completed"] >= 100 and r["cancelled"] >= 5, (policy, r)
        assert r["characters_compared"] > 10_000
        assert r["preemptions"] > 0
        assert r["running_at_end"] == 0 and r["waiting_at_end"] == 0
        # the fault drill at step 500: one fallback, survived, every token still exact
        assert r["server_alive_at_end"] and r["faults_injected"] == r["fallbacks"] == 1
    sweep = {int(k): n for k, n in by_policy["sweep"]["k_hist"].items()}
    assert set(sweep) == set(range(KMAX + 1))  # every K was forced ...
    assert sweep[0] == max(sweep.values())  # ... the K = 0 stretches dominate ...
    online = {int(k): n for k, n in by_policy["online"]["k_hist"].items()}
    assert sum(n for k, n in sweep.items() if k > 0) >= 60  # ... and K > 0 ran a while
    assert sum(online.values()) > 500


def test_bad_soak_input_is_one_error_before_any_server(tmp_path):
    env = clean_env(HUST_VSPEC_MODEL_DIR=str(tmp_path))
    for args, needle in ((["--policies", "online,bogus"], "--policies 'online,bogus'"),
                         (["--cancel-fraction", "1.5"], "--cancel-fraction 1.5"),
                         (["--prompts-dir", str(tmp_path)], f"--prompts-dir {tmp_path}")):
        proc = soak(*args, "--", "--config", PRESET, env=env, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
