"""Workloads of the A/B benchmark, built from the fixtures' prompt sets (no hub, no network).

A prompt set is a JSON-lines file in vLLM's custom dataset format, one
``{"prompt": str, "output_tokens": int}`` per line (``prompts/<name>.jsonl`` under the fixture
directory).  A *cell* is one workload at one concurrency; its requests are plain
:class:`Request` records (prompt text and output length) in the order they are sent.

Workloads:

* ``code``      prompts of the ``code`` set (high acceptance);
* ``hard``      prompts of the ``hard`` set (low acceptance);
* ``mixed``     ``code`` and ``hard`` alternating, so every batch holds both;
* ``shifting``  the mix moves during the run: request ``i`` of ``n`` is a ``hard`` prompt with
                probability ``i / (n - 1)`` (seeded), so the run starts all-code and ends
                all-hard;
* ``swing``     the ``code`` set driven at concurrency 1, 4, 16, 4, 1 in phases on one server
                (the load swings as real traffic does); its concurrency is reported as
                ``"swing"``;
* ``dataset``   the user's own prompts (``--dataset``, :mod:`.bench_datasets`).

Pure Python: no vLLM import.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
from collections.abc import Mapping, Sequence

from vllm_hust_vspec import checks
from vllm_hust_vspec.errors import VspecError

WORKLOADS = ("code", "hard", "mixed", "shifting", "swing", "dataset")
SWING = "swing"
SWING_PHASES = (1, 4, 16, 4, 1)
# The prompt sets each workload reads.
PROMPT_SETS = {"code": ("code",), "hard": ("hard",), "mixed": ("code", "hard"),
               "shifting": ("code", "hard"), "swing": ("code",), "dataset": ("dataset",)}


class WorkloadError(VspecError, ValueError):
    """A prompt set is missing or malformed, or a workload name is unknown."""


@dataclasses.dataclass(frozen=True)
class Prompt:
    text: str
    output_tokens: int
    source: str  # prompt-set name


@dataclasses.dataclass(frozen=True)
class Request:
    prompt: str
    output_len: int
    source: str


@dataclasses.dataclass(frozen=True)
class Phase:
    """One stretch of a cell at a fixed concurrency."""

    concurrency: int
    requests: tuple[Request, ...]


@dataclasses.dataclass(frozen=True)
class Cell:
    workload: str
    concurrency: int | str  # an int, or "swing"
    phases: tuple[Phase, ...]

    @property
    def key(self) -> str:
        return f"{self.workload}@{self.concurrency}"

    @property
    def num_requests(self) -> int:
        return sum(len(p.requests) for p in self.phases)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_len for p in self.phases for r in p.requests)


def parse_workloads(text: str) -> tuple[str, ...]:
    """``"code,swing"`` -> ``("code", "swing")``; unknown names raise :class:`WorkloadError`."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise WorkloadError("--workloads: give at least one workload")
    for n in names:
        if n not in WORKLOADS:
            raise WorkloadError(f"--workloads: unknown workload {n!r} (known: {', '.join(WORKLOADS)})")
    if len(set(names)) != len(names):
        raise WorkloadError(f"--workloads: {text!r} names a workload twice")
    return names


def jsonl_records(path: pathlib.Path) -> list[tuple[int, dict]]:
    """``(line number, object)`` of every non-blank line of a JSON-lines file; a line that
    is not a JSON object is one :class:`WorkloadError` naming the file and line."""
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: {checks.not_utf8(exc)}") from None
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{i}: invalid JSON: {exc.msg}") from None
        except checks.PARSER_LIMITS as exc:
            raise WorkloadError(f"{path}:{i}: invalid JSON: {checks.parser_limit(exc)}") from None
        if not isinstance(rec, dict):
            raise WorkloadError(f"{path}:{i}: expected a JSON object")
        out.append((i, rec))
    return out


def load_prompt_set(path: pathlib.Path, name: str) -> list[Prompt]:
    """Read one prompt set; every line must be ``{"prompt": str, "output_tokens": int >= 1}``."""
    if not path.is_file():
        raise WorkloadError(f"prompt set {name!r}: {path} not found (build the fixtures with "
                            "./manage.sh fixtures, or pass --prompts-dir)")
    out: list[Prompt] = []
    for i, rec in jsonl_records(path):
        if not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
            raise WorkloadError(f"{path}:{i}: expected an object with a non-empty string 'prompt'")
        n = rec.get("output_tokens")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise WorkloadError(f"{path}:{i}: 'output_tokens' must be an integer >= 1, got {n!r}")
        out.append(Prompt(rec["prompt"], n, name))
    if not out:
        raise WorkloadError(f"prompt set {name!r}: {path} holds no prompts")
    return out


def load_prompt_sets(prompts_dir: pathlib.Path, workloads: Sequence[str]) -> dict[str, list[Prompt]]:
    """The prompt sets the given workloads need, read from ``prompts_dir/<set>.jsonl``."""
    needed = sorted({s for w in workloads for s in PROMPT_SETS[w] if s != "dataset"})
    return {s: load_prompt_set(prompts_dir / f"{s}.jsonl", s) for s in needed}


def requests_for(concurrency: int, per_slot: int, minimum: int) -> int:
    """Requests in a cell at ``concurrency``: ``per_slot`` rounds of the full batch, at least
    ``minimum``."""
    return max(concurrency * per_slot, minimum)


def _take(prompts: Sequence[Prompt], start: int, n: int) -> list[Prompt]:
    return [prompts[(start + i) % len(prompts)] for i in range(n)]


def _as_request(p: Prompt, max_output: int) -> Request:
    return Request(p.text, min(p.output_tokens, max_output), p.source)


def build_requests(workload: str, sets: Mapping[str, Sequence[Prompt]], n: int,
                   max_output: int, seed: int) -> tuple[Request, ...]:
    """The ``n`` requests of one stretch of ``workload`` (deterministic for a seed)."""
    if workload not in WORKLOADS:
        raise WorkloadError(f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
    if n < 1 or max_output < 1:
        raise WorkloadError("a cell needs at least one request and one output token")
    rng = random.Random(f"{workload}:{seed}")
    if workload in ("code", "hard", "swing", "dataset"):
        src = sets[PROMPT_SETS[workload][0]]
        picked = _take(src, rng.randrange(len(src)), n)
    elif workload == "mixed":
        code, hard = sets["code"], sets["hard"]
        c0, h0 = rng.randrange(len(code)), rng.randrange(len(hard))
        picked = [code[(c0 + i // 2) % len(code)] if i % 2 == 0 else hard[(h0 + i // 2) % len(hard)]
                  for i in range(n)]
    else:  # shifting
        code, hard = sets["code"], sets["hard"]
        ci, hi = rng.randrange(len(code)), rng.randrange(len(hard))
        picked = []
        for i in range(n):
            frac = i / (n - 1) if n > 1 else 0.0
            if rng.random() < frac:
                picked.append(hard[hi % len(hard)])
                hi += 1
            else:
                picked.append(code[ci % len(code)])
                ci += 1
    return tuple(_as_request(p, max_output) for p in picked)


def build_cells(workloads: Sequence[str], concurrencies: Sequence[int],
                sets: Mapping[str, Sequence[Prompt]], *, per_slot: int, minimum: int,
                max_output: int, seed: int,
                swing_phases: Sequence[int] = SWING_PHASES) -> list[Cell]:
    """Every cell of the benchmark: each non-swing workload at each concurrency, then
    ``swing`` (one cell whose phases run ``swing_phases`` in order)."""
    cells: list[Cell] = []
    for w in workloads:
        if w == SWING:
            phases = tuple(
                Phase(c, build_requests(w, sets, requests_for(c, per_slot, minimum), max_output,
                                        seed * 1000 + j))
                for j, c in enumerate(swing_phases))
            cells.append(Cell(w, SWING, phases))
            continue
        for c in concurrencies:
            reqs = build_requests(w, sets, requests_for(c, per_slot, minimum), max_output, seed)
            cells.append(Cell(w, c, (Phase(c, reqs),)))
    return cells


def max_concurrency(cells: Sequence[Cell]) -> int:
    return max(p.concurrency for c in cells for p in c.phases)
