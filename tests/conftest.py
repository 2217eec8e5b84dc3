"""Shared pytest fixtures."""

from __future__ import annotations

import json
import os
import pathlib
import socket

import pytest

from vllm_hust_vspec.tools.fixture_dir import fixtures_dir as fixtures_dir_path

# torch.utils.cpp_extension (imported by vLLM) imports setuptools, whose distutils shim asserts
# if any earlier test in this process loaded the standard library's distutils.  Use the stdlib
# copy throughout, so in-process engines do not depend on which tests ran before them.
os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
    """The tiny model fixtures (built by ./manage.sh fixtures)."""
    root = fixtures_dir_path()
    if not (root / "manifest.json").is_file():
        pytest.fail(
            f"model fixtures not found at {root}: run ./manage.sh fixtures "
            "(./manage.sh test does it for you)"
        )
    stage = json.loads((root / "manifest.json").read_text()).get("stage", "full")
    if stage != "full":
        pytest.fail(f"the model fixtures at {root} are a {stage!r} build (the demo's part): run "
                    "./manage.sh fixtures to finish them (./manage.sh test does it for you)")
    return root.resolve()


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def vspec_dist(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """This checkout's wheel and sdist, built ONCE per test session by the real
    ``./release.sh build`` (which also runs ``check``) into a temp dir, never into dist/.
    A stale artefact is planted there first: the build must wipe it."""
    import subprocess

    out = tmp_path_factory.mktemp("release") / "dist"
    out.mkdir()
    (out / "vllm_hust_vspec-0.0.1-py3-none-any.whl").write_bytes(b"stale")
    proc = subprocess.run(
        [str(REPO / "release.sh"), "build"],
        env={**os.environ, "VSPEC_DIST_DIR": str(out)},
        capture_output=True, text=True, timeout=900, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"./release.sh build failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return out
