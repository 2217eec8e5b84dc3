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
_LINE = re.compile(r"^(\S+) / fixed K = (\d)(?: at batch ([\d,]+))? over (\d+) steps, (\d+) seeds: mean ([\d.]+) "
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
    assert m and m.group(1, 2, 4, 5) == ("fixed:2", "2", "48", "3") and m.group(3) is None
    assert float(m.group(6)) == 1.0 and float(m.group(9)) == 0.0
    proc = _run("--steps", "96", "--seeds", "4")
    m = _LINE.match(proc.stdout.strip())
    assert m and m.group(1) == "online"
    assert 0.94 < float(m.group(6)) < 1.06 and 0.0 < float(m.group(9)) < 1.0


def test_a_batch_4_phase_after_a_batch_1_phase():
    """``--batch 1,4``: the measured batch-4 row names K = 2 the best for the code set's
    acceptance (K = 1 and 3 within 3-5 % of it); fixed K = 2 against itself is 1 over the
    last phase, and online, which served batch 1 first, is near it there (a slow spell
    included, ``--drift``) and off K = 2 on a minority of its batch-4 decisions."""
    proc = _run("--batch", "1,4", "--policy", "fixed:2", "--steps", "64", "--seeds", "2")
    m = _LINE.match(proc.stdout.strip())
    assert m and m.group(1, 2, 3) == ("fixed:2", "2", "1,4"), proc.stdout + proc.stderr
    assert float(m.group(6)) == 1.0 and float(m.group(9)) == 0.0
    proc = _run("--batch", "1,4", "--steps", "300", "--seeds", "4", "--drift", "0.1")
    m = _LINE.match(proc.stdout.strip())
    assert m and m.group(1, 3) == ("online", "1,4"), proc.stdout + proc.stderr
    assert 0.95 < float(m.group(6)) <= 1.01 and 0.0 < float(m.group(9)) < 0.5


def test_bad_arguments_are_refused_before_running():
    proc = _run("--batch", "3")
    assert proc.returncode == 2 and "want batch sizes among [1, 4, 16], got '3'" in proc.stderr
    proc = _run("--accept", "0.5,0.5")
    assert proc.returncode == 2 and "want 4 probabilities, got '0.5,0.5'" in proc.stderr
    proc = _run("--cost", "[1]")
    assert proc.returncode == 2 and "want a JSON object" in proc.stderr
    proc = _run("--cost", '{"no_such_knob": 1}')
    assert proc.returncode == 2 and "no_such_knob" in proc.stderr and "Traceback" not in proc.stderr
