"""Calibrating the GO threshold on your own runs: cells in, ``calibration.json`` out.

A *cell* is one comparison: a DyT run's screen reading (the verdict's pooled saturation unless told
otherwise), whether DyT beat LayerNorm on the same setup (final validation loss lower), and a group
key (model size, ...) for leave-one-group-out. Cells come from a cells file (CSV or JSON), from the
study's own 12 (:func:`study_cells`), or from satmon runs (TensorBoard folders, replay JSON) joined
with a CSV of outcomes (:mod:`satmon.calibrate.runs`). :func:`calibrate` fits them
with :mod:`satmon.functional.threshold_fit`; :func:`write_calibration` writes the JSON that
:func:`load_calibration` reads back as a :class:`Calibration`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from satmon.results.calibration import FORMAT, Calibration, CalibrationError, calibration_from_payload, load_calibration
from satmon.study import THRESHOLD
from satmon.functional.threshold_fit import RULES, GroupCV, ThresholdFit, accuracy, auc, fit_threshold, leave_one_group_out

__all__ = [
    "Calibration", "CalibrationError", "CalibrationResult", "Cell", "STUDY_THRESHOLD", "calibrate", "load_calibration",
    "read_cells", "study_cells", "write_calibration",
]

STUDY_THRESHOLD = THRESHOLD
MIN_CELLS = 4
_YES, _NO = {"yes", "true", "helps", "help", "go"}, {"no", "false", "hurts", "hurt", "no-go"}
_NOT_READINGS = {"name", "group", "delta", "helps", "outcome", "seed"}


@dataclass(frozen=True)
class Cell:
    """One comparison: readings of the DyT run, whether DyT helped, its group.

    Attributes:
        name: the cell's (or run's) name.
        group: the leave-one-group-out key.
        helps: DyT's final validation loss was lower than LayerNorm's.
        readings: metric name -> value (``"saturation"``: the verdict's pooled saturation).
        delta: ``(DyT - LayerNorm) / LayerNorm`` when known (negative = DyT helps).
    """

    name: str
    group: str
    helps: bool
    readings: Mapping[str, float]
    delta: float | None = None


# ---------------------------------------------------------------------------------------- cells in
def to_float(value: Any, what: str, where: str) -> float | None:
    """``value`` as a float; ``None`` when blank; an error when it is not a number."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CalibrationError(f"Expected a number for {what} ({where}), got {value!r}: fix the file.") from None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _outcome(row: Mapping[str, Any], where: str) -> tuple[bool, float | None]:
    """``(helps, delta)`` from ``delta`` (negative = DyT helps), ``helps`` (yes/no, 1/0) or ``outcome``
    (a delta, or yes/no)."""
    delta = to_float(row.get("delta"), "'delta'", where)
    if delta is not None:
        return delta < 0, delta
    for key in ("helps", "outcome"):
        raw = row.get(key)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            continue
        if isinstance(raw, bool):
            return raw, None
        word = str(raw).strip().lower()
        if word in _YES or (key == "helps" and word in ("1", "1.0")):
            return True, None
        if word in _NO or (key == "helps" and word in ("0", "0.0")):
            return False, None
        if key == "outcome":
            value = to_float(raw, "'outcome' (a delta, negative = DyT helps, or yes/no)", where)
            return bool(value is not None and value < 0), value
        raise CalibrationError(f"Expected yes/no in 'helps' ({where}), got {raw!r}: write yes or no.")
    raise CalibrationError(f"Expected an outcome for every cell ('delta', negative = DyT helps; or 'helps', yes/no), "
                           f"got none ({where}): fill it in or drop the cell.")


def _cell(row: Mapping[str, Any], where: str) -> Cell:
    """A cell from a row with ``group``, an outcome and numeric readings (every other numeric field)."""
    group = str(row.get("group") if row.get("group") is not None else "").strip()
    if not group:
        raise CalibrationError(f"Expected a 'group' for every cell, got none ({where}): add a group key such as model size.")
    helps, delta = _outcome(row, where)
    readings = {k: v for k, v in ((k, _number(v)) for k, v in row.items() if k not in _NOT_READINGS) if v is not None}
    return Cell(str(row.get("name") or where), group, helps, readings, delta)


def csv_rows(text: str, path: str) -> list[dict[str, str]]:
    """Rows of a CSV with a header (``#`` lines are comments); every row must have the header's width."""
    rows = list(csv.reader(io.StringIO("\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))))
    rows = [r for r in rows if any(v.strip() for v in r)]
    if len(rows) < 2:
        raise CalibrationError(f"Expected a CSV header and at least one row in {path}, got {max(0, len(rows) - 1)} rows.")
    header = [h.strip() for h in rows[0]]
    for i, r in enumerate(rows[1:], start=1):
        if len(r) != len(header):
            raise CalibrationError(f"Expected {len(header)} columns ({','.join(header)}) on every row of {path}, got "
                                   f"{len(r)} on data row {i}: fix the CSV.")
    return [dict(zip(header, (v.strip() for v in r))) for r in rows[1:]]


def read_cells(path: str | Path) -> list[Cell]:
    """Cells from a CSV (columns ``group``, ``delta`` or ``helps``, readings such as ``saturation``;
    ``#`` lines are comments) or a JSON file (a list of cell objects, or ``{"cells": [...]}``).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "cells.csv"
        >>> _ = p.write_text("saturation,outcome,group\\n0.5,-0.1,a\\n0.2,yes,b\\n")
        >>> [(c.readings["saturation"], c.helps, c.group) for c in read_cells(p)]
        [(0.5, True, 'a'), (0.2, True, 'b')]
    """
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"Expected a cells file (CSV or JSON), got no file at {str(path)!r}.")
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise CalibrationError(f"Expected JSON in {path}, got a parse error: {e}.") from None
        rows = data.get("cells") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise CalibrationError(f"Expected a list of cell objects (or {{'cells': [...]}}) in {path}, got {type(rows).__name__}.")
        return [_cell(r, f"{path.name} cell {i}") for i, r in enumerate(rows)]
    return [_cell(r, f"{path.name} row {i}") for i, r in enumerate(csv_rows(text, str(path)), start=1)]


def study_cells() -> list[Cell]:
    """The regime study's 12 calibration cells (saturation, delta, model-size group), shipped with satmon.

    Example:
        >>> cells = study_cells()
        >>> len(cells), cells[0].name, cells[0].readings["saturation"], cells[0].helps
        (12, '64M/1M', 0.4931, True)
    """
    text = resources.files("satmon").joinpath("data_files/study_cells.csv").read_text()
    return [_cell(r, f"study_cells.csv row {i}") for i, r in enumerate(csv_rows(text, "study_cells.csv"), start=1)]


# ------------------------------------------------------------------------------------------ fitting
@dataclass(frozen=True)
class CalibrationResult:
    """Both rules' fits on one metric, their leave-one-group-out scores, the AUC and the cells."""

    metric: str
    cells: tuple[Cell, ...]
    fits: Mapping[str, ThresholdFit]
    cv: Mapping[str, GroupCV]
    auc: float
    study_accuracy: float  # the study's 0.43 applied to these cells
    source: str = ""


def calibrate(cells: Sequence[Cell], metric: str = "saturation", source: str = "") -> CalibrationResult:
    """Fit the GO threshold on ``metric`` by both rules, with leave-one-group-out accuracy and AUC.

    Raises:
        CalibrationError: fewer than 4 cells, fewer than 2 groups, one class only, or a cell without ``metric``.

    Example:
        >>> r = calibrate(study_cells(), source="study")
        >>> round(r.fits["midpoint"].threshold, 5), r.fits["midpoint"].accuracy, r.cv["midpoint"].accuracy, r.auc
        (0.43985, 0.75, 0.5, 0.75)
    """
    lacking = [c.name for c in cells if not math.isfinite(c.readings.get(metric, math.nan))]
    if lacking:
        have = sorted({k for c in cells for k in c.readings})
        raise CalibrationError(f"Expected a finite {metric!r} reading for every cell, got none for {', '.join(lacking[:5])}"
                               f"{' ...' if len(lacking) > 5 else ''}: pick a metric every cell has ({', '.join(have)}).")
    if len(cells) < MIN_CELLS:
        raise CalibrationError(f"Expected at least {MIN_CELLS} cells (runs with an outcome), got {len(cells)}: add runs; "
                               "a threshold fit on fewer is noise.")
    groups = sorted({c.group for c in cells})
    if len(groups) < 2:
        raise CalibrationError(f"Expected at least 2 groups for leave-one-group-out, got 1 ({groups[0]!r}): give the runs "
                               "a group key that varies (model size, data budget).")
    helps = [c.helps for c in cells]
    if all(helps) or not any(helps):
        raise CalibrationError(f"Expected cells where DyT helped and cells where it hurt, got only "
                               f"{'helped' if helps[0] else 'hurt'} ({len(cells)} cells): no threshold separates one class; "
                               "add runs from the other regime.")
    scores, names = [c.readings[metric] for c in cells], [c.group for c in cells]
    fits = {r: fit_threshold(scores, helps, r) for r in RULES}
    cv = {r: leave_one_group_out(scores, helps, names, r) for r in RULES}
    return CalibrationResult(metric, tuple(cells), fits, cv, auc(scores, helps), accuracy(scores, helps, STUDY_THRESHOLD), source)


# ------------------------------------------------------------------------------------ the JSON file
def _fit_json(fit: ThresholdFit, cv: GroupCV) -> dict[str, Any]:
    return {"threshold": fit.threshold, "accuracy": fit.accuracy, "balanced_accuracy": fit.balanced_accuracy,
            "correct": fit.correct, "threshold_outside_scores": fit.threshold_outside,
            "leave_one_group_out": {"accuracy": cv.accuracy, "balanced_accuracy": cv.balanced_accuracy,
                                    "correct": cv.correct, "folds": [f._asdict() for f in cv.folds]}}


def write_calibration(result: CalibrationResult, path: str | Path, rule: str = "midpoint", command: str = "") -> Calibration:
    """Write ``calibration.json`` (threshold by ``rule``, both rules' fits, the cells, provenance) and return it.

    A threshold outside (0, 1) (a fit that predicts one class everywhere) is written, but
    :func:`load_calibration` refuses it.
    """
    from satmon._version import __version__
    from satmon.io.json_records import to_json

    if rule not in result.fits:
        raise CalibrationError(f"Expected rule to be one of {sorted(result.fits)}, got {rule!r}.")
    fit, cv = result.fits[rule], result.cv[rule]
    payload = {
        "format": FORMAT, "version": 1, "threshold": fit.threshold, "rule": rule, "metric": result.metric,
        "n": len(result.cells), "groups": len({c.group for c in result.cells}),
        "helps": sum(c.helps for c in result.cells), "accuracy": fit.accuracy, "loso_accuracy": cv.accuracy,
        "auc": result.auc, "study_threshold": {"threshold": STUDY_THRESHOLD, "accuracy": result.study_accuracy},
        "fits": {r: _fit_json(result.fits[r], result.cv[r]) for r in result.fits},
        "cells": [{"name": c.name, "group": c.group, result.metric: c.readings[result.metric], "helps": c.helps,
                   "delta": c.delta} for c in result.cells],
        "provenance": {"source": result.source, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "satmon_version": __version__, "command": command},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(payload), indent=1) + "\n")
    return calibration_from_payload(to_json(payload), path)
