"""The in-engine paired comparison (runtime/rotation.py and adaptive_compare in the engine
runtime).  The engine part uses the stand-in scheduler of test_engine_runtime.py (the host's
``Scheduler`` needs a model to build); tests/host/test_compare.py runs it inside vLLM."""

from __future__ import annotations

import json

import pytest

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.runtime.engine import EngineRuntime
from vllm_hust_vspec.runtime.rotation import Rotation

from test_engine_runtime import run_step, scheduler

pytestmark = pytest.mark.unit


def test_every_policy_takes_every_position_and_each_window_has_its_decisions():
    rot = Rotation(["a", "b", "c"], window=4)
    order = [rot.decision(step) for step in range(1, 4 * 9 + 1)]
    windows = [order[i:i + 4] for i in range(0, len(order), 4)]
    assert all(len(set(w)) == 1 for w in windows)
    firsts = [w[0] for w in windows]
    assert firsts == [0, 1, 2, 1, 2, 0, 2, 0, 1]  # round r starts at policy r - 1
    for r in range(3):
        assert sorted(firsts[3 * r:3 * r + 3]) == [0, 1, 2]


def test_a_window_leaves_out_its_first_step_and_prefill_steps():
    rot = Rotation(["a", "b"], window=4)
    records = []
    for step in range(1, 9):
        rot.decision(step)
        records += rot.output(step, batch=2, tokens=5, cycle_ms=10.0,
                              prefill=step == 3)  # step 3 ran a prefill
    # window 1 (steps 1-4) is complete once a step of window 2 is out and none of its own
    # pends; windows of decisions are no waves: no whole-wave time
    assert records == [{"window": 1, "round": 1, "policy": "a", "steps": 2, "tokens": 10,
                        "ms": 20.0, "batch": 2.0, "by_batch": [[2, 2, 10, 20.0]],
                        "by_k": [], "policy_ms": 0.0}]


def test_steady_steps_are_kept_by_batch_and_k_as_geometric_means():
    """``by_k``: the measured steps the engine called steady (one K verified and drafted),
    by (batch, K), with their geometric mean time; the settling step, prefill steps and
    steps of no steady K stay out of it (they still count in ``by_batch``)."""
    rot = Rotation(["a", "b"], window=6)
    records = []
    plan = [(2, 10.0, 1, False), (2, 11.0, 1, False), (2, 41.0, 1, False),
            (3, 30.0, None, False), (2, 99.0, 1, True), (3, 12.0, 2, False)]
    for step, (batch, ms, k, prefill) in enumerate(plan, 1):
        rot.decision(step)
        # a step's own-work time (1 ms; 0.5 in the last) is kept apart, out of by_k's times
        records += rot.output(step, batch=batch, tokens=4, cycle_ms=ms, prefill=prefill,
                              steady_k=k, policy_ms=0.5 if step == 6 else 1.0)
    rot.decision(7)
    records += rot.output(7, batch=1, tokens=1, cycle_ms=5.0)
    (rec,) = records
    # step 1 settles, step 5 ran a prefill; steps 2 and 3: batch 2, K = 1, 10 and 40 ms less
    # their 1 ms each, geometric mean 20
    assert rec["by_k"] == [[2, 1, 2, 20.0], [3, 2, 1, 11.5]]
    assert rec["by_batch"] == [[2, 2, 8, 52.0], [3, 2, 8, 42.0]]
    assert rec["policy_ms"] == 3.5


def test_an_output_pending_across_the_boundary_holds_the_window_open():
    """Async scheduling: the next decision comes before the output of the step before."""
    rot = Rotation(["a", "b"], window=3)
    for step in (1, 2, 3, 4):
        rot.decision(step)
    out = []
    for step in (1, 2):
        out += rot.output(step, 1, 2, 5.0)
    assert out == []  # step 3 (window 1) still pending
    out += rot.output(3, 1, 2, 5.0)
    assert [r["window"] for r in out] == [1] and out[0]["steps"] == 2
    assert rot.policy_of(4) == 1


def test_bad_rotations_are_refused():
    with pytest.raises(ValueError, match="two policies"):
        Rotation(["a"], 8)
    with pytest.raises(ValueError, match="nothing to measure"):
        Rotation(["a", "b"], 2)


def _wave(rot, step, requests, steps=3):
    """``steps`` decisions of one wave of ``requests`` ((id, prompt) pairs); returns the
    next step number and the policies that decided."""
    got = []
    for _ in range(steps):
        step += 1
        got.append(rot.decision(step, requests))
    return step, got


def test_waves_a_round_holds_one_waves_replays_whatever_ran_before():
    """``adaptive_compare_waves``: a window per wave (every running request new); the replays
    of one wave's prompts fill one round, every policy once, the order shifted each round,
    also after requests that were never replayed (a warm-up)."""
    rot = Rotation(["a", "b", "c"], window=16, waves=True)
    step, warm = _wave(rot, 0, [("w1", [7, 7])])
    step, warm2 = _wave(rot, step, [("w2", [8])])
    assert len(set(warm)) == 1 and len(set(warm2)) == 1
    rounds = []
    for g in range(3):  # three waves of two requests, each sent once per policy
        got = []
        for rep in range(3):
            reqs = [(f"g{g}r{rep}x", [g, 1]), (f"g{g}r{rep}y", [g, 2])]
            step, ks = _wave(rot, step, reqs)
            assert len(set(ks)) == 1  # one policy decides the whole wave
            got.append(ks[0])
            assert rot._current.round == rot._by_step[step].round
        rounds.append(got)
    # the warm-up requests were rounds 1 and 2 (a window each); rounds 3-5 start one later each
    assert warm[0] == 0 and warm2[0] == 1
    assert rounds == [[2, 0, 1], [0, 1, 2], [1, 2, 0]]


def test_waves_a_wave_arriving_over_several_decisions_stays_one_window():
    rot = Rotation(["a", "b"], window=16, waves=True)
    step, first = _wave(rot, 0, [("x1", [1]), ("y1", [2])])
    step, idle = _wave(rot, step, [], steps=1)  # nothing running: no new window
    step, part = _wave(rot, step, [("x2", [1])], steps=1)  # the replay's first request
    step, rest = _wave(rot, step, [("x2", [1]), ("y2", [2])])
    assert idle == first[:1] and part[0] != first[0] and set(rest) == {part[0]}
    assert rot._current.round == 1  # a replay: the same round
    step, new = _wave(rot, step, [("z3", [3])])  # other prompts: a new round
    assert rot._current.round == 2


def test_waves_a_finished_wave_is_recorded_at_once_and_only_once():
    rot = Rotation(["a", "b"], window=16, waves=True)
    step, _ = _wave(rot, 0, [("x1", [1])], steps=2)
    out = []
    for s in (1, 2):
        out += rot.output(s, batch=1, tokens=3, cycle_ms=10.0)
    out += rot.close()  # every request finished
    assert [(r["window"], r["policy"], r["steps"], r["tokens"]) for r in out] == [(1, "a", 1, 3)]
    assert rot.close() == []
    step, ks = _wave(rot, step, [("x2", [1])], steps=2)  # the replay: the other policy
    assert set(ks) == {1}
    for s in (3, 4):
        out = rot.output(s, batch=1, tokens=2, cycle_ms=5.0)
        assert all(r["window"] != 1 for r in out)
    assert [r["window"] for r in rot.close()] == [2]


def test_a_waves_record_times_the_whole_wave_prefill_included():
    """With waves a window's record also carries every step of the wave (its prefill steps
    and its first step, which the decode measurement leaves out): the time a client waits
    for the wave; a step without a time (none) counts in neither."""
    rot = Rotation(["a", "b"], window=16, waves=True)
    step, _ = _wave(rot, 0, [("x1", [1]), ("y1", [2])], steps=5)
    out = []
    for s, (ms, prefill) in enumerate([(300.0, True), (40.0, True), (20.0, False),
                                       (22.0, False), (None, False)], 1):
        out += rot.output(s, batch=2, tokens=4, cycle_ms=ms, prefill=prefill)
    out += rot.close()
    (rec,) = out
    # decode measurement: step 3 is the first decode step but step 1 is the window's first
    # (settling) step, so steps 3 and 4 count
    assert (rec["steps"], rec["tokens"], rec["ms"]) == (2, 8, 42.0)
    assert (rec["wave_steps"], rec["wave_ms"]) == (4, 382.0)


def test_waves_without_compare_are_refused():
    with pytest.raises(settings_mod.SettingsError, match="adaptive_compare_waves"):
        settings_mod.validate(settings_mod.Settings({"adaptive_compare_waves": True}), "env")


def _compare_runtime(tmp_path, entries, window=4, **values):
    trace = tmp_path / "t.jsonl"
    sched = scheduler(kmax=4, n=2)
    settings = settings_mod.validate(settings_mod.Settings(
        {"adaptive_compare": tuple(entries), "adaptive_compare_window": window,
         "adaptive_trace_file": str(trace), **values}))
    return sched, EngineRuntime(sched, settings), trace


def test_the_engine_hands_each_window_to_its_policy_and_traces_its_speed(tmp_path):
    sched, rt, trace = _compare_runtime(tmp_path, ["fixed:1", "fixed:3"])
    assert rt.policy == "compare:fixed:1,fixed:3"
    drafted = dict.fromkeys(sched.requests, 0)
    ks = []
    for _ in range(16):
        k, drafted = run_step(rt, sched, drafted, accept=1)
        ks.append(k)
    assert ks == [1] * 4 + [3] * 4 + [3] * 4 + [1] * 4  # round 2 starts with the second
    ctl_1, ctl_3 = rt.controllers
    assert ctl_1.decisions == ctl_3.decisions == 8  # each decided its own windows only
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    windows = [r for r in records if "window" in r]
    assert [(w["window"], w["round"], w["policy"]) for w in windows] == [
        (1, 1, "fixed:1"), (2, 1, "fixed:3"), (3, 2, "fixed:3")]
    # 3 measured steps each; each step 2 requests x (1 token + 1 accepted draft)
    assert [(w["steps"], w["tokens"], w["batch"]) for w in windows] == [(3, 12, 2.0)] * 3
    assert all(w["ms"] > 0 for w in windows)
    # the measured steps verified and drafted at the window's fixed K; the stand-in
    # scheduler's steps take next to no time, the policy's own work (kept apart in
    # policy_ms, out of by_k's times) most of it, so a step may leave none for by_k
    assert [[row[:2] for row in w["by_k"]] for w in windows] == [[[2, 1]], [[2, 3]], [[2, 3]]]
    assert all(1 <= row[2] <= 3 and row[3] > 0 for w in windows for row in w["by_k"])
    assert all(0 < w["policy_ms"] <= w["ms"] for w in windows)
    decisions = [r for r in records if "k" in r and "policy" in r and "window" not in r]
    assert {(r["policy"], r["k"]) for r in decisions} == {("fixed", 1), ("fixed", 3)}


def test_zero_accepted_drafts_still_count_one_token_per_request(tmp_path):
    sched, rt, trace = _compare_runtime(tmp_path, ["fixed:0", "fixed:2"])
    drafted = dict.fromkeys(sched.requests, 0)
    for _ in range(9):
        _k, drafted = run_step(rt, sched, drafted, accept=0)
    windows = [json.loads(line) for line in trace.read_text().splitlines()
               if '"window"' in line]
    assert [(w["policy"], w["tokens"]) for w in windows] == [("fixed:0", 6), ("fixed:2", 6)]


@pytest.mark.parametrize("values, message", [
    ({"adaptive_compare": ("fixed:1",)}, "two or more"),
    ({"adaptive_compare": ("fixed:1", "fixed:1")}, "two or more"),
    ({"adaptive_compare": ("fixed:1", "sweep")}, "'sweep' is not a policy to compare"),
    ({"adaptive_compare": ("fixed:x", "online")}, "'fixed:x'"),
    ({"adaptive_compare": ("fixed:1", "online")}, "adaptive_trace_file"),
    ({"adaptive_compare": ("fixed:1", "online"), "adaptive_trace_file": "t",
      "adaptive_speculation": False}, "controller on"),
])
def test_bad_compare_settings_name_the_option(values, message):
    with pytest.raises(settings_mod.SettingsError, match=message) as err:
        settings_mod.validate(settings_mod.Settings(values), "env")
    assert "adaptive_compare" in str(err.value) or "adaptive_trace_file" in str(err.value)


def test_a_compared_fixed_k_above_kmax_is_refused():
    s = settings_mod.Settings({"adaptive_compare": ("fixed:5", "online"),
                               "adaptive_trace_file": "t"})
    with pytest.raises(settings_mod.SettingsError, match="'fixed:5' exceeds Kmax = 4"):
        settings_mod.check_kmax(s, 4)


def test_calibration_options_are_allowed_when_budget_is_compared():
    s = settings_mod.Settings({"adaptive_compare": ("fixed:2", "budget"),
                               "adaptive_trace_file": "t",
                               "adaptive_dspark_calibration": "grid.json"})
    settings_mod.validate(s)
    with pytest.raises(settings_mod.SettingsError, match="budget policy only"):
        settings_mod.validate(s.replace(adaptive_compare=("fixed:2", "online")))


def test_a_windows_first_step_teaches_its_policy_nothing(tmp_path):
    """The first step of a window verifies the previous policy's drafts: the deciding
    policy's controller gets neither their acceptance nor the step's time (alone it would
    have verified drafts of its own depth there)."""
    sched, rt, _ = _compare_runtime(tmp_path, ["fixed:1", "fixed:3"])
    seen = {id(c): [] for c in rt.controllers}
    for c in rt.controllers:
        observe = c.observe

        def spy(result, _c=c, _observe=observe):
            seen[id(_c)].append(result)
            _observe(result)

        c.observe = spy
    drafted = dict.fromkeys(sched.requests, 0)
    for _ in range(16):  # fixed:1, fixed:3 | fixed:3, fixed:1: windows of 4 steps
        _k, drafted = run_step(rt, sched, drafted, accept=1)
    ctl_1, ctl_3 = rt.controllers
    # fixed:3's first window began at step 5: that step verified fixed:1's drafts
    first = [r for r in seen[id(ctl_3)] if r.step == 5]
    assert len(first) == 1 and first[0].drafted is None and first[0].wall_ms is None
    # its other steps verified its own drafts (3 a request) and were timed, step 9 too
    # (the first of its second window, after its own first)
    own = [r for r in seen[id(ctl_3)] if r.step in (6, 7, 8, 9)]
    assert [int(r.drafted.sum()) for r in own] == [6, 6, 6, 6]
    assert all(r.wall_ms is not None for r in own)
    # fixed:1's window of round 2 began at step 13, after fixed:3's
    assert [r.drafted for r in seen[id(ctl_1)] if r.step == 13] == [None]
    assert int(next(r for r in seen[id(ctl_1)] if r.step == 14).drafted.sum()) == 2
