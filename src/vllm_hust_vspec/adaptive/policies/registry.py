"""Policies by name.

``make_policy("name")`` or ``make_policy("name:ARG")`` builds a policy; ``ARG`` is
policy-specific (``fixed:3``, ``schedule:1-4:4,5-32:2``, ``sweep:0,1,2,3,4``) and wins over
the keyword configuration (``fixed_gamma``, ``schedule``, ``sweep``, ...).

Factories have the signature ``factory(arg: str | None, kmax: int, cfg: Mapping) -> Policy``
where ``cfg`` holds the keyword arguments given to :func:`make_policy` (the controller passes
``min_gamma``, ``fixed_gamma``, ``schedule``, ``sweep``, ``profile``, ``cost_table``,
``seed``, ``start_gamma``).  Other modules add policies with :func:`register_policy`; the
modules in :data:`_PLUGIN_MODULES` (the sim helper's ``budget`` and ``profile``) are imported
on first use so their registration happens without an explicit import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from .base import Policy
from .fixed import FixedPolicy
from .online import OnlinePolicy
from .schedule import SchedulePolicy
from .sweep import SweepPolicy

PolicyFactory = Callable[[str | None, int, Mapping[str, Any]], Policy]

_REGISTRY: dict[str, PolicyFactory] = {}
_PLUGIN_MODULES = (
    "vllm_hust_vspec.adaptive.policies.budget",
    "vllm_hust_vspec.adaptive.policies.profile",
)
_plugins_loaded = False


def register_policy(name: str, factory: PolicyFactory, *, replace: bool = False) -> None:
    """Make ``name`` available to :func:`make_policy`."""
    if not name or ":" in name:
        raise ValueError(f"bad policy name {name!r}")
    if name in _REGISTRY and not replace and _REGISTRY[name] is not factory:
        raise ValueError(f"policy {name!r} is already registered")
    _REGISTRY[name] = factory


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for mod in _PLUGIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # a real import error inside the module
                raise


def policy_names() -> tuple[str, ...]:
    _load_plugins()
    return tuple(sorted(_REGISTRY))


def split_spec(spec: str) -> tuple[str, str | None]:
    """``'fixed:3'`` -> ``('fixed', '3')``; ``'online'`` -> ``('online', None)``."""
    name, sep, arg = str(spec).strip().partition(":")
    return name.strip(), (arg.strip() if sep else None)


def make_policy(spec: str, kmax: int, **cfg: Any) -> Policy:
    """Build the policy ``spec`` (``NAME`` or ``NAME:ARG``) for draft depth ``kmax``.

    Unknown names raise one :class:`ValueError` listing the known names; bad arguments raise
    :class:`ValueError` naming the policy and the value."""
    if not isinstance(kmax, int) or kmax < 0:
        raise ValueError(f"kmax must be a non-negative integer, got {kmax!r}")
    name, arg = split_spec(spec)
    _load_plugins()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"unknown policy {name!r} (in {spec!r}); known policies: "
            f"{', '.join(sorted(_REGISTRY))}"
        )
    return factory(arg, kmax, cfg)


def _int_arg(policy: str, arg: str) -> int:
    try:
        return int(arg)
    except ValueError:
        raise ValueError(f"policy {policy!r}: expected an integer K, got {arg!r}") from None


def _fixed(arg: str | None, kmax: int, cfg: Mapping[str, Any]) -> Policy:
    if arg is not None and arg != "":
        k = _int_arg("fixed", arg)
    else:
        k = cfg.get("fixed_gamma")
        k = kmax if k is None else int(k)
    return FixedPolicy(k, kmax, int(cfg.get("min_gamma", 0)))


def _schedule(arg: str | None, kmax: int, cfg: Mapping[str, Any]) -> Policy:
    table = arg if arg else cfg.get("schedule")
    if not table:
        raise ValueError(
            "policy 'schedule' needs a table, e.g. 'schedule:1-4:4,5-32:2' "
            "(or adaptive_schedule)"
        )
    return SchedulePolicy(table, kmax, int(cfg.get("min_gamma", 0)))


def _sweep(arg: str | None, kmax: int, cfg: Mapping[str, Any]) -> Policy:
    if arg:
        ks = [_int_arg("sweep", p.strip()) for p in arg.split(",") if p.strip()]
    else:
        ks = cfg.get("sweep")
    return SweepPolicy(ks, kmax, int(cfg.get("min_gamma", 0)))


def _online(arg: str | None, kmax: int, cfg: Mapping[str, Any]) -> Policy:
    start = cfg.get("start_gamma")
    if arg:
        start = _int_arg("online", arg)  # 'online:K' = start at K
    return OnlinePolicy(kmax, int(cfg.get("min_gamma", 0)), start)


register_policy("fixed", _fixed)
register_policy("schedule", _schedule)
register_policy("sweep", _sweep)
register_policy("online", _online)
