"""A small GPT-2-style causal language model with a switchable norm (DyT, LayerNorm, RMSNorm).

nanoGPT's layout, shrunk for CPUs: token + position embeddings, pre-norm blocks
(``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``), a final ``ln_f`` and a tied LM head.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from satmon.dyt import DyT

__all__ = ["GPTConfig", "GPT", "RMSNorm", "make_norm"]


class RMSNorm(nn.Module):
    """Root-mean-square norm, ``x / rms(x) * weight`` (kept local: discovery must not need ``nn.RMSNorm``)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(kind: str, dim: int, alpha_init: float = 2.0, bias: bool = True) -> nn.Module:
    """Build a norm layer by name: ``"dyt"``, ``"layernorm"`` or ``"rmsnorm"``.

    Example:
        >>> type(make_norm("dyt", 8)).__name__
        'DyT'
    """
    if kind == "dyt":
        return DyT(dim, alpha_init=alpha_init, bias=bias)
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim)
    raise ValueError(f"Expected norm to be one of 'dyt', 'layernorm', 'rmsnorm', got {kind!r}.")


@dataclass
class GPTConfig:
    """Hyper-parameters of :class:`GPT` (defaults: GPT-2's inits at the demo size, ~0.12M parameters;
    ``satmon demo`` sets ``emb_std=d_model ** -0.5``, ``satmon demo --stalled`` keeps the defaults)."""

    vocab_size: int = 256  # bytes
    seq_len: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    norm: Literal["dyt", "layernorm", "rmsnorm"] = "dyt"
    alpha_init: float = 2.0  # the regime study's "canonical" init
    dropout: float = 0.0
    # multiplies token + position embeddings; 1.0 is GPT-2. With embeddings at std 0.02 a DyT model
    # can stall at the unigram level; sqrt(d_model) lets it train (docs/science/regime_flip.md)
    emb_scale: float = 1.0
    # init std of the token embedding, which is also the output head (tied); 0.02 is GPT-2. At 0.02 a
    # DyT model can reach the byte frequencies only through saturated norms and stalls there;
    # d_model ** -0.5 lets it train (docs/guides/faq.md). Drawn at 0.02 and rescaled: other weights unchanged
    emb_std: float = 0.02
    # biases in every Linear and norm (GPT-2's); the regime study trains with ``bias=False`` (no bias anywhere)
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("emb_scale", "emb_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Expected {name} > 0, got {getattr(self, name)}.")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = make_norm(cfg.norm, cfg.d_model, cfg.alpha_init, cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = make_norm(cfg.norm, cfg.d_model, cfg.alpha_init, cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style LM: ``forward(idx (B, T)) -> logits (B, T, vocab)``.

    Example:
        >>> import torch
        >>> model = GPT(GPTConfig())
        >>> model(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 256])
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_f = make_norm(cfg.norm, cfg.d_model, cfg.alpha_init, cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))
        if cfg.emb_std != 0.02:
            with torch.no_grad():  # a rescale, not a new draw: the random stream and every other weight stay GPT-2's
                self.tok_emb.weight.mul_(cfg.emb_std / 0.02)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        if self.cfg.emb_scale != 1.0:
            x = x * self.cfg.emb_scale
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab)

    def config_dict(self) -> dict:
        return asdict(self.cfg)
