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

import codecs
import csv
import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from satmon.functional.threshold_fit import (
    RULES,
    GroupCV,
    ThresholdFit,
    accuracy,
    auc,
    fit_threshold,
    leave_one_group_out,
)
from satmon.paths import kind_of
from satmon.results.calibration import (
    FORMAT,
    Calibration,
    CalibrationError,
    calibration_from_payload,
    load_calibration,
    short_repr,
)
from satmon.study import THRESHOLD

__all__ = [
    "Calibration",
    "CalibrationError",
    "CalibrationResult",
    "Cell",
    "STUDY_THRESHOLD",
    "calibrate",
    "check_reading",
    "is_fraction",
    "load_calibration",
    "read_cells",
    "read_text",
    "study_cells",
    "write_calibration",
]

STUDY_THRESHOLD = THRESHOLD
MIN_CELLS = 4
_YES, _NO = {"yes", "true", "helps", "help", "go"}, {"no", "false", "hurts", "hurt", "no-go"}
_NOT_READINGS = {"name", "group", "delta", "helps", "outcome", "seed"}
#: characters no CSV or JSON text holds (C0 controls but tab, newlines, vertical tab, form feed; DEL)
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f]")


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
def is_fraction(name: str) -> bool:
    """Whether a reading is a fraction of elements, so must lie in [0, 1]: ``saturation`` and ``saturation_*``.

    Example:
        >>> is_fraction("saturation"), is_fraction("saturation_end"), is_fraction("d_model")
        (True, True, False)
    """
    return name == "saturation" or name.startswith("saturation_")


def check_reading(name: str, value: float, where: str) -> float:
    """``value`` unless it is a finite fraction reading (:func:`is_fraction`) outside [0, 1]: then an error.

    Non-finite readings pass here; :func:`calibrate` refuses them in the metric it fits.

    Example:
        >>> check_reading("saturation", 1.7, "cells.csv row 3")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.results.calibration.CalibrationError: Expected 'saturation' in [0, 1] (a fraction of elements),
        got 1.7 (cells.csv row 3): ...
    """
    if is_fraction(name) and math.isfinite(value) and not 0.0 <= value <= 1.0:
        raise CalibrationError(
            f"Expected {name!r} in [0, 1] (a fraction of elements), got {value!r} ({where}): it is "
            "not a saturation satmon measured; fix the value or drop the cell."
        )
    return value


def to_float(value: Any, what: str, where: str) -> float | None:
    """``value`` as a finite float; ``None`` when blank; an error when it is not a number, or NaN or inf.

    Example:
        >>> to_float(" 2.5 ", "dyt_val_loss", "row 1"), to_float("", "dyt_val_loss", "row 1")
        (2.5, None)
        >>> to_float("nan", "dyt_val_loss", "row 1")
        Traceback (most recent call last):
        ...
        satmon.results.calibration.CalibrationError: Expected a finite number for dyt_val_loss (row 1), got 'nan': ...
    """
    if _blank(value):
        return None
    number = _number(value)
    if number is None:
        raise CalibrationError(f"Expected a number for {what} ({where}), got {short_repr(value, 40)}: fix the file.")
    if not math.isfinite(number):
        raise CalibrationError(
            f"Expected a finite number for {what} ({where}), got {short_repr(value, 40)}: a NaN or inf outcome "
            "cannot be compared; fix the value or drop the row."
        )
    return number


def _names(names: Sequence[str], quote: bool = True, limit: int = 5) -> str:
    """The first few of ``names``, for a message."""
    shown = [repr(n) if quote else n for n in names[:limit]]
    return ", ".join(shown) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def _number(value: Any) -> float | None:
    """``value`` as a float (NaN and inf included), or ``None`` when it is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):  # OverflowError: an integer beyond float's range
        return None


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _helps_word(key: str, raw: Any, where: str) -> bool | None:
    """``helps``/``outcome`` read as yes/no: ``None`` when it is no such word (a number in ``outcome``)."""
    if isinstance(raw, bool):
        return raw
    word = str(raw).strip().lower()
    if word in _YES or (key == "helps" and word in ("1", "1.0")):
        return True
    if word in _NO or (key == "helps" and word in ("0", "0.0")):
        return False
    if key == "helps":
        raise CalibrationError(
            f"Expected yes/no in 'helps' ({where}), got {short_repr(raw, 40)}: write yes or no (or 1/0)."
        )
    return None


def _outcome(row: Mapping[str, Any], where: str) -> tuple[bool, float | None]:
    """``(helps, delta)`` from ``delta`` (a finite number, negative = DyT helps), ``helps`` (yes/no, 1/0)
    or ``outcome`` (a delta, or yes/no). The outcome columns a row fills must agree."""
    said: dict[str, bool] = {}
    delta = to_float(row.get("delta"), "'delta'", where)
    if delta is not None:
        said["delta"] = delta < 0
    if not _blank(row.get("helps")):
        said["helps"] = bool(_helps_word("helps", row["helps"], where))
    if not _blank(row.get("outcome")):
        word = _helps_word("outcome", row["outcome"], where)
        if word is None:
            value = to_float(row["outcome"], "'outcome' (a delta, negative = DyT helps, or yes/no)", where)
            delta, word = (value if delta is None else delta), value < 0
        said["outcome"] = word
    if not said:
        raise CalibrationError(
            f"Expected an outcome for every cell ('delta', negative = DyT helps; or 'helps', yes/no), "
            f"got none ({where}): fill it in or drop the cell."
        )
    if len(set(said.values())) > 1:
        told = ", ".join(f"{k} says DyT {'helped' if v else 'hurt'}" for k, v in said.items())
        raise CalibrationError(f"Expected the outcome columns to agree ({where}), got {told}: fix one of them.")
    return next(iter(said.values())), delta


def _label(row: Mapping[str, Any], key: str, where: str) -> str:
    """A cell's ``name`` or ``group``: a string or an integer (``""`` when absent)."""
    value = row.get(key)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise CalibrationError(
            f"Expected {key!r} to be a name (text or a number), got {short_repr(value, 40)} ({where})."
        )
    return str(value).strip()


def _cell(row: Mapping[str, Any], where: str) -> Cell:
    """A cell from a row with ``group``, an outcome and numeric readings (every other numeric field)."""
    group = _label(row, "group", where)
    if not group:
        raise CalibrationError(
            f"Expected a 'group' for every cell, got none ({where}): add a group key such as model size."
        )
    helps, delta = _outcome(row, where)
    numbers = ((str(k), _number(v)) for k, v in row.items() if k not in _NOT_READINGS)
    readings = {k: check_reading(k, v, where) for k, v in numbers if v is not None}
    return Cell(_label(row, "name", where) or where, group, helps, readings, delta)


def _unique(cells: Sequence[Cell], path: Path) -> list[Cell]:
    """``cells`` unless two share a name (a run listed twice would count twice)."""
    seen: dict[str, int] = {}
    for c in cells:
        seen[c.name] = seen.get(c.name, 0) + 1
    twice = [n for n, k in seen.items() if k > 1]
    if twice:
        raise CalibrationError(
            f"Expected each cell once in {path}, got {len(twice)} name(s) listed more than once: "
            f"{_names(twice)}: keep one row per run."
        )
    return list(cells)


#: The largest text input ``satmon calibrate`` reads (a cells file, outcomes, replay records): checked before reading.
MAX_INPUT = 256 << 20


def read_text(path: str | Path, what: str) -> str:
    """The text of a user's input file: UTF-8 (a byte-order mark is dropped) or UTF-16 with its mark.

    Raises:
        CalibrationError: no such file, a folder, an unreadable file, or bytes that are not text
            (a binary file, another encoding), naming the file and what to do.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.csv"
        >>> _ = p.write_bytes(b"\\xef\\xbb\\xbfsaturation,group\\n")
        >>> read_text(p, "a cells file")
        'saturation,group\\n'
    """
    path = Path(path)
    kind = kind_of(path)  # by lstat/stat: a FIFO, a socket, a device or a link to one is named, never opened
    if kind.kind == "folder":
        raise CalibrationError(f"Expected {what}, got a folder at {str(path)!r}: pass the file itself.")
    if kind.kind == "missing":
        raise CalibrationError(f"Expected {what}, got no file at {str(path)!r}.")
    if not kind.regular:
        raise CalibrationError(
            f"Expected {what} (a regular file), got {str(path)[:240]!r}, which is {kind.describe()}: "
            "pass the file itself (it was not opened)."
        )
    size = kind.st.st_size if kind.st is not None else 0
    if size > MAX_INPUT:  # read whole: a 1 TB sparse file named runs.json is refused by its size
        raise CalibrationError(
            f"Expected {what} of at most {MAX_INPUT >> 20} MiB (a calibration's inputs are a few MiB), "
            f"got {size:,} bytes at {str(path)[:240]!r}: pass the file itself."
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CalibrationError(f"Expected {what} this user can read, got {e.strerror or e} at {str(path)!r}.") from None
    try:
        if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CalibrationError(
            f"Expected {what} as UTF-8 text, got bytes that are not (byte {e.start} of {str(path)!r}: "
            "a binary file, or another encoding): save it as UTF-8 CSV or JSON."
        ) from None
    control = _CONTROL.search(text)
    if control:
        raise CalibrationError(
            f"Expected {what} as text, got the control character {control.group()!r} at character "
            f"{control.start()} of {str(path)!r} (a binary file?): pass the CSV or JSON file."
        )
    return text


def csv_rows(text: str, path: str) -> list[dict[str, str]]:
    """Rows of a CSV with a header (``#`` lines are comments); every row must have the header's width,
    and no column name may repeat. A byte-order mark before the header is dropped.

    Example:
        >>> csv_rows("\\ufeffrun,group\\n# a comment\\na, d64\\n", "o.csv")
        [{'run': 'a', 'group': 'd64'}]
    """
    lines = (l for l in text.removeprefix("\ufeff").splitlines() if not l.lstrip().startswith("#"))
    try:
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
    except csv.Error as e:
        raise CalibrationError(f"Expected a CSV in {path}, got a parse error: {e}: fix the file.") from None
    rows = [r for r in rows if any(v.strip() for v in r)]
    if len(rows) < 2:
        raise CalibrationError(
            f"Expected a CSV header and at least one row in {path}, got {max(0, len(rows) - 1)} rows."
        )
    header = [h.strip() for h in rows[0]]
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        raise CalibrationError(
            f"Expected each column once in the header of {path}, got {', '.join(map(repr, twice))} "
            "more than once: rename or drop the copies."
        )
    for i, r in enumerate(rows[1:], start=1):
        if len(r) != len(header):
            raise CalibrationError(
                f"Expected {len(header)} columns ({','.join(header)}) on every row of {path}, got "
                f"{len(r)} on data row {i}: fix the CSV."
            )
    return [dict(zip(header, (v.strip() for v in r))) for r in rows[1:]]


def read_cells(path: str | Path, on_skip: Callable[[str], None] | None = None) -> list[Cell]:
    """Cells from a CSV (columns ``group``, ``delta`` or ``helps``, readings such as ``saturation``;
    ``#`` lines are comments) or a JSON file (a list of cell objects, or ``{"cells": [...]}``).

    A grid cell whose arms all diverged (``satmon grid``'s ``diverged`` names each arm's first non-finite step, and
    its ``delta`` and ``helps`` are null) has no outcome to calibrate on: it is left out and named through
    ``on_skip`` (a cell with one diverged arm keeps the outcome the grid gave it).

    Every outcome must be finite and the outcome columns given must agree; ``saturation`` readings
    (and ``saturation_*``) must lie in [0, 1]; a ``name`` may appear once.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "cells.csv"
        >>> _ = p.write_text("saturation,outcome,group\\n0.5,-0.1,a\\n0.2,yes,b\\n")
        >>> [(c.readings["saturation"], c.helps, c.group) for c in read_cells(p)]
        [(0.5, True, 'a'), (0.2, True, 'b')]
    """
    path = Path(path)
    text = read_text(path, "a cells file (CSV or JSON)")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            why = "nested too deep" if isinstance(e, RecursionError) else str(e)
            raise CalibrationError(f"Expected JSON in {path}, got a parse error: {why}.") from None
        rows = data.get("cells") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise CalibrationError(
                f"Expected a list of cell objects (or {{'cells': [...]}}) in {path}, got {type(rows).__name__}."
            )
        kept = [(i, r) for i, r in enumerate(rows) if not _no_outcome_diverged(r, f"{path.name} cell {i}", on_skip)]
        return _unique([_cell(r, f"{path.name} cell {i}") for i, r in kept], path)
    return _unique([_cell(r, f"{path.name} row {i}") for i, r in enumerate(csv_rows(text, str(path)), start=1)], path)


def _no_outcome_diverged(row: Mapping[str, Any], where: str, on_skip: Callable[[str], None] | None) -> bool:
    """Whether a grid cell has no outcome because its arms diverged (said through ``on_skip``)."""
    diverged = row.get("diverged")
    if not isinstance(diverged, Mapping) or not diverged or not (_blank(row.get("delta")) and _blank(row.get("helps"))):
        return False
    if on_skip is not None:
        arms = ", ".join(f"{arm} at step {step}" for arm, step in diverged.items())
        on_skip(
            f"left out {row.get('name') or where}: its arms diverged ({arms}), so it has no outcome to calibrate on"
        )
    return True


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
    study_accuracy: float  # the study's threshold applied to these cells
    source: str = ""


def calibrate(cells: Sequence[Cell], metric: str = "saturation", source: str = "") -> CalibrationResult:
    """Fit the GO threshold on ``metric`` by both rules, with leave-one-group-out accuracy and AUC.

    Raises:
        CalibrationError: fewer than 4 cells, fewer than 2 groups, one class only, a cell without a finite
            ``metric`` reading (or a fraction reading outside [0, 1]), or a non-finite delta.

    Example:
        >>> r = calibrate(study_cells(), source="study")
        >>> round(r.fits["midpoint"].threshold, 5), r.fits["midpoint"].accuracy, r.cv["midpoint"].accuracy, r.auc
        (0.43985, 0.75, 0.5, 0.75)
    """
    missing = [c.name for c in cells if metric not in c.readings]
    if missing:
        have = sorted({k for c in cells for k in c.readings})
        raise CalibrationError(
            f"Expected a finite {metric!r} reading for every cell, got none for {_names(missing)}: pick a "
            f"metric every cell has ({', '.join(have) or 'none'})."
        )
    bad = [f"{c.readings[metric]} for {c.name!r}" for c in cells if not math.isfinite(c.readings[metric])]
    if bad:
        raise CalibrationError(
            f"Expected a finite {metric!r} reading for every cell, got {_names(bad, quote=False)}: a NaN "
            "or inf reading is a run that diverged or a measurement that failed; drop the cell."
        )
    for c in cells:
        check_reading(metric, c.readings[metric], f"cell {c.name!r}")
        if c.delta is not None and not math.isfinite(c.delta):
            raise CalibrationError(
                f"Expected a finite delta for every cell, got {c.delta} for {c.name!r}: drop the cell."
            )
    if len(cells) < MIN_CELLS:
        raise CalibrationError(
            f"Expected at least {MIN_CELLS} cells (runs with an outcome), got {len(cells)}: add runs; "
            "a threshold fit on fewer is noise."
        )
    groups = sorted({c.group for c in cells})
    if len(groups) < 2:
        raise CalibrationError(
            f"Expected at least 2 groups for leave-one-group-out, got 1 ({groups[0]!r}): give the runs "
            "a group key that varies (model size, data budget)."
        )
    helps = [c.helps for c in cells]
    if all(helps) or not any(helps):
        raise CalibrationError(
            f"Expected cells where DyT helped and cells where it hurt, got only "
            f"{'helped' if helps[0] else 'hurt'} ({len(cells)} cells): no threshold separates one class; "
            "add runs from the other regime."
        )
    scores, names = [c.readings[metric] for c in cells], [c.group for c in cells]
    fits = {r: fit_threshold(scores, helps, r) for r in RULES}
    cv = {r: leave_one_group_out(scores, helps, names, r) for r in RULES}
    return CalibrationResult(
        metric, tuple(cells), fits, cv, auc(scores, helps), accuracy(scores, helps, STUDY_THRESHOLD), source
    )


# ------------------------------------------------------------------------------------ the JSON file
def _fit_json(fit: ThresholdFit, cv: GroupCV) -> dict[str, Any]:
    return {
        "threshold": fit.threshold,
        "accuracy": fit.accuracy,
        "balanced_accuracy": fit.balanced_accuracy,
        "correct": fit.correct,
        "threshold_outside_scores": fit.threshold_outside,
        "leave_one_group_out": {
            "accuracy": cv.accuracy,
            "balanced_accuracy": cv.balanced_accuracy,
            "correct": cv.correct,
            "folds": [f._asdict() for f in cv.folds],
        },
    }


def write_calibration(
    result: CalibrationResult, path: str | Path, rule: str = "midpoint", command: str = ""
) -> Calibration:
    """Write ``calibration.json`` (threshold by ``rule``, both rules' fits, the cells, provenance) and return it.

    A threshold outside (0, 1) (a fit that predicts one class everywhere) is written, but
    :func:`load_calibration` refuses it. The file is replaced only by a complete one.
    """
    from satmon._version import __version__
    from satmon.io.atomic import atomic_write
    from satmon.io.json_records import to_json

    if rule not in result.fits:
        raise CalibrationError(f"Expected rule to be one of {sorted(result.fits)}, got {rule!r}.")
    fit, cv = result.fits[rule], result.cv[rule]
    payload = {
        "format": FORMAT,
        "version": 1,
        "threshold": fit.threshold,
        "rule": rule,
        "metric": result.metric,
        "n": len(result.cells),
        "groups": len({c.group for c in result.cells}),
        "helps": sum(c.helps for c in result.cells),
        "accuracy": fit.accuracy,
        "loso_accuracy": cv.accuracy,
        "auc": result.auc,
        "study_threshold": {"threshold": STUDY_THRESHOLD, "accuracy": result.study_accuracy},
        "fits": {r: _fit_json(result.fits[r], result.cv[r]) for r in result.fits},
        "cells": [
            {
                "name": c.name,
                "group": c.group,
                result.metric: c.readings[result.metric],
                "helps": c.helps,
                "delta": c.delta,
            }
            for c in result.cells
        ],
        "provenance": {
            "source": result.source,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "satmon_version": __version__,
            "command": command,
        },
    }
    path = Path(path)
    atomic_write(path, json.dumps(to_json(payload), indent=1) + "\n")  # an interrupt leaves the previous file whole
    return calibration_from_payload(to_json(payload), path)
