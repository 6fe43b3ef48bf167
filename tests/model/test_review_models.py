"""Review models (hand-built, not in lookalikes.py): gating verdicts checked against what each forward computes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import satmon
import satmon.model.dataflow
from satmon import DyT

D = 16


class _Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.o((q @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1) @ v)


class TorchChunkGLU(nn.Module):
    """A gated MLP written with the function ``torch.chunk`` on one fused projection (opaque names)."""

    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        a, b = torch.chunk(self.fc(x), 2, dim=-1)
        return self.out(a * F.silu(b))


class UnbindGLU(nn.Module):
    """A gated MLP whose fused projection is split by ``unbind`` on a view (count not in the call)."""

    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        g, u = self.fc(x).unflatten(-1, (2, 2 * D)).unbind(-2)
        return self.out(F.silu(g) * u)


class SplitGLU(nn.Module):
    """``torch.split`` with a size from an attribute."""

    def __init__(self):
        super().__init__()
        self.hidden = 2 * D
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        g, u = torch.split(self.fc(x), self.hidden, dim=-1)
        return self.out(F.gelu(g) * u)


class _Block(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.n1, self.n2, self.attn, self.ff = nn.LayerNorm(D), nn.LayerNorm(D), _Attn(), mlp()

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.ff(self.n2(x))


class _LM(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.emb = nn.Embedding(50, D)
        self.blocks = nn.ModuleList([_Block(mlp) for _ in range(2)])

    def forward(self, t):
        x = self.emb(t)
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("mlp", [TorchChunkGLU, UnbindGLU, SplitGLU])
def test_fused_gated_mlp_split_by_any_call_is_never_not_gated(mlp):
    torch.manual_seed(0)
    model = satmon.convert_to_dyt(_LM(mlp), alpha_init=2.0)
    batch = torch.randint(0, 50, (2, 8))
    screen = satmon.Screen(window=1, verbose=False)
    screen.discover(model, example_input=batch)
    assert screen.gating.gated is True and set(screen.gating.gated_layers) == {"blocks.0.n2", "blocks.1.n2"}
    names = satmon.Screen(window=1, verbose=False, warn=lambda _m: None)
    names.discover(model)  # no batch: the names fallback may say "unknown", never "no"
    assert names.gating.gated is not False, names.gating.message
    if names.gating.gated is None:
        assert "blocks.0.n2" in names.gating.message and "gating_mapping" in names.gating.message


def test_a_refused_mapping_without_a_trace_lists_the_modules_that_may_be_gated():
    """No batch: a mapping naming a non-MLP is refused; the message must not say the model has no gated MLP
    where a fused one (opaque names, read from the source) exists, and must name it as a candidate."""
    model = satmon.convert_to_dyt(_LM(TorchChunkGLU), alpha_init=2.0)
    screen = satmon.Screen(window=1, verbose=False, gating_mapping={"blocks.0.n2": "blocks.0.attn"})
    with pytest.raises(ValueError) as err:
        screen.discover(model)
    assert "has no gated MLPs" not in str(err.value) and "blocks.0.ff" in str(err.value)
    ok = satmon.Screen(
        window=1, verbose=False, gating_mapping={"blocks.0.n2": "blocks.0.ff", "blocks.1.n2": "blocks.1.ff"}
    )
    ok.discover(model)  # the candidate it names is accepted
    assert ok.gating.gated is True and set(ok.gating.gated_layers) == {"blocks.0.n2", "blocks.1.n2"}


def test_a_norm_shared_by_two_blocks_is_converted_everywhere_it_is_used():
    """One LayerNorm object registered under two names (weight tying of a norm): every use becomes the one DyT,
    and the screen counts both uses (an independent float64 count of |alpha * x| > 2 on the DyT's inputs)."""
    torch.manual_seed(0)
    model = _LM(SwiGLUish)
    model.blocks[1].n2 = model.blocks[0].n2
    satmon.convert_to_dyt(model, alpha_init=2.0)
    assert isinstance(model.blocks[1].n2, DyT) and model.blocks[1].n2 is model.blocks[0].n2
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    counted = [0, 0]

    def count(mod, args):
        if satmon.model.dataflow.tracing():
            return  # satmon's own check of the fresh conversion, at the first forward
        x = args[0].detach().double()
        counted[0] += int(((mod.alpha.detach().double() * x).abs() > 2).sum())
        counted[1] += x.numel()

    screen = satmon.Screen(window=2, verbose=False).attach(model)
    for m in {id(m): m for m in model.modules() if isinstance(m, DyT)}.values():
        m.register_forward_pre_hook(count)
    for _ in range(2):
        screen.step(model(torch.randint(0, 50, (2, 8))).square().mean())
    assert screen.verdict.elements == counted[1] == 2 * 2 * 8 * D * 4  # 2 steps, 4 uses per forward
    assert screen.verdict.saturation == pytest.approx(counted[0] / counted[1], abs=1e-12)


class SwiGLUish(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(D, 2 * D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
