"""One model, one data order, one seed for every loop satmon drives (Lightning, plain, HF Trainer, Fabric).

The demo GPT (d=32, 2 blocks, DyT alpha_init=8) on fixed random token windows (no shuffling), AdamW
at a constant lr 3e-2 without weight decay or clipping, a 6-step window inside 8 steps: the saturation
spreads over the layers (0.003 to 0.53), so a verdict that counted one forward too many or too few,
or at another step, would not match.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from helpers import tiny_lit, token_loader, trainer
from satmon.demos.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=8.0)
WINDOW, STEPS, LR, BATCH = 6, 8, 3e-2, 4


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (its main guard keeps it from running)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def gpt() -> GPT:
    """The recipe's model, seeded as ``pl.seed_everything(0)`` seeds the Lightning one."""
    torch.manual_seed(0)
    return GPT(GPTConfig(**CONFIG))


def loader() -> DataLoader:
    """``STEPS`` batches of ``(input, target)`` token windows, in a fixed order."""
    return token_loader(n_batches=STEPS, batch_size=BATCH, seq_len=CONFIG["seq_len"])


def lightning_run(tmp_path: Path, **monitor_options):
    """The Lightning callback on the recipe; returns the monitor."""
    import lightning.pytorch as pl

    from satmon import SaturationMonitor

    pl.seed_everything(0, verbose=False)
    lit = tiny_lit(**CONFIG, lr=LR, warmup=1)  # warmup 1: the scheduler's factor is 1 from the first step
    monitor = SaturationMonitor(window=WINDOW, verbose=False, **monitor_options)
    trainer(tmp_path, max_steps=STEPS, callbacks=[monitor]).fit(lit, loader())
    return monitor


def plain_run(steps: int = STEPS, **screen_options):
    """``examples/plain_pytorch.py``'s loop on the recipe; returns ``(screen, steps run)``."""
    import satmon

    model = gpt()
    first_input = next(iter(loader()))[0]  # the gated-MLP trace reads one batch, as the callback's reads the first
    screen = satmon.Screen(window=WINDOW, verbose=False, **screen_options).attach(model, example_input=first_input)
    ran = load_example("plain_pytorch").fit(model, iter(loader()), screen, steps, lr=LR)
    return screen, ran


def comparable(verdict, strip: str = "") -> dict:
    """``verdict.to_dict()`` with ``strip`` taken off the layer names (the Lightning module
    nests the GPT as ``model``)."""
    d = verdict.to_dict()
    for key in ("per_layer", "offset", "risk"):  # keyed by layer (or gated MLP) name
        d[key] = {k.removeprefix(strip): v for k, v in d[key].items()}
    d["gated_layers"] = [n.removeprefix(strip) for n in d["gated_layers"]]
    # the phase-diagram line: only a driver that sees the training dataloader (Lightning, Hugging Face) writes it
    d["notes"] = [n for n in d["notes"] if not n.startswith("Phase diagram:")]
    d.pop("planned_forecast")  # and the forecast from the planned passes: only a driver sees the trainer's steps
    return d


def phase_line(verdict) -> str:
    """The card's phase-diagram line, less the dataset's class name (two frameworks' datasets of one run differ)."""
    line = next(n for n in verdict.notes if n.startswith("Phase diagram:"))
    return re.sub(r" tokens in \w+\)", " tokens in the dataset)", line)


class TokenDicts(Dataset):
    """The recipe's batches as Hugging Face-style examples ``{"input_ids", "labels"}`` (labels = next tokens)."""

    def __init__(self) -> None:
        self.data = loader().dataset

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.data[i]
        return {"input_ids": x, "labels": y}


class LossLM(nn.Module):
    """The demo GPT with a Hugging Face-style forward: ``model(input_ids, labels) -> {"loss": ...}``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.model(input_ids)
        return {"loss": nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))}


def hf_args(out: Path, **overrides):
    """TrainingArguments that train like the recipe: CPU, constant lr, plain AdamW, no clipping, no shuffling."""
    from transformers import TrainingArguments

    kw = dict(
        use_cpu=True,
        report_to="none",
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=0.0,
        train_sampling_strategy="sequential",
        save_strategy="no",
        logging_steps=1000,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    kw.update(overrides)
    return TrainingArguments(str(out), **kw)
