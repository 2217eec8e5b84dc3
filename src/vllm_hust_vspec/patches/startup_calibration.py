"""Patch ``vllm.v1.engine.core.enable_envs_cache``: start-up calibration before READY.

What:   replaces the module global ``enable_envs_cache`` of ``vllm.v1.engine.core``, the
        last call of ``EngineCore.__init__`` (after model warm-up, KV-cache initialisation,
        the scheduler and the step function).  After the original, when its caller is an
        ``EngineCore.__init__`` whose scheduler carries the plugin's runtime, it runs
        :func:`vllm_hust_vspec.startup_cost.runner.run_at_start`: load or calibrate the
        budget policy's cost table.  ``EngineCoreProc`` sends READY only after
        ``EngineCore.__init__`` returns, and the offline ``LLM`` (in-process engine core)
        returns only after it, so calibration ends before anything is served.
Why:    the engine core process is spawned on the CPU host: there the plugin is loaded BY
        ``EngineCore.__init__`` (``load_general_plugins()`` is its first statement), so a
        wrapper of ``EngineCore.__init__`` itself is installed too late for that very call;
        a module global that ``__init__`` looks up at its end is not.  The engine core
        object is the caller's ``self`` (its frame), checked to be an ``EngineCore``.
Remove: when vLLM offers an engine-core start-up hook for plugins (after the scheduler, before
        READY).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_CORE = "vllm.v1.engine.core"
_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="startup-calibration",
    target=Symbol(_CORE, "enable_envs_cache"),
    requires=(
        Symbol(_CORE, "EngineCore.__init__"),
        Symbol(_CORE, "EngineCore.scheduler"),
        Symbol(_CORE, "EngineCore.step_fn"),
        Symbol(_CORE, "EngineCore.post_step", params=("model_executed",)),
        Symbol(_CORE, "EngineCore.preprocess_add_request", params=("request",)),
        Symbol(_CORE, "EngineCore.add_request", params=("request", "request_wave")),
        Symbol(_CORE, "EngineCore.abort_requests", params=("request_ids",)),
        Symbol(_CORE, "EngineCore.reset_prefix_cache"),
        Symbol(_CORE, "EngineCoreProc"),
        Symbol("vllm.v1.engine", "EngineCoreRequest"),
        Symbol(_SCHED, "Scheduler.requests"),
        Symbol(_SCHED, "Scheduler.kv_cache_config"),
        Symbol(_SCHED, "Scheduler.block_size"),
        Symbol(_SCHED, "Scheduler.max_num_running_reqs"),
        Symbol(_SCHED, "Scheduler.max_num_scheduled_tokens"),
        Symbol(_SCHED, "Scheduler.max_model_len"),
        Symbol(_SCHED, "Scheduler.has_requests"),
    ),
    process=PROCESS_ENGINE,
    why="calibrate the budget policy's full-step cost table in the engine core before READY",
    remove_when="vLLM offers a plugin hook at the end of engine-core start-up",
)


def _engine_core_of(frame: Any) -> Any:
    """The ``EngineCore`` whose ``__init__`` is ``frame``, else None."""
    if frame is None or frame.f_code.co_name != "__init__":
        return None
    candidate = frame.f_locals.get("self")
    from vllm.v1.engine.core import EngineCore

    return candidate if isinstance(candidate, EngineCore) else None


def make(original: Any) -> Any:
    from vllm_hust_vspec.startup_cost.runner import run_at_start

    @functools.wraps(original)
    def enable_envs_cache(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        engine_core = _engine_core_of(sys._getframe(1))
        if engine_core is not None:
            run_at_start(engine_core)
        return result

    return enable_envs_cache
