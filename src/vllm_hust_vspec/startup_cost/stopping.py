"""A stop signal ends the start-up measurements at once (the probe and the calibration).

vLLM 0.32's engine core, while it is being constructed, only records a SIGTERM / SIGINT
(``run_engine_core``'s handler sets a flag that its busy loop reads once construction is
over).  The probe and the calibration run inside that construction and step the engine for
seconds to minutes, so a stopped server went on measuring until the launcher killed it
(measured: 20 s, the launcher's two grace periods, for a ``budget`` server stopped during
its calibration).

:class:`StopSignals` wraps the handlers while the measurements run: a signal is recorded,
the previous handler still runs (vLLM's flag, or Python's ``KeyboardInterrupt`` in a process
that kept the default SIGINT handler), and :meth:`StopSignals.check`, called before each
engine step of the measurements, ends them with ``SystemExit(128 + N)``: the engine does
not start, its synthetic requests are purged (the driver's ``finally``), nothing is
installed or saved.  A signal that the process ignores stays ignored; outside the main
thread (where no handler can be set) nothing is wrapped.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

logger = logging.getLogger("vllm_hust_vspec")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Context manager: record SIGTERM / SIGINT while the start-up measurements run."""

    def __init__(self, what: str) -> None:
        self.what = what  # for the log line: "calibration", "cost probe"
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue
            self._previous[signum] = previous
            signal.signal(signum, self._record)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    def check(self) -> None:
        """End the measurements (``SystemExit(128 + N)``) once a stop signal arrived."""
        if self.signum is None:
            return
        name = signal.Signals(self.signum).name
        logger.warning("vllm-hust-vspec %s: %s received: stopped, nothing measured is kept; "
                       "the engine does not start", self.what, name)
        raise SystemExit(128 + self.signum)
