"""Active vocabulary for the drafter (issue 19 item 4): what it saves and what it costs.

    .venv/bin/python scripts/bench_active_vocab.py IDS.json [--rounds 3] [--prompts 16]

1. The LM head alone (``runtime/draft_lm_head.py``'s compute_logits against the full head's
   ``F.linear``), per drafted row count, on the fixture draft's head (4096 x 128) and on a
   head of a real drafter's shape (Qwen2.5-0.5B: 151,936 x 896, random weights).
   Variants: full, active ids, int8 (w8a16), both; weights in float32 and bfloat16.
2. The draft model end to end, in-process engines on the fixture pair at a fixed K = 4,
   full head and active ids interleaved for ``--rounds`` rounds: output tok/s and
   acceptance per drafted token (vLLM's spec-decode counters), greedy tokens compared.

Writes one JSON document (``--output``; with the load average before and after) and prints
a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "host"))


def _head_times(vocab: int, hidden: int, active: list[int], rows: list[int], reps: int,
                dtype_name: str) -> dict:
    import torch

    dtype = getattr(torch, dtype_name)

    from vllm_hust_vspec.runtime import draft_lm_head

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter((torch.randn(vocab, hidden) * 0.02).to(dtype),
                                             requires_grad=False)
            self.tp_size = 1

    class Processor:
        soft_cap, scale, org_vocab_size = None, 1.0, vocab

    class Model:
        def __init__(self) -> None:
            self.lm_head, self.logits_processor = Head(), Processor()

        def compute_logits(self, h):
            return torch.nn.functional.linear(h, self.lm_head.weight)  # the host's head

    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vocab-bench-{os.getpid()}.json"
    path.write_text(json.dumps({"format": "vllm-hust-vspec-active-vocab", "version": 1,
                                "ids": active}))
    full = Model()
    variants = {"full": full}
    for name, ids, quant in (("active", str(path), "none"), ("int8", None, "w8a16"),
                             ("active+int8", str(path), "w8a16")):
        m = Model()
        m.lm_head = full.lm_head
        draft_lm_head.install(m, "bench", ids, 0, quant)
        variants[name] = m
    path.unlink()
    out = {}
    with torch.inference_mode():
        for n in rows:
            h = torch.randn(n, hidden, dtype=dtype)
            times = {}
            for name, m in variants.items():
                m.compute_logits(h)
                t0 = time.perf_counter()
                for _ in range(reps):
                    m.compute_logits(h).argmax(dim=-1)
                times[name] = 1000 * (time.perf_counter() - t0) / reps
            out[n] = times
    return out


def _engine_round(fixtures: Path, prompts: list[str], settings: dict) -> dict:
    from plugin_helpers import close, engine_spec, greedy, make_llm, plugin_env

    model, spec = engine_spec(fixtures, "draft_model", 4)
    with plugin_env(adaptive_policy="fixed", **settings):
        llm = make_llm(model, spec, disable_log_stats=False)
        try:
            greedy(llm, prompts[:2], max_tokens=8)  # warm-up
            before = {m.name: float(m.value) for m in llm.get_metrics() if hasattr(m, "value")}
            t0 = time.perf_counter()
            tokens = greedy(llm, prompts, max_tokens=64)
            seconds = time.perf_counter() - t0
            after = {m.name: float(m.value) for m in llm.get_metrics() if hasattr(m, "value")}
        finally:
            close(llm)
    acc = "vllm:spec_decode_num_accepted_tokens"
    drafted = "vllm:spec_decode_num_draft_tokens"
    return {"tok_s": sum(map(len, tokens)) / seconds,
            "acceptance": (after[acc] - before[acc]) / max(1.0, after[drafted] - before[drafted]),
            "tokens": tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", type=Path, help="an active-vocabulary file (vllm-hust-vspec-vocab)")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--output", type=Path, help="write the JSON document here (vLLM's "
                        "engines log to stdout)")
    args = parser.parse_args()
    from plugin_helpers import load_prompts

    from vllm_hust_vspec.tools.fixture_dir import fixtures_dir
    from vllm_hust_vspec.vocab_ids import load

    load_before = os.getloadavg()
    ids = load(args.ids, args.size)
    rows = [1, 4, 16, 64]
    heads = {}
    for dtype in ("float32", "bfloat16"):
        heads[f"fixture draft 4096x128 {dtype}, {len(ids)} ids"] = _head_times(
            4096, 128, ids, rows, 400, dtype)
        heads[f"Qwen2.5-0.5B shape 151936x896 {dtype}, 16384 ids"] = _head_times(
            151936, 896, list(range(16384)), rows, 10, dtype)
    fixtures = fixtures_dir()
    prompts = load_prompts(fixtures, "code")[:args.prompts]
    rounds = []
    for _ in range(args.rounds):
        full = _engine_round(fixtures, prompts, {})
        active = _engine_round(fixtures, prompts, {"draft_active_vocab_ids": args.ids,
                                                   "draft_active_vocab_size": args.size})
        rounds.append({"full": full, "active": active,
                       "same_tokens": full["tokens"] == active["tokens"]})
    doc = {"load_before": load_before, "load_after": os.getloadavg(), "ids": str(args.ids),
           "size": args.size, "lm_head_ms": heads,
           "rounds": [{k: ({"tok_s": v["tok_s"], "acceptance": v["acceptance"]}
                           if isinstance(v, dict) else v) for k, v in r.items()} for r in rounds]}
    if args.output is not None:
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
    else:
        print(json.dumps(doc, indent=1))
    for name, table in heads.items():
        print(f"LM head + argmax, ms ({name}): " + "; ".join(
            f"{n} rows " + " / ".join(f"{k} {v:.3f}" for k, v in t.items())
            for n, t in table.items()))
    ratio = [r["active"]["tok_s"] / r["full"]["tok_s"] for r in rounds]
    print(f"end to end, active/full output tok/s per round: {[round(x, 3) for x in ratio]} "
          f"(median {statistics.median(ratio):.3f}); acceptance full "
          f"{statistics.median(r['full']['acceptance'] for r in rounds):.3f}, active "
          f"{statistics.median(r['active']['acceptance'] for r in rounds):.3f}; same tokens: "
          f"{all(r['same_tokens'] for r in rounds)}; load {load_before[0]:.2f} -> "
          f"{doc['load_after'][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
