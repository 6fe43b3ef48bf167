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

--plot draws the study's phase diagram (model parameters x unique training tokens, each cell coloured
by DyT's measured effect, with satmon's CPU grids) and places every run whose verdict gives its parameters
and unique training tokens as data (its hparams satmon/params and satmon/unique_tokens: SaturationMonitor
writes them; unique_tokens= gives the tokens when the training data cannot say them). It needs matplotlib:
pip install -e ".[report]" in satmon's clone.
--cells FILE adds a grid of your own to the diagram (satmon grid's OUT/grid.json, or a CSV with
name,params,train_tokens,delta,group,source); with --cells, LOGDIR may be left out.

exit codes: 0 printed, 1 no satmon data found under LOGDIR, 2 usage error (no such path, an empty
path, a file that is not a TensorBoard event file, --plot without matplotlib or to a path that cannot
be written, or that another satmon process is writing: it is named)."""

#: --plot-file's formats (matplotlib picks the format from the suffix) and its default
PLOT_SUFFIXES, PLOT_FILE = (".png", ".pdf", ".svg"), "satmon_phase.png"


def __getattr__(name: str) -> Any:
    if name in ("Run", "load_runs"):  # re-exported from satmon.io.tensorboard_reader, loaded on first use
        from satmon.io import tensorboard_reader

        return getattr(tensorboard_reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _named() -> dict[str, str]:
    """Trajectory rows with a name of their own, in this order."""
    from satmon.io.tags import TAG

    return {
        TAG.saturation: "saturation (pooled)",
        TAG.margin: "margin",
        TAG.verdict: "verdict (1 GO, 0 NO-GO, -1 non-finite)",
        TAG.collapse_risk: "collapse risk",
        TAG.forecast: "forecast (1 helps, -1 hurts, 0 uncertain)",
    }


def _at(point: tuple[int, float] | None) -> str:
    if point is None:
        return "-"
    step, value = point
    return f"{value:.4f} @ {step}" if math.isfinite(value) else f"{value} @ {step}"


def _points(series: list[tuple[int, float]]) -> list[str]:
    finite = [p for p in series if math.isfinite(p[1])] or series
    return [
        _at(series[0]),
        _at(series[-1]),
        _at(min(finite, key=lambda p: p[1])),
        _at(max(finite, key=lambda p: p[1])),
        str(len(series)),
    ]


def format_run(run: Run) -> str:
    """The verdict card (decision, notes, per-layer table), then the trajectories' key points, as compact tables.

    Everything in it that came from a file or a folder name is printable text: no control character reaches the
    terminal (:func:`~satmon.io.safe_text.printable`)."""
    return _head(run) + "\n" + _body(run)


def _head(run: Run) -> str:
    """The run's first line: its folder and the steps it holds (no torch needed: the console's first line)."""
    from satmon.io.safe_text import printable

    steps = run.steps()
    head = f"== satmon run {printable(str(run.path))}"
    if steps:
        head += f"  (steps {steps[0]}..{steps[-1]}, {len(run.scalars)} satmon scalar tags)"
    return head


def _body(run: Run) -> str:
    """What follows the run's first line: the card, the trajectories, the per-layer readings."""
    from satmon.io.markdown import table
    from satmon.io.safe_text import printable
    from satmon.io.tags import TAG
    from satmon.results.card import plain

    named = _named()
    card = run.last_text(TAG.verdict_text)  # markdown in TensorBoard; plain text on the console
    out = ["", plain(card) if card else "(no verdict card in this run: the screening window has not ended yet)", ""]
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
        cols = [
            c
            for c in ("saturation", "alpha", "alignment", "null_projection", "null_dim", "init_gap")
            if any(c in v for v in layers.values())
        ]
        cols += sorted({c for v in layers.values() for c in v} - set(cols))
        out += [
            "Per layer, last value:",
            table(["layer", *cols], [[name, *[v.get(c) for c in cols]] for name, v in layers.items()]),
            "",
        ]
    return printable("\n".join(out).rstrip(), keep="\n") + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="satmon report", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "logdir",
        metavar="LOGDIR",
        nargs="?",
        help="a TensorBoard run folder, a folder above runs, or an event file (optional with --cells)",
    )
    p.add_argument("--latest", action="store_true", help="print only the most recently written run")
    p.add_argument(
        "--plot",
        action="store_true",
        help="draw the study's phase diagram with the runs placed on it "
        f"(needs matplotlib; written to --plot-file, default ./{PLOT_FILE})",
    )
    p.add_argument(
        "--plot-file", metavar="FILE", default=None, help="where --plot writes (.png, .pdf or .svg); implies --plot"
    )
    p.add_argument(
        "--cells",
        metavar="FILE",
        action="append",
        default=[],
        help="a grid's cells to draw too: satmon grid's grid.json or a phase CSV (repeatable; implies --plot)",
    )
    return p


def _usage_error(root: str) -> str | None:
    """Why ``root`` cannot be read as a run, or ``None``."""
    from satmon.io.tensorboard_reader import EVENT_GLOB

    hint = "Pass the --logdir of a satmon run (e.g. satmon_logs/demo/version_0) or a folder above it."
    if not root.strip():
        return f"Expected LOGDIR to name a folder or an event file, got an empty path. {hint}"
    from satmon.paths import kind_of

    kind = kind_of(root)  # by lstat/stat, never opened: a FIFO would block, a device would be read forever
    shown = repr(root if len(root) <= 240 else root[:200] + "...")
    if kind.kind == "missing":
        return f"no such file or directory: {shown}. {hint}"
    if kind.kind == "file" and not Path(root).match(EVENT_GLOB):
        return (
            f"Expected LOGDIR to be a folder or a TensorBoard event file ({EVENT_GLOB}), got the file {shown}. {hint}"
        )
    if kind.kind not in ("folder", "file"):
        return (
            f"Expected LOGDIR to be a folder or a TensorBoard event file, got {shown}, which is "
            f"{kind.describe()}. {hint}"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon report``; returns the exit code (see :data:`DESCRIPTION`)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.logdir is None and not args.cells:
            parser.error("the following arguments are required: LOGDIR (or --cells FILE: a grid on the phase diagram)")
    except SystemExit as e:  # --help (0), or a usage error argparse has printed (2)
        return usage_exit(e)
    why = _usage_error(args.logdir) if args.logdir is not None else None
    plot_path, extra = None, []
    if why is None and (args.plot or args.plot_file is not None or args.cells):
        why, plot_path = _plot_usage(args.plot_file)
    if why is None:
        from satmon.io.phase_diagram import read_cells_file

        for f in args.cells:
            try:
                extra += read_cells_file(f)
            except (OSError, ValueError) as e:
                why = f"--cells {f}: {getattr(e, 'strerror', None) or e}"
                break
    if why is not None:
        print(f"satmon report: {why}", file=sys.stderr)
        return EXIT_USAGE
    if plot_path is None:
        return _report(args, None, extra)
    from contextlib import ExitStack

    from satmon.io.atomic import OutputError
    from satmon.io.lock import hold

    with ExitStack() as stack:
        try:  # every argument checked: the plot is this process's until it is written (one writer per output)
            stack.enter_context(hold([(plot_path, "--plot-file", False)]))
        except OutputError as e:
            print(f"satmon report: {str(e).rstrip('.')}; nothing was written.", file=sys.stderr)
            return EXIT_USAGE
        return _report(args, plot_path, extra)


def _report(args: argparse.Namespace, plot_path: Path | None, extra: list) -> int:
    """Print the runs under LOGDIR, then the phase diagram at ``plot_path`` (held by its lock); the exit code."""
    if args.logdir is None:
        return _plot([], plot_path, extra)
    from satmon.io.safe_text import printable

    root = Path(args.logdir)
    from satmon.cli.progress import say_to_terminal

    # on a terminal, a line at once: TensorBoard's reader and a long run's events take seconds to read (piped, the
    # report's own first line, each run's header, comes as soon as that run is read)
    say_to_terminal("report", f"reading the satmon runs under {str(root)!r}")
    try:
        runs, looked = _print_runs(root, args.latest)
    except OSError as e:  # a folder or event file this user cannot read
        print(
            f"satmon report: cannot read {str(root)!r}: {e.strerror or e} ({printable(str(e.filename or root))}).",
            file=sys.stderr,
        )
        return EXIT_NO_DATA
    if not runs:
        print(
            f"satmon report: no satmon data under {str(root)!r} ({looked} TensorBoard run folder(s) looked at). "
            "Point it at a run written by SaturationMonitor (with a TensorBoardLogger) or by `satmon replay`.",
            file=sys.stderr,
        )
        return EXIT_NO_DATA
    if plot_path is not None:
        return _plot(runs, plot_path, extra)
    return EXIT_OK


def _print_runs(root: Path, latest: bool) -> tuple[list[Run], int]:
    """Print each run as soon as it is read (the first within moments, not once every run is read); returns the runs
    printed and how many run folders were looked at. ``latest``: only the run whose event files were written last.
    An event file not read to its end (and why) is a note on stderr, as soon as its run is read."""
    from satmon.io.safe_text import printable
    from satmon.io.tensorboard_reader import EVENT_GLOB, read_run, run_dirs

    dirs = run_dirs(root)
    if latest:  # newest first; the first with satmon data is the one
        dirs = sorted(
            dirs, key=lambda d: max((f.stat().st_mtime for f in d.glob(EVENT_GLOB)), default=0.0), reverse=True
        )
    runs: list[Run] = []
    for d in dirs:
        run = read_run(d)
        for problem in run.problems:
            print(f"satmon report: note: {printable(str(d))}/{problem}", file=sys.stderr, flush=True)
        if not (run.scalars or run.texts):
            continue
        print(("\n" if runs else "") + _head(run), flush=True)  # before the card's imports (torch): at once
        print(_body(run), end="", flush=True)
        runs.append(run)
        if latest:
            break
    return runs, len(dirs)


def _plot_usage(plot_file: str | None) -> tuple[str | None, Path | None]:
    """``(why --plot cannot run, None)`` or ``(None, the plot's path)``: matplotlib there, the path writable."""
    from satmon.io.atomic import OutputError, check_output
    from satmon.io.markdown import require_matplotlib

    try:
        require_matplotlib()
    except ImportError:
        return (
            "--plot needs matplotlib: pip install matplotlib (or pip install -e '.[report]' in satmon's clone); "
            "the report without the plot: leave --plot out."
        ), None
    try:
        return None, check_output(PLOT_FILE if plot_file is None else plot_file, "--plot-file", PLOT_SUFFIXES)
    except OutputError as e:
        return str(e), None


def _plot(runs: list[Run], path: Path, extra: list | None = None) -> int:
    """Place each run on the study's phase diagram (its card's parameters and unique tokens), with the ``extra`` cells
    of ``--cells``; the exit code."""
    from satmon.io.phase_diagram import STUDY_SOURCE, phase_cells, plot_phase
    from satmon.io.tags import TAG
    from satmon.results.scale import RunScale

    placed, not_placed = [], []
    for run in runs:  # the run's scale as data: the hparams its verdict wrote (never the card's text)
        label = _label(run, runs)
        params, tokens = run.hparams.get(TAG.hp_params), run.hparams.get(TAG.hp_unique_tokens)
        if not isinstance(params, (int, float)) or not params > 0:
            not_placed.append(
                (
                    label,
                    f"its verdict gives no parameter count ({TAG.hp_params}): a replay, a run without a "
                    "verdict yet, or one written by satmon before 0.5",
                )
            )
        elif not isinstance(tokens, (int, float)) or not tokens > 0:
            not_placed.append((label, "unique training tokens unknown: pass SaturationMonitor(unique_tokens=N)"))
        else:
            placed.append((label, RunScale(int(params), int(tokens))))
    cells = phase_cells() + list(extra or [])
    existed = path.exists()
    try:
        plot_phase(cells, placed, path, not_placed=not_placed)
    except OSError as e:
        print(
            f"satmon report: could not write the plot {str(path)!r}: {e.strerror or e}; the "
            "file that was there is as it "
            "was.",
            file=sys.stderr,
        )
        return EXIT_NO_DATA
    sources = sorted({c.source for c in cells} - {STUDY_SOURCE})
    print(
        f"\nPhase diagram: {path}{' (replaced the file that was there)' if existed else ''}: the study's "
        f"{sum(c.source == STUDY_SOURCE for c in cells)} cells, "
        f"{sum(c.source != STUDY_SOURCE for c in cells)} grid cells "
        f"({'; '.join(sources) or 'none'}), {len(placed)} run(s) placed."
    )
    for label, why in not_placed:
        print(f"  not placed: {label}: {why}")
    return EXIT_OK


def _label(run: Run, runs: list[Run]) -> str:
    """A run's short name on the plot: its folder relative to the runs' common folder."""
    import os

    paths = [str(r.path) for r in runs]
    base = os.path.commonpath(paths) if len(paths) > 1 else str(run.path.parent.parent)
    try:
        return str(run.path.relative_to(base)) or run.path.name
    except ValueError:
        return str(run.path)
