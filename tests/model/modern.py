"""Modern blocks written from scratch, the way their projects write them (no download, never satmon's classes):
mixture-of-experts layers whose expert weights and biases are gathered by the router's choice, fused GLUs on raw
parameters, QK-norm with rotary tables made several ways, reordered post-norm, per-head norms, gated and
parameterless norms. Each docstring states the truth the tests check against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

D, H, E, HEADS = 16, 32, 4, 4  # grouped_mm on the CPU wants rows of a multiple of 16 bytes: widths of 4 floats and up
HD = D // HEADS


# ----------------------------------------------------------------------------- experts gathered by the router
class GatheredExperts(nn.Module):
    """Top-1 experts as 3-D parameters: ``y = bmm(x, W[e]) (+ b[e]); g, u = y.chunk(2); down(silu(g) * u)``.

    ``gather`` picks the rows as ``W[e]``, ``W.index_select(0, e)`` or ``F.embedding(e, W)``. Truth: a gated MLP whose
    gate and value projections read the block norm's output (the issue's minimal form, bias or not)."""

    def __init__(self, bias: bool = True, gather: str = "index") -> None:
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.w = nn.Parameter(torch.randn(E, D, 2 * H) / 4)
        self.b = nn.Parameter(torch.randn(E, 2 * H) / 4) if bias else None
        self.down = nn.Parameter(torch.randn(E, H, D) / 4)
        self.gather = gather

    def pick(self, table: Tensor, e: Tensor) -> Tensor:
        if self.gather == "index_select":
            return table.index_select(0, e)
        if self.gather == "embedding":
            return F.embedding(e, table.flatten(1)).view(e.shape[0], *table.shape[1:])
        return table[e]

    def forward(self, h: Tensor) -> Tensor:  # (N, D)
        e = self.router(h).argmax(-1)  # (N,) the router's choice
        y = torch.bmm(h.unsqueeze(1), self.pick(self.w, e)).squeeze(1)  # (N, 2H)
        if self.b is not None:
            y = y + self.pick(self.b, e)
        g, u = y.chunk(2, dim=-1)
        return torch.bmm((F.silu(g) * u).unsqueeze(1), self.pick(self.down, e)).squeeze(1)


class GroupedExperts(nn.Module):
    """transformers' default expert path, written out: rows sorted by expert, one ``grouped_mm``, the bias gathered
    per row and added in place, GPT-OSS's interleaved halves and its ``(up + 1) * gate * sigmoid(1.702 gate)``.
    Truth: gated (the gate statistics are no module's output)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.w = nn.Parameter(torch.randn(E, D, 2 * H) / 4)
        self.b = nn.Parameter(torch.randn(E, 2 * H) / 4)
        self.down = nn.Parameter(torch.randn(E, H, D) / 4)

    def forward(self, h: Tensor) -> Tensor:  # (N, D)
        e = self.router(h).argmax(-1)
        e_sorted, order = torch.sort(e)
        offs = torch.cumsum(torch.bincount(e_sorted, minlength=E), 0).to(torch.int32)
        gate_up = F.grouped_mm(h[order], self.w, offs=offs)  # (N, 2H)
        gate_up.add_(self.b[e_sorted])
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        glu = gate * torch.sigmoid(gate * 1.702)
        out = F.grouped_mm(((up + 1) * glu).contiguous(), self.down, offs=offs)
        return torch.empty_like(out).index_copy_(0, order, out)


class LoopExperts(nn.Module):
    """Mixtral's eager loop, scaled by the router's weight after the down projection. Truth: gated."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(SwiGLU() for _ in range(E))

    def forward(self, h: Tensor) -> Tensor:
        weights = self.router(h).softmax(-1)
        top, e = weights.max(-1)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            rows = torch.where(e == i)[0]
            if rows.numel():
                out.index_add_(0, rows, expert(h[rows]) * top[rows, None])
        return out


class SwiGLU(nn.Module):
    """``w2(silu(w1(x)) * w3(x))``. Truth: gated."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = (
            nn.Linear(D, H, bias=False),
            nn.Linear(H, D, bias=False),
            nn.Linear(D, H, bias=False),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class RawGLU(nn.Module):
    """x-transformers' ``ff_glu`` on raw ``(in, out)`` parameters: ``x, gate = (x @ W).chunk(2);
    (x * gelu(gate)) @ W_out``. Truth: gated, the second half gates."""

    def __init__(self) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(D, 2 * H) / 4)
        self.w_out = nn.Parameter(torch.randn(H, D) / 4)

    def forward(self, x: Tensor) -> Tensor:
        x, gate = (x @ self.w_in).chunk(2, dim=-1)
        return (x * F.gelu(gate)) @ self.w_out


class GeluMLP(nn.Module):
    """GPT-2's MLP. Truth: not gated."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


# ----------------------------------------------------------------------------- attention with QK-norm and RoPE
def rotate_half(t: Tensor) -> Tensor:
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RopeAttention(nn.Module):
    """Attention with QK-norm before the rotary embedding, its cos/sin tables made as ``rope`` says: from a buffer
    (``"buffer"``), cast with ``type_as(q)`` or ``.to(q)`` (whose *values* do not depend on ``q``), from
    ``q.new_tensor``, or as complex ``freqs_cis`` (Meta's Llama). ``qk`` is ``"whole"`` (OLMo2: one norm over all
    heads), ``"head"`` (Qwen3: one per head) or ``None``. Truth: the q/k norms feed attention, nothing else."""

    def __init__(self, norm: type[nn.Module], rope: str = "buffer", qk: str | None = "whole") -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        width = D if qk == "whole" else HD
        self.q_norm, self.k_norm = (norm(width), norm(width)) if qk else (None, None)
        self.qk_axes, self.rope_kind = qk, rope
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, HD, 2).float() / HD), persistent=False)

    def rope(self, t: Tensor) -> Tensor:  # (B, heads, T, hd)
        n = t.shape[-2]
        if self.rope_kind == "complex":
            freqs = torch.outer(torch.arange(n, device=t.device).float(), self.inv_freq)
            cis = torch.polar(torch.ones_like(freqs), freqs)  # (T, hd/2)
            z = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
            return torch.view_as_real(z * cis).flatten(-2).type_as(t)
        if self.rope_kind == "type_as":
            pos = torch.arange(n, device=t.device).type_as(t)
            freqs = torch.outer(pos, self.inv_freq.type_as(t))
        elif self.rope_kind == "to":
            freqs = torch.outer(torch.arange(n).to(t), self.inv_freq.to(t))
        elif self.rope_kind == "new":
            freqs = torch.outer(t.new_tensor(list(range(n))), self.inv_freq)
        else:
            freqs = torch.outer(torch.arange(n, device=t.device).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(t), emb.sin().to(t)
        return t * cos + rotate_half(t) * sin

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D)
        b, n, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.qk_axes == "whole":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(b, n, HEADS, HD) for t in (q, k, v))
        if self.qk_axes == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = self.rope(q), self.rope(k)
        att = (q @ k.transpose(-1, -2) / math.sqrt(HD)).softmax(-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, n, D))


# ----------------------------------------------------------------------------- blocks
class PreNorm(nn.Module):
    """``x + attn(n1(x))``, then ``x + mlp(n2(x))``. Truth: n2 feeds the MLP (gated when the MLP is), n1 attention."""

    def __init__(self, norm: type[nn.Module], mlp: nn.Module, rope: str = "buffer", qk: str | None = "whole") -> None:
        super().__init__()
        self.n1, self.attn, self.n2, self.mlp = norm(D), RopeAttention(norm, rope, qk), norm(D), mlp

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.n1(x))
        h = self.n2(x)
        return x + self.mlp(h.reshape(-1, D)).view(x.shape)


class ReorderedPostNorm(nn.Module):
    """OLMo2's block: ``h = x + post_attn(attn(x))``, ``x + post_ff(mlp(h))`` with QK-norm and RoPE in the attention.
    Truth: no norm feeds the gated MLP (it reads an addition); the q/k norms feed attention."""

    def __init__(self, norm: type[nn.Module], rope: str = "buffer") -> None:
        super().__init__()
        self.attn, self.post_attn, self.mlp, self.post_ff = RopeAttention(norm, rope), norm(D), SwiGLU(), norm(D)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.post_attn(self.attn(x))
        return h + self.post_ff(self.mlp(h))


class LM(nn.Module):
    """Token embedding, blocks, a final norm."""

    def __init__(self, block, n: int = 2, norm: type[nn.Module] = nn.LayerNorm, vocab: int = 50) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, D)
        self.blocks = nn.ModuleList(block() for _ in range(n))
        self.norm = norm(D)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.norm(x)


# ----------------------------------------------------------------------------- norms of other shapes and signatures
class PerHeadLayerNorm(nn.Module):
    """Cohere's QK-norm: statistics over ``head_dim``, a gain of shape ``(heads, head_dim)``.
    Truth: layernorm, per head."""

    def __init__(self, shape: tuple[int, int] = (HEADS, HD), eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(shape))
        self.variance_epsilon = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        mean = x32.mean(-1, keepdim=True)
        var = (x32 - mean).pow(2).mean(-1, keepdim=True)
        return (self.weight.float() * (x32 - mean) * torch.rsqrt(var + self.variance_epsilon)).to(x.dtype)


class ChameleonLayerNorm(nn.LayerNorm):
    """Chameleon's QK-norm: an ``nn.LayerNorm`` subclass whose gain and bias are ``(heads, head_dim)`` and whose
    statistics are over ``head_dim`` only. Truth: layernorm, per head, with a bias."""

    def __init__(self, shape: tuple[int, int] = (HEADS, HD)) -> None:
        super().__init__(shape)
        self.normalized_shape = (shape[-1],)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, None, None, 1e-5) * self.weight + self.bias


class PerHeadRMSNorm(nn.Module):
    """RMSNorm over ``head_dim`` with a gain per head and channel. Truth: rmsnorm, per head."""

    def __init__(self, shape: tuple[int, int] = (HEADS, HD)) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(shape))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class JointNorm(nn.Module):
    """A LayerNorm over both trailing dimensions with a ``(heads, head_dim)`` gain. Truth:
    layernorm over 2 dimensions."""

    def __init__(self, shape: tuple[int, int] = (HEADS, HD)) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(shape)), 1e-5

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, None, self.eps)


class MixingNorm(nn.Module):
    """Named like a norm, a 2-D parameter, but it mixes the channels (``x @ W`` after normalising): no
    normaliser's affine map. Truth: listed as undetermined, with the reason."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.eye(HD) + 0.1), 1e-5

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:]) @ self.weight


class GatedRMSNorm(nn.Module):
    """Mamba2's gated norm, ``norm(y, gate) = w * rms(y * silu(gate))``; called with one input it is an RMSNorm."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), 1e-6

    def forward(self, hidden_states: Tensor, gate: Tensor | None = None) -> Tensor:
        if gate is not None:
            hidden_states = hidden_states * F.silu(gate)
        return self.weight * hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)


class L2Norm(nn.Module):
    """Llama4's parameterless QK-norm: ``x * rsqrt(mean(x^2) + eps)``. Truth: an RMSNorm of no fixed width."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class SSMMixer(nn.Module):
    """A Mamba2-like mixer: ``y, z = in_proj(x)``, then ``out_proj(norm(y, z))`` (the gated norm), with a parameterless
    QK-style L2 norm on a side path. Truth: ``norm`` takes two inputs; ``l2`` has no width; neither can become a DyT."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj, self.out_proj = nn.Linear(D, 2 * D), nn.Linear(D, D)
        self.norm, self.l2 = GatedRMSNorm(D), L2Norm()

    def forward(self, x: Tensor) -> Tensor:
        y, z = self.in_proj(x).chunk(2, dim=-1)
        return self.out_proj(self.norm(y, z)) + self.l2(x)


class SSMBlock(nn.Module):
    """``x + mixer(pre(x))``."""

    def __init__(self) -> None:
        super().__init__()
        self.pre, self.mixer = nn.RMSNorm(D), SSMMixer()

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mixer(self.pre(x))
