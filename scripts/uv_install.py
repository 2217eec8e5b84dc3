"""Install into a venv with uv, configured from pip's own configuration.

    python scripts/uv_install.py --venv DIR [--check] -- <uv pip install arguments>

`./manage.sh install --dev` uses it for the dev venv: uv resolves and installs the CPU host in
~12 s where pip takes ~70 s on this 2-core machine (same 152 packages, same versions;
docs/fixtures.md, "Install time"). uv does not read pip's configuration, and this machine (and a
user's) says in it where packages come from: so this reads pip's effective configuration
(`pip config list` of the venv's pip: files and PIP_* variables, the later scope winning) and
hands uv the same indexes, find-links, constraints, certificate and timeout. Keys it cannot
carry over make it exit with status 3 naming them, before anything is installed (manage.sh then
says so and installs with pip): a silently different source of packages is worse than a slow
install. `--check` only checks that the configuration can be carried over.

Exit status: uv's own, 3 when pip's configuration cannot be carried over, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import shlex
import subprocess
import sys

CANNOT_CARRY = 3

# pip keys whose meaning uv's `pip install` gets through these options (list-valued ones split on
# whitespace, as pip does).
_LIST_OPTIONS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
# pip keys that change how pip talks or what it prints, never what gets installed.
_HARMLESS = frozenset({
    "disable-pip-version-check", "no-cache-dir", "cache-dir", "progress-bar", "quiet",
    "verbose", "no-color", "no-input", "root-user-action", "no-warn-script-location",
    "no-python-version-warning", "retries", "exists-action", "break-system-packages",
})


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def effective_options(config_list: str) -> dict[str, str]:
    """pip's effective options from `pip config list` output (`section.key='value'` lines).

    pip's precedence: an `install` section beats `global` in the same files, and PIP_*
    environment variables (listed as `:env:.key`) beat every file.
    """
    by_scope: dict[str, dict[str, str]] = {":env:": {}, "install": {}, "global": {}}
    for line in config_list.splitlines():
        line = line.strip()
        if not line or "=" not in line:
            continue
        name, _, raw = line.partition("=")
        section, _, key = name.rpartition(".")
        if section not in by_scope:
            continue  # another command's section (download, wheel, ...)
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            value = raw.strip("'\"")
        by_scope[section][key.replace("_", "-")] = str(value)
    merged: dict[str, str] = {}
    for scope in ("global", "install", ":env:"):
        merged.update(by_scope[scope])
    return merged


def uv_configuration(options: dict[str, str]) -> tuple[list[str], dict[str, str], list[str]]:
    """(uv arguments, environment for uv, pip keys that cannot be carried over)."""
    args: list[str] = []
    env: dict[str, str] = {}
    refused: list[str] = []
    for key in sorted(options):
        value = options[key]
        if key in _HARMLESS:
            continue
        if key == "index-url":
            args += ["--index-url", value]
        elif key in _LIST_OPTIONS:
            for item in value.split():
                args += [_LIST_OPTIONS[key], item]
        elif key == "no-index":
            if _truthy(value):
                args.append("--no-index")
        elif key == "pre":
            if _truthy(value):
                args += ["--prerelease", "allow"]
        elif key == "cert":
            env["SSL_CERT_FILE"] = value
        elif key in {"timeout", "default-timeout"}:
            env["UV_HTTP_TIMEOUT"] = str(int(float(value)))
        else:
            refused.append(key)
    # pip takes the best version across all its indexes; uv's default takes the first index
    # that has the package at all.
    if "--extra-index-url" in args:
        args += ["--index-strategy", "unsafe-best-match"]
    return args, env, refused


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", required=True, type=pathlib.Path, help="the venv to install into")
    ap.add_argument("--check", action="store_true",
                    help="only check that pip's configuration can be carried over to uv")
    ap.add_argument("uv_args", nargs="*", help="arguments of `uv pip install` (after --)")
    ns = ap.parse_args(argv)
    python = ns.venv / "bin" / "python"
    uv = ns.venv / "bin" / "uv"
    if not python.is_file():
        ap.error(f"--venv {ns.venv}: no bin/python there")
    listed = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=False)
    if listed.returncode != 0:
        print(f"uv_install: `{python} -m pip config list` failed: {listed.stderr.strip()}",
              file=sys.stderr)
        return CANNOT_CARRY
    args, env, refused = uv_configuration(effective_options(listed.stdout))
    if refused:
        print("uv_install: pip's configuration sets "
              + ", ".join(f"'{k}'" for k in refused)
              + ", which uv's `pip install` has no equivalent for here", file=sys.stderr)
        return CANNOT_CARRY
    if ns.check:
        return 0
    if not uv.is_file():
        ap.error(f"--venv {ns.venv}: no bin/uv there (install uv into it first)")
    cmd = [str(uv), "pip", "install", "--python", str(python), *args, *ns.uv_args]
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"[manage.sh] + {shown + ' ' if shown else ''}{shlex.join(cmd)}", file=sys.stderr)
    return subprocess.run(cmd, env={**os.environ, **env}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
