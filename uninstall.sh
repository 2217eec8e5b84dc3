#!/usr/bin/env bash
# uninstall.sh: alias of `./manage.sh uninstall` (disable, forget, pip uninstall); accepts
# --python P and --dry-run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$ROOT/manage.sh" "$@" uninstall
