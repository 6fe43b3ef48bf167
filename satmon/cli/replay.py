"""``satmon replay``: every satmon diagnostic over saved checkpoints, written as a TensorBoard run
that lines up with live runs (same tags, stepped by each checkpoint's global step), plus optional
JSON records and a markdown report with plots.

Every argument is checked before any checkpoint is read. Security (checkpoints read with
weights_only=True unless --trust-checkpoints; --model/--factory/--datamodule run user code) and the
exit codes (0 ok, 1 skipped, 2 usage, 3 non-finite) are in :data:`EPILOG` and docs/replay.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["EXIT_OK", "EXIT_SKIPPED", "EXIT_USAGE", "EXIT_NONFINITE", "main"]

EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, EXIT_NONFINITE = 0, 1, 2, 3

EPILOG = """\
examples:
  satmon replay lightning_logs/version_0/checkpoints --model satmon.demos.lit:LitLM \\
      --datamodule satmon.demos.corpus:CorpusDataModule --logdir satmon_logs --report replay.md
  satmon replay ckpts/ --model mypkg.model:MyLit --data calib.pt --batches 8 --json replay.json
  satmon replay weights/*.safetensors --factory ./build_model.py:build --data calib.pt

user code: --model, --factory and --datamodule IMPORT AND RUN the code they name: MODULE:ATTR is
imported from sys.path (an installed package, or PYTHONPATH; the working directory is not searched),
path/to/file.py:ATTR runs that file. Name only code you trust.

checkpoints: read with torch.load(weights_only=True): no code stored in a file runs. A file that
needs more (custom classes in its pickle) is skipped, named with the type torch refused.
--trust-checkpoints loads such files with weights_only=False, which RUNS CODE STORED IN THEM: only
for files you made or trust.

batches: a tuple/list (x, y) whose y is an integer tensor of x's shape is read as (inputs, targets)
and only x is fed; otherwise a tensor is fed as model(t), a tuple as model(*b), a dict as model(**b).
--input-key K feeds batch[K] only (an index for tuples, a key for dicts).

exit codes: 0 all replayed, 1 a checkpoint was skipped, 2 usage error (nothing read),
3 non-finite values (NaN/inf weights or DyT inputs) in a replayed checkpoint.
"""

_USER_CODE = "imports and runs that code; MODULE:ATTR from sys.path (not the working directory) or path/to/file.py:ATTR"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="satmon replay", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="CHECKPOINT_OR_DIR",
                   help="checkpoint files, or directories (searched recursively for .ckpt/.pt/.pth/.safetensors)")
    p.add_argument("--model", metavar="MODULE:CLASS", help="the LightningModule class: .ckpt files are rebuilt from "
                   f"their hyper-parameters and weights, the random-init twin with CLASS(**hyper_parameters) ({_USER_CODE})")
    p.add_argument("--factory", metavar="MODULE:FUNCTION", help="a function returning the nn.Module, for plain state_dict "
                   f"files (.pt/.pth/.safetensors) ({_USER_CODE})")
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
    p.add_argument("--name", default="replay", help="TensorBoard run name (default replay)")
    p.add_argument("--json", metavar="FILE", help="records, one per checkpoint (.jsonl: one a line; else a JSON array)")
    p.add_argument("--report", metavar="FILE.md", help="a markdown report with PNG plots saved beside it (needs matplotlib)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="forward precision (bfloat16: autocast); statistics stay float64")
    p.add_argument("--threshold", type=float, default=0.43, help="GO threshold on pooled saturation (study: 0.43)")
    p.add_argument("--level", type=float, default=2.0, help="saturation level: |alpha x| > LEVEL (default 2.0)")
    p.add_argument("--collapse-threshold", type=float, default=0.5, help="collapse-risk level for gated models (default 0.5)")
    p.add_argument("--no-twin", action="store_true", help="skip the random-init twin (no init-to-trained readout; faster)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's own choice); "
                   "1 is often fastest for small models on a busy machine")
    p.add_argument("--quiet", action="store_true", help="no progress output (the summary is still printed)")
    return p


# ------------------------------------------------------------------------------------ validation
def _writable(option: str, value: str, folder: bool) -> None:
    """Raise a usage error unless ``value`` (a folder, or a file) can be created or replaced."""
    from satmon.replay.user_code import ReplayUsageError

    path = Path(value)
    if path.exists() and path.is_dir() != folder:
        raise ReplayUsageError(f"{option} {value!r}: expected a {'folder' if folder else 'file'}, got a "
                               f"{'folder' if path.is_dir() else 'file'}. Pass a {'folder' if folder else 'file'} path.")
    parent = path if folder and path.exists() else path.parent  # files are replaced atomically: their folder is written
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ReplayUsageError(f"{option} {value!r}: cannot write there: {str(parent)!r} is a file, not a folder. "
                               "Pass a path in a writable folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ReplayUsageError(f"{option} {value!r}: cannot write there: no write permission on {str(parent)!r}. "
                               "Pass a path in a writable folder.")


def _validate(args: argparse.Namespace) -> Any:
    """Check every argument before any file is read; returns the torch device."""
    from satmon.replay.user_code import ReplayUsageError

    for option, value in (("--batches", args.batches), ("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ReplayUsageError(f"Expected {option} >= 1, got {value}.")
    if args.data is None and args.datamodule is None:
        raise ReplayUsageError("No calibration data: pass --data FILE (a torch.save'd tensor, list of batches or dict "
                               "of tensors) or --datamodule MODULE:CLASS (e.g. satmon.demos.corpus:CorpusDataModule).")
    if args.model is None and args.factory is None:
        raise ReplayUsageError("Pass --model MODULE:CLASS (a LightningModule, for .ckpt files) or --factory "
                               "MODULE:FUNCTION (returns the nn.Module, for plain state_dict files).")
    if args.data is not None and not Path(args.data).is_file():
        raise ReplayUsageError(f"--data {args.data!r}: no such file. Pass --data FILE (a torch.save'd tensor, list of "
                               "batches or dict of tensors) or --datamodule MODULE:CLASS.")
    _writable("--logdir", args.logdir, folder=True)
    for option, value in (("--json", args.json), ("--report", args.report)):
        if value is not None:
            _writable(option, value, folder=False)
    if args.report:
        from satmon.io.markdown import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as e:
            raise ReplayUsageError(f"--report: {e}") from e
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ReplayUsageError("--device cuda: no CUDA device is available here; pass --device cpu (or auto).")
    return torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                        "cpu" if args.device == "auto" else args.device)


def _user_objects(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """``(model_cls, factory, datamodule_cls)`` imported from what the user named, each checked."""
    from lightning.pytorch import LightningModule

    from satmon.replay.user_code import ReplayUsageError, import_object

    model_cls = import_object(args.model, "--model", "satmon.demos.lit:LitLM") if args.model else None
    if model_cls is not None and not (isinstance(model_cls, type) and issubclass(model_cls, LightningModule)):
        raise ReplayUsageError(f"--model {args.model}: expected a LightningModule class, got {model_cls!r}. For a "
                               "plain nn.Module pass --factory MODULE:FUNCTION returning it.")
    factory = import_object(args.factory, "--factory", "mypkg.model:build") if args.factory else None
    if factory is not None and not callable(factory):
        raise ReplayUsageError(f"--factory {args.factory}: expected a callable returning an nn.Module, got {factory!r}.")
    dm_cls = None
    if args.datamodule:
        dm_cls = import_object(args.datamodule, "--datamodule", "satmon.demos.corpus:CorpusDataModule")
        if not (isinstance(dm_cls, type) and hasattr(dm_cls, "train_dataloader")):
            raise ReplayUsageError(f"--datamodule {args.datamodule}: expected a LightningDataModule class with "
                                   f"train_dataloader(), got {dm_cls!r}.")
    return model_cls, factory, dm_cls


# ------------------------------------------------------------------------------------ output
def _progress(total: int, quiet: bool):
    """``(update(row), close())``: a tqdm bar on a terminal, one plain line a checkpoint otherwise."""
    if quiet:
        return (lambda row: None), (lambda: None)
    if sys.stdout.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="ckpt", desc="satmon replay", dynamic_ncols=True)

        def update(row: dict[str, Any]) -> None:
            bar.set_postfix_str(f"step {row['step']} " + ("FAILED" if row["error"] else f"sat {row['saturation'] or 0:.3f}"))
            bar.update()

        return update, bar.close
    done = [0]

    def line(row: dict[str, Any]) -> None:
        done[0] += 1
        what = f"skipped: {row['error']}" if row["error"] else (
            f"saturation {row['saturation']:.4f} {row['decision']}" if row["saturation"] is not None else f"norm type {row['norm_type']}")
        what += f" [non-finite: {row['nonfinite']}]" if row["nonfinite"] else ""
        secs = f" ({row['seconds']:.1f} s)" if row["seconds"] is not None else ""
        step = "" if row["step"] is None else f" step {row['step']}"
        print(f"[{done[0]}/{total}]{step} {row['name']}: {what}{secs}", flush=True)

    return line, (lambda: None)


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
        print(f"\nLast checkpoint (step {last.global_step}): {v.decision.upper()}  pooled saturation "
              f"{v.saturation:.4f} {'>=' if v.saturation >= v.threshold else '<'} threshold {v.threshold:g} "
              f"(margin {v.margin:+.4f})")


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

    if batches is not None:
        return batches, f"{len(batches)} batch(es) from {args.data}"
    hp = next((i.datamodule_hparams for i in ordered if i.datamodule_hparams), {})
    batches = datamodule_batches(dm_cls, hp, args.batches)
    return batches, f"{len(batches)} batch(es) of {dm_cls.__name__}.train_dataloader()" + (
        f" with the checkpoint's hyper-parameters {hp}" if hp else " with its default arguments")


def _loop(args: argparse.Namespace, infos: list[Any], loader: Any, batches: list[Any], probe_kwargs: dict[str, Any]):
    """Replay every checkpoint, with progress, stderr notes, TensorBoard and the JSON file after each one;
    returns the records, their JSON dicts, their summary rows and the TensorBoard run folder."""
    from satmon.replay.loop import replay, summary_row
    from satmon.io.json_records import to_json, write_records
    from satmon.io.tensorboard_replay import TensorBoardReplay

    tb = TensorBoardReplay(args.logdir, name=args.name)
    records, dicts, rows = [], [], []
    update, close = _progress(len(infos), args.quiet)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        for record in replay(infos, loader, batches, probe_kwargs=probe_kwargs, twin=not args.no_twin, on_record=tb):
            records.append(record)
            dicts.append(to_json(record.to_dict()))  # NaN/inf -> None, as written to --json
            for note in record.notes:
                print(f"satmon replay: note: {record.checkpoint}: {note}", file=sys.stderr)
            if record.error:
                print(f"satmon replay: skipped {record.checkpoint}: {record.error}", file=sys.stderr)
            rows.append(summary_row(dicts[-1]))
            update(rows[-1])
            if args.json:  # rewritten after each checkpoint: an interrupted replay keeps its records
                write_records(args.json, dicts)
    close()
    tb.close()
    return records, dicts, rows, tb.log_dir


def run(args: argparse.Namespace) -> int:
    """Validate everything the user passed, then read the checkpoints, replay them and report; the exit code."""
    import torch

    from satmon.replay import checkpoints as ck
    from satmon.replay.data import input_forward_fn, load_data_file
    from satmon.replay.loop import ModelLoader
    from satmon.replay.user_code import ReplayUsageError

    device = _validate(args)
    model_cls, factory, dm_cls = _user_objects(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.weights_only:
        print("satmon replay: note: --weights-only is the default since satmon 0.2 (the flag is ignored).", file=sys.stderr)
    if args.trust_checkpoints:
        print("satmon replay: --trust-checkpoints: checkpoints are read with torch.load(weights_only=False), which runs "
              "code stored in them.", file=sys.stderr)
    files = ck.find_checkpoints(args.paths, exclude=[args.data] if args.data else [])  # lists, opens nothing
    batches = load_data_file(args.data, args.batches, args.batch_size) if args.data is not None else None
    # the first checkpoint read: everything the user passed has been checked above
    infos = [ck.inspect_checkpoint(f, trust=args.trust_checkpoints) for f in files]
    ordered = ck.order_checkpoints(infos)
    loader = ModelLoader(model_cls, factory, device=device)
    unbuildable = [loader.check(i) for i in ordered]
    if ordered and all(unbuildable):
        raise ReplayUsageError(f"Cannot build any checkpoint: {unbuildable[0]}.")
    batches, data_text = _calibration(args, ordered, dm_cls, batches)
    probe_kwargs = dict(
        forward_fn=input_forward_fn(batches, args.input_key), device=device, threshold=args.threshold,
        level=args.level, collapse_threshold=args.collapse_threshold,
        autocast_dtype=torch.bfloat16 if args.dtype == "bfloat16" else None,
    )
    t0 = time.perf_counter()
    records, dicts, rows, log_dir = _loop(args, ordered + [i for i in infos if i.error is not None], loader, batches, probe_kwargs)
    took = time.perf_counter() - t0

    ok = [r for r in rows if r["error"] is None]
    _summary(rows, records)
    nonfinite = _nonfinite_lines(rows)
    print(f"\nReplayed {len(ok)} of {len(rows)} checkpoint(s) in {took:.1f} s on {device.type} ({args.dtype}); calibration: {data_text}.")
    print(f"TensorBoard run: {Path(log_dir).resolve()}   (satmon report {Path(log_dir).resolve()})")
    if args.json:
        print(f"JSON records:    {Path(args.json).resolve()}")
    if args.report:
        _report(args, records, dicts, rows, device, data_text, log_dir, nonfinite)
    return _exit_code(rows, records, infos, nonfinite)


def _report(args, records, dicts, rows, device, data_text: str, log_dir: str, nonfinite: list[str]) -> None:
    from satmon.io.markdown import write_report

    ok = [r for r in rows if r["error"] is None]
    intro = [
        f"Model `{args.model or args.factory}`; {len(ok)} of {len(rows)} checkpoint(s) replayed on {device.type} "
        f"({args.dtype} forward, float64 statistics); calibration: {data_text}.",
        f"GO threshold {args.threshold:g} on pooled saturation (|alpha x| > {args.level:g}); TensorBoard run "
        f"`{Path(log_dir).resolve()}`.",
    ] + [f"\n**{line}**" for line in nonfinite]
    last = next((r for r in reversed(records) if r.verdict is not None), None)
    written = write_report(args.report, dicts, rows, threshold=args.threshold, intro=intro,
                           last_card=None if last is None else last.verdict.card())
    print(f"Report:          {written[0].resolve()} (+ {len(written) - 1} PNG)")


def _exit_code(rows: list[dict[str, Any]], records: list[Any], infos: list[Any], nonfinite: list[str]) -> int:
    code = EXIT_OK
    skipped = [r["name"] for r in rows if r["error"]]
    if skipped:
        print(f"satmon replay: {len(skipped)} checkpoint(s) skipped: " + ", ".join(skipped), file=sys.stderr)
        refused = [i.path.name for i in infos if i.refused]
        if refused:
            print(f"satmon replay: {len(refused)} of them refused by torch.load(weights_only=True): {', '.join(refused)}; "
                  "--trust-checkpoints would load them, and run code stored in them: only for files you trust.",
                  file=sys.stderr)
        code = EXIT_SKIPPED
    for line in nonfinite:
        print(f"satmon replay: {line}", file=sys.stderr)
    return EXIT_NONFINITE if any(r.nonfinite for r in records) else code


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage line
        return int(e.code or 0)
    from satmon.replay.user_code import ReplayUsageError

    try:
        return run(args)
    except ReplayUsageError as e:
        print(f"satmon replay: {e}", file=sys.stderr)
        return EXIT_USAGE
