"""Trace files that fail while serving (disk full, descriptor gone) are a warning, logged
once, never an exception into the engine (issue 16 item 3).  /dev/full is the kernel's
always-full device: every write to it fails with ENOSPC."""

from __future__ import annotations

import logging
import os
import pathlib

import pytest

from vllm_hust_vspec.runtime.decision_trace import DecisionTrace
from vllm_hust_vspec.runtime.sim_trace import SimTraceRecorder

pytestmark = pytest.mark.unit


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_stops_the_decision_trace_with_one_warning(caplog):
    trace = DecisionTrace("/dev/full")
    with caplog.at_level(logging.WARNING, logger="vllm_hust_vspec"):
        for step in range(5):
            trace.write({"step": step, "k": 1})
    warnings = [r for r in caplog.records if "decision trace /dev/full" in r.getMessage()]
    assert len(warnings) == 1 and "No space left" in warnings[0].getMessage()
    assert isinstance(trace.failed, OSError)
    trace.close()


def test_a_recorder_whose_file_fails_stops_recording_with_one_warning(tmp_path, caplog):
    path = tmp_path / "sim.jsonl"
    rec = SimTraceRecorder(str(path), kmax=2, max_num_seqs=4, draft_min_steps=0)
    rec.on_step("a", 0.0, 0, 1)
    rec.finish("a", 3)
    assert rec.written == 1
    os.close(rec._fd)  # the descriptor is gone (as on a file system that went away)
    with caplog.at_level(logging.WARNING, logger="vllm_hust_vspec"):
        for rid in ("b", "c"):
            rec.on_step(rid, 0.1, 0, 1)
            rec.finish(rid, 3)
    warnings = [r for r in caplog.records if "simulator trace" in r.getMessage()]
    assert len(warnings) == 1 and "stops at 1 requests" in warnings[0].getMessage()
    assert rec.written == 1 and isinstance(rec.failed, OSError)
    assert pathlib.Path(path).read_text().count('"id"') == 1
