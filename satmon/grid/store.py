"""The grid's files: the grid JSON (``satmon calibrate --cells`` and ``satmon report --plot --cells`` read it) and
the phase-diagram rows, each replaced only by a complete file (:mod:`satmon.io.atomic`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from satmon.io.atomic import atomic_write

__all__ = ["write_grid", "write_phase_csv"]


def write_grid(
    path: Path,
    *,
    format_: str,
    recipe: Mapping[str, Any],
    plan: Mapping[str, Any],
    settings: Mapping[str, Any],
    options: Mapping[str, Any],
    key: str,
    environment: Mapping[str, Any],
    executor: str,
    cells: Sequence[dict[str, Any]],
    status: Sequence[Any],
    analysis: Mapping[str, Any],
    forecast: Mapping[str, Any],
) -> None:
    """The grid's JSON: what made it, every cell's status (the missing and failed ones and why), the analysis,
    the forecast's record and the complete cells (``group``, ``delta`` and every numeric field a reading)."""
    from satmon.grid.analysis import FINAL_READINGS, PRIOR_READINGS, WINDOW_READINGS, json_safe

    missing = [asdict(s) for s in status if s.state != "done"]
    payload = {
        "format": format_,
        "recipe": dict(recipe),
        "key": key,
        "plan_doc": "docs/plans/grid_plan.md",
        "environment": dict(environment),
        "executor": executor,
        "config": {**dict(settings), **dict(options), **dict(plan)},
        "outcome": "delta = (DyT - LayerNorm) / LayerNorm final held-out loss at step `steps`; negative = DyT helps; "
        "delta_best: the same on each arm's best held-out loss over training; an arm whose loss stopped "
        "being finite is in the cell's `diverged` (arm: step), its delta null and `helps` naming the arm "
        "that kept a finite loss as the better one (null when both diverged)",
        "group": "model size (leave-one-size-out); seeds give the second held-out protocol (leave-one-seed-out)",
        "readings": {"window": list(WINDOW_READINGS), "final": list(FINAL_READINGS), "prior": list(PRIOR_READINGS)},
        "counts": {
            "cells": len(status),
            "done": len(cells),
            "missing": sum(s.state == "missing" for s in status),
            "failed": sum(s.state in ("failed", "died") for s in status),
            "diverged": sum(bool(c.get("diverged")) for c in cells),
        },
        "not_complete": missing,
        "timing": {
            "cpu_seconds_per_cell": {c["name"]: round(c["cpu_seconds"], 1) for c in cells},
            "cpu_seconds_sum": sum(c["cpu_seconds"] for c in cells),
        },
        "analysis": json_safe(dict(analysis)),
        "forecast": json_safe(dict(forecast)),
        "cells": [json_safe(c) for c in cells],
    }
    atomic_write(path, json.dumps(payload, indent=1, allow_nan=False) + "\n")


def write_phase_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """The cells as a phase-diagram file (``name,params,train_tokens,delta,group,source``)."""
    from satmon.io.phase_diagram import COLUMNS

    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r[k] for k in COLUMNS})
    atomic_write(path, text.getvalue())
