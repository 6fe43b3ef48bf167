"""What a copy of a normaliser computes: its outputs fitted to ``gain * normalize(x) + bias``.

The two normalisations satmon reads, by what a layer computes (never by its class):

    LayerNorm:  normalize(x) = (x - mean(x)) / sqrt(var(x) + eps)
    RMSNorm:    normalize(x) = x / sqrt(mean(x^2) + eps)

:func:`fit_normalisation` runs a copy (:mod:`satmon.model._evaluate`) on rows of different means and
scales laid out along one axis and fits both per channel; :func:`fit_grouped` does so per head (a gain
of shape ``(heads, head_dim)``). Discovery (the kind and axis of a layer) and the affine map (its gain and
bias) both read a layer through these fits; neither is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from satmon.model import _evaluate as ev

__all__ = ["NormalisationFit", "SCALE", "eps_of", "fit_grouped", "fit_normalisation", "normalize"]

SCALE = 100.0  # input scale: eps (up to ~1e-2) moves normalize(x) by < 1e-6 relative


def _probe_rows(n: int, channels: int) -> Tensor:
    """Rows with different means and scales, so LayerNorm and RMSNorm cannot both fit."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(n, channels, generator=gen, dtype=torch.float64)
    shift = torch.linspace(-3.0, 3.0, n, dtype=torch.float64)[:, None]
    scale = torch.linspace(0.5, 2.0, n, dtype=torch.float64)[:, None]
    return SCALE * scale * (z + shift)  # (N, C)


def normalize(x: Tensor, kind: str, eps: float) -> Tensor:
    """``x`` normalised over its last dimension as ``kind`` (``"layernorm"`` or ``"rmsnorm"``) does, with ``eps``.

    Example:
        >>> normalize(torch.tensor([[1.0, 3.0]]), "layernorm", 0.0).tolist()
        [[-1.0, 1.0]]
    """
    if kind == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def eps_of(module: nn.Module) -> float:
    """A normaliser's ``eps`` (or ``variance_epsilon``, ``epsilon``); 0 when it names none.

    Example:
        >>> eps_of(nn.LayerNorm(4, eps=1e-3)), eps_of(nn.Identity())
        (0.001, 0.0)
    """
    for attr in ("eps", "variance_epsilon", "epsilon"):
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


@dataclass(frozen=True, eq=False)
class NormalisationFit:
    """The better of the LayerNorm and RMSNorm fits of one evaluation (rows ``(N, C)``)."""

    kind: Literal["layernorm", "rmsnorm"]
    gain: Tensor
    bias: Tensor
    residual: float
    x_hat: Tensor
    y: Tensor


def fit_normalisation(
    module: nn.Module, layout: ev.Layout, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
) -> NormalisationFit | None:
    """Run ``module`` (already a copy) on known rows laid out as ``layout``; the fit, or ``None`` if neither fits.

    Raises whatever the module raises when it cannot take the layout.
    """
    c = layout[0][layout[1]]
    rows = _probe_rows(ev.rows_of(layout), c)
    y = ev.to_rows(ev.run(module, ev.from_rows(rows, layout).to(device, dtype)), layout[1]).to("cpu", torch.float64)
    # the input as the layer saw it
    rows = ev.to_rows(ev.from_rows(rows, layout).to(dtype), layout[1]).to(torch.float64)
    eps = eps_of(module)
    best = None
    for kind in ("layernorm", "rmsnorm"):
        x_hat = normalize(rows, kind, eps)
        g, b, res = ev.fit_per_channel(x_hat, y)
        if best is None or res < best.residual:
            best = NormalisationFit(kind, g, b, res, x_hat, y)  # type: ignore[arg-type]
    assert best is not None
    return best if best.residual <= ev.tolerance(dtype) else None


def fit_grouped(
    module: nn.Module, shape: tuple[int, ...], dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
) -> tuple[Literal["layernorm", "rmsnorm"], int] | None:
    """Run ``module`` (already a copy) on ``(2, T, *shape)`` inputs whose groups (all but the last dimension) differ in
    mean and scale, and fit ``gain * normalize(x) + bias`` per position of ``shape``, the statistics taken over the
    last dimension, then over all of ``shape``: ``(kind, dims normalised)``, or ``None`` when neither fits.

    Raises whatever the module raises on such an input.
    """
    t = next(n for n in range(8, 64) if n not in shape)
    gen = torch.Generator().manual_seed(0)
    groups = (2, t, *shape[:-1], 1)
    x = torch.randn((2, t, *shape), generator=gen, dtype=torch.float64)
    x = SCALE * (
        x * (0.5 + 1.5 * torch.rand(groups, generator=gen, dtype=torch.float64))
        + 3.0 * torch.randn(groups, generator=gen, dtype=torch.float64)
    )
    y = ev.run(module, x.to(device, dtype)).to("cpu", torch.float64)
    x = x.to(dtype).to(torch.float64)  # the input as the layer saw it
    eps, width = eps_of(module), int(torch.tensor(shape).prod())
    for dims in dict.fromkeys((1, len(shape))):
        flat = x.flatten(-dims)  # (..., the normalised values)
        for kind in ("layernorm", "rmsnorm"):
            x_hat = normalize(flat, kind, eps).reshape(x.shape)
            if ev.fit_per_channel(x_hat.reshape(-1, width), y.reshape(-1, width))[2] <= ev.tolerance(dtype):
                return kind, dims  # type: ignore[return-value]
    return None
