"""Settings (the ``adaptive_*`` options) -> a :class:`~vllm_hust_vspec.adaptive.controller.Controller`."""

from __future__ import annotations

from typing import Any

from vllm_hust_vspec.adaptive.controller import Controller, ControllerConfig
from vllm_hust_vspec.settings import Settings, SettingsError, parse_schedule

HOST_TABLE = "num_speculative_tokens_per_batch_size"


def controller_config(settings: Settings, kmax: int, host_table: Any = None,
                      trace: bool = False) -> ControllerConfig:
    """The controller's config for Kmax = ``kmax``.

    ``adaptive_speculation`` off means the host's fixed K: policy ``fixed`` at Kmax (the
    plugin only observes).  The ``schedule`` policy without ``adaptive_schedule`` takes the
    user's own ``num_speculative_tokens_per_batch_size`` table (as data: the list of
    ``(lo, hi, K)``, checked by the one schedule parser), else it is refused."""
    overrides: dict[str, Any] = {"trace": trace}
    if not settings.adaptive_speculation:
        overrides.update(policy="fixed", fixed_gamma=kmax, min_gamma=0)
    elif settings.adaptive_policy == "schedule" and not settings.adaptive_schedule:
        if not host_table:
            raise SettingsError(
                "adaptive_policy 'schedule' needs adaptive_schedule "
                "(--adaptive-schedule / HUST_VSPEC_ADAPTIVE_SCHEDULE), e.g. '1-4:4,5-32:2'"
            )
        overrides["schedule"] = tuple(parse_schedule(host_table, HOST_TABLE, kmax))
    cfg = ControllerConfig.from_settings(settings.as_dict("plugin"), kmax, **overrides)
    try:
        cfg.validate()
    except ValueError as exc:
        raise SettingsError(f"HUST_VSPEC_* settings: {exc}") from None
    return cfg


def build_controller(settings: Settings, kmax: int, host_table: Any = None,
                     trace: bool = False) -> Controller:
    cfg = controller_config(settings, kmax, host_table, trace)
    try:
        return Controller(cfg)
    except ValueError as exc:
        raise SettingsError(f"HUST_VSPEC_* settings: {exc}") from None


def is_fixed_at(cfg: ControllerConfig, k: int) -> bool:
    """True when ``cfg`` always chooses ``k`` (the recorder's requirement)."""
    name, _, arg = cfg.policy.partition(":")
    if name != "fixed":
        return False
    chosen = int(arg) if arg else (cfg.fixed_gamma if cfg.fixed_gamma is not None else cfg.kmax)
    return chosen == k and cfg.stop == "off"


def check_settings(settings: Settings, kmax: int, host_table: Any = None) -> None:
    """Every settings check that needs Kmax, run where the config is built (before any model
    loads): the controller can be built, and a recording run is at fixed Kmax."""
    cfg = build_controller(settings, kmax, host_table).config
    if settings.adaptive_record_trace and not is_fixed_at(cfg, kmax):
        raise SettingsError(
            "adaptive_record_trace (HUST_VSPEC_ADAPTIVE_RECORD_TRACE) records a run at fixed "
            f"Kmax={kmax}: set HUST_VSPEC_ADAPTIVE_POLICY=fixed (with "
            "HUST_VSPEC_ADAPTIVE_FIXED_GAMMA unset or = Kmax and adaptive_stop off); "
            f"the policy is {cfg.policy!r}"
        )


def entry_settings(settings: Settings, entry: str) -> Settings:
    """The settings of one ``adaptive_compare`` entry ("fixed:K" or a policy name): the
    user's settings with that policy (a fixed entry keeps K = 0 allowed, and stops off)."""
    name, _, arg = entry.partition(":")
    if name == "fixed":
        return settings.replace(adaptive_policy="fixed", adaptive_fixed_gamma=int(arg),
                                adaptive_min_gamma=0, adaptive_stop="off")
    return settings.replace(adaptive_policy=name)
