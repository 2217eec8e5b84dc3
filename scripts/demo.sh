#!/usr/bin/env bash
# scripts/demo.sh (= ./run.sh demo): the product working on a fresh machine, no GPU, no model.
#   1. sets up what is missing: .venv (./manage.sh install --dev) and the part of the tiny model
#      fixtures the demo uses (./manage.sh fixtures --stage base: target, target-large, draft,
#      prompts; both are no-ops when already there; ./manage.sh fixtures finishes the rest later);
#   2. runs a short A/B on the large fixture pair (target-large + draft, configs/tiny-cpu-draft.toml),
#      one round on the `code` and `swing` workloads: none (target only) and online (the plugin)
#      on their own fresh servers, and `paired`: one server in which fixed K = 0..Kmax and online
#      take turns, each serving every wave of requests once, the same texts (this machine's
#      speed drifts by tens of percent within minutes: only a comparison inside one engine shows
#      online against each fixed K, and only on the same texts at these short cells; fixed K = 0
#      is the plugin drafting nothing, target-only's steps in the same engine); the paired
#      server serves three waves a cell (the first the other servers' texts), so that each of
#      its ratios is a median of three rotation rounds rather than one wave at one moment;
#      before each server it waits (at most 60 s) for the load average to fall to 1.2: a server
#      started right after the one before read that server's tail (1.56 before a demo's paired
#      server, 2026-12-07), which by the benchmarks' rule (above ~1.5) judges nothing;
#   3. prints the ratio tables, writes ab.png, report.md and results.json, stops every server, and
#      prints the path of results.json as its last line.
# Env: VSPEC_FIXTURES (use this fixture directory instead of ./manage.sh fixtures), VSPEC_DEMO_DIR
#      (default ~/.cache/vllm-hust-vspec/demo/<UTC time>).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf '[demo] %s\n' "$*" >&2; }
die() { printf '[demo] error: %s\n' "$*" >&2; exit 1; }

say "set-up: ./manage.sh install --dev (skipped when the venv is complete)"
"$ROOT/manage.sh" install --dev >&2
PY="$ROOT/.venv/bin/python"
if [[ -n "${VSPEC_FIXTURES:-}" ]]; then
    FIXTURES="$VSPEC_FIXTURES"
    [[ -f "$FIXTURES/manifest.json" ]] || die "VSPEC_FIXTURES=$FIXTURES holds no manifest.json (unset it to build the fixtures)"
    say "set-up: fixtures from VSPEC_FIXTURES"
else
    say "set-up: ./manage.sh fixtures --stage base (the models the demo uses; cached after the first build)"
    FIXTURES="$("$ROOT/manage.sh" fixtures --stage base | tail -n 1)"
    [[ -f "$FIXTURES/manifest.json" ]] || die "./manage.sh fixtures did not give a fixture directory (got '$FIXTURES')"
fi

OUT="${VSPEC_DEMO_DIR:-$HOME/.cache/vllm-hust-vspec/demo/$(date -u +%Y%m%d-%H%M%S)}"
say "fixtures: $FIXTURES"
say "A/B: none and online (fresh servers), paired (fixed K = 0..Kmax and online in one server); workloads code, swing; results in $OUT"

export HUST_VSPEC_MODEL_DIR="$FIXTURES"
exec "$PY" -m vllm_hust_vspec.tools.bench ab \
    --configs "none,online,paired" --paired-waves --paired-policies fixed:0,fixed,online \
    --workloads code,swing --concurrency 1,4,16 \
    --quiet-load 1.2 --quiet-timeout 60 \
    --rounds 1 --output-len 48 --requests-per-slot 1 --min-requests 2 --paired-requests-per-slot 3 \
    --prompts-dir "$FIXTURES/prompts" --output-dir "$OUT" \
    -- --config "$ROOT/configs/tiny-cpu-draft.toml" --max-num-seqs 16
