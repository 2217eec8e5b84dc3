"""The paired comparison at a common machine speed (tools/paired_speed.py): windows made of
steps whose time is a cost per (batch, K) times the machine's speed in that window."""

from __future__ import annotations

import json
import math
import random

import pytest

from vllm_hust_vspec.tools import paired_speed
from vllm_hust_vspec.tools.bench_paired import Window, markdown, summarize, summarize_waves

pytestmark = pytest.mark.unit

COST = {(4, 1): 40.0, (4, 2): 46.0, (4, 3): 52.0}  # ms per step at batch 4
TOKENS = {1: 7.0, 2: 9.2, 3: 10.0}  # tokens per step at batch 4 (the texts' acceptance)
# steps per window at each K: online holds K = 2 and tries its neighbours
PLAN = {"fixed:1": {1: 20}, "fixed:2": {2: 20}, "fixed:3": {3: 20},
        "online": {1: 3, 2: 14, 3: 3}}


def _window(policy, rnd, speed, number, overhead=1.0, own_ms=None):
    """A window at machine speed ``speed``; its steps at the same batch and K take
    ``overhead`` x the others' (a record's by_k times), plus ``own_ms`` a step of the
    policy's own work (recorded as ``policy_ms``, out of the by_k times)."""
    ms = {k: COST[(4, k)] * speed * overhead for k in PLAN[policy]}
    steps = sum(PLAN[policy].values())
    tokens = round(sum(n * TOKENS[k] for k, n in PLAN[policy].items()))
    own = 0.0 if own_ms is None else own_ms * steps
    total = sum(n * ms[k] for k, n in PLAN[policy].items()) + own
    return Window("code", 4, 0, 1, number, rnd, policy, steps, tokens, total, 4.0, 0.5,
                  ((4, steps, tokens, total),), wave_steps=steps + 2,
                  wave_ms=total + 300.0 * speed,
                  by_k=tuple((4, k, n, ms[k]) for k, n in sorted(PLAN[policy].items())),
                  policy_ms=None if own_ms is None else own)


def _run(speeds, overhead=1.0, own_ms=None):
    """Rounds of the four policies, window i at the machine speed ``speeds[i]``; online's
    steps ``overhead`` x and ``own_ms`` (fixed Ks: a tenth of it)."""
    ws = []
    for i, speed in enumerate(speeds):
        p = ("fixed:1", "fixed:2", "fixed:3", "online")[i % 4]
        online = p == "online"
        ws.append(_window(p, i // 4 + 1, speed, i + 1, overhead if online else 1.0,
                          None if own_ms is None else own_ms if online else own_ms / 10))
    return ws


def _true_online_ratio():
    steps = PLAN["online"]
    return (sum(n * TOKENS[k] for k, n in steps.items())
            / sum(n * COST[(4, k)] for k, n in steps.items())) / (TOKENS[2] / COST[(4, 2)])


def test_a_windows_machine_speed_is_taken_out_of_its_time():
    """The windows ran 0.8-1.25 x apart: measured, online's ratio to the best fixed K (K =
    2: 9.2/46 against 7/40 and 10/52) moves with them by round; at the common speed it is
    the ratio of its K mix, in every round."""
    rng = random.Random(3)
    speeds = [math.exp(rng.gauss(0.0, 0.1)) for _ in range(24)]
    ws = _run(speeds)
    (raw,) = summarize(ws)
    want = _true_online_ratio()
    assert raw.row("online").q3 - raw.row("online").q1 > 0.05  # the machine, by round
    adjusted, effects = paired_speed.at_common_speed(ws)
    (cell,) = summarize(adjusted)
    assert cell.best_fixed == "fixed:2"
    online = cell.row("online")
    assert online.q1 == pytest.approx(want, abs=0.01) and online.q3 == pytest.approx(want, abs=0.01)
    assert cell.row("fixed:1").ratio == pytest.approx((7 / 40) / (9.2 / 46), abs=0.01)
    # the fitted effects: the speeds' logs about their mean, shrunk by the prior step
    u = paired_speed.speed_effects(ws)
    logs = [math.log(s) for s in speeds]
    mean = sum(logs) / len(logs)
    for got, want_u in zip(u, logs):
        assert got == pytest.approx((want_u - mean) * 20 / 21, abs=0.01)
    assert effects["online"].effect == pytest.approx(0.0, abs=0.05)
    # end to end too: a wave's prompt steps ran at the window's speed as well
    (wave,) = summarize_waves(adjusted)
    row = {r.policy: r for r in wave.rows}["online"]
    assert row.q3 - row.q1 < 0.02


def test_a_policys_own_work_stays_in_its_time():
    """Online spends 1.5 ms a step on its own work (observation, decision, records), the
    fixed Ks 0.15: the engine records it apart, and at the common speed it stays as
    measured while the machine's speed goes."""
    rng = random.Random(5)
    ws = _run([math.exp(rng.gauss(0.0, 0.1)) for _ in range(48)], own_ms=1.5)
    adjusted, effects = paired_speed.at_common_speed(ws)
    assert paired_speed.policy_ms_per_step(ws) == pytest.approx(
        {"online": 1.5, "fixed:1": 0.15, "fixed:2": 0.15, "fixed:3": 0.15})
    (cell,) = summarize(adjusted)
    steps = PLAN["online"]
    want = ((sum(n * TOKENS[k] for k, n in steps.items())
             / sum(n * (COST[(4, k)] + 1.5) for k, n in steps.items()))
            / (TOKENS[2] / (COST[(4, 2)] + 0.15)))
    assert cell.row("online").q1 == pytest.approx(want, abs=0.005)
    assert cell.row("online").q3 == pytest.approx(want, abs=0.005)
    # its steps otherwise cost what the fixed Ks' do: the check says so, within the noise
    assert set(effects) == {"online"} and abs(effects["online"].effect) < 0.1
    assert effects["online"].windows == 12 and effects["online"].stderr > 0


def test_a_record_without_the_policys_own_time_shows_it_in_the_check():
    """Records written before ``policy_ms``: online's steps take 3 % longer at the same
    batch and K; the check reports about that (its windows' speeds averaged out)."""
    rng = random.Random(7)
    ws = _run([math.exp(rng.gauss(0.0, 0.05)) for _ in range(400)], overhead=1.03)
    _adjusted, effects = paired_speed.at_common_speed(ws)
    assert math.exp(effects["online"].effect) == pytest.approx(1.03, abs=0.015)
    assert paired_speed.policy_ms_per_step(ws) == {}


def test_a_window_without_steady_steps_keeps_its_time_and_one_step_moves_little():
    ws = _run([1.0] * 24)
    bare = Window(**{**ws[1].__dict__, "by_k": ()})
    one = Window(**{**ws[5].__dict__, "by_k": ((4, 2, 1, 46.0 * 1.5),)})
    u = paired_speed.speed_effects([ws[0], bare] + ws[2:5] + [one] + ws[6:])
    assert u[1] == 0.0
    # one step 1.5 x its cell: half its log after the prior step's weight, less the centring
    assert u[5] == pytest.approx(math.log(1.5) / 2, abs=0.03)
    adjusted, _ = paired_speed.at_common_speed([ws[0], bare] + ws[2:])
    assert adjusted[1].ms == pytest.approx(bare.ms, rel=0.01)


def test_rows_are_rebuilt_from_a_waves_trace():
    """A trace written before the engine kept ``by_k``: each window's steady steps are the
    steps between two window records whose decision kept the K, batch and policy of the one
    before, measured (no prefill) and without a catch-up."""
    recs = [{"trace": "vspec-decisions"}]
    plan = [  # step, batch, k, policy, ms (None: prefill), catch-up
        (1, 1, 2, "fixed", None, False), (2, 4, 2, "fixed", 50.0, False),
        (3, 4, 2, "fixed", 40.0, False), (4, 4, 2, "fixed", 90.0, True),
        (5, 4, 2, "fixed", 62.5, False), (6, 3, 2, "fixed", 30.0, False)]
    for step, batch, k, policy, ms, catch_up in plan:
        recs.append({"step": step, "batch": batch, "k": k, "policy": policy, "reason": "x"})
        res = {"step": step, "drafted": 8, "accepted": 4, "ms": ms}
        if catch_up:
            res["catch_up_ms"] = ms
            res["ms"] = None
        recs.append(res)
    recs.append({"window": 1, "round": 1, "policy": "fixed:2"})
    recs.append({"step": 7, "batch": 3, "k": 1, "policy": "online", "reason": "x"})
    recs.append({"step": 7, "drafted": 6, "accepted": 2, "ms": 33.0})  # K and policy changed
    recs.append({"step": 8, "batch": 3, "k": 1, "policy": "online", "reason": "x"})
    recs.append({"step": 8, "drafted": 3, "accepted": 2, "ms": 25.0})
    recs.append({"window": 2, "round": 1, "policy": "online"})
    rows = paired_speed.by_k_from_trace(json.loads(json.dumps(recs)))
    # window 1: steps 3 and 5 (2: the batch changed; 4: a catch-up; 6: the batch changed)
    assert rows == {1: [[4, 2, 2, 50.0]], 2: [[3, 1, 1, 25.0]]}


def test_the_report_adds_the_common_speed_tables_only_with_rows():
    """The section prints each policy's own work a step, the check of its other effect and
    the ratios at the common speed."""
    ws = _run([1.0, 1.2, 0.9, 1.1, 1.05, 0.95] * 4, own_ms=0.5)
    text = markdown(ws)
    assert "## At a common machine speed" in text and "### End to end at the common speed" in text
    assert "fixed:1 0.050, fixed:2 0.050, fixed:3 0.050, online 0.500 ms a step" in text
    (effect,) = paired_speed.policy_effects(ws).values()
    assert f"online {math.exp(effect.effect):.3f} (+-{effect.stderr:.3f}, 6 windows)" in text
    (row,) = [line for line in text.split("## At a common machine speed")[1].splitlines()
              if line.startswith("| code | 4 | fixed:2 | online |")]
    median = float(row.split("|")[6].split()[0])
    steps = PLAN["online"]
    want = ((sum(n * TOKENS[k] for k, n in steps.items())
             / sum(n * (COST[(4, k)] + 0.5) for k, n in steps.items()))
            / (TOKENS[2] / (COST[(4, 2)] + 0.05)))
    # within the prior's shrinkage: a window 20 % off keeps about 1 % of it
    assert median == pytest.approx(want, abs=0.015)
    bare = [Window(**{**w.__dict__, "by_k": ()}) for w in ws]
    assert "common machine speed" not in markdown(bare)
