"""``satmon grid``: the user's own LayerNorm-vs-DyT grid, on their recipe, as jobs (docs/guides/grid.md).

A grid trains each cell (a model size, a unique-token budget, a seed) twice from the same initial weights on the
same batches, once with LayerNorm and once with DyT, screens the DyT arm's window with ``satmon.Screen``, reads
the final checkpoint by the study's protocol, and ends with DyT's measured effect, the plan's held-out test of the
window readings and the forecast's record on these cells.

    >>> from satmon.grid import Recipe, run, load_recipe
    >>> load_recipe("builtin")[0].name
    'satmon-faithful-gpt'

``satmon.grid.run`` is :func:`satmon.grid.engine.run`; the recipe contract is :mod:`satmon.grid.recipe`.
"""

from __future__ import annotations

from satmon.grid.config import Budget, GridPlan, GridSettings
from satmon.grid.engine import CellStatus, GridInterrupted, GridResult, run
from satmon.grid.recipe import CellData, CellSpec, Recipe, lm_loss, load_recipe

__all__ = [
    "Budget",
    "CellData",
    "CellSpec",
    "CellStatus",
    "GridInterrupted",
    "GridPlan",
    "GridResult",
    "GridSettings",
    "Recipe",
    "lm_loss",
    "load_recipe",
    "run",
]
