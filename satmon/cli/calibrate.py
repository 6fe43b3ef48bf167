"""``satmon calibrate``: fit the GO threshold on your own runs and write ``calibration.json``.

Every output path is checked before any input is read, and every input before anything is written
(exit 2, one line, nothing written); outputs are replaced only by complete files
(:mod:`satmon.io.atomic`). The help text is :data:`DESCRIPTION` and :data:`EPILOG` (plain text).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from satmon import study
from satmon.cli.main import EXIT_USAGE, usage_exit
from satmon.cli.progress import say

if TYPE_CHECKING:
    from satmon.calibrate.fit import CalibrationResult

__all__ = ["EXIT_OK", "EXIT_UNWRITTEN", "EXIT_USAGE", "PLOT_SUFFIXES", "main", "format_result", "plot"]

EXIT_OK, EXIT_UNWRITTEN = 0, 1
#: the plot formats --plot accepts (matplotlib picks the format from the suffix)
PLOT_SUFFIXES = (".png", ".pdf", ".svg")

RULE_NAMES = {"midpoint": "midpoint (best accuracy; the study's)", "balanced": "balanced (best balanced accuracy)"}

DESCRIPTION = f"""\
Fit the GO threshold on your own runs and write calibration.json.

Give it one of:
  RUNS... --outcomes CSV   satmon TensorBoard folders and/or replay JSON files (each DyT run's verdict
                           saturation), with a CSV: run,dyt_val_loss,layernorm_val_loss,group
  --cells FILE             the cells directly: a CSV (saturation, outcome or delta or helps, group) or
                           a JSON list of cells; --metric picks another numeric column
  --study                  the regime study's own 12 cells (reproduces its {study.FIT_THRESHOLD:g} / 75% / 50% /
                           AUC 0.75)

It fits "metric >= threshold -> DyT helps (GO)" by the study's midpoint rule (best accuracy) and by
the balanced rule (best balanced accuracy), scores both in-sample and leave-one-group-out, gives the
AUC, and writes OUT/calibration.json (SaturationMonitor(calibration=...) reads it) and
OUT/calibration.png."""

EPILOG = """\
refused before anything is written: outcomes or readings that are NaN or inf, losses that are not
positive, saturations outside [0, 1], a run or cell listed twice, outcome columns that disagree,
files that are not UTF-8 text (a byte-order mark is fine), and blocked outputs (--out naming a file
or under one, --plot naming a folder or without a .png/.pdf/.svg suffix, read-only files, paths
with no room for the files written beside them), and outputs another satmon process is writing
(checked last, once everything else is: that process is named).

exit codes: 0 written, 1 an output could not be written (the file that was there is as it was),
2 usage error or input that cannot be calibrated on (one line says why; nothing written),
130 interrupted (Ctrl-C)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="satmon calibrate",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "runs", nargs="*", metavar="RUNS", help="satmon TensorBoard folders or replay JSON files (with --outcomes)"
    )
    p.add_argument("--outcomes", metavar="CSV", help="run,dyt_val_loss,layernorm_val_loss,group: one row per DyT run")
    p.add_argument("--cells", metavar="FILE", help="a cells CSV or JSON (saturation, outcome, group)")
    p.add_argument("--study", action="store_true", help="the regime study's 12 calibration cells (shipped with satmon)")
    p.add_argument(
        "--metric", default="saturation", help="the reading to threshold (a column of --cells; default saturation)"
    )
    p.add_argument(
        "--rule",
        choices=("midpoint", "balanced"),
        default="midpoint",
        help="whose threshold calibration.json carries (default midpoint, the study's; both are printed)",
    )
    p.add_argument("--out", default="satmon_calibration", help="output folder (default ./satmon_calibration)")
    plots = p.add_mutually_exclusive_group()
    plots.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="plot path, ending in .png, .pdf or .svg (default OUT/calibration.png)",
    )
    plots.add_argument("--no-plot", action="store_true", help="skip the plot")
    return p


def _outputs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """``(calibration.json, plot or None)``, each checked before any input is read."""
    from satmon.io.atomic import check_output, check_output_dir
    from satmon.paths import beside

    files = [Path(args.out) / "calibration.json"] + ([Path(args.out) / "calibration.png"] if args.plot is None else [])
    out = check_output_dir(args.out, "--out", [w for f in files for w in (f, *beside(f))])  # room for both, and beside
    cal = check_output(out / "calibration.json", "--out's calibration.json", (".json",))
    if args.no_plot:
        return cal, None
    return cal, check_output(out / "calibration.png" if args.plot is None else args.plot, "--plot", PLOT_SUFFIXES)


def _load(args: argparse.Namespace) -> tuple[list, str]:
    from satmon.calibrate.fit import CalibrationError, read_cells, study_cells
    from satmon.calibrate.runs import join_outcomes, read_outcomes, run_readings

    given = [bool(args.runs or args.outcomes), bool(args.cells), bool(args.study)]
    if sum(given) != 1:
        raise CalibrationError(
            f"Expected one input: RUNS with --outcomes, --cells FILE, or --study; got {sum(given)}. "
            "See `satmon calibrate --help`."
        )
    if args.study:
        return study_cells(), "study: Verma (2026), 12 calibration cells (satmon/data_files/study_cells.csv)"
    if args.cells:
        return read_cells(
            args.cells, on_skip=lambda note: print(f"satmon calibrate: {note}", file=sys.stderr)
        ), f"cells: {args.cells}"
    if not args.runs or not args.outcomes:
        raise CalibrationError(
            f"Expected run folders or replay JSON files together with --outcomes CSV, got "
            f"{'runs' if args.runs else '--outcomes'} only: give both."
        )
    if args.metric != "saturation":
        raise CalibrationError(
            f"Expected --metric saturation with runs (the verdict's pooled saturation), got "
            f"{args.metric!r}: other readings come from a --cells file."
        )
    return join_outcomes(
        run_readings(args.runs), read_outcomes(args.outcomes)
    ), f"runs: {', '.join(args.runs)}; outcomes: {args.outcomes}"


def _frac(correct: int, n: int) -> str:
    return f"{correct}/{n} = {correct / n:.3f}"


def format_result(r: CalibrationResult) -> str:
    """The console report: both rules, in-sample and leave-one-group-out, AUC, the folds."""
    from satmon.io.markdown import table

    n, helps = len(r.cells), sum(c.helps for c in r.cells)
    groups = sorted({c.group for c in r.cells})
    rows = [
        [
            RULE_NAMES[k],
            f"{f.threshold:.5f}",
            _frac(f.correct, f.n),
            f"{f.balanced_accuracy:.3f}",
            _frac(r.cv[k].correct, r.cv[k].n),
            f"{r.cv[k].balanced_accuracy:.3f}",
        ]
        for k, f in r.fits.items()
    ]
    lines = [
        f"satmon calibrate: {n} cells in {len(groups)} groups ({', '.join(groups)}); DyT helped in {helps}, hurt in "
        f"{n - helps}; metric {r.metric!r}; rule: {r.metric} >= threshold -> DyT helps (GO)",
        f"source: {r.source}",
        "",
        table(["rule", "threshold", "in-sample", "balanced", "leave-one-group-out", "balanced (held out)"], rows),
        "",
        f"AUC of {r.metric}: {r.auc:.3f} (ties count half; 0.5 = chance, below 0.5 = it reads the wrong way round). "
        f"The study's {study.THRESHOLD:g} on these cells: {r.study_accuracy:.3f} in-sample.",
    ]
    for k, cv in r.cv.items():
        folds = "; ".join(f"{f.group}: t={f.threshold:.4f}, {f.correct}/{f.n}" for f in cv.folds)
        lines.append(f"Held-out folds, {k} rule: {folds}")
    for k, f in r.fits.items():
        if f.threshold_outside:
            lines.append(
                f"Note: the {k} threshold lies outside every {r.metric} value: it predicts the same outcome for every "
                "cell, so this metric does not separate them."
            )
    return "\n".join(lines)


def plot(r: CalibrationResult, path: Path) -> Path:
    """Each cell's reading against its outcome, both fitted thresholds and the study's threshold; the
    file is replaced only once complete (its format from the suffix: .png, .pdf or .svg)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    from satmon.io.atomic import atomic_open

    fig = Figure(figsize=(9.5, 4.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    groups = sorted({c.group for c in r.cells})
    markers = "osD^vP*Xh<>p"
    with_delta = all(c.delta is not None for c in r.cells)
    for gi, g in enumerate(groups):
        for helped, color in ((True, "tab:green"), (False, "tab:red")):
            cs = [c for c in r.cells if c.group == g and c.helps == helped]
            ys = (
                [100 * c.delta for c in cs]
                if with_delta
                else [(1.0 if helped else 0.0) + 0.04 * (gi - len(groups) / 2) for c in cs]
            )
            ax.scatter(
                [c.readings[r.metric] for c in cs],
                ys,
                color=color,
                marker=markers[gi % len(markers)],
                s=40,
                label=f"{g}, DyT {'helped' if helped else 'hurt'}" if cs else None,
                edgecolor="black",
                linewidths=0.5,
            )
    styles = {"midpoint": ("black", "--"), "balanced": ("tab:blue", "-.")}
    for k, f in r.fits.items():
        ax.axvline(
            f.threshold,
            color=styles[k][0],
            ls=styles[k][1],
            lw=1.3,
            label=f"{k} rule {f.threshold:.4f} ({f.accuracy:.0%} in, {r.cv[k].accuracy:.0%} held out)",
        )
    if r.metric == "saturation":
        ax.axvline(study.THRESHOLD, color="gray", ls=":", lw=1.2, label=f"study {study.THRESHOLD:g}")
    if with_delta:
        ax.axhline(0.0, color="gray", lw=0.8)
    ax.set(
        xlabel=f"{r.metric} (GO when >= threshold)",
        ylabel="DyT vs LayerNorm final val loss (%, < 0: DyT helped)" if with_delta else "DyT helped (1) / hurt (0)",
        title=f"satmon calibrate: {len(r.cells)} cells, AUC {r.auc:.2f}",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a cell
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=Path(path).suffix.lstrip(".").lower() or "png")
    return Path(path)


def _replaced(existed: bool) -> str:
    return " (it replaced the file that was there)" if existed else ""


def _write(
    result: CalibrationResult, cal_path: Path, plot_path: Path | None, rule: str, command: str
) -> tuple[int, Any]:
    """Write calibration.json, then the plot, under their locks; ``(exit code, the calibration written or None)``."""
    from satmon.calibrate.fit import write_calibration
    from satmon.io.safe_text import printable

    existed = cal_path.exists()
    try:
        cal = write_calibration(result, cal_path, rule=rule, command=command)
    except OSError as e:
        print(
            f"satmon calibrate: could not write {str(cal_path)!r}: {e.strerror or e}; the file that was there is as it "
            "was.",
            file=sys.stderr,
        )
        return EXIT_UNWRITTEN, None
    print(printable(format_result(result), keep="\n"))  # cell, group and run names come from files
    print(f"\nWrote {cal_path}{_replaced(existed)}: threshold {cal.threshold:.5f} ({cal.rule} rule on {cal.metric}).")
    if plot_path is not None:
        existed = plot_path.exists()
        try:
            print(f"Plot: {plot(result, plot_path)}{_replaced(existed)}")
        except ImportError:
            print(
                "satmon calibrate: the plot needs matplotlib: pip install matplotlib (or pip install -e "
                "'.[report]' in satmon's clone); "
                "skipped it, the JSON is written.",
                file=sys.stderr,
            )
        except OSError as e:
            print(
                f"satmon calibrate: could not write the plot {str(plot_path)!r}: {e.strerror or e}; the file that was "
                "there is as it was (the JSON is written).",
                file=sys.stderr,
            )
            return EXIT_UNWRITTEN, cal
    return EXIT_OK, cal


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon calibrate``; returns the exit code (see :data:`EPILOG`)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error argparse has printed (2)
        return usage_exit(e)
    from satmon.calibrate.fit import CalibrationError, calibrate
    from satmon.cli.main import command as pasteable
    from satmon.io.atomic import OutputError
    from satmon.io.safe_text import printable

    command = pasteable("satmon", "calibrate", *(sys.argv[1:] if argv is None else argv))
    try:
        cal_path, plot_path = _outputs(args)
        folders = [r for r in args.runs if os.path.isdir(r)]  # False past PATH_MAX: the reader names it
        if folders:  # the slow input (TensorBoard's reader, every event file): say what runs first
            say(
                "calibrate",
                f"reading the verdicts of {len(folders)} TensorBoard folder(s) and {len(args.runs) - len(folders)} "
                "replay file(s)",
            )
        cells, source = _load(args)
        result = calibrate(cells, args.metric, source)
    except (CalibrationError, OutputError) as e:
        print(f"satmon calibrate: {printable(str(e))}", file=sys.stderr)  # a message may quote a file
        return EXIT_USAGE
    from contextlib import ExitStack

    from satmon.io.lock import hold

    outputs = [(cal_path, "--out's calibration.json", False)] + ([(plot_path, "--plot", False)] if plot_path else [])
    with ExitStack() as stack:
        try:  # every input checked: the outputs are this run's until both are written
            held = stack.enter_context(hold(outputs))
        except OutputError as e:  # another process writes one of them (named), or a lock that cannot be made
            print(f"satmon calibrate: {printable(str(e)).rstrip('.')}; nothing was written.", file=sys.stderr)
            return EXIT_USAGE
        for lock in held:
            if lock.note():
                print(f"satmon calibrate: note: {lock.note()}.", file=sys.stderr)
        code, cal = _write(result, cal_path, plot_path, args.rule, command)
    if cal is None or code != EXIT_OK:
        return code
    if cal.metric == "saturation" and 0.0 < cal.threshold < 1.0:
        print(
            f"Use it: SaturationMonitor(calibration={str(cal_path)!r}) (the threshold and its provenance on the card)."
        )
    return EXIT_OK
