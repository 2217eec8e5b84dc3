"""K = 0 without a drafter forward, and exact resume (patch drafter-k0, the draft model).

One real CPU engine per run, float32, greedy.  The ``sweep`` policy forces K = 0 stretches
of 1, 8 and 64 steps between K > 0 steps.  A run with ``adaptive_k0_drafter=skip`` (the
drafter sits out every K = 0 step and catches up before the next draft) must give, step by
step, the same drafted and accepted counts as a run with ``adaptive_k0_drafter=run`` (the
host's own K = 0 forward: a drafter that never sat out), and the same tokens as target-only.
A third case adds requests that arrive and finish during the stretches (4 slots for 10
prompts), chunked prefill (a 48-token step budget) and preemption (a KV cache of 24 blocks).
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
    read_drafter_records,
)

pytestmark = [pytest.mark.host, pytest.mark.slow]

KMAX = 3
MAX_TOKENS = 128
# K = 0 stretches of 1, 8 and 64 steps, each between K > 0 steps
SWEEP = [3, 3, 0, 3, 2] + [0] * 8 + [3, 1, 3] + [0] * 64 + [2, 3, 3, 0, 1]


def drafter_of(llm):
    """The draft-model proposer of an in-process engine (its sync state is on it)."""
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    return executor.driver_worker.worker.model_runner.drafter


def _run(fixtures, prompts, mode, trace, **engine):
    model, spec = engine_spec(fixtures, "draft_model", KMAX)
    preemptions = []
    with plugin_env(adaptive_policy="sweep", adaptive_sweep=SWEEP, adaptive_k0_drafter=mode,
                    adaptive_trace_file=trace):
        llm = make_llm(model, spec, **engine)
        try:
            scheduler = llm.llm_engine.engine_core.engine_core.scheduler
            preempt = scheduler._preempt_request

            def counted(*args, **kwargs):  # observes the host's preemptions
                preemptions.append(1)
                return preempt(*args, **kwargs)

            scheduler._preempt_request = counted
            tokens = greedy(llm, prompts, MAX_TOKENS)
            sync = drafter_of(llm).__dict__.get("_vspec_drafter_sync")
        finally:
            close(llm)
    _, decisions, results = read_decisions(trace)
    drafter = read_drafter_records(trace)
    return {"tokens": tokens, "results": [(r["step"], r["drafted"], r["accepted"]) for r in results],
            "ks": [d["k"] for d in decisions], "sync": sync, "preemptions": len(preemptions),
            "trace_skipped": sum(d["skipped"] for d in drafter),
            "trace_caught_up": sum(d["caught_up"] for d in drafter)}


def _target(fixtures, prompts, **engine):
    with plugin_env(enabled=False):
        llm = make_llm(fixtures / "target", **engine)
        out = greedy(llm, prompts, MAX_TOKENS), prompt_ids(llm, prompts)
        close(llm)
    return out


def _check(fixtures, prompts, tmp_path, **engine):
    expected, ids = _target(fixtures, prompts, **engine)
    skip = _run(fixtures, prompts, "skip", tmp_path / "skip.jsonl", **engine)
    run = _run(fixtures, prompts, "run", tmp_path / "run.jsonl", **engine)
    assert skip["ks"] == run["ks"]
    # every stretch happened and was followed by drafting again
    runs, n = [], 0
    for k in skip["ks"]:
        if k == 0:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    assert {1, 8, 64} <= set(runs), runs
    assert skip["results"] == run["results"]  # the same drafts, so the same acceptance
    assert_lossless(expected, skip["tokens"], ids, fixtures / "target")
    assert skip["tokens"] == run["tokens"]
    s = skip["sync"]
    assert s.enabled and s.steps_skipped > 0 and s.tokens_caught_up > 0
    assert not run["sync"].enabled and run["sync"].steps_skipped == 0
    # the decision trace's account (engine side) is the workers' own
    assert (skip["trace_skipped"], skip["trace_caught_up"]) == (s.steps_skipped, s.tokens_caught_up)
    assert (run["trace_skipped"], run["trace_caught_up"]) == (0, 0)
    accepted = sum(r[2] for r in skip["results"])
    print(f"K = 0 steps skipped {s.steps_skipped}, catch-up passes {s.passes_caught_up} over "
          f"{s.tokens_caught_up} tokens; accepted {accepted} (equal in both runs); "
          f"preemptions {skip['preemptions']}")
    assert accepted > 0
    return skip, run


@pytest.mark.parametrize("batch", [1, 8])
def test_drafts_after_k0_stretches_are_those_of_a_drafter_that_never_skipped(
        fixtures_dir, tmp_path, batch):
    prompts = mixed_prompts(fixtures_dir, 8)[:batch]
    _check(fixtures_dir, prompts, tmp_path, max_num_seqs=8)


def test_arrivals_chunked_prefill_and_preemption_during_k0_stretches(fixtures_dir, tmp_path):
    prompts = (mixed_prompts(fixtures_dir, 8) + mixed_prompts(fixtures_dir, 8)[:2])
    skip, _ = _check(fixtures_dir, prompts, tmp_path, max_num_seqs=4,
                     max_num_batched_tokens=48, enable_chunked_prefill=True,
                     num_gpu_blocks_override=24, block_size=32)
    assert skip["preemptions"] > 0
