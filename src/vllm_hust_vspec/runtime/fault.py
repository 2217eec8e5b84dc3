"""A fault in the controller never takes the engine down: the engine runs on at a safe K.

The engine runtime calls the controller (its policy, estimators and cost models) inside a
guard.  The first exception trips it: the traceback is logged once with the step and the
call, the controller is never called again in this engine, and every later step runs at the
safe K, traced as a ``fallback`` decision and counted (stats line, ``/metrics``).

The safe K is 0 where the method lets K vary: the one K whose cost needs no estimate (at
K = 0 the drafter sits the step out, so the engine serves about as target-only does, at any
load), where any K > 0 can cost up to twice that at high load and gains only where the
controller's estimates, which just failed, say it does.  Methods whose proposer asserts
K == Kmax in the host run at Kmax, as the host would.  Every K is lossless.  Pure Python.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("vllm_hust_vspec")


class FaultGuard:
    def __init__(self, safe_k: int) -> None:
        self.safe_k = safe_k
        self.step: int | None = None  # the step whose controller call failed (None: none did)
        self.where = ""
        # what the engine did at the safe K, for the stats line
        self.steps = 0
        self.requests = 0
        self.accepted = 0
        self.drafted = 0

    @property
    def tripped(self) -> bool:
        return self.step is not None

    def trip(self, step: int, where: str) -> None:
        """Called inside ``except``: log the fault with its traceback (once) and fall back."""
        if self.tripped:
            return
        self.step = step
        self.where = where
        logger.exception(
            "vllm-hust-vspec: the controller failed at step %d (%s); this engine runs at the "
            "safe K = %d from now on and keeps serving (outputs are unchanged: every K is "
            "lossless); the decision trace marks the steps 'fallback'", step, where, self.safe_k)

    @property
    def reason(self) -> str:
        return f"fallback k={self.safe_k}: controller fault at step {self.step} ({self.where})"

    def decision_record(self, step: int, t: float, batch: int) -> dict[str, Any]:
        """The trace's record of a step decided by the fallback."""
        return {"step": step, "t": round(t, 6), "batch": batch, "k": self.safe_k, "k_i": None,
                "policy": "fallback", "reason": self.reason, "est_accept": [],
                "est_cost_ms": None}

    def result(self, step: int, batch: int, drafted: int, accepted: int,
               ms: float | None) -> dict[str, Any]:
        """The trace's result record of a fallback step (and its count for the stats line)."""
        self.steps += 1
        self.requests += batch
        self.drafted += drafted
        self.accepted += accepted
        return {"step": step, "drafted": drafted, "accepted": accepted,
                "ms": None if ms is None else round(ms, 4)}

    def stats(self, steps: int) -> dict[str, Any]:
        """The stats line's fields while the fallback decides."""
        return {
            "policy": f"fallback(k={self.safe_k})", "steps": steps,
            "k_hist": {self.safe_k: self.steps}, "mean_k": float(self.safe_k),
            "mean_accepted_len": (1.0 + self.accepted / self.requests) if self.requests else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "goodput_tok_s": None, "fallbacks": 1,
        }

    @property
    def state(self) -> dict[str, Any]:
        """The ``/metrics`` state while the fallback decides."""
        return {"policy": "fallback", "cost": "none", "source": "", "cost_model": ""}
