"""``scripts/sim_fresh_start.py``: a fresh server's first decisions at batch 1, simulated with
the step times measured on the CPU host; run as a subprocess, as a user runs it."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "sim_fresh_start.py"
_LINE = re.compile(r"^(\S+) / fixed K = (\d) over (\d+) steps, (\d+) seeds: mean ([\d.]+) "
                   r"median ([\d.]+) p10 ([\d.]+); decisions 10\+ off K = \d: ([\d.]+)$")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(_SCRIPT), *args], capture_output=True,
                          text=True, timeout=300)


def test_the_best_fixed_k_against_itself_is_one_and_online_is_near_it():
    """Fixed K = 2 (the best K for the code set's acceptance at these step times) against
    itself on the same seeds: exactly 1, never off; online over 96 steps within 6 % of it on
    average (the sampled acceptance differs once the Ks differ)."""
    proc = _run("--policy", "fixed:2", "--steps", "48", "--seeds", "3")
    assert proc.returncode == 0, proc.stderr
    m = _LINE.match(proc.stdout.strip())
    assert m and m.group(1, 2, 3, 4) == ("fixed:2", "2", "48", "3")
    assert float(m.group(5)) == 1.0 and float(m.group(8)) == 0.0
    proc = _run("--steps", "96", "--seeds", "4")
    m = _LINE.match(proc.stdout.strip())
    assert m and m.group(1) == "online"
    assert 0.94 < float(m.group(5)) < 1.06 and 0.0 < float(m.group(8)) < 1.0


def test_bad_arguments_are_refused_before_running():
    proc = _run("--accept", "0.5,0.5")
    assert proc.returncode == 2 and "want 4 probabilities, got '0.5,0.5'" in proc.stderr
    proc = _run("--cost", "[1]")
    assert proc.returncode == 2 and "want a JSON object" in proc.stderr
    proc = _run("--cost", '{"no_such_knob": 1}')
    assert proc.returncode == 2 and "no_such_knob" in proc.stderr and "Traceback" not in proc.stderr
