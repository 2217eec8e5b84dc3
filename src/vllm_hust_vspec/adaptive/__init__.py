"""The adaptive controller core: pure Python + numpy (no vLLM, no torch).

* :mod:`.observations` -- the data the engine and the controller exchange;
* :mod:`.estimators` -- acceptance per position, step-cost model, confidence map;
* :mod:`.policies` -- fixed, schedule, online, sweep (+ budget, profile), per-request stop;
* :mod:`.controller` -- :class:`Controller` with ``observe()`` / ``decide()``;
* :mod:`.trace` -- decision-trace records.
"""

from .controller import Controller, ControllerConfig
from .observations import BatchView, Decision, KiArray, RequestResult, StepResult, ki_array

__all__ = [
    "BatchView",
    "Controller",
    "ControllerConfig",
    "Decision",
    "KiArray",
    "RequestResult",
    "StepResult",
    "ki_array",
]
