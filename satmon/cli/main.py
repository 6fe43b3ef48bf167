"""``satmon`` entry point: dispatches to the subcommands.

The top-level parser and every subcommand's parser are built from the standard library alone: torch,
Lightning and the readers are imported inside the function that runs a command, after its arguments
are parsed, so ``satmon --help``, ``--version`` and ``satmon COMMAND --help`` start at once.

Every command runs inside :func:`_guarded`: the working directory is not importable (an empty or relative
``PYTHONPATH`` entry, ``python -m``: :func:`satmon.replaying.user_code.no_working_directory`), a background
thread's error (TensorBoard's writer on a full disk) is kept instead of printed as a traceback and reaches
the command's one-line message, and an error nothing else caught ends in one line, not a traceback
(``SATMON_TRACEBACK=1`` shows it).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "SUBCOMMANDS",
    "fraction",
    "integer",
    "main",
    "usage_exit",
]

#: command -> (module with ``main(argv) -> int``, one line for ``satmon --help``)
SUBCOMMANDS = {
    "demo": ("satmon.cli.demo", "train the demo GPT (DyT) for the screening window and print the verdict"),
    "replay": ("satmon.cli.replay", "replay every diagnostic over saved checkpoints"),
    "report": ("satmon.cli.report", "print the verdict and trajectories of a satmon TensorBoard run"),
    "calibrate": ("satmon.cli.calibrate", "fit the GO threshold on your own runs' outcomes (writes calibration.json)"),
    "grid": ("satmon.cli.grid", "run a LayerNorm-vs-DyT grid on your own recipe, cells as jobs (local or SLURM)"),
}

#: the exit code of a usage error (argparse's), of a command ended by Ctrl-C (128 + SIGINT, the shell's), and of one
#: whose output pipe closed (128 + SIGPIPE: `satmon report ... | head`)
EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 2, 130, 141

DESCRIPTION = "Watch DyT saturation from inside transformer training, and replay it over saved checkpoints."

EPILOG = (
    "commands:\n"
    + "\n".join(f"  {name:<11}{line}" for name, (_, line) in SUBCOMMANDS.items())
    + """

Run satmon COMMAND --help for a command's options and exit codes.
exit codes: 0 success, 2 usage error (nothing done), 130 interrupted (Ctrl-C); each command
documents its others."""
)


def command(*words: object) -> str:
    """A command line for the user to paste: every word shell-quoted (a path with spaces stays one argument).

    Example:
        >>> command("satmon", "report", "satmon_logs/replay of demo/version_0")
        "satmon report 'satmon_logs/replay of demo/version_0'"
    """
    return shlex.join(str(w) for w in words)


def usage_exit(e: SystemExit) -> int:
    """The exit code of an argparse ``SystemExit``: 0 for ``--help`` / ``--version``, else :data:`EXIT_USAGE`
    (argparse has printed the usage and the error).

    Example:
        >>> usage_exit(SystemExit(0)), usage_exit(SystemExit(2))
        (0, 2)
    """
    return 0 if e.code in (0, None) else EXIT_USAGE


def integer(low: int, high: int | None = None):
    """An argparse ``type``: an integer in ``[low, high]`` (argparse turns a refusal into a usage error, exit 2).

    Example:
        >>> integer(1)("3")
        3
        >>> integer(1)("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected an integer >= 1, got '0'
    """
    span = f">= {low}" if high is None else f"in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {text!r}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def fraction(text: str) -> float:
    """An argparse ``type``: a number strictly between 0 and 1 (a threshold on a fraction of elements).

    Example:
        >>> fraction("0.5")
        0.5
        >>> fraction("nan")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected a number in (0, 1), got 'nan'
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    from satmon._version import __version__

    p = argparse.ArgumentParser(
        prog="satmon",
        usage="satmon [-h] [-V] COMMAND [ARGS ...]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-V", "--version", action="version", version=f"satmon {__version__}", help="print the version and exit"
    )
    p.add_argument("command", choices=list(SUBCOMMANDS), metavar="COMMAND", help="one of " + ", ".join(SUBCOMMANDS))
    return p


@contextmanager
def _guarded(name: str) -> Iterator[list[BaseException]]:
    """For a command's time: no import from the working directory; the errors of background threads kept in the
    yielded list instead of printed as tracebacks, and those of objects' finalizers said in one line; restored at
    the end."""
    from satmon.errors import error_line
    from satmon.replaying.user_code import no_working_directory

    errors: list[BaseException] = []
    previous, previous_unraisable = threading.excepthook, sys.unraisablehook

    def keep(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            errors.append(args.exc_value)

    def say(args: sys.UnraisableHookArgs) -> None:  # an error in a __del__: Python would print its traceback
        if args.exc_value is not None:
            print(
                f"satmon {name}: note: an error was ignored while an object was cleaned up: "
                f"{error_line(args.exc_value)}",
                file=sys.stderr,
            )

    threading.excepthook, sys.unraisablehook = keep, say
    try:
        with no_working_directory():
            yield errors
    finally:
        threading.excepthook, sys.unraisablehook = previous, previous_unraisable


def settings_problem() -> str | None:
    """What is wrong with satmon's settings from the environment (``SATMON_MAX_PICKLE_MB``), read once before any
    command works: one line, instead of the same error met at every file it governs."""
    from satmon.replaying.budget import pickle_budget

    try:
        pickle_budget()
    except ValueError as e:
        return str(e)
    return None


def _run(name: str, argv: list[str]) -> int:
    """The command's exit code; a background thread's error makes a run that said nothing of it end in one line."""
    from satmon.errors import error_line

    if not {"-h", "--help"} & set(argv) and (problem := settings_problem()):  # checked once, before any work
        print(f"satmon {name}: {problem}", file=sys.stderr)
        return EXIT_USAGE

    with _guarded(name) as errors:
        try:
            module = importlib.import_module(SUBCOMMANDS[name][0])
            code = int(module.main(argv) or 0)
        except KeyboardInterrupt:
            print(
                f"satmon {name}: interrupted (Ctrl-C); every output satmon replaces is either as it was or complete "
                "(files are replaced only by finished ones).",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        except Exception as e:  # nothing else caught it: one line, never a traceback (SATMON_TRACEBACK=1 shows it)
            if os.environ.get("SATMON_TRACEBACK"):
                traceback.print_exc()
            print(
                f"satmon {name}: stopped by an unexpected error: {error_line(e)}. Files satmon replaces were left as "
                "they were or replaced by complete ones; please report this with the command line "
                "(SATMON_TRACEBACK=1 shows where it happened).",
                file=sys.stderr,
            )
            return 1
        if errors and code == 0:  # a failure the command did not see (it reports those it sees in its own line)
            print(
                f"satmon {name}: a background thread failed: {error_line(errors[0])}; what it "
                "was writing (TensorBoard's "
                "event files) may be incomplete.",
                file=sys.stderr,
            )
            return 1
        return code


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon COMMAND ...``; returns the exit code.

    Bare ``satmon`` and an unknown command print the usage on stderr and return 2 (argparse's
    convention); ``--help`` prints it on stdout and returns 0. Ctrl-C during a command ends it with one
    line on stderr and exit code 130, no traceback; so does any other error (exit code 1).

    Example:
        >>> main(["--version"])  # doctest: +ELLIPSIS
        satmon 0...
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        try:
            _parser().parse_args(argv)  # --help, --version, or a usage error: argparse prints and exits
        except SystemExit as e:
            return usage_exit(e)
        return EXIT_USAGE  # not reached: a valid command is dispatched below
    return _run(argv[0], argv[1:])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
