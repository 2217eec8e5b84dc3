"""Full-step cost models and the saved cost table (the DSpark calibration format).

Two models describe what one complete decode step costs (draft + verify + commit; never
add the draft time on top of them again):

* ``sps``: steps per second by physical target rows ``G`` (verify tokens in the step,
  padded up to a captured bucket); the step costs ``1000 / SPS(G)`` ms.
* ``additive``: ``bias + alpha(Bcap) + theta(G)`` seconds, where ``Bcap`` is the physical
  request bucket (not the logical concurrency) and ``G`` the target-row bucket.

Both are fitted by least squares with non-negative coefficients (:func:`nnls`). A
:class:`CostTable` carries a model plus what it was measured on (draft width, model,
dtype/quantisation, parallel and execution settings, host version) and refuses to load
when malformed or when it does not match the running configuration.

Pure Python + numpy; imports only the leaf modules :mod:`~vllm_hust_vspec.errors` and
:mod:`~vllm_hust_vspec.checks` of ours.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_hust_vspec import checks
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.fileio import write_atomic

TABLE_FORMAT = "vspec-cost-table"
TABLE_VERSION = 1
LEGACY_DRAFT_WIDTH = 7
COST_MODELS = ("additive", "sps")
METADATA_FIELDS = ("model_id", "dtype", "quantization", "parallel", "execution", "host_version")
_TOP_LEVEL_KEYS = {
    "format",
    "version",
    "cost_model",
    "draft_width",
    "buckets",
    "additive",
    "sps",
    "calibration",
    *METADATA_FIELDS,
}


class CostTableError(VspecError, ValueError):
    """A cost table is malformed or does not fit the running configuration:
    ``CostTableError(source, field, message)`` reads
    ``"cost table <source>: field '<field>': <message>"``."""

    def render(self) -> str:
        if self.field is None:
            return self.message
        where = f"cost table {self.source}: " if self.source else "cost table: "
        return f"{where}field '{self.field}': {self.message}"


# --------------------------------------------------------------------------- NNLS


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Non-negative least squares ``min ||a x - b||, x >= 0`` (Lawson-Hanson active set).

    Columns are scaled to unit norm internally for conditioning; all-zero columns get 0.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(f"nnls: shapes {a.shape} and {b.shape} do not match")
    m, n = a.shape
    norms = np.linalg.norm(a, axis=0)
    live = norms > 0
    scale = np.where(live, norms, 1.0)
    a_s = a / scale
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10.0 * np.finfo(float).eps * max(m, n) * max(1.0, float(np.abs(a_s).sum(axis=0).max(initial=0)))
    limit = max_iter if max_iter is not None else 3 * n + 10
    w = a_s.T @ (b - a_s @ x)
    for _ in range(limit):
        candidates = (~passive) & live & (w > tol)
        if not candidates.any():
            break
        j = int(np.argmax(np.where(candidates, w, -np.inf)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a_s[:, passive], b, rcond=None)[0]
            if np.all(z[passive] > tol):
                x = z
                break
            neg = passive & (z <= tol)
            step = np.min(x[neg] / np.maximum(x[neg] - z[neg], np.finfo(float).tiny))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                break
        w = a_s.T @ (b - a_s @ x)
    return np.where(live, x / scale, 0.0)


# --------------------------------------------------------------------------- models


def _bucket(value: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= value (graphs are padded up), or None when none covers it."""
    for bucket in buckets:
        if bucket >= value:
            return bucket
    return None


@dataclass(frozen=True)
class SpsModel:
    """Steps per second by target-row bucket G."""

    sps: Mapping[int, float]

    @property
    def target_rows(self) -> tuple[int, ...]:
        return tuple(sorted(self.sps))

    def covers(self, batch: int, target_rows: int) -> bool:
        return _bucket(target_rows, self.target_rows) is not None

    def step_ms(self, batch: int, target_rows: int) -> float:
        g = _bucket(target_rows, self.target_rows)
        if g is None:
            raise ValueError(f"target rows {target_rows} exceed the largest calibrated bucket {self.target_rows[-1]}")
        return 1000.0 / self.sps[g]

    def step_ms_many(self, batch: int, target_rows: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`step_ms`; ``inf`` where no bucket covers the rows."""
        rows = self.target_rows
        ms = np.array([1000.0 / self.sps[g] for g in rows] + [np.inf])
        return ms[np.searchsorted(np.asarray(rows), target_rows, side="left")]

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, int, float]]) -> SpsModel:
        """Fit from ``(batch, target_rows, step_seconds)``: per G, SPS = 1 / mean step time
        (the least-squares constant for each bucket)."""
        by_g: dict[int, list[float]] = {}
        for _, g, sec in _checked_samples(samples):
            by_g.setdefault(g, []).append(sec)
        if not by_g:
            raise ValueError("sps fit needs at least one sample")
        return cls({g: 1.0 / float(np.mean(v)) for g, v in sorted(by_g.items())})


@dataclass(frozen=True)
class AdditiveModel:
    """``bias + alpha(Bcap) + theta(G)`` seconds per full step."""

    bias_s: float
    alpha_s: Mapping[int, float]
    theta_s: Mapping[int, float]

    @property
    def requests(self) -> tuple[int, ...]:
        return tuple(sorted(self.alpha_s))

    @property
    def target_rows(self) -> tuple[int, ...]:
        return tuple(sorted(self.theta_s))

    def covers(self, batch: int, target_rows: int) -> bool:
        return _bucket(batch, self.requests) is not None and _bucket(target_rows, self.target_rows) is not None

    def step_ms(self, batch: int, target_rows: int) -> float:
        b = _bucket(batch, self.requests)
        g = _bucket(target_rows, self.target_rows)
        if b is None or g is None:
            raise ValueError(
                f"(batch {batch}, target rows {target_rows}) is outside the calibrated buckets "
                f"requests={list(self.requests)} target_rows={list(self.target_rows)}"
            )
        return 1000.0 * (self.bias_s + self.alpha_s[b] + self.theta_s[g])

    def step_ms_many(self, batch: int, target_rows: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`step_ms`; ``inf`` where no bucket covers (batch, rows)."""
        b = _bucket(batch, self.requests)
        rows = self.target_rows
        if b is None:
            return np.full(np.shape(target_rows), np.inf)
        base = self.bias_s + self.alpha_s[b]
        ms = np.array([1000.0 * (base + self.theta_s[g]) for g in rows] + [np.inf])
        return ms[np.searchsorted(np.asarray(rows), target_rows, side="left")]

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, int, float]]) -> AdditiveModel:
        """Non-negative least squares over ``(Bcap, G, step_seconds)`` samples.

        The smallest request bucket and the smallest target-row bucket are the references
        (``alpha = theta = 0`` there), which makes the model identifiable; the (B, G) grid
        must be connected through shared G values, otherwise alpha and theta cannot be
        separated and the fit is refused.
        """
        rows = list(_checked_samples(samples))
        if not rows:
            raise ValueError("additive fit needs samples")
        bs = sorted({b for b, _, _ in rows})
        gs = sorted({g for _, g, _ in rows})
        _require_connected(rows)
        b_col = {b: i for i, b in enumerate(bs[1:], start=1)}
        g_col = {g: i for i, g in enumerate(gs[1:], start=len(bs))}
        n = len(bs) + len(gs) - 1
        if len(rows) < n:
            raise ValueError(f"additive fit needs at least {n} samples for {len(bs)} request and {len(gs)} row buckets, got {len(rows)}")
        a = np.zeros((len(rows), n))
        y = np.zeros(len(rows))
        for r, (b, g, sec) in enumerate(rows):
            a[r, 0] = 1.0
            if b in b_col:
                a[r, b_col[b]] = 1.0
            if g in g_col:
                a[r, g_col[g]] = 1.0
            y[r] = sec
        if np.linalg.matrix_rank(a) < n:
            raise ValueError("additive fit: the sample grid is rank-deficient")
        x = nnls(a, y)
        alpha = {bs[0]: 0.0, **{b: float(x[i]) for b, i in b_col.items()}}
        theta = {gs[0]: 0.0, **{g: float(x[i]) for g, i in g_col.items()}}
        return cls(float(x[0]), alpha, theta)


def _checked_samples(samples: Iterable[tuple[int, int, float]]) -> Iterable[tuple[int, int, float]]:
    for i, sample in enumerate(samples):
        try:
            b, g, sec = sample
        except (TypeError, ValueError):
            raise ValueError(f"sample {i}: expected (batch, target_rows, step_seconds), got {sample!r}") from None
        if int(b) != b or int(g) != g or b < 1 or g < b:
            raise ValueError(f"sample {i}: batch {b} and target rows {g} must be integers with 1 <= batch <= target_rows")
        if not math.isfinite(sec) or sec <= 0:
            raise ValueError(f"sample {i}: step time {sec} s must be positive")
        yield int(b), int(g), float(sec)


def request_components(by_b: Mapping[int, Iterable[int]]) -> list[set[int]]:
    """Request buckets grouped by connectivity through shared target-row buckets G
    (union-find over the bipartite B-G graph; ``by_b``: B -> its G values), the group of
    the smallest B first.  The additive model separates alpha(B) from theta(G) only when
    there is one group."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(x: tuple[str, int]) -> tuple[str, int]:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for b, gs in by_b.items():
        find(("b", b))
        for g in gs:
            parent[find(("b", b))] = find(("g", g))
    groups: dict[tuple[str, int], set[int]] = {}
    for b in sorted(by_b):
        groups.setdefault(find(("b", b)), set()).add(b)
    return sorted(groups.values(), key=min)


def _require_connected(rows: Sequence[tuple[int, int, float]]) -> None:
    """The bipartite (request bucket, row bucket) graph of the samples must be connected."""
    by_b: dict[int, list[int]] = {}
    for b, g, _ in rows:
        by_b.setdefault(b, []).append(g)
    if len(request_components(by_b)) > 1:
        raise ValueError("additive fit: the (request bucket, target rows) grid is not connected through shared G values")


# --------------------------------------------------------------------------- table


@dataclass(frozen=True)
class CostTable:
    """A fitted full-step cost model plus what it was measured on."""

    cost_model: str
    model: AdditiveModel | SpsModel
    draft_width: int = LEGACY_DRAFT_WIDTH
    request_buckets: tuple[int, ...] = ()
    target_rows: tuple[int, ...] = ()
    model_id: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    parallel: Mapping[str, Any] = field(default_factory=dict)
    execution: Mapping[str, Any] = field(default_factory=dict)
    host_version: str | None = None
    calibration: Mapping[str, Any] | None = None
    source: str | None = None

    # ---- use

    def covers(self, batch: int, target_rows: int) -> bool:
        return self.model.covers(batch, target_rows)

    def step_ms(self, batch: int, target_rows: int) -> float:
        """Cost of one full step with ``batch`` requests and ``target_rows`` verify tokens."""
        return self.model.step_ms(batch, target_rows)

    def step_ms_many(self, batch: int, target_rows: np.ndarray) -> np.ndarray:
        """:meth:`step_ms` for many row counts at once; ``inf`` outside the calibrated buckets."""
        return self.model.step_ms_many(batch, np.asarray(target_rows))

    def predict(self, batch: int, verify_tokens: int, draft_passes: int) -> float | None:
        """The step-cost protocol (:class:`~.stepcost.StepCost`): :meth:`step_ms`, None outside
        the calibrated buckets.  A full-step cost: the drafter passes do not change it (the
        table is measured with the drafter at its full ``draft_width``)."""
        if not self.model.covers(batch, verify_tokens):
            return None
        return self.model.step_ms(batch, verify_tokens)

    def predict_grid(self, batch: int, verify_tokens: np.ndarray, draft_passes: np.ndarray) -> np.ndarray:
        """:meth:`predict` for arrays of candidates (:meth:`step_ms_many`; ``inf`` outside the
        calibrated buckets)."""
        ms = self.step_ms_many(batch, verify_tokens)
        shape = np.broadcast_shapes(ms.shape, np.shape(draft_passes))
        return ms if ms.shape == shape else np.broadcast_to(ms, shape)

    def check_compatible(self, running: Mapping[str, Any]) -> None:
        """Raise :class:`CostTableError` naming the first field that differs from ``running``.

        ``running`` holds any of ``draft_width``, ``model_id``, ``dtype``, ``quantization``,
        ``parallel`` (dict), ``execution`` (dict), ``host_version``; only the given keys are
        compared. Host versions must agree on major.minor; dicts are compared key by key
        (a key the table does not record is an incompatibility).
        """
        known = {"draft_width", *METADATA_FIELDS}
        unknown = sorted(set(running) - known)
        if unknown:
            raise ValueError(f"check_compatible: unknown running-configuration key(s) {unknown}; known: {sorted(known)}")
        for key in ("draft_width", "model_id", "dtype", "quantization"):
            if key in running and running[key] != getattr(self, key):
                raise CostTableError(
                    self.source, key, f"table has {getattr(self, key)!r} but the running configuration has {running[key]!r}"
                )
        for key in ("parallel", "execution"):
            if key not in running:
                continue
            mine = getattr(self, key)
            for sub, value in sorted(dict(running[key]).items()):
                if sub not in mine:
                    raise CostTableError(self.source, f"{key}.{sub}", f"not recorded in the table (running: {value!r})")
                if mine[sub] != value:
                    raise CostTableError(
                        self.source, f"{key}.{sub}", f"table has {mine[sub]!r} but the running configuration has {value!r}"
                    )
        if "host_version" in running:
            if _major_minor(self.host_version) != _major_minor(running["host_version"]):
                raise CostTableError(
                    self.source,
                    "host_version",
                    f"table measured on {self.host_version!r}, running {running['host_version']!r} (major.minor must match)",
                )

    # ---- JSON

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": TABLE_FORMAT,
            "version": TABLE_VERSION,
            "cost_model": self.cost_model,
            "draft_width": self.draft_width,
            "buckets": {"requests": list(self.request_buckets), "target_rows": list(self.target_rows)},
            "model_id": self.model_id,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "parallel": dict(self.parallel),
            "execution": dict(self.execution),
            "host_version": self.host_version,
        }
        if isinstance(self.model, AdditiveModel):
            doc["additive"] = {
                "bias_s": self.model.bias_s,
                "alpha_s": {str(k): v for k, v in sorted(self.model.alpha_s.items())},
                "theta_s": {str(k): v for k, v in sorted(self.model.theta_s.items())},
            }
        else:
            doc["sps"] = {str(k): v for k, v in sorted(self.model.sps.items())}
        if self.calibration is not None:
            doc["calibration"] = dict(self.calibration)
        return doc

    def save(self, path: str | pathlib.Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> CostTable:
        source = str(path)
        try:
            doc = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise CostTableError(source, "<file>", f"cannot read: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise CostTableError(source, "<json>", f"invalid JSON at line {exc.lineno}: {exc.msg}") from None
        except UnicodeDecodeError as exc:
            raise CostTableError(source, "<file>", checks.not_utf8(exc)) from None
        except checks.PARSER_LIMITS as exc:
            raise CostTableError(source, "<json>", f"invalid JSON: {checks.parser_limit(exc)}") from None
        return cls.from_dict(doc, source=source)

    @classmethod
    def from_dict(cls, doc: Any, source: str | None = None) -> CostTable:
        _check_header(doc, source)
        cost_model = doc.get("cost_model")
        width = doc.get("draft_width", LEGACY_DRAFT_WIDTH)
        buckets = doc.get("buckets")
        if not isinstance(buckets, dict) or set(buckets) - {"requests", "target_rows"}:
            raise CostTableError(source, "buckets", "must be an object with 'requests' and 'target_rows' lists")
        req_b = _int_list(buckets.get("requests", []), "buckets.requests", source)
        row_b = _int_list(buckets.get("target_rows", []), "buckets.target_rows", source)
        _check_metadata(doc, source)
        model: AdditiveModel | SpsModel
        if cost_model == "additive":
            model = _additive_from_dict(doc, req_b, row_b, source)
            req_b, row_b = list(model.requests), list(model.target_rows)
        else:
            model = _sps_from_dict(doc, row_b, source)
            row_b = list(model.target_rows)
        calibration = doc.get("calibration")
        if calibration is not None:
            checks.mapping(calibration, source, "calibration", error=CostTableError)
        return cls(
            cost_model=cost_model,
            model=model,
            draft_width=int(width),
            request_buckets=tuple(req_b),
            target_rows=tuple(row_b),
            model_id=doc["model_id"],
            dtype=doc["dtype"],
            quantization=doc.get("quantization"),
            parallel=dict(doc["parallel"]),
            execution=dict(doc["execution"]),
            host_version=doc["host_version"],
            calibration=calibration,
            source=source,
        )

    @classmethod
    def fit(
        cls,
        cost_model: str,
        samples: Iterable[tuple[int, int, float]],
        *,
        draft_width: int,
        **metadata: Any,
    ) -> CostTable:
        """Fit ``cost_model`` from ``(batch_bucket, target_rows, step_seconds)`` samples."""
        if cost_model not in COST_MODELS:
            raise ValueError(f"cost_model must be one of {list(COST_MODELS)}, got {cost_model!r}")
        rows = list(samples)
        model: AdditiveModel | SpsModel = AdditiveModel.fit(rows) if cost_model == "additive" else SpsModel.fit(rows)
        req_b = model.requests if isinstance(model, AdditiveModel) else tuple(sorted({int(b) for b, _, _ in rows}))
        unknown = sorted(set(metadata) - {*METADATA_FIELDS, "calibration"})
        if unknown:
            raise ValueError(f"CostTable.fit: unknown metadata {unknown}")
        return cls(
            cost_model=cost_model,
            model=model,
            draft_width=draft_width,
            request_buckets=tuple(req_b),
            target_rows=model.target_rows,
            **metadata,
        )


def _major_minor(version: str | None) -> tuple[str, ...] | None:
    if version is None:
        return None
    return tuple(str(version).split("+")[0].split(".")[:2])


def _check_header(doc: Any, source: str | None) -> None:
    """Root object, known keys, format, version, cost model and draft width."""
    checks.mapping(doc, source, "<root>", what="a JSON object", error=CostTableError)
    unknown = sorted(set(doc) - _TOP_LEVEL_KEYS)
    if unknown:
        raise CostTableError(source, unknown[0], f"unknown field (known: {sorted(_TOP_LEVEL_KEYS)})")
    if "format" in doc and doc["format"] != TABLE_FORMAT:
        raise CostTableError(source, "format", f"must be {TABLE_FORMAT!r}, got {doc['format']!r}")
    if "version" in doc and doc["version"] != TABLE_VERSION:
        raise CostTableError(source, "version", f"unsupported version {doc['version']!r} (this build reads {TABLE_VERSION})")
    if doc.get("cost_model") not in COST_MODELS:
        raise CostTableError(source, "cost_model", f"must be one of {list(COST_MODELS)}, got {doc.get('cost_model')!r}")
    checks.integer(doc.get("draft_width", LEGACY_DRAFT_WIDTH), source, "draft_width", minimum=1, error=CostTableError)


def _check_metadata(doc: Mapping[str, Any], source: str | None) -> None:
    """What the table was measured on: model, dtype, quantisation, parallel, execution, host."""
    for key in ("model_id", "dtype", "host_version"):
        if key not in doc:
            raise CostTableError(source, key, "missing (the table must record what it was measured on)")
    for key in ("model_id", "dtype", "host_version", "quantization"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise CostTableError(source, key, f"must be a string or null, got {doc[key]!r}")
    for key in ("parallel", "execution"):
        if key not in doc or not isinstance(doc[key], dict):
            raise CostTableError(source, key, "missing or not an object")


def _additive_from_dict(doc: Mapping[str, Any], req_b: list[int], row_b: list[int], source: str | None) -> AdditiveModel:
    if "sps" in doc:
        raise CostTableError(source, "sps", "present in an additive table")
    add = doc.get("additive")
    if not isinstance(add, dict) or set(add) != {"bias_s", "alpha_s", "theta_s"}:
        raise CostTableError(source, "additive", "must be an object with exactly bias_s, alpha_s, theta_s")
    bias = _nonneg(add["bias_s"], "additive.bias_s", source)
    alpha = _bucket_map(add["alpha_s"], "additive.alpha_s", source, positive=False)
    theta = _bucket_map(add["theta_s"], "additive.theta_s", source, positive=False)
    if req_b and sorted(alpha) != req_b:
        raise CostTableError(source, "additive.alpha_s", f"keys {sorted(alpha)} differ from buckets.requests {req_b}")
    if row_b and sorted(theta) != row_b:
        raise CostTableError(source, "additive.theta_s", f"keys {sorted(theta)} differ from buckets.target_rows {row_b}")
    return AdditiveModel(bias, alpha, theta)


def _sps_from_dict(doc: Mapping[str, Any], row_b: list[int], source: str | None) -> SpsModel:
    if "additive" in doc:
        raise CostTableError(source, "additive", "present in an sps table")
    sps = _bucket_map(doc.get("sps"), "sps", source, positive=True)
    if row_b and sorted(sps) != row_b:
        raise CostTableError(source, "sps", f"keys {sorted(sps)} differ from buckets.target_rows {row_b}")
    return SpsModel(sps)


def _int_list(values: Any, name: str, source: str | None) -> list[int]:
    """A bucket list: positive integers, strictly increasing (may be empty: the model's
    keys are the buckets then)."""
    return checks.int_list(values, source, name, minimum=1, nonempty=False, error=CostTableError)


def _nonneg(value: Any, name: str, source: str | None) -> float:
    return checks.number(value, source, name, minimum=0, error=CostTableError)


def _bucket_map(values: Any, name: str, source: str | None, positive: bool) -> dict[int, float]:
    checks.mapping(values, source, name, nonempty=True, what="a non-empty object keyed by bucket size",
                   error=CostTableError)
    out: dict[int, float] = {}
    for key, value in values.items():
        bucket = checks.decimal_key(key)
        if bucket is None or bucket < 1:
            raise CostTableError(source, f"{name}.{key}", "bucket keys must be positive integers")
        number = _nonneg(value, f"{name}.{key}", source)
        if positive and number <= 0:
            raise CostTableError(source, f"{name}.{key}", f"must be > 0, got {value!r}")
        out[bucket] = number
    return out
