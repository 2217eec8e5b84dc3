"""Every launcher flag of issue 5 has an observable effect in the dry-run argv/env."""

from __future__ import annotations

import json

import pytest
from launcher_util import clean_env, compilation_config, dry_json, flag_value, spec_config

pytestmark = pytest.mark.cli

BASE = ("--target-platform", "cpu", "--target-model", "/m/target", "--draft-model", "/m/draft")


def plan(*args: str, base=BASE, env=None) -> dict:
    return dry_json(*base, *args, env=env)


def test_contract_shape_and_defaults():
    p = plan()
    assert set(p) == {"executable", "argv", "env"}
    assert p["argv"][:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                             "/m/target"]
    assert all(isinstance(v, str) for v in p["env"].values())
    env = p["env"]
    assert env["HUST_VSPEC_ENABLED"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    # every plugin option with a default travels as HUST_VSPEC_<NAME>
    assert env["HUST_VSPEC_ADAPTIVE_SPECULATION"] == "1"
    assert env["HUST_VSPEC_ADAPTIVE_POLICY"] == "online"
    # host flags pass only when set: none here
    for flag in ("--max-num-seqs", "--dtype", "--port", "--host", "--enable-prefix-caching",
                 "--no-enable-prefix-caching", "--async-scheduling", "--enforce-eager",
                 "--compilation-config"):
        assert flag not in p["argv"]
    assert spec_config(p) == {"method": "draft_model", "model": "/m/draft",
                              "num_speculative_tokens": 4}


def test_kvcache_space_kept_when_set():
    env = clean_env(VLLM_CPU_KVCACHE_SPACE="3")
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan(env=env)["env"]


def test_cuda_uses_vllm_serve():
    p = plan("--target-platform", "cuda")
    assert p["argv"][:3] == ["vllm", "serve", "/m/target"]
    assert "VLLM_CPU_KVCACHE_SPACE" not in p["env"]


@pytest.mark.parametrize("flags, vllm_args", [
    (["--served-model-name", "svc"], ["--served-model-name", "svc"]),
    (["--max-num-seqs", "7"], ["--max-num-seqs", "7"]),
    (["--max-num-batched-tokens", "4096"], ["--max-num-batched-tokens", "4096"]),
    (["--max-model-len", "512"], ["--max-model-len", "512"]),
    (["--dtype", "float32"], ["--dtype", "float32"]),
    (["--generation-config", "auto"], ["--generation-config", "auto"]),
    (["--generation-config", "vllm"], ["--generation-config", "vllm"]),
    (["--async-scheduling"], ["--async-scheduling"]),
    (["--no-async-scheduling"], ["--no-async-scheduling"]),
    (["--prefix-caching"], ["--enable-prefix-caching"]),
    (["--no-prefix-caching"], ["--no-enable-prefix-caching"]),
    (["--chunked-prefill"], ["--enable-chunked-prefill"]),
    (["--no-chunked-prefill"], ["--no-enable-chunked-prefill"]),
    (["--host", "0.0.0.0"], ["--host", "0.0.0.0"]),
    (["--port", "8123"], ["--port", "8123"]),
    (["--gpu-memory-utilization", "0.7"], ["--gpu-memory-utilization", "0.7"]),
    (["--tensor-parallel-size", "2"], ["--tensor-parallel-size", "2"]),
    (["--graph-mode", "eager"], ["--enforce-eager"]),
])
def test_host_flags_pass_through(flags, vllm_args):
    argv = plan(*flags)["argv"]
    n = len(vllm_args)
    assert any(argv[i:i + n] == vllm_args for i in range(len(argv))), argv


@pytest.mark.parametrize("mode, cuda_mode", [
    ("piecewise", "PIECEWISE"), ("full-decode-only", "FULL_DECODE_ONLY"),
    ("full-and-piecewise", "FULL_AND_PIECEWISE"), ("full", "FULL"),
])
def test_graph_mode(mode, cuda_mode):
    p = plan("--graph-mode", mode, "--target-platform", "cuda", "--max-num-seqs", "4")
    cc = compilation_config(p)
    assert cc["cudagraph_mode"] == cuda_mode
    assert cc["cudagraph_capture_sizes"] == sorted({b * w for b in (1, 2, 4)
                                                    for w in range(1, 6)})
    assert "--enforce-eager" not in p["argv"]


def test_capture_policy_and_gamma_on_cuda():
    p = plan("--target-platform", "cuda", "--max-num-seqs", "8", "--gamma", "2",
             "--capture-policy", "steady", "--adaptive-min-gamma", "1")
    assert compilation_config(p)["cudagraph_capture_sizes"] == [2, 3, 16, 24]
    p = plan("--target-platform", "cuda", "--max-num-seqs", "8", "--gamma", "2",
             "--capture-policy", "power2", "--no-adaptive-speculation")
    assert compilation_config(p)["cudagraph_capture_sizes"] == [3, 6, 12, 24]


def test_capture_sizes_capped_by_token_budget():
    p = plan("--target-platform", "cuda", "--max-num-seqs", "8", "--gamma", "2",
             "--capture-policy", "steady", "--max-num-batched-tokens", "16")
    assert compilation_config(p)["cudagraph_capture_sizes"] == [1, 2, 3, 8, 16]


def test_cpu_has_no_capture_sizes():
    p = plan("--graph-mode", "full", "--max-num-seqs", "8")
    assert compilation_config(p) == {"cudagraph_mode": "FULL"}


def test_gamma_is_the_only_kmax():
    p = plan("--gamma", "3")
    assert spec_config(p)["num_speculative_tokens"] == 3
    assert not any("GAMMA" in k and k.endswith("MAX") for k in p["env"])
    assert "HUST_VSPEC_GAMMA" not in p["env"] and "HUST_VSPEC_KMAX" not in p["env"]


@pytest.mark.parametrize("method, expected", [
    ("draft", "draft_model"), ("draft_model", "draft_model"), ("eagle", "eagle"),
    ("eagle3", "eagle3"),
])
def test_method_with_draft_model(method, expected):
    assert spec_config(plan("--method", method))["method"] == expected


@pytest.mark.parametrize("method", ["mtp", "qwen3_5_mtp", "mimo_mtp"])
def test_mtp_aliases(method):
    p = plan("--method", method, base=("--target-platform", "cpu", "--target-model", "/m/t"))
    assert spec_config(p) == {"method": "mtp", "num_speculative_tokens": 6}


def test_ngram_prompt_lookup():
    p = plan("--method", "ngram", "--prompt-lookup-min", "2", "--prompt-lookup-max", "3",
             base=("--target-platform", "cpu", "--target-model", "/m/t"))
    assert spec_config(p) == {"method": "ngram", "num_speculative_tokens": 4,
                              "prompt_lookup_min": 2, "prompt_lookup_max": 3}


def test_method_none_means_no_speculation():
    p = plan("--method", "none", base=("--target-platform", "cpu", "--target-model", "/m/t"))
    assert spec_config(p) is None
    assert p["env"]["HUST_VSPEC_ENABLED"] == "0"
    assert not any(k.startswith("HUST_VSPEC_ADAPTIVE") for k in p["env"])


def test_target_and_draft_model_flags_resolve_bare_names():
    p = plan(base=("--target-platform", "cpu", "--target-model", "tgt", "--draft-model", "drf"))
    assert flag_value(p, "--model") == "/models/tgt"
    assert spec_config(p)["model"] == "/models/drf"
    p = plan("--model-dir", "/elsewhere",
             base=("--target-platform", "cpu", "--target-model", "tgt", "--draft-model", "/abs/d"))
    assert flag_value(p, "--model") == "/elsewhere/tgt"
    assert spec_config(p)["model"] == "/abs/d"


def test_model_registry(tmp_path):
    reg = tmp_path / "models.json"
    reg.write_text(json.dumps({"tgt": "/reg/target", "drf": "rel/draft"}))
    p = plan("--model-registry", str(reg),
             base=("--target-platform", "cpu", "--target-model", "tgt", "--draft-model", "drf"))
    assert flag_value(p, "--model") == "/reg/target"
    assert spec_config(p)["model"] == str(tmp_path / "rel/draft")
    toml_reg = tmp_path / "models.toml"
    toml_reg.write_text('tgt = "/toml/target"\n')
    env = clean_env(HUST_VSPEC_MODEL_REGISTRY=str(toml_reg))
    p = plan(base=("--target-platform", "cpu", "--target-model", "tgt", "--draft-model", "/d"),
             env=env)
    assert flag_value(p, "--model") == "/toml/target"


def test_model_env_vars():
    env = clean_env(HUST_VSPEC_TARGET_MODEL="/env/t", HUST_VSPEC_DRAFT_MODEL="/env/d",
                    HUST_VSPEC_EAGLE_MODEL="/env/e")
    p = dry_json("--target-platform", "cpu", env=env)
    assert flag_value(p, "--model") == "/env/t" and spec_config(p)["model"] == "/env/d"
    p = dry_json("--target-platform", "cpu", "--method", "eagle", env=env)
    assert spec_config(p)["model"] == "/env/e"
    # an explicit flag wins over the env
    p = dry_json("--target-platform", "cpu", "--target-model", "/flag/t", env=env)
    assert flag_value(p, "--model") == "/flag/t"


@pytest.mark.parametrize("platform, var", [("cuda", "CUDA_VISIBLE_DEVICES"),
                                           ("npu", "ASCEND_RT_VISIBLE_DEVICES")])
def test_device(platform, var):
    p = plan("--target-platform", platform, "--device", "0,1")
    assert p["env"][var] == "0,1"


def test_npu_uses_vllm_serve_with_capture_sizes():
    p = plan("--target-platform", "npu", "--graph-mode", "full", "--max-num-seqs", "2",
             "--gamma", "1")
    assert p["argv"][:2] == ["vllm", "serve"]
    assert compilation_config(p)["cudagraph_capture_sizes"] == [1, 2, 4]


@pytest.mark.parametrize("flags, env_name, value", [
    (["--adaptive-speculation"], "HUST_VSPEC_ADAPTIVE_SPECULATION", "1"),
    (["--no-adaptive-speculation"], "HUST_VSPEC_ADAPTIVE_SPECULATION", "0"),
    (["--adaptive-policy", "fixed"], "HUST_VSPEC_ADAPTIVE_POLICY", "fixed"),
    (["--adaptive-profile", "p.json"], "HUST_VSPEC_ADAPTIVE_PROFILE", "p.json"),
    (["--adaptive-min-gamma", "1"], "HUST_VSPEC_ADAPTIVE_MIN_GAMMA", "1"),
    (["--adaptive-control-interval", "3"], "HUST_VSPEC_ADAPTIVE_CONTROL_INTERVAL", "3"),
    (["--adaptive-hysteresis", "0.07"], "HUST_VSPEC_ADAPTIVE_HYSTERESIS", "0.07"),
    (["--adaptive-max-gamma-step", "2"], "HUST_VSPEC_ADAPTIVE_MAX_GAMMA_STEP", "2"),
    (["--adaptive-ewma-weight", "0.3"], "HUST_VSPEC_ADAPTIVE_EWMA_WEIGHT", "0.3"),
    (["--adaptive-online-exploration", "0.1"], "HUST_VSPEC_ADAPTIVE_ONLINE_EXPLORATION", "0.1"),
    (["--adaptive-online-warmup-samples", "5"], "HUST_VSPEC_ADAPTIVE_ONLINE_WARMUP_SAMPLES",
     "5"),
    (["--adaptive-online-window", "64"], "HUST_VSPEC_ADAPTIVE_ONLINE_WINDOW", "64"),
    (["--adaptive-trace"], "HUST_VSPEC_ADAPTIVE_TRACE", "1"),
    (["--adaptive-trace-file", "t.jsonl"], "HUST_VSPEC_ADAPTIVE_TRACE_FILE", "t.jsonl"),
    (["--adaptive-record-trace", "r.jsonl"], "HUST_VSPEC_ADAPTIVE_RECORD_TRACE", "r.jsonl"),
    (["--adaptive-stop", "survival"], "HUST_VSPEC_ADAPTIVE_STOP", "survival"),
    (["--adaptive-stop-threshold", "0.25"], "HUST_VSPEC_ADAPTIVE_STOP_THRESHOLD", "0.25"),
])
def test_controller_flags_travel_as_env(flags, env_name, value):
    assert plan(*flags)["env"][env_name] == value


def test_adaptive_profile_implies_profile_policy():
    assert plan("--adaptive-profile", "p.json")["env"]["HUST_VSPEC_ADAPTIVE_POLICY"] == "profile"


def test_precedence_default_protocol_toml_cli(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[serve]\nprotocol = "arc-easy"\nport = 9001\nmax_num_batched_tokens = 2048\n'
                   'adaptive_hysteresis = 0.04\n[env]\nMY_VAR = "x"\nNUM = 3\n')
    p = dry_json("--config", str(cfg), "--target-platform", "cuda")
    assert flag_value(p, "--port") == "9001"  # TOML over protocol (18180)
    assert flag_value(p, "--max-num-seqs") == "16"  # protocol over default
    assert flag_value(p, "--max-num-batched-tokens") == "2048"
    assert flag_value(p, "--served-model-name") == "qwen2.5-14b-draft-vspec-fp16"
    assert p["env"]["HUST_VSPEC_ADAPTIVE_HYSTERESIS"] == "0.04"
    assert p["env"]["MY_VAR"] == "x" and p["env"]["NUM"] == "3"
    p = dry_json("--config", str(cfg), "--target-platform", "cuda", "--port", "9002",
                 "--adaptive-hysteresis", "0.05")
    assert flag_value(p, "--port") == "9002"  # CLI over TOML
    assert p["env"]["HUST_VSPEC_ADAPTIVE_HYSTERESIS"] == "0.05"


def test_config_from_env(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[serve]\ntarget_model = "/cfg/t"\nmethod = "ngram"\n')
    for var in ("VSPEC_CONFIG", "SPECSLO_CONFIG", "SPECASCEND_CONFIG"):
        p = dry_json("--target-platform", "cpu", env=clean_env(**{var: str(cfg)}))
        assert flag_value(p, "--model") == "/cfg/t" and spec_config(p)["method"] == "ngram"


def test_extra_vllm_args_after_double_dash():
    p = plan("--", "--seed", "7", "--enable-log-requests")
    assert p["argv"][-3:] == ["--seed", "7", "--enable-log-requests"]


def test_stale_plugin_env_is_not_inherited():
    env = clean_env(HUST_VSPEC_ADAPTIVE_FIXED_GAMMA="3", HUST_SPECSLO_ADAPTIVE_POLICY="fixed")
    p = plan(env=env)
    assert "HUST_VSPEC_ADAPTIVE_FIXED_GAMMA" not in p["env"]
    assert p["env"]["HUST_VSPEC_ADAPTIVE_POLICY"] == "online"
    from launcher_util import launcher
    text = launcher(*BASE, "--dry-run", env=env).stdout
    assert "unset HUST_VSPEC_ADAPTIVE_FIXED_GAMMA" in text
    assert "unset HUST_SPECSLO_ADAPTIVE_POLICY" in text


def test_vllm_plugins_whitelist_gets_ours():
    p = plan(env=clean_env(VLLM_PLUGINS="other"))
    assert p["env"]["VLLM_PLUGINS"] == "other,vspec"


def test_text_dry_run_shows_env_and_command():
    from launcher_util import launcher
    proc = launcher(*BASE, "--dry-run", "--port", "8111")
    assert proc.returncode == 0
    assert "export HUST_VSPEC_ENABLED=1" in proc.stdout
    assert "export VLLM_CPU_KVCACHE_SPACE=1" in proc.stdout
    cmd = proc.stdout.strip().splitlines()[-1]
    assert cmd.endswith("--port 8111 --speculative-config "
                        "'{\"method\":\"draft_model\",\"model\":\"/m/draft\","
                        "\"num_speculative_tokens\":4}'")
    assert "-m vllm.entrypoints.openai.api_server --model /m/target" in cmd


def test_env_round_trips_through_the_plugin_reader():
    """What the launcher writes is what the plugin reads (settings.from_env)."""
    from vllm_hust_vspec import settings
    p = plan("--adaptive-hysteresis", "0.07", "--adaptive-policy", "schedule",
             "--adaptive-schedule", "1-4:3,5-64:1", "--adaptive-sweep", "0,2,4",
             "--adaptive-online-exploration", "0")
    s = settings.from_env(p["env"])
    assert s.adaptive_hysteresis == 0.07
    assert s.adaptive_policy == "schedule"
    assert s.adaptive_schedule == "1-4:3,5-64:1"
    assert s.adaptive_sweep == (0, 2, 4)
    assert s.adaptive_online_exploration == 0.0
    assert s.adaptive_speculation is True


def test_method_none_over_a_speculative_preset_runs_its_target_alone(tmp_path):
    """A target-only baseline from any preset: ``--method none`` on the command line sets
    the preset's speculation settings aside (one line names them) and keeps the rest."""
    from launcher_util import REPO, launcher

    proc = launcher("--config", str(REPO / "configs/tiny-cpu-draft.toml"), "--method", "none",
                    "--target-model", "/m/target", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert spec_config(p) is None
    assert p["env"]["HUST_VSPEC_ENABLED"] == "0"
    assert flag_value(p, "--max-num-seqs") == "8" and flag_value(p, "--max-model-len") == "1024"
    lines = [line for line in proc.stderr.splitlines() if "set aside" in line]
    assert len(lines) == 1
    assert "draft_model (" + str(REPO / "configs/tiny-cpu-draft.toml") + ": [serve] draft_model)" in lines[0]
    assert "gamma (" + str(REPO / "configs/tiny-cpu-draft.toml") + ": [serve] gamma)" in lines[0]
    # the same preset with a speculation flag beside --method none still conflicts
    bad = launcher("--config", str(REPO / "configs/tiny-cpu-draft.toml"), "--method", "none",
                   "--adaptive-policy", "fixed", "--dry-run")
    assert bad.returncode == 2 and "--method none and --adaptive-policy" in bad.stderr
    # a preset that says method none and sets gamma contradicts itself: refused
    own = tmp_path / "own.toml"
    own.write_text('[serve]\nmethod = "none"\ngamma = 3\ntarget_model = "/m/t"\n')
    proc = launcher("--config", str(own), "--dry-run")
    assert proc.returncode == 2 and f"{own}: [serve] gamma" in proc.stderr
