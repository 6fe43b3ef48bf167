"""A fitted GO threshold and where it came from: the :class:`Calibration` that ``satmon calibrate`` writes.

The fit lives in :mod:`satmon.calibrate.fit` (which writes the file); reading it back lives here, below
the settings (:class:`satmon.settings.Settings` takes ``calibration=``), so that the settings never
import the calibrate layer. The file is JSON, ``"format": "satmon-calibration"``:

    {"format": "satmon-calibration", "version": 1, "threshold": 0.45, "rule": "midpoint",
     "metric": "saturation", "n": 6, "groups": 2, "accuracy": 1.0, "loso_accuracy": 0.83, "auc": 1.0,
     "provenance": {"source": "mine", "created": "...", "satmon_version": "..."}, ...}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from satmon.paths import NotRegular, kind_of, open_regular

__all__ = ["FORMAT", "Calibration", "CalibrationError", "calibration_from_payload", "load_calibration", "short_repr"]

#: The ``"format"`` value of a ``calibration.json``.
FORMAT = "satmon-calibration"
#: A larger file is not read: a calibration of thousands of cells is a few MiB.
MAX_BYTES = 64 * 2**20


class CalibrationError(ValueError):
    """Input that cannot be calibrated on, or a calibration that cannot be read; the message says what was
    expected and what to do."""


@dataclass(frozen=True)
class Calibration:
    """A threshold fitted by ``satmon calibrate``, with where it came from (read by :func:`load_calibration`).

    Attributes:
        threshold: the GO threshold on ``metric`` (``metric >= threshold``: DyT predicted to help).
        rule: how it was fitted (``"midpoint"``: best accuracy, the study's; ``"balanced"``: best balanced accuracy).
        metric: the reading it applies to (``"saturation"``: the verdict's pooled saturation).
        n: cells fitted on. groups: distinct group keys.
        accuracy: in-sample accuracy. loso_accuracy: leave-one-group-out accuracy. auc: AUC of the metric.
        source: what the cells were (files, ``study``). created: UTC time of the fit. path: the file read.
        helps: cells where DyT helped (``-1``: not recorded); :attr:`no_skill` is what guessing the commoner
            outcome scores on the cells, the baseline ``loso_accuracy`` must beat for the verdict to read as a forecast.

    Example:
        >>> cal = Calibration(0.45, "midpoint", "saturation", 6, 2, 1.0, 0.75, 1.0, source="mine")
        >>> cal.caveat().split(":")[0]
        'Caveat'
        >>> Calibration(0.45, "midpoint", "saturation", 6, 2, 1.0, 0.75, 1.0, helps=2).no_skill
        0.6666666666666666
    """

    threshold: float
    rule: str
    metric: str
    n: int
    groups: int
    accuracy: float
    loso_accuracy: float
    auc: float
    source: str = ""
    created: str = ""
    satmon_version: str = ""
    path: str = ""
    helps: int = -1

    @property
    def no_skill(self) -> float | None:
        """Guessing the commoner outcome on the calibration's cells (``None`` when the file
        does not say how many helped)."""
        if self.helps < 0 or self.n <= 0 or self.helps > self.n:
            return None
        return max(self.helps, self.n - self.helps) / self.n

    def caveat(self) -> str:
        """The provenance line for the verdict card."""
        return (
            f"Caveat: threshold {self.threshold:.4g} was fit by `satmon calibrate` "
            f"({self.rule} rule, {self.metric}) on "
            f"{self.n} cells in {self.groups} groups ({self.source or 'user cells'}): {self.accuracy:.0%} in-sample, "
            f"{self.loso_accuracy:.0%} leave-one-group-out, AUC {self.auc:.2f}. A measurement on those runs, not a "
            "guarantee for others."
        )


def short_repr(value: Any, limit: int = 80) -> str:
    """A bounded representation of ``value`` for an error message (a crafted object never floods it):
    the repr of a number, string, bytes or ``None``, else ``<type>``; cut at ``limit`` characters.

    Example:
        >>> short_repr(123), short_repr("x" * 200)[-5:], short_repr([[[]]])
        ('123', 'xx...', '<list>')
    """
    text = repr(value) if isinstance(value, (int, float, str, bytes, type(None))) else f"<{type(value).__name__}>"
    return (text[:limit] + "...") if len(text) > limit else text


def load_calibration(path: str | os.PathLike) -> Calibration:
    """Read a ``calibration.json`` written by ``satmon calibrate``.

    Raises:
        CalibrationError: not a path, no such file, a file that cannot be read or is not UTF-8 JSON,
            not a satmon calibration, or a threshold outside (0, 1).

    Example:
        >>> import json, tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "calibration.json"
        >>> _ = out.write_text(json.dumps({"format": "satmon-calibration", "threshold": 0.45, "rule": "midpoint",
        ...                                "metric": "saturation", "n": 6, "groups": 2, "accuracy": 1.0,
        ...                                "loso_accuracy": 0.75, "auc": 1.0}))
        >>> cal = load_calibration(out)
        >>> cal.threshold, cal.metric, cal.loso_accuracy
        (0.45, 'saturation', 0.75)
    """
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise CalibrationError(
            f"Expected a path to a calibration.json or a Calibration, got {short_repr(path)} "
            f"({type(path).__name__}): pass the file `satmon calibrate` wrote (OUT/calibration.json)."
        )
    try:
        given = os.fspath(path)
    except TypeError as e:  # an os.PathLike whose __fspath__ returns no str
        raise CalibrationError(f"Expected a path to a calibration.json, got {short_repr(path)}: {e}.") from None
    if not isinstance(given, str) or not given.strip():
        raise CalibrationError(
            f"Expected a path to a calibration.json, got {short_repr(given, 240)}: pass OUT/calibration.json of "
            "`satmon calibrate ... --out OUT`."
        )
    path = Path(given)
    kind = kind_of(path)  # by lstat/stat: a FIFO, a socket, a device or a link to one is named, never opened
    found, size = kind.regular, kind.st.st_size if kind.regular and kind.st is not None else 0
    what = {"folder": "a folder", "missing": "no file"}.get(kind.kind, kind.describe())
    if not found:
        raise CalibrationError(
            f"Expected a calibration JSON written by `satmon calibrate`, got {what} at {short_repr(given, 240)}: "
            "pass OUT/calibration.json of `satmon calibrate ... --out OUT`."
        )
    if size > MAX_BYTES:
        raise CalibrationError(
            f"Expected a calibration JSON written by `satmon calibrate` at {short_repr(given, 240)}, got a file of "
            f"{size / 2**20:,.0f} MiB (a calibration is a few KiB): pass the calibration.json itself."
        )
    try:
        with os.fdopen(open_regular(path), "rb") as f:  # without blocking: a FIFO put there since is not read
            raw = f.read(MAX_BYTES + 1)
    except NotRegular as e:
        raise CalibrationError(
            f"Expected a calibration JSON at {short_repr(given, 240)}, got {e.kind.describe()}: pass "
            "OUT/calibration.json of `satmon calibrate ... --out OUT`."
        ) from None
    except OSError as e:
        raise CalibrationError(
            f"Expected a readable calibration JSON at {short_repr(given, 240)}, got {type(e).__name__}: "
            f"{e.strerror or e}: check that the file can be read (its permissions)."
        ) from None
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is read, not refused
    except UnicodeDecodeError as e:
        raise CalibrationError(
            f"Expected a calibration JSON (UTF-8 text) written by `satmon calibrate` at {short_repr(given, 240)}, got "
            f"a binary file (byte {raw[e.start]:#04x} at offset {e.start} is not UTF-8): pass the "
            "calibration.json itself, not another file."
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(
            "Expected a calibration JSON written by `satmon calibrate` at "
            f"{short_repr(given, 240)}, got a parse error: {e}."
        ) from None
    except RecursionError:
        raise CalibrationError(
            "Expected a calibration JSON written by `satmon calibrate` at "
            f"{short_repr(given, 240)}, got nesting too deep "
            "to read: it is not a satmon calibration."
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise CalibrationError(
            f"Expected format {FORMAT!r} in {short_repr(given, 240)}, got {short_repr(got)}: write "
            "it with `satmon calibrate`."
        )
    t = data.get("threshold")
    if isinstance(t, bool) or not (isinstance(t, (int, float)) and 0.0 < t < 1.0):
        raise CalibrationError(
            f"Expected a threshold in (0, 1) in {short_repr(given, 240)}, got {short_repr(t)}: the "
            "fit predicts one class for "
            "every cell, so it cannot screen; add runs from both regimes and calibrate again."
        )
    return calibration_from_payload(data, path)


def calibration_from_payload(data: Mapping[str, Any], path: str | os.PathLike) -> Calibration:
    """The :class:`Calibration` of a ``calibration.json``'s payload (already checked for its format and threshold).

    Example:
        >>> calibration_from_payload({"threshold": 0.4, "rule": "balanced", "n": 8, "groups": 3}, "c.json").groups
        3
    """
    prov = data.get("provenance")
    prov = prov if isinstance(prov, Mapping) else {}
    try:
        auc_value, t = data.get("auc"), data["threshold"]
        return Calibration(
            float(t),
            str(data.get("rule", "")),
            str(data.get("metric", "saturation")),
            int(data.get("n", 0)),
            int(data.get("groups", 0)),
            float(data.get("accuracy") or 0.0),
            float(data.get("loso_accuracy") or 0.0),
            math.nan if auc_value is None else float(auc_value),
            str(prov.get("source", "")),
            str(prov.get("created", "")),
            str(prov.get("satmon_version", "")),
            str(path),
            int(data["helps"])
            if isinstance(data.get("helps"), int) and not isinstance(data.get("helps"), bool)
            else -1,
        )
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise CalibrationError(
            "Expected numbers for threshold, n, groups, accuracy, loso_accuracy and auc in "
            f"{short_repr(str(path), 240)}, "
            f"got {type(e).__name__}: {str(e)[:120]}: write the file with `satmon calibrate`."
        ) from None
