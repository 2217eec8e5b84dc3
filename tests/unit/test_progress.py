"""The progress helper: periodic plain lines off a terminal, a tqdm bar on one."""

from __future__ import annotations

import io

import pytest

from vllm_hust_vspec.progress import Progress, format_seconds

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_every_period_and_at_the_end(monkeypatch):
    monkeypatch.delenv("VSPEC_PROGRESS", raising=False)
    out, clock = io.StringIO(), Clock()
    with Progress(10, "target", stream=out, every_s=30, clock=clock) as p:
        assert p.mode == "lines"
        for i in range(10):
            clock.t += 10  # 0.1 step/s
            p.update(loss=4.25 - i * 0.1)
    lines = out.getvalue().splitlines()
    # at 30 s, 60 s, 90 s and the last step
    assert [l.split()[1] for l in lines] == ["3/10", "6/10", "9/10", "10/10"]
    assert lines[0] == "[target] 3/10 (30%) 0.1 step/s, elapsed 30s, ETA 1m10s, loss 4.05"
    assert lines[-1].startswith("[target] 10/10 (100%) 0.1 step/s, elapsed 1m40s, ETA 0s")


def test_early_close_says_where_it_stopped(monkeypatch):
    monkeypatch.delenv("VSPEC_PROGRESS", raising=False)
    out, clock = io.StringIO(), Clock()
    p = Progress(100, "cells", unit="cell", stream=out, every_s=1e9, clock=clock)
    clock.t += 5
    p.update(2)
    p.close()
    assert out.getvalue() == "[cells] 2/100 (2%) 0.4 cell/s, elapsed 5s, ETA 4m05s\n"


def test_bar_on_a_terminal(monkeypatch):
    monkeypatch.delenv("VSPEC_PROGRESS", raising=False)
    out = Tty()
    with Progress(4, "drafters", stream=out) as p:
        assert p.mode == "bar"
        for _ in range(4):
            p.update(loss=1.5)
    text = out.getvalue()
    assert "drafters" in text and "4/4" in text and "step/s" in text and "loss=1.5" in text


def test_env_forces_a_mode_and_refuses_others(monkeypatch):
    monkeypatch.setenv("VSPEC_PROGRESS", "lines")
    assert Progress(1, "x", stream=Tty()).mode == "lines"
    monkeypatch.setenv("VSPEC_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match="VSPEC_PROGRESS"):
        Progress(1, "x", stream=io.StringIO())


def test_format_seconds():
    assert [format_seconds(s) for s in (0, 59.4, 75, 3725)] == ["0s", "59s", "1m15s", "1h02m05s"]
    assert format_seconds(float("nan")) == "?"


def test_quiet_off_a_terminal_when_the_caller_logs(monkeypatch):
    monkeypatch.delenv("VSPEC_PROGRESS", raising=False)
    out, msgs, clock = io.StringIO(), io.StringIO(), Clock()
    with Progress(3, "bench ab", unit="cell", stream=out, lines=False, clock=clock) as p:
        assert p.mode == "quiet"
        for _ in range(3):
            clock.t += 100
            p.update()
        p.write("[1/1] none: 3 cells", file=msgs)
    assert out.getvalue() == "" and msgs.getvalue() == "[1/1] none: 3 cells\n"
    tty = Tty()
    with Progress(1, "bench ab", stream=tty, lines=False) as p:
        assert p.mode == "bar"
        p.write("a line", file=msgs)
        p.update()
    assert "1/1" in tty.getvalue() and msgs.getvalue().endswith("a line\n")
