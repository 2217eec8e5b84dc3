"""What the engine does about the cost table at start, from the settings.

* ``off``: the policy is not ``budget`` (or the controller is off): nothing;
* ``load``: ``adaptive_dspark_cost_table`` is given: the saved table, checked against the
  running width (and the running configuration when given), is installed; no calibration;
* ``calibrate``: policy ``budget`` without a table: the grid (``adaptive_dspark_calibration``
  or the built-in defaults) is measured before the server reports ready, the fitted table
  installed, and saved to ``adaptive_dspark_cost_table_output`` when that is given.

The launcher (``--dry-run`` too) and the engine run the same checks; the engine repeats
them with what only it knows (max_model_len, captured graph sizes, model identity).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_hust_vspec import settings as schema
from vllm_hust_vspec.adaptive.costmodel import CostTable
from vllm_hust_vspec.startup_cost.grid import CalibrationError, CalibrationGrid, check_cost_table, load_grid

MODES = ("off", "load", "calibrate")


@dataclass(frozen=True)
class CalibrationPlan:
    mode: str  # one of MODES
    grid: CalibrationGrid | None = None  # mode 'calibrate'
    table: CostTable | None = None  # mode 'load'
    output: str | None = None  # mode 'calibrate': where the fitted table is saved (or None)

    def describe(self) -> str:
        """One log line for the engine's start-up log."""
        if self.mode == "load":
            assert self.table is not None
            t = self.table
            return (f"DSpark cost table loaded from {t.source} (calibration skipped): "
                    f"cost_model={t.cost_model} draft_width={t.draft_width} "
                    f"B={list(t.request_buckets)} G={list(t.target_rows)} "
                    f"calibration={dict(t.calibration) if t.calibration else None}")
        if self.mode == "calibrate":
            assert self.grid is not None
            return self.grid.describe() + (f"; table saved to {self.output}" if self.output
                                           else "; table kept in memory only")
        return "DSpark start-up calibration off (policy is not budget)"


def calibrating(values: Mapping[str, Any]) -> bool:
    """True when the settings run the budget policy, the one that reads the cost table."""
    return bool(values["adaptive_speculation"]) and "budget" in schema.policies_in_use(values)


def check_output_path(path: str, source: str) -> None:
    """A cost-table output must be a new file in an existing, writable directory (a saved
    table is never overwritten). ``source`` names the flag / key / env var in the error."""
    p = pathlib.Path(path)
    if p.exists() or p.is_symlink():
        raise CalibrationError(f"{source}: {path} already exists; choose a file that does not "
                               f"exist yet (a saved cost table is never overwritten)")
    parent = p.parent
    if not parent.is_dir():
        raise CalibrationError(f"{source}: directory {parent} of {path} does not exist "
                               f"(create it before the launch)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CalibrationError(f"{source}: directory {parent} of {path} is not writable")


def _env_source(name: str) -> str:
    return f"env {schema.option(name).env}"


def calibration_settings(
    values: Mapping[str, Any],
    *,
    draft_width: int,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    graph_buckets: Sequence[int] | None = None,
    running: Mapping[str, Any] | None = None,
    sources: Mapping[str, str] | None = None,
) -> CalibrationPlan:
    """The plan for ``values`` (a :class:`~vllm_hust_vspec.settings.Settings` or any mapping
    of option names) at running width ``draft_width`` (``num_speculative_tokens``).

    Refuses the option conflicts (:func:`settings.check_calibration_options`), loads and
    validates the calibration file or the cost table, checks the output path.
    ``sources`` maps option names to what set them (flags in the launcher); the engine
    leaves it None and errors name the ``HUST_VSPEC_*`` variables. Raises
    :class:`CalibrationError`."""
    calibration = values["adaptive_dspark_calibration"]
    table_path = values["adaptive_dspark_cost_table"]
    output = values["adaptive_dspark_cost_table_output"]

    def src(name: str) -> str:
        return sources[name] if sources is not None else _env_source(name)

    try:
        schema.check_calibration_options(values, "settings")
    except schema.SettingsError as exc:
        raise CalibrationError(str(exc)) from None
    if not calibrating(values):
        return CalibrationPlan("off")
    if table_path:
        table = check_cost_table(table_path, draft_width=draft_width, running=running)
        return CalibrationPlan("load", table=table)
    if output:
        check_output_path(output, src("adaptive_dspark_cost_table_output"))
    grid = load_grid(calibration, draft_width=draft_width, max_model_len=max_model_len,
                     graph_buckets=graph_buckets, max_num_seqs=max_num_seqs)
    return CalibrationPlan("calibrate", grid=grid, output=output)
