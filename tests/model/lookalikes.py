"""Hand-written look-alikes of the structures the model map must read, written as other projects write them
(never satmon's classes): gains under other names, the point-wise family, channels-first norms, post-norm,
parallel-residual and fused gated blocks. Each docstring states the truth a test checks against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

D, H = 16, 24


# ----------------------------------------------------------------------------- normalisers with other parameter names
class RMSNormG(nn.Module):
    """RMSNorm whose gain is called ``g`` (truth: rmsnorm, gain = g, last axis)."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.eps = 1e-6

    def forward(self, x: Tensor) -> Tensor:
        return self.g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class ScaleNorm(nn.Module):
    """RMSNorm with a ``scale`` gain and no eps attribute (truth: rmsnorm, gain = scale)."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * self.scale


class GammaBetaLN(nn.Module):
    """LayerNorm with ``gamma``/``beta`` (truth: layernorm, gain = gamma, bias = beta)."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.gamma, self.beta = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], self.gamma, self.beta, 1e-5)


class Squash(nn.Module):
    """A parameterless RMS normalisation with no norm-like name or attribute: found only
    when ``include=`` selects it."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


# ----------------------------------------------------------------------------- the point-wise family
class Derf(nn.Module):
    """``weight * erf(alpha * x + s) + bias`` ("Stronger Normalization-Free Transformers"); ``s`` a scalar shift."""

    def __init__(self, d: int = D, alpha: float = 0.5, per_channel_shift: bool = False) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.s = nn.Parameter(torch.zeros(d if per_channel_shift else 1))
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * torch.erf(self.alpha * x + self.s) + self.bias


class HardTanhNorm(nn.Module):
    """The study's control: ``gain * hardtanh(alpha * x) + offset`` (no shift)."""

    def __init__(self, d: int = D, alpha: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.gain, self.offset = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        return self.gain * F.hardtanh(self.alpha * x) + self.offset


class ShiftedTanh(nn.Module):
    """DyT with a shift inside the tanh called ``bias_in`` and an outer bias: ``w * tanh(alpha * x + bias_in) + b``."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), 0.5))
        self.bias_in = nn.Parameter(torch.zeros(d))
        self.w, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        return self.w * torch.tanh(self.alpha * x + self.bias_in) + self.b


class SigmoidNorm(nn.Module):
    """Owns ``alpha`` and is bounded, but by a sigmoid: not a member of the family satmon counts."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.alpha, self.weight = nn.Parameter(torch.full((1,), 0.5)), nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * torch.sigmoid(self.alpha * x)


# ----------------------------------------------------------------------------- channels-first normalisers
class PermuteLayerNorm(nn.Module):
    """ConvNeXt-style code: ``(B, C, H, W)`` permuted, normalised over C, permuted back (truth: layernorm, axis 1)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))
        self.c = c

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W)
        x = x.permute(0, 2, 3, 1)  # (B, H, W, C)
        x = F.layer_norm(x, (self.c,), self.weight, self.bias, 1e-6)
        return x.permute(0, 3, 1, 2)  # (B, C, H, W)


class MeanOverChannels(nn.Module):
    """ConvNeXt's own channels-first LayerNorm: statistics over dim 1, gain and bias ``[:, None, None]``."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c)), 1e-6

    def forward(self, x: Tensor) -> Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNet(nn.Module):
    """Conv stem -> channels-first norm -> conv -> channels-first norm: every norm reads (B, C, H, W)."""

    def __init__(self, c: int = 8, norm: type[nn.Module] = PermuteLayerNorm) -> None:
        super().__init__()
        self.stem, self.n1 = nn.Conv2d(3, c, 3, padding=1), norm(c)
        self.conv, self.n2 = nn.Conv2d(c, c, 3, padding=1), norm(c)

    def forward(self, x: Tensor) -> Tensor:
        return self.n2(self.conv(F.gelu(self.n1(self.stem(x)))))


# ----------------------------------------------------------------------------- blocks
class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.o(torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v)


class SwiGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(D, H), nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ChunkedGLU(nn.Module):
    """A fused gate-up projection chunked in two and multiplied, under names no rule knows (``w_in``/``w_out``)."""

    def __init__(self) -> None:
        super().__init__()
        self.w_in, self.w_out = nn.Linear(D, 2 * H), nn.Linear(H, D)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.w_in(x).chunk(2, dim=-1)
        return self.w_out(F.gelu(a) * b)


class PostNormBlock(nn.Module):
    """``h = x + norm_a(attn(x)); out = h + norm_f(mlp(h))``: no norm feeds the gated MLP
    directly (truth: not gated)."""

    def __init__(self, norm: type[nn.Module]) -> None:
        super().__init__()
        self.attn, self.norm_a, self.mlp, self.norm_f = Attention(), norm(D), SwiGLU(), norm(D)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.norm_a(self.attn(x))
        return h + self.norm_f(self.mlp(h))


class PreNormBlock(nn.Module):
    """``x + attn(norm_1(x))``, then ``x + mlp(norm_2(x))`` (truth: norm_2 feeds the MLP; norm_1 attention)."""

    def __init__(self, norm: type[nn.Module], mlp: type[nn.Module] = SwiGLU) -> None:
        super().__init__()
        self.norm_1, self.norm_2, self.attn, self.mlp = norm(D), norm(D), Attention(), mlp()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class ParallelBlock(nn.Module):
    """GPT-NeoX parallel residual: ``x + attn(ln_a(x)) + mlp(ln_m(x))`` (truth: ln_m feeds the gated MLP)."""

    def __init__(self, norm: type[nn.Module]) -> None:
        super().__init__()
        self.ln_a, self.ln_m, self.attn, self.mlp = norm(D), norm(D), Attention(), SwiGLU()

    def forward(self, x: Tensor) -> Tensor:
        return x + self.attn(self.ln_a(x)) + self.mlp(self.ln_m(x))


class SharedNormBlock(nn.Module):
    """GPT-J / PaLM: one norm feeds attention and the gated MLP (through dropout and a cast)."""

    def __init__(self, norm: type[nn.Module]) -> None:
        super().__init__()
        self.ln, self.attn, self.mlp, self.drop = norm(D), Attention(), SwiGLU(), nn.Dropout(0.1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.drop(self.ln(x)).to(x.dtype)
        return x + self.attn(h) + self.mlp(h)


class Stack(nn.Module):
    """``n`` blocks over ``(B, T, D)`` inputs, then a final norm ``norm``."""

    def __init__(self, block, n: int = 2, norm: type[nn.Module] | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(n))
        self.norm = norm(D) if norm is not None else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        for b in self.blocks:
            x = b(x)
        return self.norm(x)
