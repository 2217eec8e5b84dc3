"""Shared pytest fixtures."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import pathlib
import socket
import sys
import tempfile

import pytest

from vllm_hust_vspec.tools.fixture_dir import fixtures_dir as fixtures_dir_path

# torch.utils.cpp_extension (imported by vLLM) imports setuptools, whose distutils shim asserts
# if any earlier test in this process loaded the standard library's distutils.  Use the stdlib
# copy throughout, so in-process engines do not depend on which tests ran before them.
os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")

# Under pytest-xdist (./manage.sh test runs one worker a core), each worker's engines compute
# on a core of their own: vLLM's CPU platform pins an engine's compute threads to the last
# core by default ("auto"), so two workers' engines would share one core and leave the other
# idle. The worker's index picks its core; a binding set by the caller stands.
# In-process engines (VLLM_ENABLE_V1_MULTIPROCESSING=0) are not bound and keep torch's
# default of one thread a core: two workers' engines would run four spinning OpenMP threads
# on two cores, so a worker's torch runs one thread, as a served engine does.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(int(_WORKER[2:]) % (os.cpu_count() or 1))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _lock(name: str) -> pathlib.Path:
    run = os.environ["PYTEST_XDIST_TESTRUNUID"]  # the same in every worker of one run
    return pathlib.Path(tempfile.gettempdir()) / f"vllm-hust-vspec-pytest-{run}.{name}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under pytest-xdist, a test marked ``exclusive`` (its figure is a wall time that a second
    engine on the machine would move) runs while no other worker runs a test: a readers-writer
    lock over the workers (flock), every other test a reader, with a turnstile so that a
    waiting exclusive test is not starved. Setup and teardown of the item are inside the lock,
    so a module fixture's server starts and stops under it too."""
    if not _WORKER:
        return (yield)
    exclusive = item.get_closest_marker("exclusive") is not None
    with open(_lock("turnstile"), "a") as turnstile, open(_lock("rw"), "a") as rw:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(rw, fcntl.LOCK_EX)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(rw, fcntl.LOCK_SH)
        try:
            return (yield)
        finally:
            fcntl.flock(rw, fcntl.LOCK_UN)

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


def load_script(name: str):
    """``scripts/NAME.py`` as a module, loaded once and registered in ``sys.modules`` (its
    dataclasses look their module up there)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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
