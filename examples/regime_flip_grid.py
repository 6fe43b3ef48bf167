"""The calibration grid of ``regime_flip.py --grid``: many small cells, LayerNorm vs DyT in each.

Superseded by ``examples/regime_grid.py`` (both norms learn in every cell, and a final checkpoint
three windows after the window): kept as the record of satmon 0.2's grid (docs/science/grids_superseded.md).

Each cell (a width, a training-token budget, a seed) trains the same GPT-2-style model twice, with
LayerNorm and with DyT, for the same steps, and records the sign of the DyT effect (final held-out
validation loss, DyT vs LayerNorm) beside the screen readings a threshold could be fit on:

- ``saturation``: satmon's verdict (pooled over every DyT layer, averaged over the window);
- ``first_block``: the verdict's first-block saturation (mean of ``blocks.0.ln_1`` and ``ln_2``);
- ``saturation_end`` / ``first_block_end``: the same at the window's end, study protocol (training
  split, eval mode);
- ``centered_end``: saturation of ``alpha * (x - channel mean over the batch's tokens)`` at the
  window's end, from this script's own float64 hook: the offset-corrected reading (the definition of
  ``satmon.functional.offset``).

The window is the whole run (``steps <= 500``), so "end of window" is the end of training. The
group is the width (``d32``, ``d64``, ``d96``): leave-one-group-out is leave-one-width-out, the CPU
analogue of the study's leave-one-scale-out. Outputs: ``OUT/calibration_grid.json`` (the cells,
readable by ``satmon calibrate --cells``), ``OUT/outcomes.csv`` (run, losses, group: for
``satmon calibrate OUT/tb --outcomes OUT/outcomes.csv``), each reading's ``satmon calibrate``
output under ``OUT/<reading>/`` and ``OUT/calibration_grid.md`` (the cells and every reading's
accuracy). docs/science/grids_superseded.md reads the committed run.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The readings a threshold is fit on, in the order they are reported.
METRICS = ("saturation", "saturation_end", "first_block", "first_block_end", "centered_end")


@dataclass(frozen=True)
class Grid:
    """The grid's axes and the sizes every cell shares."""

    widths: tuple[int, ...]
    budgets: tuple[int, ...]  # training tokens
    seeds: tuple[int, ...]
    n_layers: int = 2
    n_heads: int = 2
    seq_len: int = 64
    batch_size: int = 16
    steps: int = 500  # = satmon's default window: the verdict covers the whole run
    val_tokens: int = 32_768
    evals: int = 2
    end_batches: int = 8
    val_offset: int | None = None  # where the held-out split starts; None: regime_flip's (after every training split)


GRIDS = {
    "grid": Grid(widths=(32, 64, 96), budgets=(8_192, 65_536, 524_288), seeds=(0, 1)),
    "smoke": Grid(
        widths=(16, 24),
        budgets=(2_000, 20_000),
        seeds=(0,),
        n_layers=1,
        seq_len=32,
        batch_size=4,
        steps=6,
        val_tokens=2_000,
        evals=1,
        end_batches=2,
        val_offset=40_000,
    ),
}


def end_readings(model: Any, train_set: Any, batch_size: int, batches: int) -> dict[str, Any]:
    """Per-layer saturation and centered saturation of every DyT layer on training batches, eval mode.

    An independent hook (not satmon's counter): counts ``|alpha * x| > 2`` and
    ``|alpha * (x - mean over the batch's tokens, per channel)| > 2`` per layer.
    """
    import torch
    from torch.utils.data import DataLoader

    from satmon import find_dyt_layers

    layers = find_dyt_layers(model)
    counts = {l.name: [0, 0, 0] for l in layers}  # saturated, centered-saturated, total

    def hook(name: str):
        def fn(module: Any, args: tuple, out: Any) -> None:
            x = args[0].detach().double()
            alpha = module.alpha.detach().double()
            c = counts[name]
            c[0] += int(((alpha * x).abs() > 2.0).sum())
            centered = x - x.reshape(-1, x.shape[-1]).mean(0)
            c[1] += int(((alpha * centered).abs() > 2.0).sum())
            c[2] += x.numel()

        return fn

    handles = [l.module.register_forward_hook(hook(l.name)) for l in layers]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i, (x, _) in enumerate(DataLoader(train_set, batch_size=batch_size)):
                if i >= batches:
                    break
                model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    total = sum(c[2] for c in counts.values())
    return {
        "per_layer_end": {k: c[0] / c[2] for k, c in counts.items()},
        "centered_per_layer_end": {k: c[1] / c[2] for k, c in counts.items()},
        "saturation_end_hook": sum(c[0] for c in counts.values()) / total,
        "centered_end": sum(c[1] for c in counts.values()) / total,
    }


def first_block(per_layer: dict[str, float]) -> float | None:
    """Mean saturation of the first block's DyT layers (``[model.]blocks.0.*``: equal element counts)."""
    vals = [v for k, v in per_layer.items() if re.search(r"(^|\.)blocks\.0\.", k)]
    return sum(vals) / len(vals) if vals else None


def run_cell(rf: Any, grid: Grid, width: int, budget: int, seed: int, out: Path) -> dict[str, Any]:
    """Train one cell's LayerNorm and DyT runs on one thread; return the cell's record."""
    setup = rf.Setup(
        d_model=width,
        n_layers=grid.n_layers,
        n_heads=grid.n_heads,
        seq_len=grid.seq_len,
        batch_size=grid.batch_size,
        steps=grid.steps,
        few_tokens=budget,
        many_tokens=budget,
        val_tokens=grid.val_tokens,
        val_offset=rf.VAL_OFFSET if grid.val_offset is None else grid.val_offset,
        seeds=(seed,),
        warmup=min(50, max(1, grid.steps // 8)),
        evals=grid.evals,
        end_batches=grid.end_batches,
    )
    name = f"d{width}_t{budget}_s{seed}"
    runs = {}
    for norm in rf.NORMS:
        on_end = (lambda m, ds: end_readings(m, ds, grid.batch_size, grid.end_batches)) if norm == "dyt" else None
        runs[norm] = rf.train_one(setup, "few", norm, seed, str(out), threads=1, on_end=on_end, name=f"{name}_{norm}")
    ln, dyt = runs["layernorm"], runs["dyt"]
    per_layer = dyt.get("per_layer", {})
    cell = {
        "name": name,
        "group": f"d{width}",
        "d_model": width,
        "train_tokens": budget,
        "seed": seed,
        "epochs": dyt["epochs"],
        "val_loss_layernorm": ln["val_loss"],
        "val_loss_dyt": dyt["val_loss"],
        "delta": (dyt["val_loss"] - ln["val_loss"]) / ln["val_loss"],
        "decision": dyt.get("decision"),
        "saturation": dyt.get("saturation"),
        "saturation_end": dyt.get("saturation_end"),
        "first_block": first_block(per_layer),
        "first_block_end": first_block(dyt.get("per_layer_end", {})),
        "centered_end": dyt.get("centered_end"),
        "saturation_end_hook": dyt.get("saturation_end_hook"),
        "per_layer": per_layer,
        "per_layer_end": dyt.get("per_layer_end"),
        "centered_per_layer_end": dyt.get("centered_per_layer_end"),
        "seconds": ln["seconds"] + dyt["seconds"],
    }
    cell["helps"] = cell["delta"] < 0
    return cell


def write_outcomes(cells: list[dict[str, Any]], path: Path) -> None:
    """The outcomes CSV of ``satmon calibrate RUNS --outcomes``: one row per DyT run (its TensorBoard name)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "dyt_val_loss", "layernorm_val_loss", "group"])
        for c in cells:
            w.writerow([f"{c['name']}_dyt", repr(c["val_loss_dyt"]), repr(c["val_loss_layernorm"]), c["group"]])


def main(rf: Any, smoke: bool, out: Path, command: str) -> int:
    """Run the grid (``rf`` is the ``regime_flip`` module), write its JSON and outcomes, calibrate each reading."""
    grid = GRIDS["smoke" if smoke else "grid"]
    out.mkdir(parents=True, exist_ok=True)
    keys = [(w, b, s) for w in grid.widths for b in grid.budgets for s in grid.seeds]
    print(
        f"regime_flip --grid{' --smoke' if smoke else ''}: {len(keys)} cells x 2 norms, {grid.steps} steps, "
        "one thread ...",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    cells = []
    for w, b, s in keys:
        cells.append(run_cell(rf, grid, w, b, s, out))
        c = cells[-1]
        print(
            f"  {c['name']:<18} LN {c['val_loss_layernorm']:.4f} DyT {c['val_loss_dyt']:.4f} "
            f"({c['delta'] * 100:+.1f}%) "
            f"sat {c['saturation']:.3f} first {c['first_block']:.3f} centered(end) {c['centered_end']:.3f} "
            f"[{c['seconds']:.0f} s]",
            file=sys.stderr,
            flush=True,
        )
        # written after every cell: a long grid killed half-way keeps what it measured
        _write(out, grid, cells, command, time.perf_counter() - t0)
    write_outcomes(cells, out / "outcomes.csv")
    print(
        f"{len(cells)} cells in {(time.perf_counter() - t0) / 60:.1f} min: {out / 'calibration_grid.json'}, "
        f"{out / 'outcomes.csv'}"
    )
    return _calibrate_all(out)


def _write(out: Path, grid: Grid, cells: list[dict[str, Any]], command: str, seconds: float) -> None:
    payload = {
        "format": "satmon-cells",
        "metrics": list(METRICS),
        "grid": asdict(grid),
        "command": command,
        "minutes": seconds / 60,
        "outcome": "delta = (DyT - LayerNorm) / LayerNorm final validation loss; negative = DyT helps",
        "offset_statistics": "centered_end: this script's float64 hook at the window's "
        "end (the definition of satmon.functional.offset)",
        "cells": cells,
    }
    (out / "calibration_grid.json").write_text(json.dumps(payload, indent=1) + "\n")


def _calibrate_all(out: Path) -> int:
    """``satmon calibrate --cells`` on the grid, one reading at a time (a fit that cannot run says why and
    the others go on), then ``OUT/calibration_grid.md``: the cells and every reading's accuracy."""
    from satmon.cli import calibrate as cli

    for metric in METRICS:
        print(f"\n== {metric}")
        cli.main(["--cells", str(out / "calibration_grid.json"), "--metric", metric, "--out", str(out / metric)])
    (out / "calibration_grid.md").write_text(summary_markdown(out / "calibration_grid.json") + "\n")
    print(f"\nSummary: {out / 'calibration_grid.md'}")
    return 0


def summary_markdown(path: Path) -> str:
    """The grid's cells and, per reading, both rules' in-sample and leave-one-group-out accuracy beside the study's."""
    from satmon.calibrate.fit import CalibrationError, calibrate, read_cells
    from satmon.io.markdown import table

    cells = json.loads(path.read_text())["cells"]
    rows = [
        [
            c["name"],
            f"{c['val_loss_layernorm']:.3f}",
            f"{c['val_loss_dyt']:.3f}",
            f"{c['delta'] * 100:+.1f}%",
            "helps" if c["helps"] else "hurts",
            *(f"{c[m]:.3f}" for m in METRICS),
        ]
        for c in cells
    ]
    out = [table(["cell", "val LN", "val DyT", "DyT vs LN", "DyT", *METRICS], rows), ""]
    fits = []
    for metric in METRICS:
        try:
            r = calibrate(read_cells(path), metric)
        except CalibrationError as e:
            fits.append([metric, f"cannot fit: {str(e).split(':')[0]}", "", "", "", "", "", ""])
            continue
        m, b = r.fits["midpoint"], r.fits["balanced"]
        fits.append(
            [
                metric,
                f"{m.threshold:.4f}",
                f"{m.correct}/{m.n} = {m.accuracy:.2f}",
                f"{r.cv['midpoint'].correct}/{m.n} = {r.cv['midpoint'].accuracy:.2f}",
                f"{b.threshold:.4f}",
                f"{b.balanced_accuracy:.2f}",
                f"{r.cv['balanced'].correct}/{b.n} = {r.cv['balanced'].accuracy:.2f}",
                f"{r.auc:.2f}",
            ]
        )
    fits.append(
        [
            "study (12 cells, pooled saturation)",
            "0.4398",
            "9/12 = 0.75",
            "6/12 = 0.50",
            "0.2651",
            "0.75",
            "7/12 = 0.58",
            "0.75",
        ]
    )
    out.append(
        table(
            [
                "reading",
                "midpoint t",
                "in-sample",
                "leave-one-group-out",
                "balanced t",
                "balanced acc.",
                "leave-one-group-out (balanced)",
                "AUC",
            ],
            fits,
        )
    )
    return "\n".join(out)


__all__ = [
    "GRIDS",
    "METRICS",
    "Grid",
    "end_readings",
    "first_block",
    "main",
    "run_cell",
    "summary_markdown",
    "write_outcomes",
]
