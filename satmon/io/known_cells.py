"""The known cells :func:`forecast` reads, from the data files that ship with satmon, and the public forecast.

A cell is read when its file says it was trained under the study's protocol (a ``protocol`` column whose value
is ``study``): the study's 12 calibration cells (``study_cells.csv``) and every grid file ``phase_*.csv`` that
carries the column (satmon 0.4's faithful CPU grid, ``phase_grid_faithful.csv``; a second grid dropped beside it
in the same format sharpens the forecast with no code change). satmon 0.3's grid (``phase_grid_v03.csv``) has no
such column and is left out: 1,500 steps with a cosine schedule, embeddings scaled by sqrt(width) and budgets
filtered where LayerNorm overfit (docs/science/calibration.md), so its cells are not the study's experiment.

The columns the forecast needs (a grid file's others are ignored): ``name``, ``params`` (or the study's ``group``,
a size such as ``64M``), ``passes`` (planned tokens over unique training tokens), ``delta`` ((DyT - LayerNorm) /
LayerNorm final held-out loss) or ``final_dyt`` and ``final_layernorm``, ``group``, ``source``, ``protocol``;
optional ``train_tokens``, and ``best_dyt`` with ``best_layernorm`` (each arm's lowest held-out loss over training).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from satmon.io.phase_diagram import GRID_GLOB, parse_count
from satmon.results.forecast import Forecast, KnownCell, forecast_from, unknown_forecast

__all__ = ["PROTOCOL", "STUDY_FILE", "STUDY_LABEL", "forecast", "known_cells", "read_known_cells", "run_forecast"]

#: The ``protocol`` value of a cell trained under the study's protocol (fixed steps at every budget, the study's
#: warm-up and batch shape, GPT-2 init): only such cells are read.
PROTOCOL = "study"
#: The study's cells among the package data.
STUDY_FILE = "study_cells.csv"
#: How the forecast's evidence names the study's cells.
STUDY_LABEL = "the study (Verma 2026)"


def _float(row: dict[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    return value


def read_known_cells(name: str, text: str) -> list[KnownCell]:
    """The cells of one file's ``text`` that a forecast reads (rows whose ``protocol`` is ``study``; none when the
    file has no ``protocol`` column).

    Raises:
        ValueError: a study-protocol row without its passes, size or DyT effect, or with a value that is not a
            positive (for ``delta``: finite) number; the message names the file, the row and the column.

    Example:
        >>> rows = "name,params,passes,delta,group,source,protocol\\na,1000,2.5,0.1,small,my grid,study\\n"
        >>> read_known_cells("mine.csv", rows)[0].outcome
        'hurts'
        >>> read_known_cells("old.csv", "name,params,train_tokens,delta,group,source\\na,1,2,0.1,g,old\\n")
        []
    """
    body = "\n".join(line for line in text.lstrip("\ufeff").splitlines() if not line.lstrip().startswith("#"))
    reader = csv.DictReader(io.StringIO(body))
    if "protocol" not in (reader.fieldnames or []):
        return []
    cells = []
    for i, row in enumerate(reader, start=1):
        if (row.get("protocol") or "").strip() != PROTOCOL:
            continue
        where = f"{name} row {i}"
        cell_name = (row.get("name") or "").strip() or where
        size = _float(row, "params") if (row.get("params") or "").strip() else None
        if size is None:
            try:
                size = parse_count(row.get("group") or "")
            except ValueError:
                size = None
        passes = _float(row, "passes")
        delta = _float(row, "delta")
        if delta is None:
            dyt, ln = _float(row, "final_dyt"), _float(row, "final_layernorm")
            delta = None if dyt is None or ln is None or not ln > 0 else (dyt - ln) / ln
        for key, value in (("params", size), ("passes", passes)):
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Expected a positive number for {key} in {where} (cell {cell_name!r}), got "
                                 f"{row.get(key)!r}: a cell the forecast reads needs its size and its passes.")
        if delta is None or not math.isfinite(delta):
            raise ValueError(f"Expected a finite delta (or final_dyt and final_layernorm) in {where} (cell {cell_name!r}), "
                             f"got {row.get('delta')!r}: a cell the forecast reads needs DyT's measured effect.")
        best_dyt, best_ln = _float(row, "best_dyt"), _float(row, "best_layernorm")
        best = (best_dyt - best_ln) / best_ln if best_dyt is not None and best_ln is not None and best_ln > 0 else None
        tokens_text = (row.get("train_tokens") or "").strip()
        try:
            tokens = parse_count(tokens_text) if tokens_text else None
        except ValueError:
            tokens = None
        source = (row.get("source") or "").strip() or (STUDY_LABEL if name == STUDY_FILE else name)
        steps, warmup = _float(row, "steps"), _float(row, "warmup_steps")  # missing: an unknown schedule
        schedule = (row.get("lr_schedule") or "").strip() or None
        if steps is not None and not (math.isfinite(steps) and steps > 0):
            steps = None
        if warmup is not None and not (math.isfinite(warmup) and warmup >= 0):
            warmup = None
        cells.append(KnownCell(cell_name, float(size), float(passes), float(delta), (row.get("group") or "").strip(),  # type: ignore[arg-type]
                               source, tokens, best, steps, warmup, schedule))
    return cells


def _files(folder: Path | Traversable | None) -> list[tuple[str, str]]:
    where = resources.files("satmon").joinpath("data_files") if folder is None else folder
    entries = sorted(where.iterdir(), key=lambda e: (e.name != STUDY_FILE, e.name))  # the study's first
    return [(e.name, e.read_text(encoding="utf-8")) for e in entries
            if e.name == STUDY_FILE or GRID_GLOB.match(e.name)]


def known_cells(folder: str | Path | None = None) -> list[KnownCell]:
    """Every known cell of the study's protocol: the study's 12, then each grid file's, file by file in name order.

    Args:
        folder: where the files are (default: the package data, ``satmon/data_files/``).

    Example:
        >>> cells = known_cells()
        >>> sum(c.source == STUDY_LABEL for c in cells), round(cells[0].passes, 2), cells[0].outcome
        (12, 163.84, 'helps')
    """
    cells: list[KnownCell] = []
    for name, text in _files(None if folder is None else Path(folder)):
        cells += read_known_cells(name, text)
    return cells


def forecast(*, params: float, unique_tokens: float, planned_tokens: float, steps: float | None = None,
             warmup_steps: float | None = None, lr_schedule: str | None = None,
             cells: Sequence[KnownCell] | None = None) -> Forecast:
    """Forecast DyT's effect on a run's final held-out loss against LayerNorm from its planned passes over the data.

    The outcome is read from the known cells (:func:`known_cells`: the study's and satmon's grids of the study's
    protocol) by the rule of :mod:`satmon.results.forecast`: ``"hurts"`` or ``"helps"`` only where every known
    cell in the run's region agrees and their configurations beat a coin by a one-sided exact binomial test
    (p < 0.05), within the sizes and passes the cells cover; else ``"uncertain"``, with the counts. It knows
    nothing of the model's saturation; the 0.43 decision is separate (:data:`satmon.study.MEANING`).

    Args:
        params: the model's parameters.
        unique_tokens: the unique tokens of the training data.
        planned_tokens: the tokens training will process: optimizer steps x global batch (sequences, gradient
            accumulation and data-parallel ranks counted) x sequence length.
        steps: the run's optimizer steps (``None``: unknown, no confident outcome).
        warmup_steps: its linear warm-up steps (0: none).
        lr_schedule: the learning rate's shape: ``"linear-warmup-constant"`` (the study's), ``"linear-warmup-cosine"``,
            ``"constant"``...; ``None`` or ``"unknown"``: no confident outcome.
        cells: the known cells to read (default: :func:`known_cells`).

    Returns:
        A frozen :class:`~satmon.results.forecast.Forecast`: ``outcome``, ``passes``, ``tokens_per_param``,
        ``evidence`` (the cells it rests on, counted) and ``checkpoint_selection``.

    Raises:
        ValueError: a count that is not a positive number.

    Example:
        >>> import satmon
        >>> study = dict(steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")
        >>> f = satmon.forecast(params=115_013, unique_tokens=1_551_515, planned_tokens=5000 * 16 * 64, **study)
        >>> f.outcome, round(f.passes, 2), f.agreeing == f.configurations >= 5  # the grids' d64L2 at 3.3 passes
        ('hurts', 3.3, True)
        >>> satmon.forecast(params=64e6, unique_tokens=1e6, planned_tokens=5000 * 64 * 512, **study).outcome
        'uncertain'
        >>> satmon.forecast(params=25_000, unique_tokens=1_000, planned_tokens=3_000).outcome  # far outside the cells
        'uncertain'
    """
    return forecast_from(known_cells() if cells is None else cells, params=params, unique_tokens=unique_tokens,
                         planned_tokens=planned_tokens, steps=steps, warmup_steps=warmup_steps, lr_schedule=lr_schedule)


def run_forecast(params: float, unique_tokens: float | None, planned_tokens: float | None, unique_how: str = "",
                 planned_how: str = "", steps: float | None = None, warmup_steps: float | None = None,
                 lr_schedule: str | None = None) -> Forecast:
    """The forecast a screen's card shows: :func:`forecast` when both token counts are known, else ``"uncertain"``
    saying which count is missing, why (``unique_how``, ``planned_how``) and how to give it. Never raises.

    Example:
        >>> run_forecast(120_000, None, 512_000, "an IterableDataset has no length").evidence.split(":")[0]
        'the unique training tokens are unknown (an IterableDataset has no length)'
    """
    missing = []
    if unique_tokens is None:
        missing.append(f"the unique training tokens are unknown ({unique_how or 'not counted'})")
    if planned_tokens is None:
        missing.append(f"the planned tokens are unknown ({planned_how or 'not counted'})")
    if missing:
        return unknown_forecast(params, "; ".join(missing))
    try:
        cells = known_cells()
    except Exception as e:  # a shipped file that cannot be read: say so, never stop training
        return unknown_forecast(params, f"the known cells could not be read ({type(e).__name__}: {str(e)[:120]})")
    try:
        return forecast(params=params, unique_tokens=unique_tokens, planned_tokens=planned_tokens, steps=steps,  # type: ignore[arg-type]
                        warmup_steps=warmup_steps, lr_schedule=lr_schedule, cells=cells)
    except ValueError as e:  # a bad count: blamed on the count, never stop training
        return unknown_forecast(params, f"a count is not usable ({str(e)[:160]})")
    except Exception as e:  # a shipped file that cannot be read: say so, never stop training
        return unknown_forecast(params, f"the known cells could not be read ({type(e).__name__}: {str(e)[:120]})")
