"""Read and validate a launcher TOML file: ``[serve]`` (schema options by name) and
``[env]`` (extra environment for the server; never ``HUST_VSPEC_*``)."""

from __future__ import annotations

import dataclasses
import pathlib
import tomllib
from typing import Any

from vllm_hust_vspec import checks, settings
from vllm_hust_vspec.errors import one_line
from vllm_hust_vspec import retired
from vllm_hust_vspec.launcher.errors import LaunchError

TABLES = ("serve", "env")
# Env names the [env] table may not set: the plugin's transport belongs to the schema.
RESERVED_ENV_PREFIXES = (settings.ENV_PREFIX,) + settings.LEGACY_ENV_PREFIXES


@dataclasses.dataclass(frozen=True)
class ConfigFile:
    path: pathlib.Path
    serve: dict[str, Any]  # option name -> converted value
    env: dict[str, str]


def toml_options() -> dict[str, settings.Option]:
    return {o.name: o for o in settings.OPTIONS if o.toml}


def load_config(path: str | pathlib.Path) -> ConfigFile:
    p = pathlib.Path(path)
    where = one_line(str(p))  # every message stays one line, whatever the file is called
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LaunchError(f"{where}: config file not found") from None
    except OSError as exc:
        raise LaunchError(f"{where}: cannot read config file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise LaunchError(f"{where}: malformed TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise LaunchError(f"{where}: malformed TOML: {checks.not_utf8(exc)}") from None
    except checks.PARSER_LIMITS as exc:
        raise LaunchError(f"{where}: malformed TOML: {checks.parser_limit(exc)}") from None
    for key in raw:
        if key not in TABLES:
            raise LaunchError(
                f"{where}: unknown table or key {key!r} at top level (expected [serve] and [env])"
            )
    serve_raw = raw.get("serve", {})
    env_raw = raw.get("env", {})
    if not isinstance(serve_raw, dict):
        raise LaunchError(f"{where}: 'serve' must be a table ([serve])")
    if not isinstance(env_raw, dict):
        raise LaunchError(f"{where}: 'env' must be a table ([env])")
    known = toml_options()
    serve: dict[str, Any] = {}
    for key, value in serve_raw.items():
        opt = known.get(key)
        if opt is None and key in retired.BY_NAME:
            raise LaunchError(retired.message(retired.BY_NAME[key], f"{where}: [serve] {key}"))
        if opt is None:
            raise LaunchError(f"{where}: [serve] unknown key {key!r}")
        if opt.type.endswith("_list") and not isinstance(value, list):
            raise LaunchError(
                f"{where}: [serve] {key}: expected an array ({opt.type_label()}), got {value!r}"
            )
        if isinstance(value, dict):
            raise LaunchError(
                f"{where}: [serve] {key}: expected {opt.type_label()}, got a table"
            )
        try:
            serve[key] = settings.parse_value(opt, value, f"{where}: [serve] {key}")
        except settings.SettingsError as exc:
            raise LaunchError(str(exc)) from None
    env: dict[str, str] = {}
    for key, value in env_raw.items():
        if key.upper().startswith(RESERVED_ENV_PREFIXES):
            raise LaunchError(
                f"{where}: [env] {one_line(key)}: HUST_VSPEC_* variables are set from the option "
                f"schema; use the [serve] key or the flag instead"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise LaunchError(f"{where}: [env] {one_line(key)}: expected a string or number, "
                              f"got {value!r}")
        env[key] = str(value)
    return ConfigFile(path=p, serve=serve, env=env)
