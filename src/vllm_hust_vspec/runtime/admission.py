"""Admission control: refill the batch in cohorts (``--adaptive-refill-batch``).

While requests run and others wait, a waiting request is admitted only when ``min(N, waiting)``
batch slots are free: the batch then refills with a cohort of N new requests at once instead
of one request every time one finishes, so fewer steps mix prefills into the decode batch and
the batch size (which sets the best K) changes in few large steps rather than many small ones.
A starvation bound ends any hold: after ``max_wait_steps`` consecutive held steps the host
admits what fits, whatever the cohort.

Never held: an empty engine (its first requests start at once), a step where nothing waits
or no slot is free (the host could admit nothing anyway).  Holding only lowers, for one
``schedule()`` call, the host's admission limit to the slots already taken (patch
``admission``); which requests run, in which order, and every token they produce are the
host's.  Pure Python; one :class:`Admission` per engine.
"""

from __future__ import annotations

import dataclasses

from vllm_hust_vspec import methods


def cohort_size(refill_batch: int, method: str) -> int:
    """The cohort N of ``--adaptive-refill-batch`` (0: the method's default, as vSpec 0.14:
    8 for the draft model, 4 for every other method)."""
    if refill_batch < 0:
        raise ValueError(f"refill batch {refill_batch} must be >= 0")
    return refill_batch or methods.REFILL_DEFAULT.get(method, methods.REFILL_DEFAULT_OTHER)


@dataclasses.dataclass
class Admission:
    """The cohort rule of one engine, with its counters."""

    cohort: int  # N: hold while fewer than min(N, waiting) slots are free
    max_wait_steps: int  # the starvation bound: consecutive held steps before a release
    held_steps: int = 0  # consecutive steps held so far
    holds: int = 0  # steps held, in all
    releases: int = 0  # holds ended by the starvation bound
    held_now: int = 0  # requests held back in the latest step (0: none)

    def __post_init__(self) -> None:
        if self.cohort < 1:
            raise ValueError(f"cohort {self.cohort} must be >= 1")
        if self.max_wait_steps < 1:
            raise ValueError(f"max_wait_steps {self.max_wait_steps} must be >= 1")

    def limit(self, occupied: int, waiting: int, host_limit: int) -> int | None:
        """This step's admission limit: None (the host's own, ``host_limit``) or ``occupied``
        (admit no one this step).

        ``occupied``: batch slots taken (running requests and the host's paused streams);
        ``waiting``: requests waiting to be admitted; ``host_limit``: the host's limit on
        ``occupied`` (``max_num_active_reqs``)."""
        free = host_limit - occupied
        self.held_now = 0
        if waiting <= 0 or occupied <= 0 or free <= 0:
            self.held_steps = 0
            return None
        if free >= min(self.cohort, waiting, host_limit):
            self.held_steps = 0
            return None
        if self.held_steps >= self.max_wait_steps:  # starvation bound: admit what fits
            self.held_steps = 0
            self.releases += 1
            return None
        self.held_steps += 1
        self.holds += 1
        self.held_now = waiting
        return occupied

    @property
    def stats(self) -> dict[str, int]:
        """For the summary log line: steps held, and holds the starvation bound ended."""
        return {"admission_holds": self.holds, "admission_releases": self.releases}
