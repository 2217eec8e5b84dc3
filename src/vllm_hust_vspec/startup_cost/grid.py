"""The start-up calibration grid: what the engine measures before the server reports ready.

A grid point is ``(B, G, context)``: ``B`` requests (the physical request bucket) decoding
at verify width ``w`` (every request drafts ``w`` tokens and verifies ``w + 1``), so one
full step has ``G = B x (w + 1)`` target rows, with the requests prefilled at
``context.prefill_tokens``. Every point runs ``warmup_steps`` steps (not measured), then
``windows_per_point`` windows of ``window_steps`` full decode steps each; a window's
completion time / ``window_steps`` is one sample of the full-step cost.

The grid comes from the built-in defaults or from a JSON file
(``--adaptive-dspark-calibration FILE.json``, format in ``docs/calibration.md``) and is
validated here, before anything runs: every error is one :class:`CalibrationError` whose
message names the file and the field. The checks that need a running engine (KV capacity,
the engine's own limits) are :func:`check_engine_limits`; a saved cost table
(``--adaptive-dspark-cost-table``) is checked by :func:`check_cost_table`.

Pure Python: no vLLM, no torch (numpy only through the cost table's module).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vllm_hust_vspec import checks
from vllm_hust_vspec.adaptive.costmodel import COST_MODELS, CostTable, CostTableError, request_components
from vllm_hust_vspec.settings import SettingsError

DEFAULTS_SOURCE = "calibration defaults"

# Built-in defaults (seed section "启动标定"; CPU hosts capture no graphs, so their request
# buckets are fixed here, graph-capable hosts take their captured buckets).
DEFAULT_COST_MODEL = "additive"
DEFAULT_REQUEST_BUCKETS = (1, 2, 4, 8, 16)
DEFAULT_MAX_KV_LENGTH = 4096
DEFAULT_MIN_KV_LENGTH = 1
DEFAULT_PREFILL_TOKENS = 2048  # graph-capable hosts (the seed's default)
DEFAULT_PREFILL_TOKENS_CPU = 256  # CPU hosts: 31 prefills per width at 2048 tokens cost minutes
DEFAULT_WARMUP_STEPS = 8
DEFAULT_WINDOW_STEPS = 32
DEFAULT_WINDOWS_PER_POINT = 3
DEFAULT_TOKEN_SEED = 1
DEFAULT_TIME_CAP_S = 600.0
# Steps that may be in flight beyond the last measured one (two pipeline slots): they still
# grow every request's KV, so the context reserves room for them.
IN_FLIGHT_STEPS = 2

FILE_KEYS = (
    "cost_model",
    "draft_width",
    "request_buckets",
    "target_graph_rows",
    "contexts",
    "warmup_steps",
    "window_steps",
    "windows_per_point",
    "token_seed",
    "time_cap_s",
)
# The seed's example spells the cost model "model"; accepted as an alias of "cost_model".
KEY_ALIASES = {"model": "cost_model"}
CONTEXT_KEYS = ("prefill_tokens", "min_kv_length", "max_kv_length")


class CalibrationError(SettingsError):
    """A calibration grid or cost table that cannot be used.

    ``CalibrationError(source, field, message)`` reads ``"<source>: <field>: <message>"``
    (``source`` is the file, or ``"calibration defaults"``); ``CalibrationError(text)``
    takes a finished message (see :class:`vllm_hust_vspec.errors.VspecError`)."""


@dataclass(frozen=True)
class ContextRange:
    """One context range: requests are prefilled at ``prefill_tokens`` and the measured cost
    stands for KV lengths ``min_kv_length .. max_kv_length`` (inclusive)."""

    prefill_tokens: int
    min_kv_length: int
    max_kv_length: int

    def overlaps(self, other: ContextRange) -> bool:
        return self.min_kv_length <= other.max_kv_length and other.min_kv_length <= self.max_kv_length

    def label(self) -> str:
        return f"prefill {self.prefill_tokens}, kv {self.min_kv_length}..{self.max_kv_length}"

    def to_dict(self) -> dict[str, int]:
        return {
            "prefill_tokens": self.prefill_tokens,
            "min_kv_length": self.min_kv_length,
            "max_kv_length": self.max_kv_length,
        }


@dataclass(frozen=True)
class CalibrationGrid:
    """The effective calibration configuration (defaults filled in, validated by
    :func:`load_grid`)."""

    cost_model: str  # 'additive' | 'sps'
    draft_width: int
    request_buckets: tuple[int, ...]
    target_graph_rows: tuple[int, ...]
    contexts: tuple[ContextRange, ...]
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    window_steps: int = DEFAULT_WINDOW_STEPS
    windows_per_point: int = DEFAULT_WINDOWS_PER_POINT
    token_seed: int = DEFAULT_TOKEN_SEED
    time_cap_s: float = DEFAULT_TIME_CAP_S
    source: str = "defaults"
    notes: tuple[str, ...] = ()  # what the defaults left out, shown by describe()

    # ---- the points

    def widths_for(self, batch: int) -> list[int]:
        """Verify widths ``w`` (0..draft_width) measured at request bucket ``batch``: those
        whose ``G = batch x (w + 1)`` is one of ``target_graph_rows``."""
        rows = set(self.target_graph_rows)
        return [w for w in range(self.draft_width + 1) if batch * (w + 1) in rows]

    def points(self) -> list[tuple[int, int, ContextRange]]:
        """Every ``(B, G, context)`` to measure: per context, per request bucket ascending,
        per width ascending (``G = B x (w + 1)``)."""
        return [
            (b, b * (w + 1), ctx)
            for ctx in self.contexts
            for b in self.request_buckets
            for w in self.widths_for(b)
        ]

    @property
    def steps_per_point(self) -> int:
        """Full decode steps one point runs: warm-up plus every window."""
        return self.warmup_steps + self.windows_per_point * self.window_steps

    @property
    def progress_tokens(self) -> int:
        """Worst-case KV growth of one request during one point (full width every step,
        plus the steps still in flight), on top of its prefill."""
        return (self.steps_per_point + IN_FLIGHT_STEPS) * (self.draft_width + 1)

    def kv_needed(self, context: ContextRange) -> int:
        """KV tokens one request of ``context`` may hold during a point."""
        return context.prefill_tokens + self.progress_tokens

    # ---- output

    def describe(self) -> str:
        """One log line: source, buckets, contexts, steps."""
        ctx = "; ".join(c.label() for c in self.contexts)
        line = (
            f"DSpark adaptive effective configuration (source: {self.source}): "
            f"cost_model={self.cost_model} draft_width={self.draft_width} "
            f"B={list(self.request_buckets)} G={list(self.target_graph_rows)} "
            f"contexts=[{ctx}] warmup_steps={self.warmup_steps} "
            f"window_steps={self.window_steps} windows_per_point={self.windows_per_point} "
            f"token_seed={self.token_seed} time_cap_s={self.time_cap_s:g} "
            f"points={len(self.points())}"
        )
        if self.notes:
            line += " (" + "; ".join(self.notes) + ")"
        return line

    def to_dict(self) -> dict[str, Any]:
        """The grid in the calibration-file format (``load_grid`` reads it back)."""
        return {
            "cost_model": self.cost_model,
            "draft_width": self.draft_width,
            "request_buckets": list(self.request_buckets),
            "target_graph_rows": list(self.target_graph_rows),
            "contexts": [c.to_dict() for c in self.contexts],
            "warmup_steps": self.warmup_steps,
            "window_steps": self.window_steps,
            "windows_per_point": self.windows_per_point,
            "token_seed": self.token_seed,
            "time_cap_s": self.time_cap_s,
        }


# --------------------------------------------------------------------------- loading


def load_grid(
    path: str | pathlib.Path | None,
    *,
    draft_width: int,
    max_model_len: int | None = None,
    graph_buckets: Sequence[int] | None = None,
    max_num_seqs: int | None = None,
) -> CalibrationGrid:
    """The effective grid: the built-in defaults when ``path`` is None, else the JSON file
    with missing keys filled from the defaults.

    ``draft_width`` is the running width (``--gamma`` = ``num_speculative_tokens``).
    ``max_model_len`` bounds the contexts (the default context shrinks to fit it).
    ``graph_buckets`` (the captured graph sizes of a graph-capable host) make the default
    request buckets the captured ones; ``max_num_seqs`` caps the default buckets and
    refuses larger ones in a file. Raises :class:`CalibrationError` naming file and field.
    """
    if not checks.is_int(draft_width) or draft_width < 1:
        raise ValueError(f"load_grid: draft_width must be a positive integer, got {draft_width!r}")
    if path is None:
        return grid_from_dict({}, source=DEFAULTS_SOURCE, draft_width=draft_width,
                              max_model_len=max_model_len, graph_buckets=graph_buckets,
                              max_num_seqs=max_num_seqs)
    source = str(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(source, "<file>", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CalibrationError(source, "<file>", "not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(source, "<json>", f"invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except checks.PARSER_LIMITS as exc:
        raise CalibrationError(source, "<json>", f"invalid JSON: {checks.parser_limit(exc)}") from None
    return grid_from_dict(doc, source=source, draft_width=draft_width, max_model_len=max_model_len,
                          graph_buckets=graph_buckets, max_num_seqs=max_num_seqs)


def grid_from_dict(
    doc: Any,
    *,
    source: str,
    draft_width: int,
    max_model_len: int | None = None,
    graph_buckets: Sequence[int] | None = None,
    max_num_seqs: int | None = None,
) -> CalibrationGrid:
    """Validate a parsed calibration document, filling missing keys from the defaults
    (see :func:`load_grid`; ``source`` names the document in errors)."""
    doc = _file_keys(doc, source)
    cost_model = checks.one_of(doc.get("cost_model", DEFAULT_COST_MODEL), COST_MODELS, source,
                               "cost_model", error=CalibrationError)
    width = _int(doc, "draft_width", draft_width, 1, source)
    if width != draft_width:
        raise CalibrationError(
            source, "draft_width",
            f"{width} differs from the running width {draft_width} (--gamma = "
            f"num_speculative_tokens); costs of different widths cannot be mixed",
        )
    steps = {
        "warmup_steps": _int(doc, "warmup_steps", DEFAULT_WARMUP_STEPS, 0, source),
        "window_steps": _int(doc, "window_steps", DEFAULT_WINDOW_STEPS, 1, source),
        "windows_per_point": _int(doc, "windows_per_point", DEFAULT_WINDOWS_PER_POINT, 1, source),
        "token_seed": _int(doc, "token_seed", DEFAULT_TOKEN_SEED, 0, source),
    }
    cap = doc.get("time_cap_s", DEFAULT_TIME_CAP_S)
    if not checks.is_number(cap) or cap <= 0:
        raise CalibrationError(source, "time_cap_s", f"must be a number of seconds > 0, got {cap!r}")
    buckets, rows, notes = _buckets_and_rows(doc, source, width, graph_buckets, max_num_seqs)
    label = source
    if source == DEFAULTS_SOURCE:
        label = "defaults" if graph_buckets is None else "defaults (captured graph buckets)"
    grid = CalibrationGrid(
        cost_model=cost_model,
        draft_width=width,
        request_buckets=tuple(buckets),
        target_graph_rows=tuple(rows),
        contexts=(),
        **steps,
        time_cap_s=float(cap),
        source=label,
        notes=notes,
    )
    if "contexts" in doc:
        contexts = _contexts(doc["contexts"], source)
    else:
        prefill = DEFAULT_PREFILL_TOKENS_CPU if graph_buckets is None else DEFAULT_PREFILL_TOKENS
        contexts = (_default_context(grid, prefill, max_model_len, source),)
    grid = replace(grid, contexts=tuple(contexts))
    _check_contexts(grid, max_model_len, source)
    if cost_model == "additive":
        _check_connected(grid, source)
    return grid


def _file_keys(doc: Any, source: str) -> dict[str, Any]:
    """The document as a dict with the aliases resolved; unknown keys refused."""
    checks.mapping(doc, source, "<root>", what="a JSON object", error=CalibrationError)
    doc = dict(doc)
    for alias, key in KEY_ALIASES.items():
        if alias in doc:
            if key in doc:
                raise CalibrationError(source, alias, f"give either {alias!r} or {key!r}, not both")
            doc[key] = doc.pop(alias)
    checks.known_keys(doc, FILE_KEYS + tuple(KEY_ALIASES), source, error=CalibrationError)
    return doc


def _buckets_and_rows(
    doc: Mapping[str, Any],
    source: str,
    width: int,
    graph_buckets: Sequence[int] | None,
    max_num_seqs: int | None,
) -> tuple[list[int], list[int], tuple[str, ...]]:
    """Request buckets B and target rows G: from the file, else from the captured graph
    sizes (graph-capable hosts), else the built-in defaults; checked against each other."""
    notes: tuple[str, ...] = ()
    default_rows: list[int] = []
    if "request_buckets" in doc:
        buckets = _int_list(doc["request_buckets"], "request_buckets", source)
    elif graph_buckets is None:
        buckets = [b for b in DEFAULT_REQUEST_BUCKETS if max_num_seqs is None or b <= max_num_seqs]
        if not buckets:
            raise CalibrationError(source, "request_buckets",
                                   f"no default bucket fits max_num_seqs={max_num_seqs}")
    else:
        buckets, default_rows, notes = _captured_buckets(graph_buckets, width, max_num_seqs)
        if not buckets:
            raise CalibrationError(
                source, "request_buckets",
                f"no captured graph size B (<= max_num_seqs={max_num_seqs}) has its full-width "
                f"target rows B x {width + 1} captured too (captured: "
                f"{sorted(set(graph_buckets))}); list request_buckets in a calibration file",
            )
    if max_num_seqs is not None:
        for i, b in enumerate(buckets):
            if b > max_num_seqs:
                raise CalibrationError(source, f"request_buckets[{i}]",
                                       f"B={b} exceeds max_num_seqs={max_num_seqs}: it cannot run")
    if "target_graph_rows" in doc:
        rows = _int_list(doc["target_graph_rows"], "target_graph_rows", source)
    elif graph_buckets is not None and "request_buckets" not in doc:
        rows = default_rows
    else:
        captured = None if graph_buckets is None else set(graph_buckets)
        rows = sorted({b * (w + 1) for b in buckets for w in range(width + 1)
                       if captured is None or b * (w + 1) in captured})
    _check_rows(buckets, rows, width, source)
    return buckets, rows, notes


def _captured_buckets(
    graph_buckets: Sequence[int], width: int, max_num_seqs: int | None
) -> tuple[list[int], list[int], tuple[str, ...]]:
    """Request buckets from captured graph sizes: every captured ``B`` (<= max_num_seqs)
    whose full-width rows ``B x (width + 1)`` are captured too, with every captured
    ``G = B x (w + 1)``. Buckets not connected to the smallest one through a shared G are
    left out (and named in the notes): the additive fit could not separate them."""
    captured = sorted({int(g) for g in graph_buckets if int(g) >= 1})
    have = set(captured)
    buckets = [b for b in captured
               if (max_num_seqs is None or b <= max_num_seqs) and b * (width + 1) in have]
    if not buckets:
        return [], [], ()
    by_b = {b: [b * (w + 1) for w in range(width + 1) if b * (w + 1) in have] for b in buckets}
    component = request_components(by_b)[0]
    kept = [b for b in buckets if b in component]
    left = [b for b in buckets if b not in component]
    rows = sorted({g for b in kept for g in by_b[b]})
    notes = ()
    if left:
        notes = (f"captured B {left} left out: not connected to B={kept[0]} through a shared G",)
    return kept, rows, notes


def _default_context(grid: CalibrationGrid, prefill: int, max_model_len: int | None, source: str) -> ContextRange:
    """One range: kv 1..min(4096, max_model_len), prefill shortened so that the worst-case
    progress of a point (plus the steps in flight) still fits."""
    max_kv = DEFAULT_MAX_KV_LENGTH if max_model_len is None else min(DEFAULT_MAX_KV_LENGTH, max_model_len)
    prefill = min(prefill, max_kv - grid.progress_tokens)
    if prefill < DEFAULT_MIN_KV_LENGTH:
        raise CalibrationError(
            source, "contexts",
            f"the default steps need {grid.progress_tokens} tokens of decode progress per "
            f"request ({grid.steps_per_point} + {IN_FLIGHT_STEPS} steps x width "
            f"{grid.draft_width + 1}) on top of a prefill: more than the default context "
            f"(kv up to {max_kv} = min({DEFAULT_MAX_KV_LENGTH}, max_model_len)) leaves; pass a "
            f"smaller explicit configuration with --adaptive-dspark-calibration FILE.json",
        )
    return ContextRange(prefill, DEFAULT_MIN_KV_LENGTH, max_kv)


# --------------------------------------------------------------------------- checks


def _int(doc: Mapping[str, Any], key: str, default: int, minimum: int, source: str) -> int:
    return checks.integer(doc.get(key, default), source, key, minimum=minimum, error=CalibrationError)


def _int_list(values: Any, name: str, source: str) -> list[int]:
    return checks.int_list(values, source, name, minimum=1, error=CalibrationError,
                           hint=" (it cannot run)")


def _check_rows(buckets: Sequence[int], rows: Sequence[int], width: int, source: str) -> None:
    """Every G is ``B x (w + 1)`` for a request bucket B and a width w <= draft_width, and
    every B keeps its full-width rows."""
    for i, g in enumerate(rows):
        if g < buckets[0]:
            raise CalibrationError(source, f"target_graph_rows[{i}]",
                                   f"G={g} is smaller than every request bucket (G >= B): it cannot run")
        if not any(g % b == 0 and g // b - 1 <= width for b in buckets):
            raise CalibrationError(
                source, f"target_graph_rows[{i}]",
                f"G={g} is not B x (w + 1) for any request bucket B in {list(buckets)} and "
                f"width w <= draft_width {width}: no point can run it",
            )
    have = set(rows)
    for i, b in enumerate(buckets):
        if b * (width + 1) not in have:
            raise CalibrationError(
                source, f"request_buckets[{i}]",
                f"B={b} has no full-width target rows G={b} x {width + 1} = {b * (width + 1)} "
                f"in target_graph_rows {list(rows)} (full width must stay covered)",
            )


def _contexts(values: Any, source: str) -> tuple[ContextRange, ...]:
    if not isinstance(values, list) or not values:
        raise CalibrationError(source, "contexts", f"must be a non-empty list of objects, got {values!r}")
    out = []
    for i, item in enumerate(values):
        name = f"contexts[{i}]"
        checks.mapping(item, source, name, what=f"an object with {', '.join(CONTEXT_KEYS)}",
                       error=CalibrationError)
        checks.known_keys(item, CONTEXT_KEYS, source, prefix=f"{name}.", error=CalibrationError)
        checks.required_keys(item, CONTEXT_KEYS, source, prefix=f"{name}.", error=CalibrationError)
        out.append(ContextRange(**{
            key: checks.integer(item[key], source, f"{name}.{key}", minimum=1, error=CalibrationError)
            for key in CONTEXT_KEYS
        }))
    return tuple(out)


def _check_contexts(grid: CalibrationGrid, max_model_len: int | None, source: str) -> None:
    progress = grid.progress_tokens
    for i, c in enumerate(grid.contexts):
        name = f"contexts[{i}]"
        if c.min_kv_length > c.max_kv_length:
            raise CalibrationError(source, name,
                                   f"min_kv_length {c.min_kv_length} > max_kv_length {c.max_kv_length}")
        if c.prefill_tokens < c.min_kv_length:
            raise CalibrationError(
                source, f"{name}.prefill_tokens",
                f"{c.prefill_tokens} is below min_kv_length {c.min_kv_length}: the measured "
                f"requests would start outside the range they stand for",
            )
        if c.prefill_tokens + progress > c.max_kv_length:
            raise CalibrationError(
                source, f"{name}.prefill_tokens",
                f"prefill {c.prefill_tokens} + worst-case progress {progress} tokens "
                f"(({grid.steps_per_point} + {IN_FLIGHT_STEPS} steps) x width "
                f"{grid.draft_width + 1}) = {c.prefill_tokens + progress} exceeds max_kv_length "
                f"{c.max_kv_length}; shorten the prefill or the steps",
            )
        if max_model_len is not None and c.max_kv_length > max_model_len:
            raise CalibrationError(source, f"{name}.max_kv_length",
                                   f"{c.max_kv_length} exceeds max_model_len={max_model_len}")
    order = sorted(range(len(grid.contexts)), key=lambda j: grid.contexts[j].min_kv_length)
    for a, b in zip(order, order[1:]):
        ca, cb = grid.contexts[a], grid.contexts[b]
        if ca.overlaps(cb):
            first, second = sorted((a, b))
            c1, c2 = grid.contexts[first], grid.contexts[second]
            raise CalibrationError(
                source, f"contexts[{second}]",
                f"overlaps contexts[{first}] (kv {c2.min_kv_length}..{c2.max_kv_length} vs "
                f"{c1.min_kv_length}..{c1.max_kv_length})",
            )


def _check_connected(grid: CalibrationGrid, source: str) -> None:
    """The additive model separates alpha(B) from theta(G) only when the (B, G) points are
    connected through shared G values."""
    by_b = {b: [b * (w + 1) for w in grid.widths_for(b)] for b in grid.request_buckets}
    groups = request_components(by_b)
    if len(groups) > 1:
        parts = " | ".join(
            "B " + ",".join(str(b) for b in sorted(g)) + " (G "
            + ",".join(str(x) for x in sorted({r for b in g for r in by_b[b]})) + ")"
            for g in groups
        )
        raise CalibrationError(
            source, "target_graph_rows",
            f"the additive grid is not connected through a shared G: {parts}; add target rows "
            f"that two groups share, or use cost_model 'sps'",
        )


# --------------------------------------------------------------------------- engine checks


def check_engine_limits(
    grid: CalibrationGrid,
    *,
    source: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    kv_capacity_tokens: int,
    block_size: int = 1,
    graph_buckets: Sequence[int] | None = None,
) -> None:
    """The checks that need the engine's limits (run at start, before ready): every request
    bucket within ``max_num_seqs``, every G within ``max_num_batched_tokens``, every
    context within ``max_model_len``, the largest bucket's KV need, ``B x (prefill +
    worst-case progress)`` rounded up to whole blocks, within the KV cache, and on a
    graph-capable host (``graph_buckets`` = the captured sizes) every B and G captured."""
    captured = None if graph_buckets is None else set(graph_buckets)
    for i, b in enumerate(grid.request_buckets):
        if b > max_num_seqs:
            raise CalibrationError(source, f"request_buckets[{i}]",
                                   f"B={b} exceeds the engine's max_num_seqs={max_num_seqs}: it cannot run")
        if captured is not None and b not in captured:
            raise CalibrationError(source, f"request_buckets[{i}]",
                                   f"B={b} is not a captured graph size {sorted(captured)}")
    for i, g in enumerate(grid.target_graph_rows):
        if captured is not None and g not in captured:
            raise CalibrationError(source, f"target_graph_rows[{i}]",
                                   f"G={g} is not a captured graph size {sorted(captured)}")
        if g > max_num_batched_tokens:
            raise CalibrationError(
                source, f"target_graph_rows[{i}]",
                f"G={g} exceeds the engine's max_num_batched_tokens={max_num_batched_tokens}: it cannot run",
            )
    bmax = max(grid.request_buckets)
    block = max(1, int(block_size))
    for i, c in enumerate(grid.contexts):
        if c.max_kv_length > max_model_len:
            raise CalibrationError(source, f"contexts[{i}].max_kv_length",
                                   f"{c.max_kv_length} exceeds the engine's max_model_len={max_model_len}")
        per_request = -(-grid.kv_needed(c) // block) * block
        need = bmax * per_request
        if need > kv_capacity_tokens:
            raise CalibrationError(
                source, f"contexts[{i}]",
                f"B={bmax} requests x {per_request} KV tokens (prefill {c.prefill_tokens} + "
                f"progress {grid.progress_tokens}) = {need} exceed the KV cache capacity of "
                f"{kv_capacity_tokens} tokens",
            )


def check_cost_table(
    path: str | pathlib.Path,
    *,
    draft_width: int,
    running: Mapping[str, Any] | None = None,
) -> CostTable:
    """Load a saved cost table (:meth:`CostTable.load`) and check that it fits: its
    ``draft_width`` equals the running width, then :meth:`CostTable.check_compatible`
    against ``running`` when given. Returns the :class:`CostTable`; errors are one
    :class:`CalibrationError` naming the file and the field."""
    try:
        table = CostTable.load(path)
    except CostTableError as exc:
        raise CalibrationError(str(exc)) from None
    except UnicodeDecodeError:
        raise CalibrationError(f"cost table {path}: field '<file>': not UTF-8 text") from None
    if table.draft_width != draft_width:
        raise CalibrationError(
            f"cost table {path}: field 'draft_width': table has {table.draft_width} but the "
            f"running width is {draft_width} (--gamma = num_speculative_tokens); costs of "
            f"different widths cannot be mixed"
        )
    if running is not None:
        try:
            table.check_compatible(dict(running))
        except CostTableError as exc:
            raise CalibrationError(str(exc)) from None
    return table
