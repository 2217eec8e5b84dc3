#!/usr/bin/env python
"""What K = 0 costs over target-only, on the large fixture pair, paired call by call.

Two engines live in one process: target-only (no speculative config) and the plugin at a
fixed K = 0 (``--method draft``: target-large + draft; ``--method dspark``: target-large + the
DSpark drafter; ``--method mtp``: mtp-large, whose baseline is mtp-large without
speculation).  ``--k0-drafter run`` measures the host's own K = 0 (its drafter forward runs)
instead of the plugin's skip. Every ``generate()`` call of a cell runs on both
engines back to back, the order alternating (ABBA), so the machine's speed drift (this VM's
moves 10-20 % within minutes) hits both alike; a round's ratio is target-only time / plugin
time over the same prompts and tokens (= the output tok/s ratio). Prefix caching is off in
both (the prompts repeat across rounds and vLLM recomputes the last cached block for EAGLE
and MTP, which is a cost of the speculative config, not of K = 0). Run it alone on the
machine; it prints the load average after each round::

    .venv/bin/python scripts/bench_k0_tax.py [--method draft|dspark|mtp] [--rounds 4]
        [--batches 1,4,16] [--max-tokens 64] [--k0-drafter skip|run] [--fixtures DIR]
        [--json OUT.json]

The issue's goal is a median ratio >= 0.98 at every batch; a cell whose min-max spread is
above 10 % judges nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

from inprocess import (METHODS, fixture_prompts, missing, paired_batches, plugin_engines,
                       speculative_pair)

from vllm_hust_vspec.tools.fixture_dir import fixtures_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=sorted(METHODS), default="draft")
    ap.add_argument("--k0-drafter", choices=("skip", "run"), default="skip",
                    help="the plugin's K = 0 skip (default) or the host's K = 0 forward")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batches", default="1,4,16", help="concurrencies (one generate() call each)")
    ap.add_argument("--calls", type=int, default=8, help="paired generate() calls per cell")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--fixtures")
    ap.add_argument("--json", help="write the per-round ratios here")
    args = ap.parse_args(argv)
    batches = paired_batches(ap, args)
    fixtures = fixtures_dir(args.fixtures)
    model, spec, needed = speculative_pair(fixtures, args.method, 4)
    if missing(*needed):
        return 2
    plugin_engines(1, adaptive_policy="fixed", adaptive_fixed_gamma="0",
                   adaptive_k0_drafter=args.k0_drafter)
    import torch
    from vllm import LLM, SamplingParams

    common = dict(model=str(model), dtype="float32", max_model_len=1024,
                  max_num_seqs=max(batches), enforce_eager=True, seed=0,
                  enable_prefix_caching=False)
    base = LLM(**common)  # no speculative config: the plugin stays out of it
    plug = LLM(speculative_config=spec, **common)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = fixture_prompts(fixtures)

    def seconds(llm, batch: list[str]) -> float:
        t = time.perf_counter()
        llm.generate(batch, sp, use_tqdm=False)
        return time.perf_counter() - t

    for llm in (base, plug):  # warm-up
        seconds(llm, prompts[:2])
    ratios: dict[int, list[float]] = {b: [] for b in batches}
    loads: list[float] = []
    at = 0
    for r in range(args.rounds):
        for b in batches:
            t_base = t_plug = 0.0
            for call in range(args.calls):
                batch = [prompts[(at + i) % len(prompts)] for i in range(b)]
                at += b
                for llm in ((base, plug) if call % 2 == 0 else (plug, base)):
                    dt = seconds(llm, batch)
                    if llm is base:
                        t_base += dt
                    else:
                        t_plug += dt
            ratios[b].append(t_base / t_plug)
        loads.append(round(os.getloadavg()[0], 2))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"batch {b} {v[-1]:.3f}" for b, v in ratios.items()) + f" (load {loads[-1]})",
            file=sys.stderr, flush=True)
    table = {}
    for b, v in ratios.items():
        med = statistics.median(v)
        table[str(b)] = {"median": round(med, 4), "min": round(min(v), 4), "max": round(max(v), 4),
                         "spread": round((max(v) - min(v)) / med, 4), "rounds": [round(x, 4) for x in v]}
        print(f"{args.method}: plugin K = 0 ({args.k0_drafter}) / target-only, batch {b}: median {med:.3f} "
              f"(min {min(v):.3f}, max {max(v):.3f}, spread {table[str(b)]['spread']:.1%})")
    print(f"load average (1 min) after each round: {loads}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"method": args.method, "k0_drafter": args.k0_drafter,
             "max_tokens": args.max_tokens, "calls": args.calls,
             "torch_threads": torch.get_num_threads(),
             "ratios": table, "load_average": loads}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
