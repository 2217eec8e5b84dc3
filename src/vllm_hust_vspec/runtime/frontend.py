"""The front end's part (the process that builds the configs): the ``SpeculativeConfig`` the
host just built, checked against the plugin's settings and put in dynamic-SD mode.

Called once per config by the ``dynamic-sd-config`` patch; :func:`widen_capture_sizes` by the
``capture-sizes`` patch (graph-capable hosts).  Pure Python (no vLLM import).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.capture import capture_sizes, covering_table
from vllm_hust_vspec.host.detect import host_label, process_label, uses_v2_runner
from vllm_hust_vspec.runtime import dspark
from vllm_hust_vspec.runtime.announce import announce, patches_in_effect
from vllm_hust_vspec.runtime.controller_factory import check_settings
from vllm_hust_vspec.runtime.specconfig import prepare_speculative_config

logger = logging.getLogger("vllm_hust_vspec")


def configure_speculative(config: Any, target_parallel_config: Any) -> Any:
    """``config`` (a host ``SpeculativeConfig`` or None) prepared for the controller
    (guards and the ``[(1, 1, Kmax)]`` table in :mod:`~.specconfig`) when the plugin is
    enabled in this process; returned as given otherwise.  Bad settings raise here, before
    any model loads."""
    if config is None or os.environ.get(settings_mod.ENABLE_ENV) != "1":
        return config
    if config.method == "dspark" and dspark.v1_runner():
        dspark.run_on_v1(config)
    settings = settings_mod.from_env()
    user_table = config.num_speculative_tokens_per_batch_size
    prepare_speculative_config(
        config,
        settings,
        data_parallel_size=int(getattr(target_parallel_config, "data_parallel_size", 1)),
    )
    check_settings(settings, config.num_speculative_tokens, user_table)
    policy = settings.adaptive_policy if settings.adaptive_speculation else "fixed"
    announce(host_label(), process_label(), policy, config.num_speculative_tokens,
             patches_in_effect(), settings_mod.lossy_rules(settings))
    return config


def widen_capture_sizes(vllm_config: Any) -> None:
    """The host's capture sizes (``vllm_config.compilation_config``, which the user did not
    set) joined by ``n * (K + 1)`` for every verify width the controller may pick, capped at
    the host's largest capture size.  Nothing without speculation or without graphs."""
    spec = vllm_config.speculative_config
    comp = vllm_config.compilation_config
    sizes = comp.cudagraph_capture_sizes
    if spec is None or not sizes or not spec.num_speculative_tokens:
        return
    cap = comp.max_cudagraph_capture_size or max(sizes)
    extra = capture_sizes(
        vllm_config.scheduler_config.max_num_seqs, spec.num_speculative_tokens, policy="auto",
        kmin=settings_mod.from_env().adaptive_min_gamma, max_num_batched_tokens=cap,
    )
    comp.cudagraph_capture_sizes = sorted(set(sizes) | set(extra))


def cover_v2_widths(vllm_config: Any) -> None:
    """On vLLM's V2 model runner, replace the plugin's own one-entry batch-size table
    (``[(1, 1, Kmax)]``, set when the user gave none) by one that names every K the
    controller may choose (:func:`~vllm_hust_vspec.capture.covering_table`): V2 captures
    decode graphs only for the widths ``K + 1`` in that table, and the plugin's lookup decides
    K whatever the table says.  A user's own table is left as given."""
    spec = vllm_config.speculative_config
    if spec is None or not spec.num_speculative_tokens or not uses_v2_runner(vllm_config):
        return
    kmax = int(spec.num_speculative_tokens)
    if spec.num_speculative_tokens_per_batch_size != [(1, 1, kmax)]:
        return
    kmin = settings_mod.from_env().adaptive_min_gamma
    table, left_out = covering_table(kmin, kmax, int(vllm_config.scheduler_config.max_num_seqs))
    spec.num_speculative_tokens_per_batch_size = table
    logger.info("vllm-hust-vspec: V2 model runner: batch-size table %s so that decode graphs "
                "exist for every K in %d..%d (the controller still decides K)%s", table, kmin,
                kmax, "" if not left_out else
                f"; max_num_seqs leaves no room for K = {', '.join(map(str, left_out))}: those "
                "steps run without full decode graphs")
