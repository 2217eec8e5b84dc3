#!/usr/bin/env python3
"""Does speculation pay on the large pair? target-large + draft at fixed K vs target-only.

Offline vLLM, one process, float32, eager, batch 1 (one request at a time), temperature 0.
Runs alternate (target-only, speculative) ``--runs`` times, each in a fresh engine after a
warm-up request; prints per-run output tok/s and the ratio of the medians. Also checks that
both produce the same tokens. Example::

    .venv/bin/python scripts/bench_large_pair.py --k 2 --runs 3

The last stdout line is JSON: {"k", "baseline_tok_s", "spec_tok_s", "ratio", "mal", ...}.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import time

from vllm_hust_vspec.tools.fixture_dir import fixtures_dir

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from fixtures import mal as M  # noqa: E402


def one_run(fixture: pathlib.Path, drafter: str | None, k: int, rows: list[dict]) -> dict:
    """Fresh engine, one warm-up request, then each prompt alone; returns tok/s and tokens."""
    model, spec = M.engine_spec(fixture, drafter, k=k, large=True)
    llm = M.make_llm(model, spec, max_model_len=1024)
    M.generate(llm, rows[:1])
    before = M.spec_counters(llm)
    tokens, ids = 0, []
    t = time.perf_counter()
    for row in rows:
        out = M.generate(llm, [row])[0].outputs[0]
        tokens += len(out.token_ids)
        ids.append(list(out.token_ids))
    wall = time.perf_counter() - t
    after = M.spec_counters(llm)
    drafts = after["drafts"] - before["drafts"]
    del llm
    gc.collect()
    return {"tok_s": tokens / wall, "ids": ids,
            "mal": 1 + (after["accepted"] - before["accepted"]) / drafts if drafts else None}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", default=None, help="fixture dir (default: $VSPEC_FIXTURES or <root>/current)")
    ap.add_argument("--k", type=int, default=2, help="num_speculative_tokens (default 2)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs per mode (default 3)")
    ap.add_argument("--prompts", type=int, default=4, help="code prompts, each decoded alone (default 4)")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per prompt (default 128)")
    ap.add_argument("--drafter", default="draft", choices=M.DRAFTERS, help="drafter (default draft)")
    a = ap.parse_args(argv)
    fixture = fixtures_dir(a.fixture)
    code = fixture / "prompts" / "code.jsonl"
    if not code.is_file():
        ap.error(f"no prompts at {code}: build the fixtures first (./manage.sh fixtures)")
    rows = [{**json.loads(line), "output_tokens": a.tokens}
            for line in code.read_text(encoding="utf-8").splitlines()[: a.prompts]]
    base, spec = [], []
    for i in range(a.runs):
        base.append(one_run(fixture, None, a.k, rows))
        spec.append(one_run(fixture, a.drafter, a.k, rows))
        print(f"run {i + 1}: target-only {base[-1]['tok_s']:.1f} tok/s, "
              f"{a.drafter} K={a.k} {spec[-1]['tok_s']:.1f} tok/s (MAL {spec[-1]['mal']:.2f})", file=sys.stderr)
    same = all(s["ids"] == base[0]["ids"] for s in base + spec)
    b, s = statistics.median(r["tok_s"] for r in base), statistics.median(r["tok_s"] for r in spec)
    result = {"k": a.k, "drafter": a.drafter, "runs": a.runs, "prompts": a.prompts, "tokens": a.tokens,
              "baseline_tok_s": round(b, 1), "spec_tok_s": round(s, 1), "ratio": round(s / b, 3),
              "mal": round(statistics.median(r["mal"] for r in spec), 3), "same_tokens": same,
              "target_large_params": json.loads((fixture / "manifest.json").read_text())["models"]
              ["target-large"]["params"]}
    print(json.dumps(result))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
