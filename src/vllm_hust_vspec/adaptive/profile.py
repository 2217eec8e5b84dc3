"""Offline latency profiles: the ``profile`` policy's step-cost model and its fit.

Per component (``target``, ``draft``) one forward costs
``latency_ms = alpha * context_tokens + gamma * batched_tokens + delta_ms``
(``context_tokens``: KV tokens the batch attends over, summed over requests;
``batched_tokens``: tokens in the forward). Coefficients are non-negative and fitted by
non-negative least squares from measured samples (:func:`fit_profile`).

Formats (see ``docs/formats.md``):

* profile, ``schema_version`` 2 (written here): ``{"format": "vspec-profile",
  "schema_version": 2, "target": {"alpha", "gamma", "delta_ms"}, "draft": {...},
  "draft_parallel", ...optional pass-through keys..., "fit": {...}}``;
* profile, ``schema_version`` 1 (the earlier public release; still loads): coefficient keys
  ``alpha``/``gamma``/``delta_ms`` or ``alpha_ms_per_context_token``/
  ``gamma_ms_per_batched_token``/``delta_ms``, ``max_speculative_tokens`` required;
* samples (input of ``vllm-hust-vspec-fit-profile``): ``{"target_samples": [{"context_tokens",
  "batched_tokens", "latency_ms"}, ...], "draft_samples": [...], ...pass-through keys}``.

Pure Python + numpy; imports only :mod:`.costmodel` (for NNLS) and the leaf modules
:mod:`~vllm_hust_vspec.checks` and :mod:`~vllm_hust_vspec.errors`.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_hust_vspec.checks import PARSER_LIMITS, decimal_key, is_int, is_number, not_utf8, parser_limit
from vllm_hust_vspec.errors import KeyedError
from vllm_hust_vspec.fileio import write_atomic

from .costmodel import nnls

PROFILE_FORMAT = "vspec-profile"
SCHEMA_VERSION = 2
LEGACY_SCHEMA_VERSION = 1
COMPONENTS = ("target", "draft")
MIN_SAMPLES = 3
_PASS_THROUGH = (
    "max_speculative_tokens",
    "initial_gamma",
    "default_acceptance_rate",
    "draft_parallel",
    "per_gamma_overhead_ms",
    "batch_gamma_policy",
)
_PROFILE_KEYS = {"format", "schema_version", "target", "draft", "fit", *_PASS_THROUGH}
_SAMPLES_KEYS = {"target_samples", "draft_samples", *_PASS_THROUGH}
_LEGACY_COEFF_NAMES = {
    "alpha": ("alpha", "alpha_ms_per_context_token"),
    "gamma": ("gamma", "gamma_ms_per_batched_token"),
    "delta_ms": ("delta_ms",),
}


class ProfileError(KeyedError, ValueError):
    """A profile or a samples file is malformed; the message names the file and key:
    ``ProfileError(source, key, message)`` reads ``"<source>: key '<key>' <message>"``."""


@dataclass(frozen=True)
class LatencyModel:
    """``alpha * context_tokens + gamma * batched_tokens + delta_ms`` (ms)."""

    alpha: float
    gamma: float
    delta_ms: float

    def predict(self, context_tokens: float, batched_tokens: float) -> float:
        return self.alpha * context_tokens + self.gamma * batched_tokens + self.delta_ms

    def to_dict(self) -> dict[str, float]:
        return {"alpha": self.alpha, "gamma": self.gamma, "delta_ms": self.delta_ms}


@dataclass(frozen=True)
class Profile:
    """A latency profile (target and draft forward models plus optional hints)."""

    target: LatencyModel
    draft: LatencyModel
    draft_parallel: bool = False
    max_speculative_tokens: int | None = None
    initial_gamma: int | None = None
    default_acceptance_rate: float | None = None
    per_gamma_overhead_ms: Mapping[int, float] = field(default_factory=dict)
    batch_gamma_policy: Mapping[int, int] = field(default_factory=dict)
    fit: Mapping[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def step_ms(
        self,
        batch: int,
        k: int,
        context_tokens: float = 0.0,
        batched_tokens: int | None = None,
        draft_steps: int | None = None,
    ) -> float:
        """Predicted step time: ``draft_steps`` serial draft forwards over ``batch`` rows (or
        one parallel forward over the verify tokens) plus the target forward over
        ``batched_tokens`` (default ``batch * (k + 1)``) plus the per-K overhead."""
        tokens = batch * (k + 1) if batched_tokens is None else batched_tokens
        steps = k if draft_steps is None else draft_steps
        total = self.target.predict(context_tokens, tokens) + self.per_gamma_overhead_ms.get(k, 0.0)
        if self.draft_parallel:
            if steps > 0:
                total += self.draft.predict(context_tokens, tokens)
        else:
            d = self.draft
            # sum_{i<steps} alpha*(ctx + i*B) + gamma*B + delta
            total += steps * (d.alpha * context_tokens + d.gamma * batch + d.delta_ms)
            total += d.alpha * batch * steps * (steps - 1) / 2.0
        return total

    def predict(self, batch: int, verify_tokens: int, draft_passes: int) -> float:
        """The step-cost protocol (:class:`~.stepcost.StepCost`): :meth:`step_ms` with no
        context, ``verify_tokens`` batched target tokens and ``draft_passes`` drafter passes
        (also the K of ``per_gamma_overhead_ms``: a profile's drafter runs K passes)."""
        return self.step_ms(batch, draft_passes, batched_tokens=verify_tokens, draft_steps=draft_passes)

    def preferred_gamma(self, batch: int) -> int | None:
        """The ``batch_gamma_policy`` entry for ``batch`` (smallest key >= batch, else the last)."""
        if not self.batch_gamma_policy:
            return None
        keys = sorted(self.batch_gamma_policy)
        for key in keys:
            if key >= batch:
                return self.batch_gamma_policy[key]
        return self.batch_gamma_policy[keys[-1]]

    # ---- JSON

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": PROFILE_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "target": self.target.to_dict(),
            "draft": self.draft.to_dict(),
            "draft_parallel": self.draft_parallel,
        }
        if self.max_speculative_tokens is not None:
            doc["max_speculative_tokens"] = self.max_speculative_tokens
        if self.initial_gamma is not None:
            doc["initial_gamma"] = self.initial_gamma
        if self.default_acceptance_rate is not None:
            doc["default_acceptance_rate"] = self.default_acceptance_rate
        if self.per_gamma_overhead_ms:
            doc["per_gamma_overhead_ms"] = {str(k): v for k, v in sorted(self.per_gamma_overhead_ms.items())}
        if self.batch_gamma_policy:
            doc["batch_gamma_policy"] = {str(k): v for k, v in sorted(self.batch_gamma_policy.items())}
        if self.fit is not None:
            doc["fit"] = dict(self.fit)
        return doc

    def save(self, path: str | pathlib.Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


# --------------------------------------------------------------------------- loading


def load_profile(path: str | pathlib.Path) -> Profile:
    """Load and validate a profile file (schema_version 2, or 1 from the earlier release)."""
    return profile_from_dict(_read_json(path, "profile"), source=str(path))


def profile_from_dict(doc: Any, source: str = "<profile>") -> Profile:
    if not isinstance(doc, dict):
        raise ProfileError(f"profile {source}: the root must be a JSON object")
    version = doc.get("schema_version", LEGACY_SCHEMA_VERSION)
    if version not in (LEGACY_SCHEMA_VERSION, SCHEMA_VERSION) or isinstance(version, bool):
        raise ProfileError(f"profile {source}: unsupported schema_version {version!r} (reads 1 and 2)")
    unknown = sorted(set(doc) - _PROFILE_KEYS)
    if unknown:
        raise ProfileError(f"profile {source}: unknown key {unknown[0]!r} (known: {sorted(_PROFILE_KEYS)})")
    if version == SCHEMA_VERSION and doc.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"profile {source}", "format", f"must be {PROFILE_FORMAT!r} in schema_version 2")
    if version == LEGACY_SCHEMA_VERSION and "max_speculative_tokens" not in doc:
        raise ProfileError(f"profile {source}", "max_speculative_tokens", "is required in schema_version 1")
    models = {}
    for comp in COMPONENTS:
        models[comp] = _coefficients(doc.get(comp), comp, source, legacy=version == LEGACY_SCHEMA_VERSION)
    if models["target"].predict(1, 1) <= 0:
        raise ProfileError(f"profile {source}", "target", "must give a positive forward latency")
    hints = _pass_through(doc, f"profile {source}")
    fit = doc.get("fit")
    if fit is not None and not isinstance(fit, dict):
        raise ProfileError(f"profile {source}", "fit", "must be an object")
    return Profile(models["target"], models["draft"], fit=fit, schema_version=int(version), **hints)


def _coefficients(obj: Any, comp: str, source: str, legacy: bool) -> LatencyModel:
    if not isinstance(obj, dict):
        raise ProfileError(f"profile {source}", comp, "must be an object with alpha, gamma, delta_ms")
    names = _LEGACY_COEFF_NAMES if legacy else {k: (k,) for k in _LEGACY_COEFF_NAMES}
    allowed = {n for group in names.values() for n in group}
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ProfileError(f"profile {source}: unknown key {comp + '.' + unknown[0]!r} (known: {sorted(allowed)})")
    values = {}
    for canonical, spellings in names.items():
        present = [s for s in spellings if s in obj]
        if len(present) != 1:
            raise ProfileError(f"profile {source}", f"{comp}.{canonical}", "must be given exactly once")
        value = obj[present[0]]
        if not is_number(value) or value < 0:
            raise ProfileError(f"profile {source}", f"{comp}.{present[0]}", f"must be a finite number >= 0, got {value!r}")
        values[canonical] = float(value)
    return LatencyModel(**values)


def _pass_through(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kmax = doc.get("max_speculative_tokens")
    if kmax is not None:
        if not is_int(kmax) or kmax < 1:
            raise ProfileError(where, "max_speculative_tokens", f"must be a positive integer, got {kmax!r}")
        out["max_speculative_tokens"] = kmax
    init = doc.get("initial_gamma")
    if init is not None:
        if not is_int(init) or init < 0 or (kmax is not None and init > kmax):
            raise ProfileError(where, "initial_gamma", f"must be an integer in 0..max_speculative_tokens, got {init!r}")
        out["initial_gamma"] = init
    rate = doc.get("default_acceptance_rate")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ProfileError(where, "default_acceptance_rate", f"must be in [0, 1], got {rate!r}")
        out["default_acceptance_rate"] = float(rate)
    par = doc.get("draft_parallel", False)
    if not isinstance(par, bool):
        raise ProfileError(where, "draft_parallel", f"must be true or false, got {par!r}")
    out["draft_parallel"] = par
    over = doc.get("per_gamma_overhead_ms")
    if over is not None:
        if not isinstance(over, dict):
            raise ProfileError(where, "per_gamma_overhead_ms", "must be an object K -> ms")
        parsed: dict[int, float] = {}
        for key, value in over.items():
            k = decimal_key(key)
            if k is None:
                raise ProfileError(where, f"per_gamma_overhead_ms.{key}", "must be a non-negative integer K")
            if not is_number(value) or value < 0:
                raise ProfileError(where, f"per_gamma_overhead_ms.{key}", f"must be a number >= 0, got {value!r}")
            parsed[k] = float(value)
        out["per_gamma_overhead_ms"] = parsed
    policy = doc.get("batch_gamma_policy")
    if policy is not None:
        if not isinstance(policy, dict):
            raise ProfileError(where, "batch_gamma_policy", "must be an object batch size -> K")
        parsed_p: dict[int, int] = {}
        for key, value in policy.items():
            b = decimal_key(key)
            if b is None or b < 1:
                raise ProfileError(where, f"batch_gamma_policy.{key}", "must be a positive integer batch size")
            if not is_int(value) or value < 0 or (kmax is not None and value > kmax):
                raise ProfileError(
                    f"{where}: key 'batch_gamma_policy.{key}' = {value!r} must be an integer in 0..max_speculative_tokens"
                )
            parsed_p[b] = value
        out["batch_gamma_policy"] = parsed_p
    return out


# --------------------------------------------------------------------------- fitting


def fit_latency_model(samples: Any, name: str) -> tuple[LatencyModel, dict[str, Any]]:
    """NNLS fit of one component from ``[{"context_tokens", "batched_tokens", "latency_ms"}]``.

    Refuses fewer than 3 samples, a rank-deficient design (the three regressors
    context_tokens, batched_tokens and the constant must be linearly independent over the
    samples) and negative or non-finite values. Returns the model and fit diagnostics.
    """
    if not isinstance(samples, list):
        raise ProfileError(f"samples: key '{name}' must be a list of samples")
    if len(samples) < MIN_SAMPLES:
        raise ProfileError(f"samples: key '{name}' has {len(samples)} sample(s); at least {MIN_SAMPLES} are needed")
    rows = np.zeros((len(samples), 3))
    y = np.zeros(len(samples))
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict) or set(sample) != {"context_tokens", "batched_tokens", "latency_ms"}:
            raise ProfileError(
                f"samples: {name}[{i}] must be an object with exactly context_tokens, batched_tokens, latency_ms"
            )
        for key in ("context_tokens", "batched_tokens", "latency_ms"):
            value = sample[key]
            if not is_number(value):
                raise ProfileError(f"samples: {name}[{i}].{key} must be a finite number, got {value!r}")
            if value < 0:
                raise ProfileError(f"samples: {name}[{i}].{key} must be >= 0, got {value!r}")
        rows[i] = (sample["context_tokens"], sample["batched_tokens"], 1.0)
        y[i] = sample["latency_ms"]
    scale = np.maximum(np.abs(rows).max(axis=0), 1e-12)
    if np.linalg.matrix_rank(rows / scale) < 3:
        raise ProfileError(
            f"samples: key '{name}' is rank-deficient: context_tokens, batched_tokens and a constant must be "
            "linearly independent over the samples (vary both context and batch)"
        )
    coef = nnls(rows, y)
    model = LatencyModel(float(coef[0]), float(coef[1]), float(coef[2]))
    resid = rows @ coef - y
    diag = {"samples": len(samples), "rmse_ms": float(np.sqrt(np.mean(resid**2)))}
    return model, diag


def fit_profile(samples_doc: Any, source: str = "<samples>") -> Profile:
    """Fit a :class:`Profile` from a samples document (see the module docstring)."""
    if not isinstance(samples_doc, dict):
        raise ProfileError(f"samples {source}: the root must be a JSON object")
    unknown = sorted(set(samples_doc) - _SAMPLES_KEYS)
    if unknown:
        raise ProfileError(f"samples {source}: unknown key {unknown[0]!r} (known: {sorted(_SAMPLES_KEYS)})")
    models = {}
    fit: dict[str, Any] = {}
    for comp in COMPONENTS:
        key = f"{comp}_samples"
        if key not in samples_doc:
            raise ProfileError(f"samples {source}", key, "is missing")
        try:
            models[comp], fit[comp] = fit_latency_model(samples_doc[key], key)
        except ProfileError as exc:
            raise ProfileError(f"{exc} ({source})") from None
    if models["target"].predict(1, 1) <= 0:
        raise ProfileError(f"samples {source}: the fitted target latency model is not positive")
    hints = _pass_through(samples_doc, f"samples {source}")
    return Profile(models["target"], models["draft"], fit=fit, **hints)


def samples_from_cost(
    predict_ms: Any,
    batches: Sequence[int],
    ks: Sequence[int],
    contexts: Sequence[int],
) -> dict[str, list[dict[str, float]]]:
    """Build a samples document from a callable ``predict_ms(component, batch, k, ctx)``.

    Used by the simulator to "measure" a profile on a trace's own cost model, the way the
    profiling tool measures a host.
    """
    out: dict[str, list[dict[str, float]]] = {"target_samples": [], "draft_samples": []}
    for b in batches:
        for k in ks:
            for c in contexts:
                out["target_samples"].append(
                    {"context_tokens": c, "batched_tokens": b * (k + 1), "latency_ms": predict_ms("target", b, k, c)}
                )
                out["draft_samples"].append(
                    {"context_tokens": c, "batched_tokens": b, "latency_ms": predict_ms("draft", b, k, c)}
                )
    return out


def _read_json(path: str | pathlib.Path, what: str) -> Any:
    try:
        return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{what} {path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{what} {path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{what} {path}: {not_utf8(exc)}") from None
    except PARSER_LIMITS as exc:
        raise ProfileError(f"{what} {path}: invalid JSON: {parser_limit(exc)}") from None


def load_samples(path: str | pathlib.Path) -> Any:
    return _read_json(path, "samples")
