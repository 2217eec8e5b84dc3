"""The Extension Manager manifest and MOD_METADATA.json, validated by the documented rules.

The real Manager (``vllm-hust-ext``) is not installable here, so these tests run the package's
own validator (:mod:`vllm_hust_vspec.tools.manifest_check`) on the real files and on copies
with one rule broken each, and emulate the Manager's static discovery in a subprocess.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from vllm_hust_vspec import __version__
from vllm_hust_vspec.tools import manifest_check as mc

pytestmark = pytest.mark.packaging

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = REPO / "src/vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json"
PY = sys.executable


def _doc() -> dict:
    return json.loads(MANIFEST.read_text())


def test_manifest_is_exactly_the_documented_document() -> None:
    doc = _doc()
    assert list(doc) == ["schema_version", "extension_id", "extension_version", "kind", "host",
                         "runtime", "lifecycle_owner", "protocols", "implementation",
                         "requires_services", "activation", "resource_claims"]
    assert doc["schema_version"] == "0.3"
    assert doc["extension_id"] == "org.vllm-hust.vspec"
    assert doc["extension_version"] == __version__
    assert doc["kind"] == "in_process_plugin"
    assert doc["host"]["provider"] == doc["host"]["name"] == "vllm"
    assert set(doc["host"]) == {"provider", "name", "version_range"}
    assert doc["runtime"] == {"type": "python", "process_scope": "vllm-processes",
                              "isolation": "trusted_in_process"}
    assert doc["lifecycle_owner"] == "vllm"
    assert doc["protocols"] == [
        {"name": "vllm.general_plugins", "version_range": None},
        {"name": "vllm-ascend.spec-decode-private-abi", "version_range": None},
    ]
    assert doc["implementation"] == [{"type": "python_entry_point",
                                      "group": "vllm.general_plugins", "name": "vspec",
                                      "value": "vllm_hust_vspec:register"}]
    assert doc["requires_services"] == []
    assert doc["activation"] == {"environment": {"HUST_VSPEC_ENABLED": "1"}}
    assert doc["resource_claims"] == [{"resource": "vllm.speculative-decoding.patchset",
                                       "scope": "vllm-process", "mode": "exclusive"}]


def test_host_range_has_prerelease_lower_bound_and_covers_the_doctor_hosts() -> None:
    spec = SpecifierSet(_doc()["host"]["version_range"])
    lower = [s for s in spec if s.operator == ">="]
    assert len(lower) == 1 and Version(lower[0].version).is_prerelease
    # vLLM-HUST dev builds (distribution "vllm"), its PyPI release, Ascend's vLLM 0.23, the
    # CPU host 0.32, vLLM 0.33 (the doctor passes on its source): all inside; a vLLM we have
    # never probed is outside.
    for host in ("0.17.2rc1.dev5871+g762f85b31.empty", "0.17.2.post1", "0.23.0",
                 "0.25.1rc1+hust.20260903.4", "0.32.0", "0.33.0"):
        assert spec.contains(host), host
    for host in ("0.17.1", "0.34.0", "1.0.0"):
        assert not spec.contains(host), host


def test_checkout_validates() -> None:
    summary = mc.check_source(REPO)
    assert summary["extension_id"] == "org.vllm-hust.vspec"
    assert summary["extension_version"] == __version__
    proc = subprocess.run([PY, "-m", "vllm_hust_vspec.tools.manifest_check", "source",
                           "--root", str(REPO)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"valid: org.vllm-hust.vspec {__version__}" in proc.stdout


# ---------------------------------------------------------------- one rule broken at a time

@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    """The files the source check reads, copied from this checkout."""
    for rel in ("pyproject.toml", "MOD_METADATA.json", "src/vllm_hust_vspec/_version.py",
                "src/vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    mc.check_source(tmp_path)  # the copy is valid before we break it
    return tmp_path


def _edit_manifest(project: pathlib.Path, change) -> None:
    path = project / "src/vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _errors(project: pathlib.Path) -> str:
    with pytest.raises(mc.ManifestError) as info:
        mc.check_source(project)
    return "\n".join(info.value.errors)


def test_wrong_version(project: pathlib.Path) -> None:
    _edit_manifest(project, lambda d: d.update(extension_version="9.9.9"))
    msg = _errors(project)
    assert "$.extension_version: '9.9.9' differs from the package version" in msg
    assert __version__ in msg


def test_two_manifests(project: pathlib.Path) -> None:
    manifests = project / "src/vllm_hust_vspec/manifests"
    shutil.copy2(manifests / "vllm-hust-extension-v0.3.json",
                 manifests / "vllm-hust-extension-v0.2.json")
    msg = _errors(project)
    assert "must contain exactly one Bundle v1 manifest" in msg
    assert "vllm-hust-extension-v0.3.json, vllm-hust-extension-v0.2.json" in msg


def test_no_manifest(project: pathlib.Path) -> None:
    (project / "src/vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json").unlink()
    assert "found none" in _errors(project)


def test_symlinked_manifest(project: pathlib.Path) -> None:
    path = project / "src/vllm_hust_vspec/manifests/vllm-hust-extension-v0.3.json"
    real = project / "real.json"
    path.rename(real)
    path.symlink_to(real)
    assert "must be a regular file, not a symlink" in _errors(project)


def test_id_mismatch(project: pathlib.Path) -> None:
    _edit_manifest(project, lambda d: d.update(extension_id="org.vllm-hust.other"))
    msg = _errors(project)
    assert ("$.extension_id: 'org.vllm-hust.other' differs from the "
            "'vllm_hust.extension_bundles' entry-point name 'org.vllm-hust.vspec'") in msg


def test_unknown_top_level_field(project: pathlib.Path) -> None:
    _edit_manifest(project, lambda d: d.update(components_v2=[]))
    assert "$.components_v2: unknown field" in _errors(project)


@pytest.mark.parametrize("where,path", [
    (lambda d: d["host"], "$.host.api"),
    (lambda d: d["runtime"], "$.runtime.api"),
    (lambda d: d["protocols"][0], "$.protocols[0].api"),
    (lambda d: d["resource_claims"][0], "$.resource_claims[0].api"),
    (lambda d: d["activation"], "$.activation.api"),
])
def test_unknown_nested_field(project: pathlib.Path, where, path: str) -> None:
    _edit_manifest(project, lambda d: where(d).update(api="1"))
    assert f"{path}: unknown field" in _errors(project)


def test_extra_attributes_allowed_on_entry_point_carrier_only(project: pathlib.Path) -> None:
    _edit_manifest(project, lambda d: d["implementation"][0].update(note="extra attribute"))
    mc.check_source(project)  # allowed: not a python_module carrier
    _edit_manifest(project, lambda d: d["implementation"].append(
        {"type": "python_module", "module": "vllm_hust_vspec", "object": "register",
         "status": "active", "note": "x"}))
    assert "a python_module carrier has exactly module, object, and status" in _errors(project)


@pytest.mark.parametrize("change,expected", [
    (lambda d: d["host"].update(version_range=">=banana"),
     "$.host.version_range: '>=banana' is not a valid PEP 440 version range"),
    (lambda d: d.pop("runtime"), "missing required field 'runtime'"),
    (lambda d: d.update(schema_version="0.3.1"), "'0.3.1' is not one of"),
    (lambda d: d.update(extension_version="one"), "'one' is not a valid PEP 440 version"),
    (lambda d: d.update(kind="plugin"), "$.kind: 'plugin' is not one of"),
    (lambda d: d.update(extension_id="Org.Vspec"), "$.extension_id: 'Org.Vspec' does not match"),
    (lambda d: d["resource_claims"].append(dict(d["resource_claims"][0])), "duplicate claim"),
    (lambda d: d["resource_claims"][0].update(mode="owned"), "'owned' is not one of"),
    (lambda d: d.update(implementation=[]), "$.implementation: must have at least one item"),
    (lambda d: d["activation"].update(environment={"HUST_VSPEC_ENABLED": 1}),
     "$.activation.environment: must map strings to strings"),
    (lambda d: d.update(schema_version="0.2-experimental"),
     "$.resource_claims: only allowed with schema_version 0.3"),
])
def test_document_rules(project: pathlib.Path, change, expected: str) -> None:
    _edit_manifest(project, change)
    assert expected in _errors(project)


def test_declared_entry_point_must_be_registered(project: pathlib.Path) -> None:
    _edit_manifest(project, lambda d: d["implementation"][0].update(name="vspec2"))
    assert "declares entry point vllm.general_plugins:vspec2, which the distribution does " \
           "not register" in _errors(project)


def test_manifest_must_be_package_data(project: pathlib.Path) -> None:
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    assert '"manifests/*.json", ' in text
    pyproject.write_text(text.replace('"manifests/*.json", ', ""))
    assert "must include 'manifests/*.json'" in _errors(project)


def test_cli_reports_each_error_and_exits_1(project: pathlib.Path) -> None:
    _edit_manifest(project, lambda d: (d.update(extension_version="9.9.9"),
                                       d["host"].update(extra=1)))
    proc = subprocess.run([PY, "-m", "vllm_hust_vspec.tools.manifest_check", "source", "--root",
                           str(project)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("manifest_check: error: ") for line in lines)
    assert "extension_version" in lines[0] or "extension_version" in lines[1]


# ---------------------------------------------------------------- MOD_METADATA.json

def test_mod_metadata_is_valid_default_off_and_unqualified() -> None:
    doc = json.loads((REPO / "MOD_METADATA.json").read_text())
    assert mc.validate_mod_metadata(doc) == []
    assert doc["schema_version"] == "vllm-hust-mod-metadata-v1"
    assert doc["lifecycle"]["default_enabled"] is False
    assert doc["lifecycle"]["rollback_contract"]
    assert doc["evidence"]["qualification"] == "unqualified"
    assert doc["evidence"]["performance_claims"] == []


@pytest.mark.parametrize("change,expected", [
    (lambda d: d["lifecycle"].update(default_enabled=True), "default_enabled: must be false"),
    (lambda d: d["responsibility"].update(advisors=[{"name": "A", "relationship": "internal"}]),
     "must be [] when advisor_status is 'unknown'"),
    (lambda d: d["responsibility"].update(maintainers=[]), "must have at least one item"),
    (lambda d: d["responsibility"]["maintainers"][0].update(github="-bad-"), "does not match"),
    (lambda d: d["evidence"].update(performance_claims=["2x"]), "must be [] while unqualified"),
    (lambda d: d.update(canonical_repository="https://example.com/x"),
     "must start with https://github.com/vLLM-HUST/<repository>"),
    (lambda d: d["scope"].update(extra=1), "$.scope.extra: unknown field"),
])
def test_mod_metadata_rules(change, expected: str) -> None:
    doc = json.loads((REPO / "MOD_METADATA.json").read_text())
    change(doc)
    assert any(expected in e for e in mc.validate_mod_metadata(doc))


# ---------------------------------------------------------------- discovery without import

FORBIDDEN = ("vllm", "torch", "vllm_hust_vspec.patches", "vllm_hust_vspec.adaptive",
             "vllm_hust_vspec.launcher", "vllm_hust_vspec.runtime")


def test_importing_the_manifest_package_loads_no_runtime() -> None:
    code = textwrap.dedent(f"""
        import json, sys
        import vllm_hust_vspec.manifests
        bad = [m for m in sys.modules
               if any(m == f or m.startswith(f + ".") for f in {FORBIDDEN!r})]
        print(json.dumps(bad))
    """)
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout) == []


def test_static_discovery_finds_the_manifest_without_importing_anything() -> None:
    """What the Manager does: entry point -> distribution -> file; nothing imported."""
    code = textwrap.dedent("""
        import importlib.metadata as md, json, pathlib, sys, urllib.parse
        (ep,) = [e for e in md.entry_points(group="vllm_hust.extension_bundles")
                 if e.name == "org.vllm-hust.vspec"]
        rel = pathlib.PurePosixPath(*ep.value.split("."))
        hits = [ep.dist.locate_file(f) for f in ep.dist.files or []
                if f.parent == rel and f.name.endswith(".json")]
        if not hits:  # editable install: PEP 610 direct_url.json
            info = json.loads(ep.dist.read_text("direct_url.json"))
            root = pathlib.Path(urllib.parse.urlparse(info["url"]).path)
            hits = list((root / "src" / rel).glob("vllm-hust-extension-*.json"))
        doc = json.loads(pathlib.Path(str(hits[0])).read_text())
        print(json.dumps({"n": len(hits), "id": doc["extension_id"], "value": ep.value,
                          "loaded": sorted(m for m in sys.modules if m.startswith("vllm"))}))
    """)
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    assert out == {"n": 1, "id": "org.vllm-hust.vspec", "value": "vllm_hust_vspec.manifests",
                   "loaded": []}


def test_installed_discovery_emulation_is_valid() -> None:
    proc = subprocess.run([PY, "-m", "vllm_hust_vspec.tools.manifest_check", "inspect"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["valid"] is True and row["bundle_id"] == "org.vllm-hust.vspec"
    assert row["bundle_version"] == __version__
    assert pathlib.Path(row["manifest_path"]).resolve() == MANIFEST.resolve()
    assert row["activation_ready"] is True
