"""Every vLLM server argument the launcher can emit is one the host's own server parser
takes (vLLM's ``make_arg_parser``, as ``python -m vllm.entrypoints.openai.api_server`` builds
it), with the value the option means: the host-scope options of the schema, the
speculative-config keys of vSpec 0.14's speculation flags, and explicit capture sizes.  A
vLLM release that renames or drops one fails here before a server does."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.host

REPO = pathlib.Path(__file__).resolve().parents[2]


def dry_json(*args: str) -> dict:
    """The launcher's --dry-run plan (a placeholder model dir: a dry run loads nothing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUST_VSPEC_")}
    env["HUST_VSPEC_MODEL_DIR"] = "/models"
    proc = subprocess.run([sys.executable, "-m", "vllm_hust_vspec", *args, "--dry-run", "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)

# one value per host option, away from vLLM's default
VALUES = {"served_model_name": "m", "max_num_seqs": 3, "max_num_batched_tokens": 512,
          "max_model_len": 256, "dtype": "bfloat16", "generation_config": "auto",
          "async_scheduling": False, "prefix_caching": False, "chunked_prefill": False,
          "host": "127.0.0.2", "port": 8123, "gpu_memory_utilization": 0.5,
          "tensor_parallel_size": 1, "kv_cache_dtype": "bfloat16", "block_size": 32,
          "language_model_only": True, "disable_log_stats": True}
DEST = {"prefix_caching": "enable_prefix_caching", "chunked_prefill": "enable_chunked_prefill"}


def _flags(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [flag, str(value)]


def test_every_host_option_is_a_vllm_server_argument():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_hust_vspec import settings
    assert set(VALUES) == {o.name for o in settings.options("host")}  # a new one needs a value
    ours = [a for name, v in VALUES.items() for a in _flags(name, v)]
    ours += ["--eagle-disable-draft-torch-compile", "--draft-tensor-parallel-size", "1"]
    plan = dry_json("--config", str(REPO / "configs" / "tiny-cpu-draft.toml"), *ours)
    argv = plan["argv"]
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    for name, value in VALUES.items():
        got = getattr(args, DEST.get(name, name))
        got = got[0] if isinstance(got, list) else got
        assert got == value, (name, got, value)
    spec = args.speculative_config
    spec = json.loads(spec) if isinstance(spec, str) else spec
    assert spec["enforce_eager"] is True and spec["draft_tensor_parallel_size"] == 1


def test_mtp_local_argmax_reduction_and_capture_sizes_are_vllm_config_keys():
    from vllm.config import CompilationConfig, SpeculativeConfig

    assert "use_local_argmax_reduction" in SpeculativeConfig.__dataclass_fields__
    assert "cudagraph_capture_sizes" in CompilationConfig.__dataclass_fields__
    plan = dry_json("--config", str(REPO / "configs" / "tiny-cpu-mtp.toml"),
                    "--mtp-local-argmax-reduction", "--target-platform", "cuda",
                    "--graph-mode", "full-decode-only", "--capture-sizes", "8,1,4")
    argv = plan["argv"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["use_local_argmax_reduction"] is True
    cc = json.loads(argv[argv.index("--compilation-config") + 1])
    assert cc["cudagraph_capture_sizes"] == [1, 4, 8]
