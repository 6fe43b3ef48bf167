"""A LLaMA-style model (RoPE, SwiGLU MLP, DyT instead of RMSNorm) with satmon's abort policy armed.

In the regime study, LLaMA-style DyT models whose DyT feeds a gated (SwiGLU) MLP sometimes collapse,
and pooled saturation >= 0.5 flagged every collapse (4/4, no false alarm in 5). With
``abort_on="collapse"`` satmon stops such a run at the end of the screening window (or at a later
collapse-watch check) instead of letting it burn compute; ``--dry-run`` only reports what it would do.

The default ``--alpha-init 200`` over-scales DyT on purpose so that the collapse-risk condition
(saturation >= 0.5 in a gated model) is met within a CPU-sized run; ``--alpha-init paper`` uses the
DyT paper's LLaMA inits (0.8 pre-attention, 0.2 pre-MLP; RMSNorm before the head, ``LlamaLM``'s
default: a DyT there traps this model, docs/guides/faq.md), which at this scale saturate little and
train on to the end.

    python examples/llama_abort.py                        # stops at the verdict (collapse risk)
    python examples/llama_abort.py --dry-run              # says it would stop, trains on
    python examples/llama_abort.py --alpha-init paper     # no risk: trains to the end
"""

from __future__ import annotations

import argparse
import logging
import warnings

import lightning.pytorch as pl

from satmon import SaturationMonitor
from satmon.demos.corpus import CorpusDataModule
from satmon.demos.lit import LitLM


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--alpha-init", default="200", help="DyT alpha init (a number) or 'paper' for 0.8/0.2 (default 200)")
    p.add_argument("--window", type=int, default=100, help="screening window, optimizer steps (default 100)")
    p.add_argument("--steps", type=int, default=300, help="training steps if nothing stops the run (default 300)")
    p.add_argument("--dry-run", action="store_true", help="only report what would stop the run")
    p.add_argument("--logdir", default="satmon_logs")
    args = p.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*|.*LeafSpec.*")

    pl.seed_everything(0, verbose=False)
    alpha = {} if args.alpha_init == "paper" else {"alpha_init": float(args.alpha_init)}
    model = LitLM(
        arch="llama",
        d_model=64,
        n_layers=2,
        n_heads=4,
        seq_len=64,
        norm="dyt",
        mlp="swiglu",
        lr=3e-3,
        warmup=20,
        **alpha,
    )
    data = CorpusDataModule(seq_len=64, batch_size=16, train_tokens=400_000)
    monitor = SaturationMonitor(
        window=args.window,
        abort_on="collapse",
        dry_run=args.dry_run,
        verbose=False,
        watch_every_n_steps=25,
        log_every_n_steps=25,
    )
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        callbacks=[monitor],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=25,
        logger=pl.loggers.TensorBoardLogger(args.logdir, name="llama_abort"),
    )
    trainer.fit(model, data)

    if monitor.verdict is not None:
        print(monitor.verdict.text())
        print()
    stop = monitor.stop
    if stop is None:
        print(f"satmon: no stop; training ran to step {trainer.global_step} of {args.steps}.")
    elif stop.dry_run:
        print(f"satmon (dry run): would have stopped at step {stop.step}, reason {stop.reason.value}: {stop.message}")
        print(f"Training ran on to step {trainer.global_step} of {args.steps}.")
    else:
        print(f"satmon stopped training at step {stop.step}, reason {stop.reason.value}: {stop.message}")
        print(f"Training ended at step {trainer.global_step} of {args.steps}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
