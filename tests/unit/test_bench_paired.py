"""The paired in-engine comparison's arithmetic (tools/bench_paired.py)."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_hust_vspec.tools.bench_paired import (
    PairedError,
    Window,
    markdown,
    summarize,
    summarize_waves,
    window_from_dict,
    windows_from_trace,
)

pytestmark = pytest.mark.unit


def _w(policy, rnd, tok_s, phase=0, server_round=1, ms=100.0, workload="code", conc=4):
    return Window(workload, conc, phase, server_round, 0, rnd, policy, 10,
                  round(tok_s * ms / 1000.0), ms, 4.0, 0.5)


def test_ratios_are_taken_inside_each_rotation_round():
    """The machine slows down by half in round 2: the pairs stay 1.1 and 0.9."""
    ws = []
    for rnd, speed in ((1, 1.0), (2, 0.5), (3, 1.0)):
        ws += [_w("fixed:1", rnd, 1000 * speed), _w("fixed:2", rnd, 900 * speed),
               _w("online", rnd, 1100 * speed)]
    (cell,) = summarize(ws)
    assert cell.best_fixed == "fixed:1"
    assert cell.row("online").ratio == pytest.approx(1.1, abs=1e-3)
    assert cell.row("fixed:2").ratio == pytest.approx(0.9, abs=1e-3)
    assert cell.row("online").rounds == 3
    assert cell.row("online").server_lo == pytest.approx(1.1, abs=1e-3)


def test_an_incomplete_round_is_not_paired():
    ws = [_w("fixed:1", 1, 1000), _w("online", 1, 500), _w("fixed:1", 2, 1000)]
    (cell,) = summarize(ws)
    assert cell.row("online").rounds == 1 and cell.row("online").ratio == pytest.approx(0.5)
    assert cell.row("fixed:1").tok_s == pytest.approx(1000.0)  # the unpaired window left out


def test_a_swing_composes_the_per_phase_best_fixed_k():
    """Phase 0: fixed:1 is best (1000 vs 800), phase 1: fixed:2 (1000 vs 600); online runs
    at 1000 in both: it equals the per-phase oracle although it beats each single fixed K."""
    ws = []
    for rnd in (1, 2):
        ws += [_w("fixed:1", rnd, 1000, phase=0), _w("fixed:2", rnd, 800, phase=0),
               _w("online", rnd, 1000, phase=0),
               _w("fixed:1", rnd, 600, phase=1), _w("fixed:2", rnd, 1000, phase=1),
               _w("online", rnd, 1000, phase=1)]
    (cell,) = summarize([w for w in ws])
    online = cell.row("online")
    assert online.phase_ratio == pytest.approx(1.0, abs=1e-3)
    assert online.ratio > 1.1  # above the single best fixed K
    assert cell.row("fixed:1").phase_ratio < 0.9


def _wb(policy, rnd, rows, server_round=1):
    """A window of rows (batch, steps, tok/ms at that batch, ms)."""
    rows = tuple((b, n, round(v * ms), ms) for b, n, v, ms in rows)
    steps = sum(r[1] for r in rows)
    return Window("code", 16, 0, server_round, 0, rnd, policy, steps,
                  sum(r[2] for r in rows), sum(r[3] for r in rows),
                  sum(r[0] * r[1] for r in rows) / steps, 0.5, rows)


def test_windows_are_compared_at_the_same_decoding_batch():
    """A load fills to batch 16 and drains: in each round fixed:1's window falls on batch 16
    (10 tok/ms there for every policy) and the others' on batch 1-2 (1-2 tok/ms). Pooled,
    fixed:1 looks 5x faster; at the same batch online is 10 % faster than both fixed Ks."""
    ws = []
    for rnd in (1, 2, 3):
        ws += [_wb("fixed:1", rnd, [(16, 8, 10.0, 100.0)]),
               _wb("fixed:2", rnd, [(2, 4, 2.0, 50.0), (1, 4, 1.0, 50.0)]),
               _wb("online", rnd, [(2, 4, 2.2, 50.0), (1, 4, 1.1, 50.0)])]
        ws += [_wb("fixed:1", rnd + 3, [(2, 4, 2.0, 50.0), (1, 4, 1.0, 50.0)]),
               _wb("fixed:2", rnd + 3, [(16, 8, 10.0, 100.0)]),
               _wb("online", rnd + 3, [(16, 8, 11.0, 100.0)])]
    (cell,) = summarize(ws)
    assert cell.row("online").ratio == pytest.approx(1.1, abs=0.01)
    assert cell.row("online").server_lo == pytest.approx(1.1, abs=0.01)
    assert cell.row("fixed:2").ratio == pytest.approx(1.0, abs=0.01)
    assert cell.row("online").tok_s / cell.row("fixed:1").tok_s == pytest.approx(1.1, abs=0.01)
    # without the rows (records written before them: one row at the mean batch) the same
    # windows still pair at their mean batches
    old = [Window(w.workload, w.concurrency, w.phase, w.server_round, w.window, w.round,
                  w.policy, w.steps, w.tokens, w.ms, w.batch, w.load_1m) for w in ws]
    assert summarize(old)[0].row("online").ratio > 1.0


def test_window_records_round_trip_and_bad_ones_are_named():
    recs = [{"trace": "vspec-decisions"},
            {"window": 3, "round": 1, "policy": "fixed:2", "steps": 7, "tokens": 40,
             "ms": 90.5, "batch": 4.0}]
    (w,) = windows_from_trace(recs, "mixed", 16, 1, 2, 0.4)
    assert (w.workload, w.concurrency, w.phase, w.server_round, w.policy) == (
        "mixed", 16, 1, 2, "fixed:2")
    assert window_from_dict(w.to_dict(), "w") == w
    assert w.by_batch == () and w.rows() == ((4, 7, 40, 90.5),)
    (wb,) = windows_from_trace([dict(recs[1], by_batch=[[4, 7, 40, 90.5]])], "mixed", 16, 1, 2)
    assert wb.by_batch == ((4, 7, 40, 90.5),) and window_from_dict(wb.to_dict(), "w") == wb
    with pytest.raises(PairedError, match=r"paired\[0\]: by_batch\[0\] must be \[batch"):
        window_from_dict(dict(wb.to_dict(), by_batch=[[4, 7, -1, 9.0]]), "paired[0]")
    # the rows at one K and the policy's own work (engine records since 297049e)
    (wk,) = windows_from_trace([dict(recs[1], by_k=[[4, 2, 5, 12.5]], policy_ms=1.5)],
                               "mixed", 16, 1, 2)
    assert wk.by_k == ((4, 2, 5, 12.5),) and wk.policy_ms == 1.5
    assert window_from_dict(wk.to_dict(), "w") == wk
    for row in ([4, 2, 5], [4, -2, 5, 12.5], [4, 2, 5, "12.5"], [4, 2.0, 5, 12.5]):
        with pytest.raises(PairedError, match=r"paired\[0\]: by_k\[0\] must be \[batch, K, "):
            window_from_dict(dict(wk.to_dict(), by_k=[row]), "paired[0]")
        with pytest.raises(PairedError, match=r"window record: by_k\[0\] must be"):
            windows_from_trace([dict(recs[1], by_k=[row])], "mixed", 16, 1, 2)
    for v in (-0.5, "1.5", float("nan")):
        with pytest.raises(PairedError, match=r"paired\[0\]: key 'policy_ms' must be a finite"):
            window_from_dict(dict(wk.to_dict(), policy_ms=v), "paired[0]")
        with pytest.raises(PairedError, match=r"window record 3: key 'policy_ms' must be"):
            windows_from_trace([dict(recs[1], policy_ms=v)], "mixed", 16, 1, 2)
    bad = dict(w.to_dict(), tokens=-1)
    with pytest.raises(PairedError, match=r"paired\[0\]: key 'tokens' must be an integer >= 0"):
        window_from_dict(bad, "paired[0]")
    with pytest.raises(PairedError, match="unknown key 'x'"):
        window_from_dict(dict(w.to_dict(), x=1), "paired[0]")


def test_whole_waves_give_the_end_to_end_ratio_which_the_decode_steps_overstate():
    """Every policy of a round served the same tokens: the ratio of whole-wave times
    (prefill steps included) is the end-to-end one. Decode: online 1.25 x fixed K = 0;
    with 1000 ms of prompts in each wave of 1000 + 500 / 400 ms: 1.5 / 1.4 = 1.071."""
    import dataclasses

    ws = []
    for rnd, slow in ((1, 1.0), (2, 2.0), (3, 1.0)):  # round 2 at half the machine speed
        for policy, decode_ms in (("fixed:0", 500.0), ("fixed:1", 420.0), ("online", 400.0)):
            w = _w(policy, rnd, 1000 * 500.0 / decode_ms / slow, ms=decode_ms * slow)
            ws.append(dataclasses.replace(w, wave_steps=20,
                                          wave_ms=(1000.0 + decode_ms) * slow))
    (cell,) = summarize(ws)
    assert cell.row("online").k0 == pytest.approx(1.25, abs=2e-3)
    (wave,) = summarize_waves(ws)
    assert wave.best_fixed == "fixed:1"
    online = next(r for r in wave.rows if r.policy == "online")
    assert online.k0 == pytest.approx(1500 / 1400) and online.rounds == 3
    assert online.ratio == pytest.approx(1420 / 1400) and online.phase_ratio is None
    text = markdown(ws)
    assert "### End to end: whole waves, prompts included" in text
    assert ("| code | 4 | fixed:1 | online | 1.014 [1.014-1.014] (3) | 1.014 | - | - "
            "| 1.071 [1.071-1.071] |") in text
    # records with their wave times round-trip; windows without them give no such table
    assert window_from_dict(ws[0].to_dict(), "w") == ws[0]
    with pytest.raises(PairedError, match="key 'wave_ms' must be a finite number >= 0"):
        window_from_dict(dict(ws[0].to_dict(), wave_ms=-1.0), "w")
    plain = [dataclasses.replace(w, wave_steps=None, wave_ms=None) for w in ws]
    assert summarize_waves(plain) == [] and "End to end" not in markdown(plain)
    # a swing: phase 0's best is fixed:1's 1000 ms, phase 1's fixed:2's 1000; online takes
    # 1000 in both, the per-phase oracle's time, above fixed:2 (the least in all)
    swing = []
    for rnd in (1, 2):
        for phase, times in ((0, {"fixed:1": 1000, "fixed:2": 1200, "online": 1000}),
                             (1, {"fixed:1": 1500, "fixed:2": 1000, "online": 1000})):
            swing += [dataclasses.replace(_w(p, rnd, 1000, phase=phase, workload="swing",
                                             conc="swing"), wave_steps=9, wave_ms=float(t))
                      for p, t in times.items()]
    (wave,) = summarize_waves(swing)
    online = next(r for r in wave.rows if r.policy == "online")
    assert wave.best_fixed == "fixed:2" and online.rounds == 4
    assert online.ratio == pytest.approx(1.1) and online.phase_ratio == pytest.approx(1.0)
    assert online.k0 is None


def test_the_report_section_names_the_best_fixed_k_and_the_load():
    ws = [_w("fixed:1", r, 1000) for r in (1, 2)] + [_w("online", r, 990) for r in (1, 2)]
    text = markdown(ws)
    assert "| code | 4 | fixed:1 | online | 990.0 | 0.990 [0.990-0.990] (2) |" in text
    assert "Load average (1 min) before each server: 0.50." in text
    assert markdown([]) == ""


def test_fixed_k0_gives_every_policy_its_ratio_to_target_only_steps():
    """Where fixed K = 0 takes turns, each policy's index over its, per rotation round: the
    machine halves its speed in round 2 and online stays 1.25 x K = 0 (1.25, 1.25, 1.3:
    median 1.25, quartiles 1.25-1.275); without fixed:0 no ratio and a '-' in the report."""
    ws = []
    for rnd, speed, on in ((1, 1.0, 1000), (2, 0.5, 500), (3, 1.0, 1040)):
        ws += [_w("fixed:0", rnd, 800 * speed), _w("fixed:2", rnd, 1000 * speed),
               _w("online", rnd, on)]
    (cell,) = summarize(ws)
    online = cell.row("online")
    assert online.k0 == pytest.approx(1.25, abs=1e-3)
    assert (online.k0_q1, online.k0_q3) == (pytest.approx(1.25, abs=1e-3),
                                            pytest.approx(1.275, abs=1e-3))
    assert cell.row("fixed:0").k0 == pytest.approx(1.0)
    assert cell.best_fixed == "fixed:2"  # K = 0 is one of the fixed Ks, here not the best
    text = markdown(ws)
    assert "| 1.250 [1.250-1.275] |" in text and "`/ fixed K = 0`" in text
    (plain,) = summarize([w for w in ws if w.policy != "fixed:0"])
    assert plain.row("online").k0 is None
    assert markdown([w for w in ws if w.policy != "fixed:0"]).splitlines()[-1].endswith("| - |")


def test_a_phase_splits_into_waves_of_its_concurrency():
    from vllm_hust_vspec.tools.bench_driver import waves
    from vllm_hust_vspec.tools.bench_workloads import Phase

    phase = Phase(4, tuple(range(10)))
    got = waves(phase)
    assert [w.requests for w in got] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    assert {w.concurrency for w in got} == {4}


def test_the_held_out_best_fixed_k_is_timed_on_rounds_it_was_not_picked_on():
    """Both phases of a swing: fixed:3 serves 1010 tok/s every round, fixed:1 and fixed:2
    1000 but each lucky once (1300) in a different round; online serves 1000. Picked and
    timed on the same rounds, each phase's best fixed K is a lucky one (1075 pooled): online
    0.930 of it. Picked on one half of the rounds and timed on the other, the pick is
    either fixed:3 (1010) or a K whose lucky round was in the picking half (1000 where it is
    timed): online 0.990-1.0 of it per phase; end to end the same. Under
    two rounds a phase nothing is held out."""
    speeds = {"fixed:1": (1300, 1000, 1000, 1000), "fixed:2": (1000, 1300, 1000, 1000),
              "fixed:3": (1010,) * 4, "online": (1000,) * 4}
    ws = []
    for phase in (0, 1):
        for rnd in range(4):
            for policy, s in speeds.items():
                w = _w(policy, rnd + 1, s[rnd], phase=phase, workload="swing", conc="swing",
                       ms=1000.0)
                ws.append(dataclasses.replace(w, wave_steps=10,
                                              wave_ms=1000.0 * 1000.0 / s[rnd]))
    (cell,) = summarize(ws)
    online = cell.row("online")
    assert online.phase_ratio == pytest.approx(1000 / 1075, abs=2e-3)
    assert 1000 / 1010 - 2e-3 <= online.phase_held_out <= 1.0 + 2e-3
    # over the whole cell a K lucky in one phase's picking half can be timed on its other
    # phase's lucky round: still above the in-sample figure
    assert cell.row("online").held_out > 0.95
    (wave,) = summarize_waves(ws)
    online_wave = next(r for r in wave.rows if r.policy == "online")
    # (waves compose times: the lucky K's phase took 1000 / 1.3 + 3 x 1000 ms)
    assert online_wave.phase_ratio == pytest.approx((1000 / 1.3 + 3000) / 4000)
    assert 1000 / 1010 - 1e-9 <= online_wave.phase_held_out <= 1.0 + 1e-9
    assert "| 0.930 | 0.99" in markdown(ws)  # / per-phase best, then held out
    (one,) = summarize([w for w in ws if w.round == 1])
    assert one.row("online").held_out is None and one.row("online").phase_held_out is None
