"""``satmon report LOGDIR``: print the verdict card and the key points of a satmon TensorBoard run
(live or replayed), for a machine without a browser.

The parser needs the standard library only; the TensorBoard reader (and :class:`TAG`) load when a run
is read, so ``satmon report --help`` imports neither torch nor Lightning. The help text is
:data:`DESCRIPTION` (plain text).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from satmon.cli.main import EXIT_USAGE, usage_exit

if TYPE_CHECKING:
    from satmon.io.tensorboard_reader import Run

__all__ = ["EXIT_NO_DATA", "EXIT_OK", "EXIT_USAGE", "format_run", "main"]  # and Run, load_runs: see __getattr__

EXIT_OK, EXIT_NO_DATA = 0, 1

DESCRIPTION = """\
Print the verdict card and the key points of a satmon TensorBoard run (live or replayed), for a
machine without a browser.

LOGDIR may be a run's version folder, any folder above it (every run found below is printed) or an
event file (events.out.tfevents.*: the run folder that holds it is printed).

exit codes: 0 printed, 1 no satmon data found under LOGDIR, 2 usage error (no such path, an empty
path, a file that is not a TensorBoard event file)."""


def __getattr__(name: str) -> Any:
    if name in ("Run", "load_runs"):  # re-exported from satmon.io.tensorboard_reader, loaded on first use
        from satmon.io import tensorboard_reader

        return getattr(tensorboard_reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _named() -> dict[str, str]:
    """Trajectory rows with a name of their own, in this order."""
    from satmon.io.tensorboard import TAG

    return {TAG.saturation: "saturation (pooled)", TAG.margin: "margin",
            TAG.verdict: "verdict (1 GO, 0 NO-GO, -1 non-finite)", TAG.collapse_risk: "collapse risk"}


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
    """The verdict card (decision, notes, per-layer table), then the trajectories' key points, as compact tables.

    Everything in it that came from a file or a folder name is printable text: no control character reaches the
    terminal (:func:`~satmon.io.safe_text.printable`)."""
    from satmon.io.markdown import table
    from satmon.io.safe_text import printable
    from satmon.io.tensorboard import TAG
    from satmon.results.card import plain

    named = _named()
    steps = run.steps()
    head = f"== satmon run {run.path}"
    if steps:
        head += f"  (steps {steps[0]}..{steps[-1]}, {len(run.scalars)} satmon scalar tags)"
    card = run.last_text(TAG.verdict_text)  # markdown in TensorBoard; plain text on the console
    out = [head, "", plain(card) if card else "(no verdict card in this run: the screening window has not ended yet)", ""]
    stop = run.last_text(TAG.stop_text)
    if stop:
        out += [plain(stop), ""]

    rows = [[label, *_points(run.scalars[tag])] for tag, label in named.items() if tag in run.scalars]
    sigma = run.sigma_min_min_ratio()
    if sigma:
        rows.append(["sigma_min ratio (min over depth)", *_points(sigma)])
    other = sorted(t for t in run.scalars if t.count("/") == 1 and t not in named)
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
    return printable("\n".join(out).rstrip(), keep="\n") + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="satmon report", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir", metavar="LOGDIR", help="a TensorBoard run folder, a folder above runs, or an event file")
    p.add_argument("--latest", action="store_true", help="print only the most recently written run")
    return p


def _usage_error(root: str) -> str | None:
    """Why ``root`` cannot be read as a run, or ``None``."""
    from satmon.io.tensorboard_reader import EVENT_GLOB

    hint = "Pass the --logdir of a satmon run (e.g. satmon_logs/demo/version_0) or a folder above it."
    if not root.strip():
        return f"Expected LOGDIR to name a folder or an event file, got an empty path. {hint}"
    path = Path(root)
    if not path.exists():
        return f"no such file or directory: {root!r}. {hint}"
    if not path.is_dir() and not path.match(EVENT_GLOB):
        return f"Expected LOGDIR to be a folder or a TensorBoard event file ({EVENT_GLOB}), got the file {root!r}. {hint}"
    if not path.is_dir() and not path.is_file():  # never opened: a FIFO would block, a device would be read forever
        return f"Expected LOGDIR to be a folder or a TensorBoard event file, got {root!r}, which is not a regular file " \
               f"(a device, a pipe or a socket). {hint}"
    return None


def _load(root: Path) -> tuple[list[Run], int, list[str]]:
    """The runs with satmon data under ``root``, how many run folders were looked at, and the event files that were
    not read to their end (and why)."""
    from satmon.io.safe_text import printable
    from satmon.io.tensorboard_reader import read_run, run_dirs

    dirs = run_dirs(root)
    runs, problems = [], []
    for d in dirs:
        run = read_run(d)
        problems += [f"{printable(str(d))}/{p}" for p in run.problems]
        if run.scalars or run.texts:
            runs.append(run)
    return runs, len(dirs), problems


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon report``; returns the exit code (see :data:`DESCRIPTION`)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error argparse has printed (2)
        return usage_exit(e)
    why = _usage_error(args.logdir)
    if why is not None:
        print(f"satmon report: {why}", file=sys.stderr)
        return EXIT_USAGE
    from satmon.io.safe_text import printable

    root = Path(args.logdir)
    try:
        runs, looked, problems = _load(root)
    except OSError as e:  # a folder this user cannot read
        print(f"satmon report: cannot read {str(root)!r}: {e.strerror or e} ({printable(str(e.filename or root))}).",
              file=sys.stderr)
        return EXIT_NO_DATA
    for problem in problems:
        print(f"satmon report: note: {problem}", file=sys.stderr)
    if not runs:
        print(f"satmon report: no satmon data under {str(root)!r} ({looked} TensorBoard run folder(s) looked at). "
              "Point it at a run written by SaturationMonitor (with a TensorBoardLogger) or by `satmon replay`.",
              file=sys.stderr)
        return EXIT_NO_DATA
    if args.latest:
        from satmon.io.tensorboard_reader import EVENT_GLOB

        runs = [max(runs, key=lambda r: max(f.stat().st_mtime for f in r.path.glob(EVENT_GLOB)))]
    print("\n".join(format_run(r) for r in runs), end="")
    return EXIT_OK

