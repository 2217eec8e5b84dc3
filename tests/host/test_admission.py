"""Admission control (issue 19 item 3, ``--adaptive-refill-batch``) on the real CPU host:
in-process engines, the fixture draft pair at a fixed K = 2, 4 batch slots, 12 greedy
requests of 12 different lengths submitted at once (they finish one by one).

* Without admission control the host refills each freed slot at the next step: the decode
  batch grows back one request at a time, many times.
* With a cohort of 4 and a loose wait bound, the waiting requests are held until 4 slots are
  free (the engine empties here, since every request still has company): the batch grows in
  cohorts, at most one growth per cohort, and the decision trace records every held step
  (``{"step", "admission": {"held"}}``, ``held`` = the waiting requests, only while slots
  were free).
* With a wait bound of 2 no hold lasts more than 2 steps.
* Every output token is the same in all three (scheduling only, greedy).
"""

from __future__ import annotations

import json

import pytest
from plugin_helpers import close, engine_spec, load_prompts, make_llm, plugin_env, read_decisions

pytestmark = [pytest.mark.host, pytest.mark.slow]

SLOTS = 4
N = 12


def _run(fixtures_dir, tmp_path, name, **settings):
    from vllm import SamplingParams

    model, spec = engine_spec(fixtures_dir, "draft_model", 2)
    prompts = (load_prompts(fixtures_dir, "code") * 2)[:N]
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 3 * i, ignore_eos=True)
              for i in range(N)]
    trace = tmp_path / f"{name}.jsonl"
    with plugin_env(adaptive_policy="fixed", adaptive_fixed_gamma=2,
                    adaptive_trace_file=trace, **settings):
        llm = make_llm(model, spec, max_num_seqs=SLOTS)
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
        finally:
            close(llm)
    _, decisions, _ = read_decisions(trace)
    # admission control's records, {"step", "admission": {"held"}}, onto their steps' decisions
    held = {rec["step"]: rec["admission"]["held"]
            for rec in map(json.loads, trace.read_text().splitlines()) if "admission" in rec}
    for d in decisions:
        if d["step"] in held:
            d["held"] = held[d["step"]]
    return [list(o.outputs[0].token_ids) for o in outs], decisions


def _growths(decisions):
    """How often the decode batch grew from one step to the next."""
    batches = [d["batch"] for d in decisions]
    return sum(1 for a, b in zip(batches, batches[1:]) if b > a)


def _longest_hold(decisions):
    run = best = 0
    for d in decisions:
        run = run + 1 if d.get("held") else 0
        best = max(best, run)
    return best


def test_cohorts_refill_the_batch_and_change_no_token(fixtures_dir, tmp_path):
    off_tokens, off = _run(fixtures_dir, tmp_path, "off")
    on_tokens, on = _run(fixtures_dir, tmp_path, "cohort", adaptive_refill_batch=SLOTS,
                         adaptive_refill_max_wait_steps=1000)
    bound_tokens, bound = _run(fixtures_dir, tmp_path, "bound", adaptive_refill_batch=SLOTS,
                               adaptive_refill_max_wait_steps=2)
    print(f"growths: off {_growths(off)}, cohort {_growths(on)}, bound 2 {_growths(bound)}; "
          f"held steps: off {sum(1 for d in off if d.get('held'))}, "
          f"cohort {sum(1 for d in on if d.get('held'))}, "
          f"bound 2 {sum(1 for d in bound if d.get('held'))} "
          f"(longest {_longest_hold(bound)})")

    assert on_tokens == off_tokens and bound_tokens == off_tokens
    assert not any(d.get("held") for d in off)
    assert _growths(off) > _growths(on) + 2  # a freed slot is refilled at once, one by one
    # three cohorts of 4: the first starts an empty engine, two more follow
    assert _growths(on) <= N // SLOTS
    held = [d for d in on if d.get("held")]
    assert len(held) >= 2 * (SLOTS - 1)  # each later cohort waits for 3 slots to free up
    assert all(0 < d["batch"] < SLOTS for d in held)  # held only while slots were free
    assert all(d["held"] <= N - SLOTS for d in held)  # what waited
    assert 0 < _longest_hold(bound) <= 2
    assert _growths(bound) > _growths(on)  # the bound let requests in before the cohort
