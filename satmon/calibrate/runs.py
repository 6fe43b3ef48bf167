"""Cells from satmon runs: each DyT run's verdict saturation (TensorBoard folders, replay JSON) joined
with a CSV of outcomes (``run,dyt_val_loss,layernorm_val_loss,group``), for ``satmon calibrate``.

A run's reading is the pooled saturation its last verdict gave (TensorBoard: ``satmon/saturation`` at
the step of the last ``satmon/verdict``, stored as float32; replay: the verdict of the latest
checkpoint). A run's outcome is ``DyT final validation loss < LayerNorm's`` on the same setup.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from satmon.calibrate.fit import CalibrationError, Cell, check_reading, csv_rows, read_text, to_float
from satmon.paths import kind_of

__all__ = ["OUTCOME_COLUMNS", "join_outcomes", "read_outcomes", "run_readings"]

OUTCOME_COLUMNS = ("run", "dyt_val_loss", "layernorm_val_loss", "group")


def read_outcomes(path: str | Path) -> dict[str, tuple[float, float, str]]:
    """``run -> (DyT final val loss, LayerNorm final val loss, group)`` from a CSV with columns
    ``run,dyt_val_loss,layernorm_val_loss,group`` (``#`` lines are comments).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "outcomes.csv"
        >>> _ = p.write_text("run,dyt_val_loss,layernorm_val_loss,group\\nsmall_dyt,2.0,2.5,d64\\n")
        >>> read_outcomes(p)
        {'small_dyt': (2.0, 2.5, 'd64')}
    """
    path = Path(path)
    rows = csv_rows(read_text(path, f"an outcomes CSV ({','.join(OUTCOME_COLUMNS)})"), str(path))
    missing = [c for c in OUTCOME_COLUMNS if c not in rows[0]]
    if missing:
        raise CalibrationError(
            f"Expected columns {','.join(OUTCOME_COLUMNS)} in {path}, got {','.join(rows[0])}: "
            f"add {', '.join(missing)}."
        )
    out: dict[str, tuple[float, float, str]] = {}
    first: dict[str, int] = {}
    for i, r in enumerate(rows, start=1):
        run = r["run"].strip()
        where = f"{path.name} row {i}, run {run!r}"
        dyt, ln = (
            to_float(r["dyt_val_loss"], "dyt_val_loss", where),
            to_float(r["layernorm_val_loss"], "layernorm_val_loss", where),
        )
        if dyt is None or ln is None or not r["group"].strip() or not run:
            raise CalibrationError(
                f"Expected run, both validation losses and a group on every row, got a blank ({where}): "
                "fill it in or drop the row."
            )
        if run in first:
            raise CalibrationError(
                f"Expected each run once in {path}, got {run!r} on rows {first[run]} and {i}: keep the "
                "row of its final outcome."
            )
        first[run] = i
        out[run] = (_loss(dyt, "dyt_val_loss", where), _loss(ln, "layernorm_val_loss", where), r["group"].strip())
    return out


def _loss(value: float, column: str, where: str) -> float:
    """A final validation loss: finite and above zero (the relative change divides by LayerNorm's)."""
    if not (math.isfinite(value) and value > 0.0):
        raise CalibrationError(
            f"Expected {column} > 0 (a final validation loss, e.g. cross-entropy in nats) ({where}), got "
            f"{value!r}: fix the value or drop the row."
        )
    return value


def _replay_saturation(path: Path) -> float | None:
    text = read_text(path, "replay records (JSON or JSONL)")
    try:
        records = (
            [json.loads(l) for l in text.splitlines() if l.strip()] if path.suffix == ".jsonl" else json.loads(text)
        )
    except (json.JSONDecodeError, RecursionError) as e:
        why = "nested too deep" if isinstance(e, RecursionError) else str(e)
        raise CalibrationError(
            f"Expected replay records (JSON or JSONL) in {path}, got a parse error: {why}."
        ) from None
    records = [records] if isinstance(records, dict) else records
    if not isinstance(records, list):
        raise CalibrationError(
            f"Expected replay records (a JSON list of objects) in {path}, got {type(records).__name__}."
        )
    verdicts = [r for r in records if isinstance(r, dict) and isinstance(r.get("verdict"), dict)]
    steps = [r.get("global_step") or 0 for r in verdicts]
    odd = [s for s in steps if isinstance(s, bool) or not isinstance(s, int)]
    if odd:
        raise CalibrationError(
            f"Expected integer global_step values in {path}, got {odd[0]!r}: is it a file written by "
            "satmon replay --json?"
        )
    if not verdicts:
        return None
    latest = verdicts[max(range(len(verdicts)), key=steps.__getitem__)]["verdict"].get("saturation")
    if isinstance(latest, bool) or not isinstance(latest, (int, float)):
        return math.nan  # the latest verdict was non-finite (written as null): never an earlier checkpoint's instead
    return float(latest)


def run_readings(paths: Iterable[str | Path]) -> dict[str, float | None]:
    """``run name -> verdict saturation`` (``None``: no verdict) for satmon TensorBoard folders (every
    run below, named by its path under the folder) and replay JSON files (named by the file stem; the
    latest checkpoint's verdict).

    Raises:
        CalibrationError: a path that does not exist, unreadable records, or one run reached twice
            (the same file or folder given twice, nested folders, two files with the same stem).

    Example:
        >>> import json, tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "run1.json"
        >>> _ = p.write_text(json.dumps([{"global_step": 500, "verdict": {"saturation": 0.61}}]))
        >>> run_readings([p])
        {'run1': 0.61}
    """
    out: dict[str, float | None] = {}
    where: dict[str, Path] = {}  # name -> the run's file or folder
    named: dict[Path, str] = {}  # the run's resolved file or folder -> name

    def add(name: str, path: Path, value: float | None) -> None:
        real = path.resolve()
        if real in named:
            raise CalibrationError(
                f"Expected each run once, got {str(path)!r} twice (as {named[real]!r} and {name!r}): a "
                "run counted twice weighs double; give each file or folder once."
            )
        if name in out:
            raise CalibrationError(
                f"Expected distinct run names, got {name!r} for both {str(where[name])!r} and "
                f"{str(path)!r}: rename one, or give them as separate folders of one parent."
            )
        out[name], where[name], named[real] = value, path, name

    for raw in paths:
        p = Path(raw)
        kind = kind_of(p)  # by lstat/stat: a FIFO, a socket, a device or a link to one is named, never opened
        if not str(raw).strip() or kind.kind == "missing":
            raise CalibrationError(
                f"Expected a satmon TensorBoard folder or replay JSON, got no such path: {str(raw)!r}."
            )
        if kind.kind not in ("file", "folder"):
            raise CalibrationError(
                f"Expected a satmon TensorBoard folder or replay JSON, got {str(raw)[:240]!r}, which is "
                f"{kind.describe()}: pass the run's folder or file (it was not opened)."
            )
        if kind.regular and p.suffix in (".json", ".jsonl"):
            add(p.stem, p, _replay_saturation(p))
            continue
        from satmon.io.tensorboard_reader import load_runs

        for run in load_runs(p)[0]:
            name = run.path.relative_to(p).as_posix() if p.is_dir() and run.path != p else run.path.name
            add(name, run.path, run.verdict_saturation())
    return out


def _match(key: str, names: Sequence[str]) -> list[str]:
    exact = [n for n in names if n == key]
    return exact or [n for n in names if n.startswith(key + "/") or n.endswith("/" + key) or f"/{key}/" in n]


def join_outcomes(readings: Mapping[str, float | None], outcomes: Mapping[str, tuple[float, float, str]]) -> list[Cell]:
    """One cell per outcome row: its run's verdict saturation, ``helps = DyT loss < LayerNorm loss``.

    Raises:
        CalibrationError: an outcome row that names no run or several, two rows naming one run, a run
            without a finite verdict saturation in [0, 1], a loss that is not finite and positive.

    Example:
        >>> [c.helps for c in join_outcomes({"a/version_0": 0.5}, {"a": (2.0, 2.5, "small")})]
        [True]
    """
    names, cells, unknown = list(readings), [], []
    taken: dict[str, str] = {}  # run -> the outcome row that named it
    for key, (dyt, ln, group) in outcomes.items():
        found = _match(key, names)
        if len(found) > 1:
            raise CalibrationError(
                f"Expected run name {key!r} to name one run, got {len(found)}: {', '.join(found[:4])}: "
                "use the full name in the outcomes CSV."
            )
        if not found:
            unknown.append(key)
            continue
        run = found[0]
        if run in taken:
            raise CalibrationError(
                f"Expected each run once in the outcomes CSV, got run {run!r} named by both {taken[run]!r} "
                f"and {key!r}: keep one row."
            )
        taken[run] = key
        sat = readings[run]
        if sat is None:
            raise CalibrationError(
                f"Expected a verdict in run {run!r}, got none (the screening window did not end, "
                "or it is a LayerNorm run): list the DyT runs in the outcomes CSV."
            )
        if not math.isfinite(sat):
            raise CalibrationError(
                f"Expected a finite verdict saturation in run {run!r}, got {sat}: its verdict was "
                "non-finite (the run diverged); drop it from the outcomes CSV."
            )
        where = f"run {run!r}"
        check_reading("saturation", sat, where)
        dyt, ln = _loss(dyt, "dyt_val_loss", where), _loss(ln, "layernorm_val_loss", where)
        cells.append(Cell(key, group, dyt < ln, {"saturation": sat}, (dyt - ln) / ln))
    if unknown:
        raise CalibrationError(
            f"Expected every run of the outcomes CSV among the runs given, got no run for "
            f"{', '.join(map(repr, unknown[:5]))}; runs found: {', '.join(names[:8]) or 'none'}."
        )
    return cells
