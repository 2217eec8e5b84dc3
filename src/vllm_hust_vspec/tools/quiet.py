"""Wait for the machine to go quiet before a timed run (``bench ab --quiet-load``).

A benchmark server's figures mean something only while nothing else computes on the machine,
and the 1-minute load average is what the benchmarks record to say so (a run above ~1.5
judges nothing).  One server after another, the load average read before a server carries
the previous server's tail: it decays with a one-minute time constant, so a server started
right after one that kept both cores busy read 1.6-2.3 on a 2-core machine (2026-12-05,
``docs/benchmarks.md``) though nothing else ran.  Waiting until the average falls below a
level makes the figure recorded before each server say what it should.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def load_1m() -> float | None:
    """The machine's 1-minute load average now (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def wait_for_quiet(max_load: float, timeout: float, *, say: Callable[[str], None] = print,
                   read: Callable[[], float | None] = load_1m,
                   sleep: Callable[[float], None] = time.sleep,
                   now: Callable[[], float] = time.monotonic,
                   poll: float = 2.0) -> tuple[float | None, float]:
    """Poll the load average until it is at most ``max_load`` or ``timeout`` seconds pass;
    returns the last reading and the seconds waited.  Says one line when it starts waiting
    and one when it gives up (the run goes on: the recorded load then tells the truth)."""
    start = now()
    load = read()
    if load is None or load <= max_load:
        return load, 0.0
    say(f"waiting for the load average to fall to {max_load:g} (now {load:g}, at most "
        f"{timeout:.0f} s)")
    while True:
        waited = now() - start
        if waited >= timeout:
            say(f"the load average is still {load:g} after {waited:.0f} s: going on (this "
                "server's figures carry it)")
            return load, waited
        sleep(min(poll, timeout - waited))
        load = read()
        if load is None or load <= max_load:
            return load, now() - start
