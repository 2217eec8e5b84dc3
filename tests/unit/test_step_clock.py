"""The engine cycle time the controller sees (runtime/step_clock.py): window + overhead."""

from __future__ import annotations

import pytest

from vllm_hust_vspec.runtime.step_clock import StepClock

pytestmark = pytest.mark.unit


def test_overhead_between_output_and_decision_is_added_to_each_window():
    clock = StepClock()
    t = 0.0
    cycles = []
    for _ in range(50):
        clock.decided(t)
        t += 0.020  # 20 ms window
        window = clock.output(t - 0.020, t)
        cycles.append(clock.cycle_ms(window))
        t += 0.002  # 2 ms engine overhead before the next decision
    assert window == pytest.approx(20.0)
    assert clock.gaps == 49
    assert clock.gap_ms == pytest.approx(2.0)
    assert cycles[0] == pytest.approx(20.0)  # no overhead seen yet
    assert cycles[-1] == pytest.approx(22.0)


def test_idle_gap_longer_than_the_window_is_not_overhead():
    clock = StepClock()
    clock.decided(0.0)
    clock.output(0.0, 0.010)
    clock.decided(0.012)  # 2 ms: overhead
    assert clock.gap_ms == pytest.approx(2.0)
    clock.output(0.012, 0.022)
    clock.decided(5.0)  # the engine idled for ~5 s: ignored
    assert clock.gap_ms == pytest.approx(2.0)
    assert clock.gaps == 1
    clock.output(5.0, 5.010)
    clock.reset()  # steps the clock did not see (e.g. calibration): the open gap is dropped
    clock.decided(5.011)
    assert clock.gaps == 1


def test_overhead_follows_a_slow_change():
    clock = StepClock()
    t = 0.0
    for gap in [0.001] * 20 + [0.004] * 60:
        clock.decided(t)
        t += 0.010
        clock.output(t - 0.010, t)
        t += gap
    assert clock.gap_ms == pytest.approx(4.0, rel=0.01)
