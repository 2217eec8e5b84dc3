"""``vllm-hust-vspec-profile``: measure this host's step cost on a fixed-K grid, fit a latency
profile, pick a per-batch K table.

For each K of ``--gammas`` it starts ONE real server through the launcher (the user's preset
and host flags, Kmax = the largest K, the plugin on with ``--adaptive-policy fixed
--adaptive-fixed-gamma K`` so every step runs at K and the decision trace times every step),
drives it at each batch size of ``--batches`` (concurrency = batch) and each output length of
``--output-lens`` with vLLM's serving benchmark, and stops it.  Per grid cell it records output
tok/s, TPOT, mean accepted length and the median wall time of the steps that ran at the full
batch (from the decision trace).

Then:

* ``measurements.json``: every cell plus a manifest (host, models, flags, versions, grid);
* ``samples.json``: the input of ``vllm-hust-vspec-fit-profile``.  A step at batch B and K
  costs ``target(ctx, B*(K+1)) + n(K) * draft(ctx, B)`` (``n(K)`` draft forwards, one even at
  K = 0 on vLLM 0.32); one joint non-negative least-squares fit over the grid separates the two
  components, and each cell's measured step time is split accordingly into a target sample
  and a draft sample (``ctx`` = B x (mean prompt tokens + output length / 2));
* ``profile.json`` (or ``--output-profile``): the profile fitted from those samples (the
  same fit as ``vllm-hust-vspec-fit-profile``), with ``batch_gamma_policy`` = for each batch
  size the K of the highest measured output tok/s, ``max_speculative_tokens`` = Kmax and
  ``default_acceptance_rate`` = the measured draft-token acceptance.

The per-batch table is what ``vllm-hust-vspec-bench ab --native-table PROFILE.json`` gives
vLLM as ``num_speculative_tokens_per_batch_size``.

Launcher arguments follow ``--``::

    vllm-hust-vspec-profile --output-dir prof -- --config configs/tiny-cpu-draft.toml --max-num-seqs 16
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

from vllm_hust_vspec.adaptive.costmodel import nnls
from vllm_hust_vspec.adaptive.profile import ProfileError, fit_profile, load_profile
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.fileio import write_atomic
from vllm_hust_vspec.launcher.errors import LaunchError
from vllm_hust_vspec.methods import draft_forwards
from vllm_hust_vspec.progress import Progress, format_seconds
from vllm_hust_vspec.settings import SettingsError

from . import bench_configs as cfgs
from . import bench_workloads as wl
from .bench_ab import default_prompts_dir, free_port, machine_info
from .bench_configs import BenchConfig
from .bench_server import Server, ServerCommand, ServerError, plugin_command, resolve_base

PROG = "vllm-hust-vspec-profile"
OWNED = ("--gamma", "--adaptive-fixed-gamma")


class ProfileToolError(VspecError):
    """Bad input or a failed measurement, reported once."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0], allow_abbrev=False,
                epilog="Launcher arguments (preset, models, host flags) follow --.")
    p.add_argument("--batches", default="1,4,16", metavar="B,B",
                   help="Batch sizes (= concurrency) of the grid (default %(default)s).")
    p.add_argument("--gammas", default=None, metavar="K,K",
                   help="K values of the grid (default 0..Kmax, Kmax = the launcher's --gamma).")
    p.add_argument("--output-lens", default="32,96", metavar="L,L",
                   help="Output lengths of the grid (default %(default)s); they also vary the "
                        "context the fit sees.")
    p.add_argument("--workload", default="mixed", choices=[w for w in wl.WORKLOADS if w != wl.SWING],
                   help="Prompts of the grid (default %(default)s).")
    p.add_argument("--requests-per-slot", type=int, default=3,
                   help="Requests per cell = batch x this (default %(default)s).")
    p.add_argument("--prompts-dir", default=None,
                   help="Directory of the prompt sets (default: the fixtures' prompts/).")
    p.add_argument("--output-dir", default="vspec-profile",
                   help="Where measurements, samples and the profile go (default %(default)s).")
    p.add_argument("--output-profile", default=None,
                   help="Profile path (default OUTPUT_DIR/profile.json).")
    p.add_argument("--start-timeout", type=float, default=600.0,
                   help="Seconds a server may take to become ready (default %(default)s).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true",
                   help="Validate, print each server command and the grid, start nothing.")
    return p


# --------------------------------------------------------------------------- analysis


def step_times(records: Sequence[dict[str, Any]], batch: int, k: int) -> list[float]:
    """Wall times (ms) of the traced steps that ran at ``batch`` and ``k``."""
    decided: dict[int, tuple[int, int]] = {}
    out = []
    for rec in records:
        if "k" in rec and "policy" in rec:
            decided[int(rec["step"])] = (int(rec.get("batch") or 0), int(rec["k"]))
        elif "drafted" in rec and rec.get("ms") is not None:
            d = decided.get(int(rec["step"]))
            if d == (batch, k):
                out.append(float(rec["ms"]))
    return out


def joint_fit(cells: Sequence[dict[str, Any]], method: str) -> np.ndarray:
    """NNLS of ``step_ms = a_t*ctx + g_t*B*(K+1) + d_t + n(K)*(a_d*ctx + g_d*B + d_d)``;
    returns ``[a_t, g_t, d_t, a_d, g_d, d_d]``."""
    rows, y = [], []
    for c in cells:
        b, k, ctx = c["batch"], c["k"], c["context_tokens"]
        n = draft_forwards(method, k)
        rows.append([ctx, b * (k + 1), 1.0, n * ctx, n * b, float(n)])
        y.append(c["step_ms"])
    a = np.asarray(rows, dtype=float)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    if len(rows) < 6 or np.linalg.matrix_rank(a / scale) < 6:
        raise ProfileToolError(
            f"the grid is too small to separate target and draft cost ({len(rows)} measured "
            "cells): use at least 2 batch sizes, 2 output lengths and 2 K values")
    return nnls(a, np.asarray(y, dtype=float))


def samples_doc(cells: Sequence[dict[str, Any]], method: str, kmax: int,
                policy: dict[int, int], acceptance: float | None) -> dict[str, Any]:
    coef = joint_fit(cells, method)
    at, gt, dt_, ad, gd, dd = (float(x) for x in coef)
    target, draft = [], []
    for c in cells:
        b, k, ctx, ms = c["batch"], c["k"], c["context_tokens"], c["step_ms"]
        n = draft_forwards(method, k)
        t_tokens = b * (k + 1)
        draft_pred = ad * ctx + gd * b + dd
        target_pred = at * ctx + gt * t_tokens + dt_
        target.append({"context_tokens": ctx, "batched_tokens": t_tokens,
                       "latency_ms": round(max(ms - n * draft_pred, 0.0), 4)})
        if n > 0:
            draft.append({"context_tokens": ctx, "batched_tokens": b,
                          "latency_ms": round(max((ms - target_pred) / n, 0.0), 4)})
    doc: dict[str, Any] = {"target_samples": target, "draft_samples": draft,
                           "max_speculative_tokens": kmax,
                           "batch_gamma_policy": {str(b): k for b, k in sorted(policy.items())}}
    if acceptance is not None:
        doc["default_acceptance_rate"] = round(acceptance, 4)
    return doc


def pick_table(cells: Sequence[dict[str, Any]]) -> dict[int, int]:
    """Per batch size, the K with the highest output tok/s (tokens / time over the output
    lengths); ties go to the smaller K."""
    agg: dict[tuple[int, int], list[float]] = {}
    for c in cells:
        t = agg.setdefault((c["batch"], c["k"]), [0.0, 0.0])
        t[0] += c["output_tokens"]
        t[1] += c["duration_s"]
    best: dict[int, tuple[float, int]] = {}
    for (b, k), (tok, sec) in sorted(agg.items()):
        rate = tok / sec if sec > 0 else 0.0
        if b not in best or rate > best[b][0]:
            best[b] = (rate, k)
    return {b: k for b, (_, k) in best.items()}


# --------------------------------------------------------------------------- run


class _Grid:
    def __init__(self, a: argparse.Namespace, launcher_args: Sequence[str]) -> None:
        if not launcher_args:
            raise ProfileToolError("give the server's launcher arguments after --, e.g. "
                                   "-- --config configs/tiny-cpu-draft.toml --max-num-seqs 16")
        for arg in launcher_args:
            if arg == "--":
                break
            if arg.split("=", 1)[0] in OWNED:
                raise ProfileToolError(f"launcher argument {arg!r}: the profile sets it per "
                                       "server (use --gammas)")
        environ = dict(os.environ)
        self.batches = cfgs.parse_int_list(a.batches, "--batches")
        self.output_lens = cfgs.parse_int_list(a.output_lens, "--output-lens")
        if a.requests_per_slot < 1:
            raise ProfileToolError("--requests-per-slot must be >= 1")
        prompts_dir = pathlib.Path(a.prompts_dir) if a.prompts_dir else default_prompts_dir()
        self.sets = wl.load_prompt_sets(prompts_dir, [a.workload])
        self.base = resolve_base(launcher_args, environ)
        kmax0 = self.base.kmax
        self.gammas = (cfgs.parse_int_list(a.gammas, "--gammas", minimum=0) if a.gammas
                       else tuple(range(0, kmax0 + 1)))
        self.kmax = max(max(self.gammas), 1)
        mns = self.base.max_num_seqs
        if mns is not None and mns < max(self.batches):
            raise ProfileToolError(f"the server's max_num_seqs is {mns} but the grid runs batch "
                                   f"{max(self.batches)}: pass --max-num-seqs "
                                   f"{max(self.batches)} after --")
        self.environ = environ
        self.a = a
        self.out = pathlib.Path(a.output_dir).resolve()
        self.profile_path = pathlib.Path(a.output_profile).resolve() if a.output_profile \
            else self.out / "profile.json"
        self.preview = {k: self.command(k, 8000) for k in self.gammas}

    def command(self, k: int, port: int) -> ServerCommand:
        trace = self.out / "traces" / f"k{k}.jsonl"
        argv, env = plugin_command(self.base, port, trace, self.environ,
                                   ["--gamma", str(self.kmax), "--adaptive-policy", "fixed",
                                    "--adaptive-fixed-gamma", str(k)])
        return ServerCommand(BenchConfig(f"k{k}", "fixed", k), argv, env, trace)

    def cells(self) -> list[tuple[int, int, tuple[wl.Request, ...]]]:
        out = []
        for length in self.output_lens:
            for b in self.batches:
                n = max(b * self.a.requests_per_slot, 2)
                reqs = wl.build_requests(self.a.workload, self.sets, n, length, self.a.seed)
                # the grid's output length is exact: every request generates `length` tokens
                reqs = tuple(wl.Request(r.prompt, length, r.source) for r in reqs)
                out.append((b, length, reqs))
        return out


def run(a: argparse.Namespace, launcher_args: Sequence[str]) -> int:
    grid = _Grid(a, launcher_args)
    if a.dry_run:
        print(f"# grid: K {list(grid.gammas)} x batch {list(grid.batches)} x output "
              f"{list(grid.output_lens)}; Kmax {grid.kmax}; {len(grid.gammas)} servers")
        for k, cmd in grid.preview.items():
            env = {n: v for n, v in cmd.env.items() if n.startswith(("HUST_VSPEC_", "VLLM_"))}
            print(f"[k{k}] env: " + " ".join(f"{n}={shlex.quote(v)}" for n, v in sorted(env.items())))
            print(f"[k{k}] cmd: " + shlex.join(cmd.argv))
        return 0
    return _measure(grid)


def _measure(grid: _Grid) -> int:
    from .bench_driver import Driver, combine, read_trace_slice

    out = grid.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    cells = grid.cells()
    measured: list[dict[str, Any]] = []
    t0 = time.monotonic()
    # a bar over every cell on a terminal; the per-K lines stay on stdout
    bar = Progress(len(grid.gammas) * len(cells), "profile", unit="cell", lines=False)
    for i, k in enumerate(grid.gammas, start=1):
        port = free_port()
        cmd = grid.command(k, port)
        if cmd.trace_file is not None and cmd.trace_file.exists():
            cmd.trace_file.unlink()
        with Server(cmd, port, out / "logs" / f"k{k}.server.log") as server:
            server.start(grid.a.start_timeout)
            with open(out / "logs" / f"k{k}.bench.log", "w", encoding="utf-8") as log:
                assert server.model_name is not None and cmd.trace_file is not None
                driver = Driver(server.base_url, server.model_name, grid.base.target_path, log)
                warm = cells[0][2][:2]
                driver.run_phases([wl.Phase(2, warm)], "warmup")
                for b, length, reqs in cells:
                    offset = cmd.trace_file.stat().st_size if cmd.trace_file.exists() else 0
                    res = driver.run_phases([wl.Phase(b, reqs)], f"k{k} b{b} L{length}")
                    r = combine(res, None)
                    steps = step_times(read_trace_slice(cmd.trace_file, offset), b, k)
                    if not steps:
                        raise ProfileToolError(
                            f"K={k} batch={b} output {length}: the decision trace holds no step "
                            f"at the full batch (is the plugin active? log {server.log_path})")
                    prompt = statistics.mean(driver._prompt_len(q.prompt) for q in reqs)
                    measured.append({
                        "k": k, "batch": b, "output_len": length,
                        "output_tok_s": round(r.output_tok_s, 3), "tpot_ms": round(r.tpot_ms, 3),
                        "mean_accept_len": round(r.mean_accept_len, 4),
                        "draft_tokens": r.draft_tokens, "accepted_tokens": r.accepted_tokens,
                        "output_tokens": r.output_tokens, "duration_s": round(r.duration_s, 4),
                        "steps": len(steps), "step_ms": round(statistics.median(steps), 4),
                        "context_tokens": round(b * (prompt + length / 2.0), 1),
                        "prompt_tokens_mean": round(prompt, 1)})
                    bar.update()
        elapsed = time.monotonic() - t0
        eta = elapsed / i * (len(grid.gammas) - i)
        row = " ".join(f"b{m['batch']}/L{m['output_len']}={m['output_tok_s']:.0f}"
                       for m in measured if m["k"] == k)
        bar.write(f"[{i}/{len(grid.gammas)}] K={k}: tok/s {row} | elapsed {format_seconds(elapsed)}, "
                  f"ETA {format_seconds(eta)}", file=sys.stdout)
    bar.close()
    return _finish(grid, measured)


def _finish(grid: _Grid, measured: list[dict[str, Any]]) -> int:
    out = grid.out
    manifest = {"tool": PROG, "command": shlex.join([PROG, *sys.argv[1:]]),
                "host": machine_info(grid.base),
                "grid": {"gammas": list(grid.gammas), "batches": list(grid.batches),
                         "output_lens": list(grid.output_lens), "workload": grid.a.workload,
                         "requests_per_slot": grid.a.requests_per_slot, "kmax": grid.kmax},
                "server_command": grid.preview[grid.gammas[0]].argv[1:]}
    write_atomic(out / "measurements.json",
                 json.dumps({"manifest": manifest, "measurements": measured}, indent=1) + "\n")
    table = pick_table(measured)
    drafted = sum(m["draft_tokens"] for m in measured)
    acceptance = sum(m["accepted_tokens"] for m in measured) / drafted if drafted else None
    samples = samples_doc(measured, grid.base.method, grid.kmax, table, acceptance)
    samples_path = out / "samples.json"
    write_atomic(samples_path, json.dumps(samples, indent=1) + "\n")
    try:
        prof = fit_profile(samples, str(samples_path))
        grid.profile_path.parent.mkdir(parents=True, exist_ok=True)
        prof.save(grid.profile_path)
        load_profile(grid.profile_path)  # what the profile policy will read
    except ProfileError as exc:
        raise ProfileToolError(str(exc)) from None
    print("per-batch K (batch_gamma_policy): "
          + ", ".join(f"B<={b}: K={k}" for b, k in sorted(table.items())))
    print("vLLM num_speculative_tokens_per_batch_size: "
          + json.dumps(cfgs.table_from_policy(table, "profile")))
    print(f"measurements: {out / 'measurements.json'}")
    print(f"samples: {samples_path}")
    print(grid.profile_path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, launcher_args = argv[:i], argv[i + 1:]
    a = build_parser().parse_args(argv)
    try:
        return run(a, launcher_args)
    except (ProfileToolError, wl.WorkloadError, cfgs.ConfigError, LaunchError, SettingsError,
            ServerError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, ServerError) else 1


if __name__ == "__main__":
    sys.exit(main())
