"""docs/options.md is generated from the schema; every option has a flag or TOML key."""

from __future__ import annotations

import subprocess
import sys

import pytest
from launcher_util import REPO

pytestmark = pytest.mark.cli

ISSUE_FLAGS = (
    "--method", "--target-model", "--draft-model", "--gamma", "--served-model-name",
    "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--dtype", "--graph-mode",
    "--generation-config", "--capture-policy", "--async-scheduling", "--no-async-scheduling",
    "--prefix-caching", "--no-prefix-caching", "--chunked-prefill", "--no-chunked-prefill",
    "--device", "--host", "--port", "--gpu-memory-utilization", "--tensor-parallel-size",
    "--adaptive-speculation", "--no-adaptive-speculation", "--adaptive-policy",
    "--adaptive-profile", "--adaptive-min-gamma", "--adaptive-control-interval",
    "--adaptive-hysteresis", "--adaptive-max-gamma-step", "--adaptive-ewma-weight",
    "--adaptive-online-exploration", "--adaptive-online-warmup-samples",
    "--adaptive-online-window", "--adaptive-trace", "--adaptive-trace-file",
    "--adaptive-record-trace", "--adaptive-stop", "--adaptive-stop-threshold", "--config",
    "--protocol", "--dry-run", "--json", "--target-platform",
)


def test_options_md_is_fresh():
    proc = subprocess.run([sys.executable, "-m", "vllm_hust_vspec.launcher.docs"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    current = (REPO / "docs" / "options.md").read_text()
    assert proc.stdout == current, (
        "docs/options.md is stale: run "
        "`python -m vllm_hust_vspec.launcher.docs > docs/options.md`")


def test_every_option_is_documented():
    from vllm_hust_vspec import settings
    text = (REPO / "docs" / "options.md").read_text()
    for opt in settings.OPTIONS:
        assert f"`{opt.name}`" in text or f"`{opt.cli_flag}`" in text, opt.name


def test_help_lists_every_issue_flag():
    proc = subprocess.run([sys.executable, "-m", "vllm_hust_vspec", "--help"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0
    for flag in ISSUE_FLAGS:
        assert flag in proc.stdout, flag


def test_console_scripts_installed():
    import shutil
    bindir = REPO / ".venv" / "bin"
    for name in ("vllm-hust-vspec", "vllm-hust-vspec-bench"):
        exe = shutil.which(name, path=str(bindir)) or shutil.which(name)
        assert exe, name
        proc = subprocess.run([exe, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0 and "usage:" in proc.stdout
