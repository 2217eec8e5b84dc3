"""Hypothesis strategies for every loader of a user-supplied file or text, and the launcher's
argv: ONE module shared by ``tests/unit/test_fuzz_loaders.py`` (a few hundred cases per
loader) and ``scripts/fuzz_loaders.py`` (the long run).

Each :class:`Loader` couples a strategy of cases (valid-shaped documents with mutated keys,
values and types, which is what finds bugs, plus damaged and raw junk bytes) with the call
that loads one case, the strings its error must name (the file, the spec, the source) and a
check of what it returns.  :func:`classify` runs one case: a returned object that passes the
check is ``valid``; a :class:`~vllm_hust_vspec.errors.VspecError` (or the launcher's argparse
line) naming the file / key is ``error``; anything else is ``traceback`` (or ``unnamed`` /
``invalid`` / ``multiline``), which the test fails on and the script counts.

Nothing here starts an engine or a server: the launcher runs as
:func:`vllm_hust_vspec.launcher.cli.prepare` (resolve + build the plan, what ``--dry-run``
prints), never :func:`~vllm_hust_vspec.launcher.cli.main`'s exec.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import io
import json
import math
import os
import pathlib
import re
import shutil
import tempfile
import traceback
import tomllib
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

from vllm_hust_vspec import settings
from vllm_hust_vspec.errors import VspecError

REPO = pathlib.Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- values

# Strings that parsers mistake for numbers, keys and paths.
TRICKY_STRINGS = (
    "", " ", "0", "1", "-1", "4", "1.5", "1e400", "nan", "inf", "-inf", "Infinity", "NaN",
    "²", "٣", "1²", "１", "1_000", "0x10", "+3", " 7 ", "true", "false", "yes", "null",
    "\n", "a\nb", "\t", "\x00", "\x7f", "é", "…", "\u2028", "..", "../x", "~", "~nobody/x",
    "/", "/dev/null", "~no-such-user/x", "1-4:4", "1-4:4,5-8:2", "fixed:2", "fixed:²", "online", "budget",
    "draft", "none", "mtp", "eagle", "arc-easy", "HUST_VSPEC_X", "a,b", ",", ":", "-", "--",
)
HUGE_INTS = (2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400, -(10**400))
SPECIAL_FLOATS = (0.0, -0.0, 0.5, 1.0, 1e-300, 5e-324, 1e300, 1.7976931348623157e308,
                  float("nan"), float("inf"), float("-inf"))

ints = st.one_of(st.integers(-3, 70), st.integers(-(2**40), 2**40), st.sampled_from(HUGE_INTS))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(SPECIAL_FLOATS),
                   st.floats(-2.0, 100.0))
texts = st.one_of(st.sampled_from(TRICKY_STRINGS), st.text(max_size=12))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)


def json_values(keys: Sequence[str] = ()) -> st.SearchStrategy[Any]:
    """Any JSON value (NaN/Infinity and integers past 64 bits included)."""
    key = st.sampled_from(tuple(keys) + TRICKY_STRINGS[:20]) if keys else texts
    return st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                st.dictionaries(st.one_of(key, texts), inner, max_size=4)),
        max_leaves=10,
    )


TOML_DATES = (datetime.datetime(1979, 5, 27, 7, 32), datetime.date(1979, 5, 27),
              datetime.time(7, 32), datetime.datetime(1979, 5, 27, tzinfo=datetime.timezone.utc))


def toml_values(keys: Sequence[str] = ()) -> st.SearchStrategy[Any]:
    """Any TOML value (dates and times included; no null, TOML has none)."""
    key = st.sampled_from(tuple(keys) + TRICKY_STRINGS[:20]) if keys else texts
    leaf = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), floats, texts,
                     st.sampled_from(TOML_DATES))
    return st.recursive(
        leaf,
        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                st.dictionaries(st.one_of(key, texts), inner, max_size=3)),
        max_leaves=8,
    )


# --------------------------------------------------------------------------- mutations


def _slots(node: Any, out: list[tuple[Any, Any]]) -> None:
    """Every (container, key-or-index) under ``node``."""
    if isinstance(node, dict):
        for k in list(node):
            out.append((node, k))
            _slots(node[k], out)
    elif isinstance(node, list):
        for i in range(len(node)):
            out.append((node, i))
            _slots(node[i], out)


def _containers(node: Any, out: list[Any]) -> None:
    if isinstance(node, (dict, list)):
        out.append(node)
        for child in (node.values() if isinstance(node, dict) else node):
            _containers(child, out)


def _type_switch(value: Any) -> list[Any]:
    """Same-looking values of other types and edge values of the same type."""
    out: list[Any] = [None, [value], {"v": value}, str(value), True, False, 0, -1, ""]
    if isinstance(value, bool):
        out += [int(value), str(value).lower()]
    elif isinstance(value, int):
        out += [value + 1, value - 1, -value, str(value), 10**400, 2**63, float("nan"),
                float("inf")]
        if abs(value) < 2**1000:
            out += [float(value), value + 0.5]
    elif isinstance(value, float):
        out += [int(value) if math.isfinite(value) else 0, -value, value * 1e300,
                float("nan"), float("inf"), -1e-9, 10**400, -(10**400)]
    elif isinstance(value, str):
        out += [value + "x", value.upper(), value[:-1], value + "\n", "²", value * 3]
    elif isinstance(value, list):
        out += [value[:-1], value + value, list(reversed(value)), [], value[:1] * 3]
    elif isinstance(value, dict):
        out += [{}, list(value.values()), list(value)]
    return out


@st.composite
def mutated(draw: st.DrawFn, base: Any, keys: Sequence[str] = (), *, toml: bool = False,
            max_mutations: int = 4) -> Any:
    """``base`` (a parsed document) with 0..max_mutations edits: a value replaced by a random
    one or a type-switched one, a key dropped, renamed or added, a list element dropped or
    duplicated, now and then the root itself."""
    doc = copy.deepcopy(base)
    values = toml_values(keys) if toml else json_values(keys)
    key_st = st.one_of(st.sampled_from(tuple(keys)), texts) if keys else texts
    for _ in range(draw(st.integers(0, max_mutations))):
        slots: list[tuple[Any, Any]] = []
        _slots(doc, slots)
        op = draw(st.sampled_from(("replace", "switch", "switch", "drop", "rename", "add",
                                   "dup", "root")))
        if op == "root":
            if draw(st.integers(0, 9)) == 0:
                doc = draw(values)
            continue
        if op in ("add",) or not slots:
            boxes: list[Any] = []
            _containers(doc, boxes)
            if not boxes:
                continue
            box = draw(st.sampled_from(boxes))
            if isinstance(box, dict):
                box[draw(key_st)] = draw(values)
            else:
                box.insert(draw(st.integers(0, len(box))), draw(values))
            continue
        box, k = draw(st.sampled_from(slots))
        if op == "replace":
            box[k] = draw(values)
        elif op == "switch":
            box[k] = draw(st.sampled_from(_type_switch(box[k])))
        elif op == "drop":
            del box[k]
        elif op == "rename" and isinstance(box, dict):
            box[draw(key_st)] = box.pop(k)
        elif op == "dup" and isinstance(box, list):
            box.insert(k, copy.deepcopy(box[k]))
    return doc


# --------------------------------------------------------------------------- serialising

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_str(s: str) -> str:
    out = json.dumps(s, ensure_ascii=False)
    return out.replace("\x7f", "\\u007f")


def _toml_key(k: Any) -> str:
    k = str(k)
    return k if _BARE_KEY.fullmatch(k) else _toml_str(k)


def _toml_value(v: Any) -> str | None:
    if v is None:
        return None  # TOML has no null: the key is left out
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        items = [x for x in (_toml_value(i) for i in v) if x is not None]
        return "[" + ", ".join(items) + "]"
    if isinstance(v, dict):
        items = [f"{_toml_key(k)} = {x}" for k, x in ((k, _toml_value(i)) for k, i in v.items())
                 if x is not None]
        return "{" + ", ".join(items) + "}"
    return _toml_str(str(v))


def toml_dumps(doc: Any) -> str:
    """A TOML document for ``doc`` (top-level tables as ``[table]`` sections); a root that
    is not a table comes out as one ``value = ...`` line."""
    if not isinstance(doc, dict):
        return f"value = {_toml_value(doc) or 0}\n"
    lines, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append((k, v))
            continue
        text = _toml_value(v)
        if text is not None:
            lines.append(f"{_toml_key(k)} = {text}")
    for k, table in tables:
        lines.append(f"[{_toml_key(k)}]")
        for tk, tv in table.items():
            text = _toml_value(tv)
            if text is not None:
                lines.append(f"{_toml_key(tk)} = {text}")
    return "\n".join(lines) + "\n"


def json_dumps(doc: Any) -> str:
    return json.dumps(doc, allow_nan=True)


def jsonl_dumps(lines: Any) -> str:
    if not isinstance(lines, list):
        return json_dumps(lines) + "\n"
    return "".join((line if isinstance(line, str) else json_dumps(line)) + "\n" for line in lines)


# Byte strings that trip parsers: invalid UTF-8, BOMs, NULs, nesting past the recursion
# limit, an integer literal past Python's 4300-digit conversion limit.
JUNK_BYTES = (
    b"", b"\n", b"\xff\xfe", b"\xef\xbb\xbf{}", b"\xef\xbb\xbf[serve]\n", b"\x00", b"\x80abc",
    b"{", b"}", b"[", b"null", b"true", b"0", b"\"x\"", b"[]", b"{}", b"[[]]", b"[serve",
    b"[serve]\n[serve]\n", b"a = 1\na = 2\n", b"a.b = 1\na = 2\n", b"[serve]\ngamma = ",
    b"\xc3\x28", b"\xed\xa0\x80", b"{\"a\": \"\\ud800\"}",
    b"[" * 5000, b"{\"a\":" * 5000, b"a = " + b"[" * 5000, b"a = " + b"{x = " * 2000,
    b"1" * 5000, b"{\"x\": " + b"9" * 5000 + b"}", b"[serve]\ngamma = " + b"9" * 5000 + b"\n",
)


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` cut, spliced with junk, re-encoded or with a number blown past the
    parsers' limits."""
    op = draw(st.sampled_from(("cut", "insert", "flip", "utf16", "latin1", "huge", "deep", "bom")))
    if op == "cut":
        return data[: draw(st.integers(0, len(data)))]
    if op == "insert":
        i = draw(st.integers(0, len(data)))
        return data[:i] + draw(st.one_of(st.binary(max_size=6), st.sampled_from(JUNK_BYTES[:27]))) + data[i:]
    if op == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
    if op == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if op == "latin1":
        return data.decode("utf-8", "replace").replace("a", "é").encode("latin-1", "replace")
    if op == "huge":
        return re.sub(rb"\d+", lambda m: m.group(0) + b"7" * 4400, data, count=1)
    if op == "deep":
        return re.sub(rb"\[", b"[" * 3000, data, count=1)
    return b"\xef\xbb\xbf" + data


def file_bytes(docs: st.SearchStrategy[Any], dump: Callable[[Any], str]) -> st.SearchStrategy[bytes]:
    """Mostly well-formed files of ``docs``; some damaged; some raw junk."""
    good = docs.map(lambda d: dump(d).encode("utf-8", "surrogatepass"))
    return st.one_of(
        good, good, good, good, good, good,
        good.flatmap(damaged),
        st.sampled_from(JUNK_BYTES),
        st.binary(max_size=64),
        st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )


# --------------------------------------------------------------------------- the loaders


@dataclasses.dataclass
class Outcome:
    kind: str  # valid | error | traceback | unnamed | invalid | multiline
    message: str = ""
    detail: str = ""  # the traceback, or why the outcome is wrong


@dataclasses.dataclass
class Loader:
    name: str
    cases: st.SearchStrategy[Any]
    run: Callable[[Any, pathlib.Path], Any]  # (case, workdir) -> object (or raises)
    names: Callable[[Any, pathlib.Path], Sequence[str]]  # what an error must name (any of)
    check: Callable[[Any, Any], str | None] = lambda obj, case: None  # problem or None
    multiline_ok: bool = False


def write(workdir: pathlib.Path, name: str, data: bytes) -> pathlib.Path:
    path = workdir / name
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.write_bytes(data)
    return path


@dataclasses.dataclass(frozen=True)
class FileCase:
    """A file (bytes under a name) and the loader's other arguments."""

    data: bytes
    name: str = "input.json"
    params: tuple[tuple[str, Any], ...] = ()

    def __repr__(self) -> str:
        return f"FileCase(name={self.name!r}, params={dict(self.params)!r}, data={self.data[:2000]!r})"


def _path_names(case: FileCase, workdir: pathlib.Path) -> list[str]:
    return [str(workdir / case.name)]


def file_cases(docs: st.SearchStrategy[Any], dump: Callable[[Any], str], name: str | st.SearchStrategy[str],
               params: st.SearchStrategy[dict[str, Any]] = st.just({})) -> st.SearchStrategy[FileCase]:
    names = name if isinstance(name, st.SearchStrategy) else st.just(name)
    return st.builds(lambda data, n, p: FileCase(data, n, tuple(sorted(p.items()))),
                     file_bytes(docs, dump), names, params)


# ---- launcher TOML presets ([serve] and [env])


def _preset_docs() -> list[dict[str, Any]]:
    out = []
    for path in sorted((REPO / "configs").glob("*.toml")):
        out.append(tomllib.loads(path.read_text(encoding="utf-8")))
    return out or [{"serve": {"method": "draft", "gamma": 4}}]


PRESETS = _preset_docs()
TOML_OPTIONS = [o for o in settings.OPTIONS if o.toml]
OPTION_NAMES = tuple(o.name for o in settings.OPTIONS)
ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS", "HUST_VSPEC_ADAPTIVE_POLICY",
            "hust_vspec_gamma", "HUST_SPECSLO_X", "HUST_SPECASCEND_Y", "CUDA_VISIBLE_DEVICES", "")

# Ints kept small for Kmax and the batch: the dry run's work (capture sizes, the calibration
# grid) grows with gamma x max_num_seqs, so astronomically large ones are only slow.
_SMALL_INT_OPTIONS = ("gamma", "max_num_seqs")


def option_value(opt: settings.Option, files: Sequence[str] = ()) -> st.SearchStrategy[Any]:
    """A value of the option's type, in or near its range (a launcher-side ``str``)."""
    small = opt.name in _SMALL_INT_OPTIONS
    if opt.type == "bool":
        return st.booleans()
    if opt.type == "int":
        lo = int(opt.minimum) if opt.minimum is not None else -2
        hi = int(opt.maximum) if opt.maximum is not None else (64 if small else 5000)
        edge = [lo - 1, lo, hi, hi + 1] + ([] if small else [2**31, 2**63 - 1])
        return st.one_of(st.integers(lo, min(hi, lo + 40)), st.sampled_from(edge))
    if opt.type == "float":
        lo = opt.minimum if opt.minimum is not None else -1.0
        hi = opt.maximum if opt.maximum is not None else 1e6
        return st.one_of(st.floats(lo, hi), st.sampled_from([lo, hi, lo - 1e-3, hi + 1.0]), floats)
    if opt.choices:
        return st.one_of(st.sampled_from(opt.choices), st.sampled_from(opt.choices),
                         st.sampled_from(opt.choices), texts)
    if opt.type == "path":
        return st.one_of(st.sampled_from(tuple(files) or ("x",)),
                         st.sampled_from(("", " ", "/nonexistent/x", ".", "~/x", "a\x00b", "a\nb")),
                         texts)
    if opt.type == "int_list":
        return st.lists(st.integers(-1, 9), max_size=5)
    if opt.type == "str_list":
        return st.lists(st.sampled_from(("online", "budget", "fixed:1", "fixed:²", "profile",
                                         "schedule", "--x", "")) | texts, max_size=4)
    if opt.name == "adaptive_schedule":
        return st.one_of(schedule_texts_mostly_valid(), schedule_texts(), texts)
    if opt.name == "protocol":
        return st.sampled_from(("arc-easy", "qwen35-frontier-mtp2", "bogus"))
    if opt.name in ("target_model", "draft_model"):
        return st.sampled_from(("/models/t", "target-large", "draft", "", "./m", "~/m",
                                "~no-such-user/m"))
    return texts


@st.composite
def serve_tables(draw: st.DrawFn, files: Sequence[str] = ()) -> dict[str, Any]:
    """A [serve] table of real option names with values of (mostly) their type."""
    opts = draw(st.lists(st.sampled_from(TOML_OPTIONS), max_size=6, unique_by=lambda o: o.name))
    return {o.name: draw(option_value(o, files)) for o in opts}


@st.composite
def config_docs(draw: st.DrawFn, files: Sequence[str] = ()) -> dict[str, Any]:
    base = draw(st.sampled_from(PRESETS))
    doc = copy.deepcopy(base)
    serve = doc.setdefault("serve", {})
    if isinstance(serve, dict):
        serve.update(draw(serve_tables(files)))
    if draw(st.booleans()):
        doc["env"] = draw(st.dictionaries(st.sampled_from(ENV_KEYS) | texts,
                                          st.one_of(texts, ints.filter(lambda i: abs(i) < 2**63),
                                                    floats, st.booleans()), max_size=3))
    return draw(mutated(doc, OPTION_NAMES + ("serve", "env") + ENV_KEYS, toml=True, max_mutations=3))


def _run_config(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.launcher.toml_config import load_config

    return load_config(str(write(workdir, case.name, case.data)))


def _check_config(cfg: Any, case: FileCase) -> str | None:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in cfg.env.items()):
        return f"[env] not all strings: {cfg.env!r}"
    for key, value in cfg.serve.items():
        opt = settings.option(key)
        if value is not None and opt.type == "int" and not isinstance(value, int):
            return f"[serve] {key} = {value!r} is not an int"
    return None


# ---- model registry (JSON or TOML)


@st.composite
def registry_docs(draw: st.DrawFn) -> Any:
    base = {"target-large": "/models/target-large", "draft": "rel/draft", "home": "~/m",
            "other": "~no-such-user/m"}
    return draw(mutated(base, ("target-large", "draft", "x")))


@st.composite
def registry_cases(draw: st.DrawFn) -> FileCase:
    suffix = draw(st.sampled_from((".json", ".toml", ".txt", "")))
    doc = draw(registry_docs())
    dump = json_dumps if suffix == ".json" else toml_dumps
    data = draw(file_bytes(st.just(doc), dump))
    return FileCase(data, "registry" + suffix)


def _run_registry(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.launcher.model_store import load_registry

    return load_registry(str(write(workdir, case.name, case.data)))


def _check_registry(reg: Any, case: FileCase) -> str | None:
    if not all(isinstance(k, str) and isinstance(v, str) and os.path.isabs(v) for k, v in reg.items()):
        return f"registry entries not absolute path strings: {reg!r}"
    return None


# ---- profile


def _profile_bases() -> list[dict[str, Any]]:
    out = []
    for path in sorted((REPO / "profiles").glob("*.json")):
        if "measurements" not in path.name:
            out.append(json.loads(path.read_text()))
    out.append({"schema_version": 1, "max_speculative_tokens": 4, "initial_gamma": 2,
                "target": {"alpha_ms_per_context_token": 0.001, "gamma_ms_per_batched_token": 0.5,
                           "delta_ms": 10.0},
                "draft": {"alpha": 0.0, "gamma": 0.1, "delta_ms": 1.0},
                "per_gamma_overhead_ms": {"0": 0.0, "2": 0.5}, "draft_parallel": True})
    return out


PROFILE_BASES = _profile_bases()
PROFILE_KEYS = ("format", "schema_version", "target", "draft", "fit", "max_speculative_tokens",
                "initial_gamma", "default_acceptance_rate", "draft_parallel",
                "per_gamma_overhead_ms", "batch_gamma_policy", "alpha", "gamma", "delta_ms",
                "alpha_ms_per_context_token", "gamma_ms_per_batched_token", "1", "4", "16", "²")


def profile_docs() -> st.SearchStrategy[Any]:
    return st.sampled_from(PROFILE_BASES).flatmap(lambda b: mutated(b, PROFILE_KEYS))


def _run_profile(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.adaptive.profile import load_profile

    return load_profile(str(write(workdir, case.name, case.data)))


def _finite_model(m: Any) -> bool:
    return all(math.isfinite(x) and x >= 0 for x in (m.alpha, m.gamma, m.delta_ms))


def _check_profile(p: Any, case: Any) -> str | None:
    if not (_finite_model(p.target) and _finite_model(p.draft)):
        return f"non-finite or negative coefficients: {p!r}"
    if not all(isinstance(k, int) and k >= 0 for k in p.per_gamma_overhead_ms):
        return f"bad per_gamma_overhead_ms keys {p.per_gamma_overhead_ms!r}"
    if not all(isinstance(k, int) and k >= 1 for k in p.batch_gamma_policy):
        return f"bad batch_gamma_policy keys {p.batch_gamma_policy!r}"
    if not math.isfinite(p.step_ms(1, 1)):
        return f"step_ms(1, 1) = {p.step_ms(1, 1)}"
    return None


# ---- profile samples (vllm-hust-vspec-fit-profile's input)


def _samples_base() -> dict[str, Any]:
    from vllm_hust_vspec.adaptive.profile import samples_from_cost

    def cost(comp: str, b: int, k: int, c: int) -> float:
        return (10.0 + 0.5 * b * (k + 1) + 0.001 * c) if comp == "target" else 1.0 + 0.1 * b
    doc = samples_from_cost(cost, [1, 4], [0, 2], [16, 512])
    doc["max_speculative_tokens"] = 4
    return doc


SAMPLES_BASE = _samples_base()
SAMPLES_KEYS = ("target_samples", "draft_samples", "context_tokens", "batched_tokens",
                "latency_ms", "max_speculative_tokens", "batch_gamma_policy", "draft_parallel")


def _run_samples(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.adaptive.profile import fit_profile, load_samples

    path = str(write(workdir, case.name, case.data))
    return fit_profile(load_samples(path), source=path)


# ---- cost table


def _table_bases() -> list[dict[str, Any]]:
    from vllm_hust_vspec.adaptive.costmodel import CostTable

    samples = [(b, b * (w + 1), 0.01 + 0.002 * b + 0.001 * b * (w + 1))
               for b in (1, 2, 4) for w in range(3)]
    meta = dict(model_id="m", dtype="float16", quantization=None, parallel={"tp": 1},
                execution={"graph_mode": "eager"}, host_version="0.32.0")
    add = CostTable.fit("additive", samples, draft_width=2, calibration={"points": 9}, **meta)
    sps = CostTable.fit("sps", samples, draft_width=2, **meta)
    return [add.to_dict(), sps.to_dict()]


TABLE_BASES = _table_bases()
TABLE_KEYS = ("format", "version", "cost_model", "draft_width", "buckets", "additive", "sps",
              "calibration", "model_id", "dtype", "quantization", "parallel", "execution",
              "host_version", "requests", "target_rows", "bias_s", "alpha_s", "theta_s", "1",
              "2", "²", "0")


def _run_table(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.adaptive.costmodel import CostTable
    from vllm_hust_vspec.startup_cost import check_cost_table

    path = str(write(workdir, case.name, case.data))
    p = dict(case.params)
    if p.get("checked"):
        return check_cost_table(path, draft_width=p["draft_width"], running=p.get("running"))
    return CostTable.load(path)


def _check_table(t: Any, case: Any) -> str | None:
    from vllm_hust_vspec.adaptive.costmodel import CostTable

    for b in t.request_buckets or (1,):
        for g in t.target_rows:
            if t.covers(b, g) and not (math.isfinite(t.step_ms(b, g)) and t.step_ms(b, g) >= 0):
                return f"step_ms({b}, {g}) = {t.step_ms(b, g)}"
    again = CostTable.from_dict(t.to_dict(), source=t.source)
    if again != t:
        return "to_dict() does not load back to the same table"
    return None


# ---- calibration grid


def _grid_bases() -> list[dict[str, Any]]:
    from vllm_hust_vspec.startup_cost import load_grid

    base = load_grid(None, draft_width=4).to_dict()
    small = {"cost_model": "sps", "draft_width": 2, "request_buckets": [1, 2],
             "target_graph_rows": [1, 2, 3, 4, 6], "warmup_steps": 1, "window_steps": 2,
             "windows_per_point": 1,
             "contexts": [{"prefill_tokens": 16, "min_kv_length": 1, "max_kv_length": 64},
                          {"prefill_tokens": 128, "min_kv_length": 100, "max_kv_length": 512}]}
    aliased = {"model": "additive", "draft_width": 1, "request_buckets": [1], "target_graph_rows": [1, 2]}
    return [base, small, aliased]


GRID_BASES = _grid_bases()
GRID_KEYS = ("cost_model", "model", "draft_width", "request_buckets", "target_graph_rows",
             "contexts", "warmup_steps", "window_steps", "windows_per_point", "token_seed",
             "time_cap_s", "prefill_tokens", "min_kv_length", "max_kv_length")
grid_params = st.fixed_dictionaries({
    "draft_width": st.sampled_from((1, 2, 4)),
    "max_model_len": st.one_of(st.none(), st.sampled_from((1, 64, 512, 4096, 10**6))),
    "max_num_seqs": st.one_of(st.none(), st.sampled_from((1, 2, 8, 16, 256))),
})


def _run_grid(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.startup_cost import load_grid

    path = str(write(workdir, case.name, case.data))
    grid = load_grid(path, **dict(case.params))
    grid.describe()
    return grid


def _check_grid(g: Any, case: Any) -> str | None:
    if not g.points():
        return "a grid with no points"
    if g.draft_width != dict(case.params)["draft_width"]:
        return "draft_width differs from the running width"
    return None


# ---- simulator trace (JSON lines)


def _trace_bases() -> list[list[Any]]:
    out = []
    for path in sorted((REPO / "tests" / "data").glob("*.jsonl")) + sorted(
            (REPO / "tests" / "data" / "recorded").glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            lines = [json.loads(next(fh)) for _ in range(3)]
        for rec in lines[1:]:  # short requests keep the cases small
            for key in ("accept_len", "p", "conf"):
                if isinstance(rec.get(key), list):
                    rec[key] = rec[key][:3]
        out.append(lines)
    kmax = 2
    out.append([{"format": "vspec-trace", "version": 1, "kmax": kmax, "max_num_seqs": 2, "seed": 3,
                 "cost": {"bias_ms": 1.0, "target_mem_ms": 2.0, "target_token_ms": 0.1,
                          "draft_mem_ms": 0.5, "draft_token_ms": 0.01, "draft_min_steps": 1,
                          "noise": 0.0}},
                {"id": "a", "arrival_s": 0.0, "accept_len": [2, 0], "p": [[0.9, 0.5], [0.1, 0.0]],
                 "conf": [[1.0, 0.2], [0.3, 0.3]]},
                {"id": "b", "arrival_s": 0.5, "accept_len": [1]}])
    return out


TRACE_BASES = _trace_bases()
TRACE_KEYS = ("format", "version", "kmax", "max_num_seqs", "cost", "seed", "meta", "id",
              "arrival_s", "accept_len", "p", "conf", "bias_ms", "target_mem_ms",
              "target_token_ms", "draft_mem_ms", "draft_token_ms", "draft_min_steps", "noise")


@st.composite
def jsonl_docs(draw: st.DrawFn, bases: Sequence[list[Any]], keys: Sequence[str]) -> list[Any]:
    """JSON-lines documents: a base's records mutated, lines dropped, duplicated, moved or
    replaced by raw junk text."""
    lines = draw(mutated(draw(st.sampled_from(bases)), keys))
    if not isinstance(lines, list):
        return lines
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(("drop", "dup", "swap", "junk", "blank")))
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, copy.deepcopy(lines[i]))
        elif op == "swap":
            lines.insert(0, lines.pop(i))
        elif op == "junk":
            lines[i] = draw(st.sampled_from(("{", "[1]", "nan", "\"x\"", "{}", " ", "\x00",
                                             "{\"a\": 1} {\"b\": 2}", "\u2028{}")))
        else:
            lines.insert(i, "")
    return lines


def _run_trace(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.adaptive.simulate import read_trace

    return read_trace(str(write(workdir, case.name, case.data)))


def _check_trace(t: Any, case: Any) -> str | None:
    h = t.header
    if not (1 <= h.kmax <= 64 and h.max_num_seqs >= 1 and h.cost.step_ms(1, 0, 1) > 0):
        return f"bad header {h!r}"
    for r in t.requests:
        if not (len(r.accept_len) >= 1 and r.accept_len.min() >= 0 and r.accept_len.max() <= h.kmax):
            return f"request {r.id!r}: accept_len out of range"
        for m in (r.p, r.conf):
            if m is not None and not (m.shape == (len(r.accept_len), h.kmax) and (m >= 0).all() and (m <= 1).all()):
                return f"request {r.id!r}: p/conf shape or range"
        if not math.isfinite(r.arrival_s):
            return f"request {r.id!r}: arrival {r.arrival_s}"
    return None


# ---- the dynamic-SD schedule table (settings.parse_schedule): text and the host's rows


@st.composite
def schedule_texts(draw: st.DrawFn) -> str:
    entries = draw(st.lists(st.tuples(st.integers(-2, 40), st.integers(-2, 40), st.integers(-2, 10)),
                            min_size=0, max_size=4))
    parts = []
    for lo, hi, k in entries:
        form = draw(st.sampled_from(("range", "range", "single", "junk")))
        if form == "range":
            parts.append(f"{lo}-{hi}:{k}")
        elif form == "single":
            parts.append(f"{lo}:{k}")
        else:
            parts.append(draw(st.sampled_from(("1-4", "1:2:3", "-:1", "a-b:c", "1-²:2", "²:1",
                                               "1--4:2", " 1 - 4 : 2 ", "1-4:" + "9" * 5000,
                                               "1_0:1", "١-٤:٢", "1-4:4.5", "", " ")) | texts))
    sep = draw(st.sampled_from((",", ", ", ",,", ";")))
    return sep.join(parts)


@st.composite
def valid_schedules(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """A table vLLM accepts: contiguous ranges from batch size 1, K in 0..8."""
    rows, lo = [], 1
    for _ in range(draw(st.integers(1, 4))):
        hi = lo + draw(st.integers(0, 20))
        rows.append((lo, hi, draw(st.integers(0, 8))))
        lo = hi + 1
    return rows


@st.composite
def schedule_texts_mostly_valid(draw: st.DrawFn) -> str:
    """A valid table as text (``LO-HI:K``, ``N:K`` for one batch size), then perhaps one
    entry edited, dropped or duplicated, or the entries shuffled."""
    rows = draw(valid_schedules())
    parts = [f"{lo}:{k}" if lo == hi and draw(st.booleans()) else f"{lo}-{hi}:{k}"
             for lo, hi, k in rows]
    op = draw(st.sampled_from(("none", "none", "edit", "drop", "dup", "shuffle")))
    i = draw(st.integers(0, len(parts) - 1))
    if op == "edit":
        parts[i] = draw(st.sampled_from((parts[i].replace(":", "-"), parts[i] + "0",
                                          "0" + parts[i], parts[i].replace("-", ":"),
                                          parts[i] + ":1", f"{i + 1}-{i}:1")))
    elif op == "drop":
        del parts[i]
    elif op == "dup":
        parts.insert(i, parts[i])
    elif op == "shuffle":
        parts = draw(st.permutations(parts))
    return ",".join(parts)


schedule_rows = st.one_of(
    valid_schedules(),
    valid_schedules().map(lambda rows: [list(r) for r in reversed(rows)]),
    st.lists(st.one_of(st.tuples(st.integers(-2, 40), st.integers(-2, 40), st.integers(-2, 10)),
                       st.lists(scalars, max_size=4), scalars), max_size=4),
    st.tuples(st.tuples(st.just(1), st.just(4), st.just(2))),
    scalars,
    st.dictionaries(texts, scalars, max_size=2),
)


@dataclasses.dataclass(frozen=True)
class ScheduleCase:
    table: Any
    kmax: int | None


schedule_cases = st.builds(ScheduleCase, st.one_of(schedule_texts_mostly_valid(),
                                                   schedule_texts_mostly_valid(), schedule_texts(),
                                                   texts, schedule_rows),
                           st.one_of(st.none(), st.integers(0, 8)))
SCHEDULE_SOURCE = "fuzz: adaptive_schedule"


def _run_schedule(case: ScheduleCase, workdir: pathlib.Path) -> Any:
    return settings.parse_schedule(case.table, SCHEDULE_SOURCE, case.kmax)


def _check_schedule(entries: Any, case: ScheduleCase) -> str | None:
    prev = 0
    for lo, hi, k in entries:
        if not (all(type(v) is int for v in (lo, hi, k)) and prev < lo <= hi and k >= 0
                and (case.kmax is None or k <= case.kmax)):
            return f"bad entries {entries!r}"
        prev = hi
    if not entries or entries[0][0] != 1:
        return f"table does not start at 1: {entries!r}"
    return None


# ---- the A/B benchmark's --native-table (a profile JSON with batch_gamma_policy, or text)


@dataclasses.dataclass(frozen=True)
class NativeCase:
    data: bytes | None  # a .json file, or None for inline text
    text: str = ""

    def spec(self, workdir: pathlib.Path) -> str:
        return str(workdir / "native.json") if self.data is not None else self.text


native_cases = st.one_of(
    st.builds(NativeCase, file_bytes(profile_docs(), json_dumps)),
    st.builds(lambda t: NativeCase(None, t), st.one_of(schedule_texts(), texts)),
)


def _run_native(case: NativeCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.tools.bench_configs import load_native_table

    if case.data is not None:
        write(workdir, "native.json", case.data)
    return load_native_table(case.spec(workdir))


def _native_names(case: NativeCase, workdir: pathlib.Path) -> list[str]:
    return [case.spec(workdir), repr(case.spec(workdir))]


def _check_native(table: Any, case: NativeCase) -> str | None:
    return _check_schedule([tuple(e) for e in table], ScheduleCase(None, None))


# ---- the benchmark's prompt sets and --dataset files


PROMPT_BASE = [{"prompt": "def f(x):", "output_tokens": 8}, {"prompt": "Why?", "output_tokens": 1}]
PROMPT_KEYS = ("prompt", "output_tokens", "conversations", "value", "from")


def _run_prompts(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.tools.bench_workloads import load_prompt_set

    return load_prompt_set(write(workdir, case.name, case.data), "code")


def _check_prompts(prompts: Any, case: Any) -> str | None:
    if not prompts or not all(isinstance(p.text, str) and p.text and type(p.output_tokens) is int
                              and p.output_tokens >= 1 for p in prompts):
        return f"bad prompts {prompts!r}"
    return None


SHAREGPT_BASE = [{"id": "x", "conversations": [{"from": "human", "value": "Hi"},
                                                {"from": "gpt", "value": "Hello there"}]}]


@dataclasses.dataclass(frozen=True)
class DatasetCase:
    kind: str
    data: bytes
    suffix: str
    spec_form: str  # "ok" or a broken spec

    def path(self, workdir: pathlib.Path) -> pathlib.Path:
        return workdir / f"dataset{self.suffix}"

    def spec(self, workdir: pathlib.Path) -> str:
        p = str(self.path(workdir))
        return {"ok": f"{self.kind}:{p}", "nocolon": f"{self.kind}{p}", "empty": f"{self.kind}:",
                "bogus": f"bogus:{p}", "missing": f"{self.kind}:{p}.missing",
                "dir": f"{self.kind}:{self.path(workdir).parent}"}[self.spec_form]


@st.composite
def dataset_cases(draw: st.DrawFn) -> DatasetCase:
    kind = draw(st.sampled_from(("custom", "sharegpt")))
    if kind == "custom":
        data = draw(file_bytes(jsonl_docs([PROMPT_BASE], PROMPT_KEYS), jsonl_dumps))
        suffix = draw(st.sampled_from((".jsonl", ".jsonl", ".jsonl", ".json")))
    else:
        data = draw(file_bytes(st.just(SHAREGPT_BASE).flatmap(lambda b: mutated(b, PROMPT_KEYS)), json_dumps))
        suffix = draw(st.sampled_from((".json", ".json", ".jsonl")))
    form = draw(st.sampled_from(("ok",) * 8 + ("nocolon", "empty", "bogus", "missing", "dir")))
    return DatasetCase(kind, data, suffix, form)


def _run_dataset(case: DatasetCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.tools import bench_datasets

    write(workdir, case.path(workdir).name, case.data)
    spec = case.spec(workdir)
    kind, arg = bench_datasets.parse_spec(spec)
    # the pure-Python check load() runs before handing the file to vLLM's dataset classes
    return bench_datasets._check_file(kind, pathlib.Path(arg), spec)


def _dataset_names(case: DatasetCase, workdir: pathlib.Path) -> list[str]:
    return [case.spec(workdir), str(case.path(workdir))]


# ---- the A/B benchmark's results.json


RESULTS_BASE = {
    "command": "vllm-hust-vspec-bench ab", "machine": {"cpus": 2},
    "runs": [{"config": "none", "policy": "none", "k": 0, "workload": "code", "concurrency": 1,
              "round": 1, "output_tok_s": 10.0, "tpot_ms": 100.0, "mean_accept_len": 1.0,
              "mean_k": 0.0},
             {"config": "online", "policy": "online", "k": 4, "workload": "swing",
              "concurrency": "swing", "round": 2, "output_tok_s": 12.5, "tpot_ms": 80.0,
              "mean_accept_len": 2.1, "mean_k": 2.5, "load_1m": 1.5, "settle_steps": 3}],
    "paired": [{"workload": "code", "concurrency": 4, "phase": 0, "server_round": 1, "window": 0,
                "round": 0, "policy": "fixed:2", "steps": 16, "tokens": 80, "ms": 400.0,
                "batch": 4.0, "load_1m": None, "by_batch": [[4, 16, 80, 400.0]]}],
}
RESULTS_KEYS = ("command", "machine", "runs", "paired", "config", "policy", "k", "workload",
                "concurrency", "round", "output_tok_s", "tpot_ms", "mean_accept_len", "mean_k",
                "load_1m", "settle_steps", "phase", "server_round", "window", "steps", "tokens",
                "ms", "batch", "by_batch")


def _run_results(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.tools.bench_results import load_results

    return load_results(write(workdir, case.name, case.data))[1]


# ---- the decision trace (vllm-hust-vspec-bench trace DECISIONS.jsonl)


def _decision_bases() -> list[list[Any]]:
    """Short traces written by the real controller (sweep: K = 0 stretches; online: the
    weighed est_costs/est_goodput), plus a drafter and two window records."""
    import numpy as np

    from vllm_hust_vspec.adaptive.controller import Controller, ControllerConfig
    from vllm_hust_vspec.adaptive.observations import BatchView, StepResult

    out = []
    for policy, extra in (("sweep", {"sweep": (0, 0, 2, 4, 3)}), ("online", {})):
        ctl = Controller(ControllerConfig(kmax=4, policy=policy, trace=True, **extra))
        rng = np.random.default_rng(0)
        lines = [ctl.trace_header(host={"host": "fuzz"})]
        ids = ("r0", "r1", "r2")
        for step in range(1, 9):
            b = 3 if step < 6 else 2
            d = ctl.decide(BatchView(step=step, req_ids=ids[:b]))
            ms = None if step % 4 == 0 else 10.0 + 2.0 * d.k * b
            ctl.observe(StepResult(step, b, d.k, (), ms, max(d.k, 1), drafted=np.full(b, d.k),
                                   accepted=rng.integers(0, d.k + 1, size=b)))
            lines += ctl.drain_records()
        lines += [{"step": 3, "drafter": {"skipped": 1, "caught_up": 0}},
                  {"window": 1, "round": 1, "policy": "fixed:2", "steps": 3, "tokens": 30,
                   "ms": 20.0, "batch": 3.0, "by_batch": [[3, 3, 30, 20.0]]},
                  {"window": 2, "round": 1, "policy": "online", "steps": 3, "tokens": 24,
                   "ms": 20.0, "batch": 3.0, "by_batch": [[2, 1, 6, 8.0], [3, 2, 18, 12.0]]}]
        out.append(json.loads(json.dumps(lines)))  # plain JSON types
    return out


DECISION_BASES = _decision_bases()
DECISION_KEYS = ("trace", "version", "settings", "host", "step", "t", "batch", "k", "k_i",
                 "policy", "reason", "est_accept", "est_cost_ms", "est_costs", "est_goodput",
                 "drafted", "accepted", "ms", "drafter", "skipped", "caught_up", "window",
                 "round", "steps", "tokens", "by_batch", "r0")


def _run_decisions(case: FileCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.tools import trace_picture

    trace = trace_picture.load(write(workdir, case.name, case.data))
    s = trace_picture.summary(trace)  # what the command prints (text and --json)
    trace_picture.summary_text(s)
    json.dumps(s)
    return s


# ---- the launcher's argv (resolve + build the plan: what --dry-run prints)


ARGV_FILES = ("config.toml", "registry.json", "grid.json", "table.json", "profile.json")


@dataclasses.dataclass(frozen=True)
class ArgvCase:
    argv: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...]
    env: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        files = {n: d[:600] for n, d in self.files}
        return f"ArgvCase(argv={list(self.argv)!r}, env={dict(self.env)!r}, files={files!r})"


CLI_OPTIONS = [o for o in settings.OPTIONS if o.cli]
RETIRED_FLAGS = ("--adaptive-gamma0-mode", "--adaptive-gamma0-mode=sticky")


def _flag_tokens(opt: settings.Option, value: Any, form: str) -> list[str]:
    flag = opt.cli_flag
    if opt.type == "bool":
        if opt.negatable and value is False:
            return ["--no-" + flag[2:]]
        return [flag]
    if isinstance(value, (list, tuple)):
        text = ",".join(str(v) for v in value)
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = str(value)
    return [f"{flag}={text}"] if form == "eq" else [flag, text]


@st.composite
def argv_cases(draw: st.DrawFn, workdir: pathlib.Path) -> ArgvCase:
    files_abs = [str(workdir / n) for n in ARGV_FILES]
    argv: list[str] = []
    if draw(st.integers(0, 4)):
        argv += ["--target-model", draw(st.sampled_from(("/models/t", "target-large", "t",
                                                         "~no-such-user/t")))]
    if draw(st.integers(0, 2)):
        argv += ["--draft-model", draw(st.sampled_from(("/models/d", "draft", "d", "~/d")))]
    for opt in draw(st.lists(st.sampled_from(CLI_OPTIONS), max_size=7)):
        value = draw(option_value(opt, files_abs))
        argv += _flag_tokens(opt, value, draw(st.sampled_from(("sep", "eq"))))
    for _ in range(draw(st.sampled_from((0, 0, 0, 1, 2)))):
        i = draw(st.integers(0, len(argv)))
        argv.insert(i, draw(st.sampled_from(RETIRED_FLAGS + ("--", "-x", "--gam", "--gamma",
                                                             "--no-dry-run", "--config", "-",
                                                             "--=", "positional", "--method=",
                                                             "--enforce-eager", "-O3",
                                                             "--model=/m", "--port=1"))
                                | texts))
    if draw(st.integers(0, 3)) == 0:
        argv += ["--", *draw(st.lists(st.sampled_from(("--enforce-eager", "--max-num-seqs", "8",
                                                       "--speculative-config", "{}", "-O", "--seed",
                                                       "--no-enable-prefix-caching", "--port=9")),
                                      max_size=3))]
    argv = [a for a in argv if a not in ("-h", "--help") and not a.startswith(("--h", "-h"))]
    files = []
    used = " ".join(argv)
    if "config.toml" in used or draw(st.integers(0, 3)) == 0:
        files.append(("config.toml", draw(file_bytes(config_docs(files_abs), toml_dumps))))
    if "registry.json" in used:
        files.append(("registry.json", draw(file_bytes(registry_docs(), json_dumps))))
    if "grid.json" in used:
        files.append(("grid.json", draw(file_bytes(st.sampled_from(GRID_BASES).flatmap(
            lambda b: mutated(b, GRID_KEYS)), json_dumps))))
    if "table.json" in used:
        files.append(("table.json", draw(file_bytes(st.sampled_from(TABLE_BASES).flatmap(
            lambda b: mutated(b, TABLE_KEYS)), json_dumps))))
    env = {}
    if draw(st.integers(0, 5)) == 0:
        env["VSPEC_CONFIG"] = str(workdir / "config.toml")
        if not any(n == "config.toml" for n, _ in files):
            files.append(("config.toml", draw(file_bytes(config_docs(files_abs), toml_dumps))))
    if draw(st.integers(0, 5)) == 0:
        env[draw(st.sampled_from(("HUST_VSPEC_TARGET_MODEL", "HUST_VSPEC_DRAFT_MODEL",
                                  "HUST_VSPEC_MODEL_DIR", "VLLM_PLUGINS", "HUST_VSPEC_GAMMA",
                                  "VLLM_CPU_KVCACHE_SPACE")))] = draw(st.sampled_from(
            ("/m", "x", "", "vspec", "a,b")))
    return ArgvCase(tuple(argv), tuple(files), tuple(sorted(env.items())))


def _run_argv(case: ArgvCase, workdir: pathlib.Path) -> Any:
    from vllm_hust_vspec.launcher import cli

    for name in ARGV_FILES + ("out.json",):
        p = workdir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    for name, data in case.files:
        write(workdir, name, data)
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **dict(case.env)}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            res, plan = cli.prepare(case.argv, environ)
    except SystemExit as exc:  # argparse's one line (parser._Parser.error)
        text = err.getvalue().strip()
        if exc.code != 2:
            raise AssertionError(f"argparse exit {exc.code!r}: {text}") from None
        raise ArgparseError(text) from None
    cli.render_text(plan, res)
    json.loads(plan.as_json())
    return plan


class ArgparseError(VspecError):
    """The launcher's argparse refusal (printed as one ``PROG: error: ...`` line, exit 2),
    wrapped so that :func:`classify` treats it like the project's own errors."""


def _argv_names(case: ArgvCase, workdir: pathlib.Path) -> list[str]:
    names = [str(workdir / n) for n, _ in case.files] + [str(workdir / n) for n in ARGV_FILES]
    names += [o.cli_flag for o in settings.OPTIONS] + [o.name for o in settings.OPTIONS]
    names += [e for o in settings.OPTIONS for e in ((o.env,) if o.env else ()) + o.env_aliases]
    names += [part for a in case.argv if a.startswith("-") for part in a.split("=", 1)]
    names += [a for a in case.argv if a.strip()]
    names += [a.replace("\r", "\\r").replace("\n", "\\n") for a in case.argv if a.strip()]
    names += ["--no-" + o.cli_flag[2:] for o in settings.OPTIONS if o.type == "bool"]
    names += ["protocol", "[serve]", "[env]", "env "]
    for name, data in case.files:  # a preset's own values (a file it names, e.g.)
        if name.endswith(".toml"):
            try:
                doc = tomllib.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, ValueError):
                continue
            serve = doc.get("serve")
            if isinstance(serve, dict):
                names += [v for v in serve.values() if isinstance(v, str) and v.strip()]
    return names


def _check_plan(plan: Any, case: ArgvCase) -> str | None:
    if not (isinstance(plan.argv, list) and all(isinstance(a, str) for a in plan.argv)):
        return f"argv not strings: {plan.argv!r}"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in plan.env.items()):
        return f"env not strings: {plan.env!r}"
    return None


# --------------------------------------------------------------------------- registry


def loaders(workdir: pathlib.Path) -> dict[str, Loader]:
    """Every loader, by name (``workdir``: where the cases' files are written)."""
    grid_docs = st.sampled_from(GRID_BASES).flatmap(lambda b: mutated(b, GRID_KEYS))
    table_docs = st.sampled_from(TABLE_BASES).flatmap(lambda b: mutated(b, TABLE_KEYS))
    table_params = st.one_of(
        st.just({}),
        st.fixed_dictionaries({"checked": st.just(True), "draft_width": st.sampled_from((1, 2, 7)),
                               "running": st.one_of(st.none(), st.just({"model_id": "m", "dtype": "float16",
                                                                         "parallel": {"tp": 1},
                                                                         "host_version": "0.32.1"}))}),
    )
    return {
        "launcher_toml": Loader("launcher_toml", file_cases(config_docs(), toml_dumps, "preset.toml"),
                                _run_config, _path_names, _check_config),
        "model_registry": Loader("model_registry", registry_cases(), _run_registry, _path_names,
                                 _check_registry),
        "profile": Loader("profile", file_cases(profile_docs(), json_dumps, "profile.json"),
                          _run_profile, _path_names, _check_profile),
        "profile_samples": Loader("profile_samples", file_cases(
            mutated(SAMPLES_BASE, SAMPLES_KEYS), json_dumps, "samples.json"),
            _run_samples, _path_names, _check_profile),
        "cost_table": Loader("cost_table", file_cases(table_docs, json_dumps, "table.json", table_params),
                             _run_table, _path_names, _check_table),
        "calibration_grid": Loader("calibration_grid", file_cases(grid_docs, json_dumps, "grid.json", grid_params),
                                   _run_grid, _path_names, _check_grid),
        "sim_trace": Loader("sim_trace", file_cases(jsonl_docs(TRACE_BASES, TRACE_KEYS), jsonl_dumps,
                                                    "trace.jsonl"),
                            _run_trace, _path_names, _check_trace),
        "schedule": Loader("schedule", schedule_cases, _run_schedule,
                           lambda case, wd: [SCHEDULE_SOURCE], _check_schedule),
        "native_table": Loader("native_table", native_cases, _run_native, _native_names, _check_native),
        "prompt_set": Loader("prompt_set", file_cases(jsonl_docs([PROMPT_BASE], PROMPT_KEYS), jsonl_dumps,
                                                      "code.jsonl"),
                             _run_prompts, lambda case, wd: [str(wd / case.name)], _check_prompts),
        "dataset": Loader("dataset", dataset_cases(), _run_dataset, _dataset_names),
        "bench_results": Loader("bench_results", file_cases(mutated(RESULTS_BASE, RESULTS_KEYS), json_dumps,
                                                            "results.json"),
                                _run_results, _path_names),
        "decision_trace": Loader("decision_trace", file_cases(jsonl_docs(DECISION_BASES, DECISION_KEYS),
                                                              jsonl_dumps, "decisions.jsonl"),
                                 _run_decisions, _path_names),
        "launcher_argv": Loader("launcher_argv", argv_cases(workdir), _run_argv, _argv_names, _check_plan,
                                multiline_ok=False),
    }


def classify(loader: Loader, case: Any, workdir: pathlib.Path) -> Outcome:
    """Run one case; see the module docstring for the outcomes."""
    try:
        obj = loader.run(case, workdir)
    except VspecError as exc:
        msg = str(exc)
        names = [n for n in loader.names(case, workdir) if n]
        # argparse names what it refuses itself ("unrecognized arguments: ...", "argument
        # --x: ..."), a blank argument included
        named = isinstance(exc, ArgparseError) and ("unrecognized arguments:" in msg or "argument " in msg)
        if not named and not any(n in msg for n in names):
            return Outcome("unnamed", msg, f"{type(exc).__name__} names none of the file/key/flag")
        if not loader.multiline_ok and ("\n" in msg or "\r" in msg):
            return Outcome("multiline", msg, f"{type(exc).__name__}: the message spans lines")
        return Outcome("error", msg)
    except Exception as exc:  # noqa: BLE001 - the point: anything else is a traceback
        return _traceback(exc, "")
    try:
        problem = loader.check(obj, case)
    except Exception as exc:  # noqa: BLE001
        return _traceback(exc, " using the loaded object")
    if problem:
        return Outcome("invalid", problem)
    return Outcome("valid")


def _traceback(exc: BaseException, what: str) -> Outcome:
    """A traceback outcome whose message is the exception type and the line of ours that
    raised it (what tells two bugs apart), then the exception's own text."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "vllm_hust_vspec" in f.filename]
    site = f"{pathlib.Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    text = str(exc).replace("\n", " ")[:200]
    return Outcome("traceback", f"{type(exc).__name__}{what} at {site}: {text}",
                   "".join(traceback.format_exception(exc)))


_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def normalize(message: str, workdir: pathlib.Path) -> str:
    """An error message with the work dir's paths and every number replaced (what makes two
    messages "the same error")."""
    text = message.replace(str(workdir), "<dir>")
    text = re.sub(r"0x[0-9a-fA-F]+", "0xN", text)
    return _NUM.sub("N", text)


def make_workdir() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="vspec-fuzz-"))
