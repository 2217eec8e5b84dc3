#!/usr/bin/env bash
# run.sh: start vLLM with a preset from configs/.
#   ./run.sh PRESET [flags] [-- native vLLM args]   = vllm-hust-vspec --config configs/PRESET.toml ...
#   ./run.sh list                                   list the presets
#   ./run.sh demo                                   set up, then a short A/B benchmark (scripts/demo.sh)
# VSPEC_CONFIG (legacy SPECSLO_CONFIG, SPECASCEND_CONFIG) replaces the preset's file.
# tiny-cpu-* presets use the model fixtures at $VSPEC_FIXTURES or
# ${VSPEC_FIXTURES_DIR:-~/.cache/vllm-hust-vspec/fixtures}/current (./manage.sh fixtures builds them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONFIGS="$ROOT/configs"

die() { printf 'run.sh: error: %s\n' "$*" >&2; exit 2; }

presets() {
    local f
    for f in "$CONFIGS"/*.toml; do
        [[ -e "$f" ]] || continue
        f="${f##*/}"
        printf '%s\n' "${f%.toml}"
    done
}

python_bin() {
    if [[ -n "${PYTHON_BIN:-}" ]]; then
        printf '%s\n' "$PYTHON_BIN"
    elif [[ -x "$ROOT/.venv/bin/python" ]]; then
        printf '%s\n' "$ROOT/.venv/bin/python"
    else
        command -v python3 || die "no python found (set PYTHON_BIN)"
    fi
}

[[ $# -gt 0 ]] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
preset="$1"
shift

case "$preset" in
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    list) presets; exit 0 ;;
    demo) exec "$ROOT/scripts/demo.sh" "$@" ;;  # short A/B on the fixtures (scripts/demo.sh)
esac

config="$CONFIGS/$preset.toml"
[[ "$preset" != */* && -f "$config" ]] \
    || die "unknown preset '$preset' (presets: $(presets | paste -sd' ' -); ./run.sh list)"

for var in VSPEC_CONFIG SPECSLO_CONFIG SPECASCEND_CONFIG; do
    if [[ -n "${!var:-}" ]]; then
        printf 'run.sh: %s=%s replaces %s\n' "$var" "${!var}" "configs/$preset.toml" >&2
        config="${!var}"
        break
    fi
done

if [[ "$preset" == tiny-cpu-* ]]; then
    fixtures="${VSPEC_FIXTURES:-${VSPEC_FIXTURES_DIR:-$HOME/.cache/vllm-hust-vspec/fixtures}/current}"
    dry=0
    for a in "$@"; do
        [[ "$a" == "--" ]] && break
        [[ "$a" == "--dry-run" ]] && dry=1
    done
    if [[ $dry -eq 0 && ! -f "$fixtures/manifest.json" ]]; then
        die "model fixtures not found at $fixtures: run ./manage.sh fixtures (run.sh never builds them)"
    fi
    # a 'base' build (what ./run.sh demo builds first) has target, target-large and draft only
    if [[ $dry -eq 0 && "$preset" != tiny-cpu-draft && "$preset" != tiny-cpu-ngram ]] \
        && grep -q '"stage": "base"' "$fixtures/manifest.json"; then
        die "the model fixtures at $fixtures are the demo's part (no eagle, eagle3, mtp yet): run ./manage.sh fixtures to finish them"
    fi
    # the DSpark drafter is its own stage on a full build (./manage.sh fixtures builds it)
    if [[ $dry -eq 0 && "$preset" == tiny-cpu-dspark && ! -f "$fixtures/dspark/manifest.json" ]]; then
        die "the model fixtures at $fixtures have no DSpark drafter (dspark/): run ./manage.sh fixtures to build it"
    fi
    export HUST_VSPEC_MODEL_DIR="$fixtures"
fi

exec "$(python_bin)" -m vllm_hust_vspec --config "$config" "$@"
