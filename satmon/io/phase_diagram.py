"""The study's phase diagram: model size x unique training tokens, each cell coloured by DyT's measured effect,
and the runs satmon screened placed among them (``satmon report --plot``).

The cells come with satmon, as package data under ``satmon/data_files/``:

* the study's 12 calibration cells (``study_cells.csv``; nominal sizes: 64M/124M/354M/1.3B parameters x
  1M/10M/50M/118M tokens), read by :func:`study_cells`;
* every grid file ``phase_*.csv`` (:data:`GRID_GLOB`), one row per cell with the columns
  :data:`COLUMNS` (``name,params,train_tokens,delta,group,source``; ``delta`` = (DyT - LayerNorm) /
  LayerNorm final validation loss, negative when DyT helped, blank when not measured; ``source`` labels
  the grid on the plot), read by :func:`read_phase_cells`. satmon ships ``phase_grid_v03.csv``, the 0.3
  CPU grid, labelled as not the study's protocol; a grid file dropped beside it is drawn too.

matplotlib (the ``report`` extra) is imported only by :func:`plot_phase`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from satmon.io.atomic import atomic_open
from satmon.results.forecast.cells import GRID_FILES, parse_count

__all__ = [
    "COLUMNS",
    "GRID_GLOB",
    "STUDY_SOURCE",
    "PhaseCell",
    "grid_cells",
    "parse_count",
    "phase_cells",
    "plot_phase",
    "read_cells_file",
    "read_phase_cells",
    "study_cells",
    "study_points",
]

#: The columns of a grid file (others are ignored).
COLUMNS = ("name", "params", "train_tokens", "delta", "group", "source")
#: Grid files among the package data.
GRID_GLOB = GRID_FILES
#: How the study's cells are labelled.
STUDY_SOURCE = "Verma (2026): the study's 12 cells (nominal sizes)"


@dataclass(frozen=True)
class PhaseCell:
    """One cell of a phase diagram.

    Attributes:
        name: the cell's name (``"64M/1M"``).
        params: the model's parameters.
        train_tokens: the unique tokens it trained on.
        delta: DyT's effect, (DyT - LayerNorm) / LayerNorm final validation loss (< 0: DyT helped); ``None`` when
            not measured.
        group: its group (the model size).
        source: where the cell comes from (the plot's legend).
    """

    name: str
    params: float
    train_tokens: float
    delta: float | None
    group: str
    source: str

    @property
    def tokens_per_param(self) -> float:
        return self.train_tokens / self.params


def _rows(text: str, name: str, columns: Sequence[str]) -> list[dict[str, str]]:
    """CSV rows of ``text``, its ``#`` comment lines left out; ``columns`` must be there."""
    body = "\n".join(line for line in text.lstrip("\ufeff").splitlines() if not line.lstrip().startswith("#"))
    reader = csv.DictReader(io.StringIO(body))
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(
            f"Expected the columns {','.join(columns)} in {name}, got {reader.fieldnames}: add {', '.join(missing)}."
        )
    return list(reader)


def study_cells() -> list[PhaseCell]:
    """The study's 12 calibration cells at their nominal sizes, from ``satmon/data_files/study_cells.csv``.

    Example:
        >>> cells = study_cells()
        >>> len(cells), cells[0].name, cells[0].params, cells[0].train_tokens, cells[0].delta
        (12, '64M/1M', 64000000.0, 1000000.0, -0.273)
    """
    text = resources.files("satmon").joinpath("data_files/study_cells.csv").read_text(encoding="utf-8")
    rows = _rows(text, "study_cells.csv", ("name", "group", "train_tokens", "delta"))
    return [
        PhaseCell(
            name=r["name"],
            params=parse_count(r["group"]),
            train_tokens=parse_count(r["train_tokens"]),
            delta=float(r["delta"]),
            group=r["group"],
            source=STUDY_SOURCE,
        )
        for r in rows
    ]


def study_points() -> list[tuple[float, float]]:
    """``(params, train_tokens)`` of each of the study's cells (what a card's phase-diagram line compares with)."""
    return [(c.params, c.train_tokens) for c in study_cells()]


def _number(row: dict[str, str], key: str, where: str, blank_ok: bool = False) -> float | None:
    text = (row.get(key) or "").strip()
    if not text and blank_ok:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (key != "delta" and value <= 0):
        raise ValueError(
            f"Expected {'a finite number' if key == 'delta' else 'a positive number'} for {key} in {where}, "
            f"got {text!r}."
        )
    return value


def read_phase_cells(source: str | Path, text: str | None = None) -> list[PhaseCell]:
    """The cells of a grid file (columns :data:`COLUMNS`; ``text``: its content, else the file is read).

    Raises:
        ValueError: a missing column, an empty name or source, a count that is not positive, a delta that is not
            a finite number (blank is "not measured"), a cell listed twice; the message names the file and row.

    Example:
        >>> rows = "name,params,train_tokens,delta,group,source\\na,1000,5000,-0.1,small,my grid\\n"
        >>> read_phase_cells("mine.csv", rows)
        [PhaseCell(name='a', params=1000.0, train_tokens=5000.0, delta=-0.1, group='small', source='my grid')]
    """
    name = Path(source).name
    text = Path(source).read_text(encoding="utf-8") if text is None else text
    cells, seen = [], set()
    for i, row in enumerate(_rows(text, name, COLUMNS), start=1):
        where = f"{name} row {i}"
        cell_name, label = (row.get("name") or "").strip(), (row.get("source") or "").strip()
        if not cell_name or not label:
            raise ValueError(
                f"Expected a name and a source on every row of {name}, got {cell_name!r} and {label!r} on row {i}."
            )
        if cell_name in seen:
            raise ValueError(f"Expected each cell once in {name}, got {cell_name!r} twice (row {i}).")
        seen.add(cell_name)
        cells.append(
            PhaseCell(
                name=cell_name,
                params=_number(row, "params", where),
                train_tokens=_number(row, "train_tokens", where),
                delta=_number(row, "delta", where, blank_ok=True),
                group=(row.get("group") or "").strip(),
                source=label,
            )
        )
    return cells


def read_cells_file(path: str | Path) -> list[PhaseCell]:
    """The cells of a user's grid: ``satmon grid``'s ``grid.json`` (its ``cells``, labelled with its recipe and folder)
    or a grid file in :data:`COLUMNS` (``.csv``).

    Raises:
        ValueError: not JSON with a ``cells`` list, a cell without ``name``, ``params``, ``train_tokens``,
            ``delta`` or ``group``, or a CSV :func:`read_phase_cells` refuses; the message names the file.

    Example:
        >>> import json, tempfile
        >>> f = Path(tempfile.mkdtemp()) / "grid.json"
        >>> _ = f.write_text(json.dumps({"recipe": {"name": "mine"}, "cells": [
        ...     {"name": "a", "params": 1000, "train_tokens": 5000, "delta": -0.1, "group": "s"}]}))
        >>> [(c.name, c.delta, c.source) for c in read_cells_file(f)]
        [('a', -0.1, 'satmon grid: mine (grid.json)')]
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() != ".json":
        return read_phase_cells(path, text)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(
            f"Expected {path.name} to be a grid JSON (satmon grid's grid.json), got invalid JSON: {e}."
        ) from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        raise ValueError(f"Expected {path.name} to hold a 'cells' list (satmon grid's grid.json), got none.")
    recipe = data.get("recipe") if isinstance(data.get("recipe"), dict) else {}
    source = f"satmon grid: {recipe.get('name', data.get('mode', 'a grid'))} ({path.name})"
    out = []
    for i, c in enumerate(cells, start=1):
        try:
            delta = c["delta"]
            out.append(
                PhaseCell(
                    name=str(c["name"]),
                    params=float(c["params"]),
                    train_tokens=float(c["train_tokens"]),
                    delta=None if delta is None else float(delta),
                    group=str(c["group"]),
                    source=source,
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"Expected name, params, train_tokens, delta and group in every cell of {path.name}, got "
                f"cell {i} without a usable {e}."
            ) from None
    return out


def grid_cells() -> list[PhaseCell]:
    """The cells of every grid file shipped with satmon (``satmon/data_files/phase_*.csv``),
    file by file in name order."""
    folder = resources.files("satmon").joinpath("data_files")
    cells: list[PhaseCell] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if GRID_GLOB.match(entry.name):
            cells += read_phase_cells(entry.name, entry.read_text(encoding="utf-8"))
    return cells


def phase_cells() -> list[PhaseCell]:
    """The study's cells, then every shipped grid's."""
    return study_cells() + grid_cells()


def _mean_by_point(cells: Sequence[PhaseCell]) -> list[tuple[PhaseCell, int]]:
    """Cells of one source at the same (params, tokens) (seeds of one cell) as one point, their delta averaged."""
    groups: dict[tuple[str, float, float], list[PhaseCell]] = {}
    for c in cells:
        groups.setdefault((c.source, c.params, c.train_tokens), []).append(c)
    out = []
    for same in groups.values():
        deltas = [c.delta for c in same if c.delta is not None]
        first = same[0]
        out.append(
            (
                PhaseCell(
                    first.name,
                    first.params,
                    first.train_tokens,
                    sum(deltas) / len(deltas) if deltas else None,
                    first.group,
                    first.source,
                ),
                len(same),
            )
        )
    return out


def plot_phase(
    cells: Sequence[PhaseCell],
    runs: Sequence[tuple[str, Any]],
    path: str | Path,
    not_placed: Sequence[tuple[str, str]] = (),
) -> Path:
    """Draw the cells (x: parameters, y: unique training tokens, both log; colour: DyT's effect) and place each run.

    Args:
        cells: the phase cells (:func:`phase_cells`).
        runs: ``(label, scale)`` of each run to place (a :class:`~satmon.results.scale.RunScale` with tokens).
        path: the image (.png, .pdf or .svg), replaced only once complete.
        not_placed: ``(label, why)`` of runs that could not be placed, listed under the plot.
    """
    from matplotlib import cm, colormaps, colors
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(10, 6.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    ax.set(xscale="log", yscale="log")
    points = _mean_by_point(cells)
    deltas = [abs(c.delta) for c, _ in points if c.delta is not None]
    top = max(deltas, default=0.0) or 1.0  # a symmetric scale around "no effect"
    norm = colors.TwoSlopeNorm(vcenter=0.0, vmin=-top, vmax=top)
    cmap = colormaps["RdBu_r"]  # blue: DyT helped (delta < 0), red: DyT hurt
    sources = list(dict.fromkeys(c.source for c, _ in points))
    markers = {s: m for s, m in zip(sources, "osD^vP*Xh")}
    for source in sources:
        mine = [(c, n) for c, n in points if c.source == source]
        study = source == STUDY_SOURCE
        seeds = max(n for _, n in mine)
        label = source + (f" (mean of {seeds} seeds a cell)" if seeds > 1 else "")
        ax.scatter(
            [c.params for c, _ in mine],
            [c.train_tokens for c, _ in mine],
            c=[cmap(norm(c.delta)) if c.delta is not None else "white" for c, _ in mine],
            marker=markers[source],
            s=110 if study else 55,
            edgecolors="black",
            linewidths=0.7,
            zorder=3,
        )
        # the legend's
        ax.scatter([], [], marker=markers[source], s=80, color="lightgray", edgecolors="black", label=label)
    placed = [(label, s) for label, s in runs if getattr(s, "unique_tokens", None)]
    xs = [c.params for c, _ in points] + [s.params for _, s in placed]
    ys = [c.train_tokens for c, _ in points] + [s.unique_tokens for _, s in placed]
    lo_x, hi_x, lo_y, hi_y = min(xs) / 3, max(xs) * 3, min(ys) / 3, max(ys) * 3
    for ratio in (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0):  # lines of equal tokens per parameter
        if lo_y <= ratio * hi_x and ratio * lo_x <= hi_y:
            ax.plot([lo_x, hi_x], [ratio * lo_x, ratio * hi_x], ls=":", lw=0.8, color="gray", zorder=1)
            x = min(hi_x, hi_y / ratio) / 1.25  # the label sits where the line leaves the plot (right or top)
            ax.text(
                x, ratio * x, f"{ratio:g} tokens/param", fontsize=7, color="gray", ha="right", va="bottom", zorder=2
            )
    for label, s in placed:
        ax.scatter(
            [s.params],
            [s.unique_tokens],
            marker="*",
            s=320,
            color="gold",
            edgecolors="black",
            linewidths=1.0,
            zorder=5,
            label=f"this run: {label}" if len(placed) == 1 else None,
        )
        ax.annotate(
            f"{label}\n{s.tokens_per_param:.3g} tok/param",
            (s.params, s.unique_tokens),
            xytext=(8, 6),
            textcoords="offset points",
            fontsize=8,
            zorder=6,
        )
    if len(placed) > 1:
        ax.scatter([], [], marker="*", s=200, color="gold", edgecolors="black", label="the runs of this report")
    ax.set(
        xlim=(lo_x, hi_x),
        ylim=(lo_y, hi_y),
        xlabel="model parameters",
        ylabel="unique training tokens",
        title="Where the run sits on the study's phase diagram (colour: DyT's measured effect)",
    )
    fig.colorbar(
        cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="DyT vs LayerNorm final val loss (delta; < 0: DyT helped)"
    )
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncols=2)
    if not_placed:  # under the axes, above the legend
        ax.set_xlabel(
            ax.get_xlabel()
            + "\nnot placed: "
            + "; ".join(f"{label} ({why})" for label, why in not_placed[:4])
            + ("; ..." if len(not_placed) > 4 else ""),
            fontsize=8,
        )
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=Path(path).suffix.lstrip(".").lower() or "png")
    return Path(path)
