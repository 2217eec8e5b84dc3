#!/usr/bin/env bash
# release.sh: build, audit and publish vllm-hust-vspec.
# Usage: ./release.sh [--python P] [--dry-run] CMD          (P default: .venv/bin/python, else python3)
#   source-check   bash -n on the shell scripts; validate pyproject, manifest and MOD_METADATA.json
#   build          wipe dist/ build/ *.egg-info, build this version's wheel + sdist
#                  (uv build --no-sources, else python -m build), then check
#   check          audit dist/: exactly this version's wheel and sdist, manifest and entry points
#                  in the wheel, METADATA, RECORD hashes, sdist contents; print the SHA256 list
#   publish        refuse unless the git tree is clean, UV_PUBLISH_TOKEN is set and
#                  VSPEC_RELEASE_CONFIRM equals the version; then check and uv publish
#                  (the token is read by uv from the environment and never printed)
# Env: VSPEC_DIST_DIR (default dist/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
DRY_RUN=0
PYTHON_BIN=""
SCRIPTS=(manage.sh install.sh uninstall.sh release.sh run.sh)

say() { printf '[release.sh] %s\n' "$*" >&2; }
die() { printf '[release.sh] error: %s\n' "$*" >&2; exit 1; }
run() {
    printf '[release.sh] + %s\n' "$*" >&2
    if [[ $DRY_RUN -eq 0 ]]; then "$@"; fi
}

py() {
    if [[ -n "$PYTHON_BIN" ]]; then printf '%s\n' "$PYTHON_BIN"
    elif [[ -x "$ROOT/.venv/bin/python" ]]; then printf '%s\n' "$ROOT/.venv/bin/python"
    else command -v python3
    fi
}
# Our tools run from this checkout's src/, whatever is installed.
pysrc() { PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" run "$(py)" "$@"; }

dist_dir() { printf '%s\n' "${VSPEC_DIST_DIR:-$ROOT/dist}"; }

version() {
    "$(py)" - "$ROOT/src/vllm_hust_vspec/_version.py" <<'PY'
import ast, sys
for node in ast.parse(open(sys.argv[1], encoding="utf-8").read()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
        print(node.value.value)
PY
}

cmd_source_check() {
    local s
    for s in "${SCRIPTS[@]}"; do
        [[ -f "$ROOT/$s" ]] || die "source-check: $s is missing"
        run bash -n "$ROOT/$s"
    done
    pysrc -m vllm_hust_vspec.tools.manifest_check source --root "$ROOT"
}

cmd_build() {
    local d
    d="$(dist_dir)"
    cmd_source_check
    run rm -rf "$d" "$ROOT/build"
    # shellcheck disable=SC2046
    run rm -rf $(compgen -G "$ROOT/src/*.egg-info" || true)
    if command -v uv >/dev/null 2>&1; then
        run uv build --no-sources --out-dir "$d" "$ROOT"
    else
        say "uv not found: building with python -m build"
        run "$(py)" -m build --outdir "$d" "$ROOT"
    fi
    cmd_check
}

cmd_check() {
    pysrc -m vllm_hust_vspec.tools.release_audit "$(dist_dir)" --version "$(version)"
}

cmd_publish() {
    local v
    v="$(version)"
    git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
        || die "refusing to publish: $ROOT is not a git checkout"
    if [[ -n "$(git -C "$ROOT" status --porcelain)" ]]; then
        die "refusing to publish: the git tree is not clean (commit or remove every change first; see git status)"
    fi
    [[ -n "${UV_PUBLISH_TOKEN:-}" ]] || die "refusing to publish: UV_PUBLISH_TOKEN is not set"
    [[ "${VSPEC_RELEASE_CONFIRM:-}" == "$v" ]] \
        || die "refusing to publish: set VSPEC_RELEASE_CONFIRM=$v to confirm publishing version $v"
    command -v uv >/dev/null 2>&1 || die "refusing to publish: uv is not installed (pip install uv)"
    cmd_check
    local wheel sdist
    wheel="$(dist_dir)/vllm_hust_vspec-$v-py3-none-any.whl"
    sdist="$(dist_dir)/vllm_hust_vspec-$v.tar.gz"
    # uv reads UV_PUBLISH_TOKEN itself: the token never appears on a command line or in output.
    run uv publish "$wheel" "$sdist"
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

main() {
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --dry-run) DRY_RUN=1; shift ;;
            --python) [[ $# -ge 2 ]] || { say "error: --python needs a path"; exit 2; }
                      PYTHON_BIN="$2"; shift 2 ;;
            -h|--help) usage; exit 0 ;;
            *) break ;;
        esac
    done
    [[ $# -eq 1 ]] || { usage >&2; exit 2; }
    case "$1" in
        source-check) cmd_source_check ;;
        build) cmd_build ;;
        check) cmd_check ;;
        publish) cmd_publish ;;
        *) printf '[release.sh] error: unknown command %s\n' "'$1'" >&2; usage >&2; exit 2 ;;
    esac
}

main "$@"
