"""run.sh: presets by name, list, fixtures for tiny-cpu-*, VSPEC_CONFIG (demo: the
benchmark issue's tests)."""

from __future__ import annotations

import json
import subprocess

import pytest
from launcher_util import REPO, clean_env

pytestmark = pytest.mark.cli

PRESETS = sorted(p.stem for p in (REPO / "configs").glob("*.toml"))


def run_sh(*args: str, env=None) -> subprocess.CompletedProcess:
    env = clean_env() if env is None else env
    return subprocess.run([str(REPO / "run.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_list():
    proc = run_sh("list")
    assert proc.returncode == 0
    assert sorted(proc.stdout.split()) == PRESETS


def test_unknown_preset_lists_presets():
    proc = run_sh("nope")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "unknown preset 'nope'" in proc.stderr
    for name in PRESETS:
        assert name in proc.stderr
    assert proc.stderr.count("error:") == 1


def test_tiny_preset_without_fixtures_says_how_to_build(tmp_path):
    proc = run_sh("tiny-cpu-draft", env=clean_env(VSPEC_FIXTURES_DIR=str(tmp_path)))
    assert proc.returncode == 2
    assert f"{tmp_path}/current" in proc.stderr and "./manage.sh fixtures" in proc.stderr
    assert not (tmp_path / "current").exists()  # never builds


def test_tiny_preset_uses_the_fixtures_dir():
    proc = run_sh("tiny-cpu-draft", "--dry-run", "--json", "--port", "8765",
                  env=clean_env(VSPEC_FIXTURES_DIR="/fx"))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    argv = plan["argv"]
    assert argv[argv.index("--model") + 1] == "/fx/current/target-large"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == "/fx/current/draft"
    assert argv[argv.index("--port") + 1] == "8765"
    proc = run_sh("tiny-cpu-eagle3", "--dry-run", "--json", env=clean_env(VSPEC_FIXTURES="/f2"))
    plan = json.loads(proc.stdout)
    spec = json.loads(plan["argv"][plan["argv"].index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "/f2/eagle3", "num_speculative_tokens": 4}


def test_preset_flags_and_native_args():
    proc = run_sh("eagle", "--dry-run", "--json", "--target-platform", "cuda", "--gamma", "3",
                  "--", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    argv = plan["argv"]
    assert argv[:3] == ["vllm", "serve", "/models/Qwen2.5-14B-Instruct"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 3 and spec["method"] == "eagle"
    assert argv[-2:] == ["--seed", "1"]


def test_vspec_config_replaces_the_preset(tmp_path):
    cfg = tmp_path / "mine.toml"
    cfg.write_text('[serve]\nmethod = "ngram"\ntarget_model = "/mine/t"\n')
    proc = run_sh("eagle", "--dry-run", "--json", "--target-platform", "cpu",
                  env=clean_env(VSPEC_CONFIG=str(cfg)))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["argv"][plan["argv"].index("--model") + 1] == "/mine/t"
    assert "VSPEC_CONFIG" in proc.stderr


def test_presets_have_no_absolute_host_paths():
    import tomllib
    for path in (REPO / "configs").glob("*.toml"):
        data = tomllib.loads(path.read_text())
        for key, value in data.get("serve", {}).items():
            if isinstance(value, str):
                assert not value.startswith(("/", "~")), (path.name, key, value)


def test_head_presets_refuse_a_base_build(tmp_path):
    """A 'base' build (the demo's part) has no heads: the eagle/eagle3/mtp presets say how to
    finish it, before any server starts."""
    (tmp_path / "manifest.json").write_text(json.dumps({"stage": "base"}, indent=1))
    for preset in ("tiny-cpu-eagle", "tiny-cpu-eagle3", "tiny-cpu-mtp"):
        proc = run_sh(preset, env=clean_env(VSPEC_FIXTURES=str(tmp_path)))
        assert proc.returncode == 2, preset
        assert "demo's part" in proc.stderr and "./manage.sh fixtures" in proc.stderr, proc.stderr
        assert proc.stderr.count("error:") == 1


def test_the_dspark_preset_refuses_a_build_without_its_drafter(tmp_path):
    """A full build made by the builder alone has no dspark/ (./manage.sh fixtures adds it):
    the preset says so before any server starts."""
    (tmp_path / "manifest.json").write_text(json.dumps({"stage": "full"}, indent=1))
    proc = run_sh("tiny-cpu-dspark", env=clean_env(VSPEC_FIXTURES=str(tmp_path)))
    assert proc.returncode == 2
    assert "no DSpark drafter" in proc.stderr and "./manage.sh fixtures" in proc.stderr, proc.stderr
