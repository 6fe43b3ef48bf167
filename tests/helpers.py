"""Shared test helpers: tiny models, data, and an independent float64 reference."""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from satmon.demos.lit import LitLM


def tiny_lit(**overrides) -> LitLM:
    cfg = dict(arch="gpt", d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=2.0, lr=3e-3, warmup=1)
    cfg.update(overrides)
    return LitLM(**cfg)


def token_loader(n_batches: int = 8, batch_size: int = 4, seq_len: int = 16, seed: int = 0, vocab: int = 256) -> DataLoader:
    """Fixed random token windows (shuffle off, so reruns and resumes see the same data)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n_batches * batch_size, seq_len + 1), generator=g)
    return DataLoader(TensorDataset(x[:, :-1], x[:, 1:]), batch_size=batch_size, shuffle=False)


def trainer(tmp_path, **kw) -> pl.Trainer:
    args = dict(
        default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, accelerator="cpu", devices=1, num_sanity_val_steps=0, limit_val_batches=0,
    )
    args.update(kw)
    return pl.Trainer(**args)


class InputRecorder:
    """Record every DyT input of training forwards in float64 (the reference, independent of satmon's code)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        modules = dict(model.named_modules())
        self.inputs: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {n: [] for n in names}
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):
        def hook(mod, args, out):
            if mod.training:
                self.inputs[name].append((args[0].detach().to(torch.float64).clone(), mod.alpha.detach().to(torch.float64).clone()))
        return hook

    def counts(self, level: float = 2.0, first: int | None = None) -> dict[str, tuple[int, int]]:
        out = {}
        for name, items in self.inputs.items():
            items = items if first is None else items[:first]
            sat = sum(int(((a * x).abs() > level).sum()) for x, a in items)
            out[name] = (sat, sum(x.numel() for x, _ in items))
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def clean_env() -> dict[str, str]:
    """The test process's environment without what an earlier in-process distributed run (Lightning,
    accelerate) may have left there, for a subprocess that starts its own process group."""
    stale = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
             "GROUP_RANK", "PL_GLOBAL_SEED", "TORCHELASTIC_RUN_ID")
    return {**{k: v for k, v in os.environ.items() if k not in stale and not k.startswith("ACCELERATE_")},
            "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}



class RecordingSink:
    """A satmon sink (with a layout) that records every call, in order: ``calls`` holds
    ``("scalars", values, step)``, ``("text", tag, markdown, step)``, ``("hparams", params, metrics, step)``,
    ``("layout", layout)`` and ``("close",)``."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def scalars(self, values, step):
        self.calls.append(("scalars", dict(values), step))

    def text(self, tag, markdown, step):
        self.calls.append(("text", tag, markdown, step))

    def hparams(self, params, metrics, step):
        self.calls.append(("hparams", dict(params), dict(metrics), step))

    def layout(self, layout):
        self.calls.append(("layout", layout))

    def close(self):
        self.calls.append(("close",))
