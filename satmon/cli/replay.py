"""``satmon replay``: every satmon diagnostic over saved checkpoints, written as a TensorBoard run
that lines up with live runs (same tags, stepped by each checkpoint's global step), plus optional
JSON records and a markdown report with plots.

Everything is checked before any work: the rule numbers, every output path, the user's code, the
checkpoints' listing and the model on the first checkpoint (built on the meta device). Outputs never
lose what was there: ``--json`` is written once, atomically, when the replay is complete, its records
kept as they come in ``FILE.partial.jsonl``; reports and plots are replaced atomically; Ctrl-C ends
with one line saying where everything is (exit 130). Security (checkpoints read with
weights_only=True unless --trust-checkpoints; --model/--factory/--datamodule run user code) and the
exit codes are in :data:`EPILOG` and docs/replay.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from satmon import study

__all__ = ["EXIT_INTERRUPTED", "EXIT_NONFINITE", "EXIT_OK", "EXIT_SKIPPED", "EXIT_TERMINATED", "EXIT_USAGE", "main"]

EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, EXIT_NONFINITE = 0, 1, 2, 3
#: Interrupted by Ctrl-C (SIGINT) or SIGTERM: the shell's 128 + signal number.
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143

DESCRIPTION = ("Replay every satmon diagnostic over saved checkpoints: a TensorBoard run with the live callback's "
               "tags, stepped by each checkpoint's global step, plus optional JSON records and a markdown report.")

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
    p = argparse.ArgumentParser(prog="satmon replay", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="CHECKPOINT_OR_DIR",
                   help="checkpoint files, or directories (searched recursively, symlinks followed, for .ckpt/.pt/.pth/"
                   ".safetensors files and Hugging Face checkpoint-N folders)")
    p.add_argument("--model", metavar="MODULE:CLASS", help="the LightningModule class: .ckpt files are rebuilt from "
                   f"their hyper-parameters and weights, the random-init twin with CLASS(**hyper_parameters) ({_USER_CODE})")
    p.add_argument("--factory", metavar="MODULE:FUNCTION", help="a function returning the nn.Module, for plain state_dict "
                   f"files (.pt/.pth/.safetensors) and Hugging Face checkpoint folders ({_USER_CODE})")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", metavar="FILE", help="calibration batches: a torch.save'd tensor, list of batches or dict "
                      "of tensors (read with weights_only=True)")
    data.add_argument("--datamodule", metavar="MODULE:CLASS", help="a LightningDataModule: its train_dataloader, built "
                      f"with the datamodule hyper-parameters stored in the checkpoint when present ({_USER_CODE})")
    p.add_argument("--trust-checkpoints", action="store_true", help="load checkpoints with torch.load(weights_only=False): "
                   "RUNS CODE STORED IN THE FILES; only for checkpoints you trust (default: weights_only=True, and "
                   "files that need more are skipped with the reason)")
    p.add_argument("--weights-only", action="store_true", help=argparse.SUPPRESS)  # 0.1's opt-in; now the default
    p.add_argument("--batches", type=int, default=4, help="calibration batches, the same for every checkpoint (default 4)")
    p.add_argument("--batch-size", type=int, default=None, help="split a --data tensor/dict into batches of this many rows")
    p.add_argument("--input-key", default=None, help="feed only batch[KEY] to the model (index or dict key)")
    p.add_argument("--logdir", default="satmon_logs", help="TensorBoard root; the run goes to LOGDIR/NAME/version_N (default ./satmon_logs)")
    p.add_argument("--name", default=None, help="TensorBoard run name: the run goes to LOGDIR/NAME/version_N (default: the "
                   "run goes to 'LOGDIR/replay of RUN', RUN the run the checkpoints are of, e.g. demo/version_0; "
                   "LOGDIR/replay/version_N when they are of several runs)")
    p.add_argument("--json", metavar="FILE", help="records, one per checkpoint (FILE.jsonl: one a line; FILE.json: a JSON "
                   "array); written when the replay is complete, FILE.partial.jsonl holds the records as they come")
    p.add_argument("--report", metavar="FILE.md", help="a markdown report with PNG plots saved beside it (needs matplotlib)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the model runs (auto: CUDA when available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="forward precision (bfloat16: autocast); statistics stay float64")
    p.add_argument("--threshold", type=float, default=study.THRESHOLD,
                   help=f"GO threshold on pooled saturation, in (0, 1) (the study's: {study.THRESHOLD:g})")
    p.add_argument("--level", type=float, default=study.LEVEL,
                   help=f"saturation level: |alpha x| > LEVEL, > 0 (default {study.LEVEL:g})")
    p.add_argument("--collapse-threshold", type=float, default=study.COLLAPSE_THRESHOLD,
                   help=f"collapse-risk level for gated models, in (0, 1) (default {study.COLLAPSE_THRESHOLD:g})")
    p.add_argument("--no-twin", action="store_true", help="skip the random-init twin (no init-to-trained readout; faster)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's own choice); "
                   "1 is often fastest for small models on a busy machine")
    p.add_argument("--live", metavar="RUN", default=None, help="the live run's TensorBoard folder, to show its verdict "
                   "beside the replay's (default: found in the checkpoints' SaturationMonitor state, or in TensorBoard "
                   "events beside the checkpoints)")
    p.add_argument("--quiet", action="store_true", help="no status lines and no progress (the summary is still printed)")
    return p


# ------------------------------------------------------------------------------------ validation
def _usage(message: str) -> Exception:
    from satmon.replay.user_code import ReplayUsageError

    return ReplayUsageError(message)


def _check_numbers(args: argparse.Namespace) -> Any:
    """Counts and the rule's numbers (``--threshold`` in (0, 1), ``--level`` > 0, ``--collapse-threshold`` in (0, 1));
    returns the one :class:`satmon.Settings` every checkpoint is read with."""
    from satmon.settings import Settings, check_rule

    for option, value in (("--batches", args.batches), ("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise _usage(f"Expected {option} >= 1, got {value}.")
    cpus = os.cpu_count() or 1
    if args.threads is not None and args.threads > cpus:  # torch's thread pool crashes (SIGSEGV) far beyond the machine
        raise _usage(f"Expected --threads in [1, {cpus}] (the CPUs of this machine), got {args.threads}.")
    try:
        check_rule(args.level, args.threshold, args.collapse_threshold)
    except ValueError as e:
        message = str(e)
        for name, flag in (("`collapse_threshold`", "--collapse-threshold"), ("`threshold`", "--threshold"), ("`level`", "--level")):
            message = message.replace(name, flag)
        raise _usage(message) from None
    return Settings(threshold=args.threshold, level=args.level, collapse_threshold=args.collapse_threshold)


@dataclass
class Outputs:
    """Every path the replay writes, checked before any work (symlinks resolved: a link's target is written)."""

    logdir: Path
    name: str
    source: str | None = None  # the run the checkpoints are of: the TensorBoard run is "replay of SOURCE"
    json: Path | None = None
    partial: Path | None = None
    report: Path | None = None
    plots: list[Path] = field(default_factory=list)
    existed: set[Path] = field(default_factory=set)  #: outputs that were there before (replaced at the end)


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _check_utf8(option: str, value: str) -> None:
    """TensorBoard, and the links of a markdown report, take only UTF-8 paths: an output name with bytes that are not
    UTF-8 is refused before any work, and so is one holding control characters (every line naming it would send them
    to the terminal)."""
    from satmon.replay.user_code import printable

    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _usage(f"Expected {option} to be a UTF-8 name (TensorBoard, JSON and markdown write only those), got "
                     f"'{printable(value)}': pass another name.") from None
    if not value.isprintable():
        raise _usage(f"Expected {option} to be a name without control characters (every line naming it would send them "
                     f"to the terminal), got '{printable(value)}': pass another name.")


def _check_folder(option: str, value: str) -> Path:
    """A folder that can be created or written: refused when empty, a file, or under a file or a read-only folder."""
    from satmon.io.atomic import OutputError, check_name_lengths
    from satmon.paths import not_a_folder

    if not value.strip():
        raise _usage(f"Expected {option} to name a folder, got an empty name: pass a path such as satmon_logs.")
    _check_utf8(option, value)
    path = Path(value)  # literally: no ~ or $VAR expansion (what is checked is what is written)
    try:
        check_name_lengths(path, option)
    except OutputError as e:
        raise _usage(str(e)) from None
    if (said := not_a_folder(path)) is not None:  # a file, a FIFO, a device, a link to one, a symlink loop
        raise _usage(f"Expected {option} {value!r} to be a folder, got {said}: pass a folder path (it is created if missing).")
    existing = next((a for a in (path, *path.parents) if a.exists()), Path("."))
    if not existing.is_dir():
        raise _usage(f"{option} {value!r}: cannot write there: {str(existing)!r} is a file, not a folder. "
                     "Pass a path in a writable folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _usage(f"{option} {value!r}: cannot write there: no write permission on {str(existing)!r}. "
                     "Pass a path in a writable folder.")
    return path


def _check_outputs(args: argparse.Namespace) -> Outputs:
    """Check every output path before any work: the TensorBoard folder and run name, --json and its partial
    file, --report and its plots."""
    from satmon.io.atomic import OutputError, check_output
    from satmon.io.markdown import PLOTS, report_paths

    from satmon.replay.live import run_name, source_run

    logdir = _check_folder("--logdir", args.logdir)
    source = run_name(source_run([Path(p) for p in args.paths])) if args.name is None else None
    name = args.name if args.name is not None else f"replay of {source}" if source else "replay"
    _check_utf8("--name", name)
    parts = Path(name).parts
    if not name.strip() or Path(name).is_absolute() or any(p in ("..", ".") for p in parts):
        raise _usage(f"Expected --name to be a run name such as 'replay' (a relative path without '.' or '..'), got {name!r}.")
    run = logdir / name
    if os.path.exists(run) and not os.path.isdir(run):  # False past PATH_MAX: checked by _check_folder below
        raise _usage(f"--logdir/--name: {str(run)!r} is a file, where the TensorBoard run folder goes: pass another "
                     "--name or --logdir.")
    _check_folder("--logdir/--name", str(run))  # the names' lengths; writable where it exists
    real_logdir, real_run = os.path.realpath(logdir), os.path.realpath(run)
    if os.path.commonpath([real_logdir, real_run]) != real_logdir:  # checked where it resolves, as it is written
        raise _usage(f"Expected --name {name!r} to stay under --logdir, got {str(run)!r}, which resolves to {real_run!r} "
                     "(a symlink out of it): pass another --name.")
    out = Outputs(logdir=logdir, name=name if source is None else "replay", source=source)

    def beside(path: Path, what: str, option: str, resolve: bool = True) -> Path:
        if path.is_dir():
            raise _usage(f"{option} {getattr(args, option[2:])!r}: {str(path)!r} is a folder, where {what} goes: move it "
                         f"away or pass another {option}.")
        checked = check_output(path, f"{option}'s {what}")
        return _resolved(checked) if resolve else checked

    for option in ("--json", "--report"):
        if getattr(args, option[2:]) is not None:
            _check_utf8(option, getattr(args, option[2:]))
    try:
        if args.json is not None:
            out.json = _resolved(check_output(args.json, "--json", (".json", ".jsonl")))
            # satmon's own file: its name is replaced, never resolved (a symlink there points at a file of the user's)
            out.partial = beside(out.json.with_name(out.json.name + ".partial.jsonl"), "the file of partial records",
                                 "--json", resolve=False)
        if args.report is not None:
            out.report = _resolved(check_output(args.report, "--report", (".md",)))
            out.plots = [beside(p, f"its {n} plot", "--report") for p, n in zip(report_paths(out.report)[1:], PLOTS)]
    except OutputError as e:
        raise _usage(str(e)) from None
    for target in (out.json, out.report, *out.plots):
        if target is not None and target.exists():
            out.existed.add(target)
    data = os.path.realpath(args.data) if args.data is not None else None
    for option, target in (("--json", out.json), ("--json", out.partial), ("--report", out.report),
                           *(("--report", plot) for plot in out.plots)):
        if target is not None and data is not None and os.path.realpath(target) == data:
            raise _usage(f"Expected {option} to write another file than --data {args.data!r}, got the same file: it would "
                         "be replaced by the replay's outputs. Pass another name.")
    if args.report:
        from satmon.io.markdown import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as e:
            raise _usage(f"--report: {e}") from e
    return out


def _check_inputs(args: argparse.Namespace) -> Any:
    """Calibration data and model options present, the --data file there; returns the torch device."""
    if args.data is None and args.datamodule is None:
        raise _usage("No calibration data: pass --data FILE (a torch.save'd tensor, list of batches or dict "
                     "of tensors) or --datamodule MODULE:CLASS (e.g. satmon.demos.corpus:CorpusDataModule).")
    if args.model is None and args.factory is None:
        raise _usage("Pass --model MODULE:CLASS (a LightningModule, for .ckpt files) or --factory "
                     "MODULE:FUNCTION (returns the nn.Module, for plain state_dict files).")
    if args.weights_only and args.trust_checkpoints:
        raise _usage("Expected either --weights-only (read checkpoints with torch.load(weights_only=True): the default) or "
                     "--trust-checkpoints (weights_only=False: runs code stored in them), got both: drop one.")
    from satmon.paths import kind_of

    if args.live is not None and kind_of(args.live).kind not in ("folder", "file"):  # a FIFO, a name too long...
        raise _usage(f"--live {args.live[:240]!r}: {kind_of(args.live).describe()}. Pass the live run's TensorBoard folder (e.g. "
                     "satmon_logs/demo/version_0), or leave --live out.")
    if args.data is not None:  # by its kind, never opened (satmon.paths)
        from satmon.replay.data import check_data_file

        check_data_file(args.data)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise _usage("--device cuda: no CUDA device is available here; pass --device cpu (or auto).")
    return torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                        "cpu" if args.device == "auto" else args.device)


def _user_objects(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """``(model_cls, factory, datamodule_cls)`` imported from what the user named, each checked (a
    LightningModule is recognised by its bases: Lightning is not imported here)."""
    from satmon.replay.loop import is_lightning_module
    from satmon.replay.user_code import import_object

    model_cls = import_object(args.model, "--model", "satmon.demos.lit:LitLM") if args.model else None
    if model_cls is not None and not is_lightning_module(model_cls):
        raise _usage(f"--model {args.model}: expected a LightningModule class, got {_named(model_cls)}. For a "
                     "plain nn.Module pass --factory MODULE:FUNCTION returning it.")
    factory = import_object(args.factory, "--factory", "mypkg.model:build") if args.factory else None
    if factory is not None and not callable(factory):
        raise _usage(f"--factory {args.factory}: expected a callable returning an nn.Module, got {_named(factory)}.")
    dm_cls = None
    if args.datamodule:
        dm_cls = import_object(args.datamodule, "--datamodule", "satmon.demos.corpus:CorpusDataModule")
        if not (isinstance(dm_cls, type) and hasattr(dm_cls, "train_dataloader")):
            raise _usage(f"--datamodule {args.datamodule}: expected a LightningDataModule class with "
                         f"train_dataloader(), got {_named(dm_cls)}.")
    return model_cls, factory, dm_cls


def _named(obj: Any) -> str:
    from satmon.replay.user_code import short

    name = getattr(obj, "__qualname__", None)
    return f"{type(obj).__name__} {name}" if isinstance(name, str) else short(obj, 80)


def _check_model(args: argparse.Namespace, loader: Any, ordered: list[Any]) -> None:
    """The model on the first buildable checkpoint, built on the meta device: a wrong --model/--factory stops here
    (unless a later checkpoint fits, which then replays while the others are skipped)."""
    checks = [loader.check(i) for i in ordered]
    if ordered and all(checks):
        raise _usage(f"Cannot build any checkpoint: {checks[0]}.")
    buildable = [i for i, c in zip(ordered, checks) if c is None]
    if not buildable:
        return
    problem = loader.mismatch(buildable[0])
    if problem and all(loader.mismatch(i) for i in buildable[1:]):
        option = f"--model {args.model}" if args.model and buildable[0].kind == "lightning" else f"--factory {args.factory}"
        more = f" (nor any of the other {len(buildable) - 1})" if len(buildable) > 1 else ""
        raise _usage(f"{option} does not build the checkpoints' model: {buildable[0].path.name}{more}: {problem}")


# ------------------------------------------------------------------------------------ output
def _progress(total: int, quiet: bool):
    """``(update(row), close())``: a bar with an ETA on a terminal, one plain line a checkpoint (with the ETA) otherwise."""
    if quiet:
        return (lambda row: None), (lambda: None)
    from satmon.cli.progress import Progress

    progress = Progress(total, label="satmon replay:", unit="ckpt", every_item=True)
    done = [0]

    def update(row: dict[str, Any]) -> None:
        done[0] += 1
        reason = str(row["error"] or "")
        what = f"skipped: {reason if len(reason) <= 100 else reason[:97] + '...'}" if row["error"] else (
            f"saturation {row['saturation']:.4f} {row['decision']}" if row["saturation"] is not None else f"norm type {row['norm_type']}")
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
    return f"replaying the checkpoints in {paths} with {code}, calibration from {data}; loading torch and checking the arguments"


def _summary(rows: list[dict[str, Any]], records: list[Any]) -> None:
    from satmon.io.markdown import table

    print()
    print(table(["step", "checkpoint", "saturation", "verdict", "non-finite", "norm type", "min sigma ratio",
                 "min alignment", "s"],
                [[r["step"], r["name"], r["saturation"], r["decision"], r["nonfinite"], r["norm_type"], r["min_ratio"],
                  r["min_alignment"], None if r["seconds"] is None else f"{r['seconds']:.2f}"] for r in rows if r["error"] is None]))
    last = next((r for r in reversed(records) if r.verdict is not None), None)
    if last is not None:
        v = last.verdict
        said = v.headline() if v.cautions else v.decision.upper()  # a qualified decision says how far to trust it
        print(f"\nLast checkpoint (step {last.global_step}): {said}  pooled saturation "
              f"{v.saturation:.4f} {'>=' if v.saturation >= v.threshold else '<'} threshold {v.threshold:g} "
              f"(margin {v.margin:+.4f})")
    live = _live_lines(records)
    if live:
        print("\n" + "\n".join(live))


def _nearest(records: list[Any], step: int) -> Any:
    """The replayed record whose step is nearest ``step`` (the later one on a tie)."""
    scored = [r for r in records if r.verdict is not None]
    return min(scored, key=lambda r: (abs((r.global_step or 0) - step), -(r.global_step or 0))) if scored else None


def _source_of(records: list[Any]) -> Any:
    """The source run the records name (:class:`~satmon.results.live_replay.ReplaySource`), or ``None``."""
    return next((s for s in (getattr(r, "source", None) for r in records) if s is not None), None)


def _compared(records: list[Any]) -> list[Any]:
    """The records shown beside the live verdict: the one nearest its step, and the last."""
    source = _source_of(records)
    if source is None or source.live is None:
        return []
    near = _nearest(records, source.live.step)
    last = next((r for r in reversed(records) if r.verdict is not None), None)
    return [r for r in dict.fromkeys((near, last)) if r is not None]


def _live_lines(records: list[Any], markdown: bool = False) -> list[str]:
    """The run these checkpoints come from, its live verdict beside the replay's (the checkpoint nearest the
    verdict's step, and the last), and why they can differ."""
    from satmon.io.markdown import table
    from satmon.results.live_replay import WHY, agreement, comparison_rows

    source = _source_of(records)
    if source is None:
        return []
    head = source.headline()
    lines = [head if markdown else head.replace("`", "")]
    shown = _compared(records)
    if source.live is None or not shown:
        return lines
    rows = comparison_rows(source.live, [(r.verdict, Path(r.checkpoint).name, r.global_step) for r in shown])
    lines += ["", table(["reading", "decision", "pooled saturation", "what was read"], rows), ""]
    lines.append(f"{agreement(source.live, [r.verdict for r in shown])} Why they can differ: {WHY}")
    return lines


def _nonfinite_lines(rows: list[dict[str, Any]]) -> list[str]:
    bad = [r for r in rows if r["nonfinite"]]
    if not bad:
        return []
    return [f"Non-finite values (NaN/inf) in {len(bad)} replayed checkpoint(s): "
            + "; ".join(f"step {r['step']} {r['name']}: {r['nonfinite']}" for r in bad)
            + ". The run diverged there: the saturation rule does not apply (exit code 3)."]


def _calibration(args: argparse.Namespace, ordered: list[Any], dm_cls: Any, batches: list[Any] | None) -> tuple[list[Any], str]:
    """The calibration batches (the --data file's, or the datamodule's built with the checkpoint's
    hyper-parameters), and where they came from in words."""
    from satmon.replay.data import datamodule_batches
    from satmon.replay.user_code import short

    if batches is not None:
        return batches, f"{len(batches)} batch(es) from {args.data}"
    hp = next((i.datamodule_hparams for i in ordered if i.datamodule_hparams), {})
    batches = datamodule_batches(dm_cls, hp, args.batches)
    return batches, f"{len(batches)} batch(es) of {dm_cls.__name__}.train_dataloader()" + (
        f" with the checkpoint's hyper-parameters {short(hp)}" if hp else " with its default arguments")


class _TensorBoard:
    """The TensorBoard run, made at the first record (a refused or interrupted-before-work replay leaves none,
    and so does a replay where no checkpoint could be read: ``enabled=False``)."""

    def __init__(self, logdir: Path, name: str, enabled: bool = True, source: str | None = None) -> None:
        self.logdir, self.name, self.writer, self.enabled, self.source = logdir, name, None, enabled, source

    def __call__(self, record: Any) -> None:
        if not self.enabled:
            return
        if self.writer is None:
            from satmon.io.tensorboard_replay import TensorBoardReplay

            self.writer = TensorBoardReplay(self.logdir, name=self.name, source=self.source)
        self.writer(record)

    @property
    def log_dir(self) -> Path | None:
        return None if self.writer is None else Path(self.writer.log_dir).resolve()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _Partial:
    """The records as they come, one JSON line each, flushed to disk: what an interrupted (even killed) replay
    keeps. It gets the permissions of the file it stands for (a private --json stays private)."""

    def __init__(self, path: Path, like: Path) -> None:
        self.path, self.count, self.size = path, 0, 0
        self.replaced = os.path.lexists(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.replaced:  # the name is replaced, never written through: a symlink's target, a hard link's other names
            os.unlink(path)  # are left as they are
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        if like.exists():
            os.chmod(path, stat.S_IMODE(os.stat(like).st_mode))

    def add(self, record: dict[str, Any]) -> None:
        """Append one record, on disk before it counts; a write that fails (a full disk) is cut back off, so the
        file always ends on a complete record."""
        data = (json.dumps(record, allow_nan=False) + "\n").encode("utf-8")
        try:
            done = 0
            while done < len(data):
                done += os.write(self.fd, data[done:])
            os.fsync(self.fd)
        except BaseException:
            try:
                os.ftruncate(self.fd, self.size)  # freeing space always works
                os.lseek(self.fd, self.size, os.SEEK_SET)
            except OSError:
                pass
            raise
        self.size += len(data)
        self.count += 1

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class _State:
    """Where an interrupted replay stands, for its one-line summary."""

    outputs: Outputs | None = None
    total: int = 0
    done: int = 0
    started: bool = False
    partial: _Partial | None = None
    tensorboard: _TensorBoard | None = None
    json_written: bool = False

    def interrupted(self, how: str) -> str:
        if not self.started:
            return f"satmon replay: {how} before the first checkpoint was replayed; nothing was written."
        said = [f"satmon replay: {how} after {self.done} of {self.total} checkpoint(s)"]
        out = self.outputs
        if out is not None and out.json is not None and not self.json_written:
            kept = "was left as it was" if out.json in out.existed else "was not written"
            where = (f"the {self.partial.count} new record(s) are in {self.partial.path}" if self.partial is not None
                     and self.partial.count else "no record was complete")
            said.append(f"{out.json} {kept}; {where}")
        if self.tensorboard is not None and self.tensorboard.log_dir is not None:
            said.append(f"TensorBoard run {self.tensorboard.log_dir} holds the checkpoints replayed so far")
        if out is not None and out.report is not None:
            said.append(f"no report was written ({out.report} {'left as it was' if out.report in out.existed else 'not made'})")
        return ": ".join(said[:1]) + (": " + "; ".join(said[1:]) if len(said) > 1 else "") + "."


def _loop(args: argparse.Namespace, state: _State, infos: list[Any], loader: Any, batches: list[Any], settings: Any,
          probe_kwargs: dict[str, Any], tensorboard: bool = True, source: Any = None):
    """Replay every checkpoint, with progress, stderr notes, TensorBoard and the partial JSON records as they
    come; returns the records, their JSON dicts and their summary rows."""
    from satmon.io.json_records import to_json
    from satmon.replay.loop import replay, summary_row

    out = state.outputs
    state.tensorboard = _TensorBoard(out.logdir, out.name, enabled=tensorboard, source=out.source)
    if out.partial is not None:
        state.partial = _Partial(out.partial, out.json)
        if state.partial.replaced:
            print(f"satmon replay: note: {out.partial} (the records of an earlier interrupted replay) is replaced by "
                  "this run's.", file=sys.stderr)
    records, dicts, rows = [], [], []
    state.total, state.started = len(infos), True
    update, close = _progress(len(infos), args.quiet)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*LeafSpec.*")
            for record in replay(infos, loader, batches, settings=settings, probe_kwargs=probe_kwargs,
                                 twin=not args.no_twin, on_record=state.tensorboard, source=source):
                records.append(record)
                dicts.append(to_json(record.to_dict()))  # NaN/inf -> None, as written to --json
                if state.partial is not None:
                    state.partial.add(dicts[-1])
                state.done += 1
                for note in record.notes:
                    print(f"satmon replay: note: {record.checkpoint}: {note}", file=sys.stderr)
                if record.error:
                    print(f"satmon replay: skipped {record.checkpoint}: {record.error}", file=sys.stderr)
                rows.append(summary_row(dicts[-1]))
                update(rows[-1])
    finally:
        close()
        state.tensorboard.close()
        if state.partial is not None:
            state.partial.close()
    return records, dicts, rows


def _replaced(out: Outputs, path: Path) -> str:
    return " (replaced the previous file; its permissions kept)" if path in out.existed else ""


def run(args: argparse.Namespace, state: _State | None = None) -> int:
    """Check everything the user passed, then read the checkpoints, replay them and report; the exit code."""
    state = _State() if state is None else state
    talk = _talk(args)
    talk(_first_line(args))  # before torch is imported: the user sees at once what runs
    settings = _check_numbers(args)
    state.outputs = out = _check_outputs(args)
    device = _check_inputs(args)
    import torch

    from satmon.replay import checkpoints as ck
    from satmon.replay.data import input_forward_fn, load_data_file
    from satmon.replay.loop import ModelLoader
    from satmon.replay.user_code import printable

    model_cls, factory, dm_cls = _user_objects(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.weights_only:
        print("satmon replay: note: --weights-only is the default since satmon 0.2 (the flag is ignored).", file=sys.stderr)
    listing = ck.list_checkpoints(args.paths, exclude=[p for p in (args.data, out.partial) if p])  # stat only
    if not listing.paths:
        raise _usage(ck.nothing_to_replay(args.paths, listing))
    unread = listing.unread()
    for path, why in listing.explicit + unread + listing.broken_links():
        print(f"satmon replay: note: not replayed: {printable(str(path))}: {why}.", file=sys.stderr)
    batches = load_data_file(args.data, args.batches, args.batch_size) if args.data is not None else None
    if args.trust_checkpoints:
        print("satmon replay: --trust-checkpoints: checkpoints are read with torch.load(weights_only=False), which runs "
              "code stored in them.", file=sys.stderr)
    # the first checkpoint read: everything the user passed has been checked above
    talk(f"found {len(listing.paths)} checkpoint(s); reading their index ("
         + ("torch.load(weights_only=False): --trust-checkpoints" if args.trust_checkpoints else "weights only: no code in "
            "them runs") + ")")
    infos = [ck.inspect_checkpoint(p, trust=args.trust_checkpoints, stamps=listing.stamps[p]) for p in listing.paths]
    ordered = ck.order_checkpoints(infos)
    loader = ModelLoader(model_cls, factory, device=device)
    _check_model(args, loader, ordered)
    source = _source(args, ordered)
    talk(_source_line(source))
    data_text, probe_kwargs = "none (no readable checkpoint)", {}
    if ordered:
        talk("building the calibration batches" + (f" from {args.datamodule}" if args.datamodule else ""))
        batches, data_text = _calibration(args, ordered, dm_cls, batches)
        probe_kwargs = dict(
            forward_fn=input_forward_fn(batches, args.input_key), device=device,
            autocast_dtype=torch.bfloat16 if args.dtype == "bfloat16" else None,
        )
    todo = ordered + [i for i in infos if i.error is not None]
    talk(f"replaying {len(todo)} checkpoint(s) on {device.type} (calibration: {data_text}); the first one also builds "
         "the model and finds its layers")
    t0 = time.perf_counter()
    records, dicts, rows = _loop(args, state, todo, loader, batches or [], settings, probe_kwargs,
                                 tensorboard=bool(ordered), source=source)
    took = time.perf_counter() - t0

    ok = [r for r in rows if r["error"] is None]
    _summary(rows, records)
    nonfinite = _nonfinite_lines(rows)
    print(f"\nReplayed {len(ok)} of {len(rows)} checkpoint(s) in {took:.1f} s on {device.type} ({args.dtype}); calibration: {data_text}.")
    log_dir = state.tensorboard.log_dir
    if log_dir is not None:
        print(f"TensorBoard run: {log_dir}   (satmon report {log_dir})")
    else:
        print("TensorBoard run: none (no checkpoint could be read)")
    if out.json is not None:
        from satmon.io.json_records import write_records

        write_records(out.json, dicts)  # complete: replaces the previous file in one rename
        state.json_written = True
        state.partial.remove()
        print(f"JSON records:    {out.json.resolve()}{_replaced(out, out.json)}")
    unverified = _unverified(ordered)
    if unverified:
        print(f"satmon replay: note: {unverified}", file=sys.stderr)
    if out.report is not None:
        _report(args, out, records, dicts, rows, device, data_text, log_dir, nonfinite + ([unverified] if unverified else []))
    return _exit_code(rows, records, infos, nonfinite, unread)


def _unverified(ordered: list[Any]) -> str:
    """What could not be checked for damage: checkpoints in formats that record no checksum (``""``: none)."""
    names = [i.path.name for i in ordered if any(w.layout not in ("zip", "dcp") for w in i.weights)]  # DCP: zip chunks
    if not names:
        return ""
    from satmon.replay.user_code import printable

    shown = ", ".join(printable(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{len(names)} checkpoint(s) record no checksum ({shown}: .safetensors, or torch files older than its zip "
            "format): damaged bytes in them cannot be detected, only a damaged structure.")


def _source(args: argparse.Namespace, ordered: list[Any]) -> Any:
    """The run the checkpoints come from and its live verdict (:func:`satmon.replay.live.find_source`)."""
    from satmon.replay.live import find_source

    return find_source([Path(p) for p in args.paths], ordered, live=args.live)


def _source_line(source: Any) -> str:
    """The status line naming the source run and what its live window said."""
    live = source.live
    if live is None:
        return f"replay of {source.run}: its live verdict was not found ({source.missing})"
    from satmon.results.live_replay import decision_text

    return (f"replay of {source.run}: its live window said {decision_text(live.decision, live.trust)} at step {live.step} "
            f"(pooled saturation {live.saturation:.4f}; read from {live.found.replace('`', '')})")


def _report(args, out: Outputs, records, dicts, rows, device, data_text: str, log_dir: Path, nonfinite: list[str]) -> None:
    from satmon.io.markdown import write_report
    from satmon.results.card import cut_off

    ok = [r for r in rows if r["error"] is None]
    last = next((r for r in reversed(records) if r.verdict is not None), None)
    counted = cut_off(last.verdict) if last is not None else f"|alpha x| > {args.level:g}"  # erf/hardtanh: their own
    intro = [
        f"Model `{args.model or args.factory}`; {len(ok)} of {len(rows)} checkpoint(s) replayed on {device.type} "
        f"({args.dtype} forward, float64 statistics); calibration: {data_text}.",
        f"GO threshold {args.threshold:g} on pooled saturation ({counted}); TensorBoard run `{log_dir}`.",
    ] + [f"\n**{line}**" for line in nonfinite]
    live = _live_lines(records, markdown=True)
    if live:
        intro += ["", *live]
    written = write_report(out.report, dicts, rows, threshold=args.threshold, intro=intro,
                           last_card=None if last is None else last.card())
    replaced = [p for p in written if p in out.existed]
    note = f"; replaced {len(replaced)} previous file(s), their permissions kept" if replaced else ""
    print(f"Report:          {written[0].resolve()} (+ {len(written) - 1} PNG{note})")


def _exit_code(rows: list[dict[str, Any]], records: list[Any], infos: list[Any], nonfinite: list[str],
               unread: list[tuple[Path, str]]) -> int:
    """The exit code; an incomplete replay (a checkpoint skipped, a file or folder that could not be read) says so in
    its last line, whatever else it found."""
    from satmon.replay.user_code import printable

    code = EXIT_OK
    skipped = [r["name"] for r in rows if r["error"]]
    if skipped:
        print(f"satmon replay: {len(skipped)} checkpoint(s) skipped: " + ", ".join(skipped), file=sys.stderr)
        refused = [printable(i.path.name) for i in infos if i.refused and not i.unsafe]
        if refused:
            print(f"satmon replay: {len(refused)} of them refused by torch.load(weights_only=True) for a type torch does "
                  f"not allow by default: {', '.join(refused)}; --trust-checkpoints would load them, and run code stored "
                  "in them: only for files you made or trust.", file=sys.stderr)
    for line in nonfinite:
        print(f"satmon replay: {line}", file=sys.stderr)
    if skipped or unread:
        code = EXIT_SKIPPED
        said = [f"{len(rows) - len(skipped)} of {len(rows)} checkpoint(s) replayed"]
        if skipped:
            said.append(f"{len(skipped)} skipped")
        if unread:
            shown = "; ".join(f"{printable(str(p))} ({why})" for p, why in unread[:3]) + ("; ..." if len(unread) > 3 else "")
            said.append(f"{len(unread)} file(s) or folder(s) that may hold checkpoints could not be read: {shown}")
        print("satmon replay: incomplete: " + "; ".join(said) + ".", file=sys.stderr)
    return EXIT_NONFINITE if any(r.nonfinite for r in records) else code


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
    from satmon.replay.user_code import ReplayUsageError

    state = _State()
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
        print("\n" + state.interrupted("terminated (SIGTERM)" if terminated else "interrupted (Ctrl-C)"), file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except OSError as e:  # an output that cannot be written mid-run (a full disk...): what was there stays
        from satmon.replay.user_code import error_line

        print(state.interrupted(f"stopped by {error_line(e)}"), file=sys.stderr)
        return EXIT_SKIPPED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
