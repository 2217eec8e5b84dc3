"""``scripts/replay_paired_prices.py`` on a paired trace written here: fixed K = 0..2 and
online (trying K = 0..2 in turn) take turns at batch 2, step times from a known roofline."""

from __future__ import annotations

import json
import pathlib

import pytest
from conftest import load_script

from paired_traces import TOKENS, header
from paired_traces import step as trace_step

pytestmark = pytest.mark.unit

replay_paired_prices = load_script("replay_paired_prices")

B = 2
# K = 1 commits the most tokens a millisecond: 2, 4 and 5 tokens a step in 20, 31 and 42 ms
# (paired_traces: TOKENS accepted per request, roofline_ms)


def _trace(path: pathlib.Path) -> None:
    recs = [header()]
    step = 0
    for _round in range(4):
        for policy in ("fixed:0", "fixed:1", "fixed:2", "online"):
            for _ in range(6):
                k = int(policy.split(":")[1]) if policy != "online" else step % 3
                recs += trace_step(step, k, B, policy)
                step += 1
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def test_prices_from_the_same_roofline_pick_the_best_fixed_k(tmp_path, capsys):
    path = tmp_path / "paired.jsonl"
    _trace(path)
    errors, picks = replay_paired_prices.replay(str(path))
    assert len(errors) == len(picks) > 0
    assert max(errors) < 0.01  # the model learnt the roofline the steps came from
    assert min(picks) == pytest.approx(1.0)  # K = 1, the best fixed
    assert replay_paired_prices.main([str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert "all: " in out and "picked K's goodput / best fixed 1.0000" in out


def test_a_trace_without_a_header_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"step": 0, "k": 1, "batch": 1, "policy": "online"}) + "\n")
    with pytest.raises(SystemExit, match="header: not a decision trace"):
        replay_paired_prices.replay(str(path))


class _FlatPrices:
    """Prices every K of a step alike (a step-cost model that knows nothing), so the replay
    picks the K with the most tokens a step: K = 2 in both cells below."""

    ready = True
    draft_min_steps = 0

    def predict_uniform(self, batch, ks):
        return [30.0 for _ in ks]

    def add(self, *args, **kwargs):
        pass


def test_near_judges_each_decision_by_its_own_cells_fixed_ks(tmp_path, capsys, monkeypatch):
    """Two cells in one server: in the first K = 1 commits the most tokens a millisecond,
    in the second (drafts accepted whole) K = 2.  Prices that pick K = 2 everywhere lose in
    the first cell; pooled over the server the fixed Ks' steps name K = 2 the best for both
    cells and hide it, ``--near`` judges each decision by the fixed steps of its own cell."""
    recs = [header()]
    step = 0
    for accepted in (TOKENS, {0: 0.0, 1: 1.0, 2: 2.0}):
        for _round in range(4):
            for policy in ("fixed:0", "fixed:1", "fixed:2", "online"):
                for _ in range(6):
                    k = int(policy.split(":")[1]) if policy != "online" else step % 3
                    recs += trace_step(step, k, B, policy, accepted)
                    step += 1
    path = tmp_path / "two-cells.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    monkeypatch.setattr(replay_paired_prices, "StepCostModel", _FlatPrices)
    _errors, pooled = replay_paired_prices.replay(str(path))
    _errors, near = replay_paired_prices.replay(str(path), near=40)
    assert min(pooled) == pytest.approx(1.0)  # K = 2 pooled: 5.5 tokens in 42 ms, K = 1 4 in 31
    # the first cell's decisions: K = 2 (5 tokens in 42 ms) against K = 1 (4 in 31)
    assert min(near) == pytest.approx((5 / 42) / (4 / 31))
    assert max(near) == pytest.approx(1.0)  # the second cell's
    assert replay_paired_prices.main([str(path), "--near", "40"]) == 0
    assert "picked K's goodput / best fixed 0.9" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        replay_paired_prices.main([str(path), "--near", "0"])
