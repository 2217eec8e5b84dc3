"""Audit the release artefacts in ``dist/`` (used by ``release.sh check``).

Checks, each failure one line naming the artefact and member:

* ``dist/`` holds exactly this version's wheel and sdist, nothing else;
* wheel: the one manifest (validated, ``extension_version`` = version), ``entry_points.txt``
  with the bundle entry point, the ``vllm.general_plugins`` entry point and the console
  scripts, ``METADATA`` name/version, and every ``RECORD`` line's sha256 and size;
* sdist: ``PKG-INFO`` version, the manifest, ``MOD_METADATA.json``, ``manage.sh``,
  ``install.sh``, ``uninstall.sh``, ``run.sh``, ``release.sh``, ``configs/`` (at least one
  TOML) and ``profiles/`` (at least a README);
* prints the SHA256 list of both artefacts (``sha256  filename``).

Usage: ``python -m vllm_hust_vspec.tools.release_audit DIST_DIR --version V``.  Exit 0 ok,
1 any problem.  Imports nothing of the runtime.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import email.parser
import hashlib
import json
import pathlib
import sys
import tarfile
import zipfile

from vllm_hust_vspec.tools.manifest_check import (
    BUNDLE_GROUP,
    MANIFEST_NAMES,
    PACKAGE,
    declared_entry_points,
    validate_document,
)

MANIFEST_MEMBER = f"{PACKAGE}/manifests/vllm-hust-extension-v0.3.json"
EXTENSION_ID = "org.vllm-hust.vspec"
REQUIRED_SCRIPTS = ("vllm-hust-vspec-doctor",)
SDIST_FILES = ("PKG-INFO", "MOD_METADATA.json", "manage.sh", "install.sh", "uninstall.sh",
               "run.sh", "release.sh", f"src/{MANIFEST_MEMBER}")


def artefact_names(version: str) -> tuple[str, str]:
    stem = f"{PACKAGE}-{version}"
    return f"{stem}-py3-none-any.whl", f"{stem}.tar.gz"


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest_checks(where: str, raw: bytes, version: str) -> list[str]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"{where}: not UTF-8 JSON: {exc}"]
    errors = validate_document(doc, where)
    if doc.get("extension_version") != version:
        errors.append(f"{where}: extension_version {doc.get('extension_version')!r} != "
                      f"{version!r}")
    return errors


def audit_wheel(path: pathlib.Path, version: str) -> list[str]:
    with zipfile.ZipFile(path) as whl:
        names = set(whl.namelist())
        info = f"{PACKAGE}-{version}.dist-info"
        errors, doc = _wheel_manifest(whl, names, path.name, version)
        errors += _wheel_entry_points(whl, names, path.name, info, doc)
        errors += _wheel_metadata(whl, names, path.name, info, version)
        errors += _wheel_record(whl, names, path.name, info)
    return errors


def _wheel_manifest(whl: zipfile.ZipFile, names: set[str], label: str,
                    version: str) -> tuple[list[str], dict]:
    """The wheel's one manifest checked, and its document ({} when it has problems)."""
    manifests = [n for n in names if n.startswith(f"{PACKAGE}/manifests/")
                 and n.rsplit("/", 1)[-1] in MANIFEST_NAMES]
    if manifests != [MANIFEST_MEMBER]:
        return [f"{label}: expected exactly {MANIFEST_MEMBER}, found {manifests}"], {}
    raw = whl.read(MANIFEST_MEMBER)
    errors = _manifest_checks(f"{label}:{MANIFEST_MEMBER}", raw, version)
    return errors, json.loads(raw) if not errors else {}


def _wheel_entry_points(whl: zipfile.ZipFile, names: set[str], label: str, info: str,
                        doc: dict) -> list[str]:
    """entry_points.txt: the bundle entry point, the manifest's entry points, the scripts."""
    if f"{info}/entry_points.txt" not in names:
        return [f"{label}: no {info}/entry_points.txt"]
    errors = []
    cfg = configparser.ConfigParser(delimiters=("=",))
    cfg.optionxform = str  # type: ignore[assignment, method-assign]
    cfg.read_string(whl.read(f"{info}/entry_points.txt").decode())
    bundle = dict(cfg[BUNDLE_GROUP]) if cfg.has_section(BUNDLE_GROUP) else {}
    if bundle != {EXTENSION_ID: f"{PACKAGE}.manifests"}:
        errors.append(f"{label}: entry_points.txt [{BUNDLE_GROUP}] is {bundle}, "
                      f"expected {{{EXTENSION_ID!r}: '{PACKAGE}.manifests'}}")
    for group, name in declared_entry_points(doc):
        if not (cfg.has_section(group) and name in cfg[group]):
            errors.append(f"{label}: entry_points.txt lacks {group}:{name} "
                          "(declared by the manifest)")
    scripts = cfg["console_scripts"] if cfg.has_section("console_scripts") else {}
    for script in REQUIRED_SCRIPTS:
        if script not in scripts:
            errors.append(f"{label}: console script {script} missing")
    return errors


def _wheel_metadata(whl: zipfile.ZipFile, names: set[str], label: str, info: str,
                    version: str) -> list[str]:
    if f"{info}/METADATA" not in names:
        return [f"{label}: no {info}/METADATA"]
    meta = email.parser.Parser().parsestr(whl.read(f"{info}/METADATA").decode())
    if meta["Name"] != "vllm-hust-vspec" or meta["Version"] != version:
        return [f"{label}: METADATA says {meta['Name']} {meta['Version']}"]
    return []


def _wheel_record(whl: zipfile.ZipFile, names: set[str], label: str, info: str) -> list[str]:
    """Every RECORD line's sha256 and size, and no member left out of RECORD."""
    record_name = f"{info}/RECORD"
    if record_name not in names:
        return [f"{label}: no {record_name}"]
    errors = []
    listed = set()
    for line in whl.read(record_name).decode().splitlines():
        if not line.strip():
            continue
        member, digest, size = line.rsplit(",", 2)
        listed.add(member)
        if member == record_name:
            continue
        if member not in names:
            errors.append(f"{label}: RECORD lists missing {member}")
            continue
        data = whl.read(member)
        want = "sha256=" + base64.urlsafe_b64encode(
            hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if digest != want or size != str(len(data)):
            errors.append(f"{label}: RECORD hash/size mismatch for {member}")
    unlisted = sorted(n for n in names - listed if not n.endswith("/"))
    if unlisted:
        errors.append(f"{label}: files not in RECORD: {unlisted}")
    return errors


def audit_sdist(path: pathlib.Path, version: str) -> list[str]:
    errors: list[str] = []
    base = f"{PACKAGE}-{version}/"
    with tarfile.open(path, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        for rel in SDIST_FILES:
            if base + rel not in members:
                errors.append(f"{path.name}: {base}{rel} missing")
        for folder, what in (("configs/", ".toml"), ("profiles/", "")):
            files = [n for n, m in members.items()
                     if n.startswith(base + folder) and m.isfile() and n.endswith(what)]
            if not files:
                errors.append(f"{path.name}: {base}{folder} has no files"
                              + (f" ending {what}" if what else ""))
        if base + "PKG-INFO" in members:
            fh = tar.extractfile(members[base + "PKG-INFO"])
            meta = email.parser.Parser().parsestr(fh.read().decode() if fh else "")
            if meta["Version"] != version:
                errors.append(f"{path.name}: PKG-INFO version {meta['Version']!r} != {version!r}")
        member = base + "src/" + MANIFEST_MEMBER
        if member in members:
            fh = tar.extractfile(members[member])
            errors += _manifest_checks(f"{path.name}:{member}", fh.read() if fh else b"",
                                       version)
    return errors


def audit(dist: pathlib.Path, version: str) -> tuple[list[str], list[str]]:
    """(errors, sha256 lines)."""
    wheel, sdist = artefact_names(version)
    present = sorted(p.name for p in dist.iterdir()) if dist.is_dir() else []
    errors = []
    if present != sorted([wheel, sdist]):
        errors.append(f"{dist}: must hold exactly {wheel} and {sdist}; holds {present}")
    sums = []
    for name, fn in ((wheel, audit_wheel), (sdist, audit_sdist)):
        path = dist / name
        if path.is_file():
            errors += fn(path, version)
            sums.append(f"{sha256(path)}  {name}")
    return errors, sums


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_hust_vspec.tools.release_audit")
    p.add_argument("dist", type=pathlib.Path)
    p.add_argument("--version", required=True)
    args = p.parse_args(argv)
    errors, sums = audit(args.dist, args.version)
    for line in errors:
        print(f"release check: error: {line}", file=sys.stderr)
    if errors:
        return 1
    print("SHA256:")
    for line in sums:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
