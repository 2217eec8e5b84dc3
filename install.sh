#!/usr/bin/env bash
# install.sh: alias of `./manage.sh install --editable` (options are passed on, e.g. --enable,
# --python P, --dry-run).  Use ./manage.sh install --dev for the development set-up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pre=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) pre+=("$1"); shift ;;
        --python) pre+=("$1" "${2:?--python needs a path}"); shift 2 ;;
        *) break ;;
    esac
done
exec "$ROOT/manage.sh" "${pre[@]}" install --editable "$@"
