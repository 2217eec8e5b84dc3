#!/usr/bin/env python
"""Output tok/s of the plugin on the large fixture pair (target-large + draft), CPU host.

Configurations: target-only, fixed K = 1..Kmax and ``online``, at batch 1 (one request at a
time) and batch 8 (eight concurrent requests); medians of ``--rounds`` interleaved rounds.
Two engines live in one process: target-only, and the plugin engine whose controller is
rebuilt per configuration (``EngineRuntime.reconfigure``), so every configuration shares the
same warm engine and the rounds interleave.

    .venv/bin/python scripts/bench_plugin_throughput.py [--fixtures DIR] [--rounds 3]
        [--max-tokens 64] [--kmax 4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

from vllm_hust_vspec.runtime.engine import runtime_of
from vllm_hust_vspec.tools.fixture_dir import fixtures_dir


def _prompts(fixtures: pathlib.Path) -> list[str]:
    rows = [json.loads(line) for line in (fixtures / "prompts" / "code.jsonl").read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows]


def _tok_s(llm, prompts: list[str], batch: int, max_tokens: int) -> float:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(prompts), batch):
        outs = llm.generate(prompts[i:i + batch], sp, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kmax", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per measurement")
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args(argv)
    fixtures = fixtures_dir(args.fixtures)
    if not (fixtures / "target-large").is_dir():
        print(f"error: {fixtures}/target-large not found (build the fixtures first)", file=sys.stderr)
        return 2
    for k, v in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                 "HF_HUB_OFFLINE": "1"}.items():
        os.environ.setdefault(k, v)
    os.environ["HUST_VSPEC_ENABLED"] = "1"
    os.environ["HUST_VSPEC_ADAPTIVE_LOG_INTERVAL"] = "0"
    import vllm_hust_vspec
    from vllm import LLM
    from vllm_hust_vspec import settings as settings_mod

    vllm_hust_vspec.register()
    prompts = (_prompts(fixtures) * 4)[: args.prompts]
    common = dict(model=str(fixtures / "target-large"), dtype="float32", max_model_len=1024,
                  max_num_seqs=8, enforce_eager=True, seed=0)
    base = LLM(**common)
    spec = {"method": "draft_model", "model": str(fixtures / "draft"), "num_speculative_tokens": args.kmax}
    plug = LLM(speculative_config=spec, **common)
    runtime = runtime_of(plug.llm_engine.engine_core.engine_core.scheduler)
    configs = ["target-only"] + [f"fixed:{k}" for k in range(1, args.kmax + 1)] + ["online"]
    results: dict[str, dict[int, list[float]]] = {c: {1: [], 8: []} for c in configs}
    for llm in (base, plug):  # warm-up
        _tok_s(llm, prompts[:2], 2, 8)
    for r in range(args.rounds):
        for batch in (1, 8):
            for c in configs:
                if c == "target-only":
                    llm = base
                else:
                    name, _, arg = c.partition(":")
                    values = {"adaptive_policy": name}
                    if arg:
                        values["adaptive_fixed_gamma"] = int(arg)
                    runtime.reconfigure(settings_mod.Settings(values))
                    llm = plug
                results[c][batch].append(_tok_s(llm, prompts, batch, args.max_tokens))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    table = {c: {str(b): round(statistics.median(v), 2) for b, v in d.items()} for c, d in results.items()}
    print(f"{'config':<12} {'batch 1 tok/s':>14} {'batch 8 tok/s':>14}")
    for c in configs:
        print(f"{c:<12} {table[c]['1']:>14.2f} {table[c]['8']:>14.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"medians": table, "rounds": args.rounds,
                                                       "max_tokens": args.max_tokens}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
