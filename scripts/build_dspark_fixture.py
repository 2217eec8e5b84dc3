#!/usr/bin/env python3
"""Build (or find cached) the DSpark drafter fixture on a fixture build; print its directory last.

It trains on the build's ``target`` (so ``./manage.sh fixtures`` first: ``--build`` defaults
to ``<root>/current``) and writes ``<build>/dspark/`` under its own hash (the base and full
builds keep theirs). What it trains and what its ``manifest.json`` records:
``scripts/dspark_fixture/build.py`` and docs/fixtures.md.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from dspark_fixture import build as B  # noqa: E402
from fixtures import params as P  # noqa: E402
from fixtures import malloc  # noqa: E402
from fixtures import store  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=None,
                    help="the fixture build to train on (default: <root>/current, root = $VSPEC_FIXTURES_DIR "
                         "or ~/.cache/vllm-hust-vspec/fixtures)")
    ap.add_argument("--steps", type=int, default=B.STEPS, help=f"training steps (default {B.STEPS})")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    ap.add_argument("--threads", type=int, default=P.THREADS, help=f"torch threads (default {P.THREADS})")
    a = ap.parse_args(argv)
    build_dir = pathlib.Path(a.build) if a.build else store.root_dir() / "current"
    if not store.has_stage(build_dir, "base"):
        ap.error(f"--build {build_dir}: no published fixture build there (run ./manage.sh fixtures first)")
    build_dir = build_dir.resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    key = B.stage_key(build_dir, a.steps, a.seed, a.threads)
    with store.locked(build_dir.parent, f"{build_dir.name}-{B.DIR}"):
        if B.built(build_dir, key):
            print(f"[dspark] cached {build_dir / B.DIR} ({key})", file=sys.stderr)
        else:
            B.build(build_dir, key, a.steps, a.seed, a.threads)
    print(build_dir / B.DIR)
    return 0


if __name__ == "__main__":
    malloc.reexec_with_tunables()  # training reuses freed memory (scripts/fixtures/malloc.py)
    sys.exit(main(sys.argv[1:]))
