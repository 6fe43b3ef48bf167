"""``satmon report LOGDIR``: print the verdict card and the key points of a satmon TensorBoard run
(live or replayed), for a machine without a browser.

``LOGDIR`` may be a run's version folder, any folder above it (every run found below is printed)
or an event file. Exit codes: 0 printed, 1 no satmon data found, 2 no such path.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from satmon.writers.tensorboard import TAG

__all__ = ["main", "Run", "load_runs", "format_run"]

#: Tags written only for TensorBoard's hparams view, not trajectories.
HPARAMS_ONLY = ("satmon/verdict_saturation",)


@dataclass
class Run:
    """The satmon content of one TensorBoard run folder."""

    path: Path
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # tag -> [(step, value)]
    texts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # tag (without /text_summary) -> [(step, text)]


def _trajectory(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Points in step order, the last write of a step winning. A step-0 point written after later
    steps is dropped: it is the hparams view's copy of the metric (Lightning logs hparams metrics at
    step 0), not a reading taken at step 0."""
    kept: dict[int, float] = {}
    top = -1
    for step, value in points:
        if step == 0 and top > 0:
            continue
        kept[step] = value
        top = max(top, step)
    return sorted(kept.items())


#: The sub-run in which :func:`satmon.writers.tensorboard.log_verdict` writes TensorBoard's hparams view.
HPARAMS_SUBRUN = "satmon_hparams"


def _event_dirs(root: Path) -> list[Path]:
    """Run folders: those holding event files, without the hparams sub-runs (their parent run has the same readings)."""
    if root.is_file():
        return [root.parent]
    dirs = sorted({f.parent for f in root.rglob("events.out.tfevents.*")})
    return [d for d in dirs if d.name != HPARAMS_SUBRUN] or dirs


def load_runs(root: str | Path) -> tuple[list[Run], int]:
    """Every run folder under ``root`` with satmon tags, and how many run folders were looked at."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    dirs = _event_dirs(Path(root))
    runs = []
    for d in dirs:
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        run = Run(path=d)
        for tag in tags.get("scalars", []):
            if tag.startswith("satmon/") and tag not in HPARAMS_ONLY:
                run.scalars[tag] = _trajectory([(e.step, float(e.value)) for e in acc.Scalars(tag)])
        for tag in tags.get("tensors", []):
            if tag.startswith("satmon/") and tag.endswith("/text_summary"):
                texts = []
                for e in acc.Tensors(tag):
                    value = tensor_util.make_ndarray(e.tensor_proto).reshape(-1)
                    texts.append((e.step, b"\n".join(v if isinstance(v, bytes) else str(v).encode() for v in value).decode()))
                run.texts[tag[: -len("/text_summary")]] = texts
        if run.scalars or run.texts:
            runs.append(run)
    return runs, len(dirs)


def _at(point: tuple[int, float] | None) -> str:
    if point is None:
        return "-"
    step, value = point
    return f"{value:.4f} @ {step}" if math.isfinite(value) else f"{value} @ {step}"


def _points(series: list[tuple[int, float]]) -> list[str]:
    finite = [p for p in series if math.isfinite(p[1])] or series
    return [_at(series[0]), _at(series[-1]), _at(min(finite, key=lambda p: p[1])), _at(max(finite, key=lambda p: p[1])),
            str(len(series))]


def _layer_tags(scalars: dict[str, list[tuple[int, float]]]) -> dict[str, dict[str, float]]:
    """layer -> {reading: last value} from ``satmon/saturation/<layer>``, ``satmon/alpha/<layer>``,
    ``satmon/init_gap/<layer>`` and ``satmon/deadir/<layer>/<reading>``."""
    layers: dict[str, dict[str, float]] = defaultdict(dict)
    for tag, series in scalars.items():
        parts = tag.split("/")
        if len(parts) == 3 and parts[1] in ("saturation", "alpha", "init_gap"):
            layers[parts[2]][parts[1]] = series[-1][1]
        elif len(parts) >= 4 and parts[1] == "deadir":
            layers["/".join(parts[2:-1])][parts[-1]] = series[-1][1]
    return dict(layers)


def format_run(run: Run) -> str:
    """The verdict card, then the trajectories' key points, as compact tables."""
    from satmon.writers.markdown import table

    steps = sorted({s for series in run.scalars.values() for s, _ in series})
    head = f"== satmon run {run.path}"
    if steps:
        head += f"  (steps {steps[0]}..{steps[-1]}, {len(run.scalars)} satmon scalar tags)"
    out = [head, ""]
    cards = run.texts.get(TAG.verdict)
    out += [cards[-1][1] if cards else "(no verdict card in this run: the screening window has not ended yet)", ""]
    stop = run.texts.get(TAG.stop)
    if stop:
        out += [stop[-1][1].replace("**", ""), ""]

    rows = []
    names = {TAG.saturation: "saturation (pooled)", TAG.margin: "margin", TAG.verdict: "verdict (1 = GO)",
             "satmon/collapse/risk": "collapse risk"}
    for tag, label in names.items():
        if tag in run.scalars:
            rows.append([label, *_points(run.scalars[tag])])
    ratio_tags = {t: s for t, s in run.scalars.items() if t.startswith(TAG.sigma_min_ratio(""))}
    if ratio_tags or TAG.sigma_min_min_ratio in run.scalars:
        summary = run.scalars.get(TAG.sigma_min_min_ratio)
        if summary is None:  # the minimum over depth, per step
            by_step: dict[int, float] = {}
            for series in ratio_tags.values():
                for s, v in series:
                    by_step[s] = min(by_step.get(s, math.inf), v)
            summary = sorted(by_step.items())
        rows.append(["sigma_min ratio (min over depth)", *_points(summary)])
    other = sorted(t for t in run.scalars if t.count("/") == 1 and t not in names)
    rows += [[t, *_points(run.scalars[t])] for t in other]
    if rows:
        out += [table(["trajectory", "first", "last", "min", "max", "points"], rows), ""]

    layers = _layer_tags(run.scalars)
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
