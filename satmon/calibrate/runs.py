"""Cells from satmon runs: each DyT run's verdict saturation (TensorBoard folders, replay JSON) joined
with a CSV of outcomes (``run,dyt_val_loss,layernorm_val_loss,group``), for ``satmon calibrate``.

A run's reading is the pooled saturation its last verdict gave (TensorBoard: ``satmon/saturation`` at
the step of the last ``satmon/verdict``, stored as float32; replay: the verdict of the latest
checkpoint). A run's outcome is ``DyT final validation loss < LayerNorm's`` on the same setup.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from satmon.calibrate.fit import CalibrationError, Cell, csv_rows, to_float

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
    if not path.is_file():
        raise CalibrationError(f"Expected an outcomes CSV ({','.join(OUTCOME_COLUMNS)}), got no file at {str(path)!r}.")
    rows = csv_rows(path.read_text(), str(path))
    missing = [c for c in OUTCOME_COLUMNS if c not in rows[0]]
    if missing:
        raise CalibrationError(f"Expected columns {','.join(OUTCOME_COLUMNS)} in {path}, got {','.join(rows[0])}: "
                               f"add {', '.join(missing)}.")
    out: dict[str, tuple[float, float, str]] = {}
    for i, r in enumerate(rows, start=1):
        where = f"{path.name} row {i}, run {r['run']!r}"
        dyt, ln = to_float(r["dyt_val_loss"], "dyt_val_loss", where), to_float(r["layernorm_val_loss"], "layernorm_val_loss", where)
        if dyt is None or ln is None or not r["group"].strip() or not r["run"].strip():
            raise CalibrationError(f"Expected run, both validation losses and a group on every row, got a blank ({where}): "
                                   "fill it in or drop the row.")
        out[r["run"].strip()] = (dyt, ln, r["group"].strip())
    return out


def _replay_saturation(path: Path) -> float | None:
    text = path.read_text()
    try:
        records = [json.loads(l) for l in text.splitlines() if l.strip()] if path.suffix == ".jsonl" else json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"Expected replay records (JSON or JSONL) in {path}, got a parse error: {e}.") from None
    records = [records] if isinstance(records, dict) else records
    good = [r for r in records if isinstance(r, dict) and isinstance(r.get("verdict"), dict)
            and isinstance(r["verdict"].get("saturation"), (int, float))]
    return float(max(good, key=lambda r: r.get("global_step") or 0)["verdict"]["saturation"]) if good else None


def run_readings(paths: Iterable[str | Path]) -> dict[str, float | None]:
    """``run name -> verdict saturation`` (``None``: no verdict) for satmon TensorBoard folders (every
    run below, named by its path under the folder) and replay JSON files (named by the file stem; the
    latest checkpoint's verdict).

    Example:
        >>> import json, tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "run1.json"
        >>> _ = p.write_text(json.dumps([{"global_step": 500, "verdict": {"saturation": 0.61}}]))
        >>> run_readings([p])
        {'run1': 0.61}
    """
    out: dict[str, float | None] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise CalibrationError(f"Expected a satmon TensorBoard folder or replay JSON, got no such path: {str(p)!r}.")
        if p.is_file() and p.suffix in (".json", ".jsonl"):
            out[p.stem] = _replay_saturation(p)
            continue
        from satmon.io.tensorboard_reader import load_runs

        for run in load_runs(p)[0]:
            name = run.path.relative_to(p).as_posix() if p.is_dir() and run.path != p else run.path.name
            out[name] = run.verdict_saturation()
    return out


def _match(key: str, names: Sequence[str]) -> list[str]:
    exact = [n for n in names if n == key]
    return exact or [n for n in names if n.startswith(key + "/") or n.endswith("/" + key) or f"/{key}/" in n]


def join_outcomes(readings: Mapping[str, float | None], outcomes: Mapping[str, tuple[float, float, str]]) -> list[Cell]:
    """One cell per outcome row: its run's verdict saturation, ``helps = DyT loss < LayerNorm loss``.

    Example:
        >>> [c.helps for c in join_outcomes({"a/version_0": 0.5}, {"a": (2.0, 2.5, "small")})]
        [True]
    """
    names, cells, unknown = list(readings), [], []
    for key, (dyt, ln, group) in outcomes.items():
        found = _match(key, names)
        if len(found) > 1:
            raise CalibrationError(f"Expected run name {key!r} to name one run, got {len(found)}: {', '.join(found[:4])}: "
                                   "use the full name in the outcomes CSV.")
        if not found:
            unknown.append(key)
            continue
        sat = readings[found[0]]
        if sat is None:
            raise CalibrationError(f"Expected a verdict in run {found[0]!r}, got none (the screening window did not end, "
                                   "or it is a LayerNorm run): list the DyT runs in the outcomes CSV.")
        cells.append(Cell(key, group, dyt < ln, {"saturation": sat}, (dyt - ln) / ln))
    if unknown:
        raise CalibrationError(f"Expected every run of the outcomes CSV among the runs given, got no run for "
                               f"{', '.join(map(repr, unknown[:5]))}; runs found: {', '.join(names[:8]) or 'none'}.")
    return cells
