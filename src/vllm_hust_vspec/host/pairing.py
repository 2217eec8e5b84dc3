"""Static pairing check: does a plugin package (``vllm_ascend``) import against a vLLM tree?

vLLM-Ascend releases follow one vLLM release each; paired with another tree (vLLM-HUST 0.17
under vllm-ascend 0.23, say) its modules fail at import with ``ImportError: cannot import
name ...``, before any of our patches could matter.  The symbol checks of the doctor cannot
see that: they ask only for the names our patches touch.

The check reads source only (:mod:`ast`, no import).  It walks the import closure of the
package from its top module: every module-level ``import`` / ``from ... import`` of the
package's own modules, and every string constant that names one of its modules (vLLM loads
the platform, worker and runner classes from such strings: ``"vllm_ascend.platform.NPUPlatform"``)
is followed.  In each module of that closure, every unconditional module-level import from
the host package (not under ``if``/``try``, so version-guarded and ``TYPE_CHECKING`` imports do
not count) must resolve in the host tree: the module file exists, and each imported name is
a submodule, a definition (:class:`~vllm_hust_vspec.host.probe.SourceProbe` follows names
imported from the host's own modules), a name the module imports from elsewhere (the
standard library, torch), a name of a ``from m import *`` it holds, or the module has a
module-level ``__getattr__`` (lazy names, accepted unseen).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import pathlib
import re

from vllm_hust_vspec.fileio import write_atomic
from vllm_hust_vspec.host.probe import SourceProbe, _imported_name, import_source
from vllm_hust_vspec.patchspec import Symbol


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """One import of the package that the host tree cannot satisfy."""

    module: str  # the package's module holding the import
    line: int
    source: str  # the host module imported from
    name: str | None  # the name imported (None: ``import host.module`` itself)
    detail: str

    def as_json(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        what = f"{self.source}.{self.name}" if self.name else self.source
        return f"{self.module}:{self.line}: {what} ({self.detail})"


@dataclasses.dataclass(frozen=True)
class PairingResult:
    package: str
    host: str
    modules: int  # modules of the package's closure that were read
    imports: int  # unconditional imports from the host checked
    unresolved: tuple[Unresolved, ...]

    @property
    def ok(self) -> bool:
        return not self.unresolved

    def as_json(self, limit: int = 50) -> dict:
        return {"package": self.package, "host": self.host, "ok": self.ok,
                "modules": self.modules, "imports_checked": self.imports,
                "unresolved_count": len(self.unresolved),
                "unresolved": [u.as_json() for u in self.unresolved[:limit]]}


class PairingCheck:
    """The closure of ``package`` (a package dir) checked against ``host`` (a package dir)."""

    def __init__(self, package: pathlib.Path, host: pathlib.Path) -> None:
        self.pkg_name, self.host_name = package.name, host.name
        self.probe = SourceProbe({package.name: package, host.name: host})
        self._module_ref = re.compile(rf"^{re.escape(self.pkg_name)}(\.[A-Za-z_]\w*)+$")
        self._resolved: dict[tuple[str, str], str | None] = {}

    def run(self) -> PairingResult:
        todo, seen = [self.pkg_name], {self.pkg_name}
        unresolved: list[Unresolved] = []
        checked = 0
        while todo:
            module = todo.pop()
            path = self.probe.module_file(module)
            tree = self.probe._parse(path) if path is not None else None
            if tree is None:
                continue
            for stmt in tree.body:  # unconditional module-level imports only
                for src, names in _imports(stmt, module, path):
                    top = src.split(".")[0]
                    if top == self.host_name:
                        for name in names:
                            checked += 1
                            why = self._why_unresolved(src, name)
                            if why is not None:
                                unresolved.append(Unresolved(module, stmt.lineno, src, name, why))
            for ref in self._references(tree, module, path):
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)
        unresolved.sort(key=lambda u: (u.module, u.line))
        return PairingResult(self.pkg_name, self.host_name, len(seen), checked, tuple(unresolved))

    def _references(self, tree: ast.Module, module: str, path: pathlib.Path) -> set[str]:
        """Modules of the package this one leads to: its imports (anywhere in the file, as
        they run when called) and the strings that name a module or a module's attribute."""
        out: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for src, names in _imports(node, module, path):
                    if src.split(".")[0] == self.pkg_name:
                        out.add(src)
                        out.update(f"{src}.{n}" for n in names if n and n != "*")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and self._module_ref.match(node.value):
                out.add(node.value)
                out.add(node.value.rpartition(".")[0])
        return {m for m in out if self.probe.module_file(m) is not None}

    def _why_unresolved(self, source: str, name: str | None, depth: int = 0) -> str | None:
        """Why ``from source import name`` fails in the host tree, or None where it resolves."""
        key = (source, name or "")
        if key not in self._resolved:
            self._resolved[key] = self._why(source, name, depth)
        return self._resolved[key]

    def _why(self, source: str, name: str | None, depth: int) -> str | None:
        path = self.probe.module_file(source)
        if path is None:
            return f"no module {source} in the host tree"
        if name is None or self.probe.module_file(f"{source}.{name}") is not None \
                or self.probe.probe(Symbol(source, name)).ok:
            return None
        tree = self.probe._parse(path)
        if tree is not None:
            if _imported_name(tree, source, path, name) is not None:
                return None  # bound there by an import (from the standard library, torch, ...)
            if any(isinstance(s, ast.FunctionDef) and s.name == "__getattr__" for s in tree.body):
                return None  # lazy names: accepted unseen
            stars = [src for stmt in tree.body for src, names in _imports(stmt, source, path)
                     if names == ["*"] and src.split(".")[0] == self.host_name]
            if depth < 8 and any(self._why_unresolved(src, name, depth + 1) is None
                                 for src in stars):
                return None
        return f"{name} not defined in {source}"


def _imports(stmt: ast.AST, module: str, path: pathlib.Path) -> list[tuple[str, list]]:
    """``[(source module, [names])]`` of an import statement (``[None]`` for a plain
    ``import a.b``); other statements give nothing."""
    if isinstance(stmt, ast.Import):
        return [(alias.name, [None]) for alias in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return [(import_source(stmt, module, path), [alias.name for alias in stmt.names])]
    return []


def _fingerprint(root: pathlib.Path) -> list:
    """What the check reads of a tree: every ``.py`` file's relative path, size and mtime."""
    out = []
    for path in sorted(root.rglob("*.py")):
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((str(path.relative_to(root)), st.st_size, st.st_mtime_ns))
    return out


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return pathlib.Path(base) / "vllm-hust-vspec" / "pairing"


def check(package: pathlib.Path, host: pathlib.Path, cache: pathlib.Path | None = None) -> dict:
    """:meth:`PairingCheck.run` as JSON, kept in ``cache`` (default :func:`cache_dir`) under a
    key of both trees' fingerprints and this module's source: reading two trees takes ~10 s,
    and a cached answer is reused only while no ``.py`` file of either tree changed."""
    cache = cache_dir() if cache is None else cache
    key = hashlib.sha256(json.dumps([
        str(package.resolve()), _fingerprint(package), str(host.resolve()), _fingerprint(host),
        pathlib.Path(__file__).read_text(encoding="utf-8"),
    ]).encode()).hexdigest()[:32]
    path = cache / f"{key}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    result = PairingCheck(package, host).run().as_json()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(result))
    except OSError:
        pass  # an unwritable cache only costs the next run its ~10 s
    return result
