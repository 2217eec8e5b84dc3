"""Protocols: validated benchmark contracts.  A protocol's settings are the base layer
(above the schema defaults, below TOML and flags); the settings it *pins* may not be
changed, so a run cannot silently drift from the conditions its results were validated
under.  Model names are bare names resolved by the model store, never host paths."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from vllm_hust_vspec.launcher.errors import LaunchError


@dataclasses.dataclass(frozen=True)
class Protocol:
    name: str
    description: str
    settings: Mapping[str, Any]  # option name -> value (the base layer)
    pinned: tuple[str, ...]  # options that may not deviate from `settings`
    methods: tuple[str, ...]  # canonical methods the contract was validated with
    per_method: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # per_method: defaults that depend on the method (applied when not set elsewhere)


PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol(
            name="arc-easy",
            description="ARC-Easy engineering regression: Qwen2.5-14B-Instruct target, FP16, "
            "B16, 32K context, port 18180, full-decode-only graphs, sync scheduling, no "
            "prefix cache, the model's generation config; draft (Qwen2.5-0.5B-Instruct) or "
            "EAGLE (Eagle-Qwen2.5-14B-Instruct); K chosen online up to 4.",
            settings={
                "method": "draft_model",
                "target_model": "Qwen2.5-14B-Instruct",
                "gamma": 4,
                "dtype": "float16",
                "max_num_seqs": 16,
                "max_model_len": 32768,
                "port": 18180,
                "graph_mode": "full-decode-only",
                "async_scheduling": False,
                "prefix_caching": False,
                "generation_config": "auto",
            },
            pinned=("gamma", "dtype", "max_num_seqs", "max_model_len", "graph_mode",
                    "async_scheduling", "prefix_caching", "generation_config"),
            methods=("draft_model", "eagle"),
            per_method={
                "draft_model": {"draft_model": "Qwen2.5-0.5B-Instruct",
                                "served_model_name": "qwen2.5-14b-draft-vspec-fp16"},
                "eagle": {"draft_model": "Eagle-Qwen2.5-14B-Instruct",
                          "served_model_name": "qwen2.5-14b-eagle-vspec-fp16"},
            },
        ),
        Protocol(
            name="qwen35-frontier-mtp2",
            description="Qwen3.5-35B-A3B frontier: built-in MTP head, K up to 6 chosen "
            "online in steps of 2 from 2, B16, TP2 + expert parallel, 256K context, prefix "
            "cache, async scheduling, full-and-piecewise graphs with exact capture sizes, the batch "
            "refilled in cohorts of 8.",
            settings={
                "method": "mtp",
                "target_model": "Qwen3.5-35B-A3B",
                "gamma": 6,
                "tensor_parallel_size": 2,
                "max_num_seqs": 16,
                "max_model_len": 262144,
                "prefix_caching": True,
                "async_scheduling": True,
                "graph_mode": "full-and-piecewise",
                "capture_policy": "exact",
                "served_model_name": "qwen3.5-35b-a3b-mtp2-vspec",
                "adaptive_policy": "online",
                "adaptive_min_gamma": 2,
                "adaptive_max_gamma_step": 2,
                "adaptive_hysteresis": 0.03,
                "adaptive_online_exploration": 0.0,
                "adaptive_online_warmup_samples": 2,
                # vSpec 0.14's contract refilled the batch in cohorts of 8 on these graphs
                "adaptive_refill_batch": 8,
                "extra_args": ("--enable-expert-parallel",),
            },
            pinned=("method", "gamma", "tensor_parallel_size", "max_model_len",
                    "prefix_caching", "async_scheduling", "graph_mode"),
            methods=("mtp",),
        ),
    )
}


def get_protocol(name: str, source: str = "--protocol") -> Protocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise LaunchError(
            f"{source}: unknown protocol {name!r} (known: {', '.join(sorted(PROTOCOLS))})"
        ) from None
