"""Helpers for the launcher's CLI tests: run our commands as real subprocesses in a clean,
machine-independent environment."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# Placeholder model dir: dry runs never check it exists, and goldens stay machine-free.
MODEL_DIR = "/models"
_DROP_PREFIXES = ("HUST_VSPEC_", "HUST_SPECSLO_", "HUST_SPECASCEND_")
_DROP = ("VSPEC_CONFIG", "SPECSLO_CONFIG", "SPECASCEND_CONFIG", "VLLM_CPU_KVCACHE_SPACE",
         "VLLM_PLUGINS", "VSPEC_FIXTURES", "VSPEC_FIXTURES_DIR", "CUDA_VISIBLE_DEVICES",
         "ASCEND_RT_VISIBLE_DEVICES")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_DROP_PREFIXES) and k not in _DROP}
    env["HUST_VSPEC_MODEL_DIR"] = MODEL_DIR
    env.update(extra)
    return env


def launcher(*args: str, env: dict[str, str] | None = None,
             cwd: pathlib.Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "vllm_hust_vspec", *args], cwd=cwd,
                          env=clean_env() if env is None else env, capture_output=True,
                          text=True, timeout=timeout)


def dry_json(*args: str, env: dict[str, str] | None = None) -> dict:
    args = list(args)
    at = args.index("--") if "--" in args else len(args)
    proc = launcher(*args[:at], "--dry-run", "--json", *args[at:], env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def spec_config(plan: dict) -> dict | None:
    argv = plan["argv"]
    if "--speculative-config" not in argv:
        return None
    return json.loads(argv[argv.index("--speculative-config") + 1])


def compilation_config(plan: dict) -> dict | None:
    argv = plan["argv"]
    if "--compilation-config" not in argv:
        return None
    return json.loads(argv[argv.index("--compilation-config") + 1])


def flag_value(plan: dict, flag: str) -> str | None:
    argv = plan["argv"]
    return argv[argv.index(flag) + 1] if flag in argv else None


def normalized(plan: dict) -> dict:
    """The plan with the machine's executable path replaced by a placeholder."""
    out = dict(plan)
    exe = plan["executable"]
    if exe == PYTHON or exe == "vllm" or exe.endswith("/vllm"):
        out["executable"] = "<" + plan["argv"][0] + ">"
    return out
