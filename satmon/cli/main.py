"""``satmon`` entry point: dispatches to the subcommands."""

from __future__ import annotations

import sys

__all__ = ["main"]

SUBCOMMANDS = {
    "demo": ("satmon.cli.demo", "train the demo GPT (DyT) for the screening window and print the verdict"),
    "replay": ("satmon.cli.replay", "replay every diagnostic over saved checkpoints"),
    "report": ("satmon.cli.report", "print the verdict and trajectories of a satmon TensorBoard run"),
    "calibrate": ("satmon.cli.calibrate", "fit the GO threshold on your own runs' outcomes (writes calibration.json)"),
}


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon SUBCOMMAND ...``; returns the exit code.

    Example:
        >>> main(["--version"])
        satmon 0.3.0
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        from satmon._version import __version__

        print(f"satmon {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        lines = [f"usage: satmon {{{','.join(SUBCOMMANDS)}}} ...", ""] + [f"  {k:<11}{v[1]}" for k, v in SUBCOMMANDS.items()]
        if argv and argv[0] not in ("-h", "--help"):
            print(f"satmon: unknown command {argv[0]!r}; expected one of {', '.join(SUBCOMMANDS)}.\n", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)
            return 2
        print("\n".join(lines))
        return 0
    import importlib

    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
