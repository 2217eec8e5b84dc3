"""Start-up calibration inside the engine core: measure, fit, install one cost table.

Called once per engine core by the ``startup-calibration`` patch, at the end of
``EngineCore.__init__`` (after model warm-up, KV-cache allocation and the scheduler; before
``EngineCoreProc`` sends READY and before the offline ``LLM`` returns).  It acts only when
the plugin's runtime is attached to the scheduler.  First the cost probe
(:func:`probe_at_start`, when ``adaptive_cost_probe`` is on and a policy prices K with the
step-cost model).  Then, for the ``budget`` policy, the launcher's plan
(:func:`~.plan.calibration_settings`, which the ``--dry-run`` runs):

* ``adaptive_dspark_cost_table`` given: load it (:func:`~.grid.check_cost_table` against the
  running configuration), install it, log its source and coverage; nothing is measured.
* the budget policy already has a table (``budget:PATH``): nothing to do.
* otherwise: check the grid (:func:`~.grid.load_grid` + :func:`~.grid.check_engine_limits`),
  drive the engine through every grid point (:func:`~.driver.measure`: synthetic greedy
  requests at forced verify widths, purged afterwards), fit the cost model on the CPU
  (held-out error logged), install the table in the budget policy and save it to
  ``adaptive_dspark_cost_table_output`` when given.

Errors are :class:`~.grid.CalibrationError` (a ``SettingsError``): the engine does not start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import statistics
import time
from typing import Any

from vllm_hust_vspec.adaptive.costmodel import CostTable
from vllm_hust_vspec.startup_cost import probe
from vllm_hust_vspec.startup_cost.driver import measure
from vllm_hust_vspec.startup_cost.fit import by_point, holdout_error
from vllm_hust_vspec.startup_cost.grid import CalibrationError, CalibrationGrid, check_engine_limits
from vllm_hust_vspec.startup_cost.plan import calibration_settings
from vllm_hust_vspec.runtime.engine import runtime_of

logger = logging.getLogger("vllm_hust_vspec")

DEFAULT_SOURCE = "start-up calibration"
READY_MARGIN_S = 15.0  # start-up left after calibration (EngineCoreProc threads, READY)


# --------------------------------------------------------------------------- entry point


def run_at_start(engine_core: Any) -> CostTable | None:
    """The patch's call: install a cost table in the engine's budget policy (loaded or
    calibrated), or do nothing when the plugin is not active here. Returns the table.

    The option conflicts (calibration options with another policy, a saved table with a
    grid or an output) were refused when the engine read its settings
    (``settings.check_calibration_options``); the plan is the launcher's
    (:func:`~.plan.calibration_settings`), with what only the engine knows (max_model_len,
    captured graph sizes, the running configuration a saved table must match)."""
    scheduler = getattr(engine_core, "scheduler", None)
    runtime = None if scheduler is None else runtime_of(scheduler)
    if runtime is None:
        return None
    if probe.wants_probe(runtime):
        probe_at_start(runtime, engine_core)
    if not runtime.needs_cost_table:
        return None  # not the budget policy, or budget:PATH with its own table
    vllm_config = engine_core.vllm_config
    graph_buckets = None
    if _captures_graphs(vllm_config):
        graph_buckets = list(vllm_config.compilation_config.cudagraph_capture_sizes or ()) or None
    plan = calibration_settings(
        runtime.settings, draft_width=runtime.kmax,
        max_model_len=int(scheduler.max_model_len),
        max_num_seqs=int(scheduler.max_num_running_reqs), graph_buckets=graph_buckets,
        running=running_metadata(engine_core, runtime),
    )
    if plan.mode == "load":
        assert plan.table is not None
        return load_table(runtime, plan.table)
    if plan.mode == "calibrate":
        assert plan.grid is not None
        return calibrate_at_start(runtime, engine_core, plan.grid, plan.output)
    return None


# --------------------------------------------------------------------------- cost probe


def probe_at_start(runtime: Any, engine_core: Any) -> list[tuple[int, int, int, float]]:
    """The start-up cost probe (:mod:`.probe`): time every K at a few batch sizes, seed
    the step-cost model of every policy that prices with it, log the table; returns the
    samples handed over."""
    scheduler = engine_core.scheduler
    capacity, block = _kv_capacity(scheduler)
    grid = probe.fit_limits(
        probe.probe_grid(runtime.kmax, int(scheduler.max_num_running_reqs),
                         int(scheduler.max_model_len)),
        max_num_seqs=int(scheduler.max_num_running_reqs),
        max_num_batched_tokens=int(scheduler.max_num_scheduled_tokens),
        kv_capacity_tokens=capacity, block_size=block)
    if grid is None:
        logger.info("vllm-hust-vspec cost probe: skipped: the KV cache (%d tokens) or the step "
                    "budget (%d tokens) holds no probe request", capacity,
                    int(scheduler.max_num_scheduled_tokens))
        return []
    _check_limits(scheduler, grid)
    t0 = time.perf_counter()
    measured = measure(engine_core, runtime, grid, _time_cap(engine_core, grid), what="cost probe")
    rows = probe.samples(measured.windows, runtime.method, runtime.kmax, runtime.varies_k,
                         runtime.skip_k0)
    seeded = probe.seed(runtime.controllers, rows)
    logger.info(
        "vllm-hust-vspec cost probe: %d/%d points in %.1f s%s, seeded %d controller(s); "
        "ms per step %s", measured.points_done, measured.points_total,
        time.perf_counter() - t0, " (stopped by its time cap)" if measured.stopped_by_cap else "",
        seeded, probe.summary(measured.windows))
    return rows


# --------------------------------------------------------------------------- load


def load_table(runtime: Any, table: CostTable) -> CostTable:
    """Install a saved table (checked against the running configuration) and log it."""
    install(runtime, table)
    cal = table.calibration or {}
    logger.info(
        "vllm-hust-vspec: cost table %s loaded, calibration skipped: cost_model=%s "
        "draft_width=%d coverage B=%s G=%s (measured on model %s, %s, host %s%s)",
        table.source, table.cost_model, table.draft_width, list(table.request_buckets),
        list(table.target_rows), table.model_id, table.dtype, table.host_version,
        "" if not cal.get("grid") else f"; saved calibration grid {json.dumps(cal['grid'])}",
    )
    return table


def install(runtime: Any, table: CostTable) -> None:
    """Give the engine's budget policy its one immutable table (before its first decision)."""
    if table.draft_width < runtime.kmax:
        raise CalibrationError(
            f"cost table {table.source}: field 'draft_width': {table.draft_width} is smaller "
            f"than the running width {runtime.kmax}")
    runtime.use_cost_table(table)


# --------------------------------------------------------------------------- calibrate


def calibrate_at_start(runtime: Any, engine_core: Any, grid: CalibrationGrid,
                       output: str | None) -> CostTable:
    """Check the grid against the engine's limits, measure, fit, install and (optionally)
    save."""
    t0 = time.perf_counter()
    _check_limits(engine_core.scheduler, grid)
    logger.info("vllm-hust-vspec calibration: %s", grid.describe())
    measured = measure(engine_core, runtime, grid, _time_cap(engine_core, grid))
    samples = [(w.batch, w.rows, w.step_s) for w in measured.windows]
    holdout = holdout_error(grid.cost_model, measured.windows)
    _log_holdout(grid, holdout, measured.remeasured)
    source = output if output is not None else f"{DEFAULT_SOURCE} ({grid.source})"
    try:
        metadata = running_metadata(engine_core, runtime)
        table = CostTable.fit(grid.cost_model, samples,
                              calibration=_calibration_record(grid, measured, holdout),
                              **metadata)
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


def _check_limits(scheduler: Any, grid: CalibrationGrid) -> None:
    """The grid against what this engine can schedule and hold (raises CalibrationError)."""
    capacity, block = _kv_capacity(scheduler)
    check_engine_limits(
        grid, source=grid.source,
        max_num_seqs=int(scheduler.max_num_running_reqs),
        max_num_batched_tokens=int(scheduler.max_num_scheduled_tokens),
        max_model_len=int(scheduler.max_model_len),
        kv_capacity_tokens=capacity,
        block_size=block,
    )


def _kv_capacity(scheduler: Any) -> tuple[int, int]:
    """The engine's KV cache in tokens, and its block size."""
    block = int(scheduler.block_size)
    return int(scheduler.kv_cache_config.num_blocks) * block, block


def _log_holdout(grid: CalibrationGrid, holdout: dict[str, Any] | None, remeasured: int) -> None:
    if holdout is None:
        logger.info("vllm-hust-vspec calibration: held-out error not measured "
                    "(windows_per_point=%d leaves no window to hold out)", grid.windows_per_point)
        return
    logger.info(
        "vllm-hust-vspec calibration: %s model, held-out median relative error %.2f%% "
        "(max %.2f%%) over %d windows (one per point; %d disturbed window(s) were "
        "measured again)", grid.cost_model, 100 * holdout["median"], 100 * holdout["max"],
        holdout["windows"], remeasured)


def _calibration_record(grid: CalibrationGrid, measured: Any,
                        holdout: dict[str, Any] | None) -> dict[str, Any]:
    """The table's ``calibration`` field: the grid, what was measured, the held-out error
    and each point's median step time."""
    return {
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
    """Write the table whole or not at all: a temporary file in the same directory, linked
    to ``path`` (which fails if ``path`` exists), then removed; an interrupted write leaves
    no ``path``."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(table.to_dict(), indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
    except FileExistsError:
        raise CalibrationError(
            f"adaptive_dspark_cost_table_output {path}: the file appeared during calibration; "
            "refusing to overwrite it") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


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
