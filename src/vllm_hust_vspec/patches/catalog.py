"""Every patch of the project, in application order.

Importing this module imports neither vLLM nor numpy: each patch module declares its ``SPEC``
at module level and imports the host and the layers it calls into (runtime/, startup_cost/)
only inside ``make``, so the doctor reads the declarations in an environment that has
nothing but this package.  The doctor reads :func:`all_specs`; the
plugin applies :func:`patches_for` this process and host.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from vllm_hust_vspec.patches import (
    admission,
    async_placeholders,
    capture_sizes,
    cpu_expand_kernel,
    dflash_k0,
    draft_confidence_output,
    draft_confidence_request,
    draft_confidence_sample,
    draft_confidence_take,
    draft_lm_head,
    draft_propose,
    draft_trim,
    lossy_accept,
    lossy_accept_context,
    drafter_k0,
    dspark_inputs,
    dspark_sample,
    eagle_k0,
    hust_attach,
    hust_draft_k,
    hust_shared,
    hust_step_k,
    requirements_ascend,
    requirements_hust,
    sample_no_drafts,
    scheduler_k,
    spec_metadata_no_drafts,
    spec_stats,
    speculative_config,
    startup_calibration,
    stat_logger,
    stats_decode,
    step_output,
)
from vllm_hust_vspec.models import registration
from vllm_hust_vspec.patches.registry import Patch
from vllm_hust_vspec.patchspec import PatchSpec

_MODULES: tuple[ModuleType, ...] = (
    speculative_config,
    capture_sizes,
    stats_decode,
    stat_logger,
    scheduler_k,
    admission,
    spec_stats,
    step_output,
    draft_trim,
    async_placeholders,
    draft_confidence_request,
    draft_confidence_sample,
    draft_propose,
    draft_confidence_take,
    draft_confidence_output,
    draft_lm_head,
    drafter_k0,
    eagle_k0,
    dflash_k0,
    dspark_inputs,
    dspark_sample,
    cpu_expand_kernel,
    sample_no_drafts,
    lossy_accept_context,
    lossy_accept,
    spec_metadata_no_drafts,
    startup_calibration,
)

# vLLM-HUST 0.17 (family vllm-hust), in application order: the runtime joins the scheduler,
# K is decided per step, each step's results are observed, drafts and placeholders are cut,
# the worker's drafter drafts K (the observers and the cuts are the vllm family's, declared
# again: hust_shared)
_HUST: tuple[tuple[PatchSpec, Any], ...] = (
    (hust_attach.SPEC, hust_attach.make),
    (hust_step_k.SPEC, hust_step_k.make),
    *hust_shared.PATCHES,
    (hust_draft_k.SPEC, hust_draft_k.make),
)


def all_specs() -> tuple[PatchSpec, ...]:
    """Every declared patch (applied or requirement-only), for the doctor: the runtime
    patches (vLLM, then vLLM-HUST 0.17), the Qwen2 EAGLE registration's requirements, then
    the requirement-only specs for vLLM-Ascend and vLLM-HUST."""
    return (tuple(m.SPEC for m in _MODULES) + tuple(spec for spec, _ in _HUST)
            + (registration.SPEC,)
            + tuple(requirements_ascend.SPECS) + tuple(requirements_hust.SPECS))


def all_patches() -> tuple[Patch, ...]:
    return (tuple(Patch(m.SPEC, m.make) for m in _MODULES)
            + tuple(Patch(spec, make) for spec, make in _HUST))


def _host_has(module: str | None) -> bool:
    """Whether the running host has ``module`` (True for None: no condition)."""
    if module is None:
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def patches_for(roles: tuple[str, ...], family: str, graph_capable: bool,
                platform: str = "cpu") -> tuple[Patch, ...]:
    """The patches that fit a process playing ``roles`` on a host of ``family`` and
    ``platform`` (graph-only patches need ``graph_capable``; CPU-only ones ``platform == 'cpu'``;
    those for one host model, ``HOST_MODULE``, a host that has it)."""
    out = []
    for m in _MODULES:
        spec = m.SPEC
        if not spec.applies or spec.family != family or spec.process not in roles:
            continue
        if getattr(m, "GRAPH_HOSTS_ONLY", False) and not graph_capable:
            continue
        if getattr(m, "CPU_HOSTS_ONLY", False) and platform != "cpu":
            continue
        if not _host_has(getattr(m, "HOST_MODULE", None)):
            continue
        out.append(Patch(spec, m.make))
    for spec, make in _HUST:
        if spec.family == family and spec.process in roles:
            out.append(Patch(spec, make))
    return tuple(out)


# Host modules of the V1 model runner and its proposers and sampler: vLLM's V2 model runner
# (vllm.v1.worker.gpu, 0.33+ on CUDA) runs none of them, so patches on them do nothing there.
V1_RUNNER_MODULES = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.spec_decode.",
                     "vllm.v1.sample.rejection_sampler")


def v1_only(family: str = "vllm") -> tuple[str, ...]:
    """The applied patches of ``family`` whose targets only vLLM's V1 model runner runs."""
    specs = [m.SPEC for m in _MODULES] + [spec for spec, _ in _HUST]
    return tuple(s.name for s in specs
                 if s.family == family and s.target.module.startswith(V1_RUNNER_MODULES))
