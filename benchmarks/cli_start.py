"""How long the satmon command takes to start, beside ``python -c "import torch"``, in one run.

Each command runs as a fresh process, as a user types it, ``--repeats`` times; the commands are
interleaved (the order rotated each round) so that a busy, shared machine slows them alike. Reported:
the median and the minimum wall time of each, and its ratio to importing torch (the floor of any
command that needs torch) and to a bare interpreter (``python -c pass``, the floor of any command).

Measured:

- ``satmon --help`` and ``satmon report --help``: argparse only, no torch, no Lightning (goal: under
  0.3 s, and never slower than importing torch);
- ``satmon report RUN``: reads a real TensorBoard run (made with ``satmon demo`` at a small size, or
  ``--run PATH``), so it pays for the TensorBoard reader;
- ``python -c "import torch"`` and ``python -c pass``: the references.

Usage::

    python benchmarks/cli_start.py                 # 9 rounds; makes a small demo run first (about a minute)
    python benchmarks/cli_start.py --run satmon_logs/demo/version_0 --repeats 15 --json cli_start.json

satmon resolves from this checkout (``PYTHONPATH`` is set to its root), through the installed
``satmon`` console script when there is one (what a user runs), else through an equivalent
``python -c``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the goal of issue 18: satmon --help under this many seconds
HELP_GOAL_S = 0.3


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONWARNINGS": "ignore",
    }


def satmon_command() -> tuple[list[str], str]:
    """How to run satmon: the console script, or the same call through ``python -c``; and its description."""
    script = shutil.which("satmon")
    if script:
        return [script], f"console script {script}"
    return [sys.executable, "-c", "import sys; from satmon.cli.main import main; sys.exit(main())"], "python -c main()"


def make_run(folder: Path) -> Path:
    """A small real run: ``satmon demo`` with an 8-step window (a verdict, scalars, texts, a checkpoint)."""
    satmon, _ = satmon_command()
    args = ["demo", "--window", "8", "--train-tokens", "20000", "--logdir", str(folder), "--quiet", "--threads", "1"]
    proc = subprocess.run([*satmon, *args], capture_output=True, text=True, env=_env(), timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"cli_start: the demo run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return folder / "demo" / "version_0"


def time_once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(), timeout=300, check=False)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"cli_start: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return took


def measure(commands: dict[str, list[str]], repeats: int) -> dict[str, list[float]]:
    """Wall times of each command, ``repeats`` rounds, interleaved with the order rotated each round."""
    names = list(commands)
    for name in names:  # one untimed round: the file system cache warm for every command alike
        time_once(commands[name])
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(time_once(commands[name]))
    return times


def table(times: dict[str, list[float]], torch_key: str, bare_key: str) -> str:
    torch_med, bare_med = statistics.median(times[torch_key]), statistics.median(times[bare_key])
    rows = ["| command | median (s) | min (s) | / import torch | / python -c pass |", "|---|---|---|---|---|"]
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(f"| `{name}` | {med:.3f} | {min(ts):.3f} | {med / torch_med:.2f} | {med / bare_med:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9, help="fresh processes per command (default 9)")
    p.add_argument("--run", default=None, help="a satmon TensorBoard run for `satmon report RUN` (default: make one)")
    p.add_argument("--json", default=None, help="also write the times here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"expected --repeats >= 1, got {args.repeats}")
    satmon, how = satmon_command()
    with tempfile.TemporaryDirectory(prefix="satmon_cli_start_") as tmp:
        run = Path(args.run) if args.run else make_run(Path(tmp))
        commands = {
            "satmon --help": [*satmon, "--help"],
            "satmon report --help": [*satmon, "report", "--help"],
            "satmon report RUN": [*satmon, "report", str(run)],
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "python -c pass": [sys.executable, "-c", "pass"],
        }
        times = measure(commands, args.repeats)
    torch_key, bare_key = 'python -c "import torch"', "python -c pass"
    print(
        f"satmon start-up, {args.repeats} fresh processes per command, interleaved; satmon via {how}; "
        f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs; run: {run}"
    )
    print()
    print(table(times, torch_key, bare_key))
    print()
    help_med, torch_med = statistics.median(times["satmon --help"]), statistics.median(times[torch_key])
    print(
        f"satmon --help: median {help_med:.3f} s; goal under {HELP_GOAL_S} s: "
        f"{'met' if help_med < HELP_GOAL_S else 'NOT met'}; "
        f"never slower than import torch ({torch_med:.3f} s): "
        f"{'met' if max(times['satmon --help']) < min(times[torch_key]) else 'NOT met'} (slowest vs fastest)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"repeats": args.repeats, "satmon": how, "times_s": times}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
