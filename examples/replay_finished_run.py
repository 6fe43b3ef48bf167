"""Replay satmon over a finished run's checkpoints with ``satmon replay``.

A run that was trained without satmon (or whose logs are gone) still has its checkpoints. This
example trains a short DyT run that saves a checkpoint every ``--every`` steps (standing in for your
finished run), then runs

    satmon replay CKPT_DIR --model satmon.demos.lit:LitLM --datamodule satmon.demos.corpus:CorpusDataModule \\
        --logdir DIR --json replay.json --report replay.md

which re-reads every checkpoint (with ``torch.load(weights_only=True)``: no code stored in a file
runs), measures saturation (and satmon's other diagnostics) on the same calibration batches, and
writes a TensorBoard run, JSON records and a markdown report. Exit codes: 0 all replayed, 1 a
checkpoint skipped, 2 usage error, 3 a checkpoint holds NaN/inf (a diverged run).

    python examples/replay_finished_run.py                       # 300 steps, a checkpoint every 50
    python examples/replay_finished_run.py --steps 6 --every 3 --window 3
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import warnings
from pathlib import Path


def train(args: argparse.Namespace, workdir: Path) -> tuple[Path, object]:
    """The 'finished run': a DyT GPT with checkpoints every ``args.every`` steps (and a live monitor, to compare)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from satmon import SaturationMonitor
    from satmon.demos.corpus import CorpusDataModule
    from satmon.demos.lit import LitLM

    pl.seed_everything(0, verbose=False)
    # the demo's model
    model = LitLM(
        arch="gpt",
        d_model=64,
        n_layers=2,
        n_heads=4,
        seq_len=64,
        norm="dyt",
        alpha_init=2.0,
        emb_std=64**-0.5,
        lr=3e-3,
        warmup=20,
    )
    data = CorpusDataModule(seq_len=64, batch_size=16, train_tokens=400_000)
    ckpt_dir = workdir / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.every, save_top_k=-1, filename="{step}")
    monitor = SaturationMonitor(window=min(args.window, args.steps), verbose=False)
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        logger=False,
        callbacks=[ckpt, monitor],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=data)
    return ckpt_dir, monitor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="training steps of the stand-in run (default 300)")
    p.add_argument("--every", type=int, default=50, help="checkpoint every N steps (default 50)")
    p.add_argument("--window", type=int, default=100, help="the live monitor's window, for comparison (default 100)")
    p.add_argument("--batches", type=int, default=4, help="calibration batches for the replay (default 4)")
    p.add_argument("--workdir", default="replay_example", help="checkpoints, logs, JSON and report go here")
    args = p.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*|.*LeafSpec.*|.*has no logger.*")

    workdir = Path(args.workdir)
    if (workdir / "checkpoints").exists():
        shutil.rmtree(workdir / "checkpoints")  # a rerun replays this run's checkpoints only
    ckpt_dir, monitor = train(args, workdir)
    print(
        f"Trained {args.steps} steps; checkpoints in {ckpt_dir}: "
        f"{', '.join(sorted(f.name for f in ckpt_dir.glob('*.ckpt')))}"
    )

    satmon = [shutil.which("satmon")] if shutil.which("satmon") else [sys.executable, "-m", "satmon.cli.main"]
    cmd = satmon + [
        "replay",
        str(ckpt_dir),
        "--model",
        "satmon.demos.lit:LitLM",
        "--datamodule",
        "satmon.demos.corpus:CorpusDataModule",
        "--logdir",
        str(workdir / "satmon_logs"),
        "--json",
        str(workdir / "replay.json"),
        "--report",
        str(workdir / "replay.md"),
        "--batches",
        str(args.batches),
        "--quiet",
    ]
    print("$ " + " ".join(["satmon"] + cmd[len(satmon) :]), flush=True)
    rc = subprocess.call(cmd)
    if rc not in (0, 1, 3):  # 1: some checkpoint skipped, 3: non-finite values (both named above); 2: usage error
        print(f"satmon replay failed with exit code {rc}", file=sys.stderr)
        return rc

    records = json.loads((workdir / "replay.json").read_text())
    print("\nstep  replayed saturation  verdict     non-finite weights / DyT inputs")
    for r in records:
        v = r.get("verdict") or {}
        sat = v.get("saturation")
        print(
            f"{r.get('global_step')!s:>4}  {sat if sat is None else format(sat, '.4f'):>19}  "
            f"{str(v.get('decision', r.get('error', '-'))).upper():<10}  {r.get('nonfinite_weights', '-')} / "
            f"{v.get('nonfinite', '-')}"
        )
    if monitor.verdict is not None:
        print(f"\nLive monitor over the first {monitor.verdict.window} steps: {monitor.verdict.summary()}")
    print(f"Report: {workdir / 'replay.md'}   TensorBoard: tensorboard --logdir {workdir / 'satmon_logs'}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
