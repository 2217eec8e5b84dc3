"""Patch ``VllmConfig._set_cudagraph_sizes``: capture every verify width (graph hosts only).

What:   wraps ``vllm.config.vllm.VllmConfig._set_cudagraph_sizes``; when the user (or our
        launcher, per ``--capture-policy``) gave no explicit capture sizes, adds
        ``n * (K + 1)`` for every verify width the controller may pick and n on the host's
        request ladder (capped at the host's largest capture size), computed by
        :func:`vllm_hust_vspec.runtime.frontend.widen_capture_sizes` with
        :func:`vllm_hust_vspec.capture.capture_sizes` (the launcher's function too).
        Explicit sizes are left exactly as given.  On vLLM's V2 model runner it also
        replaces the plugin's own ``[(1, 1, Kmax)]`` batch-size table by one that names every
        K (:func:`vllm_hust_vspec.runtime.frontend.cover_v2_widths`): V2 captures decode graphs
        for the widths of that table only.
Why:    the host's dynamic-SD tiers follow the batch-size table; our table is a single
        ``[(1, 1, Kmax)]`` entry, so without this only the Kmax width would have graphs and
        every other K the controller picks would run eagerly.
Remove: when vLLM captures every width up to Kmax in dynamic-SD mode.
Note:   declared for the doctor on every host; applied only where the platform captures
        graphs (the CPU host has none: its capture list is empty).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_FRONTEND, PatchSpec, Symbol

_VLLM = "vllm.config.vllm"

SPEC = PatchSpec(
    name="capture-sizes",
    target=Symbol(_VLLM, "VllmConfig._set_cudagraph_sizes"),
    requires=(
        Symbol(_VLLM, "VllmConfig.compilation_config"),
        Symbol(_VLLM, "VllmConfig.speculative_config"),
        Symbol(_VLLM, "VllmConfig.scheduler_config"),
        Symbol("vllm.config.compilation", "CompilationConfig.cudagraph_capture_sizes"),
        Symbol("vllm.config.compilation", "CompilationConfig.max_cudagraph_capture_size"),
        Symbol("vllm.config.speculative", "SpeculativeConfig.num_speculative_tokens_per_batch_size"),
    ),
    process=PROCESS_FRONTEND,
    why="device graphs for every verify width n*(K+1), K = 1..Kmax",
    remove_when="vLLM captures every width up to Kmax in dynamic-SD mode",
)

# Applied only on hosts whose platform captures device graphs.
GRAPH_HOSTS_ONLY = True


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.frontend import cover_v2_widths, widen_capture_sizes

    @functools.wraps(original)
    def _set_cudagraph_sizes(self: Any) -> None:
        explicit = self.compilation_config.cudagraph_capture_sizes is not None
        original(self)
        if not explicit:
            widen_capture_sizes(self)
        cover_v2_widths(self)

    return _set_cudagraph_sizes
