"""Third-party look-alikes, written the way other projects write them (never satmon's classes).

Shared by the tests: discovery, conversion, the probe and gated-MLP detection must work on these
as they are, so nothing here may subclass or name-match satmon's own modules.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


# ----------------------------------------------------------------------------- norms
class LlamaRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, as transformers writes it (normalises in float32)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaStyleRMSNorm(nn.Module):
    """Gemma's parametrisation: ``x_hat * (1 + weight)`` with ``weight`` initialised to zero."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class SkewedLayerNorm(nn.Module):
    """Called a LayerNorm, but its output is not ``g * normalize(x) + b``: no affine map to read."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x_hat = F.layer_norm(x, x.shape[-1:])
        return self.weight * x_hat + 0.3 * x_hat.pow(2)


# ----------------------------------------------------------------------------- DyT written by others
class DynamicTanh(nn.Module):
    """The DyT paper's official class, written out (``torch.tanh`` in forward)."""

    def __init__(self, normalized_shape: int, channels_last: bool = True, alpha_init_value: float = 0.5) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.alpha = nn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x: Tensor) -> Tensor:
        x = torch.tanh(self.alpha * x)
        if self.channels_last:
            return x * self.weight + self.bias
        return x * self.weight[:, None, None] + self.bias[:, None, None]


class SquashNorm(nn.Module):
    """A DyT whose tanh is an ``nn.Tanh()`` submodule and whose name says nothing of tanh."""

    def __init__(self, dim: int, alpha: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.squash = nn.Tanh()
        self.gain = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.gain * self.squash(self.alpha * x) + self.shift


class ScaledThing(nn.Module):
    """Owns ``alpha`` but is not tanh-bounded: must never be taken for DyT."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor) -> Tensor:
        return self.alpha * x


# ----------------------------------------------------------------------------- user models with unusual names
class OddGatedBlock(nn.Module):
    """A SwiGLU block whose names say nothing: norms ``pre``/``post``, projections ``proj_g/proj_u/proj_d``."""

    def __init__(self, d: int, hidden: int, norm: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.pre, self.mix = norm(d), nn.Linear(d, d)
        self.post = norm(d)
        self.proj_g, self.proj_u, self.proj_d = nn.Linear(d, hidden), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mix(self.pre(x))
        h = self.post(x)
        return x + self.proj_d(F.silu(self.proj_g(h)) * self.proj_u(h))


class BilinearBlock(OddGatedBlock):
    """Like :class:`OddGatedBlock` but ``proj_g(h) * proj_u(h)`` with no activation: a
    product satmon cannot classify."""

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mix(self.pre(x))
        h = self.post(x)
        return x + self.proj_d(self.proj_g(h) * self.proj_u(h))


class SquashBlock(nn.Module):
    """A non-gated block normalised by :class:`SquashNorm` (names ``pre``/``post``, GELU MLP ``up``/``down``)."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.pre, self.mix = SquashNorm(d), nn.Linear(d, d)
        self.post, self.up, self.down = SquashNorm(d), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mix(self.pre(x))
        return x + self.down(F.gelu(self.up(self.post(x))))


class UserLM(nn.Module):
    """A token model of ``block(d, hidden)`` blocks in ``stack``, a final norm ``out_norm`` and a head."""

    def __init__(
        self,
        block: type[nn.Module],
        vocab: int = 64,
        d: int = 32,
        hidden: int = 64,
        n_layers: int = 2,
        norm: type[nn.Module] = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.stack = nn.ModuleList(block(d, hidden) for _ in range(n_layers))
        self.out_norm = norm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.embed(idx)  # (B, T, C)
        for block in self.stack:
            x = block(x)
        return self.head(self.out_norm(x))
