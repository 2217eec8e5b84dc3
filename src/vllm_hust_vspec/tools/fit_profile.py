"""``vllm-hust-vspec-fit-profile SAMPLES.json PROFILE.json``: fit a latency profile.

Fits, per component (target, draft), ``latency_ms = alpha * context_tokens +
gamma * batched_tokens + delta_ms`` by non-negative least squares from measured samples,
writes the profile (schema_version 2) and validates it by loading it back. Formats:
``docs/formats.md``. Malformed samples (too few, rank-deficient, negative or non-finite
values, unknown keys) print one ``vllm-hust-vspec-fit-profile: error: ...`` line and exit 2;
nothing is written then.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vllm_hust_vspec.adaptive.profile import ProfileError, fit_profile, load_profile, load_samples

PROG = "vllm-hust-vspec-fit-profile"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Fit the profile policy's latency model (per component: alpha*context_tokens + "
        "gamma*batched_tokens + delta_ms, non-negative least squares) from measured samples.",
    )
    parser.add_argument("samples", metavar="SAMPLES.json", help="target_samples/draft_samples (docs/formats.md)")
    parser.add_argument("profile", metavar="PROFILE.json", help="where to write the fitted profile")
    args = parser.parse_args(argv)
    try:
        profile = fit_profile(load_samples(args.samples), source=args.samples)
    except ProfileError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        profile.save(args.profile)
    except OSError as exc:
        print(f"{PROG}: error: cannot write {args.profile}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        loaded = load_profile(args.profile)
    except ProfileError as exc:  # the fit produced something the loader refuses: a bug
        print(f"{PROG}: error: the written profile does not load back: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.profile}")
    for name in ("target", "draft"):
        model = getattr(loaded, name)
        fit = (loaded.fit or {}).get(name, {})
        print(
            f"  {name}: latency_ms = {model.alpha:.6g} * context_tokens + {model.gamma:.6g} * batched_tokens "
            f"+ {model.delta_ms:.6g}  ({fit.get('samples')} samples, rmse {fit.get('rmse_ms', float('nan')):.3g} ms)"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
