"""The start-up cost probe: a few timed decode steps of every K before the server is ready,
handed to the step-cost model of every policy that prices K with it (``online``, and
``budget`` outside its table).

Why (measured on the CPU host, demo traces of 2026-12-03): a fresh ``online`` server learnt
its step costs from its own first steps, which are batch-1 steps when the first request
comes alone. There a step verifies ``T = 1 + D`` tokens after ``D`` drafter passes, so a
verified token and a drafter pass are the same column of the fit: priced from them, K = 3-4
at batch 3-4 came out 51-70 % too dear and the server held K = 0 where fixed K = 2 was
best. The probe times every K at three batch sizes (1, 4, 16, capped at ``max_num_seqs``),
which separates the two terms before the first request, and it runs each of those shapes
through the engine once more before anything is served.

It drives the engine exactly as the budget policy's calibration does
(:func:`~.driver.measure`: synthetic greedy requests under a forced K, purged afterwards),
with a small grid: short prompts, two windows of a few steps per point. A point's window
time per step is the whole engine cycle (output to output), which is what the controller
times while serving. The samples age in the cost model like its own step times, so what the
server measures while serving replaces them within a few hundred steps.

``adaptive_cost_probe = false`` turns it off (the policies then learn from served steps
alone). The engine side (the measurement, its time cap, the log line) is
:func:`~.runner.probe_at_start`; this module is pure Python.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from vllm_hust_vspec import methods
from vllm_hust_vspec.startup_cost.fit import Window, by_point
from vllm_hust_vspec.startup_cost.grid import CalibrationGrid, ContextRange

PROBE_BATCHES = (1, 4, 16)  # capped at max_num_seqs (which is then probed itself)
PROBE_PREFILL = 64  # prompt tokens of a probe request
PROBE_WARMUP_STEPS = 3
PROBE_WINDOW_STEPS = 4
PROBE_WINDOWS = 2  # a disturbed window is measured again (driver.DISTURBED)
PROBE_TIME_CAP_S = 120.0


def probe_batches(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes probed: 1, 4 and 16, none above ``max_num_seqs`` (which is probed
    in their place)."""
    top = max(1, int(max_num_seqs))
    return tuple(sorted({min(b, top) for b in PROBE_BATCHES}))


def probe_grid(kmax: int, max_num_seqs: int, max_model_len: int) -> CalibrationGrid:
    """Every K in ``0..kmax`` at every probed batch size, prompts of ``PROBE_PREFILL``
    tokens (fewer when ``max_model_len`` is short), one prefill per point."""
    batches = probe_batches(max_num_seqs)
    rows = tuple(sorted({b * (w + 1) for b in batches for w in range(kmax + 1)}))
    grid = CalibrationGrid(
        cost_model="additive", draft_width=kmax, request_buckets=batches,
        target_graph_rows=rows, contexts=(ContextRange(PROBE_PREFILL, 1, PROBE_PREFILL),),
        warmup_steps=PROBE_WARMUP_STEPS, window_steps=PROBE_WINDOW_STEPS,
        windows_per_point=PROBE_WINDOWS, time_cap_s=PROBE_TIME_CAP_S, source="cost probe")
    growth = grid.progress_tokens  # a request's KV growth over one point
    prefill = max(1, min(PROBE_PREFILL, max_model_len - growth - 1))
    kv = max(prefill + 1, min(max_model_len - 1, prefill + growth))
    return dataclasses.replace(grid, contexts=(ContextRange(prefill, 1, kv),))


def fit_limits(grid: CalibrationGrid, *, max_num_seqs: int, max_num_batched_tokens: int,
               kv_capacity_tokens: int, block_size: int = 1) -> CalibrationGrid | None:
    """The probe grid cut to what this engine holds: no batch above ``max_num_seqs`` or
    above what the KV cache holds at once (a probed batch too large is replaced by the
    largest that fits), no point of more target rows than ``max_num_batched_tokens``. None
    when not even one request fits (the probe is then skipped: it is a head start, not a
    requirement)."""
    ctx = grid.contexts[0]
    block = max(1, int(block_size))
    per_request = -(-grid.kv_needed(ctx) // block) * block
    top = min(int(max_num_seqs), int(kv_capacity_tokens) // per_request)
    if top < 1:
        return None
    batches = tuple(b for b in sorted({min(b, top) for b in grid.request_buckets})
                    if b <= max_num_batched_tokens)
    if not batches:
        return None
    rows = {b * (w + 1) for b in batches for w in range(grid.draft_width + 1)}
    return dataclasses.replace(
        grid, request_buckets=batches,
        target_graph_rows=tuple(sorted(g for g in rows if g <= max_num_batched_tokens)))


def wants_probe(runtime: Any) -> bool:
    """True when the probe is on, some controller prices K with the step-cost model, and the
    method has a model drafter: an n-gram (or suffix) drafter drafts from the text, and the
    probe's synthetic prompts give it nothing to draft, so no forced K could be held."""
    if not runtime.settings.adaptive_cost_probe:
        return False
    if methods.draft_forwards(runtime.method, 1) == 0:
        return False
    return any(c.uses_step_costs for c in runtime.controllers)


def samples(windows: Sequence[Window], method: str, kmax: int, varies_k: bool,
            skip_k0: bool) -> list[tuple[int, int, int, float]]:
    """The cost model's ``(batch, verify tokens, drafter passes, ms)`` of each window: a
    window at width ``k`` verified ``B (k + 1)`` tokens a step and drafted ``k`` (``Kmax``
    on a host that fixes K, which cuts per request; none at K = 0 there either, the gate's
    K = 0 being the same cut)."""
    out = []
    for w in windows:
        drafted = w.width if varies_k or w.width == 0 else kmax
        out.append((w.batch, w.rows, methods.draft_forwards(method, drafted, skip_k0),
                    1000.0 * w.step_s))
    return out


def seed(controllers: Sequence[Any], rows: Sequence[tuple[int, int, int, float]]) -> int:
    """Hand the samples to every controller that prices K with the step-cost model; returns
    how many controllers took them."""
    n = 0
    for controller in controllers:
        if controller.uses_step_costs:
            controller.seed_step_costs(rows)
            n += 1
    return n


def summary(windows: Sequence[Window]) -> str:
    """``B=1: K0 12.3 K1 14.0 ...; B=4: ...`` (median ms per step of each point)."""
    points = sorted(by_point(windows).items())
    parts = []
    for b in sorted({b for (b, _), _ in points}):
        cells = " ".join(f"K{g // b - 1} {1000 * statistics.median(ws):.1f}"
                         for (bb, g), ws in points if bb == b)
        parts.append(f"B={b}: {cells}")
    return "; ".join(parts)
