"""``vllm-hust-vspec``: build the vLLM server command from presets, TOML and flags, then
run it as a supervised child (:mod:`~vllm_hust_vspec.launcher.supervise`: a stop signal ends
every process of the server, also while it starts), or print it with ``--dry-run``."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from vllm_hust_vspec import methods
from vllm_hust_vspec.host.detect import find_installed
from vllm_hust_vspec.launcher import model_store, supervise
from vllm_hust_vspec.launcher.command import LaunchPlan, build_plan
from vllm_hust_vspec.launcher.errors import LaunchError
from vllm_hust_vspec.launcher.parser import PROG
from vllm_hust_vspec.launcher.resolve import Resolved, resolve


def render_text(plan: LaunchPlan, res: Resolved) -> str:
    lines = [f"# vllm-hust-vspec dry run (platform {res.platform}; models are not checked)",
             "# environment set by the launcher:"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in plan.env.items()]
    lines += [f"unset {k}" for k in plan.unset]
    lines.append("# server command:")
    lines.append(shlex.join([plan.executable] + plan.argv[1:]))
    return "\n".join(lines)


def prepare(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[Resolved, LaunchPlan]:
    res = resolve(argv, environ)
    plan = build_plan(res, environ)
    return res, plan


def run_plan(plan: LaunchPlan, environ: Mapping[str, str]) -> int:
    """Run the server command under the launcher's supervision; its exit status."""
    env = {k: v for k, v in environ.items() if k not in plan.unset}
    env.update(plan.env)
    argv = [plan.executable] + plan.argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return supervise.run(plan.executable, argv, env)
    except OSError as exc:
        raise LaunchError(f"cannot start {plan.executable}: {exc.strerror}") from None


def check_host_method(method: str) -> None:
    """Refuse, before anything starts, a method the installed vLLM has no proposer for."""
    host_dir = find_installed("vllm")
    if host_dir is None:
        return  # no host here: the server's own start says so
    why = methods.host_lacks(method, host_dir)
    if why is not None:
        raise LaunchError(f"--method {method}: {why}; choose another method")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    environ = dict(os.environ)
    try:
        res, plan = prepare(argv, environ)
        if res.set_aside:
            print(f"{PROG}: --method none: runs the target without speculation; set aside "
                  + ", ".join(f"{name} ({src})" for name, src in res.set_aside),
                  file=sys.stderr)
        if res.values.dry_run:
            print(plan.as_json() if res.values.json else render_text(plan, res))
            return 0
        check_host_method(res.values.method)
        lookups = [lk for lk in (res.target, res.draft) if lk is not None]
        model_store.check_exist(res.values.method, lookups)
        print(f"{PROG}: " + shlex.join([plan.executable] + plan.argv[1:]), file=sys.stderr)
        return run_plan(plan, environ)
    except LaunchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
