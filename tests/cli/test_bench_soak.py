"""vllm-hust-vspec-bench soak (issue 16 item 1): the short soak on the real CPU host.

One target-only reference server, then one plugin server per policy (``online``, and the
``sweep`` that forces every K in 0..Kmax with K = 0 stretches of 1, 8 and 64 steps), each
started through the launcher (the preset's draft over the small target) with a KV cache of
36 blocks of 32 tokens (1,152 tokens: vLLM preempts, 22-26 times a policy here; with 10
blocks of 128 a request rarely crosses a block and a run preempted 0-3 times);
32 streaming clients for 500 requests per policy, mixed prompt lengths, ``max_tokens`` 1-64, stop
strings, 10% hung up mid-stream.  Every completed text must equal the reference, every
cancelled one be a prefix of it; nothing lost or answered twice; preemptions > 0 in each policy; vLLM's
running and waiting counts back at 0; the engine core's RSS steady after warm-up; a fault
drill at step 200 on each server (the controller raises there) survived with one fallback.
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
    # 500 requests a policy (not a duration: a 2-core AVX2 machine serves 2.5x slower than a
    # bf16 one, and the drill's step and the preemptions follow the traffic, not the clock).
    # The start-up cost probe (~20 s a plugin server) is off: it is not what a soak checks
    # (test_cost_probe.py, test_plugin_serve.py and the demo run it).  The small target serves
    # the same traffic 5x as fast as the preset's target-large (60 -> 11 s a policy here);
    # the preemptions follow the KV blocks, not the model
    proc = soak("--policies", "online,sweep", "--duration", "240", "--max-requests", "500",
                "--clients", "32", "--kv-blocks", "36", "--inject-fault-at", "200",
                "--output-dir", str(out),
                "--", "--config", PRESET, "--target-model", "target", "--max-num-seqs", "16",
                "--no-adaptive-cost-probe",
                "--", "--block-size", "32",
                env=clean_env(HUST_VSPEC_MODEL_DIR=str(fixtures_dir)))
    doc = json.loads((out / "soak.json").read_text())
    table = proc.stdout[-3000:] + proc.stderr[-3000:]
    print(table)
    by_policy = {r["policy"]: r for r in doc["results"]}
    assert set(by_policy) == {"online", "sweep"}
    assert all(r["preemptions"] > 0 for r in by_policy.values()), table
    failed = {(p, c) for p, r in by_policy.items() for c, ok in r["checks"].items() if not ok}
    assert not failed and proc.returncode == 0, (failed, table)
    for policy, r in by_policy.items():
        assert r["mismatches"] == 0 and r["lost"] == 0 and r["duplicated"] == 0
        assert r["requests"] == 500 and r["completed"] >= 400 and r["cancelled"] >= 20, (policy, r)
        assert r["characters_compared"] > 5_000
        assert r["running_at_end"] == 0 and r["waiting_at_end"] == 0
        # the fault drill at step 200: one fallback, survived, every token still exact
        assert r["server_alive_at_end"] and r["faults_injected"] == r["fallbacks"] == 1
    sweep = {int(k): n for k, n in by_policy["sweep"]["k_hist"].items()}
    assert set(sweep) == set(range(KMAX + 1))  # every K was forced ...
    assert sweep[0] == max(sweep.values())  # ... the K = 0 stretches dominate ...
    online = {int(k): n for k, n in by_policy["online"]["k_hist"].items()}
    # ... and K > 0 ran a while (two of the sweep's 97-step cycles before the drill: 32)
    assert sum(n for k, n in sweep.items() if k > 0) >= 24
    # online decided every step up to the drill at step 200 (its fallback is checked above;
    # its step count follows its acceptance, not the clock: with the drill at 300, 309 steps
    # left it nine to spare) and drafted on enough of them for its own choices to have run
    # under preemption and hang-ups.  How much it drafts is the controller's call on the
    # machine's costs, not a soak property (the sweep above forces every K): 293 of its first
    # 300 decisions at K > 0 on the developers' machine, 140 of 200 on CI's; since the cost
    # model's batch factor (2026-12-05) online held K = 0 on 895 of 944 decisions in a suite
    # run (whether the small target runs faster there without the drafter is not measured;
    # on the large pair at batch 8 it does, docs/benchmarks.md) and drafted on 49, its
    # warm-up, measurements and probes: at least 20 draft, under preemptions and hang-ups
    assert sum(online.values()) > 200 and sum(n for k, n in online.items() if k > 0) >= 20


def test_bad_soak_input_is_one_error_before_any_server(tmp_path):
    env = clean_env(HUST_VSPEC_MODEL_DIR=str(tmp_path))
    for args, needle in ((["--policies", "online,bogus"], "--policies 'online,bogus'"),
                         (["--cancel-fraction", "1.5"], "--cancel-fraction 1.5"),
                         (["--prompts-dir", str(tmp_path)], f"--prompts-dir {tmp_path}")):
        proc = soak(*args, "--", "--config", PRESET, env=env, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
