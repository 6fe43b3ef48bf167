"""``satmon demo``: the main job. Train a small GPT-2-style DyT model on the embedded corpus for the
screening window, on CPU, print the verdict card and where the TensorBoard logs are."""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from pathlib import Path

__all__ = ["main", "run_demo"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="satmon demo", description=__doc__)
    p.add_argument("--window", type=int, default=500, help="screening window in optimizer steps (default 500)")
    p.add_argument("--steps", type=int, default=None, help="total training steps (default: the window)")
    p.add_argument("--threshold", type=float, default=0.43)
    p.add_argument("--logdir", default="satmon_logs", help="TensorBoard root (default ./satmon_logs)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--train-tokens", type=int, default=400_000, help="size of the training split of the embedded corpus")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=0, help="save a checkpoint every N steps (0: only the last)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def run_demo(args: argparse.Namespace):
    """Train and return ``(monitor, logger_dir)``."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    from satmon import SaturationMonitor
    from satmon.demos.corpus import CorpusDataModule
    from satmon.demos.lit import LitLM

    pl.seed_everything(args.seed, verbose=False)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    steps = args.steps or args.window
    model = LitLM(arch="gpt", d_model=args.d_model, n_layers=args.layers, n_heads=4, seq_len=args.seq_len,
                  norm="dyt", alpha_init=2.0, lr=3e-3, warmup=50)
    data = CorpusDataModule(seq_len=args.seq_len, batch_size=args.batch_size, train_tokens=args.train_tokens, seed=args.seed)
    monitor = SaturationMonitor(window=args.window, threshold=args.threshold, log_every_n_steps=25, verbose=False)
    logger = TensorBoardLogger(args.logdir, name="demo", default_hp_metric=False)  # the HParams view shows satmon's verdict
    ckpt = ModelCheckpoint(every_n_train_steps=args.checkpoint_every or None, save_top_k=-1 if args.checkpoint_every else 1)
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=logger, callbacks=[monitor, ckpt],
        enable_progress_bar=not args.quiet, enable_model_summary=False, log_every_n_steps=25,
        val_check_interval=min(250, steps), limit_val_batches=8, num_sanity_val_steps=0,
    )
    trainer.fit(model, data)
    return monitor, logger.log_dir


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    print(f"satmon demo: GPT-2-style model (d={args.d_model}, {args.layers} blocks, DyT alpha_init 2.0) on the "
          f"embedded corpus (Python's standard library), {args.window}-step screening window, CPU.")
    t0 = time.perf_counter()
    monitor, log_dir = run_demo(args)
    took = time.perf_counter() - t0
    if monitor.verdict is None:
        print("satmon demo: no verdict (training stopped before any step was counted).")
        return 1
    print()
    print(monitor.verdict.card())
    print()
    print(monitor.verdict.summary())
    print(f"Trained {args.steps or args.window} steps in {took:.0f} s.")
    print(f"TensorBoard logs: {Path(log_dir).resolve()}")
    print(f"Open them with:   tensorboard --logdir {Path(args.logdir).resolve()}")
    print(f"Or, without a browser: satmon report {Path(log_dir).resolve()}")
    return 0
