"""A LightningModule around satmon's example models (GPT-2-style and LLaMA-style)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor

from satmon.demos.gpt import GPT, GPTConfig

__all__ = ["LitLM"]


def build_model(arch: str, **config: Any) -> torch.nn.Module:
    """Build ``"gpt"`` or ``"llama"`` from keyword hyper-parameters."""
    if arch == "gpt":
        return GPT(GPTConfig(**config))
    if arch == "llama":
        from satmon.demos.llama import LlamaConfig, LlamaLM

        return LlamaLM(LlamaConfig(**config))
    raise ValueError(f"Expected arch 'gpt' or 'llama', got {arch!r}.")


class LitLM(pl.LightningModule):
    """Next-token training of an example model; hyper-parameters are saved so that
    ``LitLM.load_from_checkpoint`` rebuilds it (and a random-init twin) from a checkpoint alone.

    Example:
        >>> import torch
        >>> lit = LitLM(arch="gpt", n_layers=1)
        >>> x = torch.zeros(2, 8, dtype=torch.long)
        >>> float(lit.training_step((x, x), 0).detach()) > 0
        True
    """

    def __init__(
        self, arch: str = "gpt", lr: float = 3e-3, weight_decay: float = 0.0, warmup: int = 20, **config: Any
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = build_model(arch, **config)

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx)

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = self(x)  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        warmup = max(1, int(self.hparams.warmup))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
