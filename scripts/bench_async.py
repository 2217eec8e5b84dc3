#!/usr/bin/env python
"""The controller under asynchronous scheduling, on this CPU host, paired call by call.

vLLM turns async scheduling on by default for EAGLE, MTP and draft models on GPU hosts; its
CPU platform forces it off and the CPU build of torch has no CUDA streams or events, which
the V1 runner's async path uses.  This benchmark keeps async scheduling on with the test
suite's imitation of those two and nothing else (``tests/host/cpu_async.py``: no-op streams
and events; on the CPU every kernel has finished when it returns).  The scheduler, the
engine core's batch queue (two steps in flight), the runner's async path and the plugin are
the real ones.  What it measures: the decisions the controller makes with a step of
latency between a decision and the drafts it sees (``budget`` reads the confidences of the
drafts of step s to decide step s+2), not what async scheduling saves on a GPU.

One engine per configuration, all in this process, all with async scheduling
(``--scheduling sync`` runs the same engines with the host's synchronous scheduling, no
imitation, for the rows to compare with):
``none`` (target-only, no speculative config), ``fixed:K`` (the plugin at a fixed K),
``online``, ``budget`` (its start-up calibration runs when the engine is built).  Every ``generate()`` call of a cell runs on every engine
back to back, the order rotating, so the machine's speed drift hits all alike; a round's
ratio is target-only time / configuration time over the same prompts and tokens (= the
output tok/s ratio).  Run it alone on the machine; it prints the load average after each
round::

    .venv/bin/python scripts/bench_async.py [--method dspark|draft] [--gamma 5] [--scheduling async|sync]
        [--configs none,fixed:3,fixed:5,online,budget] [--batches 1,4,8] [--rounds 3]
        [--calls 4] [--max-tokens 64] [--prompts fixture|mixed] [--fixtures DIR] [--json OUT.json]

``--prompts mixed`` serves the code and hard prompts alternating (every batch holds easy and
hard requests, ``bench ab``'s ``mixed``); ``fixture`` the code prompts, then the prose ones.

A cell whose min-max spread is above 10 % judges nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import time

from inprocess import (fixture_prompts, missing, mixed_prompts, paired_batches, plugin_engines,
                       speculative_pair)

from vllm_hust_vspec.tools.fixture_dir import fixtures_dir

REPO = pathlib.Path(__file__).resolve().parents[1]


def _configs(ap: argparse.ArgumentParser, raw: str, gamma: int) -> list[str]:
    out = []
    for item in (x.strip() for x in raw.split(",")):
        if item in ("none", "online", "budget"):
            out.append(item)
        elif item.startswith("fixed:") and item[6:].isdigit() and 0 <= int(item[6:]) <= gamma:
            out.append(item)
        elif item:
            ap.error(f"--configs: {item!r} is not none, fixed:K (0 <= K <= --gamma {gamma}), "
                     "online or budget")
    if "none" not in out or len(out) < 2:
        ap.error("--configs needs none (the baseline) and one configuration more")
    return out


def _plugin_env(config: str) -> dict[str, str]:
    """The HUST_VSPEC_* settings of one configuration's engine (none: no speculative
    config, so the plugin stays out of it)."""
    if config == "none":
        return {}
    if config.startswith("fixed:"):
        return {"ADAPTIVE_POLICY": "fixed", "ADAPTIVE_FIXED_GAMMA": config[6:]}
    return {"ADAPTIVE_POLICY": config}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("dspark", "draft"), default="dspark")
    ap.add_argument("--gamma", type=int, default=5, help="Kmax (the DSpark block width)")
    ap.add_argument("--scheduling", choices=("async", "sync"), default="async")
    ap.add_argument("--configs", default="none,fixed:3,fixed:5,online,budget")
    ap.add_argument("--batches", default="1,4,8", help="concurrencies (one generate() call each)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=4, help="paired generate() calls per cell")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", choices=("fixture", "mixed"), default="fixture",
                    help="fixture: code, then prose; mixed: code and hard alternating")
    ap.add_argument("--fixtures")
    ap.add_argument("--json", help="write the per-round ratios here")
    args = ap.parse_args(argv)
    if args.gamma < 1:
        ap.error(f"--gamma {args.gamma}: must be >= 1")
    configs = _configs(ap, args.configs, args.gamma)
    batches = paired_batches(ap, args)
    fixtures = fixtures_dir(args.fixtures)
    model, spec, needed = speculative_pair(fixtures, args.method, args.gamma)
    if missing(*needed):
        return 2
    plugin_engines(1)
    asynchronous = args.scheduling == "async"
    if asynchronous:
        sys.path.insert(0, str(REPO / "tests" / "host"))
        from cpu_async import async_scheduling_on_cpu  # the imitation of CUDA streams/events
    else:
        async_scheduling_on_cpu = contextlib.nullcontext
    import torch
    from vllm import LLM, SamplingParams

    common = dict(model=str(model), dtype="float32", max_model_len=1024,
                  max_num_seqs=max(batches), enforce_eager=True, seed=0,
                  enable_prefix_caching=False, async_scheduling=asynchronous)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = mixed_prompts(fixtures) if args.prompts == "mixed" else fixture_prompts(fixtures)
    with async_scheduling_on_cpu():
        engines = {}
        for config in configs:
            saved = dict(os.environ)
            os.environ.update({f"HUST_VSPEC_{k}": v
                               for k, v in _plugin_env(config).items()})
            try:
                t = time.perf_counter()
                engines[config] = (LLM(**common) if config == "none"
                                   else LLM(speculative_config=spec, **common))
                print(f"{config}: engine ready in {time.perf_counter() - t:.0f} s",
                      file=sys.stderr, flush=True)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            core = engines[config].llm_engine.engine_core.engine_core
            if (type(core.scheduler).__name__ == "AsyncScheduler") != asynchronous:
                raise SystemExit(f"error: {config}: the engine runs {type(core.scheduler).__name__} "
                                 f"(asked: {args.scheduling} scheduling)")

        def seconds(llm, batch: list[str]) -> float:
            t = time.perf_counter()
            llm.generate(batch, sp, use_tqdm=False)
            return time.perf_counter() - t

        for llm in engines.values():  # warm-up
            seconds(llm, prompts[:2])
        others = [c for c in configs if c != "none"]
        ratios = {(c, b): [] for c in others for b in batches}
        loads: list[float] = []
        at = 0
        for r in range(args.rounds):
            for b in batches:
                spent = dict.fromkeys(configs, 0.0)
                for call in range(args.calls):
                    batch = [prompts[(at + i) % len(prompts)] for i in range(b)]
                    at += b
                    shift = (call + r) % len(configs)
                    for config in configs[shift:] + configs[:shift]:  # the order rotates
                        spent[config] += seconds(engines[config], batch)
                for c in others:
                    ratios[(c, b)].append(spent["none"] / spent[c])
            loads.append(round(os.getloadavg()[0], 2))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{c}@{b} {v[-1]:.3f}" for (c, b), v in ratios.items()) + f" (load {loads[-1]})",
                file=sys.stderr, flush=True)
    table: dict[str, dict[str, dict]] = {}
    print(f"{args.method}, Kmax {args.gamma}, {args.scheduling} scheduling, {args.prompts} prompts: "
          f"output tok/s over target-only "
          f"(median of {args.rounds} rounds [min-max], spread)")
    for (c, b), v in ratios.items():
        med = statistics.median(v)
        spread = (max(v) - min(v)) / med
        table.setdefault(c, {})[str(b)] = {
            "median": round(med, 4), "min": round(min(v), 4), "max": round(max(v), 4),
            "spread": round(spread, 4), "rounds": [round(x, 4) for x in v]}
        print(f"  {c:>8} @ {b:<2}: {med:.3f} [{min(v):.3f}-{max(v):.3f}] {spread:.1%}")
    print(f"load average (1 min) after each round: {loads}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"method": args.method, "gamma": args.gamma, "async_scheduling": asynchronous,
             "prompts": args.prompts,
             "max_tokens": args.max_tokens, "calls": args.calls, "ratios": table,
             "load_average": loads, "torch_threads": torch.get_num_threads()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
