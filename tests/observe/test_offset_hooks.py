"""Offset statistics of the live window against an independent float64 re-computation, and the flag."""

from __future__ import annotations

import statistics

import pytest
import torch

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder, exact_count
from satmon import SaturationMonitor, find_dyt_layers
from satmon.observe.offset import offset_driven


def _reference(items: list[tuple[torch.Tensor, torch.Tensor]], level: float = 2.0) -> dict[str, float]:
    """Per layer from recorded float64 inputs: sampled saturation, centered saturation, mean
    of per-batch median ratios."""
    sat = cen = total = 0
    medians = []
    for x, a in items:
        flat = x.reshape(-1, x.shape[-1])  # (tokens, C)
        m = flat.mean(0)
        s = (flat - m).square().mean(0).sqrt()
        sat += exact_count(flat, a, level)
        cen += exact_count(flat - m, a, level)
        total += flat.numel()
        medians.append(statistics.median((m.abs() / s).tolist()))
    return {"saturated": sat / total, "centered": cen / total, "offset_ratio": sum(medians) / len(medians)}


@pytest.mark.parametrize("every", [1, 3])
def test_offset_readings_equal_an_independent_float64_recount(tmp_path, every):
    window = 7
    lit = tiny_lit(alpha_init=20.0)
    names = [l.name for l in find_dyt_layers(lit)]
    rec = InputRecorder(lit, names)
    monitor = SaturationMonitor(window=window, offset_every=every, verbose=False)
    trainer(tmp_path, max_steps=window, callbacks=[monitor]).fit(lit, token_loader(window))
    got = monitor.verdict.offset
    sampled = [i for i in range(window) if i % every == 0]
    assert set(got) == set(names)
    for name in names:
        want = _reference([rec.inputs[name][i] for i in sampled])
        assert got[name]["saturated"] == pytest.approx(want["saturated"], abs=1e-12)
        assert got[name]["centered"] == pytest.approx(want["centered"], abs=1e-12)
        assert got[name]["offset_ratio"] == pytest.approx(want["offset_ratio"], rel=1e-9)
    # the sampled saturation of every-step sampling is the verdict's own per-layer saturation
    if every == 1:
        assert all(got[n]["saturated"] == pytest.approx(monitor.verdict.per_layer[n], abs=1e-12) for n in names)


def test_flag_reads_offset_driven_only_when_channel_means_explain_the_saturation():
    # measured on satmon's runs (docs/science/science.md): stalled 0.741 -> 0.006, healthy 0.779 -> 0.608
    assert offset_driven({"ln_f": {"saturated": 0.741, "centered": 0.006, "offset_ratio": 102.0}})
    assert not offset_driven({"ln_f": {"saturated": 0.779, "centered": 0.608, "offset_ratio": 1.99}})
    assert not offset_driven({"ln_f": {"saturated": 0.0, "centered": 0.0, "offset_ratio": 0.0}})


def test_offset_flag_on_the_card_for_a_model_riding_on_constant_offsets(tmp_path):
    # a DyT fed by inputs that sit on per-channel constants (10 +- 0.01): saturated, but by the offset only
    import lightning.pytorch as pl
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from satmon import DyT

    class Offset(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.head = DyT(16, alpha_init=1.0), nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            return self.head(self.norm(batch[0])).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    x = 10.0 + 0.01 * torch.randn(32, 8, 16, generator=torch.Generator().manual_seed(0))
    monitor = SaturationMonitor(window=4, offset_every=1, verbose=False)
    trainer(tmp_path, max_steps=4, callbacks=[monitor]).fit(Offset(), DataLoader(TensorDataset(x), batch_size=8))
    v = monitor.verdict
    assert v.saturation == 1.0 and v.offset["norm"]["centered"] == 0.0 and "offset-driven" in v.flags
    assert "Flag: offset-driven" in v.card() and v.decision == "go"  # flags never change the study's decision
