"""The declaration every patch makes: what it patches, what it needs, why, and when it goes.

These declarations are the ONLY list of host symbols in the project: the runtime checks them
before applying anything, and the doctor (``vllm-hust-vspec-doctor``) reads the same objects
to probe a host's source tree statically.  This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses

# Process roles: where vLLM calls our register().
PROCESS_FRONTEND = "frontend"  # API server / offline LLM process (builds the configs)
PROCESS_ENGINE = "engine"  # engine core (owns the scheduler, and so the controller)
PROCESS_WORKER = "worker"  # model runner / drafter
PROCESSES = (PROCESS_FRONTEND, PROCESS_ENGINE, PROCESS_WORKER)

# Host families a spec applies to.
FAMILY_VLLM = "vllm"  # upstream vLLM >= 0.24 (CPU, CUDA)
FAMILY_ASCEND = "vllm-ascend"  # vLLM-Ascend 0.23+ (requirement-only for now)
FAMILY_HUST = "vllm-hust"  # vLLM-HUST 0.17 (requirement-only for now)
FAMILIES = (FAMILY_VLLM, FAMILY_ASCEND, FAMILY_HUST)


@dataclasses.dataclass(frozen=True)
class Symbol:
    """One host symbol: ``module`` (dotted import path) and ``qualname`` inside it
    (``Class``, ``Class.method``, or ``Class.attribute`` for an attribute assigned in a
    method body, e.g. ``Scheduler.dynamic_sd_lookup``).  ``params`` optionally lists
    parameter names the callable must accept (checked statically by the doctor)."""

    module: str
    qualname: str
    params: tuple[str, ...] = ()
    root: str = "vllm"  # which tree: "vllm" or "vllm_ascend"

    def __str__(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclasses.dataclass(frozen=True)
class PatchSpec:
    """A declarative patch.

    name:        short unique id (shown in the plugin's log line and the doctor).
    target:      the symbol replaced or wrapped (its attribute on its owner).
    requires:    every host symbol the patch's code touches (target included).
    process:     the process role it belongs to (one of PROCESSES).
    family:      host family it is written for.
    methods:     speculative methods it matters for (empty = all).
    adaptive:    True when it is part of the controller's patch set (doctor --adaptive).
    why:         why it exists.
    remove_when: the upstream change that would make it unnecessary.
    applies:     False for requirement-only specs (declared for the doctor; not applied).
    asked_only:  the doctor checks it only when ``--method`` names one of ``methods`` (a
                 method the host family may not offer at all, e.g. DFlash on vLLM-HUST 0.17).
    """

    name: str
    target: Symbol
    requires: tuple[Symbol, ...]
    process: str
    why: str
    remove_when: str
    family: str = FAMILY_VLLM
    methods: tuple[str, ...] = ()
    adaptive: bool = True
    applies: bool = True
    asked_only: bool = False

    def __post_init__(self) -> None:
        if self.process not in PROCESSES:
            raise ValueError(f"patch {self.name}: unknown process {self.process!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"patch {self.name}: unknown family {self.family!r}")
        if self.asked_only and not self.methods:
            raise ValueError(f"patch {self.name}: asked_only needs the methods it is asked for")

    @property
    def all_symbols(self) -> tuple[Symbol, ...]:
        seen = [self.target]
        for s in self.requires:
            if s not in seen:
                seen.append(s)
        return tuple(seen)
