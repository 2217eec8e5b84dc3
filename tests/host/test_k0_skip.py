"""K = 0 without a drafter forward, and exact resume (patches drafter-k0, eagle-k0 and
dflash-k0: the draft model, EAGLE, EAGLE-3, MTP, DSpark on the DFlash proposer).

One real CPU engine per run, float32, greedy.  The ``sweep`` policy forces K = 0 stretches
of 1, 8 and 64 steps between K > 0 steps.  A run with ``adaptive_k0_drafter=skip`` (the
drafter sits out every K = 0 step and catches up before the next draft) must give, step by
step, the same drafted and accepted counts as a run with ``adaptive_k0_drafter=run`` (the
host's own K = 0 forward: a drafter that never sat out), and the same tokens as target-only.
A third case adds requests that arrive and finish during the stretches (4 slots for 10
prompts, two of them twice: prefix-cache hits), chunked prefill (a 48-token step budget) and
preemption (a KV cache of 24 blocks).  The draft model runs every case; the EAGLE family
(whose catch-up reads the target hidden states kept by KV slot) and DSpark (whose catch-up
writes the context K/V of the missed positions from them, no drafter forward) batch 8 and
the last case.
"""

from __future__ import annotations

import json

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
    """The proposer of an in-process engine (its sync state is on it)."""
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    return executor.driver_worker.worker.model_runner.drafter


def _run(fixtures, method, prompts, mode, trace, **engine):
    model, spec = engine_spec(fixtures, method, KMAX)
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
    caught = {rec["step"]: rec["drafter"]["caught_up"]
              for rec in map(json.loads, trace.read_text().splitlines())
              if isinstance(rec.get("drafter"), dict)}
    # what each K > 0 decision was told it would catch up, and what it did (a batch K > 0
    # drafts every row, K_i = 0 ones too)
    resumes = [(d.get("catch_up", 0), caught.get(d["step"], 0)) for d in decisions
               if d["k"] > 0 and (d.get("catch_up") or caught.get(d["step"]))]
    return {"tokens": tokens, "results": [(r["step"], r["drafted"], r["accepted"]) for r in results],
            "ks": [d["k"] for d in decisions], "sync": sync, "preemptions": len(preemptions),
            "trace_skipped": sum(d["skipped"] for d in drafter),
            "trace_caught_up": sum(d["caught_up"] for d in drafter), "resumes": resumes}


_TARGET_ONLY: dict[tuple, tuple] = {}


def _target(model, prompts, **engine):
    """Target-only tokens, served once per target, prompts and engine arguments (the
    drafters that share a target share its reference)."""
    key = (model, tuple(prompts), tuple(sorted(engine.items())))
    if key not in _TARGET_ONLY:
        with plugin_env(enabled=False):
            llm = make_llm(model, **engine)
            try:
                _TARGET_ONLY[key] = greedy(llm, prompts, MAX_TOKENS), prompt_ids(llm, prompts)
            finally:
                close(llm)
    return _TARGET_ONLY[key]


def _check(fixtures, method, prompts, tmp_path, noisy=False, **engine):
    model, _ = engine_spec(fixtures, method, KMAX)
    expected, ids = _target(model, prompts, **engine)
    skip = _run(fixtures, method, prompts, "skip", tmp_path / "skip.jsonl", **engine)
    run = _run(fixtures, method, prompts, "run", tmp_path / "run.jsonl", **engine)
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
    if noisy:
        # the same drafted counts every step; acceptance equal but for near-ties (see below)
        assert [r[:2] for r in skip["results"]] == [r[:2] for r in run["results"]]
        differ = sum(a != b for a, b in zip(skip["results"], run["results"]))
        acc_skip, acc_run = (sum(r[2] for r in x["results"]) for x in (skip, run))
        assert differ <= 0.02 * len(run["results"]) and abs(acc_skip - acc_run) <= 0.03 * acc_run
    else:
        assert skip["results"] == run["results"]  # the same drafts, so the same acceptance
    assert_lossless(expected, skip["tokens"], ids, model)
    assert skip["tokens"] == run["tokens"]
    s = skip["sync"]
    assert s.enabled and s.steps_skipped > 0 and s.tokens_caught_up > 0
    assert (s.rows is not None) == (method != "draft_model")
    assert not run["sync"].enabled and run["sync"].steps_skipped == 0
    # the decision trace's account (engine side) is the workers' own
    assert (skip["trace_skipped"], skip["trace_caught_up"]) == (s.steps_skipped, s.tokens_caught_up)
    assert (run["trace_skipped"], run["trace_caught_up"]) == (0, 0)
    # the policy is told before each resume what it will catch up (ledger.pending): the
    # decoding requests' missed tokens; a step may catch up more, for requests that were
    # still prefilling in chunks (they are not in the decision's batch)
    resumes = skip["resumes"]
    assert resumes and all(told <= did for told, did in resumes), resumes
    if "max_num_batched_tokens" not in engine:
        assert all(told == did for told, did in resumes), resumes
    assert not any(d.get("catch_up") for d in read_decisions(tmp_path / "run.jsonl")[1])
    accepted = sum(r[2] for r in skip["results"])
    print(f"{method}: K = 0 steps skipped {s.steps_skipped}, catch-up passes {s.passes_caught_up} over "
          f"{s.tokens_caught_up} tokens; accepted {accepted} (without skipping "
          f"{sum(r[2] for r in run['results'])}); preemptions {skip['preemptions']}")
    assert accepted > 0
    return skip, run


EAGLE_FAMILY = ("eagle", "eagle3", "mtp")
HIDDEN = EAGLE_FAMILY + ("dspark",)  # the drafters that read the target's hidden states


@pytest.mark.parametrize(("method", "batch"), [("draft_model", 1), ("draft_model", 8)]
                         + [(m, 8) for m in HIDDEN])
def test_drafts_after_k0_stretches_are_those_of_a_drafter_that_never_skipped(
        fixtures_dir, tmp_path, method, batch):
    prompts = mixed_prompts(fixtures_dir, 8)[:batch]
    _check(fixtures_dir, method, prompts, tmp_path, max_num_seqs=8)


@pytest.mark.parametrize("method", ("draft_model",) + HIDDEN)
def test_arrivals_chunked_prefill_and_preemption_during_k0_stretches(fixtures_dir, tmp_path,
                                                                     method):
    """A request restarted after preemption is caught up from 0, its prefix-cache hit too:
    those positions' drafter KV is computed again in other batch shapes than the host's
    passes.  float32 GEMMs on this CPU are not batch-invariant below 16 rows (a 768-wide
    Linear, as EAGLE-3's combine_hidden_states: 6e-7 apart), so near-tie drafts may flip:
    measured, EAGLE-3 differed in 4 of ~300 steps (142 vs 138 accepted; 0 without prefix
    caching, 0 without preemption).  There the drafted counts stay equal and the acceptance
    within 3%; the other methods measured exact and are held to it."""
    prompts = (mixed_prompts(fixtures_dir, 8) + mixed_prompts(fixtures_dir, 8)[:2])
    skip, _ = _check(fixtures_dir, method, prompts, tmp_path, noisy=method == "eagle3",
                     max_num_seqs=4,
                     max_num_batched_tokens=48, enable_chunked_prefill=True,
                     num_gpu_blocks_override=24, block_size=32)
    assert skip["preemptions"] > 0


def test_a_fault_in_the_skip_falls_back_to_the_hosts_drafter(fixtures_dir, tmp_path, monkeypatch):
    """A fault in our own worker code (injected into HiddenRows.put, the plugin's, at its 40th
    call; vLLM itself is untouched) never takes the engine down: the worker logs it, drops the
    skip and its hidden-state table, the host's drafter runs from then on, and every token
    still equals target-only."""
    from vllm_hust_vspec.runtime.hidden_rows import HiddenRows

    model, _ = engine_spec(fixtures_dir, "eagle", KMAX)
    prompts = mixed_prompts(fixtures_dir, 8)[:4]
    expected, ids = _target(model, prompts, max_num_seqs=4)
    put, calls = HiddenRows.put, []

    def failing(self, slots, rows):
        calls.append(1)
        if len(calls) == 40:
            raise RuntimeError("fault injected into HiddenRows.put")
        return put(self, slots, rows)

    monkeypatch.setattr(HiddenRows, "put", failing)
    out = _run(fixtures_dir, "eagle", prompts, "skip", tmp_path / "fault.jsonl", max_num_seqs=4)
    assert_lossless(expected, out["tokens"], ids, model)
    s = out["sync"]
    assert len(calls) == 40 and s.faults == 1 and not s.enabled and s.rows is None
    assert s.steps_skipped > 0  # it had skipped before the fault
