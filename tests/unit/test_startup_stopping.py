"""startup_cost/stopping.py: a stop signal during the start-up measurements is recorded, the
previous handler still runs, the next check ends them, and the handlers come back."""

from __future__ import annotations

import os
import signal

import pytest

from vllm_hust_vspec.startup_cost.stopping import StopSignals


@pytest.fixture
def own_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_signal_ends_the_measurements_at_the_next_check(own_handlers):
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    previous = signal.getsignal(signal.SIGTERM)
    with StopSignals("cost probe") as stop:
        stop.check()  # nothing yet
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]  # vLLM's handler (here: a stand-in) still ran
        with pytest.raises(SystemExit) as ended:
            stop.check()
    assert ended.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous


def test_ctrl_c_in_a_process_with_pythons_handler_still_interrupts(own_handlers):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with StopSignals("calibration") as stop:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(SystemExit) as ended:
            stop.check()
    assert ended.value.code == 128 + signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored(own_handlers):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with StopSignals("calibration") as stop:
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)
        stop.check()  # no stop
    assert stop.signum is None
