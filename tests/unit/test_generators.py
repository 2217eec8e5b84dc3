"""Trace generators: every kind valid, carries p, and has the shape its name promises."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.generators import KINDS, generate
from vllm_hust_vspec.adaptive.simulate import read_trace, run_trace, write_trace

pytestmark = pytest.mark.unit


def _batches(trace, k=2):
    sizes = []
    run_trace(trace, lambda s, running, t: np.full(len(running), k), trace.header.seed, "probe",
              feedback=lambda s, running, *_: sizes.append(len(running)))
    return np.array(sizes)


@pytest.mark.parametrize("kind", KINDS)
def test_kind_is_valid_deterministic_and_round_trips(kind, tmp_path):
    trace = generate(kind, seed=3, scale=0.2)
    assert trace.has_p
    assert trace.has_conf == (kind == "hetero")
    assert trace.header.meta["generator"] == kind
    for r in trace.requests:
        assert r.p.shape == (len(r.accept_len), trace.header.kmax)
        assert 0 <= r.accept_len.min() and r.accept_len.max() <= trace.header.kmax
    again = generate(kind, seed=3, scale=0.2)
    assert [r.accept_len.tolist() for r in again.requests] == [r.accept_len.tolist() for r in trace.requests]
    other = generate(kind, seed=4, scale=0.2)
    assert [r.accept_len.tolist() for r in other.requests] != [r.accept_len.tolist() for r in trace.requests]
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    back = read_trace(path)
    assert back.header == trace.header
    for a, b in zip(back.requests, trace.requests):
        assert a.id == b.id and a.arrival_s == b.arrival_s
        assert np.array_equal(a.accept_len, b.accept_len) and np.array_equal(a.p, b.p)


@pytest.mark.parametrize("kind", KINDS)
def test_many_seeds_write_valid_traces(kind, tmp_path):
    for seed in range(8):
        path = tmp_path / f"{seed}.jsonl"
        write_trace(generate(kind, seed, scale=0.02), path)
        read_trace(path)  # raises TraceError on anything the format refuses


@pytest.mark.parametrize("kind", KINDS)
def test_acceptance_falls_with_position_and_matches_p(kind):
    trace = generate(kind, seed=0, scale=0.3)
    p = np.concatenate([r.p for r in trace.requests])
    acc = np.concatenate([r.accept_len for r in trace.requests])
    means = p.mean(axis=0)
    assert np.all(np.diff(means) < 0), means  # conditional acceptance decays with position
    # accept_len is drawn from p: P(accept_len >= 1) = mean p_1
    assert (acc >= 1).mean() == pytest.approx(means[0], abs=0.03)
    assert (acc >= 2).mean() == pytest.approx(np.mean(p[:, 0] * p[:, 1]), abs=0.03)


def test_stationary_levels_and_full_batch():
    hi = np.concatenate([r.p[:, 0] for r in generate("stationary-high", 1).requests]).mean()
    lo = np.concatenate([r.p[:, 0] for r in generate("stationary-low", 1).requests]).mean()
    assert hi > 0.78 and lo < 0.55
    trace = generate("stationary-high", 0)
    sizes = _batches(trace)
    assert np.mean(sizes == trace.header.max_num_seqs) > 0.5  # a saturated server, then the drain


def test_falling_acceptance_falls_along_each_output():
    trace = generate("falling", 0, scale=0.3)
    head = np.mean([r.p[: len(r.p) // 4, 0].mean() for r in trace.requests])
    tail = np.mean([r.p[-len(r.p) // 4:, 0].mean() for r in trace.requests])
    assert head > tail + 0.25


def test_hetero_has_easy_and_hard_requests_and_informative_conf():
    trace = generate("hetero", 0, scale=0.3)
    q = np.array([r.p[:, 0].mean() for r in trace.requests])
    assert (q > 0.8).mean() > 0.25 and (q < 0.45).mean() > 0.25
    p = np.concatenate([r.p for r in trace.requests]).ravel()
    c = np.concatenate([r.conf for r in trace.requests]).ravel()
    assert np.corrcoef(p, c)[0, 1] > 0.8


def test_phase_switches_regime_over_time():
    trace = generate("phase", 0)
    # batch-mean first-position acceptance per window of 100 steps swings between regimes
    means = []
    run_trace(trace, lambda s, running, t: np.full(len(running), 2), 0, "probe",
              feedback=lambda s, running, t, *_: means.append(
                  np.mean([trace.requests[i].p[j, 0] for i, j in zip(running, t)])))
    windows = np.array(means[: len(means) // 100 * 100]).reshape(-1, 100).mean(axis=1)
    assert windows.max() - windows.min() > 0.3
    assert ((windows > np.median(windows)).astype(int) != np.roll((windows > np.median(windows)).astype(int), 1)).sum() >= 3


def test_ramp_goes_one_to_max_to_one():
    trace = generate("ramp", 0)
    sizes = _batches(trace)
    peak = int(np.argmax(sizes))
    assert sizes[0] == 1 and sizes[-1] == 1 and sizes.max() == trace.header.max_num_seqs
    assert 0.15 * len(sizes) < peak < 0.85 * len(sizes)


def test_noisy_has_high_step_noise():
    assert generate("noisy", 0).header.cost.noise == pytest.approx(0.3)
    assert generate("stationary-high", 0).header.cost.noise == pytest.approx(0.05)


def test_unknown_kind_and_bad_scale():
    with pytest.raises(ValueError, match="unknown trace kind 'bursty'"):
        generate("bursty")
    with pytest.raises(ValueError, match="scale"):
        generate("ramp", scale=0)
