"""The launcher's supervisor (launcher/supervise.py) with real child processes: a server
stand-in that ignores stop signals while it "starts" (what vLLM 0.32's API server does while
it waits for its engine) and starts a grandchild that ignores them too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from vllm_hust_vspec.launcher import supervise


@pytest.mark.parametrize(("argv", "url"), [
    (["python", "-m", "x"], "http://127.0.0.1:8000/health"),
    (["vllm", "serve", "m", "--port", "9001"], "http://127.0.0.1:9001/health"),
    (["x", "--host", "0.0.0.0", "--port=7"], "http://127.0.0.1:7/health"),
    (["x", "--host=10.0.0.2", "--port", "81"], "http://10.0.0.2:81/health"),
    (["x", "--host", "::"], "http://[::1]:8000/health"),
])
def test_health_url_follows_the_servers_host_and_port(argv, url):
    assert supervise.health_url(argv) == url


def test_nothing_answers_on_a_closed_port():
    from conftest import free_port
    assert not supervise.answers(f"http://127.0.0.1:{free_port()}/health", timeout=0.5)


SUPERVISOR = """
import os, sys
from vllm_hust_vspec.launcher import supervise
supervise.GRACE_S = float(sys.argv[1])
sys.exit(supervise.run(sys.executable, [sys.executable, "-c", sys.argv[2]], os.environ))
"""
# A stand-in server: ignores SIGTERM/SIGINT (as a starting vLLM does), starts a grandchild
# that ignores them too, writes both pids, then waits forever.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    g = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(600)"])
    print(g.pid, flush=True)
    time.sleep(600)
""")


def _supervised(child: str, grace: float = 1.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(grace), child],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_servers_exit_status_is_the_launchers():
    proc = _supervised("import sys; sys.exit(3)")
    assert proc.wait(timeout=60) == 3


def test_a_stop_while_starting_ends_every_process_in_stages():
    proc = _supervised(STUBBORN)
    grandchild = int(proc.stdout.readline())
    server = psutil.Process(proc.pid).children()[0]
    time.sleep(1.0)  # the supervisor has seen the tree
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    took = time.monotonic() - t0
    err = proc.stderr.read()
    assert rc == 128 + signal.SIGTERM
    assert 1.0 <= took < 10, took  # signalled at once, ignored: killed after the grace
    assert "SIGTERM while the server starts" in err and "killed" in err
    for pid in (server.pid, grandchild):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_stop_is_passed_to_a_server_that_acts_on_it():
    proc = _supervised("import signal, sys, time\n"
                       "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                       "print('up', flush=True)\ntime.sleep(600)", grace=30)
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0  # ended by itself, well before any escalation
    assert "did not stop" not in proc.stderr.read()


def test_the_server_dies_with_the_launcher():
    proc = _supervised("import time\nprint('up', flush=True)\ntime.sleep(600)")
    assert proc.stdout.readline().strip() == "up"
    server = psutil.Process(proc.pid).children()[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    server.wait(timeout=10)  # it would sleep 600 s: PR_SET_PDEATHSIG ended it
    assert not server.is_running()
