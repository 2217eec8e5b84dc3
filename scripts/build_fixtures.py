#!/usr/bin/env python3
"""Build (or find cached) the tiny trained model fixtures; print their directory last.

Layout, manifest keys, stages and budgets: docs/fixtures.md. Progress goes to stderr (a bar
on a terminal, periodic lines otherwise); the only stdout line is the fixture directory
``<root>/<hash>`` (``root`` = ``$VSPEC_FIXTURES_DIR`` or ``~/.cache/vllm-hust-vspec/fixtures``),
and ``<root>/current`` points at it afterwards. ``--stage base`` stops after what the demo
needs (target, target-large, draft, prompts); a later full build finishes the same
directory (same hash, same bits as a build in one go).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import signal
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from fixtures import params as P  # noqa: E402
from fixtures import malloc  # noqa: E402
from fixtures import store  # noqa: E402



def parse_args(argv: list[str]) -> tuple[P.BuildParams, pathlib.Path, str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    ap.add_argument("--scale", type=float, default=None,
                    help=f"multiply the training step budget (default 1.0 = {P.FULL_TARGET_STEPS} target + "
                         f"{P.FULL_DRAFTER_STEPS} drafter steps)")
    ap.add_argument("--quick", action="store_true", help=f"a plumbing build in a few minutes (--scale {P.QUICK_SCALE})")
    ap.add_argument("--large-intermediate", type=int, default=16384,
                    help="MLP width of target-large / mtp-large (zero-padded, same function; default 16384)")
    ap.add_argument("--no-mal", action="store_true",
                    help="skip the vLLM acceptance measurement (manifest mal_k4 stays null)")
    ap.add_argument("--threads", type=int, default=P.THREADS,
                    help=f"torch threads for training (default {P.THREADS}; another count gives other bits, "
                         "the same guaranteed quality)")
    ap.add_argument("--precision", choices=("auto", *P.PRECISIONS), default="auto",
                    help="training precision: bf16 (autocast, fp32 weights) or fp32; auto (default): bf16 "
                         "where the CPU has native bf16, fp32 elsewhere (an emulated bf16 step costs ~18x)")
    ap.add_argument("--stage", choices=P.STAGES, default="full",
                    help="base: only what the demo needs (target, target-large, draft, prompts); "
                         "full (default): also the heads and the vLLM acceptance measurement")
    ap.add_argument("--root", default=None, help="fixture root (default $VSPEC_FIXTURES_DIR or "
                                                 "~/.cache/vllm-hust-vspec/fixtures)")
    a = ap.parse_args(argv)
    if a.quick and a.scale is not None:
        ap.error("--quick and --scale are exclusive")
    scale = P.QUICK_SCALE if a.quick else (1.0 if a.scale is None else a.scale)
    try:
        params = P.BuildParams(seed=a.seed, scale=scale, large_intermediate=a.large_intermediate,
                               measure_mal=not a.no_mal, threads=a.threads,
                               precision=P.auto_precision() if a.precision == "auto" else a.precision)
    except ValueError as e:
        ap.error(str(e))
    return params, store.root_dir(a.root), a.stage


def main(argv: list[str]) -> int:
    params, root, stage = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the temp-dir cleanup on kill
    key = P.build_hash(params)
    final = root / key
    if not store.has_stage(final, stage):
        with store.locked(root, key):
            if not store.has_stage(final, "base"):
                from fixtures import build

                tmp = store.temp_dir(root, key)
                try:
                    build.build_base(tmp, params, key)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                store.publish(tmp, final)
            if not store.has_stage(final, stage):
                from fixtures import build

                build.build_full(final, params, key)
    else:
        print(f"[fixtures] cached build {final} (stage {store.stage_of(final)})", file=sys.stderr)
    store.point_current(root, final)
    print(final)
    return 0

if __name__ == "__main__":
    malloc.reexec_with_tunables()  # training reuses freed memory (scripts/fixtures/malloc.py)
    sys.exit(main(sys.argv[1:]))
