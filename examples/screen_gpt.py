"""Screen a small GPT-2-style DyT model with satmon: `satmon demo`, written against the API.

python examples/screen_gpt.py                     # 500-step window on CPU, a few minutes
python examples/screen_gpt.py --steps 20 --window 10
tensorboard --logdir satmon_logs                  # the verdict card and the per-layer curves
"""

import argparse

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from satmon import SaturationMonitor
from satmon.demos.corpus import CorpusDataModule
from satmon.demos.lit import LitLM

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--window", type=int, default=500, help="screening window, optimizer steps")
p.add_argument("--steps", type=int, default=500, help="training steps")
p.add_argument("--logdir", default="satmon_logs")
args = p.parse_args()

pl.seed_everything(0)
# the demo's model: token embedding (tied with the output head) at std d_model ** -0.5, so that DyT trains
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
    warmup=50,
)
data = CorpusDataModule(seq_len=64, batch_size=16, train_tokens=400_000)
monitor = SaturationMonitor(window=args.window, log_every_n_steps=25, verbose=False)  # the study's rule (0.43)
logger = TensorBoardLogger(args.logdir, name="screen_gpt")
trainer = pl.Trainer(
    max_steps=args.steps,
    accelerator="cpu",
    logger=logger,
    callbacks=[monitor],
    log_every_n_steps=25,
    enable_checkpointing=False,
    enable_progress_bar=False,
    limit_val_batches=0,
    num_sanity_val_steps=0,
)
trainer.fit(model, data)

verdict = monitor.verdict
print(f"{verdict.text()}\n\n{verdict.summary()}" if verdict else "no verdict: training stopped before the first step")
print(f"TensorBoard: tensorboard --logdir {args.logdir}   (run: {logger.log_dir})")
