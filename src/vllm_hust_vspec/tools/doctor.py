"""``vllm-hust-vspec-doctor``: does this host have every symbol our patches will touch?

Static: the host's source is read with :mod:`ast` (see :mod:`vllm_hust_vspec.host.probe`);
nothing imports ``vllm``, ``vllm_ascend``, ``torch`` or ``torch_npu``, so the doctor runs on a
machine without the accelerator.  The symbols come only from the patch declarations
(:func:`vllm_hust_vspec.patches.catalog.all_specs`, plus the requirement-only specs for
vLLM-Ascend and vLLM-HUST), filtered by the host family detected from the trees, ``--method``
and ``--adaptive``.

With a vLLM-Ascend tree, the doctor also checks the pairing (:mod:`vllm_hust_vspec.host.pairing`):
that ``vllm_ascend``'s modules import at all over the ``vllm`` tree given.

Exit status: 0 every required symbol exists (and the pairing imports), 1 any is missing (or
the pairing does not import), 2 usage error (bad flag,
unknown method, a root that is not a source tree, no vLLM found).  ``--json`` keys are
documented in ``docs/doctor.md``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import email.parser

import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_hust_vspec._version import __version__
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.host import pairing as pairing_mod
from vllm_hust_vspec.host.detect import find_installed
from vllm_hust_vspec.host.probe import ProbeResult, SourceProbe
from vllm_hust_vspec.patchspec import FAMILY_ASCEND, FAMILY_HUST, FAMILY_VLLM, PatchSpec
from vllm_hust_vspec.models import registration
from vllm_hust_vspec.settings import SettingsError, canonical_method

JSON_SCHEMA = "vllm-hust-vspec-doctor/1"
# Upstream vLLM below this has no dynamic-SD path: such a `vllm` tree is a vLLM-HUST host.
FIRST_VLLM_FAMILY_VERSION = Version("0.24")


class UsageError(VspecError):
    """Bad invocation: exit 2 with this message."""


# ------------------------------------------------------------------------------ specs

def load_specs() -> list[PatchSpec]:
    """Every patch declaration of the project: the catalog (runtime patches and the
    requirement-only specs for vLLM-Ascend and vLLM-HUST)."""
    from vllm_hust_vspec.patches import catalog

    return list(catalog.all_specs())


def select_specs(specs: Iterable[PatchSpec], family: str, method: str | None,
                 adaptive: bool) -> list[PatchSpec]:
    """The specs that matter for this family, method (``None`` = every method) and mode."""
    out = []
    for spec in specs:
        if spec.family != family:
            continue
        if method is not None and spec.methods and method not in spec.methods:
            continue
        if method is None and spec.asked_only:
            continue
        if spec.adaptive and not adaptive:
            continue
        out.append(spec)
    return out


# ------------------------------------------------------------------------------ trees

@dataclasses.dataclass(frozen=True)
class HostTree:
    """One host package tree (``vllm`` or ``vllm_ascend``) and what we know about it."""

    package: str
    root: pathlib.Path  # the package directory (holds __init__.py)
    distribution: str | None
    version: str | None
    version_source: str | None
    git: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "root": str(self.root),
            "distribution": self.distribution,
            "version": self.version,
            "version_source": self.version_source,
            "git": self.git,
        }


def package_dir(given: str, package: str, flag: str) -> pathlib.Path:
    """Accept the package directory itself or a project/site-packages dir holding it."""
    path = pathlib.Path(os.path.expanduser(given))  # "~nobody/x" stays as written
    if not path.is_dir():
        raise UsageError(f"{flag} {given}: no such directory")
    path = path.resolve()
    if path.name == package and (path / "__init__.py").is_file():
        return path
    if (path / package / "__init__.py").is_file():
        return path / package
    raise UsageError(f"{flag} {given}: neither {package}/__init__.py nor __init__.py of a "
                     f"'{package}' package directory is there")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_distribution(pkg_dir: pathlib.Path) -> tuple[str, str, str] | None:
    """(name, version, metadata path) of the installed distribution that owns pkg_dir."""
    wanted = f"{pkg_dir.name}/__init__.py"
    for dist in importlib.metadata.distributions(path=[str(pkg_dir.parent)]):
        files = dist.files or []
        top = (dist.read_text("top_level.txt") or "").split()
        if any(str(f) == wanted for f in files) or pkg_dir.name in top:
            meta_path = getattr(dist, "_path", None)
            return (_normalize(dist.metadata["Name"]), dist.version,
                    str(meta_path) if meta_path else str(pkg_dir.parent))
    return None


def _version_file(pkg_dir: pathlib.Path) -> str | None:
    """``__version__``/``version`` string assigned in ``<pkg>/_version.py`` (AST, no import)."""
    path = pkg_dir / "_version.py"
    if not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_bytes())
    except SyntaxError:
        return None
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else (
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        value = getattr(stmt, "value", None)
        if names & {"__version__", "version"} and isinstance(value, ast.Constant) \
                and isinstance(value.value, str):
            return value.value
    return None


def describe_tree(package: str, pkg_dir: pathlib.Path) -> HostTree:
    """Distribution name and version (sdist PKG-INFO, installed metadata, pyproject, or
    ``_version.py``) and the git state when the tree is a git checkout."""
    project = pkg_dir.parent
    name = version = source = None
    pkg_info = project / "PKG-INFO"
    if pkg_info.is_file():
        msg = email.parser.Parser().parsestr(pkg_info.read_text(errors="replace"))
        name, version, source = _normalize(msg["Name"] or package), msg["Version"], str(pkg_info)
    if version is None:
        installed = _installed_distribution(pkg_dir)
        if installed:
            name, version, source = installed
    pyproject = project / "pyproject.toml"
    if version is None and pyproject.is_file():
        try:
            proj = tomllib.loads(pyproject.read_text()).get("project", {})
        except tomllib.TOMLDecodeError:
            proj = {}
        if isinstance(proj.get("name"), str):
            name = _normalize(proj["name"])
        if isinstance(proj.get("version"), str):
            version, source = proj["version"], str(pyproject)
    if version is None:
        version = _version_file(pkg_dir)
        if version is not None:
            source = str(pkg_dir / "_version.py")
    return HostTree(package, pkg_dir, name, version, source, git_state(pkg_dir))


def git_state(pkg_dir: pathlib.Path) -> dict[str, Any] | None:
    """Revision and dirty flag when ``pkg_dir`` is tracked in a git checkout, else None.

    A package merely lying inside some repository (a venv under a project) does not count:
    its ``__init__.py`` must be a tracked file."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(pkg_dir), *args], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    if git("ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    top = git("rev-parse", "--show-toplevel")
    rev = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    if top is None or rev is None or status is None:
        return None
    return {"toplevel": top, "revision": rev, "dirty": bool(status)}


def detect_family(vllm: HostTree, ascend: HostTree | None) -> str:
    """vllm-ascend when an Ascend tree is given/installed; vllm-hust for the ``vllm-hust``
    distribution or a vLLM below 0.24; otherwise upstream vllm."""
    if ascend is not None:
        return FAMILY_ASCEND
    if vllm.distribution == "vllm-hust":
        return FAMILY_HUST
    if vllm.version is not None:
        try:
            if Version(vllm.version) < FIRST_VLLM_FAMILY_VERSION:
                return FAMILY_HUST
        except InvalidVersion:
            pass
    return FAMILY_VLLM


# ------------------------------------------------------------------------------ report

@dataclasses.dataclass(frozen=True)
class Check:
    spec: PatchSpec
    result: ProbeResult

    def as_json(self) -> dict[str, Any]:
        sym = self.result.symbol
        return {
            "patch": self.spec.name,
            "applies": self.spec.applies,
            "process": self.spec.process,
            "adaptive": self.spec.adaptive,
            "methods": list(self.spec.methods),
            "symbol": str(sym),
            "params": list(sym.params),
            "status": self.result.status,
            "file": self.result.file,
            "line": self.result.line,
            "detail": self.result.detail,
        }


def run_checks(specs: Sequence[PatchSpec], probe: SourceProbe) -> list[Check]:
    cache: dict[Any, ProbeResult] = {}
    checks = []
    for spec in specs:
        for sym in spec.all_symbols:
            if sym not in cache:
                cache[sym] = probe.probe(sym)
            checks.append(Check(spec, cache[sym]))
    return checks


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    method = None
    if args.method is not None:
        try:
            method = canonical_method(args.method, source="--method")
        except SettingsError as exc:
            raise UsageError(str(exc)) from exc
    if args.vllm_root is not None:
        vllm_dir = package_dir(args.vllm_root, "vllm", "--vllm-root")
    else:
        found = find_installed("vllm")
        if found is None:
            raise UsageError("no installed vllm package found on sys.path; pass --vllm-root DIR")
        vllm_dir = found
    if args.ascend_root is not None:
        ascend_dir: pathlib.Path | None = package_dir(args.ascend_root, "vllm_ascend",
                                                      "--ascend-root")
    else:
        ascend_dir = find_installed("vllm_ascend")
    vllm = describe_tree("vllm", vllm_dir)
    ascend = describe_tree("vllm_ascend", ascend_dir) if ascend_dir else None
    family = detect_family(vllm, ascend)
    roots = {"vllm": vllm_dir}
    if ascend_dir:
        roots["vllm_ascend"] = ascend_dir
    specs = select_specs(load_specs(), family, method, args.adaptive)
    asked_only = sorted({m for s in load_specs() if s.family == family and s.asked_only
                         and (args.adaptive or not s.adaptive) for m in s.methods})
    checks = run_checks(specs, SourceProbe(roots))
    missing = sorted({c.as_json()["symbol"] for c in checks if not c.result.ok})
    pairing = None
    if ascend_dir is not None:  # does vllm_ascend import at all over this vllm tree?
        pairing = pairing_mod.check(ascend_dir, vllm_dir)
        pairing["versions"] = {"vllm_ascend": ascend.version, "vllm": vllm.version}
    from vllm_hust_vspec.patches import catalog

    v2 = (vllm_dir / "v1" / "worker" / "gpu" / "model_runner.py").is_file()
    registry_py = vllm_dir / "model_executor" / "models" / "registry.py"
    own = (registration.host_has_own(registry_py.read_text(encoding="utf-8"))
           if registry_py.is_file() else ())
    return {
        "schema": JSON_SCHEMA,
        "plugin_version": __version__,
        "family": family,
        "method": method,
        "adaptive": args.adaptive,
        "hosts": [t.as_json() for t in (vllm, ascend) if t is not None],
        "patches": [s.name for s in specs],
        "checks": [c.as_json() for c in checks],
        "missing": missing,
        "unchecked_methods": asked_only if method is None else [],
        "pairing": pairing,
        "v2_runner": {"present": v2, "v1_only_patches": list(catalog.v1_only(family)) if v2 else []},
        "models": {"qwen2_eagle": {"host_has": list(own),
                                   "plugin_registers": [a for a in
                                                        registration.QWEN2_EAGLE_ARCHITECTURES
                                                        if a not in own]}},
        "ok": not missing and (pairing is None or pairing["ok"]),
    }


def render_text(report: dict[str, Any]) -> str:
    lines = [f"vllm-hust-vspec-doctor {report['plugin_version']}: family={report['family']} "
             f"method={report['method'] or 'all'} adaptive={'yes' if report['adaptive'] else 'no'}"]
    for host in report["hosts"]:
        git = host["git"]
        gtxt = (f" git={git['revision'][:12]}{' (dirty)' if git['dirty'] else ''}"
                if git else "")
        lines.append(f"host {host['package']}: {host['distribution'] or '?'} "
                     f"{host['version'] or '?'} at {host['root']}{gtxt}")
    current = None
    for check in report["checks"]:
        if check["patch"] != current:
            current = check["patch"]
            lines.append(f"[{current}]{'' if check['applies'] else ' (requirement only)'}")
        where = check["file"] or "-"
        if check["line"]:
            where += f":{check['line']}"
        detail = f"  ({check['detail']})" if check["detail"] else ""
        lines.append(f"  {check['status']:<7} {check['symbol']}  {where}{detail}")
    n = len(report["checks"])
    if not report["patches"]:
        lines.append("no patch declarations apply to this family/method/mode: nothing to check")
    pairing = report["pairing"]
    if pairing is not None:
        v = pairing["versions"]
        head = (f"pairing: vllm_ascend {v['vllm_ascend'] or '?'} over vllm {v['vllm'] or '?'}: "
                f"{pairing['imports_checked']} imports of {pairing['modules']} modules")
        if pairing["ok"]:
            lines.append(f"{head}, all resolve")
        else:
            lines.append(f"{head}, {pairing['unresolved_count']} do not resolve: vllm_ascend "
                         "cannot import over this vllm tree (it follows one vLLM release); first:")
            for u in pairing["unresolved"][:10]:
                lines.append(f"  UNRESOLVED {pairing_mod.Unresolved(**u)}")
    if report["v2_runner"]["present"] and report["family"] == FAMILY_HUST:
        lines.append("V2 model runner present (opt-in on vLLM-HUST 0.17: VLLM_USE_V2_MODEL_RUNNER"
                     "); V1-only: " + ", ".join(report["v2_runner"]["v1_only_patches"])
                     + " (with V2 the plugin is not covered: run the V1 runner)")
    elif report["v2_runner"]["present"]:
        lines.append("V2 model runner present (vLLM's default on CUDA): per-step K through the "
                     "scheduler, decode graphs for every K (the plugin's batch-size table); "
                     "the draft model drafts Kmax there; V1-only (nothing on V2): "
                     + ", ".join(report["v2_runner"]["v1_only_patches"])
                     + " (draft confidences: the budget policy uses its uniform rule)")
    q = report["models"]["qwen2_eagle"]
    lines.append("models: Qwen2 EAGLE-1 heads: "
                 + (f"the host has its own ({', '.join(q['host_has'])}); " if q["host_has"]
                    else "the host has none; ")
                 + (f"the plugin registers {', '.join(q['plugin_registers'])}"
                    if q["plugin_registers"] else "the plugin registers nothing"))
    if report["unchecked_methods"]:
        lines.append("not checked without --method (this host may not offer them): "
                     + ", ".join(report["unchecked_methods"]))
    if report["missing"]:
        lines.append(f"MISSING {len(report['missing'])} symbol(s): "
                     + ", ".join(report["missing"]))
    elif pairing is not None and not pairing["ok"]:
        lines.append(f"FAILED: all {n} symbol check(s) passed, but vllm_ascend does not import "
                     "over this vllm tree")
    else:
        lines.append(f"OK: all {n} check(s) passed")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-hust-vspec-doctor",
        description="Check statically (no import) that the host's vLLM / vLLM-Ascend source "
                    "has every symbol the vllm-hust-vspec patches declare.")
    p.add_argument("--method", help="speculative method (aliases accepted); default: all")
    p.add_argument("--adaptive", action="store_true",
                   help="also check the adaptive controller's patches")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--vllm-root", metavar="DIR",
                   help="vllm package dir or its parent (default: the installed vllm)")
    p.add_argument("--ascend-root", metavar="DIR",
                   help="vllm_ascend package dir or its parent (default: the installed one)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)  # argparse exits 2 on bad flags
    try:
        report = build_report(args)
    except UsageError as exc:
        print(f"vllm-hust-vspec-doctor: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
