"""What the decide-cost benchmark (scripts/bench_decide.py) times, checked without a clock.

The 50 us per step figure is a benchmark (a timed bound moves with whatever else runs on the
machine): ``.venv/bin/python scripts/bench_decide.py`` prints it and exits 1 when a held case
is over. Here the same harness runs a few short rounds and the tests hold what makes its
figures mean something: every registered policy and stop mode is covered, each case runs
and gives a positive figure, and the drafting regime really drafts with per-request K_i.
"""

from __future__ import annotations

import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import load_script

from vllm_hust_vspec.adaptive.policies import registry
from vllm_hust_vspec.names import STOP_MODES

pytestmark = pytest.mark.unit

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_decide.py"
bench = load_script("bench_decide")


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    return bench.write_profile(str(tmp_path_factory.mktemp("speed") / "profile.json"))


def test_cases_cover_every_registered_policy():
    # the product's policies (other tests may register their own)
    builtin = {name for name in registry.policy_names()
               if registry._REGISTRY[name].__module__.startswith("vllm_hust_vspec.")}
    assert {c.policy.split(":", 1)[0] for c in bench.CASES} == builtin
    assert len({c.name for c in bench.CASES}) == len(bench.CASES)


def test_cases_cover_every_stop_mode():
    assert {c.kw.get("stop", "off") for c in bench.CASES} == set(STOP_MODES)


@pytest.mark.parametrize("case", bench.CASES, ids=[c.name for c in bench.CASES])
def test_case_runs(case, profile_path):
    us, kis = bench.run(case, steps=20, rounds=2, profile=profile_path)
    assert math.isfinite(us) and us > 0
    assert len(kis) == 20 and all(k.shape == (bench.B,) for k in kis)
    assert all(((k >= 0) & (k <= bench.KMAX)).all() for k in kis)
    if case.policy.startswith("fixed:"):
        assert all((k == 3).all() for k in kis)


@pytest.mark.parametrize("case", [c for c in bench.CASES if c.cheap_draft], ids=lambda c: c.name)
def test_drafting_regime_drafts_per_request(case):
    """budget with a cheap drafter: the timed decisions draft, with K_i that differ between
    requests (else the drafting figure would time the held K = 0 path)."""
    _, kis = bench.run(case, steps=100, rounds=2)
    drafted = [ki for ki in kis if ki.max() > 0]
    assert len(drafted) >= 0.9 * len(kis), f"only {len(drafted)}/{len(kis)} decisions draft"
    assert sum(len(np.unique(ki)) > 1 for ki in drafted) >= 0.5 * len(drafted)
    assert 1.0 <= np.mean([ki.mean() for ki in drafted]) < bench.KMAX - 1


def test_script_prints_the_table_and_refuses_unknown_cases():
    ok = subprocess.run([sys.executable, str(SCRIPT), "--steps", "5", "--rounds", "1",
                         "--cases", "fixed,budget-drafting-arrays", "--json"],
                        capture_output=True, text=True, timeout=300)
    rows = [__import__("json").loads(line) for line in ok.stdout.splitlines()]
    assert [r["case"] for r in rows] == ["fixed", "budget-drafting-arrays"]
    assert all(r["us_per_step"] > 0 and r["bound_us"] == 50.0 for r in rows)
    assert ok.returncode in (0, 1)  # 1 only when a figure was over the bound
    bad = subprocess.run([sys.executable, str(SCRIPT), "--cases", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown nope" in bad.stderr
