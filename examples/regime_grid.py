"""Does the 500-step screen predict DyT's effect? The regime study's protocol at CPU scale, pre-registered.

A thin caller of ``satmon grid builtin`` (the faithful grid's recipe, ``satmon/grid/builtin.py``; the loop, the
readings and the analysis are ``satmon.grid``'s, moved there from this script with their numbers unchanged).
Each cell (a model size, a unique-token budget, a seed) trains satmon's GPT-2-style demo model twice from the
same initial weights and on the same batches, once with LayerNorm and once with DyT, and records the window's
readings from ``satmon.Screen``, the final checkpoint's by the study's protocol, both arms' curves and best
held-out losses, and DyT's effect ``delta = (DyT - LayerNorm) / LayerNorm`` (negative: DyT helps). docs/guides/grid.md
describes the cell; docs/plans/grid_plan.md and docs/plans/grid2_plan.md the analyses, committed before the runs.

    python examples/regime_grid.py              # the full grid: 2 sizes x 4 budgets x 2 seeds (~2 CPU-hours)
    python examples/regime_grid.py --quick      # 2 of its cells (same numbers on the same machine), ~15 CPU-minutes
    python examples/regime_grid.py --smoke      # 4 tiny cells, 8 steps: the test suite's check
    python examples/regime_grid.py --grid2      # the second grid (docs/plans/grid2_plan.md): 30 cells, ~4 CPU-hours
    python examples/regime_grid.py --sizes d64L2,d80L2 --budgets 164ep,1.4ep --seeds 2,3 --out more
    python examples/regime_grid.py --report data/faithful_grid.json --plot docs/img/faithful_grid.png

The same as ``satmon grid builtin --preset quick --out regime_grid_out`` and so on, plus ``satmon calibrate`` on
every window reading (``OUT/calibrate/``) and the four-panel plot (``OUT/faithful_grid.png``; matplotlib, the
``report`` extra). Every finished cell is ``OUT/cells/<name>.<key>.json``: a stopped run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

from satmon.grid.analysis import (  # noqa: F401 (the analysis' names, re-exported: its callers and tests read them here)
    FINAL_READINGS,
    READINGS,
    STUDY_THRESHOLD,
    WINDOW_READINGS,
    analyze,
    held_out,
    json_safe,
    plot,
    report_markdown,
)

#: --quick / --smoke / --grid2 / the default: the builtin recipe's presets
MODES = {"full": "full", "quick": "quick", "smoke": "smoke", "grid2": "grid2"}


def try_plot(analysis: dict[str, Any], cells: list[dict[str, Any]], path: Path) -> bool:
    """The plot, or one line saying why not (matplotlib is the ``report`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            f'regime_grid: no plot ({path}): matplotlib is not installed; pip install -e ".[report]" adds it.',
            file=sys.stderr,
        )
        return False
    plot(analysis, cells, path)
    return True


def calibrate_all(json_path: Path, out: Path) -> dict[str, int]:
    """``satmon calibrate --cells JSON --metric M --out out/M`` for every window reading, through the console
    command's entry point (in this process); its console text goes to ``out/M/stdout.txt``. Returns the exit
    code per reading (2: the cells cannot be fitted, e.g. one class only; the text says why)."""
    from satmon.cli.main import main as satmon_main  # the `satmon` console script's entry point

    codes = {}
    for metric in WINDOW_READINGS:
        dest = out / metric
        dest.mkdir(parents=True, exist_ok=True)
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            codes[metric] = satmon_main(
                ["calibrate", "--cells", str(json_path), "--metric", metric, "--out", str(dest)]
            )
        (dest / "stdout.txt").write_text(text.getvalue())
    return codes


def report(json_path: Path, out_md: Path | None, plot_path: Path | None, permutations: int = 10_000) -> str:
    """The pre-registered analysis of a finished grid's JSON (``satmon grid``'s or 0.4's) as markdown (and the plot)."""
    cells = json.loads(json_path.read_text())["cells"]
    analysis = analyze(cells, permutations)
    text = report_markdown(analysis, cells)
    if out_md is not None:
        out_md.write_text(text + "\n")
    if plot_path is not None:
        try_plot(analysis, cells, plot_path)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", action="store_true", help="2 cells of the full grid (d64L2, 164 and 1.4 epochs, seed 0)"
    )
    mode.add_argument("--smoke", action="store_true", help="4 tiny cells, 8 steps (window 4): the test suite's check")
    mode.add_argument(
        "--grid2",
        action="store_true",
        help="the second grid (docs/plans/grid2_plan.md): 30 cells, 3 sizes, "
        "3.3-164 passes, seeds 2 and 3, budgets drawn as chunks per seed (~4 CPU-hours)",
    )
    mode.add_argument("--report", metavar="JSON", help="only the analysis of a finished grid's JSON (no training)")
    p.add_argument("--sizes", help="model sizes, e.g. d64L2,d96L3 (default: the mode's)")
    p.add_argument("--budgets", help="unique-token budgets, epochs or bytes, e.g. 164ep,16ep,3.3ep,1.4ep or 31220,3.5M")
    p.add_argument("--seeds", help="seeds, e.g. 0,1")
    p.add_argument("--steps", type=int, help="optimizer steps per arm (default 5000, the study's)")
    p.add_argument("--window", type=int, help="the screening window (default 500)")
    p.add_argument("--warmup", type=int, help="linear warm-up steps, then a constant rate (default 2000, the study's)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    p.add_argument("--emb-scale", type=float, help="embedding multiplier (default 1.0: GPT-2's, the study's)")
    p.add_argument("--alpha-init", type=float, help="DyT's alpha_init (default 2.0, the study's)")
    p.add_argument("--out", default="regime_grid_out", help="output directory (default ./regime_grid_out)")
    p.add_argument("--jobs", type=int, default=2, help="cells trained at once, one thread each (default 2)")
    p.add_argument("--plot", default=None, help="with --report: write the plot there")
    p.add_argument(
        "--permutations", type=int, default=10_000, help="shuffles for the permutation p-value (default 10000)"
    )
    p.add_argument("--no-calibrate", action="store_true", help="skip `satmon calibrate` on every window reading")
    args = p.parse_args(argv)
    if args.permutations < 1:
        p.error(f"expected --permutations >= 1, got {args.permutations}")
    if args.report:
        try:
            print(report(Path(args.report), None, Path(args.plot) if args.plot else None, args.permutations))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            p.error(f"could not read the grid JSON {args.report}: {e}")
        return 0
    if args.jobs < 1:
        p.error(f"expected --jobs >= 1, got {args.jobs}")
    import satmon.grid
    from satmon.io.lock import OutputBusy

    preset = "smoke" if args.smoke else "quick" if args.quick else "grid2" if args.grid2 else "full"
    settings = {k: getattr(args, k) for k in ("steps", "window", "warmup", "lr") if getattr(args, k) is not None}
    options = {k: getattr(args, k) for k in ("emb_scale", "alpha_init") if getattr(args, k) is not None}
    out = Path(args.out)
    try:
        result = satmon.grid.run(
            "builtin",
            args.sizes,
            args.budgets,
            args.seeds,
            out=out,
            preset=preset,
            settings=settings or None,
            options=options,
            jobs=args.jobs,
            permutations=args.permutations,
            say=lambda line: print(f"regime_grid: {line}", file=sys.stderr, flush=True),
        )
    except (ValueError, OutputBusy) as e:
        p.error(str(e))
    except satmon.grid.GridInterrupted as e:
        print(
            f"regime_grid: interrupted: {len(e.result.cells)} cells complete and kept; rerun "
            "the same command to resume.",
            file=sys.stderr,
        )
        return 130
    if not result.cells:
        return 1
    plotted = try_plot(result.analysis, result.cells, out / "faithful_grid.png")
    print(report_markdown(result.analysis, result.cells))
    cpu = sum(c["cpu_seconds"] for c in result.cells)
    print(
        f"\n{len(result.cells)} cells; CPU {cpu / 60:.1f} min summed over cells. Wrote {result.json_path}, "
        f"{out / 'report.md'}" + (f", {out / 'faithful_grid.png'}" if plotted else "")
    )
    if not args.no_calibrate:
        codes = calibrate_all(result.json_path, out / "calibrate")
        bad = {m: c for m, c in codes.items() if c != 0}
        print(
            f"satmon calibrate on {len(codes)} window readings: {out / 'calibrate'}/<reading>/"
            + (f"; could not fit {sorted(bad)} (see their stdout.txt)" if bad else "")
        )
    return 0 if result.complete else 1


if __name__ == "__main__":
    sys.exit(main())
