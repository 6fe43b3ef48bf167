"""A norm layer's effective affine map, read from what the layer computes.

A LayerNorm or RMSNorm computes ``y = gain * normalize(x) + bias``. The ``gain`` is not always the
layer's ``weight`` attribute: Gemma-style RMSNorms compute ``x_hat * (1 + weight)`` with ``weight``
initialised to zero. :func:`effective_affine` evaluates (a float64 copy of) the layer on known
inputs, fits ``gain`` and ``bias`` per channel for both normalisations, and returns the one that
fits; when the layer's own attributes reproduce the outputs (``weight``, ``1 + weight``, ones; its
``bias`` or zero) they are returned exactly, so nothing changes for layers that were already read
right.

    LayerNorm:  normalize(x) = (x - mean(x)) / sqrt(var(x) + eps)
    RMSNorm:    normalize(x) = x / sqrt(mean(x^2) + eps)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["EffectiveAffine", "effective_affine"]

AffineKind = Literal["layernorm", "rmsnorm"]

_TOL = 1e-4  # relative fit residual; layers that compute in float32 inside land near 1e-7
_SCALE = 100.0  # input scale: eps (up to ~1e-2) moves normalize(x) by < 1e-6 relative
_ROWS = 16


@dataclass(frozen=True, eq=False)
class EffectiveAffine:
    """What a norm layer multiplies and adds after normalising.

    Attributes:
        kind: the normalisation that fits the layer's outputs, ``"layernorm"`` or ``"rmsnorm"``.
        gain: the effective per-channel gain, shape ``(C,)``, float64 on the CPU.
        bias: the effective per-channel bias, shape ``(C,)``, float64 on the CPU; ``None`` when the
            layer adds nothing (no bias, or a bias that is exactly zero).
        residual: the largest fit residual relative to the largest output (0 for an exact fit).
        exact: ``True`` when ``gain``/``bias`` are the layer's own attributes (``weight``,
            ``1 + weight`` or ones; ``bias`` or zero), confirmed by the fit; ``False`` when they are
            the fitted values (within ``residual``).
        note: where the values came from, in words (e.g. ``"gain = 1 + weight"``).
    """

    kind: AffineKind
    gain: Tensor
    bias: Tensor | None
    residual: float
    exact: bool
    note: str


def _channels(module: nn.Module, dim: int | None) -> int:
    if dim is not None:
        return int(dim)
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int):
        return shape
    if isinstance(shape, (tuple, list, torch.Size)):
        if len(shape) != 1:
            raise ValueError(
                f"Expected {type(module).__name__} to normalise over one channel dimension, got normalized_shape="
                f"{tuple(shape)}. Only single-axis norms have a per-channel affine map."
            )
        return int(shape[0])
    w = getattr(module, "weight", None)
    if isinstance(w, Tensor) and w.dim() == 1:
        return w.numel()
    raise ValueError(
        f"Expected {type(module).__name__} to have `normalized_shape` or a 1-D `weight`, got neither. "
        "Pass `dim=` (the channel count) to effective_affine."
    )


def _float64_clone(module: nn.Module) -> nn.Module:
    """A float64 CPU copy that shares nothing with ``module`` and runs no hooks."""
    clone = copy.copy(module)  # shallow: the instance dict is new, its values are shared
    clone.__dict__["_parameters"] = {
        k: None if p is None else nn.Parameter(_whole(p).detach().to("cpu", _as64(p.dtype)).clone(), requires_grad=False)
        for k, p in module._parameters.items()
    }
    clone.__dict__["_buffers"] = {
        k: None if b is None else b.detach().to("cpu", _as64(b.dtype)).clone() for k, b in module._buffers.items()
    }
    clone.__dict__["_modules"] = {k: None if m is None else _float64_clone(m) for k, m in module._modules.items()}
    for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        if hooks in clone.__dict__:
            clone.__dict__[hooks] = type(clone.__dict__[hooks])()
    return clone


def _whole(t: Tensor) -> Tensor:
    """An FSDP2 parameter outside the forward is a sharded ``DTensor``: gather it (a collective every rank reaches)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def _as64(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype.is_floating_point else dtype


def _probe_inputs(channels: int) -> Tensor:
    """Rows with different means and scales, so LayerNorm and RMSNorm cannot both fit."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(_ROWS, channels, generator=gen, dtype=torch.float64)
    shift = torch.linspace(-3.0, 3.0, _ROWS, dtype=torch.float64)[:, None]
    scale = torch.linspace(0.5, 2.0, _ROWS, dtype=torch.float64)[:, None]
    return _SCALE * scale * (z + shift)  # (N, C)


def _normalize(x: Tensor, kind: AffineKind, eps: float) -> Tensor:
    if kind == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _fit(x_hat: Tensor, y: Tensor) -> tuple[Tensor, Tensor, float]:
    """Per-channel least squares ``y = g * x_hat + b``; returns ``g, b, relative residual``."""
    xm, ym = x_hat.mean(0), y.mean(0)
    dx = x_hat - xm
    var = dx.pow(2).sum(0)
    g = (dx * (y - ym)).sum(0) / var.clamp_min(1e-300)
    b = ym - g * xm
    return g, b, _residual(y, g * x_hat + b) if bool((var > 0).all()) else float("inf")


def _residual(y: Tensor, fitted: Tensor) -> float:
    return float((y - fitted).abs().max() / y.abs().max().clamp_min(1e-300))


def _run(module: nn.Module, x: Tensor) -> Tensor:
    clone = _float64_clone(module)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        try:
            y = clone.forward(x)
        except Exception:  # some layers want (B, T, C)
            y = clone.forward(x[None])[0]
    if not isinstance(y, Tensor) or y.shape != x.shape:
        raise TypeError(f"returned {type(y).__name__} of shape {getattr(y, 'shape', None)}, not {tuple(x.shape)}")
    return y.to(torch.float64)


def _attribute_candidates(module: nn.Module, channels: int) -> list[tuple[str, Tensor, Tensor | None]]:
    w, b = (_whole(v) if isinstance(v, Tensor) else v for v in (getattr(module, "weight", None), getattr(module, "bias", None)))
    bias = b.detach().to("cpu", torch.float64) if isinstance(b, Tensor) and b.shape == (channels,) else None
    if isinstance(w, Tensor) and w.shape == (channels,):
        w_cpu = w.detach().to("cpu")
        w_up = w_cpu if w_cpu.dtype in (torch.float32, torch.float64) else w_cpu.float()
        # 1 + weight rounded as Gemma-style forwards compute it (float32 or wider), then widened
        return [("gain = weight", w_cpu.to(torch.float64), bias), ("gain = 1 + weight", (1.0 + w_up).to(torch.float64), bias)]
    return [("gain = 1 (no weight)", torch.ones(channels, dtype=torch.float64), bias)]


def effective_affine(module: nn.Module, dim: int | None = None) -> EffectiveAffine:
    """Resolve a norm layer's effective gain and bias from what the layer computes.

    The layer is evaluated (a float64 CPU copy, no hooks, no grad; the module itself is never
    changed) on known inputs; ``gain`` and ``bias`` are fitted per channel for both LayerNorm and
    RMSNorm normalisations and the better fit is kept. When the layer's own ``weight`` (or
    ``1 + weight``, or ones without a weight) and ``bias`` reproduce its outputs, those exact values
    are returned.

    Args:
        module: a LayerNorm/RMSNorm-like layer normalising over its last dimension.
        dim: the channel count, for layers with neither ``normalized_shape`` nor a 1-D ``weight``.

    Returns:
        An :class:`EffectiveAffine`.

    Raises:
        ValueError: the layer's outputs fit neither normalisation (relative residual above 1e-4),
            it cannot run on a float64 CPU copy, or its channel count is unknown. The message names
            the layer class and what to do.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> ln = nn.LayerNorm(4)
        >>> _ = torch.nn.init.constant_(ln.weight, 3.0)
        >>> a = effective_affine(ln)
        >>> a.kind, a.gain.tolist(), a.bias, a.exact
        ('layernorm', [3.0, 3.0, 3.0, 3.0], None, True)
    """
    name = type(module).__name__
    channels = _channels(module, dim)
    x = _probe_inputs(channels)
    try:
        y = _run(module, x)
    except Exception as err:
        raise ValueError(
            f"Expected {name} to run on a float64 CPU copy of itself to read its affine map, got "
            f"{type(err).__name__}: {err}. Exclude this layer (exclude=...) or convert it by hand."
        ) from err
    eps = _eps(module)
    fits = {}
    for kind in ("layernorm", "rmsnorm"):
        x_hat = _normalize(x, kind, eps)
        fits[kind] = (x_hat, *_fit(x_hat, y))
    kind = min(fits, key=lambda k: fits[k][3])
    x_hat, gain, bias, residual = fits[kind]
    if not residual <= _TOL:
        raise ValueError(
            f"Expected {name} to compute gain * normalize(x) + bias (LayerNorm or RMSNorm over the last "
            f"dimension), got a best fit residual of {residual:.2e} (> {_TOL:.0e}). satmon cannot determine this "
            "layer's affine map: exclude it (exclude=...), or copy its parameters yourself."
        )
    for note, g_attr, b_attr in _attribute_candidates(module, channels):
        b_eff = b_attr if b_attr is not None else torch.zeros_like(g_attr)
        res = _residual(y, g_attr * x_hat + b_eff)
        if res <= max(_TOL, 10 * residual):
            has_bias = b_attr is not None and bool(b_attr.ne(0).any())
            return EffectiveAffine(kind, g_attr, b_attr if has_bias else None, res, True, note + (", bias" if has_bias else ""))
    scale = float(y.abs().max())
    has_bias = bool((bias.abs() > _TOL * max(scale, 1e-300)).any())
    return EffectiveAffine(kind, gain, bias if has_bias else None, residual, False,
                           "fitted: the layer's attributes do not reproduce its outputs")


def _eps(module: nn.Module) -> float:
    for attr in ("eps", "variance_epsilon", "epsilon"):
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0
