"""The package's import direction (an AST read of every module under src/vllm_hust_vspec).

Layers, lowest first; a module may import from a lower layer and from its own package, and
nothing else (imports inside functions count the same as module-level ones):

    leaves       _version, names, errors, patchspec, progress, capture, manifests, fileio,
                 retired
    checks       the field checks every loader uses (raise errors.VspecError); vocab_ids
    schema       settings
    core         adaptive (the controller, pure Python), host (detection, static probe), methods,
                 models (out-of-tree models for vLLM's registry)
    runtime      the engine glue the patches call into
    startup_cost the start-up calibration: the cost table (drives the runtime)
    patches      one module per host patch; each wrapper makes one call into the layers below
    plugin       the composition root: the only module that imports patches and runtime both
    launcher     the ``vllm-hust-vspec`` launcher
    tools        doctor, benchmarks, profile, simulator CLIs; the package root and __main__

No two packages of one layer import each other, and no modules form an import cycle.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

PACKAGE = "vllm_hust_vspec"
SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / PACKAGE

LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "names", "errors", "patchspec", "progress", "capture", "manifests", "fileio",
     "retired"),
    ("checks", "vocab_ids"),
    ("settings",),
    ("adaptive", "host", "methods", "models"),
    ("runtime",),
    ("startup_cost",),
    ("patches",),
    ("plugin",),
    ("launcher",),
    ("tools", "__main__", "__init__"),
)
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py under ``root`` (package ``root.name``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: pathlib.Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every import of a module of the package in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # ``from pkg import submodule`` imports the submodule
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found += [(node.lineno, t) for t in dict.fromkeys(targets)
                  if t == PACKAGE or t.startswith(PACKAGE + ".")]
    return found


def part_of(module: str) -> str:
    """The top-level part a module belongs to (``__init__`` for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def violations(root: pathlib.Path) -> list[str]:
    """Every import against the layering, and every import cycle, under ``root``."""
    mods = modules(root)
    known = set(mods)
    bad = []
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        src = part_of(name)
        if src not in RANK:
            bad.append(f"{name}: part {src!r} is in no layer of {__name__}.LAYERS")
            continue
        for line, target in imports(name, path, known):
            graph[name].add(target)
            dst = part_of(target)
            if dst == src:
                continue
            if dst not in RANK:
                bad.append(f"{path}:{line}: {name} imports {target}, which is in no layer")
            elif RANK[dst] >= RANK[src]:
                way = "up" if RANK[dst] > RANK[src] else "sideways"
                bad.append(f"{path}:{line}: {name} imports {target} ({way}: {src} is in layer "
                           f"{RANK[src]}, {dst} in layer {RANK[dst]})")
    bad += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_imports_only_downwards_and_has_no_cycle():
    assert violations(SRC) == []


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / PACKAGE
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_upward_import_fails(tmp_path):
    """The check on a small tree: an import from the core up into the runtime (inside a
    function, as the lazy imports were) is reported with its file and line."""
    root = _tree(tmp_path, {
        "__init__.py": "",
        "settings.py": "",
        "adaptive/__init__.py": "",
        "adaptive/controller.py": "def f():\n    from vllm_hust_vspec.runtime import engine\n",
        "runtime/__init__.py": "",
        "runtime/engine.py": "from vllm_hust_vspec.adaptive import controller\n",
    })
    found = violations(root)
    assert any("adaptive/controller.py:2" in v and "(up: adaptive is in layer 3, runtime in "
               "layer 4)" in v for v in found), found
    assert any(v.startswith("import cycle:") for v in found), found


def test_a_sideways_import_and_a_relative_import_fail(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "host/__init__.py": "",
        "host/detect.py": "from ..adaptive import controller\n",
        "adaptive/__init__.py": "",
        "adaptive/controller.py": "",
    })
    assert violations(root) == [
        f"{root / 'host/detect.py'}:1: vllm_hust_vspec.host.detect imports "
        "vllm_hust_vspec.adaptive.controller (sideways: host is in layer 3, adaptive in layer 3)"]
