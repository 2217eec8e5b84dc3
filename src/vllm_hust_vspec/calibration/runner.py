"""Start-up calibration inside the engine core: measure, fit, install one cost table.

Called once per engine core by the ``startup-calibration`` patch, at the end of
``EngineCore.__init__`` (after model warm-up, KV-cache allocation and the scheduler; before
``EngineCoreProc`` sends READY and before the offline ``LLM`` returns).  It acts only when
the plugin's runtime is attached to the scheduler and its policy is ``budget``:

* ``adaptive_dspark_cost_table`` given: load it (:func:`~.grid.check_cost_table` against the
  running configuration), install it, log its source and coverage; nothing is measured.
* the budget policy already has a table (``budget:PATH``): nothing to do.
* otherwise: check the grid (:func:`~.grid.load_grid` + :func:`~.grid.check_engine_limits`),
  drive the engine through every grid point with synthetic greedy requests added through the
  engine core's own ``add_request``, with the verify width forced through
  :meth:`EngineRuntime.force_width <vllm_hust_vspec.runtime.engine.EngineRuntime.force_width>`
  (the controller, the decision trace and the recorder see none of these steps), purge them
  (abort, flush the workers' request state, reset the prefix cache), fit the cost model on
  the CPU (held-out error logged), install the table in the budget policy and save it to
  ``adaptive_dspark_cost_table_output`` when given.

Errors are :class:`~.grid.CalibrationError` (a ``SettingsError``): the engine does not start.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_hust_vspec.adaptive.costmodel import CostTable
from vllm_hust_vspec.calibration.grid import (
    CalibrationError,
    CalibrationGrid,
    ContextRange,
    check_cost_table,
    check_engine_limits,
    load_grid,
)
from vllm_hust_vspec.calibration.fit import Window, by_point, holdout_error, subset_problem
from vllm_hust_vspec.calibration.plan import check_output_path

logger = logging.getLogger("vllm_hust_vspec")

REQUEST_PREFIX = "vspec-calibration-"  # ids of the synthetic requests
CACHE_SALT = "vllm-hust-vspec-calibration"  # keeps their KV blocks apart from real prefixes
DEFAULT_SOURCE = "start-up calibration"
READY_MARGIN_S = 15.0  # start-up left after calibration (EngineCoreProc threads, READY)
# a window this much slower than its point's median was disturbed: it is measured again
DISTURBED = 0.25
MAX_BAD_WINDOWS = 3  # windows of a point that may be discarded (batch or rows off) before failing


@dataclasses.dataclass
class Measurement:
    """What the engine measured: complete points' windows, and how far it got."""

    windows: list[Window]
    points_done: int
    points_total: int
    seconds: float
    stopped_by_cap: bool
    remeasured: int = 0  # disturbed windows measured again


# --------------------------------------------------------------------------- entry point


def run_at_start(engine_core: Any) -> CostTable | None:
    """The patch's call: install a cost table in the engine's budget policy (loaded or
    calibrated), or do nothing when the plugin is not active here. Returns the table."""
    scheduler = getattr(engine_core, "scheduler", None)
    runtime = None if scheduler is None else scheduler.__dict__.get("_vspec_runtime")
    if runtime is None:
        return None
    settings = runtime.settings
    table_path = settings.adaptive_dspark_cost_table
    grid_path = settings.adaptive_dspark_calibration
    output = settings.adaptive_dspark_cost_table_output
    policy = runtime.controller.policy
    if getattr(policy, "name", None) != "budget":
        given = [name for name, value in (
            ("adaptive_dspark_cost_table", table_path),
            ("adaptive_dspark_calibration", grid_path),
            ("adaptive_dspark_cost_table_output", output)) if value]
        if given:
            raise CalibrationError(
                f"{', '.join(given)} given, but only the 'budget' policy uses a cost table "
                f"(the engine's policy is {getattr(policy, 'name', policy)!r}; set "
                "--adaptive-policy budget)")
        return None
    if table_path:
        if grid_path or output:
            raise CalibrationError(
                "adaptive_dspark_cost_table skips calibration: do not combine it with "
                "adaptive_dspark_calibration or adaptive_dspark_cost_table_output")
        return load_table(runtime, engine_core, str(table_path))
    if getattr(policy, "table", None) is not None:
        if grid_path or output:
            raise CalibrationError(
                f"the budget policy already has the cost table {policy.table.source} "
                "(budget:PATH); adaptive_dspark_calibration / adaptive_dspark_cost_table_output "
                "would calibrate another one")
        return None
    return calibrate_at_start(runtime, engine_core,
                              None if not grid_path else str(grid_path),
                              None if not output else str(output))


# --------------------------------------------------------------------------- load


def load_table(runtime: Any, engine_core: Any, path: str) -> CostTable:
    """Load a saved table, check it against the running configuration, install it."""
    table = check_cost_table(path, draft_width=runtime.kmax,
                             running=running_metadata(engine_core, runtime))
    install(runtime, table)
    cal = table.calibration or {}
    logger.info(
        "vllm-hust-vspec: cost table %s loaded, calibration skipped: cost_model=%s "
        "draft_width=%d coverage B=%s G=%s (measured on model %s, %s, host %s%s)",
        path, table.cost_model, table.draft_width, list(table.request_buckets),
        list(table.target_rows), table.model_id, table.dtype, table.host_version,
        "" if not cal.get("grid") else f"; saved calibration grid {json.dumps(cal['grid'])}",
    )
    return table


def install(runtime: Any, table: CostTable) -> None:
    """Give the engine's budget policy its one immutable table (before its first decision)."""
    controller = runtime.controller
    policy = controller.policy
    if controller.decisions or controller.steps:
        raise RuntimeError("vllm-hust-vspec: a cost table is installed only before the first step")
    if table.draft_width < runtime.kmax:
        raise CalibrationError(
            f"cost table {table.source}: field 'draft_width': {table.draft_width} is smaller "
            f"than the running width {runtime.kmax}")
    policy.table = table
    controller.config.cost_table = table.source


# --------------------------------------------------------------------------- calibrate


def calibrate_at_start(runtime: Any, engine_core: Any, grid_path: str | None,
                       output: str | None) -> CostTable:
    """Check, measure, fit, install and (optionally) save."""
    t0 = time.perf_counter()
    vllm_config = engine_core.vllm_config
    scheduler = engine_core.scheduler
    if output is not None:
        check_output_path(output, "adaptive_dspark_cost_table_output")
    graph_buckets = None
    if _captures_graphs(vllm_config):
        graph_buckets = list(vllm_config.compilation_config.cudagraph_capture_sizes or ()) or None
    grid = load_grid(grid_path, draft_width=runtime.kmax,
                     max_model_len=int(scheduler.max_model_len), graph_buckets=graph_buckets,
                     max_num_seqs=int(scheduler.max_num_running_reqs))
    block = int(scheduler.block_size)
    check_engine_limits(
        grid, source=grid.source if grid_path is None else grid_path,
        max_num_seqs=int(scheduler.max_num_running_reqs),
        max_num_batched_tokens=int(scheduler.max_num_scheduled_tokens),
        max_model_len=int(scheduler.max_model_len),
        kv_capacity_tokens=int(scheduler.kv_cache_config.num_blocks) * block,
        block_size=block,
    )
    logger.info("vllm-hust-vspec calibration: %s", grid.describe())
    measured = measure(engine_core, runtime, grid, _time_cap(engine_core, grid))
    samples = [(w.batch, w.rows, w.step_s) for w in measured.windows]
    holdout = holdout_error(grid.cost_model, measured.windows)
    if holdout is None:
        logger.info("vllm-hust-vspec calibration: held-out error not measured "
                    "(windows_per_point=%d leaves no window to hold out)", grid.windows_per_point)
    else:
        logger.info(
            "vllm-hust-vspec calibration: %s model, held-out median relative error %.2f%% "
            "(max %.2f%%) over %d windows (one per point; %d disturbed window(s) were "
            "measured again)", grid.cost_model, 100 * holdout["median"], 100 * holdout["max"],
            holdout["windows"], measured.remeasured)
    source = output if output is not None else f"{DEFAULT_SOURCE} ({grid.source})"
    calibration = {
        "grid": grid.to_dict(),
        "grid_source": grid.source,
        "points_measured": measured.points_done,
        "points_total": measured.points_total,
        "stopped_by_time_cap": measured.stopped_by_cap,
        "measure_s": round(measured.seconds, 3),
        "windows_measured_again": measured.remeasured,
        "holdout": holdout,
        "step_ms": [
            {"batch": b, "target_rows": g, "ms": round(1000 * statistics.median(v), 4)}
            for (b, g), v in sorted(by_point(measured.windows).items())
        ],
    }
    try:
        metadata = running_metadata(engine_core, runtime)
        table = CostTable.fit(grid.cost_model, samples, calibration=calibration, **metadata)
    except ValueError as exc:
        raise CalibrationError(f"vllm-hust-vspec calibration: the {grid.cost_model} fit of "
                               f"{len(samples)} windows failed: {exc}") from None
    table = dataclasses.replace(table, source=source)
    install(runtime, table)
    if output is not None:
        _write_new(output, table)
    logger.info(
        "vllm-hust-vspec calibration: done in %.1f s (%d/%d points, measuring %.1f s): "
        "%s table, coverage B=%s G=%s; %s", time.perf_counter() - t0, measured.points_done,
        measured.points_total, measured.seconds, table.cost_model,
        list(table.request_buckets), list(table.target_rows),
        f"written to {output}" if output else "not saved (no adaptive_dspark_cost_table_output)",
    )
    return table


def measure(engine_core: Any, runtime: Any, grid: CalibrationGrid,
            time_cap_s: float | None = None) -> Measurement:
    """Drive the engine through every grid point (for at most ``time_cap_s``, default the
    grid's); always purges its requests."""
    cap = float(grid.time_cap_s if time_cap_s is None else time_cap_s)
    points = grid.points()
    rng = np.random.default_rng(grid.token_seed)
    vocab = int(engine_core.vllm_config.model_config.get_vocab_size())
    driver = _Driver(engine_core, runtime, rng, vocab)
    windows: list[Window] = []
    started = time.perf_counter()
    deadline = started + cap
    done = 0
    remeasured = 0
    stopped = False
    per_point_s: list[float] = []
    try:
        for i, (b, g, ctx) in enumerate(points):
            width = g // b - 1
            t_point = time.perf_counter()
            result = driver.run_point(i, b, g, width, ctx, grid, deadline)
            if result is None:
                stopped = True
                break
            got, again = result
            remeasured += again
            windows.extend(got)
            done += 1
            per_point_s.append(time.perf_counter() - t_point)
            elapsed = time.perf_counter() - started
            eta = statistics.mean(per_point_s) * (len(points) - done)
            ms = 1000 * statistics.median(w.step_s for w in got)
            logger.info(
                "vllm-hust-vspec calibration: point %d/%d B=%d G=%d (width %d, %s): "
                "%.3f ms/step over %d windows%s; elapsed %.1f s, ETA %.1f s",
                done, len(points), b, g, width, ctx.label(), ms, len(got),
                f" ({again} disturbed window(s) measured again)" if again else "",
                elapsed, eta)
    finally:
        driver.purge()
    seconds = time.perf_counter() - started
    if stopped:
        measured_points = sorted({(w.batch, w.rows) for w in windows})
        problem = subset_problem(grid.cost_model, windows)
        if problem is not None:
            raise CalibrationError(
                grid.source, "time_cap_s",
                f"calibration stopped at its time cap of {cap:.0f} s after {done} of "
                f"{len(points)} points {measured_points}: {problem}; raise time_cap_s or shrink "
                "the grid (request_buckets, target_graph_rows, window_steps, windows_per_point)")
        logger.warning(
            "vllm-hust-vspec calibration: time cap %g s reached after %d of %d points; fitting "
            "the connected subset measured so far %s", cap, done, len(points),
            measured_points)
    return Measurement(windows, done, len(points), seconds, stopped, remeasured)


class _Driver:
    """Adds, steps and purges the synthetic requests of one engine core."""

    def __init__(self, engine_core: Any, runtime: Any, rng: np.random.Generator, vocab: int) -> None:
        self.core = engine_core
        self.runtime = runtime
        self.rng = rng
        self.vocab = vocab
        self.live: list[str] = []  # ids of the calibration requests in the scheduler
        self.all_ids: set[str] = set()
        self.serial = 0

    # ---- requests

    def _add(self, batch: int, ctx: ContextRange) -> None:
        from vllm import SamplingParams
        from vllm.v1.engine import EngineCoreRequest

        # KV length = prompt + generated tokens: stay <= max_kv_length
        max_tokens = max(1, ctx.max_kv_length - ctx.prefill_tokens)
        for _ in range(batch):
            self.serial += 1
            rid = f"{REQUEST_PREFIX}{os.getpid()}-{self.serial}"
            tokens = self.rng.integers(0, self.vocab, size=ctx.prefill_tokens).tolist()
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                    detokenize=False)
            request = EngineCoreRequest(
                request_id=rid, prompt_token_ids=tokens, mm_features=None,
                sampling_params=params, pooling_params=None, arrival_time=time.time(),
                lora_request=None, cache_salt=CACHE_SALT, data_parallel_rank=None,
            )
            req, wave = self.core.preprocess_add_request(request)
            self.core.add_request(req, wave)
            self.live.append(rid)
            self.all_ids.add(rid)

    def _abort(self) -> None:
        if self.live:
            self.core.abort_requests(list(self.live))
        self.live = []

    def _step(self) -> None:
        outputs, executed = self.core.step_fn()
        self.core.post_step(executed)
        del outputs  # no client waits for these requests

    def _kv_lengths(self) -> list[int]:
        reqs = self.core.scheduler.requests
        return [int(reqs[r].num_tokens) for r in self.live if r in reqs]

    # ---- one point

    def run_point(self, index: int, batch: int, rows: int, width: int, ctx: ContextRange,
                  grid: CalibrationGrid, deadline: float) -> tuple[list[Window], int] | None:
        """The windows of one point and how many disturbed windows were measured again, or
        None when the time cap ran out first.

        A window more than ``DISTURBED`` slower than the median of the point's windows was
        slowed by something else (on a shared CPU: other processes); it is measured again,
        at most ``windows_per_point`` times per point."""
        runtime = self.runtime
        runtime.force_width(width)
        try:
            self._start(batch, ctx, grid, deadline)
            out: list[Window] = []
            while len(out) < grid.windows_per_point:
                window = self._window(index, batch, rows, width, ctx, grid, deadline)
                if window is None:
                    return None
                out.append(dataclasses.replace(window, index=len(out)))
            again = 0
            while again < grid.windows_per_point:
                median = statistics.median(w.step_s for w in out)
                slow = [i for i, w in enumerate(out) if w.step_s > median * (1 + DISTURBED)]
                if not slow:
                    break
                window = self._window(index, batch, rows, width, ctx, grid, deadline)
                if window is None:
                    return None
                out[slow[0]] = dataclasses.replace(window, index=slow[0])
                again += 1
            return out, again
        finally:
            self._abort()
            runtime.calibration_steps = []

    def _window(self, index: int, batch: int, rows: int, width: int, ctx: ContextRange,
                grid: CalibrationGrid, deadline: float) -> Window | None:
        """One window of ``window_steps`` pure decode steps (None: the time cap ran out)."""
        runtime = self.runtime
        bad = 0
        while True:
            if time.perf_counter() > deadline:
                return None
            growth = (grid.window_steps + 2) * (width + 1)
            if max(self._kv_lengths(), default=0) + growth > ctx.max_kv_length:
                # the requests would leave the context range: start a fresh set
                self._abort()
                self._start(batch, ctx, grid, deadline)
            steps = runtime.calibration_steps
            first = len(steps) - 1  # the window starts when the last output arrived
            calls = 0
            # one output per step when scheduling is synchronous; a batch queue may need more
            # calls for as many outputs
            while len(steps) - 1 - first < grid.window_steps and calls < 4 * grid.window_steps:
                self._step()
                calls += 1
            window = steps[first + 1:first + 1 + grid.window_steps]
            ok = (len(window) == grid.window_steps and first >= 0
                  and all(s.batch == batch and s.rows == rows and not s.prefill for s in window))
            if ok:
                seconds = window[-1].t - steps[first].t
                del steps[: len(steps) - 1]  # keep only the last output as the next start
                return Window(index, batch, rows, width, 0, seconds / grid.window_steps)
            bad += 1
            if bad > MAX_BAD_WINDOWS:
                seen = sorted({(s.batch, s.rows, s.prefill) for s in window})
                raise CalibrationError(
                    f"vllm-hust-vspec calibration: point B={batch} G={rows} (width {width}): "
                    f"{bad} windows did not run as pure decode steps of {batch} requests x "
                    f"{width + 1} rows (seen (batch, rows, prefill): {seen}); the engine "
                    "cannot hold this point")
            self._abort()
            self._start(batch, ctx, grid, deadline)

    def _start(self, batch: int, ctx: ContextRange, grid: CalibrationGrid, deadline: float) -> None:
        """Fresh requests, prefilled, then ``warmup_steps`` decode steps at the forced width."""
        self._add(batch, ctx)
        steps = self.runtime.calibration_steps
        steps.clear()
        calls = 0
        limit = 64 + 4 * (grid.warmup_steps + ctx.prefill_tokens * batch)
        # until every request decodes: the last step scheduled no prefill and had all of them
        while not steps or steps[-1].prefill or steps[-1].batch != batch:
            self._step()
            calls += 1
            if calls > limit:
                raise CalibrationError(
                    f"vllm-hust-vspec calibration: {batch} requests of {ctx.prefill_tokens} "
                    f"prompt tokens did not all reach decoding within {limit} engine steps")
        for _ in range(grid.warmup_steps):
            self._step()
        lengths = self._kv_lengths()
        if len(lengths) != batch or min(lengths) < ctx.min_kv_length:
            raise CalibrationError(
                f"vllm-hust-vspec calibration: after warm-up the {batch} requests hold KV lengths "
                f"{sorted(set(lengths))}, outside [{ctx.min_kv_length}, {ctx.max_kv_length}]")

    # ---- purge

    def purge(self) -> None:
        """Abort every calibration request, let one empty step carry their ids to the
        workers (which drop their per-request state), reset the prefix cache, and give the
        runtime back to the controller."""
        core = self.core
        scheduler = core.scheduler
        try:
            self._abort()
            leftover = [r for r in self.all_ids if r in scheduler.requests]
            if leftover:
                core.abort_requests(leftover)
            flushes = 0
            while scheduler.has_requests() and flushes < 4:
                self._step()
                flushes += 1
            left = sorted(r for r in self.all_ids if r in scheduler.requests)
            if left:
                raise RuntimeError(f"vllm-hust-vspec calibration: requests {left} left after the purge")
            if not core.reset_prefix_cache():
                raise RuntimeError("vllm-hust-vspec calibration: prefix cache reset failed")
        finally:
            self.runtime.release_width()


# --------------------------------------------------------------------------- metadata


def running_metadata(engine_core: Any, runtime: Any) -> dict[str, Any]:
    """What a cost table must have been measured on to serve this engine
    (``CostTable.check_compatible`` keys): width, model, dtype, quantisation, parallel and
    execution settings, host version."""
    import vllm

    cfg = engine_core.vllm_config
    model = cfg.model_config
    par = cfg.parallel_config
    spec = cfg.speculative_config
    sched = cfg.scheduler_config
    from vllm_hust_vspec.host.detect import platform_name

    return {
        "draft_width": int(runtime.kmax),
        "model_id": str(model.model),
        "dtype": str(model.dtype).removeprefix("torch."),
        "quantization": None if model.quantization is None else str(model.quantization),
        "parallel": {
            "tensor_parallel_size": int(par.tensor_parallel_size),
            "pipeline_parallel_size": int(par.pipeline_parallel_size),
            "data_parallel_size": int(par.data_parallel_size),
        },
        "execution": {
            "platform": platform_name(),
            "speculative_method": str(spec.method),
            "draft_model": None if spec.model is None else str(spec.model),
            "enforce_eager": bool(model.enforce_eager),
            "async_scheduling": bool(sched.async_scheduling),
            "kv_cache_dtype": str(cfg.cache_config.cache_dtype),
        },
        "host_version": str(vllm.__version__),
    }


# --------------------------------------------------------------------------- helpers


def _captures_graphs(vllm_config: Any) -> bool:
    from vllm_hust_vspec.host.detect import graph_capable

    return graph_capable() and not vllm_config.model_config.enforce_eager


def _write_new(path: str, table: CostTable) -> None:
    try:
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(json.dumps(table.to_dict(), indent=2) + "\n")
    except FileExistsError:
        raise CalibrationError(
            f"adaptive_dspark_cost_table_output {path}: the file appeared during calibration; "
            "refusing to overwrite it") from None


def _time_cap(engine_core: Any, grid: CalibrationGrid) -> float:
    """The calibration's time budget: ``time_cap_s``, shortened in an engine-core process so
    that READY reaches the front end within ``VLLM_ENGINE_READY_TIMEOUT_S`` (counted here
    from the process start, with a margin for the rest of the start-up)."""
    from vllm.v1.engine.core import EngineCoreProc

    cap = float(grid.time_cap_s)
    if not isinstance(engine_core, EngineCoreProc):
        return cap
    import psutil

    limit = float(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))
    spent = time.time() - psutil.Process().create_time()
    left = limit - spent - READY_MARGIN_S
    if left <= 0:
        raise CalibrationError(
            grid.source, "time_cap_s",
            f"no time is left for calibration: the engine started {spent:.0f} s ago and the "
            f"front end waits VLLM_ENGINE_READY_TIMEOUT_S={limit:g} s for it; raise "
            "VLLM_ENGINE_READY_TIMEOUT_S")
    if left < cap:
        logger.info(
            "vllm-hust-vspec calibration: time cap %.0f s shortened to %.0f s: the front end "
            "waits VLLM_ENGINE_READY_TIMEOUT_S=%g s for this engine (started %.0f s ago)",
            cap, left, limit, spent)
        return left
    return cap
