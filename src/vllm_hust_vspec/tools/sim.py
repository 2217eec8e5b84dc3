"""``vllm-hust-vspec-sim``: run controller policies on a trace, or generate a trace.

Run::

    vllm-hust-vspec-sim TRACE.jsonl [--policy NAME[:ARG] ...] [--seed N] [--json]

Every fixed K in 0..kmax and (when the trace carries ``p``) the expected-acceptance oracle
are always computed. Without ``--policy`` every standard policy runs. ``--json`` prints one
object::

    {"policies": {"<name>": {"tok_s", "vs_best_fixed", "vs_oracle", "mean_k", "decide_us"}},
     "fixed": {"<k>": tok_s, ...}, "best_fixed_k": k, "oracle": {"tok_s", "mean_k"} | null}

Generate::

    vllm-hust-vspec-sim --generate KIND --out FILE [--seed N] [--scale F]

Bad input (unreadable or malformed trace, unknown policy or bad argument) prints one
``vllm-hust-vspec-sim: error: ...`` line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from vllm_hust_vspec.adaptive.generators import KINDS, generate
from vllm_hust_vspec.names import STANDARD_POLICIES
from vllm_hust_vspec.adaptive.simulate import SimReport, Trace, TraceError, read_trace, simulate, write_trace

PROG = "vllm-hust-vspec-sim"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Simulate adaptive speculative-decoding policies on a vspec trace (JSON lines), "
        "against every fixed K and the expected-acceptance oracle; or generate a synthetic trace.",
    )
    p.add_argument("trace", nargs="?", metavar="TRACE.jsonl", help="trace to simulate (see docs/formats.md)")
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAME[:ARG]",
        help="policy to run (repeatable), e.g. online, budget[:COSTS.json], profile[:PROFILE.json], fixed:3, "
        "schedule:1-4:4,5-32:2 (profile without a path uses a profile fitted to the trace's own cost "
        f"model); default: the standard policies ({', '.join(STANDARD_POLICIES)})",
    )
    p.add_argument(
        "--seed", type=int, metavar="N",
        help="noise seed for a run (default: the trace header's seed); generator seed with --generate (default 0)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--generate", choices=KINDS, metavar="KIND", help=f"generate a trace: {', '.join(KINDS)}")
    p.add_argument("--out", metavar="FILE", help="where --generate writes the trace")
    p.add_argument(
        "--scale", type=float, default=1.0, metavar="F",
        help="size multiplier for --generate (requests or duration; default 1.0)",
    )
    return p


def _table(trace: Trace, report: SimReport, seed: int) -> str:
    doc = report.to_json()
    tokens = sum(len(r.accept_len) for r in trace.requests)
    h = trace.header
    lines = [
        f"trace {trace.source}: {len(trace.requests)} requests, {tokens} tokens, kmax {h.kmax}, "
        f"max_num_seqs {h.max_num_seqs}, noise seed {seed}",
        f"{'policy':<24} {'tok/s':>10} {'vs best fixed':>14} {'vs oracle':>10} {'mean K':>7} {'decide us':>10}",
    ]
    for name, row in doc["policies"].items():
        vs_or = "-" if row["vs_oracle"] is None else f"{row['vs_oracle']:.3f}"
        lines.append(
            f"{name:<24} {row['tok_s']:>10.1f} {row['vs_best_fixed']:>14.3f} {vs_or:>10} "
            f"{row['mean_k']:>7.2f} {row['decide_us']:>10.1f}"
        )
    fixed = "  ".join(f"{k}={v:.1f}" for k, v in doc["fixed"].items())
    lines.append(f"fixed K tok/s: {fixed}  (best K={doc['best_fixed_k']})")
    if doc["oracle"] is None:
        lines.append("oracle: not computed (the trace has no 'p')")
    else:
        lines.append(f"oracle: {doc['oracle']['tok_s']:.1f} tok/s, mean K {doc['oracle']['mean_k']:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    def fail(msg: str) -> int:
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2

    if args.generate is not None:
        if args.trace is not None or args.policy or args.json:
            return fail("--generate takes only --out, --seed and --scale (no TRACE, --policy or --json)")
        if not args.out:
            return fail("--generate needs --out FILE")
        seed = 0 if args.seed is None else args.seed
        if seed < 0:
            return fail(f"--seed must be >= 0, got {seed}")
        try:
            trace = generate(args.generate, seed, args.scale)
            write_trace(trace, args.out)
        except ValueError as exc:
            return fail(str(exc))
        except OSError as exc:
            return fail(f"cannot write {args.out}: {exc.strerror}")
        tokens = sum(len(r.accept_len) for r in trace.requests)
        print(f"wrote {args.out}: {args.generate} seed {seed}, {len(trace.requests)} requests, {tokens} tokens")
        return 0

    if args.trace is None:
        return fail("a TRACE.jsonl is required (or --generate KIND --out FILE)")
    if args.out is not None or args.scale != 1.0:
        return fail("--out and --scale only go with --generate")
    if args.seed is not None and args.seed < 0:
        return fail(f"--seed must be >= 0, got {args.seed}")
    try:
        trace = read_trace(args.trace)
    except TraceError as exc:
        return fail(str(exc))
    policies = list(args.policy) if args.policy else list(STANDARD_POLICIES)
    seed = trace.header.seed if args.seed is None else args.seed
    try:
        report = simulate(trace, policies, seed)
    except (ValueError, TraceError) as exc:
        return fail(str(exc))
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(_table(trace, report, seed))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
