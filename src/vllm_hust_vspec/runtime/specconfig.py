"""Check a host ``SpeculativeConfig`` against the plugin settings and turn on dynamic SD.

Called in the process that builds the config (the ``dynamic-sd-config`` patch).  Every
refusal is a :class:`~vllm_hust_vspec.settings.SettingsError` raised before any model loads.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_hust_vspec.methods import UNSUPPORTED, varies_k
from vllm_hust_vspec.settings import Settings, SettingsError, check_kmax

logger = logging.getLogger("vllm_hust_vspec")


def prepare_speculative_config(config: Any, settings: Settings, data_parallel_size: int = 1) -> None:
    """Validate ``config`` (a host ``SpeculativeConfig``) and set its
    ``num_speculative_tokens_per_batch_size`` to ``[(1, 1, Kmax)]`` when unset.

    * methods the plugin cannot drive are refused;
    * methods whose proposer asserts K == Kmax keep the host's static K (no table): the
      controller only trims each request's verified drafts;
    * data parallelism > 1 keeps one K on every rank: only the ``fixed`` policy (or
      ``adaptive_speculation`` off) is accepted, any other policy is refused.
    """
    method = str(config.method)
    kmax = config.num_speculative_tokens
    check_speculative_config(method, kmax, settings, data_parallel_size)
    if not varies_k(method):
        logger.info(
            "vllm-hust-vspec: method %s asserts K == Kmax in the host; K stays %d and the "
            "controller trims each request's verified drafts only", method, kmax,
        )
        return
    if data_parallel_size > 1:
        return  # the host turns dynamic SD off under DP; the fixed K is installed per rank
    if config.num_speculative_tokens_per_batch_size is None:
        config.num_speculative_tokens_per_batch_size = [(1, 1, kmax)]
        logger.info("vllm-hust-vspec: dynamic-SD mode on (K chosen per step, Kmax=%d)", kmax)


def check_speculative_config(method: str, kmax: Any, settings: Settings,
                             data_parallel_size: int = 1) -> None:
    """The refusals of :func:`prepare_speculative_config`, on their own (the vLLM-HUST 0.17
    engine core runs them when it attaches: that host has no dynamic-SD table to set)."""
    if method in UNSUPPORTED:
        raise SettingsError(
            f"speculative_config.method={method!r} cannot be made adaptive: "
            f"{UNSUPPORTED[method]} (unset HUST_VSPEC_ENABLED to run it without the plugin)"
        )
    if not kmax or kmax < 1:
        raise SettingsError(
            f"speculative_config.num_speculative_tokens must be >= 1 for the plugin, got {kmax!r}"
        )
    check_kmax(settings, kmax, source="HUST_VSPEC_* settings")
    if data_parallel_size > 1 and settings.adaptive_speculation and (
        settings.adaptive_policy != "fixed"
    ):
        raise SettingsError(
            f"data_parallel_size={data_parallel_size}: ranks would choose different K and "
            f"deadlock; use HUST_VSPEC_ADAPTIVE_POLICY=fixed (one K for every rank) or "
            f"HUST_VSPEC_ADAPTIVE_SPECULATION=0"
        )

