#!/usr/bin/env python3
"""The long fuzz run of every loader of a user file (and the launcher's argv).

The same strategies as ``tests/unit/test_fuzz_loaders.py`` (from
``tests/unit/fuzz_strategies.py``), many more cases, and a table instead of a failure:
per loader the cases run, the valid objects returned, the distinct error messages seen
(after replacing paths and numbers) and the tracebacks (must be 0; the other failure
columns too: an error naming no file/key, a multi-line message, a returned object that
fails its check).  Nothing starts an engine or a server.

    nice -n 19 .venv/bin/python scripts/fuzz_loaders.py --cases 10000
    .venv/bin/python scripts/fuzz_loaders.py --loader profile --cases 2000 --seed 3

Exit status 1 when any loader had a failure.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import shutil
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit"))

import hypothesis  # noqa: E402
from hypothesis import HealthCheck, Phase, given  # noqa: E402

import fuzz_strategies as F  # noqa: E402

BAD = ("traceback", "unnamed", "multiline", "invalid")


def run_loader(loader: F.Loader, cases: int, seed: int, workdir: pathlib.Path,
               show: int) -> dict[str, object]:
    counts: collections.Counter[str] = collections.Counter()
    distinct: set[str] = set()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    bad_kinds: collections.Counter[str] = collections.Counter()

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=cases, deadline=None, database=None,
                         phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(loader.cases)
    def body(case: object) -> None:
        out = F.classify(loader, case, workdir)
        counts["cases"] += 1
        counts[out.kind] += 1
        if out.kind == "error":
            distinct.add(F.normalize(out.message, workdir))
        elif out.kind in BAD:
            key = F.normalize(out.message, workdir)
            if out.kind == "traceback":  # one row per exception type and raising line
                key = out.message.split(": ", 1)[0]
            key = key[:200]
            bad_kinds[f"{out.kind}: {key}"] += 1
            if len(examples[key]) < show:
                examples[key].append(f"{case!r}"[:3000] + f"\n{out.message}\n{out.detail[-1500:]}")

    start = time.monotonic()
    body()
    return {"counts": counts, "distinct": distinct, "bad": bad_kinds, "examples": examples,
            "seconds": time.monotonic() - start}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=10000, help="cases per loader (default %(default)s)")
    p.add_argument("--loader", action="append", default=None,
                   help="run only this loader (repeatable); default: all")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed (default %(default)s)")
    p.add_argument("--show", type=int, default=1,
                   help="failing inputs printed per distinct failure (default %(default)s)")
    p.add_argument("--messages", action="store_true",
                   help="print every distinct (normalised) error message")
    a = p.parse_args(argv)
    workdir = F.make_workdir()
    hypothesis.configuration.set_hypothesis_home_dir(str(workdir / ".hypothesis"))
    table = F.loaders(workdir)
    names = a.loader or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        p.error(f"unknown loader {unknown[0]!r} (known: {', '.join(table)})")
    rows = []
    failed = False
    try:
        for name in names:
            r = run_loader(table[name], a.cases, a.seed, workdir, a.show)
            c = r["counts"]
            rows.append((name, c["cases"], c["valid"], c["error"], len(r["distinct"]),
                         c["traceback"], c["unnamed"] + c["multiline"] + c["invalid"], r["seconds"]))
            print(f"{name}: {c['cases']} cases in {r['seconds']:.0f} s", file=sys.stderr, flush=True)
            if a.messages:
                for m in sorted(r["distinct"]):
                    print(f"  [{name}] {m}")
            for kind, n in sorted(r["bad"].items()):
                failed = True
                print(f"\n=== {name}: {n} x {kind}")
                key = kind.split(": ", 1)[1]
                for ex in r["examples"].get(key, []):
                    print(ex)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    head = ("loader", "cases", "valid", "errors", "distinct errors", "tracebacks", "other failures", "s")
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(f"{v:.0f}" if isinstance(v, float) else str(v) for v in row) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
