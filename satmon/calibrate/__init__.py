"""``satmon calibrate``: fit the GO threshold on your own cells or runs, and read a fitted
``calibration.json`` back.

Example:
    >>> from satmon.calibrate import calibrate, study_cells
    >>> round(calibrate(study_cells(), source="study").fits["midpoint"].threshold, 5)
    0.43985
"""

from typing import Any

from satmon.calibrate.fit import (
    Calibration,
    CalibrationError,
    CalibrationResult,
    Cell,
    calibrate,
    load_calibration,
    read_cells,
    study_cells,
    write_calibration,
)

__all__ = [
    "Calibration",
    "CalibrationError",
    "CalibrationResult",
    "Cell",
    "calibrate",
    "load_calibration",
    "read_cells",
    "study_cells",
    "write_calibration",
]


def __getattr__(name: str) -> Any:
    from satmon import _compat  # a name of satmon 0.2's satmon.calibrate module

    return _compat.moved_attribute(__name__, name)
