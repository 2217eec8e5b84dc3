"""Find local model directories.  Never downloads.

A model value is either a path (contains ``/``, or starts with ``.`` or ``~``) or a bare
name.  Bare names are looked up, in order, in the model registry (a JSON or TOML file
mapping names to paths; relative paths are relative to the registry file) and under the
model directory.  Environment fallbacks (losing to an explicit flag, winning over a
preset's or protocol's bare name): ``HUST_VSPEC_TARGET_MODEL``, ``HUST_VSPEC_DRAFT_MODEL``,
``HUST_VSPEC_EAGLE_MODEL`` (eagle/eagle3 first), ``HUST_VSPEC_MODEL_DIR``,
``HUST_VSPEC_MODEL_REGISTRY``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tomllib
from collections.abc import Mapping

from vllm_hust_vspec import checks, settings
from vllm_hust_vspec.launcher.errors import LaunchError

TARGET_ENV = "HUST_VSPEC_TARGET_MODEL"
DRAFT_ENV = "HUST_VSPEC_DRAFT_MODEL"
EAGLE_ENV = "HUST_VSPEC_EAGLE_MODEL"
MODEL_DIR_ENV = "HUST_VSPEC_MODEL_DIR"
REGISTRY_ENV = "HUST_VSPEC_MODEL_REGISTRY"


@dataclasses.dataclass(frozen=True)
class Lookup:
    """Where a model value came from and where it resolved (or was looked for)."""

    role: str  # "target" or "draft"
    value: str  # as given
    source: str  # flag, TOML key, env var or protocol
    path: str  # resolved path (for a bare name that resolved nowhere: the name)
    tried: tuple[str, ...]  # places looked at


def is_bare_name(value: str) -> bool:
    return "/" not in value and not value.startswith((".", "~"))


def env_names(role: str, method: str) -> tuple[str, ...]:
    if role == "target":
        return (TARGET_ENV,)
    if method in ("eagle", "eagle3"):
        return (EAGLE_ENV, DRAFT_ENV)
    return (DRAFT_ENV,)


def _expand(path: str) -> pathlib.Path:
    """``~`` and ``~user`` expanded; an unknown user's ``~name`` is left as written
    (``pathlib.Path.expanduser`` raises RuntimeError for it)."""
    return pathlib.Path(os.path.expanduser(path))


def load_registry(path: str) -> dict[str, str]:
    """``name -> absolute path`` from a JSON or TOML file (a flat table of strings)."""
    p = _expand(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError:
        raise LaunchError(f"{p}: model registry not found or unreadable") from None
    except UnicodeDecodeError as exc:
        raise LaunchError(f"{p}: malformed model registry: {checks.not_utf8(exc)}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise LaunchError(f"{p}: malformed model registry: {exc}") from None
    except checks.PARSER_LIMITS as exc:
        raise LaunchError(f"{p}: malformed model registry: {checks.parser_limit(exc)}") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{p}: model registry must map names to paths")
    out = {}
    for name, target in data.items():
        if not isinstance(target, str) or not target:
            raise LaunchError(f"{p}: model registry entry {name!r}: expected a path string")
        t = _expand(target)
        out[name] = str(t if t.is_absolute() else (p.parent / t))
    return out


class ModelStore:
    """Resolves model values to paths given the model dir and registry."""

    def __init__(self, model_dir: str | None, registry: str | None) -> None:
        self.model_dir = model_dir
        self.registry_path = registry
        self._registry: dict[str, str] | None = None

    def registry(self) -> dict[str, str]:
        if self._registry is None:
            self._registry = load_registry(self.registry_path) if self.registry_path else {}
        return self._registry

    def resolve(self, value: str) -> tuple[str, tuple[str, ...]]:
        """``(path, places tried)``; does not check that the path exists."""
        if not is_bare_name(value):
            return str(_expand(value)), (value,)
        tried = []
        if self.registry_path:
            tried.append(f"registry {self.registry_path}")
            hit = self.registry().get(value)
            if hit:
                return hit, tuple(tried)
        if self.model_dir:
            candidate = str(_expand(self.model_dir) / value)
            tried.append(candidate)
            return candidate, tuple(tried)
        return value, tuple(tried)


def pick_value(
    role: str,
    method: str,
    explicit: Mapping[str, object],
    merged: Mapping[str, object],
    sources: Mapping[str, str],
    environ: Mapping[str, str],
) -> tuple[str | None, str]:
    """The model value for ``role`` and its source: flag > env > TOML/protocol."""
    key = "target_model" if role == "target" else "draft_model"
    if key in explicit:
        return str(explicit[key]), settings.option(key).cli_flag
    for name in env_names(role, method):
        if environ.get(name):
            return environ[name], f"env {name}"
    value = merged.get(key)
    if value:
        return str(value), sources.get(key, key)
    return None, ""


def missing_error(method: str, lookups: list[Lookup], missing: list[Lookup]) -> LaunchError:
    needs = "a target model" + (" and a draft model" if any(
        lk.role == "draft" for lk in lookups) else "")
    lines = [f"method {method} needs {needs}; not found:"]
    for lk in missing:
        flag = "--target-model" if lk.role == "target" else "--draft-model"
        where = ", ".join(lk.tried) if lk.tried else "nowhere (a bare name needs --model-dir, "\
            f"{MODEL_DIR_ENV} or a registry)"
        lines.append(f"  {lk.role} {lk.value!r} (from {lk.source}): looked in {where}; "
                     f"pass {flag} PATH")
    return LaunchError("\n".join(lines))


def check_exist(method: str, lookups: list[Lookup]) -> None:
    """Every model must be an existing local directory (real starts only)."""
    missing = [lk for lk in lookups if not os.path.isdir(lk.path)]
    if missing:
        raise missing_error(method, lookups, missing)
