"""Patch ``StatLoggerManager.__init__``: the controller's metrics join the server's ``/metrics``.

What:   wraps ``vllm.v1.metrics.loggers.StatLoggerManager.__init__``; when the engine
        speculates, :class:`vllm_hust_vspec.runtime.prometheus.VspecStatLogger` is added to
        the host's ``custom_stat_loggers`` (the list vLLM's ``vllm.stat_logger_plugins``
        entry points also feed); it keeps the plugin's metrics in the registry vLLM's
        ``/metrics`` serves.
Why:    an entry point in ``vllm.stat_logger_plugins`` would load in every vLLM server of
        the environment, with the plugin off too, and a custom logger turns the server's
        stats on even under ``--disable-log-stats``; this patch exists only where the
        plugin is enabled, and the manager exists only where the server logs stats.
Remove: when vLLM's stat-logger plugins can stay out of servers that do not enable them.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_FRONTEND, PatchSpec, Symbol

_LOGGERS = "vllm.v1.metrics.loggers"

SPEC = PatchSpec(
    name="stat-logger",
    target=Symbol(_LOGGERS, "StatLoggerManager.__init__",
                  params=("vllm_config", "engine_idxs", "custom_stat_loggers")),
    requires=(
        Symbol(_LOGGERS, "AggregateStatLoggerBase"),
        Symbol("vllm.config.vllm", "VllmConfig.speculative_config"),
        Symbol("vllm.config.vllm", "VllmConfig.model_config"),
        Symbol("vllm.config.model", "ModelConfig.served_model_name"),
    ),
    process=PROCESS_FRONTEND,
    why="the controller's state on the server's own /metrics",
    remove_when="vLLM's stat-logger plugins can stay out of servers that do not enable them",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.prometheus import with_vspec_logger

    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        args_ = bound.arguments
        args_["custom_stat_loggers"] = with_vspec_logger(
            args_["vllm_config"], args_.get("custom_stat_loggers"))
        original(*bound.args, **bound.kwargs)

    return __init__
