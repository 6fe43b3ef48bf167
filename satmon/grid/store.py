"""The grid's files: the grid JSON (``satmon calibrate --cells`` and ``satmon report --plot --cells`` read it) and
the phase-diagram rows, each replaced only by a complete file (:mod:`satmon.io.atomic`); and the names of the files
every cell writes, checked against the file system's limits before any work."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from satmon.grid.cell import cell_key, cell_name
from satmon.grid.config import GridPlan
from satmon.grid.vary import vary_suffix
from satmon.io.atomic import atomic_write

__all__ = ["check_file_names", "write_grid", "write_phase_csv", "written_beneath"]


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


#: The longest file name a cell adds to its name and key: ``<name>.<key>.attempt.json``, written through
#: :func:`~satmon.io.atomic.atomic_write`'s temporary companion.
_CELL_FILE_SUFFIX = ".attempt.json"


def check_file_names(out: Path, entries: Sequence[Mapping[str, Any]]) -> None:
    """Every file a cell writes has a name the file system takes, and a path under its limit, checked before any work:
    a ``--vary`` value or a size name that makes one too long is refused naming it (a job would otherwise fail
    writing its first file, with the cause only in its log)."""
    from satmon.io.atomic import TEMP_EXTRA  # the whole path's length: check_output_dir's check_room

    if not entries:
        return
    existing = next((a for a in (out.absolute(), *out.absolute().parents) if a.exists()), Path("/"))
    try:
        name_max = int(os.pathconf(existing, "PC_NAME_MAX"))
    except (OSError, ValueError):
        name_max = 255
    longest = max(entries, key=lambda e: len(os.fsencode(f"{e['name']}.{e['key']}")))
    file_name = f"{longest['name']}.{longest['key']}{_CELL_FILE_SUFFIX}"
    need = len(os.fsencode(file_name)) + TEMP_EXTRA
    if need > name_max:
        vary = dict(longest.get("vary") or {})
        culprit = max(vary.items(), key=lambda kv: len(str(kv[1])), default=None)
        if culprit is not None and len(str(culprit[1])) >= len(str(longest["size"])):
            given = f"--vary {culprit[0]}={_clip(str(culprit[1]))} ({len(str(culprit[1]))} characters)"
            fix = f"pass a shorter --vary value for {culprit[0]} (or fewer --vary axes)"
        else:
            given = f"the size name {_clip(str(longest['size']))!r} ({len(str(longest['size']))} characters)"
            fix = "name the size shorter"
        raise ValueError(
            f"Expected settings whose cells' file names fit the file system's limit of {name_max} bytes, "
            f"got {given}: its cell {_clip(longest['name'])} writes {file_name[:12]}...{_CELL_FILE_SUFFIX} of "
            f"{need} bytes (with its temporary companion): {fix}."
        )


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else f"{text[: n // 2]}...{text[-8:]}"


def written_beneath(out: Path, plan: GridPlan, keyed: Sequence[tuple[Any, ...]]) -> list[str]:
    """The deepest files a grid writes under ``out``, each cell's (its record, attempt and failure files with their
    temporaries and locks, its progress file, its job's log), for the path-limit check before any work."""
    from satmon.paths import beside

    paths: list[str] = []
    for vary, _, _, gkey_c, processed_c in keyed:
        for size, budget, seed in plan.cells():
            tokens = budget.resolve(processed_c)
            stem = f"{cell_name(size, tokens, seed) + vary_suffix(vary)}.{cell_key(gkey_c, size, tokens, seed)}"
            for name in (f"{stem}.attempt.json", f"{stem}.failed.json"):
                paths += [str(out / "cells" / name), *beside(out / "cells" / name)]
            paths += [str(out / "cells" / f".{stem}.progress.tmp"), str(out / "jobs" / f"{stem}.log")]
    return paths
