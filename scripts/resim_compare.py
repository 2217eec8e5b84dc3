#!/usr/bin/env python
"""Compare two re-simulations of the same paired traces: is a change to the controller better?

``resim_paired.py --json-out FILE`` writes every (trace, seed, workload cell) ratio of the
policy to the best fixed K.  Two such files, made on the same traces with the same seeds
(one before a change, one after, or two ``--config`` variants), share their random draws
until the policies part (common random numbers), so their difference per (trace, seed, cell)
is far less noisy than either figure: this script prints the mean paired difference (B -
A, in points of the best fixed K), per workload cell and over all, with its standard error
taken over the *traces* (each server's mean difference counts once: the seeds and cells
of one server share its steps, so they are not independent), and how many servers moved
each way.  A change is resolved when the difference is more than twice that error (the
script says so, or says "unresolved").

    python scripts/resim_paired.py OUT/traces/paired-r*.jsonl --results OUT/results.json --json-out a.json
    (change the controller, or pass --config)
    python scripts/resim_paired.py OUT/traces/paired-r*.jsonl --results OUT/results.json --json-out b.json
    python scripts/resim_compare.py --base a.json --change b.json

Several runs' files (each ``resim_paired.py`` call reads one bench run: one results.json)
are pooled: ``--base a1.json a2.json --change b1.json b2.json``.

Why: the controller's variants measured in the resim of the judged runs moved the mean
ratio by 0.1-0.3 points, the size of the spread between two sets of traces, and the two
figures alone cannot say whether that is a change or a draw.  Paired, the same figures
carry an error of 0.03-0.15 points (docs/controller.md, "Re-simulated on the real engine's
step times").
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import sys

from resim_paired import RESIM_FORMAT as FORMAT


class CompareError(ValueError):
    """Two resim files that cannot be compared (names the file and what is wrong)."""


def load(*paths: str) -> dict[tuple[str, int, str, int], float]:
    """(trace, seed, cell, n-th occurrence of the cell in that trace and seed) -> ratio,
    over the rows of every file (a trace in two files is refused)."""
    out: dict[tuple[str, int, str, int], float] = {}
    owner: dict[str, str] = {}
    for path in paths:
        rows = _load_one(path)
        for key, ratio in rows.items():
            if owner.setdefault(key[0], path) != path:
                raise CompareError(f"{path}: trace {key[0]} is in {owner[key[0]]} too")
            out[key] = ratio
    return out


def _load_one(path: str) -> dict[tuple[str, int, str, int], float]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise CompareError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise CompareError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("rows"), list):
        raise CompareError(f"{path}: not a resim_paired.py --json-out file (format {FORMAT!r} with 'rows')")
    out: dict[tuple[str, int, str, int], float] = {}
    seen: collections.Counter = collections.Counter()
    for i, row in enumerate(doc["rows"]):
        try:
            key = (str(row["trace"]), int(row["seed"]), str(row["cell"]))
            ratio = float(row["ratio"])
        except (KeyError, TypeError, ValueError):
            raise CompareError(f"{path}: rows[{i}]: want trace, seed, cell and ratio") from None
        seen[key] += 1
        out[(*key, seen[key])] = ratio
    if not out:
        raise CompareError(f"{path}: no rows (no judged cell in the traces?)")
    return out


def compare(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> dict:
    """The paired differences of ``b`` over ``a``: overall and per cell, each with its
    standard error over the traces (None with one trace) and the traces up / down."""
    if set(a) != set(b):
        only_a, only_b = len(set(a) - set(b)), len(set(b) - set(a))
        raise CompareError(f"{name_a} and {name_b} hold different (trace, seed, cell) rows "
                           f"({only_a} only in {name_a}, {only_b} only in {name_b}): resimulate "
                           "both on the same traces, --results and --seeds")

    def summary(keys: list) -> dict:
        by_trace: dict[str, list[float]] = collections.defaultdict(list)
        for k in keys:
            by_trace[k[0]].append(b[k] - a[k])
        means = [statistics.fmean(v) for v in by_trace.values()]
        se = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else None
        diff = statistics.fmean(b[k] - a[k] for k in keys)
        return {"a": statistics.fmean(a[k] for k in keys), "b": statistics.fmean(b[k] for k in keys),
                "diff": diff, "se": se, "traces": len(means),
                "up": sum(1 for m in means if m > 0), "down": sum(1 for m in means if m < 0),
                "resolved": se is not None and abs(diff) > 2.0 * se}

    keys = sorted(a)
    cells = sorted({k[2] for k in keys})
    return {"all": summary(keys),
            "cells": {c: summary([k for k in keys if k[2] == c]) for c in cells}}


def render(result: dict) -> str:
    def line(name: str, s: dict) -> str:
        se = "-" if s["se"] is None else f"{100 * s['se']:.2f}"
        verdict = "resolved" if s["resolved"] else "unresolved"
        return (f"| {name} | {s['a']:.4f} | {s['b']:.4f} | {100 * s['diff']:+.2f} | {se} | "
                f"{s['up']} / {s['down']} of {s['traces']} | {verdict} |")

    rows = ["| cell | A / best fixed | B / best fixed | B - A (points) | error (points) | "
            "traces up / down | |", "|---|---|---|---|---|---|---|"]
    rows += [line(c, s) for c, s in result["cells"].items()]
    rows.append(line("all", result["all"]))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", nargs="+", required=True, metavar="FILE",
                   help="resim_paired.py --json-out file(s): the baseline")
    p.add_argument("--change", nargs="+", required=True, metavar="FILE",
                   help="the same traces and seeds with the change")
    args = p.parse_args(argv)
    try:
        result = compare(load(*args.base), load(*args.change), " ".join(args.base),
                         " ".join(args.change))
    except CompareError as exc:
        p.error(str(exc))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
