"""``satmon report LOGDIR``: print the verdict card and the key points of a satmon TensorBoard run
(live or replayed), for a machine without a browser.

``LOGDIR`` may be a run's version folder, any folder above it (every run found below is printed)
or an event file. Exit codes: 0 printed, 1 no satmon data found, 2 no such path.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from satmon.io.tensorboard import TAG
from satmon.io.tensorboard_reader import Run, load_runs

__all__ = ["main", "Run", "load_runs", "format_run"]  # Run and load_runs: re-exported from satmon.io.tensorboard_reader

#: Trajectory rows with a name of their own, in this order.
_NAMED = {TAG.saturation: "saturation (pooled)", TAG.margin: "margin", TAG.verdict: "verdict (1 GO, 0 NO-GO, -1 non-finite)",
          TAG.collapse_risk: "collapse risk"}


def _at(point: tuple[int, float] | None) -> str:
    if point is None:
        return "-"
    step, value = point
    return f"{value:.4f} @ {step}" if math.isfinite(value) else f"{value} @ {step}"


def _points(series: list[tuple[int, float]]) -> list[str]:
    finite = [p for p in series if math.isfinite(p[1])] or series
    return [_at(series[0]), _at(series[-1]), _at(min(finite, key=lambda p: p[1])), _at(max(finite, key=lambda p: p[1])),
            str(len(series))]


def format_run(run: Run) -> str:
    """The verdict card (decision, notes, per-layer table), then the trajectories' key points, as compact tables."""
    from satmon.io.markdown import table

    steps = run.steps()
    head = f"== satmon run {run.path}"
    if steps:
        head += f"  (steps {steps[0]}..{steps[-1]}, {len(run.scalars)} satmon scalar tags)"
    card = run.last_text(TAG.verdict)
    out = [head, "", card or "(no verdict card in this run: the screening window has not ended yet)", ""]
    stop = run.last_text(TAG.stop)
    if stop:
        out += [stop.replace("**", ""), ""]

    rows = [[label, *_points(run.scalars[tag])] for tag, label in _NAMED.items() if tag in run.scalars]
    sigma = run.sigma_min_min_ratio()
    if sigma:
        rows.append(["sigma_min ratio (min over depth)", *_points(sigma)])
    other = sorted(t for t in run.scalars if t.count("/") == 1 and t not in _NAMED)
    rows += [[t, *_points(run.scalars[t])] for t in other]
    if rows:
        out += [table(["trajectory", "first", "last", "min", "max", "points"], rows), ""]

    layers = run.layers()
    if layers:
        cols = [c for c in ("saturation", "alpha", "alignment", "null_projection", "null_dim", "init_gap")
                if any(c in v for v in layers.values())]
        cols += sorted({c for v in layers.values() for c in v} - set(cols))
        out += ["Per layer, last value:",
                table(["layer", *cols], [[name, *[v.get(c) for c in cols]] for name, v in layers.items()]), ""]
    return "\n".join(out).rstrip() + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="satmon report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir", metavar="LOGDIR", help="a TensorBoard run folder, a folder above runs, or an event file")
    p.add_argument("--latest", action="store_true", help="print only the most recently written run")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    root = Path(args.logdir)
    if not root.exists():
        print(f"satmon report: no such file or directory: {str(root)!r}. Pass the --logdir of a satmon run "
              "(e.g. satmon_logs/demo/version_0) or a folder above it.", file=sys.stderr)
        return 2
    runs, looked = load_runs(root)
    if not runs:
        print(f"satmon report: no satmon data under {str(root)!r} ({looked} TensorBoard run folder(s) looked at). "
              "Point it at a run written by SaturationMonitor (with a TensorBoardLogger) or by `satmon replay`.",
              file=sys.stderr)
        return 1
    if args.latest:
        runs = [max(runs, key=lambda r: max(f.stat().st_mtime for f in r.path.glob("events.out.tfevents.*")))]
    print("\n".join(format_run(r) for r in runs), end="")
    return 0

