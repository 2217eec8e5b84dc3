#!/usr/bin/env python
"""Admission control (``--adaptive-refill-batch``, issue 19 item 3) against none, on bursty
arrivals, paired run by run.

Two engines live in one process, built alike but for admission control: the plugin's
default policy (``online``) without it, and with ``--adaptive-refill-batch`` (default 0: the
method's cohort, 8 for the draft model, 4 for EAGLE).  Each round draws one arrival schedule
(a gamma process as vLLM's serving benchmark draws it: ``--rate`` requests/s, shape
``--burstiness``, below 1 = bursts and lulls) of ``--requests`` greedy requests from the
fixture prompts, and plays it on both engines back to back, the order alternating (ABBA):
requests join the engine at their arrival times, the engine steps while it has work, sleeps
while it has none.  Per run: output tok/s (output tokens / time from the first arrival to
the last finish), mean and 90th-percentile TTFT (arrival to first token), mean TPOT.  The
ratios (with / without) of a round pair the two runs of one schedule.  Run it alone on the
machine; it records the load average after each round::

    .venv/bin/python scripts/bench_admission.py [--method draft|eagle] [--rounds 4]
        [--requests 48] [--rate 3] [--burstiness 0.2] [--refill-batch 0] [--max-num-seqs 16]
        [--max-tokens 64] [--fixtures DIR] [--json OUT.json]

``--method draft`` runs the large fixture pair (target-large + draft), ``eagle`` the small
target with its EAGLE head.  A cell whose min-max ratio spread is above 10 % judges nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

from inprocess import fixture_prompts, missing, plugin_engines

from vllm_hust_vspec.tools.fixture_dir import fixtures_dir


def arrivals(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Arrival times (s from the start) of ``n`` requests: gamma inter-arrival times of mean
    1/rate and shape ``burstiness`` (vLLM's serving benchmark draws them so), the first at 0."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return list(np.cumsum(gaps))


def play(llm, prompts: list[str], times: list[float], max_tokens: int) -> dict:
    """Play one arrival schedule on ``llm``'s engine; the run's figures."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    tokens: dict[str, int] = {}
    nxt = 0
    tag = f"{id(llm)}-{start}"
    while len(done) < len(times):
        now = time.perf_counter() - start
        while nxt < len(times) and times[nxt] <= now:
            rid = f"{tag}-{nxt}"
            engine.add_request(rid, prompts[nxt], sp)
            arrived[rid] = start + times[nxt]
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(0.05, times[nxt] - now)))
            continue
        for out in engine.step():
            t = time.perf_counter()
            rid = out.request_id
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            if n and rid not in first:
                first[rid] = t
            if out.finished:
                done[rid] = t
                tokens[rid] = n
    last = max(done.values())
    from vllm_hust_vspec.runtime.engine import runtime_of

    admission = runtime_of(engine.engine_core.engine_core.scheduler).admission
    ttft = sorted(first[r] - arrived[r] for r in arrived)
    tpot = [(done[r] - first[r]) / (tokens[r] - 1) for r in arrived if tokens[r] > 1]
    return {"output_tok_s": sum(tokens.values()) / (last - start),
            "ttft_mean_ms": 1000 * statistics.fmean(ttft),
            "ttft_p90_ms": 1000 * ttft[int(0.9 * (len(ttft) - 1))],
            "tpot_mean_ms": 1000 * statistics.fmean(tpot),
            "tokens": sum(tokens.values()),
            "held_steps_so_far": 0 if admission is None else admission.holds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("draft", "eagle"), default="draft")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=3.0, help="mean arrivals per second")
    ap.add_argument("--burstiness", type=float, default=0.2,
                    help="gamma shape of the inter-arrival times (1 = Poisson, < 1 = bursty)")
    ap.add_argument("--refill-batch", type=int, default=0,
                    help="--adaptive-refill-batch of the engine with admission control")
    ap.add_argument("--max-wait-steps", type=int, default=8,
                    help="--adaptive-refill-max-wait-steps of that engine")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--fixtures")
    ap.add_argument("--json", help="write the per-round figures here")
    args = ap.parse_args(argv)
    if min(args.rounds, args.requests, args.max_num_seqs, args.max_tokens) < 1 \
            or args.rate <= 0 or args.burstiness <= 0 or args.refill_batch < 0:
        ap.error("--rounds, --requests, --max-num-seqs, --max-tokens >= 1; --rate and "
                 "--burstiness > 0; --refill-batch >= 0")
    fixtures = fixtures_dir(args.fixtures)
    target = fixtures / ("target-large" if args.method == "draft" else "target")
    head = fixtures / ("draft" if args.method == "draft" else "eagle")
    if missing(target, head):
        return 2
    plugin_engines(2)
    import torch
    from vllm import LLM

    spec = {"method": "draft_model" if args.method == "draft" else "eagle", "model": str(head),
            "num_speculative_tokens": 4}
    common = dict(model=str(target), dtype="float32", max_model_len=1024,
                  max_num_seqs=args.max_num_seqs, enforce_eager=True, seed=0,
                  enable_prefix_caching=False, speculative_config=spec)
    # each engine reads the plugin's settings from the environment when its scheduler is built
    os.environ.pop("HUST_VSPEC_ADAPTIVE_REFILL_BATCH", None)
    off = LLM(**common)
    os.environ["HUST_VSPEC_ADAPTIVE_REFILL_BATCH"] = str(args.refill_batch)
    os.environ["HUST_VSPEC_ADAPTIVE_REFILL_MAX_WAIT_STEPS"] = str(args.max_wait_steps)
    on = LLM(**common)
    os.environ.pop("HUST_VSPEC_ADAPTIVE_REFILL_BATCH")
    pool = fixture_prompts(fixtures)
    for llm in (off, on):  # warm-up: one short schedule each
        play(llm, pool[:4], [0.0, 0.0, 0.1, 0.2], 16)
    keys = ("output_tok_s", "ttft_mean_ms", "ttft_p90_ms", "tpot_mean_ms")
    runs: list[dict] = []
    loads: list[float] = []
    for r in range(args.rounds):
        times = arrivals(args.requests, args.rate, args.burstiness, seed=r)
        prompts = [pool[(r * args.requests + i) % len(pool)] for i in range(args.requests)]
        got = {}
        for name, llm in ((("off", off), ("on", on)) if r % 2 == 0 else (("on", on), ("off", off))):
            got[name] = play(llm, prompts, times, args.max_tokens)
        loads.append(round(os.getloadavg()[0], 2))
        ratio = {k: got["on"][k] / got["off"][k] for k in keys}
        runs.append({"off": got["off"], "on": got["on"], "ratio": ratio, "load": loads[-1]})
        print(f"round {r + 1}/{args.rounds}: with/without " + ", ".join(
            f"{k} {v:.3f}" for k, v in ratio.items()) + f" (load {loads[-1]})",
            file=sys.stderr, flush=True)
    table = {}
    for k in keys:
        v = [run["ratio"][k] for run in runs]
        med = statistics.median(v)
        table[k] = {"median": round(med, 4), "min": round(min(v), 4), "max": round(max(v), 4),
                    "spread": round((max(v) - min(v)) / med, 4),
                    "off_median": round(statistics.median(run["off"][k] for run in runs), 2),
                    "on_median": round(statistics.median(run["on"][k] for run in runs), 2)}
        print(f"{args.method} cohort {args.refill_batch or 'method'}: {k}: without "
              f"{table[k]['off_median']}, with {table[k]['on_median']}, ratio median {med:.3f} "
              f"(min {min(v):.3f}, max {max(v):.3f}, spread {table[k]['spread']:.1%})")
    print(f"load average (1 min) after each round: {loads}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"method": args.method, "refill_batch": args.refill_batch,
             "max_wait_steps": args.max_wait_steps, "requests": args.requests,
             "rate": args.rate, "burstiness": args.burstiness,
             "max_num_seqs": args.max_num_seqs, "max_tokens": args.max_tokens,
             "ratios": table, "runs": runs, "load_average": loads,
             "torch_threads": torch.get_num_threads()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
