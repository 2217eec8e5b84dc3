"""The calibration's engine driver: synthetic requests through every grid point.

:func:`measure` adds greedy synthetic requests through the engine core's own
``add_request`` (ids ``REQUEST_PREFIX`` + serial, a ``CACHE_SALT`` that keeps their KV
blocks apart from real prefixes), forces the K of each point (the grid's width w) by
installing a :class:`~.forced.ForcedK` in the engine runtime (the controller, the decision
trace and the recorder see none of these steps), times ``windows_per_point`` windows of
``window_steps`` steps per point, measures a disturbed window again, and always purges its requests (abort, flush the workers' request state,
reset the prefix cache).  :mod:`.runner` decides whether to calibrate and fits, installs
and saves the table.

Errors are :class:`~.grid.CalibrationError` (a ``SettingsError``): the engine does not start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import statistics
import time
from typing import Any

import numpy as np

from vllm_hust_vspec.startup_cost.fit import Window, subset_problem
from vllm_hust_vspec.startup_cost.forced import ForcedK
from vllm_hust_vspec.startup_cost.grid import CalibrationError, CalibrationGrid, ContextRange
from vllm_hust_vspec.startup_cost.stopping import StopSignals
from vllm_hust_vspec.progress import Progress

logger = logging.getLogger("vllm_hust_vspec")

REQUEST_PREFIX = "vspec-calibration-"  # ids of the synthetic requests
CACHE_SALT = "vllm-hust-vspec-calibration"  # keeps their KV blocks apart from real prefixes
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


def measure(engine_core: Any, runtime: Any, grid: CalibrationGrid,
            time_cap_s: float | None = None, what: str = "calibration") -> Measurement:
    """Drive the engine through every grid point (for at most ``time_cap_s``, default the
    grid's); always purges its requests.  A SIGTERM / SIGINT ends it at the next engine step
    (:class:`~.stopping.StopSignals`: ``SystemExit``, ``what`` names it in the log)."""
    cap = float(grid.time_cap_s if time_cap_s is None else time_cap_s)
    points = grid.points()
    rng = np.random.default_rng(grid.token_seed)
    vocab = int(engine_core.vllm_config.model_config.get_vocab_size())
    stop = StopSignals(what)
    driver = _Driver(engine_core, runtime, rng, vocab, stop)
    windows: list[Window] = []
    started = time.perf_counter()
    deadline = started + cap
    done = 0
    remeasured = 0
    stopped = False
    per_point_s: list[float] = []
    # a bar on a terminal; the log line of each point (with its ETA) is the record elsewhere
    bar = Progress(len(points), f"vllm-hust-vspec {what}", unit="point", lines=False)
    with stop:
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
                bar.update()
                logger.info(
                    "vllm-hust-vspec %s: point %d/%d B=%d G=%d (width %d, %s): "
                    "%.3f ms/step over %d windows%s; elapsed %.1f s, ETA %.1f s", what,
                    done, len(points), b, g, width, ctx.label(), ms, len(got),
                    f" ({again} disturbed window(s) measured again)" if again else "",
                    elapsed, eta)
        except BaseException:
            bar.close()
            # what failed may be the engine itself (a worker stopped by the same Ctrl-C): the
            # first error is the one to see, not the purge's
            with contextlib.suppress(Exception):
                driver.purge()
            stop.check()  # a stop signal (Ctrl-C also stops the workers) explains the failure
            raise
        bar.close()
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

    def __init__(self, engine_core: Any, runtime: Any, rng: np.random.Generator, vocab: int,
                 stop: StopSignals | None = None) -> None:
        self.core = engine_core
        self.stop = stop
        self.runtime = runtime
        self.rng = rng
        self.vocab = vocab
        self.live: list[str] = []  # ids of the calibration requests in the scheduler
        self.all_ids: set[str] = set()
        self.serial = 0
        self.forced = ForcedK(0, runtime.kmax, runtime.varies_k)  # the point's, once run

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
        """One engine step of the measurements (a stop signal ends them before it)."""
        if self.stop is not None:
            self.stop.check()
        self._run_step()

    def _run_step(self) -> None:
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
        self.forced = ForcedK(width, self.runtime.kmax, self.runtime.varies_k)
        self.runtime.override_k(self.forced)
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
            self.forced.steps.clear()

    def _window(self, index: int, batch: int, rows: int, width: int, ctx: ContextRange,
                grid: CalibrationGrid, deadline: float) -> Window | None:
        """One window of ``window_steps`` pure decode steps (None: the time cap ran out)."""
        bad = 0
        while True:
            if time.perf_counter() > deadline:
                return None
            growth = (grid.window_steps + 2) * (width + 1)
            if max(self._kv_lengths(), default=0) + growth > ctx.max_kv_length:
                # the requests would leave the context range: start a fresh set
                self._abort()
                self._start(batch, ctx, grid, deadline)
            steps = self.forced.steps
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
        """Fresh requests, prefilled, then ``warmup_steps`` decode steps at the forced K."""
        self._add(batch, ctx)
        steps = self.forced.steps
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
                self._run_step()  # also after a stop signal
                flushes += 1
            left = sorted(r for r in self.all_ids if r in scheduler.requests)
            if left:
                raise RuntimeError(f"vllm-hust-vspec calibration: requests {left} left after the purge")
            if not core.reset_prefix_cache():
                raise RuntimeError("vllm-hust-vspec calibration: prefix cache reset failed")
        finally:
            self.runtime.override_k(None)
