"""Gate statistics (satmon.functional.gate) against closed-form float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from satmon.functional.gate import flat_threshold, gate_stats, gate_stats_finalize, gate_stats_update, split_gate_up

D, H = 16, 24


def _slope64(activation: str, x: float) -> float:
    """d act / dx in closed form, float64 (independent of satmon's autograd search)."""
    if activation == "silu":
        s = 1 / (1 + math.exp(-x))
        return s * (1 + x * (1 - s))
    return 0.5 * (1 + math.erf(x / math.sqrt(2))) + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_flat_threshold_is_the_tail_edge(activation):
    t = flat_threshold(activation, 0.05)
    assert abs(abs(_slope64(activation, t)) - 0.05) < 1e-7
    assert all(abs(_slope64(activation, t - 0.01 * k)) < 0.05 for k in range(1, 3000))
    assert abs(_slope64(activation, t + 0.01)) > 0.05


def _reference(g, u, activation, t):
    g64, u64 = g.double(), u.double()
    act = {"silu": lambda x: x * torch.sigmoid(x), "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))}[
        activation
    ]
    return int((g64 < t).sum()), g64.numel(), float((act(g64) * u64).abs().sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7,), (3, 5, 11)])
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_gate_stats_against_float64(dtype, shape, activation):
    gen = torch.Generator().manual_seed(0)
    g, u = (3 * torch.randn(shape, generator=gen)).to(dtype), torch.randn(shape, generator=gen).to(dtype)
    t = flat_threshold(activation)
    n_flat, n, s = gate_stats_update(g, u, activation=activation)
    ref_flat, ref_n, ref_s = _reference(g, u, activation, t)
    assert (int(n_flat), int(n)) == (ref_flat, ref_n) and n_flat.dtype == torch.int64
    assert float(s) == pytest.approx(ref_s, rel=1e-5)
    stats = gate_stats(g, u, activation=activation)
    assert stats["flat_fraction"] == ref_flat / ref_n and stats["mean_abs_hidden"] == pytest.approx(
        ref_s / ref_n, rel=1e-5
    )


def test_gate_stats_batched_equals_one_shot_and_fused_split():
    gen = torch.Generator().manual_seed(1)
    g, u = 4 * torch.randn(6, 9, H, generator=gen), torch.randn(6, 9, H, generator=gen)
    parts = [gate_stats_update(*split_gate_up(torch.cat([g[i : i + 2], u[i : i + 2]], dim=-1))) for i in range(0, 6, 2)]
    summed = [sum(p[k] for p in parts) for k in range(3)]
    one = gate_stats_update(g, u)
    assert int(summed[0]) == int(one[0]) and int(summed[1]) == int(one[1])
    assert float(summed[2]) == pytest.approx(float(one[2]), rel=1e-5)
    assert gate_stats(g, threshold=-1.0)["flat_fraction"] == float((g < -1.0).double().mean())


def test_gate_stats_edge_cases():
    assert math.isnan(gate_stats_finalize(torch.tensor(0), torch.tensor(0), torch.tensor(0.0))["flat_fraction"])
    with pytest.raises(ValueError, match="Expected `activation` in"):
        gate_stats_update(torch.zeros(3), activation="relu")
    with pytest.raises(ValueError, match="Expected `up` with the gate's shape"):
        gate_stats_update(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="even last dim"):
        split_gate_up(torch.zeros(3))
