"""Patch ``Scheduler.__init__`` on vLLM-HUST 0.17: the engine runtime joins the scheduler.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler.__init__`` (AsyncScheduler inherits
        it); after the host's ``__init__`` it checks the speculative config against the
        plugin's settings (method, Kmax, data parallelism) and attaches an engine runtime
        (controller, decision trace, recorder), without a K lookup: the host has none.
Why:    every other engine patch finds its runtime on the scheduler; 0.17 has no
        ``dynamic_sd_lookup`` to replace and no dynamic-SD config for the front end to patch,
        so the checks the front end makes on vLLM >= 0.24 run here.
Remove: when vLLM-HUST rebases onto vLLM >= 0.24 (then ``scheduler-k`` applies).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import FAMILY_HUST, PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="hust-attach",
    target=Symbol(_SCHED, "Scheduler.__init__"),
    requires=(
        Symbol(_SCHED, "Scheduler.num_spec_tokens"),
        Symbol(_SCHED, "Scheduler.running"),
        Symbol(_SCHED, "Scheduler.requests"),
        Symbol(_SCHED, "Scheduler.vllm_config"),
        Symbol("vllm.config.speculative", "SpeculativeConfig.method"),
        Symbol("vllm.config.speculative", "SpeculativeConfig.num_speculative_tokens"),
    ),
    process=PROCESS_ENGINE,
    family=FAMILY_HUST,
    why="attach the controller to the 0.17 scheduler (no dynamic-SD lookup there)",
    remove_when="vLLM-HUST rebases onto vLLM >= 0.24 (then scheduler-k applies)",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import attach

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        attach(self, k_lookup=False)

    return __init__
