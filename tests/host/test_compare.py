"""The paired in-engine comparison (``adaptive_compare``) inside a real CPU engine.

fixed K = 1, fixed K = 3 and online take turns in windows of 6 decisions while 8 greedy
requests decode: the output equals target-only (every policy is lossless, and so are their
switches), the fixed windows decide exactly their K, each policy's windows are traced with
the tokens the engine produced in them, and their tokens add up to what the measured steps
of the run produced (from the controllers' own result records).
"""

from __future__ import annotations

import pytest

from plugin_helpers import (
    assert_lossless,
    close,
    engine_spec,
    greedy,
    make_llm,
    mixed_prompts,
    plugin_env,
    prompt_ids,
    read_decisions,
    runtime_of,
)
from vllm_hust_vspec.adaptive.trace import is_decision

pytestmark = [pytest.mark.host, pytest.mark.slow]

KMAX = 3
MAX_TOKENS = 64
POLICIES = ("fixed:1", "fixed:3", "online")
WINDOW = 6


def _target_only(fixtures_dir, prompts):
    """The target's greedy outputs and the prompts' token ids (the lossless reference)."""
    with plugin_env(enabled=False):
        llm = make_llm(fixtures_dir / "target", max_num_seqs=8)
        try:
            return greedy(llm, prompts, MAX_TOKENS), prompt_ids(llm, prompts)
        finally:
            close(llm)


def test_policies_take_turns_losslessly_and_each_window_is_measured(fixtures_dir, tmp_path):
    prompts = mixed_prompts(fixtures_dir, 8)
    expected, ids = _target_only(fixtures_dir, prompts)
    trace = tmp_path / "compare.jsonl"
    model, spec = engine_spec(fixtures_dir, "draft_model", KMAX)
    with plugin_env(adaptive_compare=",".join(POLICIES), adaptive_compare_window=WINDOW,
                    adaptive_trace_file=trace):
        llm = make_llm(model, spec, max_num_seqs=8)
        try:
            rt = runtime_of(llm)
            assert rt.policy == "compare:" + ",".join(POLICIES)
            assert [c.config.policy for c in rt.controllers] == ["fixed", "fixed", "online"]
            got = greedy(llm, prompts, MAX_TOKENS)
        finally:
            close(llm)
    assert_lossless(expected, got, ids, fixtures_dir / "target")

    records = [r for r in _lines(trace)]
    windows = [r for r in records if "window" in r]
    assert {w["policy"] for w in windows} == set(POLICIES)
    assert all(w["tokens"] >= w["steps"] * w["batch"] - 1e-6 for w in windows)
    assert sum(w["steps"] for w in windows) > 20 and all(w["ms"] >= 0 for w in windows)
    # the decisions follow the rotation: window n's decisions are its policy's
    _, decisions, _ = read_decisions(trace)
    by_step = {d["step"]: d for d in decisions}
    order = _rotation(len(by_step))
    for step, d in by_step.items():
        policy = order[step - 1]
        if policy == "fixed:1":
            assert d["k"] == 1, (step, d)
        elif policy == "fixed:3":
            assert d["k"] == 3, (step, d)
        else:
            assert d["policy"] == "online"
    print("windows:", [(w["policy"], w["steps"], w["tokens"], w["ms"]) for w in windows])


def _rotation(n: int) -> list[str]:
    """The policy of each decision, as runtime/rotation.py orders the windows."""
    out: list[str] = []
    w = 0
    while len(out) < n:
        rnd = w // len(POLICIES)
        out += [POLICIES[(w % len(POLICIES) + rnd) % len(POLICIES)]] * WINDOW
        w += 1
    return out


def _lines(path):
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_is_decision_ignores_window_records():
    assert not is_decision({"window": 1, "round": 1, "policy": "fixed:1", "steps": 3,
                            "tokens": 9, "ms": 1.0, "batch": 3.0})


def test_waves_every_policy_serves_the_same_texts(fixtures_dir, tmp_path):
    """``adaptive_compare_waves``: each prompt sent once per policy (batch 1, one after the
    other, as ``bench ab --paired-waves`` sends a wave): a window per request, each round one
    prompt's replays under both policies, every replay's output the target's."""
    prompts = mixed_prompts(fixtures_dir, 3)
    expected, ids = _target_only(fixtures_dir, prompts)
    trace = tmp_path / "waves.jsonl"
    model, spec = engine_spec(fixtures_dir, "draft_model", KMAX)
    policies = ("fixed:1", "fixed:3")
    with plugin_env(adaptive_compare=",".join(policies), adaptive_compare_waves=True,
                    adaptive_trace_file=trace):
        llm = make_llm(model, spec, max_num_seqs=4)
        try:
            replays = [[greedy(llm, [p], MAX_TOKENS)[0] for _ in policies] for p in prompts]
        finally:
            close(llm)
    for i, outs in enumerate(replays):
        assert_lossless([expected[i]] * len(policies), outs, [ids[i]] * len(policies),
                        fixtures_dir / "target")
    windows = [r for r in _lines(trace) if "window" in r]
    print("windows:", [(w["round"], w["policy"], w["steps"], w["tokens"]) for w in windows])
    by_round: dict[int, list[dict]] = {}
    for w in windows:
        by_round.setdefault(w["round"], []).append(w)
    # every window is recorded when its wave ends, the last one too, with the whole wave's
    # time: its prefill step and its first step besides the measured decode steps
    assert len(windows) == len(prompts) * len(policies)
    assert all(w["wave_steps"] >= w["steps"] + 1 and w["wave_ms"] > w["ms"] for w in windows)
    rounds = sorted(by_round)
    assert len(rounds) == len(prompts)
    for r in rounds:
        assert sorted(w["policy"] for w in by_round[r]) == sorted(policies), by_round[r]
    # each window decided its own K: fixed K = 1 verified one draft a step, fixed K = 3 three
    _, decisions, _ = read_decisions(trace)
    assert {d["k"] for d in decisions} == {1, 3}
    # the same text: a round's fixed K = 3 window needs fewer steps than its fixed K = 1 one
    for r in rounds:
        steps = {w["policy"]: w["steps"] for w in by_round[r]}
        assert steps["fixed:3"] < steps["fixed:1"], by_round[r]
