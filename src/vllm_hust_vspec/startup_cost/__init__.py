"""Start-up cost calibration (DSpark "启动标定"): the grid the engine measures before the
server reports ready, its validation, and which of calibrate / load a saved table / nothing
a configuration asks for.

* :mod:`.grid` -- :class:`CalibrationGrid` (defaults or a JSON file), the pre-flight and
  engine-limit checks, the cost-table check;
* :mod:`.plan` -- :func:`calibration_settings`: the settings -> what the engine does at start.

Pure Python (no vLLM, no torch): the launcher runs every check here in ``--dry-run``.
"""

from .grid import (
    CalibrationError,
    CalibrationGrid,
    ContextRange,
    check_cost_table,
    check_engine_limits,
    grid_from_dict,
    load_grid,
)
from .plan import CalibrationPlan, calibration_settings, check_output_path

__all__ = [
    "CalibrationError",
    "CalibrationGrid",
    "CalibrationPlan",
    "ContextRange",
    "calibration_settings",
    "check_cost_table",
    "check_engine_limits",
    "check_output_path",
    "grid_from_dict",
    "load_grid",
]
