"""Static probe of a host's source tree: does a declared :class:`Symbol` exist there?

The probe reads Python source with :mod:`ast`; it never imports the host (no ``vllm``,
``vllm_ascend``, ``torch`` or ``torch_npu``), so it works on a machine without the
accelerator, on an unpacked sdist and on a git checkout alike.

A symbol is ``module`` + ``qualname`` (see :mod:`vllm_hust_vspec.patchspec`).  Resolution:

* ``module`` maps to ``<root>/<a>/<b>.py`` or ``<root>/<a>/<b>/__init__.py``, where ``root``
  is the package directory of the symbol's tree (``vllm`` or ``vllm_ascend``);
* the first qualname part is a top-level class, function or assignment of that module
  (definitions under top-level ``if``/``try``/``with`` count), or a name imported into it from
  a module of a probed tree (followed);
* later parts are looked up in the class body (methods, class attributes, dataclass fields),
  then among attributes assigned as ``self.<name>`` in any method body, then in the class's
  bases (followed through imports when the base lives in a probed tree);
* ``params`` must all be parameter names of the callable found.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
from collections.abc import Iterator, Mapping

from vllm_hust_vspec.patchspec import Symbol

OK = "OK"
MISSING = "MISSING"

_Scope = ast.Module | ast.ClassDef
_Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """Outcome for one symbol.

    status: ``OK`` or ``MISSING``.
    file:   the source file the symbol was found in, or the file the probe looked in last
            (``None`` only when the symbol's tree was not given).
    line:   1-based line of the definition/assignment when found.
    detail: why it is missing, or how it was found (``inherited from X``).
    """

    symbol: Symbol
    status: str
    file: str | None
    line: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclasses.dataclass(frozen=True)
class _Found:
    node: ast.AST
    file: pathlib.Path
    via: str = ""
    # Every definition of the name in its scope (several under if/else or try/except).
    alternatives: tuple[ast.AST, ...] = ()


class _NotFound(Exception):
    def __init__(self, file: pathlib.Path | None, detail: str) -> None:
        super().__init__(detail)
        self.file = file
        self.detail = detail


class SourceProbe:
    """Probe one or more package trees, e.g. ``{"vllm": Path(".../vllm")}``."""

    def __init__(self, roots: Mapping[str, pathlib.Path]) -> None:
        self.roots = {name: pathlib.Path(path) for name, path in roots.items()}
        self._trees: dict[pathlib.Path, ast.Module | None] = {}

    # ---------------------------------------------------------------- files and modules
    def module_file(self, module: str) -> pathlib.Path | None:
        """The source file of a dotted module inside a probed tree (``None`` if absent)."""
        parts = module.split(".")
        root = self.roots.get(parts[0])
        if root is None:
            return None
        base = root.joinpath(*parts[1:])
        for candidate in (base.with_suffix(".py") if parts[1:] else None, base / "__init__.py"):
            if candidate is not None and candidate.is_file():
                return candidate
        return None

    def _expected_file(self, module: str) -> pathlib.Path | None:
        parts = module.split(".")
        root = self.roots.get(parts[0])
        if root is None:
            return None
        if len(parts) == 1:
            return root / "__init__.py"
        return root.joinpath(*parts[1:]).with_suffix(".py")

    def _parse(self, path: pathlib.Path) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(path.read_bytes(), filename=str(path))
            except (OSError, SyntaxError, ValueError):
                self._trees[path] = None
        return self._trees[path]

    # ---------------------------------------------------------------- public entry
    def probe(self, symbol: Symbol) -> ProbeResult:
        if symbol.module.split(".")[0] not in self.roots:
            return ProbeResult(symbol, MISSING, None, None,
                               f"no source tree given for {symbol.module.split('.')[0]!r}")
        try:
            found = self._resolve(symbol.module, symbol.qualname.split("."), set())
        except _NotFound as exc:
            return ProbeResult(symbol, MISSING, _s(exc.file), None, exc.detail)
        detail = found.via
        if symbol.params:
            # Conditional definitions (if/else on the host version): every one must take the
            # parameters, since the probe cannot tell which branch the host will run.
            defs = found.alternatives or (found.node,)
            for node in defs:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    return ProbeResult(symbol, MISSING, str(found.file), _line(node),
                                       f"{symbol.qualname} is not a function; cannot take "
                                       f"parameters {', '.join(symbol.params)}")
                have = set(_param_names(node.args))
                lacking = [p for p in symbol.params if p not in have]
                if lacking:
                    where = (f" (definition at line {_line(node)} of {len(defs)} conditional "
                             "definitions)" if len(defs) > 1 else "")
                    return ProbeResult(symbol, MISSING, str(found.file), _line(node),
                                       f"parameter(s) missing: {', '.join(lacking)}{where}")
        if len(found.alternatives) > 1:
            lines = ", ".join(str(_line(n)) for n in found.alternatives)
            detail = "; ".join(x for x in (detail, f"conditional definitions at lines {lines}")
                               if x)
        return ProbeResult(symbol, OK, str(found.file), _line(found.node), detail)

    # ---------------------------------------------------------------- resolution
    def _resolve(self, module: str, parts: list[str], seen: set[tuple[str, str]]) -> _Found:
        key = (module, ".".join(parts))
        if key in seen:
            raise _NotFound(self._expected_file(module), f"import cycle at {module}")
        seen = seen | {key}
        path = self.module_file(module)
        if path is None:
            raise _NotFound(self._expected_file(module), f"module file of {module} not found")
        tree = self._parse(path)
        if tree is None:
            raise _NotFound(path, f"{path} cannot be parsed")
        head, rest = parts[0], parts[1:]
        node = _lookup_in_scope(tree, head)
        if node is None:
            target = _imported_name(tree, module, path, head)
            if target is not None:
                tmod, tname = target
                if tmod.split(".")[0] in self.roots and (
                    self.module_file(tmod) is not None or tname is None
                ):
                    if tname is None:  # ``import a.b as head``: a module alias
                        if not rest:
                            return _Found(tree, path, f"module alias of {tmod}")
                        return self._resolve(tmod, rest, seen)
                    found = self._resolve(tmod, [tname, *rest], seen)
                    return dataclasses.replace(found, via=found.via or f"imported from {tmod}")
                # ``from pkg import submodule``
                sub = f"{tmod}.{tname}" if tname else tmod
                if self.module_file(sub) is not None and rest:
                    return self._resolve(sub, rest, seen)
            raise _NotFound(path, f"{head} not defined in {module}")
        if not rest:
            return _Found(node, path, alternatives=_all_in_scope(tree, head))
        if not isinstance(node, ast.ClassDef):
            raise _NotFound(path, f"{module}.{head} is not a class; cannot look up "
                                  f"{'.'.join(rest)}")
        return self._member(module, path, tree, node, rest, seen)

    def _member(self, module: str, path: pathlib.Path, tree: ast.Module, cls: ast.ClassDef,
                parts: list[str], seen: set[tuple[str, str]]) -> _Found:
        name, rest = parts[0], parts[1:]
        node = _lookup_in_scope(cls, name)
        if node is None:
            node = _self_attribute(cls, name)
        if node is not None:
            if not rest:
                return _Found(node, path, alternatives=_all_in_scope(cls, name))
            if isinstance(node, ast.ClassDef):
                return self._member(module, path, tree, node, rest, seen)
            raise _NotFound(path, f"{cls.name}.{name} is not a class")
        # Inherited: follow the bases we can see.
        outside: list[str] = []
        for base in cls.bases:
            ref = _dotted(base)
            if ref is None:
                continue
            target = self._base_target(module, path, tree, ref)
            if target is None:
                outside.append(ref)
                continue
            bmod, bparts = target
            try:
                found = self._resolve(bmod, [*bparts, *parts], seen)
            except _NotFound:
                continue
            via = found.via or f"inherited from {bmod}.{'.'.join(bparts)}"
            return dataclasses.replace(found, via=via)
        detail = f"{name} not defined in {module}.{cls.name}"
        if outside:
            detail += f" (bases outside the probed trees: {', '.join(outside)})"
        raise _NotFound(path, detail)

    def _base_target(self, module: str, path: pathlib.Path, tree: ast.Module,
                     ref: str) -> tuple[str, list[str]] | None:
        """Map a base-class expression to (module, qualname parts) in a probed tree."""
        head, *rest = ref.split(".")
        if _lookup_in_scope(tree, head) is not None:
            return module, [head, *rest]
        target = _imported_name(tree, module, path, head)
        if target is None:
            return None
        tmod, tname = target
        if tmod.split(".")[0] not in self.roots:
            return None
        if tname is None:
            return (tmod, rest) if rest else None
        sub = f"{tmod}.{tname}"
        if rest and self.module_file(sub) is not None:
            return sub, rest
        return tmod, [tname, *rest]


# -------------------------------------------------------------------- AST helpers

def _s(path: pathlib.Path | None) -> str | None:
    return None if path is None else str(path)


def _line(node: ast.AST) -> int | None:
    return getattr(node, "lineno", None)


def _param_names(args: ast.arguments) -> list[str]:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if args.vararg is not None:
        names.append(args.vararg.arg)
    if args.kwarg is not None:
        names.append(args.kwarg.arg)
    return names


def _top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a scope, descending into if/try/with blocks but not into defs."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _top_statements(stmt.body)
            yield from _top_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            yield from _top_statements(stmt.body)
            for handler in stmt.handlers:
                yield from _top_statements(handler.body)
            yield from _top_statements(stmt.orelse)
            yield from _top_statements(stmt.finalbody)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            yield from _top_statements(stmt.body)


def _assigned_names(stmt: ast.stmt) -> list[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        targets = [stmt.target]
    names: list[str] = []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.append(n.id)
    return names


def _lookup_in_scope(scope: _Scope, name: str) -> ast.AST | None:
    """A def/class/assignment named ``name`` directly in a module or class body.

    The last definition wins, as at run time."""
    found: ast.AST | None = None
    for stmt in _top_statements(scope.body):
        if isinstance(stmt, _Def) and stmt.name == name:
            found = stmt
        elif name in _assigned_names(stmt):
            found = stmt
    return found


def _all_in_scope(scope: _Scope, name: str) -> tuple[ast.AST, ...]:
    """Every def/class/assignment named ``name`` directly in the scope, in source order."""
    return tuple(stmt for stmt in _top_statements(scope.body)
                 if (isinstance(stmt, _Def) and stmt.name == name)
                 or name in _assigned_names(stmt))


def _self_attribute(cls: ast.ClassDef, name: str) -> ast.AST | None:
    """The first ``self.<name> = ...`` (or annotated/augmented) in the class's methods."""
    for stmt in cls.body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        selfname = stmt.args.args[0].arg if stmt.args.args else "self"
        for node in ast.walk(stmt):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if (isinstance(sub, ast.Attribute) and sub.attr == name
                            and isinstance(sub.value, ast.Name) and sub.value.id == selfname):
                        return node
    return None


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        inner = _dotted(expr.value)
        return None if inner is None else f"{inner}.{expr.attr}"
    if isinstance(expr, ast.Subscript):  # Generic[T] style bases
        return _dotted(expr.value)
    return None


def _imported_name(tree: ast.Module, module: str, path: pathlib.Path,
                   name: str) -> tuple[str, str | None] | None:
    """Where a module-level name comes from: ``(module, attribute)`` for ``from m import
    a as name``, ``(module, None)`` for ``import m as name``."""
    result: tuple[str, str | None] | None = None
    for stmt in _top_statements(tree.body):
        if isinstance(stmt, ast.ImportFrom):
            src = import_source(stmt, module, path)
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    result = (src, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == name:
                    result = (alias.name, None)
                elif alias.asname is None and alias.name.split(".")[0] == name:
                    result = (name, None)
    return result


def import_source(stmt: ast.ImportFrom, module: str, path: pathlib.Path) -> str:
    """The absolute module a ``from ... import`` in ``module`` (file ``path``) reads from."""
    if not stmt.level:
        return stmt.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")
    if stmt.level > 1:
        base = base[: len(base) - (stmt.level - 1)]
    return ".".join(base + ([stmt.module] if stmt.module else []))
