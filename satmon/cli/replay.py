"""``satmon replay``: the command line of :func:`satmon.replay` (:mod:`satmon.replaying.session`), which checks
everything before any work, replays the checkpoints and writes the outputs (a TensorBoard run lined up with the
live runs, ``--json`` once complete, ``--report``). This module parses the flags into one
:class:`~satmon.replaying.options.ReplayOptions` and prints what it yields: progress, the summary table, the live
verdict beside the replay's, the exit code. Ctrl-C and SIGTERM end with one line saying where every output stands (exit
130 / 143); :data:`EPILOG` and docs/guides/replay.md give security and the exit codes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from satmon import study
from satmon.replaying.user_code import ReplayUsageError  # no torch: the first line is said before torch is imported

__all__ = ["EXIT_INTERRUPTED", "EXIT_NONFINITE", "EXIT_OK", "EXIT_SKIPPED", "EXIT_TERMINATED", "EXIT_USAGE", "main"]

EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, EXIT_NONFINITE = 0, 1, 2, 3
#: Interrupted by Ctrl-C (SIGINT) or SIGTERM: the shell's 128 + signal number.
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143

DESCRIPTION = (
    "Replay every satmon diagnostic over saved checkpoints: a TensorBoard run with the live callback's "
    "tags, stepped by each checkpoint's global step, plus optional JSON records and a markdown report."
)

EPILOG = """\
examples:
  satmon replay lightning_logs/version_0/checkpoints --model satmon.demos.lit:LitLM \\
      --datamodule satmon.demos.corpus:CorpusDataModule --logdir satmon_logs --report replay.md
  satmon replay ckpts/ --model mypkg.model:MyLit --data calib.pt --batches 8 --json replay.json
  satmon replay weights/*.safetensors --factory ./build_model.py:build --data calib.pt
  satmon replay hf_output_dir/ --factory ./build_model.py:build --data calib.pt

user code: --model, --factory and --datamodule IMPORT AND RUN the code they name: MODULE:ATTR is
imported from sys.path (an installed package, or PYTHONPATH; the working directory is not searched),
path/to/file.py:ATTR runs that file. Name only code you trust.

checkpoints: read with torch.load(weights_only=True): no code stored in a file runs. A file that
needs more (custom classes in its pickle) is skipped, named with the global torch refused.
--trust-checkpoints loads such files with weights_only=False, which RUNS CODE STORED IN THEM: only
for files you made or trust. A Hugging Face checkpoint-N folder is one checkpoint (weights from
model.safetensors, pytorch_model.bin or a sharded index, step from trainer_state.json); its
optimizer, scheduler and RNG files are not checkpoints.

batches: a tuple/list (x, y) whose y is an integer tensor of x's shape is read as (inputs, targets)
and only x is fed; otherwise a tensor is fed as model(t), a tuple as model(*b), a dict as model(**b).
--input-key K feeds batch[K] only (an index for tuples, a key for dicts).

outputs: --json FILE is written once the replay is complete (atomically: the previous FILE stays
whole until then); the records are kept as they come in FILE.partial.jsonl, removed at the end.
An interrupted replay leaves FILE as it was and says where its records are.

exit codes: 0 all replayed, 1 incomplete (a checkpoint was skipped, or a file or folder that may hold
checkpoints could not be read: the last line says "incomplete"), 2 usage error (checked before any
work; nothing written), 3 non-finite values (NaN/inf weights or DyT inputs) in a replayed checkpoint,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

_USER_CODE = "imports and runs that code; MODULE:ATTR from sys.path (not the working directory) or path/to/file.py:ATTR"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="satmon replay",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="CHECKPOINT_OR_DIR",
        help="checkpoint files, or directories (searched recursively, symlinks followed, for .ckpt/.pt/.pth/"
        ".safetensors files and Hugging Face checkpoint-N folders)",
    )
    p.add_argument(
        "--model",
        metavar="MODULE:CLASS",
        help="the LightningModule class: .ckpt files are rebuilt from "
        f"their hyper-parameters and weights, the random-init twin with CLASS(**hyper_parameters) ({_USER_CODE})",
    )
    p.add_argument(
        "--factory",
        metavar="MODULE:FUNCTION",
        help="a function returning the nn.Module, for plain state_dict "
        f"files (.pt/.pth/.safetensors) and Hugging Face checkpoint folders ({_USER_CODE})",
    )
    data = p.add_mutually_exclusive_group()
    data.add_argument(
        "--data",
        metavar="FILE",
        help="calibration batches: a torch.save'd tensor, list of batches or dict "
        "of tensors (read with weights_only=True)",
    )
    data.add_argument(
        "--datamodule",
        metavar="MODULE:CLASS",
        help="a LightningDataModule: its train_dataloader, built "
        f"with the datamodule hyper-parameters stored in the checkpoint when present ({_USER_CODE})",
    )
    p.add_argument(
        "--trust-checkpoints",
        action="store_true",
        help="load checkpoints with torch.load(weights_only=False): "
        "RUNS CODE STORED IN THE FILES; only for checkpoints you trust (default: weights_only=True, and "
        "files that need more are skipped with the reason)",
    )
    p.add_argument("--weights-only", action="store_true", help=argparse.SUPPRESS)  # 0.1's opt-in; now the default
    p.add_argument(
        "--batches", type=int, default=4, help="calibration batches, the same for every checkpoint (default 4)"
    )
    p.add_argument(
        "--batch-size", type=int, default=None, help="split a --data tensor/dict into batches of this many rows"
    )
    p.add_argument("--input-key", default=None, help="feed only batch[KEY] to the model (index or dict key)")
    p.add_argument(
        "--logdir",
        default="satmon_logs",
        help="TensorBoard root; the run goes to LOGDIR/NAME/version_N (default ./satmon_logs)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="TensorBoard run name: the run goes to LOGDIR/NAME/version_N (default: the "
        "run goes to 'LOGDIR/replay of RUN', RUN the run the checkpoints are of, e.g. demo/version_0; "
        "LOGDIR/replay/version_N when they are of several runs)",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        help="records, one per checkpoint (FILE.jsonl: one a line; FILE.json: a JSON "
        "array); written when the replay is complete, FILE.partial.jsonl holds the records as they come",
    )
    p.add_argument(
        "--report", metavar="FILE.md", help="a markdown report with PNG plots saved beside it (needs matplotlib)"
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the model runs (auto: CUDA when available)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="forward precision (bfloat16: autocast); statistics stay float64",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help=f"GO threshold on pooled saturation, in (0, 1) (default: the study's, {study.THRESHOLD:g})",
    )
    p.add_argument(
        "--level",
        type=float,
        default=study.LEVEL,
        help=f"saturation level: |alpha x| > LEVEL, > 0 (default {study.LEVEL:g})",
    )
    p.add_argument(
        "--collapse-threshold",
        type=float,
        default=study.COLLAPSE_THRESHOLD,
        help=f"collapse-risk level for gated models, in (0, 1) (default {study.COLLAPSE_THRESHOLD:g})",
    )
    p.add_argument(
        "--no-twin", action="store_true", help="skip the random-init twin (no init-to-trained readout; faster)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: torch's own choice); "
        "1 is often fastest for small models on a busy machine",
    )
    p.add_argument(
        "--live",
        metavar="RUN",
        default=None,
        help="the live run's TensorBoard folder, to show its verdict "
        "beside the replay's (default: found in the checkpoints' SaturationMonitor state, or in TensorBoard "
        "events beside the checkpoints)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no status lines and no progress (the summary is still printed)"
    )
    return p


# ------------------------------------------------------------------------------------ validation
def _check_numbers(args: argparse.Namespace) -> Any:
    """Counts and the rule's numbers (``--threshold`` in (0, 1), ``--level`` > 0, ``--collapse-threshold`` in (0, 1));
    returns the one :class:`satmon.Settings` every checkpoint is read with (``--threshold`` left out: the study's)."""
    from satmon.settings import Settings

    for option, value in (("--batches", args.batches), ("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ReplayUsageError(f"Expected {option} >= 1, got {value}.")
    cpus = os.cpu_count() or 1
    if args.threads is not None and args.threads > cpus:  # torch's thread pool crashes (SIGSEGV) far beyond the machine
        raise ReplayUsageError(f"Expected --threads in [1, {cpus}] (the CPUs of this machine), got {args.threads}.")
    try:
        return Settings(threshold=args.threshold, level=args.level, collapse_threshold=args.collapse_threshold)
    except ValueError as e:
        message = str(e)
        for name, flag in (
            ("`collapse_threshold`", "--collapse-threshold"),
            ("`threshold`", "--threshold"),
            ("`level`", "--level"),
        ):
            message = message.replace(name, flag)
        raise ReplayUsageError(message) from None


# ------------------------------------------------------------------------------------ output
def _progress(total: int, quiet: bool):
    """``(update(row), close())``: a bar with an ETA on a terminal, one plain line a
    checkpoint (with the ETA) otherwise."""
    if quiet:
        return (lambda row: None), (lambda: None)
    from satmon.cli.progress import Progress

    progress = Progress(total, label="satmon replay:", unit="ckpt", every_item=True)
    done = [0]

    def update(row: dict[str, Any]) -> None:
        done[0] += 1
        reason = str(row["error"] or "")
        what = (
            f"skipped: {reason if len(reason) <= 100 else reason[:97] + '...'}"
            if row["error"]
            else (
                f"saturation {row['saturation']:.4f} {row['decision']}"
                if row["saturation"] is not None
                else f"norm type {row['norm_type']}"
            )
        )
        what += f" [non-finite: {row['nonfinite']}]" if row["nonfinite"] else ""
        secs = f" ({row['seconds']:.1f} s)" if row["seconds"] is not None else ""
        step = "" if row["step"] is None else f"step {row['step']} "
        progress.update(done[0], f"{step}{row['name']}: {what}{secs}")

    return update, progress.close


def _talk(args: argparse.Namespace):
    """The status lines of this replay (none with --quiet)."""
    from satmon.cli.progress import say

    return (lambda text: None) if args.quiet else (lambda text: say("replay", text))


def _first_line(args: argparse.Namespace) -> str:
    """What the replay is about to do, said before anything slow (importing torch, reading checkpoints)."""
    paths = ", ".join(args.paths[:2]) + (f" (+{len(args.paths) - 2} more)" if len(args.paths) > 2 else "")
    code = args.model or args.factory or "?"
    data = args.data or args.datamodule or "?"
    return (
        f"replaying the checkpoints in {paths} with {code}, calibration from {data}; loading torch "
        "and checking the arguments"
    )


def _summary(rows: list[dict[str, Any]], records: list[Any], live: list[str] | None = None) -> None:
    """The table of replayed checkpoints, the last one's verdict and ``live`` (the live verdict beside the replay's)."""
    from satmon.io.markdown import table

    print()
    print(
        table(
            [
                "step",
                "checkpoint",
                "saturation",
                "verdict",
                "non-finite",
                "norm type",
                "min sigma ratio",
                "min alignment",
                "s",
            ],
            [
                [
                    r["step"],
                    r["name"],
                    r["saturation"],
                    r["decision"],
                    r["nonfinite"],
                    r["norm_type"],
                    r["min_ratio"],
                    r["min_alignment"],
                    None if r["seconds"] is None else f"{r['seconds']:.2f}",
                ]
                for r in rows
                if r["error"] is None
            ],
        )
    )
    last = next((r for r in reversed(records) if r.verdict is not None), None)
    if last is not None:
        v = last.verdict
        said = v.headline() if v.cautions else v.decision.upper()  # a qualified decision says how far to trust it
        print(
            f"\nLast checkpoint (step {last.global_step}): {said}  pooled saturation "
            f"{v.saturation:.4f} {v.comparison} threshold {v.threshold:g} "
            f"(margin {v.margin:+.4f})"
        )
    if live:
        print("\n" + "\n".join(live))


def _replaced(out: Any, path: Any) -> str:
    return " (replaced the previous file; its permissions kept)" if path in out.existed else ""


def run(args: argparse.Namespace, state: dict[str, Any] | None = None) -> int:
    """Check everything the user passed, then read the checkpoints, replay them and report; the exit code
    (``state["run"]``: the :class:`~satmon.replaying.session.ReplaySession` once made, for the
    line of an interrupted one)."""
    state = {} if state is None else state
    talk = _talk(args)
    talk(_first_line(args))  # before torch is imported: the user sees at once what runs
    settings = _check_numbers(args)
    if args.weights_only and args.trust_checkpoints:
        raise ReplayUsageError(
            "Expected either --weights-only (read checkpoints with torch.load(weights_only=True): the default) or "
            "--trust-checkpoints (weights_only=False: runs code stored in them), got both: drop one."
        )
    from satmon.replaying.outputs import live_lines
    from satmon.replaying.session import ReplayOptions, ReplaySession

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.weights_only:
        print(
            "satmon replay: note: --weights-only is the default since satmon 0.2 (the flag is ignored).",
            file=sys.stderr,
        )
    options = ReplayOptions(
        model=args.model,
        factory=args.factory,
        data=args.data,
        datamodule=args.datamodule,
        settings=settings,
        batches=args.batches,
        batch_size=args.batch_size,
        input_key=args.input_key,
        trust_checkpoints=args.trust_checkpoints,
        device=args.device,
        dtype=args.dtype,
        twin=not args.no_twin,
        live=args.live,
        logdir=args.logdir,
        name=args.name,
        json=args.json,
        report=args.report,
        on_status=talk,
    )
    state["run"] = rp = ReplaySession(args.paths, options)
    talk(
        f"replaying {len(rp.todo)} checkpoint(s) on {rp.device.type} (calibration: {rp.data_text}); the first one also "
        "builds the model and finds its layers"
    )
    update, close = _progress(len(rp.todo), args.quiet)
    try:
        for record in rp:
            for note in record.notes:
                print(f"satmon replay: note: {record.checkpoint}: {note}", file=sys.stderr)
            if record.error:
                print(f"satmon replay: skipped {record.checkpoint}: {record.error}", file=sys.stderr)
            update(rp.rows[-1])
    finally:
        close()
        rp.close()  # stopped early (Ctrl-C...): its files closed now, while TensorBoard's writer thread still runs
    rows, records, out = rp.rows, rp.records, rp.outputs
    ok = [r for r in rows if r["error"] is None]
    _summary(rows, records, live_lines(records))
    print(
        f"\nReplayed {len(ok)} of {len(rows)} checkpoint(s) in {rp.seconds:.1f} s on {rp.device.type} ({args.dtype}); "
        f"calibration: {rp.data_text}."
    )
    if rp.log_dir is not None:
        from satmon.cli.main import command

        print(f"TensorBoard run: {rp.log_dir}   ({command('satmon', 'report', rp.log_dir)})")
    else:
        print("TensorBoard run: none (no checkpoint could be read)")
    if rp.json_written is not None:
        print(f"JSON records:    {rp.json_written.resolve()}{_replaced(out, rp.json_written)}")
    if rp.unverified:
        print(f"satmon replay: note: {rp.unverified}", file=sys.stderr)
    if rp.report_written:
        written = rp.report_written
        replaced = [p for p in written if p in out.existed]
        note = f"; replaced {len(replaced)} previous file(s), their permissions kept" if replaced else ""
        print(f"Report:          {written[0].resolve()} (+ {len(written) - 1} PNG{note})")
    for line in rp.problems():  # the last one says "incomplete" when the replay was
        print(f"satmon replay: {line}", file=sys.stderr)
    return EXIT_NONFINITE if rp.nonfinite else EXIT_OK if rp.complete else EXIT_SKIPPED


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the replay is, so that it ends like Ctrl-C (one line, outputs intact)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon replay ...``; returns the exit code (:data:`EPILOG` lists them)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage line
        return int(e.code or 0)
    state: dict[str, Any] = {}

    def stopped(how: str) -> str:  # one line: how far it got, where every output stands
        if state.get("run") is None:
            return f"satmon replay: {how} before the first checkpoint was replayed; nothing was written."
        return state["run"].stopped(how)

    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: SIGTERM keeps its default
        pass
    try:
        return run(args, state)
    except ReplayUsageError as e:
        print(f"satmon replay: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        terminated = isinstance(e, _Terminated)
        print("\n" + stopped("terminated (SIGTERM)" if terminated else "interrupted (Ctrl-C)"), file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except OSError as e:  # an output that cannot be written mid-run (a full disk...): what was there stays
        from satmon.errors import error_line

        print(stopped(f"stopped by {error_line(e)}"), file=sys.stderr)
        return EXIT_SKIPPED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
