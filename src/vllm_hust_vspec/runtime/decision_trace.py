"""The decision-trace file (DESIGN 3b): JSON lines, appended, flushed per line.

Only the engine core (the process that owns the controller) writes it.  The records are
built by :mod:`vllm_hust_vspec.adaptive.trace`; this module owns the file.  A file that
cannot be opened stops the engine at start-up (with its path); one that fails while serving
(disk full, file system gone) is a warning, logged once, and the trace stops there: serving
goes on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from vllm_hust_vspec.settings import Settings

logger = logging.getLogger("vllm_hust_vspec")


def trace_path(settings: Settings, pid: int | None = None) -> str | None:
    """``adaptive_trace_file``, else ``./vspec-decisions-<pid>.jsonl`` when the legacy
    ``adaptive_trace`` switch is on, else None."""
    if settings.adaptive_trace_file:
        return str(settings.adaptive_trace_file)
    if settings.adaptive_trace:
        return os.path.abspath(f"vspec-decisions-{pid or os.getpid()}.jsonl")
    return None


class DecisionTrace:
    def __init__(self, path: str) -> None:
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self.failed: OSError | None = None  # the write error that stopped the trace

    def write(self, record: dict[str, Any]) -> None:
        if self.failed is not None:
            return
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except OSError as exc:
                self.failed = exc
                logger.warning("vllm-hust-vspec: decision trace %s: write failed (%s); the "
                               "trace stops here, serving goes on", self.path, exc)

    def close(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError:  # its buffer could not be written either: already warned
                pass
