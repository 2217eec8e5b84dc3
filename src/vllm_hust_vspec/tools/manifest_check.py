"""Validate the Extension Manager manifest and ``MOD_METADATA.json`` by the documented rules.

The vLLM-HUST Extension Manager (``vllm-hust-ext``) cannot be installed from PyPI, so the
package checks its own manifest the way the Manager's 0.3 parser and its static discovery do
(as the Manager's documentation describes its manifest format, discovery and validation):

* the document: required fields, allowed keys at every level (unknown fields are rejected,
  except extra attributes of non-``python_module`` implementation carriers), enums,
  identifier/resource patterns, PEP 440 versions and ranges (``packaging``), duplicates;
* the package: exactly one manifest file (a regular file) in the directory named by the
  ``vllm_hust.extension_bundles`` entry point, ``extension_id`` equal to the entry-point name,
  the entry-point value a module path without ``:``, ``extension_version`` equal to
  ``_version.py`` (and to the distribution version when installed), the manifest shipped as
  package data, every declared entry point registered by the same distribution;
* ``MOD_METADATA.json``: the ``vllm-hust-mod-metadata-v1`` rules.

Nothing here imports the runtime (no ``vllm``, no ``torch``, none of our patches).

CLI: ``python -m vllm_hust_vspec.tools.manifest_check source [--root DIR] [--json]`` checks a
checkout; ``installed [--json]`` emulates the Manager's discovery on the installed
distribution; ``inspect`` prints the discovered manifest with its location.  Exit 0 valid,
1 invalid, 2 usage error.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import json
import pathlib
import re
import sys
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_hust_vspec.errors import VspecError

DISTRIBUTION = "vllm-hust-vspec"
PACKAGE = "vllm_hust_vspec"
BUNDLE_GROUP = "vllm_hust.extension_bundles"
MANIFEST_NAMES = (
    "vllm-hust-extension-v0.3.json",
    "vllm-hust-extension-v0.2.json",
    "vllm-hust-extension-v1.json",
    "extension-bundle-v1.json",
)
SCHEMA_VERSIONS = ("0.3", "0.3-experimental", "0.2-experimental")
KINDS = ("in_process_plugin", "scheduler_policy", "kv_connector", "kv_service_adapter",
         "control_plane_extension", "runtime_bridge")
RUNTIME_TYPES = ("python", "external_service", "oci", "kubernetes", "composite")
LIFECYCLE_OWNERS = ("vllm", "host", "external_operator", "kubernetes", "user")
CARRIER_TYPES = ("python_module", "host_builtin", "python_entry_point", "external_service",
                 "oci_image", "helm_values", "kubernetes_manifest", "crd", "controller")
CARRIER_STATUSES = ("active", "import_only", "legacy_unregistered")
CLAIM_MODES = ("exclusive", "shared")
PLANES = ("api", "scheduler", "worker", "native", "device", "bridge")
ISOLATIONS = ("trusted_in_process", "process_isolated", "sandboxed_process")
PERMISSIONS = ("device_access", "filesystem_read", "filesystem_write", "ipc",
               "network_egress", "shared_memory", "subprocess")

TOP_REQUIRED = ("schema_version", "extension_id", "extension_version", "kind", "host",
                "runtime", "lifecycle_owner", "protocols", "implementation",
                "requires_services")
TOP_OPTIONAL = ("requires_extensions", "resource_claims", "components", "activation")
ONLY_03 = ("requires_extensions", "resource_claims")

ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
RESOURCE_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*$")
IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DOTTED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
GITHUB_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}$")


class ManifestError(VspecError):
    """Invalid manifest, metadata or package layout; ``errors`` holds one line each."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# ============================================================================ documents

class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where
        self.errors: list[str] = []

    def err(self, path: str, msg: str) -> None:
        self.errors.append(f"{self.where}: {path}: {msg}")

    def keys(self, obj: Any, path: str, required: Iterable[str],
             optional: Iterable[str] = ()) -> bool:
        """Object with exactly the allowed keys; False when it is not an object."""
        if not isinstance(obj, dict):
            self.err(path, f"must be an object, got {type(obj).__name__}")
            return False
        required = tuple(required)
        allowed = set(required) | set(optional)
        for key in obj:
            if key not in allowed:
                self.err(f"{path}.{key}", f"unknown field (allowed: {', '.join(sorted(allowed))})")
        for key in required:
            if key not in obj:
                self.err(path, f"missing required field '{key}'")
        return True

    def string(self, obj: Mapping[str, Any], key: str, path: str,
               pattern: re.Pattern[str] | None = None,
               choices: Iterable[str] | None = None) -> None:
        if key not in obj:
            return
        value = obj[key]
        if not isinstance(value, str) or not value:
            self.err(f"{path}.{key}", "must be a non-empty string")
            return
        if pattern is not None and not pattern.match(value):
            self.err(f"{path}.{key}", f"{value!r} does not match {pattern.pattern}")
        if choices is not None and value not in tuple(choices):
            self.err(f"{path}.{key}", f"{value!r} is not one of {', '.join(choices)}")

    def specifier(self, obj: Mapping[str, Any], key: str, path: str,
                  nullable: bool = False) -> None:
        if key not in obj:
            return
        value = obj[key]
        if value is None and nullable:
            return
        if not isinstance(value, str) or not value.strip():
            self.err(f"{path}.{key}", "must be a PEP 440 version specifier string"
                     + (" or null" if nullable else ""))
            return
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            self.err(f"{path}.{key}", f"{value!r} is not a valid PEP 440 version range")

    def array(self, obj: Mapping[str, Any], key: str, path: str,
              non_empty: bool = False) -> list[Any]:
        value = obj.get(key)
        if key not in obj:
            return []
        if not isinstance(value, list):
            self.err(f"{path}.{key}", "must be an array")
            return []
        if non_empty and not value:
            self.err(f"{path}.{key}", "must have at least one item")
        return value


def validate_document(doc: Any, where: str = "manifest") -> list[str]:
    """Every rule of the documented manifest shape; returns one message per problem."""
    c = _Checker(where)
    if not c.keys(doc, "$", TOP_REQUIRED, TOP_OPTIONAL):
        return c.errors
    _check_header(c, doc)
    _check_host_runtime(c, doc)
    _check_implementation(c, doc)
    _check_requirements(c, doc)
    _check_claims(c, doc)
    _check_components(c, doc)
    _check_activation(c, doc)
    return c.errors


def _check_header(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Schema version, id, version, kind and owner."""
    c.string(doc, "schema_version", "$", choices=SCHEMA_VERSIONS)
    if doc.get("schema_version") == "0.2-experimental":
        for key in ONLY_03:
            if key in doc:
                c.err(f"$.{key}", "only allowed with schema_version 0.3 / 0.3-experimental")
    c.string(doc, "extension_id", "$", pattern=ID_RE)
    if "extension_version" in doc:
        version = doc["extension_version"]
        try:
            Version(version if isinstance(version, str) else "")
        except InvalidVersion:
            c.err("$.extension_version", f"{version!r} is not a valid PEP 440 version")
    c.string(doc, "kind", "$", choices=KINDS)
    c.string(doc, "lifecycle_owner", "$", choices=LIFECYCLE_OWNERS)


def _check_host_runtime(c: _Checker, doc: Mapping[str, Any]) -> None:
    """The host it extends and the runtime it runs in."""
    host = doc.get("host")
    if "host" in doc and c.keys(host, "$.host", ("provider", "name", "version_range"),
                                ("api_range",)):
        c.string(host, "provider", "$.host", pattern=ID_RE)
        c.string(host, "name", "$.host")
        c.specifier(host, "version_range", "$.host")
        c.specifier(host, "api_range", "$.host")

    runtime = doc.get("runtime")
    if "runtime" in doc and c.keys(runtime, "$.runtime", ("type", "process_scope", "isolation")):
        c.string(runtime, "type", "$.runtime", choices=RUNTIME_TYPES)
        c.string(runtime, "process_scope", "$.runtime")
        c.string(runtime, "isolation", "$.runtime")


def _check_implementation(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Protocols and implementation carriers."""
    for i, item in enumerate(c.array(doc, "protocols", "$")):
        p = f"$.protocols[{i}]"
        if c.keys(item, p, ("name", "version_range")):
            c.string(item, "name", p)
            c.specifier(item, "version_range", p, nullable=True)

    for i, item in enumerate(c.array(doc, "implementation", "$", non_empty=True)):
        p = f"$.implementation[{i}]"
        if not isinstance(item, dict):
            c.err(p, "must be an object")
            continue
        c.string(item, "type", p, choices=CARRIER_TYPES)
        if "type" not in item:
            c.err(p, "missing required field 'type'")
        elif item["type"] == "python_module":
            if set(item) != {"type", "module", "object", "status"}:
                c.err(p, "a python_module carrier has exactly module, object, and status")
            c.string(item, "module", p, pattern=DOTTED_RE)
            c.string(item, "object", p, pattern=IDENT_RE)
            c.string(item, "status", p, choices=CARRIER_STATUSES)
        elif len(item) < 2:
            c.err(p, f"a {item['type']} carrier needs at least one attribute besides type")


def _check_requirements(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Required services and extensions."""
    for i, item in enumerate(c.array(doc, "requires_services", "$")):
        p = f"$.requires_services[{i}]"
        if c.keys(item, p, ("service_id", "protocol", "version_range", "endpoint_config"),
                  ("optional",)):
            c.string(item, "service_id", p)
            c.string(item, "protocol", p)
            c.specifier(item, "version_range", p, nullable=True)
            if "optional" in item and not isinstance(item["optional"], bool):
                c.err(f"{p}.optional", "must be a boolean")

    seen_ext: set[str] = set()
    for i, item in enumerate(c.array(doc, "requires_extensions", "$")):
        p = f"$.requires_extensions[{i}]"
        if c.keys(item, p, ("extension_id", "version_range")):
            c.string(item, "extension_id", p, pattern=ID_RE)
            c.specifier(item, "version_range", p)
            if item.get("extension_id") in seen_ext:
                c.err(p, f"duplicate dependency {item['extension_id']!r}")
            seen_ext.add(item.get("extension_id"))


def _check_claims(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Resource claims (no duplicate resource @ scope)."""
    seen_claims: set[tuple[Any, Any]] = set()
    for i, item in enumerate(c.array(doc, "resource_claims", "$")):
        p = f"$.resource_claims[{i}]"
        if c.keys(item, p, ("resource", "scope", "mode")):
            c.string(item, "resource", p, pattern=RESOURCE_RE)
            c.string(item, "scope", p, pattern=RESOURCE_RE)
            c.string(item, "mode", p, choices=CLAIM_MODES)
            key = (item.get("scope"), item.get("resource"))
            if key in seen_claims:
                c.err(p, f"duplicate claim {key[1]!r} @ {key[0]!r}")
            seen_claims.add(key)


def _check_components(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Components (unique ids, contracts, planes, permissions)."""
    seen_components: set[str] = set()
    for i, item in enumerate(c.array(doc, "components", "$")):
        p = f"$.components[{i}]"
        if not c.keys(item, p, ("component_id", "contracts", "execution_planes", "isolation",
                                "implementation_ref"), ("permissions",)):
            continue
        c.string(item, "component_id", p, pattern=IDENT_RE)
        if item.get("component_id") in seen_components:
            c.err(p, f"duplicate component_id {item['component_id']!r}")
        seen_components.add(item.get("component_id"))
        contracts = c.array(item, "contracts", p, non_empty=True)
        if len(set(map(str, contracts))) != len(contracts) or not all(
                isinstance(x, str) and x.startswith("vllm.") for x in contracts):
            c.err(f"{p}.contracts", "must be unique strings starting with 'vllm.'")
        for key, allowed in (("execution_planes", PLANES), ("permissions", PERMISSIONS)):
            for x in c.array(item, key, p):
                if x not in allowed:
                    c.err(f"{p}.{key}", f"{x!r} is not one of {', '.join(allowed)}")
        c.string(item, "isolation", p, choices=ISOLATIONS)
        ref = item.get("implementation_ref")
        if not (isinstance(ref, str) and ":" in ref
                and DOTTED_RE.match(ref.split(":", 1)[0])
                and DOTTED_RE.match(ref.split(":", 1)[1])):
            c.err(f"{p}.implementation_ref", "must be 'module.path:object'")


def _check_activation(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Activation: entry points, environment, additional config."""
    act = doc.get("activation")
    if "activation" in doc and c.keys(act, "$.activation", (),
                                      ("entry_points", "environment", "additional_config")):
        for i, item in enumerate(c.array(act, "entry_points", "$.activation")):
            p = f"$.activation.entry_points[{i}]"
            if c.keys(item, p, ("group", "name")):
                c.string(item, "group", p)
                c.string(item, "name", p)
        env = act.get("environment", {})
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            c.err("$.activation.environment", "must map strings to strings")
        if not isinstance(act.get("additional_config", {}), dict):
            c.err("$.activation.additional_config", "must be an object")


def declared_entry_points(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(group, name) of every entry point the manifest says the distribution installs."""
    out = []
    for item in doc.get("implementation", []):
        if isinstance(item, dict) and item.get("type") == "python_entry_point":
            out.append((item.get("group"), item.get("name")))
    for item in (doc.get("activation") or {}).get("entry_points", []):
        if isinstance(item, dict):
            out.append((item.get("group"), item.get("name")))
    return out


def validate_mod_metadata(doc: Any, where: str = "MOD_METADATA.json") -> list[str]:
    """The ``vllm-hust-mod-metadata-v1`` rules."""
    c = _Checker(where)
    if not c.keys(doc, "$", ("schema_version", "mod_id", "repository", "display_name",
                             "canonical_repository", "responsibility", "lifecycle", "scope",
                             "evidence"), ("metadata_source",)):
        return c.errors
    _check_mod_identity(c, doc)
    _check_mod_responsibility(c, doc)
    _check_mod_lifecycle_scope(c, doc)
    _check_mod_evidence(c, doc)
    return c.errors


def _check_mod_identity(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Schema version, ids and the canonical repository."""
    if doc.get("schema_version") != "vllm-hust-mod-metadata-v1":
        c.err("$.schema_version", "must be 'vllm-hust-mod-metadata-v1'")
    for key in ("mod_id", "repository", "display_name"):
        c.string(doc, key, "$")
    repo = doc.get("repository")
    url = doc.get("canonical_repository")
    if not (isinstance(url, str) and isinstance(repo, str)
            and url.startswith(f"https://github.com/vLLM-HUST/{repo}")):
        c.err("$.canonical_repository", "must start with https://github.com/vLLM-HUST/<repository>")


def _check_mod_responsibility(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Organisation, maintainers and advisors."""
    resp = doc.get("responsibility")
    if "responsibility" in doc and c.keys(resp, "$.responsibility", (
            "organization", "maintainers", "advisor_status", "advisors")):
        if resp.get("organization") != "vLLM-HUST":
            c.err("$.responsibility.organization", "must be 'vLLM-HUST'")
        maintainers = c.array(resp, "maintainers", "$.responsibility", non_empty=True)
        for i, m in enumerate(maintainers):
            p = f"$.responsibility.maintainers[{i}]"
            if c.keys(m, p, ("name", "github")):
                c.string(m, "name", p)
                c.string(m, "github", p, pattern=GITHUB_RE)
        status = resp.get("advisor_status")
        c.string(resp, "advisor_status", "$.responsibility",
                 choices=("none", "unknown", "declared"))
        advisors = c.array(resp, "advisors", "$.responsibility")
        if status in ("none", "unknown") and advisors:
            c.err("$.responsibility.advisors", f"must be [] when advisor_status is {status!r}")
        if status == "declared" and not advisors:
            c.err("$.responsibility.advisors",
                  "must be non-empty when advisor_status is 'declared'")
        for i, a in enumerate(advisors):
            p = f"$.responsibility.advisors[{i}]"
            if c.keys(a, p, ("name", "relationship"), ("github",)):
                c.string(a, "name", p)
                c.string(a, "relationship", p)


def _check_mod_lifecycle_scope(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Lifecycle (never enabled by default) and scope."""
    life = doc.get("lifecycle")
    if "lifecycle" in doc and c.keys(life, "$.lifecycle", (
            "status", "default_enabled", "activation_contract", "rollback_contract")):
        if life.get("default_enabled") is not False:
            c.err("$.lifecycle.default_enabled", "must be false")
        for key in ("status", "activation_contract", "rollback_contract"):
            c.string(life, key, "$.lifecycle")
    scope = doc.get("scope")
    if "scope" in doc and c.keys(scope, "$.scope", ("mechanism", "supported_workloads",
                                                    "out_of_scope")):
        c.string(scope, "mechanism", "$.scope")
        c.array(scope, "supported_workloads", "$.scope")
        c.array(scope, "out_of_scope", "$.scope")


def _check_mod_evidence(c: _Checker, doc: Mapping[str, Any]) -> None:
    """Evidence (no performance claims while unqualified) and the metadata source."""
    ev = doc.get("evidence")
    if "evidence" in doc and c.keys(ev, "$.evidence", ("qualification", "latest_result",
                                                       "index", "performance_claims")):
        c.string(ev, "qualification", "$.evidence", choices=(
            "unqualified", "qualified", "not-beneficial-in-tested-cell", "rejected"))
        for key in ("latest_result", "index"):
            if ev.get(key) is not None and not isinstance(ev.get(key), str):
                c.err(f"$.evidence.{key}", "must be a URL/path string or null")
        claims = c.array(ev, "performance_claims", "$.evidence")
        if ev.get("qualification") == "unqualified" and claims:
            c.err("$.evidence.performance_claims", "must be [] while unqualified")
    src = doc.get("metadata_source")
    if "metadata_source" in doc and c.keys(src, "$.metadata_source", ("repository", "commit")):
        c.string(src, "repository", "$.metadata_source")
        c.string(src, "commit", "$.metadata_source")


# ============================================================================ packages

def read_version_file(path: pathlib.Path) -> str:
    """``__version__`` from ``_version.py``, read with ast (no import)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__version__" for t in stmt.targets)
                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
            return stmt.value.value
    raise ManifestError([f"{path}: no __version__ string"])


def manifest_in(directory: pathlib.Path) -> pathlib.Path:
    """The one manifest in a bundle directory (errors: none, two, symlink, not a file)."""
    present = [directory / n for n in MANIFEST_NAMES if (directory / n).exists()
               or (directory / n).is_symlink()]
    if len(present) != 1:
        names = ", ".join(p.name for p in present) or "none"
        raise ManifestError([f"{directory}: must contain exactly one Bundle v1 manifest "
                             f"(one of {', '.join(MANIFEST_NAMES)}); found {names}"])
    path = present[0]
    if path.is_symlink() or not path.is_file():
        raise ManifestError([f"{path}: the manifest must be a regular file, not a symlink"])
    return path


def load_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError([f"{path}: not UTF-8 JSON: {exc}"]) from exc


def _package_checks(doc: Mapping[str, Any], manifest: pathlib.Path, version: str,
                    bundle_eps: Mapping[str, str], installed_eps: set[tuple[str, str]],
                    where_eps: str) -> list[str]:
    errors = []
    if doc.get("extension_version") != version:
        errors.append(f"{manifest}: $.extension_version: {doc.get('extension_version')!r} "
                      f"differs from the package version {version!r} (_version.py)")
    ext_id = doc.get("extension_id")
    if len(bundle_eps) != 1:
        errors.append(f"{where_eps}: expected exactly one '{BUNDLE_GROUP}' entry point, "
                      f"found {sorted(bundle_eps) or 'none'}")
    for name, value in bundle_eps.items():
        if name != ext_id:
            errors.append(f"{manifest}: $.extension_id: {ext_id!r} differs from the "
                          f"'{BUNDLE_GROUP}' entry-point name {name!r} ({where_eps})")
        if ":" in value or not DOTTED_RE.match(value):
            errors.append(f"{where_eps}: entry point {name} = {value!r} must register a static "
                          "module directory (a dotted module path without ':')")
    for group, name in declared_entry_points(doc):
        if (group, name) not in installed_eps:
            errors.append(f"{manifest}: declares entry point {group}:{name}, which the "
                          f"distribution does not register ({where_eps})")
    return errors


def check_source(root: pathlib.Path) -> dict[str, Any]:
    """Validate a checkout: pyproject entry points and package data, the manifest, the
    version, ``MOD_METADATA.json``.  Raises :class:`ManifestError`; returns a summary."""
    root = root.resolve()
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise ManifestError([f"{root}: no pyproject.toml"])
    meta = tomllib.loads(pyproject.read_text())
    eps = meta.get("project", {}).get("entry-points", {})
    bundle_eps = dict(eps.get(BUNDLE_GROUP, {}))
    installed = {(g, n) for g, table in eps.items() for n in table}
    errors: list[str] = []
    data = meta.get("tool", {}).get("setuptools", {}).get("package-data", {}).get(PACKAGE, [])
    if "manifests/*.json" not in data:
        errors.append(f"{pyproject}: [tool.setuptools.package-data] {PACKAGE} must include "
                      "'manifests/*.json' (the JSON is not Python: without it the wheel "
                      "has no manifest)")
    if meta.get("project", {}).get("name") != DISTRIBUTION:
        errors.append(f"{pyproject}: project.name must be {DISTRIBUTION!r}")
    module = next(iter(bundle_eps.values()), f"{PACKAGE}.manifests")
    directory = root / "src" / pathlib.Path(*module.split("."))
    manifest = manifest_in(directory)
    doc = load_json(manifest)
    errors += validate_document(doc, str(manifest))
    version = read_version_file(root / "src" / PACKAGE / "_version.py")
    errors += _package_checks(doc, manifest, version, bundle_eps, installed, str(pyproject))
    stray = root / "src" / PACKAGE
    for name in MANIFEST_NAMES:
        if (stray / name).exists():
            errors.append(f"{stray / name}: a manifest at the package root is not allowed "
                          f"(only in {directory})")
    mod_path = root / "MOD_METADATA.json"
    if not mod_path.is_file():
        errors.append(f"{mod_path}: missing")
    else:
        errors += validate_mod_metadata(load_json(mod_path), str(mod_path))
    if errors:
        raise ManifestError(errors)
    return {"valid": True, "manifest_path": str(manifest), "extension_id": doc["extension_id"],
            "extension_version": doc["extension_version"], "mod_metadata": str(mod_path)}


def discover(extension_id: str | None = None) -> list[dict[str, Any]]:
    """Emulate the Manager's static discovery for every ``vllm_hust.extension_bundles``
    registration (or just ``extension_id``).  Nothing is imported.  Each row is the
    inventory entry; a broken one has ``valid: false`` and ``discovery_error``."""
    rows = []
    for ep in importlib.metadata.entry_points(group=BUNDLE_GROUP):
        if extension_id is not None and ep.name != extension_id:
            continue
        rows.append(_discover_one(ep))
    return rows


def _editable_root(dist: importlib.metadata.Distribution) -> pathlib.Path | None:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    info = json.loads(text)
    if not info.get("dir_info", {}).get("editable") or not info.get("url", "").startswith("file:"):
        return None
    return pathlib.Path(urllib.request.url2pathname(urllib.parse.urlparse(info["url"]).path))


def _locate_manifest(ep: importlib.metadata.EntryPoint,
                     dist: importlib.metadata.Distribution) -> tuple[pathlib.Path, str]:
    """The one Bundle v1 manifest in the entry point's module directory, and where it was
    found: ``RECORD`` (the installed files) or ``editable`` (an editable install's tree)."""
    rel = pathlib.PurePosixPath(*ep.value.split("."))
    found = [dist.locate_file(f) for f in (dist.files or [])
             if f.parent == rel and f.name in MANIFEST_NAMES]
    source = "RECORD"
    if not found:
        root = _editable_root(dist)
        if root is not None:
            source = "editable"
            for base in (root / rel, root / "src" / rel):
                if base.is_dir():
                    found = [base / n for n in MANIFEST_NAMES if (base / n).exists()]
                    break
    if len(found) != 1:
        raise ManifestError([f"{ep.name}: {rel} must contain exactly one Bundle v1 "
                             f"manifest; found {len(found)}"])
    return pathlib.Path(str(found[0])), source


def _discover_one(ep: importlib.metadata.EntryPoint) -> dict[str, Any]:
    dist = ep.dist
    row: dict[str, Any] = {"bundle_id": ep.name, "valid": False}
    try:
        if dist is None:
            raise ManifestError([f"entry point {ep.name}: no owning distribution"])
        row["distribution"] = dist.metadata["Name"]
        row["distribution_version"] = dist.version
        if ":" in ep.value or not DOTTED_RE.match(ep.value):
            raise ManifestError([f"entry point {ep.name} = {ep.value!r} must register a static "
                                 "module directory"])
        manifest, source = _locate_manifest(ep, dist)
        manifest_in(manifest.parent)
        doc = load_json(manifest)
        errors = validate_document(doc, str(manifest))
        bundle_eps = {e.name: e.value for e in dist.entry_points if e.group == BUNDLE_GROUP}
        installed = {(e.group, e.name) for e in dist.entry_points}
        errors += _package_checks(doc, manifest, dist.version, bundle_eps, installed,
                                  f"{dist.metadata['Name']} {dist.version} entry_points.txt")
        version_py = pathlib.Path(str(manifest)).parent.parent / "_version.py"
        if version_py.is_file() and read_version_file(version_py) != dist.version:
            errors.append(f"{version_py}: __version__ {read_version_file(version_py)!r} differs "
                          f"from the installed distribution version {dist.version!r}")
        if errors:
            raise ManifestError(errors)
        row.update({
            "bundle_version": doc["extension_version"],
            "manifest_path": str(manifest),
            "manifest_source": source,
            "kind": doc["kind"],
            "host": doc["host"],
            "runtime": doc["runtime"],
            "lifecycle_owner": doc["lifecycle_owner"],
            "protocols": doc["protocols"],
            "implementation": doc["implementation"],
            "requires_services": doc["requires_services"],
            "requires_extensions": doc.get("requires_extensions", []),
            "resource_claims": doc.get("resource_claims", []),
            "components": doc.get("components", []),
            "activation": doc.get("activation", {}),
            "activation_ready": True,
            "activation_blocker": None,
            "valid": True,
        })
    except ManifestError as exc:
        row["discovery_error"] = exc.errors
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_hust_vspec.tools.manifest_check",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    src = sub.add_parser("source", help="validate a checkout (pyproject, manifest, metadata)")
    src.add_argument("--root", default=".", help="project root (default: .)")
    src.add_argument("--json", action="store_true")
    for name, help_ in (("installed", "discover and validate the installed distribution"),
                        ("inspect", "print the discovered manifest (Manager inspect shape)")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--id", default="org.vllm-hust.vspec", help="extension id")
        sp.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "source":
        try:
            summary = check_source(pathlib.Path(args.root))
        except ManifestError as exc:
            for line in exc.errors:
                print(f"manifest_check: error: {line}", file=sys.stderr)
            return 1
        print(json.dumps(summary, indent=2) if args.json
              else f"valid: {summary['extension_id']} {summary['extension_version']} "
                   f"({summary['manifest_path']})")
        return 0
    rows = discover(args.id)
    if not rows:
        print(f"manifest_check: error: no '{BUNDLE_GROUP}' entry point named {args.id!r} is "
              "installed", file=sys.stderr)
        return 1
    if len(rows) > 1:
        print(f"manifest_check: error: {args.id!r} is registered {len(rows)} times",
              file=sys.stderr)
        return 1
    row = rows[0]
    if not row["valid"]:
        for line in row["discovery_error"]:
            print(f"manifest_check: error: {line}", file=sys.stderr)
        return 1
    if args.cmd == "inspect" or args.json:
        print(json.dumps(row, indent=2))
    else:
        print(f"valid: {row['bundle_id']} {row['bundle_version']} ({row['manifest_path']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
