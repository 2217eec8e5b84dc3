"""``tools/quiet.py``: waiting for the load average before a timed server (bench ab
--quiet-load).  The load average is the operating system's; these tests feed the function a
scripted sequence of readings and a fake clock instead (nothing of vLLM runs here)."""

from __future__ import annotations

import pytest

from vllm_hust_vspec.tools.quiet import load_1m, wait_for_quiet

pytestmark = pytest.mark.unit


class _Clock:
    def __init__(self, loads):
        self.t = 0.0
        self.loads = list(loads)
        self.said = []

    def read(self):
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]

    def sleep(self, s):
        self.t += s

    def now(self):
        return self.t


def _wait(c: _Clock, max_load: float, timeout: float):
    return wait_for_quiet(max_load, timeout, say=c.said.append, read=c.read, sleep=c.sleep,
                          now=c.now, poll=2.0)


def test_a_quiet_machine_is_not_waited_for():
    c = _Clock([0.4])
    assert _wait(c, 1.0, 300) == (0.4, 0.0)
    assert c.said == [] and c.t == 0.0


def test_it_waits_until_the_load_falls_to_the_level():
    """The previous server's tail: 1.9, 1.6, 1.3, then 0.95 after three polls of 2 s."""
    c = _Clock([1.9, 1.6, 1.3, 0.95, 0.5])
    load, waited = _wait(c, 1.0, 300)
    assert load == 0.95 and waited == pytest.approx(6.0)
    assert len(c.said) == 1 and "fall to 1 (now 1.9" in c.said[0]


def test_it_gives_up_after_the_timeout_and_says_so():
    c = _Clock([2.0])
    load, waited = _wait(c, 1.0, 7)
    assert load == 2.0 and waited == pytest.approx(7.0)
    assert len(c.said) == 2 and "still 2 after 7 s" in c.said[1]


def test_the_real_reading_is_a_number():
    assert load_1m() is None or load_1m() >= 0.0
