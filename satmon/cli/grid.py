"""``satmon grid``: the user's own LayerNorm-vs-DyT grid on their recipe, cells as jobs (docs/guides/grid.md).

Arguments are checked (the recipe imported, every cell checked by it, the output folder) before any job starts;
``satmon.grid.run`` does the work. The help text is :data:`DESCRIPTION` and :data:`EPILOG`.
"""

from __future__ import annotations

import argparse
import re
import sys

from satmon.cli.main import EXIT_INTERRUPTED, EXIT_USAGE, integer, usage_exit
from satmon.cli.progress import say

__all__ = ["EXIT_BUSY", "EXIT_INCOMPLETE", "main", "minutes"]

EXIT_INCOMPLETE, EXIT_BUSY = 1, 3

DESCRIPTION = """\
Run a LayerNorm-vs-DyT grid on your recipe: every cell (a size, a unique-token budget, a seed) trains twice
from the same initial weights on the same batches, once with LayerNorm and once with DyT; the DyT arm's
window is screened by satmon.Screen and its final checkpoint read by the study's protocol. It ends with
DyT's measured effect per size and budget (final and best checkpoint), whether a window reading predicted
it held out (docs/plans/grid_plan.md's test), and where satmon.forecast was right or wrong on these cells.

RECIPE is 'builtin' (satmon's faithful grid), 'llama' (satmon.demos.llama: RMSNorm vs DyT, SwiGLU and
GELU), MODULE:ATTR or path/to/file.py:ATTR naming a
satmon.grid.Recipe (docs/guides/grid.md: the contract and a complete example). Naming it runs its code: name
only code you trust; the working directory is not searched. The jobs import what this command imported
(they start in OUT/jobs, never importing the working folder's satmon/ or submitit/), a file recipe from the
copy made when the grid started (editing the file later changes no running grid), and each job refuses code
other than its cell's key names.

  satmon grid builtin --smoke --out g                        # 4 tiny cells in seconds: a first try
  satmon grid builtin --preset quick --out g                 # 2 cells of the faithful grid (~15 CPU-minutes each)
  satmon grid my_recipe.py:RECIPE --sizes s,m --budgets 16ep,164ep --seeds 0,1 --steps 2000 --window 200 --out g
  satmon grid builtin --preset full --executor slurm --slurm-partition gpu --gpus-per-cell 1 --time 2:00:00 \\
      --max-parallel 8 --out /scratch/g"""

EPILOG = """\
budgets: epochs ('164ep': passes over the unique tokens in --steps steps) or tokens ('31220', '64k', '3.5M').

resuming: every finished cell is OUT/cells/<name>.<key>.json, written atomically; the key hashes the
recipe (its source file too), every shared setting, the options and the cell's axes. Rerun the same
command and only cells without a complete result run (a failed or killed job's cell runs again, its log
named); change any setting and its cells are new ones, never mixed with the old. One grid at a time
per --out: a second one stops at once, naming the first (exit 3), and so does a rerun while a job an
earlier, killed grid started is still running. Ctrl-C cancels the running jobs, keeps every finished
cell and writes grid.json with the rest listed. A cell whose arm diverged (its loss not finite) is
complete: an outcome, named and counted, never a lost grid.

outputs: OUT/grid.json (the cells, the missing and failed ones and why, the environment, the analysis;
satmon calibrate --cells OUT/grid.json --metric READING reads it), OUT/report.md, OUT/phase_grid.csv
(satmon report --plot --cells OUT/grid.json draws the cells on the study's phase diagram), OUT/jobs/ (logs).

executors: local (default; --jobs at once, one thread each) through submitit's LocalExecutor, or plain
local processes where submitit is not installed (pip install 'satmon[grid]'); slurm: one submitit job
array (--slurm-partition, --gpus-per-cell, --cpus-per-cell, --time, --max-parallel; --dry-run writes the
sbatch file to OUT/jobs/submission.sh and submits nothing).

exit codes: 0 every cell complete (a diverged arm included), 1 some cells failed or died (grid.json and
the lines above name them, why and their logs; rerun to retry them), 2 usage error (refused before any
work: nothing made), 3 --out is in use (by another grid, or by a job a killed grid left running),
130 interrupted (Ctrl-C; rerun the same command to resume)."""


def minutes(text: str) -> int:
    """An argparse ``type``: a time limit as minutes (``90``) or ``[D-]HH:MM[:SS]`` (SLURM's), in whole minutes.

    Example:
        >>> minutes("90"), minutes("2:00:00"), minutes("1-00:00")
        (90, 120, 1440)
    """
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{2})(?::(\d{2}))?", text.strip())
    if m:
        total = int(m[1] or 0) * 1440 + int(m[2]) * 60 + int(m[3]) + (1 if int(m[4] or 0) else 0)
    elif text.strip().isdigit():
        total = int(text)
    else:
        raise argparse.ArgumentTypeError(f"expected minutes (90) or HH:MM:SS (2:00:00), got {text!r}")
    if total < 1:
        raise argparse.ArgumentTypeError(f"expected a time limit of at least 1 minute, got {text!r}")
    return total


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_]\w*", key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="satmon grid", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "recipe", metavar="RECIPE", help="'builtin', MODULE:ATTR or path/to/file.py:ATTR (a satmon.grid.Recipe)"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--preset", help="one of the recipe's named grids (the builtin's: full, quick, smoke, grid2)")
    mode.add_argument("--smoke", action="store_true", help="the recipe's 'smoke' preset (the builtin's: 4 tiny cells)")
    p.add_argument("--sizes", help="model sizes, as the recipe names them (the builtin's: d64L2,d96L3)")
    p.add_argument("--budgets", help="unique-token budgets: epochs or tokens, e.g. 164ep,16ep or 31220,3.5M")
    p.add_argument("--seeds", help="seeds, e.g. 0,1")
    p.add_argument("--steps", type=integer(1), help="optimizer steps per arm (default 5000, the study's)")
    p.add_argument("--window", type=integer(1), help="the screening window in steps (default 500)")
    p.add_argument(
        "--warmup",
        type=integer(0),
        help="linear warm-up steps, then a constant rate (default min(2000, 0.4 x --steps))",
    )
    p.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    p.add_argument("--eval-every", type=integer(1), help="held-out loss every N steps (default 250)")
    p.add_argument("--series-every", type=integer(1), help="window series and training loss every N steps (default 50)")
    p.add_argument("--device", help="where cells train: cpu (default) or cuda")
    p.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe option over its default (repeatable)",
    )
    p.add_argument(
        "--arms",
        help="the arms to run among the recipe's (default all; the builtin's: layernorm,dyt; "
        "llama's: rmsnorm,dyt,dyt-gelu,rmsnorm-gelu); the recipe's first arm, the reference, always runs",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="an extra axis over a recipe option or a grid setting (lr, warmup, window, ...), crossed with "
        "sizes x budgets x seeds (repeatable)",
    )
    p.add_argument("--out", default="satmon_grid", help="output folder (default ./satmon_grid)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local", help="local processes (default) or SLURM")
    p.add_argument("--jobs", type=integer(1), default=2, help="local: cells at once, one thread each (default 2)")
    p.add_argument("--slurm-partition", help="slurm: the partition")
    p.add_argument("--gpus-per-cell", type=integer(0), default=0, help="slurm: GPUs per cell's job (default 0)")
    p.add_argument(
        "--cpus-per-cell", type=integer(1), default=1, help="slurm: CPUs (and torch threads) per cell (default 1)"
    )
    p.add_argument(
        "--time", type=minutes, default=24 * 60, help="a cell's time limit, minutes or HH:MM:SS (default 24:00:00)"
    )
    p.add_argument(
        "--max-parallel", type=integer(1), default=16, help="slurm: array tasks running at once (default 16)"
    )
    p.add_argument("--dry-run", action="store_true", help="slurm: write the sbatch file and tasks, submit nothing")
    p.add_argument(
        "--progress-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between progress lines "
        "(cells done, running, queued, failed, ETA; default 30 on a terminal, 120 otherwise)",
    )
    p.add_argument(
        "--permutations",
        type=integer(1),
        default=10_000,
        help="shuffles of the plan's permutation test (default 10000)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon grid``; returns the exit code (see :data:`EPILOG`)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return usage_exit(e)
    say("grid", f"loading the recipe {args.recipe} and checking its cells")
    from satmon.errors import UsageError, error_line
    from satmon.grid.engine import GridInterrupted, run
    from satmon.grid.jobs import slurm_parameters
    from satmon.io.atomic import OutputError
    from satmon.io.lock import OutputBusy
    from satmon.io.safe_text import printable

    if args.progress_every is not None and not args.progress_every >= 0:
        print(f"satmon grid: Expected --progress-every >= 0 seconds, got {args.progress_every}.", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run and args.executor != "slurm":
        print(
            "satmon grid: Expected --dry-run with --executor slurm (it writes the sbatch file), got --executor local.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    settings = {
        k: getattr(args, k)
        for k in ("steps", "window", "warmup", "lr", "eval_every", "series_every", "device")
        if getattr(args, k) is not None
    }
    slurm = slurm_parameters(args.slurm_partition, args.gpus_per_cell, args.time, args.max_parallel, args.cpus_per_cell)
    preset = "smoke" if args.smoke else args.preset
    try:
        result = run(
            args.recipe,
            args.sizes,
            args.budgets,
            args.seeds,
            out=args.out,
            settings=settings or None,
            options=dict(args.option),
            preset=preset,
            executor=args.executor,
            jobs=args.jobs,
            time_min=args.time,
            slurm=slurm,
            dry_run=args.dry_run,
            permutations=args.permutations,
            every=args.progress_every,
            arms=args.arms,
            vary=args.vary or None,
            say=lambda line: say("grid", line),
        )
    except OutputBusy as e:
        print(f"satmon grid: {printable(str(e))}", file=sys.stderr)
        return EXIT_BUSY
    except (UsageError, OutputError, ValueError) as e:
        print(
            f"satmon grid: {printable(str(e) if type(e) in (ValueError, OutputError) else error_line(e))}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except GridInterrupted as e:
        r = e.result
        print(
            f"satmon grid: interrupted (Ctrl-C): {len(r.cells)} of {len(r.status)} cells complete and kept in "
            f"{r.out / 'cells'}; {r.json_path} lists the rest. Rerun the same command to resume: only the cells "
            "without a complete result run.",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if args.dry_run:
        return 0
    return 0 if result.complete else EXIT_INCOMPLETE
