"""One benchmark configuration as one real vLLM server: its command (from the launcher, so
the host flags are exactly what users get), its start, readiness and stop.

Every configuration is derived from ONE launcher resolution of the user's preset/flags:

* plugin-off configurations (``none``, ``fixed``, ``native_table``) take the launcher's plan
  with ``HUST_VSPEC_ENABLED=0`` and no ``HUST_VSPEC_*`` settings (the host as users run it
  today); ``none`` drops ``--speculative-config``; ``fixed`` sets its
  ``num_speculative_tokens``; ``native_table`` adds ``num_speculative_tokens_per_batch_size``;
* plugin-on configurations (``online``, ``budget``) are the launcher's plan for the same
  arguments plus ``--adaptive-speculation --adaptive-policy P --adaptive-trace-file F``.

The server runs in its own session (process group); :meth:`Server.stop` ends the whole group
(API server and engine core), so nothing is left running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_hust_vspec import settings
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.launcher import model_store
from vllm_hust_vspec.launcher.cli import prepare
from vllm_hust_vspec.launcher.command import LaunchPlan
from vllm_hust_vspec.launcher.errors import LaunchError
from vllm_hust_vspec.launcher.resolve import Resolved

from .bench_configs import BenchConfig, NativeTable

SPEC_FLAG = "--speculative-config"
# Launcher flags the bench sets itself; the user may not pass them.
BENCH_OWNED = ("--port", "--host", "--dry-run", "--json", "--adaptive-speculation",
               "--no-adaptive-speculation", "--adaptive-policy", "--adaptive-trace-file",
               "--adaptive-trace", "--target-platform")
# The budget policy's cost table: the bench gives it to the budget servers only (an online
# server refuses it), from --budget-cost-table or the first budget server's calibration.
BENCH_COST_TABLE = ("--adaptive-dspark-cost-table", "--adaptive-dspark-cost-table-output")
# vLLM flags that would switch off what the bench measures.
FORBIDDEN_NATIVE = ("--disable-log-stats",)


class ServerError(VspecError, RuntimeError):
    """A server failed to start, died, or did not answer in time."""


@dataclasses.dataclass(frozen=True)
class ServerCommand:
    config: BenchConfig
    argv: list[str]  # argv[0] is the executable to run
    env: dict[str, str]  # the full environment of the child
    trace_file: pathlib.Path | None


@dataclasses.dataclass(frozen=True)
class BaseLaunch:
    """The launcher's resolution of the user's arguments (models checked, Kmax known)."""

    launcher_args: tuple[str, ...]
    resolved: Resolved
    plan: LaunchPlan

    @property
    def kmax(self) -> int:
        return int(self.resolved.values.gamma or 0)

    @property
    def method(self) -> str:
        return str(self.resolved.values.method)

    @property
    def target_path(self) -> str:
        assert self.resolved.target is not None
        return self.resolved.target.path

    @property
    def max_num_seqs(self) -> int | None:
        v = self.resolved.values.max_num_seqs
        return None if v is None else int(v)


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def check_launcher_args(args: Sequence[str]) -> None:
    ours, _, native = _split(args)
    for a in ours:
        if _flag_name(a) in BENCH_COST_TABLE:
            raise LaunchError(f"launcher argument {a!r}: the A/B benchmark gives the budget "
                              "servers their cost table itself (the first one calibrates and "
                              "saves it, the others load it); pass a saved table as "
                              "--budget-cost-table before --")
        if _flag_name(a) in BENCH_OWNED:
            raise LaunchError(f"launcher argument {a!r}: the A/B benchmark sets it itself "
                              "(per configuration); remove it")
    for a in native:
        if _flag_name(a) in FORBIDDEN_NATIVE:
            raise LaunchError(f"native vLLM argument {a!r}: the A/B benchmark reads the "
                              "server's log stats and /metrics; remove it")


def _split(args: Sequence[str]) -> tuple[list[str], bool, list[str]]:
    args = list(args)
    if "--" in args:
        i = args.index("--")
        return args[:i], True, args[i + 1:]
    return args, False, []


def _with_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """Launcher ``args`` with our ``flags`` inserted before any ``--`` (native vLLM part)."""
    ours, has_native, native = _split(args)
    return ours + list(flags) + (["--"] + native if has_native else [])


def resolve_base(launcher_args: Sequence[str], environ: Mapping[str, str]) -> BaseLaunch:
    """Resolve the user's launcher arguments once, check the models exist; LaunchError on bad
    input (nothing started)."""
    check_launcher_args(launcher_args)
    res, plan = prepare(list(launcher_args), environ)
    if res.values.method == "none":
        raise LaunchError("the A/B benchmark compares speculative configurations: give a "
                          "speculative method (e.g. --method draft or a preset), not none")
    lossy = settings.lossy_rules(res.values)
    if lossy:
        raise LaunchError(f"lossy acceptance ({', '.join(lossy)}) changes the output: the "
                          "benchmarks compare configurations that keep the target's tokens; "
                          "drop --eagle-relaxed-accept-topk / --confidence-accept-margin")
    lookups = [lk for lk in (res.target, res.draft) if lk is not None]
    model_store.check_exist(res.values.method, lookups)
    return BaseLaunch(tuple(launcher_args), res, plan)


def _child_env(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in plan.unset}
    env.update(plan.env)
    return env


def _plugin_off(env: dict[str, str]) -> dict[str, str]:
    """The host exactly as users run it today: plugin disabled, none of our settings."""
    prefixes = (settings.ENV_PREFIX, *settings.LEGACY_ENV_PREFIXES)
    out = {k: v for k, v in env.items() if not k.startswith(prefixes)}
    out[settings.ENABLE_ENV] = "0"
    return out


def _spec_index(argv: Sequence[str]) -> int:
    try:
        return list(argv).index(SPEC_FLAG)
    except ValueError:
        raise LaunchError(f"the launcher's server command has no {SPEC_FLAG}") from None


def server_command(base: BaseLaunch, config: BenchConfig, port: int,
                   trace_file: pathlib.Path | None, environ: Mapping[str, str],
                   native_table: NativeTable | None = None,
                   compare_window: int = 16, budget_flags: Sequence[str] = (),
                   compare_waves: bool = False) -> ServerCommand:
    """The exact command and environment of one configuration's server; ``budget_flags``
    (its cost table) go to a plugin server whose policies include budget."""
    net = ["--host", "127.0.0.1", "--port", str(port)]
    if config.plugin:
        if trace_file is None:
            raise ValueError("plugin configurations need a trace file")
        if config.policy == "plugin_fixed":
            flags = ["--adaptive-policy", "fixed", "--adaptive-fixed-gamma", str(config.k)]
        elif config.policy == "paired":
            flags = ["--adaptive-compare", ",".join(config.compare),
                     "--adaptive-compare-window", str(compare_window)]
            if compare_waves:
                flags.append("--adaptive-compare-waves")
        else:
            flags = ["--adaptive-policy", config.policy]
        if config.uses_budget:
            flags += list(budget_flags)
        argv, env = plugin_command(base, port, trace_file, environ, flags)
        return ServerCommand(config, argv, env, trace_file)
    _res, plan = prepare(_with_flags(base.launcher_args, net), environ)
    argv = [plan.executable] + plan.argv[1:]
    env = _plugin_off(_child_env(plan, environ))
    i = _spec_index(argv)
    spec: dict[str, Any] = json.loads(argv[i + 1])
    if config.policy == "none":
        del argv[i:i + 2]
    else:
        if config.policy == "fixed":
            spec["num_speculative_tokens"] = config.k
        elif config.policy == "native_table":
            if native_table is None:
                raise LaunchError("configuration native_table needs a batch-size table "
                                  "(--native-table)")
            spec["num_speculative_tokens"] = config.k
            spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in native_table]
        argv[i + 1] = json.dumps(spec, separators=(",", ":"))
    return ServerCommand(config, argv, env, None)


def plugin_command(base: BaseLaunch, port: int, trace_file: pathlib.Path,
                   environ: Mapping[str, str], flags: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """argv and env of a plugin-on server: the user's launcher arguments plus ``flags`` (e.g.
    the policy), with the controller on and its decision trace written to ``trace_file``."""
    args = _with_flags(base.launcher_args, ["--host", "127.0.0.1", "--port", str(port),
                                            "--adaptive-speculation", *flags,
                                            "--adaptive-trace-file", str(trace_file)])
    _res, plan = prepare(args, environ)
    return [plan.executable] + plan.argv[1:], _child_env(plan, environ)


# --------------------------------------------------------------------------- lifecycle


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (localhost)
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def _tail(path: pathlib.Path, n: int = 25) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


class Server:
    """A running server of one configuration (use as a context manager)."""

    def __init__(self, cmd: ServerCommand, port: int, log_path: pathlib.Path) -> None:
        self.cmd = cmd
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.model_name: str | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self, timeout_s: float) -> None:
        """:meth:`launch` and :meth:`wait_ready`."""
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> int:
        """Start the server process (its own session); returns its pid."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("# " + " ".join(self.cmd.argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(self.cmd.argv, env=self.cmd.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self.proc.pid

    def wait_ready(self, timeout_s: float) -> None:
        """Until ``/health`` and ``/v1/models`` answer; on failure the server is stopped and
        :class:`ServerError` names the configuration and the log's last lines."""
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(
                    f"server for configuration {self.cmd.config.name} exited with code {code} "
                    f"before it was ready; log {self.log_path}:\n{_tail(self.log_path)}")
            status, _ = _get(self.base_url + "/health", timeout=2.0)
            if status == 200:
                status, body = _get(self.base_url + "/v1/models")
                if status == 200:
                    data = json.loads(body.decode())["data"]
                    self.model_name = str(data[0]["id"])
                    return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"server for configuration {self.cmd.config.name} was not ready after "
                    f"{timeout_s:.0f} s; log {self.log_path}:\n{_tail(self.log_path)}")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        """End the server's whole process group: SIGTERM, and SIGKILL for whatever is still
        alive after ``grace_s`` (the API server and its engine core alike)."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the server leads its own group
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _wait_group_gone(pgid, 5.0)
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.wait(timeout=10.0)
        _wait_group_gone(pgid, 10.0)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a group whose members are all zombies still "exists"; look for live members
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)


def metrics_text(base_url: str) -> str:
    status, body = _get(base_url + "/metrics")
    if status != 200:
        raise ServerError(f"{base_url}/metrics answered {status}")
    return body.decode()
