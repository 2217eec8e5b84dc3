"""Run the vLLM server as the launcher's child, and stop all of it on SIGTERM or SIGINT.

Why not ``exec``: vLLM 0.32's API server does not act on a stop signal while its engine
starts (host behaviour, plugin off too): its main thread waits for the engine's ready message
in a blocking ``zmq`` poll (``MPClient.__init__``, a 600 s timeout) and runs no Python signal
handler there, and when the engine core does end (SIGTERM to the whole group) that poll does
not notice, so the API server waits on alone. Measured: SIGTERM or SIGINT to the API server
33 s into its start, still running 45 s later. A server that cannot be stopped while it
loads a model or runs the start-up calibration is what ``docker stop`` and systemd then kill
after their own timeouts, leaving whatever that leaves.

So the launcher stays the parent (same process group, same terminal, same stdio) and:

* passes every SIGTERM / SIGINT it gets to the server's main process (a second signal from a
  group-wide delivery is harmless: vLLM acts on the first);
* when the server was not ready yet at the first signal (its ``/health`` did not answer),
  sends the same signal at once to every process under it too (the engine core ends the
  start-up cost probe or calibration at its next step, ``startup_cost/stopping.py``, and
  any other start-up once it is constructed), and kills what is left after :data:`GRACE_S`,
  or as soon as the main process has been alone for :data:`_ALONE_S`; then exits with
  128 + the stop signal;
* when the server was ready, waits as long as vLLM's own shutdown takes (its drain timeout);
* when the server's main process has ended, kills any process it left behind, and returns its
  exit status (128 + N for a server ended by signal N, as a shell reports it).

The server's main process gets SIGTERM if the launcher itself dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

#: Seconds a server that was still starting gets to end after a stop signal.
GRACE_S = 10.0
#: Signals passed on to the server.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_S = 0.5
_ALONE_S = 2.0  # how long the main process may outlive every process under it
_PR_SET_PDEATHSIG = 1


def health_url(argv: Sequence[str]) -> str:
    """The server's ``/health`` URL from its ``--host`` / ``--port`` (vLLM's defaults: every
    interface, port 8000); a wildcard host is asked on the loopback."""
    host, port = "127.0.0.1", "8000"
    args = list(argv)
    for i, a in enumerate(args):
        for flag in ("--host", "--port"):
            value = None
            if a == flag and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(flag + "="):
                value = a.split("=", 1)[1]
            if value is None:
                continue
            if flag == "--port":
                port = value
            else:
                host = value
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/health"


def answers(url: str, timeout: float = 1.0) -> bool:
    """True when an HTTP server answers ``url`` (any status): the server is serving."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


class _Tree:
    """The processes under the server's main process (seen while it lived)."""

    def __init__(self, pid: int) -> None:
        import psutil  # a vLLM dependency; only the launcher's serving path needs it

        self._psutil = psutil
        self.root = pid
        self.seen: dict[int, Any] = {}

    def refresh(self) -> None:
        with contextlib.suppress(self._psutil.Error):
            for proc in self._psutil.Process(self.root).children(recursive=True):
                self.seen.setdefault(proc.pid, proc)

    def alive(self) -> list[Any]:
        out = []
        for proc in self.seen.values():
            with contextlib.suppress(self._psutil.Error):
                if proc.is_running() and proc.status() != self._psutil.STATUS_ZOMBIE:
                    out.append(proc)
        return out

    def working(self) -> list[Any]:
        """The live processes other than multiprocessing's resource tracker (the API server
        starts one; it ends with its parent, so it never ends a wait for the rest)."""
        out = []
        for proc in self.alive():
            with contextlib.suppress(self._psutil.Error):
                if not any("multiprocessing.resource_tracker" in a for a in proc.cmdline()):
                    out.append(proc)
        return out

    def signal(self, signum: int) -> None:
        for proc in self.alive():
            with contextlib.suppress(self._psutil.Error):
                proc.send_signal(signum)


def run(executable: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start the server (``argv[0]`` as its name), supervise it, return its exit status."""
    url = health_url(argv)
    stop: dict[str, Any] = {"signum": None, "at": 0.0, "starting": False, "stage": 0,
                            "alone_since": None, "pid": None}

    def on_signal(signum: int, _frame: Any) -> None:
        if stop["signum"] is None:  # the loop below passes it on to the rest of the tree
            stop.update(signum=signum, at=time.monotonic(), starting=not answers(url))
        if stop["pid"] is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stop["pid"], signum)

    # the handlers before the child: a stop that comes as soon as the server prints (a
    # loaded machine may not run the launcher again for a while after the fork) must not
    # end the launcher by the default action and leave the server behind
    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        child = subprocess.Popen([executable, *argv[1:]], executable=executable, env=dict(env),
                                 preexec_fn=_die_with_parent)
    except BaseException:
        for s, h in previous.items():
            signal.signal(s, h)
        raise
    stop["pid"] = child.pid
    if stop["signum"] is not None:  # stopped while it was being started
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, stop["signum"])
    tree = _Tree(child.pid)
    try:
        while True:
            try:
                rc = child.wait(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            tree.refresh()
            if stop["signum"] is not None and stop["starting"]:
                _escalate(child, tree, stop)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if child.poll() is None:  # the launcher itself is ending (an error in this loop)
            child.kill()
            child.wait()
        tree.signal(signal.SIGKILL)  # nothing the server started outlives it
    if stop["stage"] == 2:  # ended on the stop signal, by the launcher's hand
        return 128 + int(stop["signum"])
    return rc if rc >= 0 else 128 - rc


def _escalate(child: subprocess.Popen, tree: _Tree, stop: dict[str, Any]) -> None:
    """A server stopped while it started: pass the signal to every process under it, kill
    what is left after ``GRACE_S``, or once its
    main process has been alone for ``_ALONE_S`` (it waits for an engine that ended, and its
    wait never ends by itself)."""
    now = time.monotonic()
    waited = now - stop["at"]
    if stop["stage"] == 0:
        stop["stage"] = 1
        tree.signal(stop["signum"])
        print(f"vllm-hust-vspec: {signal.Signals(stop['signum']).name} while the server "
              f"starts: sent to its {len(tree.alive()) + 1} processes; what is left in "
              f"{GRACE_S:.0f} s is killed", file=sys.stderr, flush=True)
    if stop["stage"] != 1:
        return
    if tree.working():
        stop["alone_since"] = None
    elif stop["alone_since"] is None:
        stop["alone_since"] = now
    alone = stop["alone_since"] is not None and now - stop["alone_since"] >= _ALONE_S
    if waited >= GRACE_S or alone:
        stop["stage"] = 2
        print(f"vllm-hust-vspec: the server did not stop in {waited:.0f} s: killed",
              file=sys.stderr, flush=True)
        tree.signal(signal.SIGKILL)
        child.kill()
