"""Patch ``EngineArgs.create_speculative_config``: turn on the host's dynamic-SD mode.

What:   wraps ``vllm.engine.arg_utils.EngineArgs.create_speculative_config``; after the host
        builds the ``SpeculativeConfig``, :func:`vllm_hust_vspec.runtime.frontend.configure_speculative`
        checks it against the plugin's settings (guards in
        :mod:`vllm_hust_vspec.runtime.specconfig`) and sets
        ``num_speculative_tokens_per_batch_size`` to ``[(1, 1, Kmax)]`` when the user gave none.
Why:    the scheduler consults its K lookup (which the ``scheduler-k`` patch replaces by the
        controller) only in dynamic-SD mode, and that mode also turns off padding new decodes
        to Kmax, switches V1 to PIECEWISE graphs and makes V2 capture every width.  Doing it
        here, in the process that builds the config, makes
        ``HUST_VSPEC_ENABLED=1 vllm serve ... --speculative-config '{...}'`` work without our
        launcher.
Remove: when vLLM accepts a pluggable K policy object in ``SpeculativeConfig`` (no upstream
        PR yet; dynamic SD arrived in vllm-project/vllm#32374 with a static table only).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_FRONTEND, PatchSpec, Symbol

_ARGS = "vllm.engine.arg_utils"
_SPEC = "vllm.config.speculative"

SPEC = PatchSpec(
    name="dynamic-sd-config",
    target=Symbol(_ARGS, "EngineArgs.create_speculative_config",
                  params=("target_model_config", "target_parallel_config")),
    requires=(
        Symbol(_SPEC, "SpeculativeConfig.num_speculative_tokens_per_batch_size"),
        Symbol(_SPEC, "SpeculativeConfig.num_speculative_tokens"),
        Symbol(_SPEC, "SpeculativeConfig.method"),
        Symbol("vllm.config.parallel", "ParallelConfig.data_parallel_size"),
        Symbol("vllm.v1.spec_decode.dynamic.utils", "validate_and_normalize_dynamic_sd_schedule"),
    ),
    process=PROCESS_FRONTEND,
    why="turn on dynamic-SD mode so the scheduler asks the controller for K every step",
    remove_when="vLLM takes a pluggable K policy in SpeculativeConfig",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.frontend import configure_speculative

    @functools.wraps(original)
    def create_speculative_config(self: Any, target_model_config: Any,
                                  target_parallel_config: Any) -> Any:
        config = original(self, target_model_config, target_parallel_config)
        return configure_speculative(config, target_parallel_config)

    return create_speculative_config
