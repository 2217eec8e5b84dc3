"""``release.sh``: source-check, build (once per session, see ``vspec_dist`` in conftest),
check, and publish's refusals.

``publish`` runs in a throwaway git repository holding a copy of ``release.sh`` and ``src/``
(this checkout is shared and never clean), with a stand-in ``uv`` on PATH that records its
argv and whether it saw the token; the real ``uv publish`` is never reached.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from vllm_hust_vspec import __version__

pytestmark = pytest.mark.packaging

REPO = pathlib.Path(__file__).resolve().parents[2]
WHEEL = f"vllm_hust_vspec-{__version__}-py3-none-any.whl"
SDIST = f"vllm_hust_vspec-{__version__}.tar.gz"
TOKEN = "pypi-SECRET-TOKEN-do-not-print-1234"


def release(*args: str, cwd: pathlib.Path = REPO, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in ("UV_PUBLISH_TOKEN", "VSPEC_RELEASE_CONFIRM")}
    full.update(env)
    return subprocess.run([str(cwd / "release.sh"), "--python", sys.executable, *args],
                          cwd=cwd, env=full, capture_output=True, text=True, timeout=600,
                          check=False)


def test_source_check_passes() -> None:
    proc = release("source-check")
    assert proc.returncode == 0, proc.stderr
    for script in ("manage.sh", "install.sh", "uninstall.sh", "release.sh", "run.sh"):
        assert f"bash -n {REPO / script}" in proc.stderr
    assert f"valid: org.vllm-hust.vspec {__version__}" in proc.stdout


def test_build_leaves_exactly_this_versions_wheel_and_sdist(vspec_dist: pathlib.Path) -> None:
    # The session build planted a stale 0.0.1 wheel first; it is gone.
    assert sorted(p.name for p in vspec_dist.iterdir()) == sorted([WHEEL, SDIST])


def test_check_audits_and_prints_sha256(vspec_dist: pathlib.Path) -> None:
    proc = release("check", VSPEC_DIST_DIR=str(vspec_dist))
    assert proc.returncode == 0, proc.stderr
    for name in (WHEEL, SDIST):
        digest = hashlib.sha256((vspec_dist / name).read_bytes()).hexdigest()
        assert f"{digest}  {name}" in proc.stdout.splitlines()


def test_wheel_carries_manifest_and_entry_points(vspec_dist: pathlib.Path) -> None:
    with zipfile.ZipFile(vspec_dist / WHEEL) as whl:
        manifest = json.loads(whl.read("vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json"))
        eps = whl.read(f"vllm_hust_vspec-{__version__}.dist-info/entry_points.txt").decode()
    assert manifest == json.loads(
        (REPO / "src/vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json").read_text())
    assert "[vllm_hust.extension_bundles]\norg.vllm-hust.vspec = vllm_hust_vspec.manifests" in eps
    assert "vspec = vllm_hust_vspec:register" in eps
    assert "vllm-hust-vspec-doctor = vllm_hust_vspec.tools.doctor:main" in eps


def test_sdist_carries_the_scripts_configs_and_profiles(vspec_dist: pathlib.Path) -> None:
    with tarfile.open(vspec_dist / SDIST) as tar:
        names = set(tar.getnames())
    base = f"vllm_hust_vspec-{__version__}/"
    for rel in ("manage.sh", "run.sh", "release.sh", "install.sh", "uninstall.sh",
                "MOD_METADATA.json", "profiles/README.md"):
        assert base + rel in names, rel
    assert any(n.startswith(base + "configs/") and n.endswith(".toml") for n in names)


@pytest.fixture
def dist_copy(vspec_dist: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    out = tmp_path / "dist"
    shutil.copytree(vspec_dist, out)
    return out


def _check_fails(dist: pathlib.Path) -> str:
    proc = release("check", VSPEC_DIST_DIR=str(dist))
    assert proc.returncode == 1
    return proc.stderr


def test_check_rejects_a_third_artefact(dist_copy: pathlib.Path) -> None:
    (dist_copy / "vllm_hust_vspec-0.0.1.tar.gz").write_bytes(b"old")
    assert f"must hold exactly {WHEEL} and {SDIST}" in _check_fails(dist_copy)


def test_check_rejects_a_tampered_wheel(dist_copy: pathlib.Path) -> None:
    src = dist_copy / WHEEL
    tampered = dist_copy / "t.whl"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tampered, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == "vllm_hust_vspec/_version.py":
                data += b"# tampered\n"
            zout.writestr(item, data)
    tampered.replace(src)
    assert "RECORD hash/size mismatch for vllm_hust_vspec/_version.py" in _check_fails(dist_copy)


def test_check_rejects_an_sdist_without_manage_sh(dist_copy: pathlib.Path) -> None:
    src = dist_copy / SDIST
    buf = io.BytesIO()
    with tarfile.open(src) as tin, tarfile.open(fileobj=buf, mode="w:gz") as tout:
        for m in tin.getmembers():
            if not m.name.endswith("/manage.sh"):
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    src.write_bytes(buf.getvalue())
    assert f"{SDIST}: vllm_hust_vspec-{__version__}/manage.sh missing" in _check_fails(dist_copy)


# ---------------------------------------------------------------- publish refusals

@pytest.fixture
def clean_repo(tmp_path: pathlib.Path, vspec_dist: pathlib.Path) -> pathlib.Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(REPO / "release.sh", repo / "release.sh")
    shutil.copytree(REPO / "src", repo / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (repo / ".gitignore").write_text("dist/\n")
    shutil.copytree(vspec_dist, repo / "dist")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "release"]):
        subprocess.run(["git", *cmd], cwd=repo, env=env, check=True)
    # Stand-in uv: records its argv and whether the token reached it through the env.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "uv").write_text(
        "#!/usr/bin/env bash\n"
        f"printf '%s\\n' \"$*\" > {tmp_path}/uv-argv\n"
        f"[[ -n \"${{UV_PUBLISH_TOKEN:-}}\" ]] && echo yes > {tmp_path}/uv-token-seen\n"
        "exit 0\n")
    (bindir / "uv").chmod(0o755)
    return repo


def _publish(repo: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    path = f"{repo.parent / 'bin'}:{os.environ['PATH']}"
    proc = release("publish", cwd=repo, PATH=path, **env)
    assert TOKEN not in proc.stdout + proc.stderr
    return proc


def test_publish_refuses_a_dirty_tree(clean_repo: pathlib.Path) -> None:
    (clean_repo / "stray.txt").write_text("x")
    proc = _publish(clean_repo, UV_PUBLISH_TOKEN=TOKEN, VSPEC_RELEASE_CONFIRM=__version__)
    assert proc.returncode == 1
    assert "refusing to publish: the git tree is not clean" in proc.stderr
    assert not (clean_repo.parent / "uv-argv").exists()


def test_publish_refuses_without_token(clean_repo: pathlib.Path) -> None:
    proc = _publish(clean_repo, VSPEC_RELEASE_CONFIRM=__version__)
    assert proc.returncode == 1
    assert "refusing to publish: UV_PUBLISH_TOKEN is not set" in proc.stderr


@pytest.mark.parametrize("confirm", [None, "0.0.1", "yes"])
def test_publish_refuses_without_matching_confirmation(clean_repo: pathlib.Path,
                                                       confirm: str | None) -> None:
    env = {"UV_PUBLISH_TOKEN": TOKEN}
    if confirm is not None:
        env["VSPEC_RELEASE_CONFIRM"] = confirm
    proc = _publish(clean_repo, **env)
    assert proc.returncode == 1
    assert f"refusing to publish: set VSPEC_RELEASE_CONFIRM={__version__}" in proc.stderr
    assert not (clean_repo.parent / "uv-argv").exists()


def test_publish_passes_the_token_only_through_the_environment(clean_repo: pathlib.Path) -> None:
    proc = _publish(clean_repo, UV_PUBLISH_TOKEN=TOKEN, VSPEC_RELEASE_CONFIRM=__version__)
    assert proc.returncode == 0, proc.stderr
    argv = (clean_repo.parent / "uv-argv").read_text().split()
    assert argv == ["publish", str(clean_repo / "dist" / WHEEL), str(clean_repo / "dist" / SDIST)]
    assert (clean_repo.parent / "uv-token-seen").read_text().strip() == "yes"


def test_build_prefers_uv_and_falls_back_to_python_build(tmp_path: pathlib.Path) -> None:
    """--dry-run: the commands are printed, nothing is built or wiped."""
    out = tmp_path / "dist"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "uv").write_text("#!/usr/bin/env bash\nexit 0\n")
    (bindir / "uv").chmod(0o755)
    with_uv = release("--dry-run", "build", VSPEC_DIST_DIR=str(out),
                      PATH=f"{bindir}:{os.environ['PATH']}")
    assert with_uv.returncode == 0, with_uv.stderr
    assert f"+ uv build --no-sources --out-dir {out} {REPO}" in with_uv.stderr
    assert f"+ rm -rf {out} {REPO / 'build'}" in with_uv.stderr
    path = ":".join(p for p in os.environ["PATH"].split(":")
                    if not (pathlib.Path(p) / "uv").exists())
    without = release("--dry-run", "build", VSPEC_DIST_DIR=str(out), PATH=path)
    assert without.returncode == 0, without.stderr
    assert "uv not found: building with python -m build" in without.stderr
    assert f"-m build --outdir {out} {REPO}" in without.stderr
    assert "-m vllm_hust_vspec.tools.release_audit" in without.stderr
    assert not out.exists()
