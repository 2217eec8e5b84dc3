"""Build ``<build>/dspark/`` on a published fixture build: train, calibrate, measure, write.

The directory holds the drafter's ``config.json`` (``Qwen3DSparkModel``, vLLM's
``Qwen3DSparkForCausalLM``), ``model.safetensors``, the tokenizer, and ``manifest.json``
(``key``: this stage's hash; ``widths``: per block width, the mean accepted length vLLM
serves on each ``mal-prompts`` set and the same greedy walk in torch over held-out greedy
text with the mean confidence of accepted and rejected slots; ``calibration``: the per-slot
temperatures and the ECE of the cumulative survival per slot before and after them).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from fixtures import store
from fixtures import tok as T
from fixtures.train import log_stderr as log

HERE = pathlib.Path(__file__).resolve().parent
DIR = "dspark"
#: Widths whose acceptance the manifest records (the seed's Draft5 and Draft7).
WIDTHS = (5, 7)
STEPS = 400
LR = 2e-3


def source_files() -> list[pathlib.Path]:
    return [HERE.parent / "build_dspark_fixture.py", *sorted(HERE.glob("*.py"))]


def stage_key(build: pathlib.Path, steps: int, seed: int, threads: int) -> str:
    """Hash of the base build it trains on, this stage's code, its parameters and libraries."""
    h = hashlib.sha256()
    h.update(build.resolve().name.encode() + b"\0")
    for path in source_files():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(json.dumps({"steps": steps, "seed": seed, "threads": threads}, sort_keys=True).encode())
    h.update(json.dumps({d: importlib.metadata.version(d) for d in ("torch", "transformers")},
                        sort_keys=True).encode())
    return h.hexdigest()[:16]


def built(build: pathlib.Path, key: str) -> bool:
    try:
        return json.loads((build / DIR / store.MANIFEST).read_text()).get("key") == key
    except (OSError, ValueError):
        return False


def build(build_dir: pathlib.Path, key: str, steps: int, seed: int, threads: int) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from fixtures import corpus as C
    from fixtures import train as TR

    from . import model as M
    from . import train as DT

    t_start = time.perf_counter()
    TR.setup_torch(seed, threads, "fp32")
    target = LlamaForCausalLM.from_pretrained(str(build_dir / "target"), dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tcfg = target.config.to_dict()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(build_dir / "tokenizer" / "tokenizer.json"))
    corpus = C.load()
    train_stream = T.encode_docs(tokenizer, corpus.train_docs)
    valid_stream = T.encode_docs(tokenizer, corpus.valid_docs)
    log(f"dspark {key}: training on {build_dir.name}/target ({steps} steps)")

    timings = {}
    t = time.perf_counter()
    pool = DT.Pool(target, build_dir / "target", train_stream, DT.POOL, seed + 10, "greedy text", build_dir)
    held = DT.Pool(target, build_dir / "target", valid_stream, DT.HELD_OUT, seed + 20, "held-out greedy text",
                   build_dir)
    timings["greedy_text_s"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    torch.manual_seed(seed + 30)
    draft = M.DSparkDraft(tcfg, T.VOCAB_SIZE, T.PAD_ID)
    draft.init_from_target(target)
    sps = DT.train(draft, target, pool, steps, LR)
    timings["train_s"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    acc, conf = DT.held_out_blocks(draft, held, M.MAX_WIDTH)
    temps = DT.fit_temperatures(acc, conf)
    calibration = {"temperatures": [round(x, 4) for x in temps],
                   "ece_before": DT.cumulative_ece(acc, conf, [1.0] * len(temps)),
                   "ece_after": DT.cumulative_ece(acc, conf, temps),
                   "blocks": int(acc.shape[0]),
                   "survival": [round(float(v), 4) for v in acc.double().mean(0)]}
    reference = {str(w): DT.walk_mal(draft, held, w, temps) for w in WIDTHS}
    timings["reference_s"] = round(time.perf_counter() - t, 1)
    log(f"dspark: held-out MAL {({w: v['mal'] for w, v in reference.items()})}, ECE before "
        f"{calibration['ece_before']} after {calibration['ece_after']}")

    tmp = build_dir / f".{DIR}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    token_ids = {"bos_token_id": T.BOS_ID, "eos_token_id": T.EOS_ID, "pad_token_id": T.PAD_ID}
    cfg = M.config(tcfg, T.VOCAB_SIZE, T.PAD_ID, token_ids, M.MAX_WIDTH, temps)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    save_file(draft.checkpoint_state(), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in T.TOKENIZER_FILES:
        shutil.copy2(build_dir / "tokenizer" / name, tmp / name)
    manifest = {"key": key, "build": build_dir.resolve().name, "steps": steps, "seed": seed,
                "threads": threads, "steps_per_s": round(sps, 3),
                "calibration": calibration, "timings": {**timings,
                                                        "total_s": round(time.perf_counter() - t_start, 1)},
                "shape": {**M.SHAPE, "markov_rank": M.MARKOV_RANK, "target_layer_ids": M.TARGET_LAYER_IDS,
                          "max_width": M.MAX_WIDTH},
                "versions": {d: importlib.metadata.version(d) for d in ("torch", "transformers")},
                "python": sys.version.split()[0]}
    t = time.perf_counter()
    mal_json = build_dir / f".{DIR}-mal-{os.getpid()}.json"
    try:
        subprocess.run([sys.executable, str(HERE / "mal.py"), str(build_dir), str(tmp), str(mal_json),
                        *map(str, WIDTHS)], check=True, stdout=sys.stderr)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        mal_json.unlink(missing_ok=True)
        raise
    served = json.loads(mal_json.read_text())
    mal_json.unlink()
    manifest["timings"]["mal_s"] = round(time.perf_counter() - t, 1)
    manifest["widths"] = {str(w): {"mal_by_prompts": {n: r["mal"] for n, r in served[str(w)].items()},
                                   "detail": served[str(w)], "held_out": reference[str(w)]} for w in WIDTHS}
    manifest["mal"] = {"temperature": 0.0, "dtype": "float32", "prompts": "mal-prompts/{code,prose,hard}.jsonl",
                       "how": "vLLM (V1 runner, the plugin at a fixed K): 1 + accepted / drafts; held_out: "
                              "the same greedy walk over held-out greedy text, in torch"}
    manifest["timings"]["total_s"] = round(time.perf_counter() - t_start, 1)
    (tmp / store.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    final = build_dir / DIR
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    return manifest

