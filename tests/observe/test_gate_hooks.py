"""GateHooks (satmon.observe.gate): gate statistics read by hooks equal a float64 recount; NaN without data."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import token_loader, trainer
from reference import gate_stats
from satmon import DyT, SaturationMonitor
from satmon.demos.lit import LitLM
from satmon.demos.llama import LlamaLM
from satmon.functional.gate import flat_threshold
from satmon.model.gating import GatedPairing, GatingInfo, detect_gating
from satmon.observe.gate import GateCounter, GateHooks

D, H = 16, 24


def _report(**pairing) -> GatingInfo:
    p = GatedPairing(
        **{
            "norm": "norm",
            "mlp": "",
            "gate": "fc_in",
            "up": None,
            "down": "fc_out",
            "fused": True,
            "activation": "silu",
            "source": "mapping",
            **pairing,
        }
    )
    return GatingInfo(True, ("norm",), "", {"norm": p})


class _Fused(nn.Module):
    def __init__(self, gate_first: bool, act=F.silu):
        super().__init__()
        self.norm, self.fc_in, self.fc_out = DyT(D), nn.Linear(D, 2 * H), nn.Linear(H, D)
        self.gate_first, self.act = gate_first, act

    def forward(self, x):
        a, b = self.fc_in(self.norm(x)).chunk(2, dim=-1)
        g, u = (a, b) if self.gate_first else (b, a)
        return self.fc_out(self.act(g) * u)


def _gate_and_hidden(model: _Fused, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate pre-activations and the down projection's input, from the model's own modules (no satmon code)."""
    with torch.no_grad():
        a, b = model.fc_in(model.norm(x)).double().chunk(2, dim=-1)
    g, u = (a, b) if model.gate_first else (b, a)
    return g, model.act(g) * u


@pytest.mark.parametrize("gate_first", [True, False])
def test_fused_gate_statistics_equal_a_float64_recount_and_nan_before_any_data(gate_first):
    torch.manual_seed(0)
    model = _Fused(gate_first)
    with torch.no_grad():
        model.fc_in.weight.mul_(40)  # push many gates into the flat tail
    report = detect_gating(model, ["norm"], example_input=torch.randn(1, 2, D))
    assert report.pairings["norm"].gate_first is gate_first
    hooks = GateHooks(model, report, GateCounter(1))
    assert all(math.isnan(v) for v in hooks.readings()["norm"].values())  # no data: NaN, not 0.0
    hooks.attach()
    x = torch.randn(4, 7, D)
    with torch.no_grad():
        model(x[:2]), model(x[2:])
    flat, hidden = gate_stats(*_gate_and_hidden(model, x), flat_threshold("silu"))
    r = hooks.readings()["norm"]
    assert 0.05 < flat < 0.95 and r["flat_fraction"] == flat
    assert r["mean_abs_hidden"] == pytest.approx(hidden, rel=1e-6)


def test_unknown_activation_or_unhookable_gate_reads_nan_not_zero():
    model = _Fused(True, act=F.relu)
    hooks = GateHooks(model, _report(activation="relu"), GateCounter(1)).attach()
    with torch.no_grad():
        model(torch.randn(3, D))
    r = hooks.readings()["norm"]
    assert math.isnan(r["flat_fraction"]) and r["mean_abs_hidden"] > 0  # ReLU has no flat tail satmon can place
    blind = GateHooks(model, _report(gate_stats=False), GateCounter(1)).attach()
    assert not blind.attached  # nothing to hook
    with torch.no_grad():
        model(torch.randn(3, D))
    assert all(math.isnan(v) for v in blind.readings()["norm"].values())


def test_split_gate_statistics_through_the_callback_equal_a_float64_recount(tmp_path):
    model = LitLM(
        arch="llama",
        d_model=32,
        n_layers=2,
        n_heads=2,
        seq_len=16,
        norm="dyt",
        mlp="swiglu",
        alpha_init=200.0,
        lr=0.0,
        warmup=1,
    )
    captured: dict[str, list[torch.Tensor]] = {"g": [], "h": []}
    mlp = model.model.blocks[0].mlp
    h1 = mlp.gate_proj.register_forward_hook(
        lambda m, a, out: captured["g"].append(out.detach().double()) if m.training else None
    )
    h2 = mlp.down_proj.register_forward_pre_hook(
        lambda m, a: captured["h"].append(a[0].detach().double()) if m.training else None
    )
    monitor = SaturationMonitor(window=2, verbose=False, watch_every_n_steps=0)
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(model, token_loader(2))
    h1.remove(), h2.remove()
    g = torch.cat([x.reshape(-1) for x in captured["g"]])
    h = torch.cat([x.reshape(-1) for x in captured["h"]])
    r = monitor.verdict.risk["model.blocks.0.mlp"]
    flat, hidden = gate_stats(g, h, flat_threshold("silu"))
    assert r["flat_fraction"] == flat  # same count, exactly
    assert r["mean_abs_hidden"] == pytest.approx(hidden, rel=1e-9)


def test_readings_follow_pairing_order_with_one_slot_each():
    model = LlamaLM(vocab_size=16, d_model=D, n_layers=2, n_heads=2, seq_len=8)
    report = detect_gating(model, example_input=torch.randint(0, 16, (1, 8)))  # gating is read from a forward
    hooks = GateHooks(model, report, GateCounter(len(report.pairings))).attach()
    with torch.no_grad():
        model(torch.randint(0, 16, (2, 8)))
    readings = hooks.readings()
    assert list(readings) == ["blocks.0.mlp_norm", "blocks.1.mlp_norm"]
    assert readings["blocks.0.mlp_norm"]["mean_abs_hidden"] != readings["blocks.1.mlp_norm"]["mean_abs_hidden"]
