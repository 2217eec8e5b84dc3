"""What the scripts that build vLLM engines in their own process share: the fixture
directories they need, and the environment of an in-process engine with the plugin on."""

from __future__ import annotations

import os
import pathlib
import sys


def _prompt_texts(fixtures: pathlib.Path, kind: str) -> list[str]:
    """One fixture prompt set's texts, read by ``bench ab``'s loader (one clear error naming
    the file for a missing or malformed set)."""
    from vllm_hust_vspec.tools.bench_workloads import load_prompt_set

    return [p.text for p in load_prompt_set(fixtures / "prompts" / f"{kind}.jsonl", kind)]


def fixture_prompts(fixtures: pathlib.Path) -> list[str]:
    """The fixture's code prompts, then its prose prompts."""
    return _prompt_texts(fixtures, "code") + _prompt_texts(fixtures, "prose")


def mixed_prompts(fixtures: pathlib.Path) -> list[str]:
    """The fixture's code and hard prompts alternating, so every batch holds easy and hard
    requests (``bench ab``'s ``mixed`` workload)."""
    pairs = zip(_prompt_texts(fixtures, "code"), _prompt_texts(fixtures, "hard"))
    return [p for pair in pairs for p in pair]


def missing(*paths: pathlib.Path) -> bool:
    """True (after one error line) when a fixture directory is missing."""
    for path in paths:
        if not path.is_dir():
            print(f"error: {path} not found (build the fixtures first: ./manage.sh fixtures)",
                  file=sys.stderr)
            return True
    return False


def plugin_engines(kv_cache_gib: int, **plugin: str) -> None:
    """Engines built after this run in this process (no engine-core subprocess), offline,
    with ``kv_cache_gib`` GiB of KV cache, on one torch thread, and with the plugin enabled
    and registered with ``plugin`` as its ``HUST_VSPEC_<NAME>`` settings (its summary log
    line off).

    One thread (``OMP_NUM_THREADS`` set by the caller stands): a served engine computes on one
    thread (vLLM sets it for serving), while an in-process engine keeps torch's default of one
    a core, whose spinning OpenMP threads held the load average at 2 on a 2-core machine
    whatever the script did, so no run could show a quiet machine."""
    for k, v in {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
                 "OMP_NUM_THREADS": "1"}.items():
        os.environ.setdefault(k, v)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    os.environ.update({"HUST_VSPEC_ENABLED": "1", "HUST_VSPEC_ADAPTIVE_LOG_INTERVAL": "0"})
    os.environ.update({f"HUST_VSPEC_{k.upper()}": v for k, v in plugin.items()})
    import vllm_hust_vspec

    vllm_hust_vspec.register()


def paired_batches(ap, args) -> list[int]:
    """The concurrencies of ``--batches`` (a comma-separated list), after checking them and
    ``--rounds`` / ``--calls`` (an ``argparse`` error otherwise): the options of the scripts
    that pair engines call by call."""
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batches: {args.batches!r} is not a comma-separated list of integers")
    if not batches or min(batches) < 1 or args.rounds < 1 or args.calls < 1:
        ap.error("--batches, --rounds and --calls must be >= 1")
    return batches


# --method of the paired scripts -> (vLLM speculative method, drafter fixture dir or None,
# target fixture dir): MTP is its own model
METHODS = {"draft": ("draft_model", "draft", "target-large"),
           "dspark": ("dspark", "dspark", "target-large"),
           "mtp": ("mtp", None, "mtp-large")}


def speculative_pair(fixtures: pathlib.Path, method: str,
                     k: int) -> tuple[pathlib.Path, dict, list[pathlib.Path]]:
    """The target model, the speculative config at Kmax ``k`` and the fixture directories
    they need, of ``method`` (a key of :data:`METHODS`)."""
    spec_method, draft_dir, target_dir = METHODS[method]
    model = fixtures / target_dir
    spec = {"method": spec_method, "num_speculative_tokens": k}
    if draft_dir is None:
        return model, spec, [model]
    spec["model"] = str(fixtures / draft_dir)
    return model, spec, [model, fixtures / draft_dir]
