#!/usr/bin/env python
"""The fixture target's held-out loss along a training budget: does another step count or peak
learning rate train the same target sooner? (docs/fixtures.md, "Training and budgets").

    .venv/bin/python scripts/target_lr_curve.py STEPS PEAK_LR [--every N] [--threads T]

Trains the fixture target (``scripts/fixtures``: same corpus, tokenizer, shapes, seeded
batches, AdamW and schedule shape as the build, bf16 autocast where the CPU has native bf16)
and prints the ``val_loss`` the manifest records (32 held-out windows) every N steps, then one
JSON line with the curve. With the recipe's budget (650 steps, 2e-3) its last value is the
build's target ``val_loss``. Writes nothing; not part of the build (nor of its hash).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from fixtures import build as B  # noqa: E402
from fixtures import params as P  # noqa: E402
from fixtures import shapes as S  # noqa: E402
from fixtures import train as TR  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", type=int, help="optimizer steps (the recipe: %d)" % P.FULL_TARGET_STEPS)
    p.add_argument("lr", type=float, help="peak learning rate (the recipe: %g)" % P.LR)
    p.add_argument("--every", type=int, default=50, help="evaluate every N steps (default 50)")
    p.add_argument("--threads", type=int, default=P.THREADS, help="torch threads (default 2)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.lr <= 0 or a.every < 1 or a.threads < 1:
        p.error("steps, --every and --threads must be >= 1 and lr > 0")

    import torch
    from transformers import LlamaForCausalLM

    TR.setup_torch(0, a.threads, P.auto_precision())
    _, _, train_stream, valid_stream = B._corpus_and_tokens()
    val_windows = TR.eval_windows(valid_stream)
    torch.manual_seed(0)
    target = LlamaForCausalLM(S.llama_config(S.TARGET))
    windows = TR.Windows(train_stream, 1, P.TARGET_BATCH)  # the build's target stream (seed + 1)
    opt = TR._optimizer(target, a.lr)
    t0 = time.perf_counter()
    curve = []
    for step in range(a.steps):
        target.train()
        x = windows.batch()
        with TR.autocast():
            logits = target(input_ids=x).logits
        TR._lm_loss(logits, x).backward()
        TR._step(opt, target, TR.lr_at(step, a.steps, a.lr))
        if (step + 1) % a.every == 0 or step + 1 == a.steps:
            val = TR.eval_lm(target, val_windows)
            curve.append([step + 1, round(val, 4)])
            print(f"step {step + 1} val_loss {val:.4f} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    print(json.dumps({"steps": a.steps, "lr": a.lr, "threads": a.threads, "curve": curve}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
