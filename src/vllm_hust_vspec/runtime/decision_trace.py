"""The decision-trace file (DESIGN 3b): JSON lines, appended, flushed per line.

Only the engine core (the process that owns the controller) writes it.  The records are
built by :mod:`vllm_hust_vspec.adaptive.trace`; this module owns the file.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from vllm_hust_vspec.settings import Settings


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

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
