"""``satmon replay``: every satmon diagnostic over saved checkpoints, written as a TensorBoard run
that lines up with live runs (same tags, stepped by each checkpoint's global step), plus optional
JSON records and a markdown report with plots.

The logic lives in :mod:`satmon.replay`; the readings come from :func:`satmon.probe`, the live
callback's own code. Exit codes: 0 all replayed, 1 some checkpoint was skipped (named on stderr
and in the JSON), 2 the command cannot run as given (the message says what to pass).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["main"]

EPILOG = """\
examples:
  satmon replay lightning_logs/version_0/checkpoints --model satmon.demos.lit:LitLM \\
      --datamodule satmon.demos.corpus:CorpusDataModule --logdir satmon_logs --report replay.md
  satmon replay ckpts/ --model mypkg.model:MyLit --data calib.pt --batches 8 --json replay.json
  satmon replay weights/*.safetensors --factory mypkg.model:build --data calib.pt

batches: a tuple/list (x, y) whose y is an integer tensor of x's shape is read as (inputs, targets)
and only x is fed; otherwise a tensor is fed as model(t), a tuple as model(*b), a dict as model(**b).
--input-key K feeds batch[K] only (an index for tuples, a key for dicts).
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="satmon replay", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="CHECKPOINT_OR_DIR",
                   help="checkpoint files, or directories (searched recursively for .ckpt/.pt/.pth/.safetensors)")
    p.add_argument("--model", metavar="MODULE:CLASS", help="the LightningModule class; .ckpt files are rebuilt with "
                   "CLASS.load_from_checkpoint and the random-init twin with CLASS(**hyper_parameters)")
    p.add_argument("--factory", metavar="MODULE:FUNCTION", help="a function returning the nn.Module, for plain state_dict "
                   "files (.pt/.pth/.safetensors)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", metavar="FILE", help="calibration batches: a torch.save'd tensor, list of batches or dict of tensors")
    data.add_argument("--datamodule", metavar="MODULE:CLASS", help="a LightningDataModule: its train_dataloader, built "
                      "with the datamodule hyper-parameters stored in the checkpoint when present")
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
    p.add_argument("--weights-only", action="store_true", help="never fall back to torch.load(weights_only=False): "
                   "checkpoints that need it are skipped")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's own choice); "
                   "1 is often fastest for small models on a busy machine")
    p.add_argument("--quiet", action="store_true", help="no progress output (the summary is still printed)")
    return p


def _device(choice: str):
    import torch

    from satmon.replay import ReplayUsageError

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ReplayUsageError("--device cuda: no CUDA device is available here; pass --device cpu (or auto).")
    return torch.device(choice)


def _progress(records_total: int, quiet: bool):
    """``(update(record), close())``: a tqdm bar on a terminal, one plain line a checkpoint otherwise."""
    if quiet:
        return (lambda row: None), (lambda: None)
    if sys.stdout.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=records_total, unit="ckpt", desc="satmon replay", dynamic_ncols=True)

        def update(row: dict[str, Any]) -> None:
            bar.set_postfix_str(f"step {row['step']} " + ("FAILED" if row["error"] else f"sat {row['saturation'] or 0:.3f}"))
            bar.update()

        return update, bar.close
    done = [0]

    def line(row: dict[str, Any]) -> None:
        done[0] += 1
        what = f"skipped: {row['error']}" if row["error"] else (
            f"saturation {row['saturation']:.4f} {row['decision']}" if row["saturation"] is not None else f"norm type {row['norm_type']}")
        secs = f" ({row['seconds']:.1f} s)" if row["seconds"] is not None else ""
        step = "" if row["step"] is None else f" step {row['step']}"
        print(f"[{done[0]}/{records_total}]{step} {row['name']}: {what}{secs}", flush=True)

    return line, (lambda: None)


def run(args: argparse.Namespace) -> int:
    from satmon import replay as rp
    from satmon.writers.markdown import require_matplotlib, table, write_report

    if args.batches < 1:
        raise rp.ReplayUsageError(f"Expected --batches >= 1, got {args.batches}.")
    if args.data is None and args.datamodule is None:
        raise rp.ReplayUsageError("No calibration data: pass --data FILE (a torch.save'd tensor, list of batches or dict "
                                  "of tensors) or --datamodule MODULE:CLASS (e.g. satmon.demos.corpus:CorpusDataModule).")
    model_cls = rp.import_object(args.model, "--model", "satmon.demos.lit:LitLM") if args.model else None
    if model_cls is not None and not (isinstance(model_cls, type) and hasattr(model_cls, "load_from_checkpoint")):
        raise rp.ReplayUsageError(f"--model {args.model}: expected a LightningModule class, got {model_cls!r}. For a "
                                  "plain nn.Module pass --factory MODULE:FUNCTION returning it.")
    factory = rp.import_object(args.factory, "--factory", "mypkg.model:build") if args.factory else None
    if factory is not None and not callable(factory):
        raise rp.ReplayUsageError(f"--factory {args.factory}: expected a callable returning an nn.Module, got {factory!r}.")
    if args.report:
        try:
            require_matplotlib()
        except ImportError as e:
            raise rp.ReplayUsageError(f"--report: {e}") from e
    device = _device(args.device)
    if args.threads is not None:
        if args.threads < 1:
            raise rp.ReplayUsageError(f"Expected --threads >= 1, got {args.threads}.")
        import torch

        torch.set_num_threads(args.threads)
    loader = rp.ModelLoader(model_cls, factory, device=device)

    infos = [rp.inspect_checkpoint(f, allow_unsafe=not args.weights_only) for f in rp.find_checkpoints(args.paths, exclude=[args.data] if args.data else [])]
    ordered = rp.order_checkpoints(infos)
    failed = [i for i in infos if i.error is not None]
    unbuildable = [loader.check(i) for i in ordered]
    if ordered and all(unbuildable):
        raise rp.ReplayUsageError(f"Cannot build any checkpoint: {unbuildable[0]}.")

    if args.data is not None:
        batches = rp.load_data_file(args.data, args.batches, args.batch_size)
        data_text = f"{len(batches)} batch(es) from {args.data}"
    else:
        dm_cls = rp.import_object(args.datamodule, "--datamodule", "satmon.demos.corpus:CorpusDataModule")
        hp = next((i.datamodule_hparams for i in ordered if i.datamodule_hparams), {})
        batches = rp.datamodule_batches(dm_cls, hp, args.batches)
        data_text = f"{len(batches)} batch(es) of {dm_cls.__name__}.train_dataloader()" + (
            f" with the checkpoint's hyper-parameters {hp}" if hp else " with its default arguments")
    import torch

    probe_kwargs = dict(
        forward_fn=rp.input_forward_fn(batches, args.input_key), device=device, threshold=args.threshold,
        level=args.level, collapse_threshold=args.collapse_threshold,
        autocast_dtype=torch.bfloat16 if args.dtype == "bfloat16" else None,
    )

    tb = rp.TensorBoardReplay(args.logdir, name=args.name)
    records: list[dict[str, Any]] = []
    update, close = _progress(len(ordered) + len(failed), args.quiet)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        for record in rp.replay(ordered + failed, loader, batches, probe_kwargs=probe_kwargs, twin=not args.no_twin, on_record=tb):
            records.append(record)
            row = rp.summary_row(record)
            for note in record.get("notes", []):
                print(f"satmon replay: note: {record['checkpoint']}: {note}", file=sys.stderr)
            if row["error"]:
                print(f"satmon replay: skipped {record['checkpoint']}: {row['error']}", file=sys.stderr)
            update(row)
            if args.json:
                from satmon.writers.json_records import write_records

                write_records(args.json, records)  # rewritten after each checkpoint: an interrupted replay keeps its records
    close()
    tb.close()
    took = time.perf_counter() - t0

    rows = [rp.summary_row(r) for r in records]
    ok = [r for r in rows if r["error"] is None]
    print()
    print(table(["step", "checkpoint", "saturation", "verdict", "norm type", "min sigma ratio", "min alignment", "s"],
                [[r["step"], r["name"], r["saturation"], r["decision"], r["norm_type"], r["min_ratio"], r["min_alignment"],
                  None if r["seconds"] is None else f"{r['seconds']:.2f}"] for r in rows if r["error"] is None]))
    last = next((r for r in reversed(records) if r.get("verdict")), None)
    if last is not None:
        v = last["verdict"]
        print(f"\nLast checkpoint (step {last['global_step']}): {rp.summary_row(last)['decision']}  pooled saturation "
              f"{v['saturation']:.4f} {'>=' if v['saturation'] >= v['threshold'] else '<'} threshold {v['threshold']:g} "
              f"(margin {v['margin']:+.4f})")
    print(f"\nReplayed {len(ok)} of {len(rows)} checkpoint(s) in {took:.1f} s on {device.type} ({args.dtype}); calibration: {data_text}.")
    print(f"TensorBoard run: {Path(tb.log_dir).resolve()}   (satmon report {Path(tb.log_dir).resolve()})")
    if args.json:
        print(f"JSON records:    {Path(args.json).resolve()}")
    if args.report:
        intro = [
            f"Model `{args.model or args.factory}`; {len(ok)} of {len(rows)} checkpoint(s) replayed on {device.type} "
            f"({args.dtype} forward, float64 statistics); calibration: {data_text}.",
            f"GO threshold {args.threshold:g} on pooled saturation (|alpha x| > {args.level:g}); TensorBoard run "
            f"`{Path(tb.log_dir).resolve()}`.",
        ]
        card = None
        if last is not None:
            from satmon.verdict import Verdict

            card = Verdict.from_dict(last["verdict"]).card()
        written = write_report(args.report, records, rows, threshold=args.threshold, intro=intro, last_card=card)
        print(f"Report:          {written[0].resolve()} (+ {len(written) - 1} PNG)")
    if len(ok) < len(rows):
        print(f"satmon replay: {len(rows) - len(ok)} checkpoint(s) skipped: "
              + ", ".join(r["name"] for r in rows if r["error"]), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage line
        return int(e.code or 0)
    from satmon.replay import ReplayUsageError

    try:
        return run(args)
    except ReplayUsageError as e:
        print(f"satmon replay: {e}", file=sys.stderr)
        return 2
