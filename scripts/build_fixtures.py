#!/usr/bin/env python3
"""Build (or find cached) the tiny trained model fixtures; print their directory last.

Layout, manifest keys and budgets: docs/fixtures.md. Progress goes to stderr; the only stdout
line is the fixture directory ``<root>/<hash>`` (``root`` = ``$VSPEC_FIXTURES_DIR`` or
``~/.cache/vllm-hust-vspec/fixtures``), and ``<root>/current`` points at it afterwards.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import signal
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from fixtures import params as P  # noqa: E402
from fixtures import store  # noqa: E402

MODEL_DIRS = ("target", "target-large", "draft", "eagle", "eagle3", "mtp", "mtp-large")


def parse_args(argv: list[str]) -> tuple[P.BuildParams, pathlib.Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    ap.add_argument("--scale", type=float, default=None,
                    help=f"multiply the training step budget (default 1.0 = {P.FULL_TARGET_STEPS} target + "
                         f"{P.FULL_HEAD_STEPS} drafter steps)")
    ap.add_argument("--quick", action="store_true", help=f"a plumbing build in a few minutes (--scale {P.QUICK_SCALE})")
    ap.add_argument("--large-intermediate", type=int, default=16384,
                    help="MLP width of target-large / mtp-large (zero-padded, same function; default 16384)")
    ap.add_argument("--no-mal", action="store_true",
                    help="skip the vLLM acceptance measurement (manifest mal_k4 stays null)")
    ap.add_argument("--root", default=None, help="fixture root (default $VSPEC_FIXTURES_DIR or "
                                                 "~/.cache/vllm-hust-vspec/fixtures)")
    a = ap.parse_args(argv)
    if a.quick and a.scale is not None:
        ap.error("--quick and --scale are exclusive")
    scale = P.QUICK_SCALE if a.quick else (1.0 if a.scale is None else a.scale)
    try:
        params = P.BuildParams(seed=a.seed, scale=scale, large_intermediate=a.large_intermediate,
                               measure_mal=not a.no_mal)
    except ValueError as e:
        ap.error(str(e))
    return params, store.root_dir(a.root)


def main(argv: list[str]) -> int:
    params, root = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the temp-dir cleanup on kill
    key = P.build_hash(params)
    final = root / key
    if not store.is_complete(final):
        with store.locked(root, key):
            if not store.is_complete(final):
                from fixtures import build

                tmp = store.temp_dir(root, key)
                try:
                    build.build(tmp, params, key)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                store.publish(tmp, final)
    else:
        print(f"[fixtures] cached build {final}", file=sys.stderr)
    store.point_current(root, final)
    print(final)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
