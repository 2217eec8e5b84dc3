"""The fixture builder as a command: reproducible at a tiny step budget, staged, cached, clear errors.

Two real builds (a few training steps, no vLLM measurement, a narrow target-large) into temp
roots, one in two stages (``--stage base``, then the full build finishing it), one in one go;
they must give byte-identical checkpoints, and a rebuild must return from the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.cli, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILDER = REPO / "scripts" / "build_fixtures.py"
sys.path.insert(0, str(REPO / "scripts"))
from fixtures import params as P  # noqa: E402
TINY = ["--scale", "0.002", "--no-mal", "--large-intermediate", "1024", "--seed", "7"]


def _build(root: pathlib.Path, *args: str) -> tuple[pathlib.Path, str]:
    env = {**os.environ, "VSPEC_FIXTURES_DIR": str(root)}
    proc = subprocess.run([sys.executable, str(BUILDER), *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pathlib.Path(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _digests(fixture: pathlib.Path) -> dict[str, str]:
    files = sorted(fixture.glob("*/model.safetensors")) + [fixture / "tokenizer" / "tokenizer.json"]
    files += sorted((fixture / "prompts").glob("*.jsonl")) + sorted((fixture / "mal-prompts").glob("*.jsonl"))
    return {str(p.relative_to(fixture)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    root_a, root_b = tmp_path_factory.mktemp("fx-a"), tmp_path_factory.mktemp("fx-b")
    base, log = _build(root_a, *TINY, "--stage", "base")
    manifest = json.loads((base / "manifest.json").read_text())
    assert manifest["stage"] == "base" and set(manifest["models"]) == {"target", "target-large", "draft"}
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == ["draft", "mal-prompts", "prompts", "target",
                                                                    "target-large", "tokenizer"]
    assert "stage full" not in log
    a, log = _build(root_a, *TINY)
    assert a == base and "stage base" not in log and "stage full" in log  # finishes, does not retrain
    b, _ = _build(root_b, *TINY)
    return root_a, a, b


def test_same_seed_gives_identical_checkpoints(two_builds) -> None:
    _, a, b = two_builds
    assert a.name == b.name  # same code and parameters -> same hash
    da, db = _digests(a), _digests(b)
    assert len(da) == 7 + 1 + 3 + 3
    assert da == db


def test_layout_and_current_link(two_builds) -> None:
    root, a, _ = two_builds
    assert (root / "current").resolve() == a.resolve()
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["hash"] == a.name and manifest["seed"] == 7 and manifest["stage"] == "full"
    assert manifest["params"]["scale"] == 0.002 and manifest["params"]["threads"] == 2
    assert manifest["params"]["precision"] == P.PRECISIONS[P.auto_precision()]  # picked by the CPU
    assert 1 <= manifest["params"]["target_steps"] <= 3 and manifest["params"]["head_steps"] == 1
    assert manifest["guarantee"] is None and manifest["quality"] is None  # no promise at this budget
    assert manifest["machine"]["cpus"] >= 1
    for name, entry in manifest["models"].items():
        assert (a / entry["path"] / "model.safetensors").is_file(), name
        assert entry["mal_k4"] is None  # --no-mal
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert not [p for p in a.iterdir() if p.name.startswith(".")]  # no staging dir, no temp manifest


def test_cached_build_trains_nothing(two_builds) -> None:
    root, a, _ = two_builds
    before = (a / "manifest.json").stat().st_mtime_ns
    again, log = _build(root, *TINY)
    assert again == a
    assert f"cached build {a}" in log, log
    assert "building" not in log and "target step" not in log, log
    assert (a / "manifest.json").stat().st_mtime_ns == before


def test_parameters_change_the_hash(two_builds, tmp_path: pathlib.Path) -> None:
    from_params = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); from fixtures import params as P; "
         "kw = dict(scale=0.002, large_intermediate=1024, measure_mal=False); "
         "print(P.build_hash(P.BuildParams(seed=7, **kw)), P.build_hash(P.BuildParams(seed=8, **kw)), "
         "P.build_hash(P.BuildParams(seed=7, threads=1, **kw)))",
         str(REPO / "scripts")], capture_output=True, text=True, check=True).stdout.split()
    _, a, _ = two_builds
    assert from_params[0] == a.name
    assert from_params[1] != a.name and from_params[2] != a.name


def test_bad_arguments_fail_before_building(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "VSPEC_FIXTURES_DIR": str(tmp_path)}
    for args, needle in ((["--quick", "--scale", "0.5"], "exclusive"),
                         (["--scale", "0"], "--scale"),
                         (["--large-intermediate", "100"], "--large-intermediate"),
                         (["--threads", "0"], "--threads"),
                         (["--stage", "half"], "--stage")):
        proc = subprocess.run([sys.executable, str(BUILDER), *args], env=env, capture_output=True, text=True)
        assert proc.returncode == 2, args
        assert needle in proc.stderr, proc.stderr
        assert proc.stdout == ""
    assert list(tmp_path.iterdir()) == []
