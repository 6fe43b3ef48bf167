"""A small LLaMA-style causal LM: RoPE attention, SwiGLU (or GELU) MLP, DyT/RMSNorm/LayerNorm.

Each block is pre-norm: ``x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))``, then a
final ``norm_f`` and an untied ``lm_head``. With ``norm="dyt"`` every block norm is a bias-free
:class:`satmon.DyT` with the LLaMA inits of the DyT paper (0.8 / 0.2 for pre-attention / pre-MLP) and
the final norm is RMSNorm by default: with ``final_norm="dyt"`` (the DyT paper's layout, init 0.2)
this model is trapped at the byte-unigram level at ``satmon demo --arch llama``'s settings (the final
DyT saturates on an offset shared by every token by the end of the warm-up, and the gradient below the head
is exactly 0, or nearly; data/llama_final_norm.json, docs/guides/faq.md). ``"layernorm"`` has no bias
either and ``"rmsnorm"`` is satmon's own RMSNorm (not ``torch.nn.RMSNorm``), all built by
:func:`satmon.demos.gpt.make_norm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the GPT model's norms: DyT, LayerNorm, satmon's own RMSNorm
from satmon.demos.gpt import (
    make_norm,
)

__all__ = ["LlamaConfig", "LlamaLM"]

_NORMS = ("dyt", "rmsnorm", "layernorm")
_MLPS = ("swiglu", "gelu")


@dataclass
class LlamaConfig:
    """Hyper-parameters of :class:`LlamaLM`.

    ``mlp_hidden=None`` picks parameter-matched widths: ``8/3 * d_model`` rounded up to a
    multiple of 8 for SwiGLU (three matrices) and ``4 * d_model`` for GELU (two matrices).
    ``alpha_init``, when set, overrides the three per-position DyT inits. ``final_norm`` is the norm
    before the head: ``None`` (the default) is RMSNorm under DyT blocks and the blocks' own norm
    otherwise; ``"dyt"`` under DyT blocks is the DyT paper's layout, which traps this model at its
    demo settings (module docstring).
    """

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 128
    mlp: str = "swiglu"
    norm: str = "dyt"
    final_norm: str | None = None
    alpha_init_attn: float = 0.8
    alpha_init_mlp: float = 0.2
    alpha_init_final: float = 0.2
    alpha_init: float | None = None
    mlp_hidden: int | None = None
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.norm not in _NORMS:
            raise ValueError(f"Expected `norm` in {_NORMS}, got {self.norm!r}.")
        if self.final_norm is None:
            self.final_norm = "rmsnorm" if self.norm == "dyt" else self.norm
        if self.final_norm not in _NORMS:
            raise ValueError(f"Expected `final_norm` in {_NORMS} or None (the default), got {self.final_norm!r}.")
        if self.mlp not in _MLPS:
            raise ValueError(f"Expected `mlp` in {_MLPS}, got {self.mlp!r}.")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"Expected `d_model` divisible by `n_heads` with an even head size (RoPE rotates pairs),"
                f" got d_model={self.d_model}, n_heads={self.n_heads}."
            )
        if self.alpha_init is not None:
            self.alpha_init_attn = self.alpha_init_mlp = self.alpha_init_final = float(self.alpha_init)
        if self.mlp_hidden is None:
            self.mlp_hidden = 8 * math.ceil(8 * self.d_model / 3 / 8) if self.mlp == "swiglu" else 4 * self.d_model


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention with rotary position embeddings (RoPE)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        inv_freq = cfg.rope_base ** (-torch.arange(0, self.head_dim, 2).float() / self.head_dim)  # (hs/2,)
        angles = torch.outer(torch.arange(cfg.seq_len).float(), inv_freq)  # (T_max, hs/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T_max, hs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _heads(self, t: Tensor) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (self._heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))  # (B, nh, T, hs)
        cos, sin = self.cos[:T].to(q.dtype), self.sin[:T].to(q.dtype)  # (T, hs)
        q = q * cos + _rotate_half(q) * sin  # (B, nh, T, hs)
        k = k * cos + _rotate_half(k) * sin  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class SwiGLU(nn.Module):
    """Gated MLP ``down_proj(silu(gate_proj(h)) * up_proj(h))`` (HF LLaMA names)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))  # (B, T, C)


class GeluMLP(nn.Module):
    """Non-gated MLP ``fc_out(gelu(fc_in(h)))``: the study's control for SwiGLU."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, hidden, bias=False)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(hidden, d_model, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        return self.fc_out(self.act(self.fc_in(h)))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.alpha_init_attn, bias=False)
        self.attn = Attention(cfg)
        self.mlp_norm = make_norm(cfg.norm, cfg.d_model, cfg.alpha_init_mlp, bias=False)
        self.mlp = (SwiGLU if cfg.mlp == "swiglu" else GeluMLP)(cfg.d_model, cfg.mlp_hidden)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x))  # (B, T, C)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, C)


class LlamaLM(nn.Module):
    """LLaMA-style causal language model: ``idx (B, T) -> logits (B, T, vocab_size)``.

    Args:
        config: a :class:`LlamaConfig`; keyword arguments build one when it is omitted.

    Example:
        >>> import torch
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8)
        >>> tuple(model(torch.zeros(3, 8, dtype=torch.long)).shape)
        (3, 8, 32)
        >>> round(model.blocks[0].attn_norm.alpha.item(), 2), type(model.norm_f).__name__
        (0.8, 'RMSNorm')
        >>> round(LlamaLM(vocab_size=32, d_model=16, n_heads=2, seq_len=8, final_norm="dyt").norm_f.alpha.item(), 2)
        0.2
    """

    def __init__(self, config: LlamaConfig | None = None, **kwargs) -> None:
        super().__init__()
        if config is not None and kwargs:
            raise ValueError(f"Expected either `config` or keyword arguments, got both (kwargs: {sorted(kwargs)}).")
        self.config = cfg = config if config is not None else LlamaConfig(**kwargs)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = make_norm(cfg.final_norm, cfg.d_model, cfg.alpha_init_final, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        residual_out = ("o_proj.weight", "down_proj.weight", "fc_out.weight")  # GPT-2 scaled init
        for name, p in self.named_parameters():
            if p.dim() == 2:  # embeddings and projections; norms keep their own init
                std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(residual_out) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: Tensor) -> Tensor:
        if idx.dim() != 2 or idx.shape[1] > self.config.seq_len:
            raise ValueError(
                f"Expected token ids of shape (B, T) with T <= seq_len={self.config.seq_len}, got {tuple(idx.shape)}."
                " Crop the sequence or build the model with a larger `seq_len`."
            )
        x = self.tok_emb(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        return self.lm_head(self.norm_f(x))  # (B, T, vocab_size)
