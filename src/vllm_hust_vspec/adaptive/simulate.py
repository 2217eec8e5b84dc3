"""Trace-driven simulator and the expected-acceptance oracle.

A trace (JSON lines, ``docs/formats.md``) holds a header (``kmax``, ``max_num_seqs``, a
roofline step-cost formula, a noise seed) and one line per request with ``accept_len[t]``:
how many draft tokens would be accepted if drafting started at output position ``t``
(greedy, so independent of K), optionally the true conditional acceptance ``p[t]`` and a
draft confidence ``conf[t]`` per position.

Semantics (normative; any two implementations agree):

* a request's output length is ``len(accept_len)``; admission is FIFO by ``arrival_s``
  (ties: file order) at step boundaries, up to ``max_num_seqs`` running; when nothing runs
  the clock jumps to the next arrival;
* each step the policy picks ``K_i <= kmax`` for every running request; ``K = max K_i``,
  ``T = sum_i (1 + K_i)``, ``B`` the running count; step ms = ``bias + max(target_mem_ms,
  target_token_ms * T) + max(K, draft_min_steps) * max(draft_mem_ms, draft_token_ms * B)``
  times ``exp(N(0, noise^2))``, one draw per step from ``numpy.random.default_rng(seed)``
  (draw ``i`` belongs to step ``i`` whatever the policy);
* a request at position ``t`` advances by ``min(K_i, accept_len[t]) + 1``, truncated at its
  end; finished requests leave after the step; no prefill cost;
* goodput = committed tokens / busy time (the sum of step times).

The oracle picks, each step, the batch-uniform K maximising
``sum_i E_i(K) / cost(B, K)`` with ``E_i(K) = 1 + sum_{j<=K} prod_{m<=j} p_i[t][m]`` and the
noiseless cost, then realises it on the trace like any policy.

Pure Python + numpy. Policies run through :class:`~.controller.Controller`.
"""

from __future__ import annotations

import json
import math
import pathlib
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_hust_vspec.fileio import write_atomic

from .. import checks
from ..errors import KeyedError
from .observations import BatchView, StepResult, ki_array

TRACE_FORMAT = "vspec-trace"
TRACE_VERSION = 1
MAX_KMAX = 64
COST_KEYS = (
    "bias_ms",
    "target_mem_ms",
    "target_token_ms",
    "draft_mem_ms",
    "draft_token_ms",
    "draft_min_steps",
    "noise",
)
# optional cost keys (defaults: CostSpec's): the machine's speed drifting while it serves
DRIFT_KEYS = ("drift", "drift_steps")
_HEADER_KEYS = {"format", "version", "kmax", "max_num_seqs", "cost", "seed", "meta"}
_REQUEST_KEYS = {"id", "arrival_s", "accept_len", "p", "conf"}


class TraceError(KeyedError, ValueError):
    """A malformed trace; the message names the file, line and key:
    ``TraceError(where, key, message)`` reads ``"<file>:<line>: key '<key>' <message>"``."""


# --------------------------------------------------------------------------- trace model


@dataclass(frozen=True)
class CostSpec:
    """The header's roofline step-cost formula (all times in ms)."""

    bias_ms: float
    target_mem_ms: float
    target_token_ms: float
    draft_mem_ms: float
    draft_token_ms: float
    draft_min_steps: int = 0
    noise: float = 0.0
    drift: float = 0.0
    drift_steps: float = 500.0

    def speed_path(self, seed: int) -> Callable[[], float]:
        """The machine's speed factor, one call a step: ``exp(x)`` with ``x`` an AR(1)
        process of stationary sd ``drift`` and correlation time ``drift_steps`` steps,
        starting at 0, from its own stream (``default_rng((seed, 1))``: the same path, step
        by step, for every policy); 1 every step when ``drift`` is 0.  Why: on the CPU host
        a fixed K's step at one batch drifted by 8-15 % (sd) over a paired run against
        3.5-5 % from one step to the next, with slow spells of tens of seconds at a third
        above the usual time; a simulator without it cannot show what a stale price or a
        speed estimate stuck at a spell's level costs a policy."""
        if self.drift <= 0.0:
            return lambda: 1.0
        rng = np.random.default_rng((seed, 1))
        rho = math.exp(-1.0 / self.drift_steps)
        sd = self.drift * math.sqrt(1.0 - rho * rho)
        state = [0.0]

        def step() -> float:
            x = state[0]
            state[0] = rho * x + sd * float(rng.standard_normal())
            return math.exp(x)

        return step

    def step_ms(self, batch: int, k: int, verify_tokens: int) -> float:
        """Noiseless step time."""
        return (
            self.bias_ms
            + max(self.target_mem_ms, self.target_token_ms * verify_tokens)
            + max(k, self.draft_min_steps) * max(self.draft_mem_ms, self.draft_token_ms * batch)
        )

    def uniform_ms(self, batch: int, kmax: int) -> np.ndarray:
        """Noiseless step time for every request drafting K, for K = 0..kmax."""
        ks = np.arange(kmax + 1)
        return (
            self.bias_ms
            + np.maximum(self.target_mem_ms, self.target_token_ms * batch * (ks + 1))
            + np.maximum(ks, self.draft_min_steps) * max(self.draft_mem_ms, self.draft_token_ms * batch)
        )

    def predict(self, batch: int, verify_tokens: int, draft_passes: int) -> float:
        """The step-cost protocol (:class:`~.stepcost.StepCost`): the noiseless step time
        (fewer than ``draft_min_steps`` drafter passes are priced at ``draft_min_steps``: the
        host runs them anyway)."""
        return self.step_ms(batch, draft_passes, verify_tokens)

    def to_dict(self) -> dict[str, float | int]:
        doc = {key: getattr(self, key) for key in COST_KEYS}
        if self.drift > 0.0:
            doc.update({key: getattr(self, key) for key in DRIFT_KEYS})
        return doc


@dataclass(frozen=True)
class TraceHeader:
    kmax: int
    max_num_seqs: int
    cost: CostSpec
    seed: int = 0
    meta: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "kmax": self.kmax,
            "max_num_seqs": self.max_num_seqs,
            "cost": self.cost.to_dict(),
            "seed": self.seed,
        }
        if self.meta is not None:
            doc["meta"] = dict(self.meta)
        return doc


@dataclass(frozen=True)
class TraceRequest:
    id: str
    arrival_s: float
    accept_len: np.ndarray  # int, shape (n,)
    p: np.ndarray | None = None  # float, shape (n, kmax)
    conf: np.ndarray | None = None  # float, shape (n, kmax)

    def to_dict(self, decimals: int = 4) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "arrival_s": round(float(self.arrival_s), 6),
            "accept_len": [int(a) for a in self.accept_len],
        }
        if self.p is not None:
            doc["p"] = np.round(self.p, decimals).tolist()
        if self.conf is not None:
            doc["conf"] = np.round(self.conf, decimals).tolist()
        return doc


@dataclass(frozen=True)
class Trace:
    header: TraceHeader
    requests: tuple[TraceRequest, ...]
    source: str = "<trace>"

    @property
    def has_p(self) -> bool:
        return bool(self.requests) and all(r.p is not None for r in self.requests)

    @property
    def has_conf(self) -> bool:
        return bool(self.requests) and all(r.conf is not None for r in self.requests)


# --------------------------------------------------------------------------- reading


def read_trace(path: str | pathlib.Path) -> Trace:
    """Read and validate a trace file; raises :class:`TraceError` naming file:line and key."""
    source = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_trace(fh, source)
    except OSError as exc:
        raise TraceError(f"{source}: cannot read trace: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{source}: cannot read trace: {checks.not_utf8(exc, offset=False)}") from None


def parse_trace(lines: Iterable[str], source: str = "<trace>") -> Trace:
    header: TraceHeader | None = None
    requests: list[TraceRequest] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except checks.PARSER_LIMITS as exc:
            raise TraceError(f"{where}: not valid JSON ({checks.parser_limit(exc)})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: each line must be a JSON object")
        if header is None:
            header = _parse_header(obj, where)
            continue
        req = _parse_request(obj, where, header.kmax)
        if req.id in seen:
            raise TraceError(f"{where}: key 'id': duplicate request id {req.id!r}")
        seen.add(req.id)
        requests.append(req)
    if header is None:
        raise TraceError(f"{source}: empty trace (line 1 must be the vspec-trace header)")
    if not requests:
        raise TraceError(f"{source}: the trace has a header but no requests")
    return Trace(header, tuple(requests), source)


def _number(obj: Mapping[str, Any], key: str, where: str, *, minimum: float = 0.0) -> float:
    return checks.number(obj[key], where, key, minimum=minimum, error=TraceError)


def _integer(obj: Mapping[str, Any], key: str, where: str, lo: int, hi: int | None = None) -> int:
    return checks.integer(obj[key], where, key, minimum=lo, maximum=hi, error=TraceError)


def _check_keys(obj: Mapping[str, Any], where: str, kind: str, known: set[str],
                required: tuple[str, ...]) -> None:
    """Refuse unknown keys and missing required keys of a header or request line."""
    unknown = sorted(set(obj) - known)
    if unknown:
        raise TraceError(f"{where}: unknown {kind} key {unknown[0]!r} (known: {sorted(known)})")
    for key in required:
        if key not in obj:
            raise TraceError(f"{where}: {kind} key '{key}' is missing")


def _parse_header(obj: Mapping[str, Any], where: str) -> TraceHeader:
    if obj.get("format") != TRACE_FORMAT:
        raise TraceError(f"{where}: key 'format' must be {TRACE_FORMAT!r} on the header line, got {obj.get('format')!r}")
    if obj.get("version") != TRACE_VERSION:
        raise TraceError(f"{where}: key 'version': unsupported trace version {obj.get('version')!r} (reads {TRACE_VERSION})")
    _check_keys(obj, where, "header", _HEADER_KEYS, ("kmax", "max_num_seqs", "cost"))
    kmax = _integer(obj, "kmax", where, 1, MAX_KMAX)
    max_num_seqs = _integer(obj, "max_num_seqs", where, 1)
    seed = _integer(obj, "seed", where, 0) if "seed" in obj else 0
    cost = obj["cost"]
    if not isinstance(cost, dict):
        raise TraceError(f"{where}: header key 'cost' must be an object")
    cwhere = f"{where}: header 'cost'"
    unknown = sorted(set(cost) - set(COST_KEYS) - set(DRIFT_KEYS))
    if unknown:
        raise TraceError(f"{cwhere}: unknown key {unknown[0]!r} "
                         f"(known: {list(COST_KEYS) + list(DRIFT_KEYS)})")
    missing = [k for k in COST_KEYS if k not in cost]
    if missing:
        raise TraceError(f"{cwhere}: key '{missing[0]}' is missing")
    values = {k: _number(cost, k, cwhere) for k in COST_KEYS if k != "draft_min_steps"}
    dms = _integer(cost, "draft_min_steps", cwhere, 0, kmax)
    values.update({key: _number(cost, key, cwhere) for key in DRIFT_KEYS if key in cost})
    if values.get("drift_steps", CostSpec.drift_steps) < 1.0:
        raise TraceError(f"{cwhere}: key 'drift_steps' must be at least 1 step, "
                         f"got {values['drift_steps']!r}")
    spec = CostSpec(draft_min_steps=dms, **values)
    if spec.step_ms(1, 0, 1) <= 0:
        raise TraceError(f"{cwhere}: the step cost must be positive (all coefficients are 0)")
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise TraceError(f"{where}: header key 'meta' must be an object")
    return TraceHeader(kmax, max_num_seqs, spec, seed, meta)


def _matrix(value: Any, key: str, where: str, n: int, kmax: int) -> np.ndarray:
    if not isinstance(value, list) or len(value) != n:
        raise TraceError(f"{where}: key '{key}' must be a list of {n} rows (one per accept_len entry)")
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float range
        raise TraceError(f"{where}: key '{key}' must hold lists of {kmax} numbers") from None
    if arr.shape != (n, kmax):
        raise TraceError(f"{where}: key '{key}' must have shape [{n}][{kmax}] (kmax={kmax}), got {list(arr.shape)}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0 or arr.max() > 1:
        row = int(np.argwhere(~(np.isfinite(arr) & (arr >= 0) & (arr <= 1)))[0][0])
        raise TraceError(f"{where}: key '{key}[{row}]' has a value outside [0, 1]")
    return arr


def _parse_request(obj: Mapping[str, Any], where: str, kmax: int) -> TraceRequest:
    if "format" in obj:
        raise TraceError(f"{where}: a second header line (only line 1 is the header)")
    _check_keys(obj, where, "request", _REQUEST_KEYS, ("id", "arrival_s", "accept_len"))
    rid = obj["id"]
    if not isinstance(rid, str) or not rid:
        raise TraceError(f"{where}: key 'id' must be a non-empty string, got {rid!r}")
    arrival = _number(obj, "arrival_s", where)
    acc = obj["accept_len"]
    if not isinstance(acc, list) or not acc:
        raise TraceError(f"{where}: key 'accept_len' must be a non-empty list of integers 0..{kmax}")
    for t, a in enumerate(acc):
        if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a <= kmax:
            raise TraceError(f"{where}: key 'accept_len[{t}]' = {a!r} is out of range 0..{kmax} (kmax)")
    n = len(acc)
    p = _matrix(obj["p"], "p", where, n, kmax) if obj.get("p") is not None else None
    conf = _matrix(obj["conf"], "conf", where, n, kmax) if obj.get("conf") is not None else None
    return TraceRequest(rid, arrival, np.asarray(acc, dtype=np.int64), p, conf)


def write_trace(trace: Trace, path: str | pathlib.Path, decimals: int = 4) -> None:
    lines = [json.dumps(trace.header.to_dict(), separators=(",", ":"))]
    lines += [json.dumps(req.to_dict(decimals), separators=(",", ":")) for req in trace.requests]
    write_atomic(path, "\n".join(lines) + "\n")


# --------------------------------------------------------------------------- engine


@dataclass
class RunResult:
    """One policy realised on one trace."""

    name: str
    tokens: int = 0
    busy_ms: float = 0.0
    steps: int = 0
    sum_k: int = 0
    decide_ns: int = 0

    @property
    def tok_s(self) -> float:
        return 1000.0 * self.tokens / self.busy_ms if self.busy_ms > 0 else 0.0

    @property
    def mean_k(self) -> float:
        return self.sum_k / self.steps if self.steps else 0.0

    @property
    def decide_us(self) -> float:
        return self.decide_ns / self.steps / 1000.0 if self.steps else 0.0


# select(step, running_idx, positions) -> K_i per running request (int array)
Selector = Callable[[int, np.ndarray, np.ndarray], np.ndarray]
# feedback(step, running_idx, positions, k_i, accepted, step_ms, K)
Feedback = Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, int], None]


class _Packed:
    """The trace flattened into arrays for fast stepping."""

    def __init__(self, trace: Trace) -> None:
        reqs = trace.requests
        self.kmax = trace.header.kmax
        self.ids = [r.id for r in reqs]
        self.lengths = np.array([len(r.accept_len) for r in reqs], dtype=np.int64)
        self.base = np.concatenate(([0], np.cumsum(self.lengths)[:-1])).astype(np.int64)
        self.acc = np.concatenate([r.accept_len for r in reqs]).astype(np.int64)
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i))
        self.order = order
        self.arrival = [reqs[i].arrival_s for i in order]
        self.conf = np.concatenate([r.conf for r in reqs]) if trace.has_conf else None
        self.expected: np.ndarray | None = None
        if trace.has_p:
            p = np.concatenate([r.p for r in reqs])  # (N, kmax)
            surv = np.cumprod(p, axis=1)
            self.expected = np.concatenate((np.ones((len(p), 1)), 1.0 + np.cumsum(surv, axis=1)), axis=1)


def run_trace(trace: Trace, select: Selector, seed: int, name: str, feedback: Feedback | None = None,
              packed: _Packed | None = None) -> RunResult:
    """Realise a policy (``select``) on ``trace`` with the normative semantics."""
    pk = packed or _Packed(trace)
    hdr = trace.header
    spec = hdr.cost
    rng = np.random.default_rng(seed)
    speed = spec.speed_path(seed)
    pos = np.zeros(len(pk.lengths), dtype=np.int64)
    running = np.zeros(0, dtype=np.int64)
    qi = 0
    nreq = len(pk.order)
    now = 0.0
    out = RunResult(name)
    dmin = spec.draft_min_steps
    while True:
        # admission at the step boundary (FIFO by arrival), clock jumps over idle gaps
        if len(running) == 0:
            if qi >= nreq:
                break
            now = max(now, pk.arrival[qi])
        if qi < nreq and len(running) < hdr.max_num_seqs and pk.arrival[qi] <= now:
            new = []
            while qi < nreq and len(running) + len(new) < hdr.max_num_seqs and pk.arrival[qi] <= now:
                new.append(pk.order[qi])
                qi += 1
            running = np.concatenate((running, np.array(new, dtype=np.int64)))
        b = len(running)
        t = pos[running]
        ki = select(out.steps, running, t)
        k = int(ki.max())
        verify = b + int(ki.sum())
        ms = spec.step_ms(b, k, verify) * math.exp(rng.normal(0.0, spec.noise)) * speed()
        accepted = np.minimum(ki, pk.acc[pk.base[running] + t])
        newt = np.minimum(t + accepted + 1, pk.lengths[running])
        out.tokens += int((newt - t).sum())
        pos[running] = newt
        if feedback is not None:
            feedback(out.steps, running, t, ki, accepted, ms, max(k, dmin))
        out.busy_ms += ms
        out.sum_k += k
        out.steps += 1
        now += ms / 1000.0
        done = newt >= pk.lengths[running]
        if done.any():
            running = running[~done]
    return out


def run_fixed(trace: Trace, k: int, seed: int, packed: _Packed | None = None) -> RunResult:
    def select(_step: int, running: np.ndarray, _t: np.ndarray) -> np.ndarray:
        return np.full(len(running), k, dtype=np.int64)

    return run_trace(trace, select, seed, f"fixed:{k}", packed=packed)


def run_oracle(trace: Trace, seed: int, packed: _Packed | None = None) -> RunResult:
    """The expected-acceptance oracle (needs ``p`` on every request)."""
    pk = packed or _Packed(trace)
    if pk.expected is None:
        raise ValueError("the oracle needs 'p' on every request of the trace")
    spec = trace.header.cost
    kmax = trace.header.kmax
    expected = pk.expected
    cache: dict[int, np.ndarray] = {}

    def select(_step: int, running: np.ndarray, t: np.ndarray) -> np.ndarray:
        b = len(running)
        cost = cache.get(b)
        if cost is None:
            cost = cache[b] = spec.uniform_ms(b, kmax)
        gain = expected[pk.base[running] + t].sum(axis=0)
        return np.full(b, int(np.argmax(gain / cost)), dtype=np.int64)

    return run_trace(trace, select, seed, "oracle", packed=pk)


def run_controller(
    trace: Trace,
    policy: str,
    seed: int,
    packed: _Packed | None = None,
    **config: Any,
) -> RunResult:
    """Drive a :class:`~.controller.Controller` with ``policy`` through the trace.

    Each step: ``decide()`` on the running batch (with ``conf[t]`` as confidences when the
    trace has them), the step semantics, then ``observe()`` with the step's result. The
    decision applies immediately. ``decide_us`` is the mean observe()+decide() time.
    """
    from .controller import Controller, ControllerConfig  # local: the engine is usable without it

    pk = packed or _Packed(trace)
    kmax = trace.header.kmax
    with tempfile.TemporaryDirectory(prefix="vspec-sim-") as tmp:
        if _policy_name(policy) == "profile" and ":" not in policy and config.get("profile") is None:
            path = pathlib.Path(tmp) / "profile.json"
            profile_for_trace(trace).save(path)
            config["profile"] = str(path)
        controller = Controller(ControllerConfig(kmax=kmax, policy=policy, seed=seed, **config))
        ids = pk.ids
        conf = pk.conf
        clock = time.perf_counter_ns
        spent = [0]

        def select(step: int, running: np.ndarray, t: np.ndarray) -> np.ndarray:
            req_ids = tuple(ids[i] for i in running)
            confs = conf[pk.base[running] + t] if conf is not None else None
            view = BatchView(step, req_ids, tuple(int(x) for x in t), confs)
            t0 = clock()
            decision = controller.decide(view)
            spent[0] += clock() - t0
            if decision.k_i is None:
                ki = np.full(len(running), decision.k, dtype=np.int64)
            else:
                try:
                    ki = ki_array(decision.k_i, req_ids)
                except KeyError as exc:
                    raise RuntimeError(f"policy {policy!r} gave no K_i for request {exc.args[0]!r}") from None
            if len(ki) and (ki.min() < 0 or ki.max() > kmax):
                raise RuntimeError(f"policy {policy!r} chose K_i outside 0..{kmax}: {ki.tolist()}")
            return ki

        def feedback(step: int, running: np.ndarray, t: np.ndarray, ki: np.ndarray, accepted: np.ndarray,
                     ms: float, draft_steps: int) -> None:
            # the engine's form: per-request counts (and verified confidences) as arrays
            rows = conf[pk.base[running] + t] if conf is not None else None
            result = StepResult(step, len(running), int(ki.max()), (), ms, draft_steps,
                                drafted=ki, accepted=accepted, confidences=rows, context_lens=t)
            t0 = clock()
            controller.observe(result)
            spent[0] += clock() - t0

        out = run_trace(trace, select, seed, policy, feedback=feedback, packed=pk)
    out.decide_ns = spent[0]
    return out


def _policy_name(spec: str) -> str:
    return spec.split(":", 1)[0]


def profile_for_trace(trace: Trace) -> Any:
    """The latency profile ``fit-profile`` would produce on this trace's host: samples of
    the header's (noise-free) cost, per component, fitted by NNLS. The roofline's kinks are
    not linear, so the profile is only approximately right, like a real one."""
    from .profile import fit_profile, samples_from_cost

    spec = trace.header.cost
    kmax = trace.header.kmax
    top = trace.header.max_num_seqs

    def predict(component: str, b: int, k: int, _ctx: int) -> float:
        if component == "target":
            return spec.bias_ms + max(spec.target_mem_ms, spec.target_token_ms * b * (k + 1))
        return max(spec.draft_mem_ms, spec.draft_token_ms * b)

    batches = sorted({1, max(1, top // 4), max(1, top // 2), top})
    samples = samples_from_cost(predict, batches, sorted({0, kmax // 2, kmax}), [256, 1024])
    samples["max_speculative_tokens"] = kmax
    return fit_profile(samples, source="<trace cost>")


# --------------------------------------------------------------------------- report


@dataclass
class SimReport:
    """Everything the CLI prints."""

    policies: dict[str, RunResult]
    fixed: dict[int, RunResult]
    best_fixed_k: int
    oracle: RunResult | None

    @property
    def best_fixed(self) -> RunResult:
        return self.fixed[self.best_fixed_k]

    def to_json(self) -> dict[str, Any]:
        best = self.best_fixed.tok_s
        ora = self.oracle.tok_s if self.oracle is not None else None
        return {
            "policies": {
                name: {
                    "tok_s": r.tok_s,
                    "vs_best_fixed": r.tok_s / best if best > 0 else None,
                    "vs_oracle": (r.tok_s / ora) if ora else None,
                    "mean_k": r.mean_k,
                    "decide_us": r.decide_us,
                }
                for name, r in self.policies.items()
            },
            "fixed": {str(k): r.tok_s for k, r in sorted(self.fixed.items())},
            "best_fixed_k": self.best_fixed_k,
            "oracle": {"tok_s": self.oracle.tok_s, "mean_k": self.oracle.mean_k} if self.oracle is not None else None,
        }


def check_policies(trace: Trace, policies: Sequence[str], config: Mapping[str, Any] | None = None) -> None:
    """Build every policy once so a bad name or argument fails before anything runs
    (raises ValueError naming the policy)."""
    from .controller import Controller, ControllerConfig

    seen: set[str] = set()
    for spec in policies:
        if spec in seen:
            raise ValueError(f"policy {spec!r} is given twice")
        seen.add(spec)
        cfg = dict(config or {})
        with tempfile.TemporaryDirectory(prefix="vspec-sim-") as tmp:
            if _policy_name(spec) == "profile" and ":" not in spec and cfg.get("profile") is None:
                path = pathlib.Path(tmp) / "profile.json"
                profile_for_trace(trace).save(path)
                cfg["profile"] = str(path)
            Controller(ControllerConfig(kmax=trace.header.kmax, policy=spec, **cfg))


def simulate(
    trace: Trace,
    policies: Sequence[str],
    seed: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> SimReport:
    """Run ``policies`` plus every fixed K in 0..kmax and (with ``p``) the oracle."""
    s = trace.header.seed if seed is None else seed
    check_policies(trace, policies, config)
    pk = _Packed(trace)
    fixed = {k: run_fixed(trace, k, s, pk) for k in range(trace.header.kmax + 1)}
    best_k = max(fixed, key=lambda k: (fixed[k].tok_s, -k))
    oracle = run_oracle(trace, s, pk) if pk.expected is not None else None
    results = {name: run_controller(trace, name, s, pk, **dict(config or {})) for name in policies}
    return SimReport(results, fixed, best_k, oracle)
