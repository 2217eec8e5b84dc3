"""vllm-hust-vspec: adaptive speculative decoding for vLLM (a vllm.general_plugins plugin).

vLLM calls :func:`register` in every process it starts (front end, engine core, workers).
It does nothing unless ``HUST_VSPEC_ENABLED=1``; importing this package imports nothing
heavy.
"""

import os

from vllm_hust_vspec._version import __version__

__all__ = ["__version__", "register"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point (``vspec = vllm_hust_vspec:register``).

    Inert unless ``HUST_VSPEC_ENABLED=1``: then it reads the settings from the env, and
    applies the patches that fit this process and host, all or nothing (idempotent).  Any
    problem (bad setting, missing host symbol) raises one clear error: vLLM does not catch
    it, so the process fails closed instead of running half-patched."""
    if os.environ.get("HUST_VSPEC_ENABLED") != "1":
        return
    from vllm_hust_vspec.plugin import activate

    activate()
