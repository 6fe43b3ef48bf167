"""A normaliser's effective affine map, read from what the layer computes, along the axis it normalises.

A LayerNorm or RMSNorm computes ``y = gain * normalize(x) + bias``. The ``gain`` is not always the
layer's ``weight`` attribute: Gemma-style RMSNorms compute ``x_hat * (1 + weight)`` with ``weight``
initialised to zero, others call it ``g``, ``scale`` or ``gamma``. :func:`effective_affine`
evaluates (a float64 copy of) the layer on known inputs laid out along its channel axis (last, or
``(B, C, H, W)`` for a channels-first layer), fits ``gain`` and ``bias`` per channel for both
normalisations, and returns the one that fits; when one of the layer's own parameters (or ``1 +``
it, or ones) and another (or zero) reproduce the outputs, those exact values are returned. A
point-wise layer (DyT, Derf, HardTanh) reads as ``weight * f(alpha * x + s) + bias`` the same way.

    LayerNorm:  normalize(x) = (x - mean(x)) / sqrt(var(x) + eps)
    RMSNorm:    normalize(x) = x / sqrt(mean(x^2) + eps)

The fits are :mod:`satmon.model.fits` (shared with discovery); the kind and axis a layer is read along
come from discovery (:func:`satmon.model.discovery.read_module`), which imports nothing of this module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor, nn

from satmon.functional.saturation import pointwise_function
from satmon.model import _evaluate as ev
from satmon.model.discovery import norm_channels, read_module
from satmon.model.fits import fit_normalisation

__all__ = ["EffectiveAffine", "effective_affine"]

AffineKind = Literal["layernorm", "rmsnorm", "dyt"]

_TOL = 1e-4  # relative fit residual; layers that compute in float32 inside land near 1e-7


@dataclass(frozen=True, eq=False)
class EffectiveAffine:
    """What a normaliser multiplies and adds after normalising (or after its point-wise function).

    Attributes:
        kind: the form that fits the layer's outputs, ``"layernorm"``, ``"rmsnorm"`` or ``"dyt"``.
        gain: the effective per-channel gain, shape ``(C,)``, float64 on the CPU.
        bias: the effective per-channel bias, shape ``(C,)``, float64 on the CPU; ``None`` when the
            layer adds nothing (no bias, or a bias that is exactly zero).
        residual: the largest fit residual relative to the largest output (0 for an exact fit).
        exact: ``True`` when ``gain``/``bias`` are the layer's own parameters (``p``, ``1 + p`` or
            ones; another parameter or zero), confirmed by the fit; ``False`` when they are the
            fitted values (within ``residual``).
        note: where the values came from, in words (e.g. ``"gain = 1 + weight"``).
        axis: the input dimension the layer normalises (``-1``, or ``1`` channels-first).
    """

    kind: AffineKind
    gain: Tensor
    bias: Tensor | None
    residual: float
    exact: bool
    note: str
    axis: int = -1


def _layout(channels: int, axis: int) -> ev.Layout:
    return next(l for l in ev.layouts(channels) if l[1] == axis)


def _own_vectors(module: nn.Module, channels: int) -> dict[str, Tensor]:
    out = {}
    for n, p in module.named_parameters(recurse=False):
        if p.numel() == channels and p.is_floating_point():
            out[n] = ev.whole(p).detach().to("cpu").reshape(channels)
    return out


def _widened(p: Tensor) -> Tensor:
    return p if p.dtype in (torch.float32, torch.float64) else p.float()


def _exact(
    module: nn.Module, channels: int, t: Tensor, y: Tensor, tol: float
) -> tuple[str, Tensor, Tensor | None, float] | None:
    """The layer's own parameters that reproduce ``y = gain * t + bias`` (rows), if any."""
    vectors = _own_vectors(module, channels)
    gains = [(f"gain = {n}", p.to(torch.float64)) for n, p in vectors.items()]
    # 1 + weight rounded as Gemma-style forwards compute it (float32 or wider), then widened
    gains += [(f"gain = 1 + {n}", (1.0 + _widened(p)).to(torch.float64)) for n, p in vectors.items()]
    gains.append(("gain = 1 (no weight)", torch.ones(channels, dtype=torch.float64)))
    biases: list[tuple[str, Tensor | None]] = [(n, p.to(torch.float64)) for n, p in vectors.items()] + [("", None)]
    for note, g in gains:
        for bname, b in biases:
            if bname and note.endswith(f" {bname}"):
                continue
            fitted = g * t + (b if b is not None else 0.0)
            res = ev.residual(y, fitted)
            if res <= tol:
                has_bias = b is not None and bool(b.ne(0).any())
                return note + (f", bias = {bname}" if has_bias else ""), g, b if has_bias else None, res
    return None


def effective_affine(module: nn.Module, dim: int | None = None, axis: int | None = None) -> EffectiveAffine:
    """Resolve a normaliser's effective gain and bias from what the layer computes.

    The layer is evaluated (a float64 CPU copy, no hooks, no grad; the module itself is never
    changed) on known inputs along its channel axis; ``gain`` and ``bias`` are fitted per channel
    for both LayerNorm and RMSNorm normalisations (or, for a point-wise layer, against
    ``f(alpha * x + s)`` with its own ``alpha`` and shift) and the better fit is kept. When the
    layer's own parameters (``p``, ``1 + p`` or ones; another or zero) reproduce its outputs, those
    exact values are returned.

    Args:
        module: a normaliser.
        dim: the channel count, for layers with neither a vector parameter nor ``normalized_shape``.
        axis: the channel axis (``-1`` or ``1``); default: the axis discovery reads for the layer.

    Returns:
        An :class:`EffectiveAffine`. For a layer on the meta device (a model built under ``torch.device("meta")``)
        the form (kind, which parameter is the gain, whether one adds a bias) is read on a CPU twin whose
        parameters are drawn, and ``gain``/``bias`` are meta tensors: their values are the model's once loaded.

    Raises:
        ValueError: the layer's outputs fit no form (relative residual above 1e-4), it cannot run on
            a float64 CPU copy, or its channel count is unknown. The message names the layer class
            and what to do.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> ln = nn.LayerNorm(4)
        >>> _ = torch.nn.init.constant_(ln.weight, 3.0)
        >>> a = effective_affine(ln)
        >>> a.kind, a.gain.tolist(), a.bias, a.exact
        ('layernorm', [3.0, 3.0, 3.0, 3.0], None, True)
    """
    with ev.on_host():  # the test inputs hold values, also under torch.device("meta")
        if ev.on_meta(module):
            return _on_meta(module, dim, axis)
        return _effective_affine(module, dim, axis)


def _on_meta(module: nn.Module, dim: int | None, axis: int | None) -> EffectiveAffine:
    """A layer on the meta device: its form read on a CPU twin whose parameters are drawn; values are meta tensors."""
    params = tuple(n for n, p in module.named_parameters(recurse=False) if p.is_floating_point())
    try:
        twin = ev.clone(module, randomize=params)
    except ev.OnMeta as err:
        raise ValueError(
            f"Expected {type(module).__name__} on the meta device to need only its parameters' "
            "shapes to read its affine "
            f"map, got {err}. Build the model on the CPU to copy its affine map, or convert without copy_affine."
        ) from err
    found = _effective_affine(twin, dim, axis)

    def meta(t: Tensor | None) -> Tensor | None:
        return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")

    return replace(
        found,
        gain=meta(found.gain),
        bias=meta(found.bias),
        note=f"{found.note} (read on a CPU twin of a layer on the meta device, its parameters drawn: the form "
        "is the layer's, the values are meta tensors until the model's are loaded)",
    )


def _effective_affine(module: nn.Module, dim: int | None, axis: int | None) -> EffectiveAffine:
    name = type(module).__name__
    reading = read_module(module, selected=True)
    channels = dim if dim is not None else norm_channels(module)
    if channels is None:
        shape = getattr(module, "normalized_shape", None)
        if isinstance(shape, (tuple, list, torch.Size)) and len(shape) > 1:
            raise ValueError(
                f"Expected {name} to normalise over one channel dimension, got normalized_shape={tuple(shape)}. "
                "Only single-axis norms have a per-channel affine map."
            )
        raise ValueError(
            f"Expected {name} to have a vector parameter or `normalized_shape`, got neither. "
            "Pass `dim=` (the channel count) to effective_affine."
        )
    if axis is None:
        axis = reading.axis if reading is not None and reading.kind != "unknown" else -1
    layout = _layout(int(channels), axis)
    try:
        if reading is not None and reading.kind == "dyt":
            return _pointwise_affine(module, reading, int(channels), layout)
        fit = fit_normalisation(ev.clone(module), layout)
    except Exception as err:
        raise ValueError(
            f"Expected {name} to run on a float64 CPU copy of itself to read its affine map, got "
            f"{type(err).__name__}: {err}. Exclude this layer (exclude=...) or convert it by hand."
        ) from err
    if fit is None:
        where = "the last dimension" if axis == -1 else f"dimension {axis} (channels first)"
        raise ValueError(
            f"Expected {name} to compute gain * normalize(x) + bias (LayerNorm or RMSNorm over {where}), got no fit "
            f"within {_TOL:.0e}. satmon cannot determine this layer's affine map: exclude it "
            "(exclude=...), or copy its "
            "parameters yourself."
        )
    exact = _exact(module, int(channels), fit.x_hat, fit.y, max(_TOL, 10 * fit.residual))
    if exact is not None:
        note, g, b, res = exact
        return EffectiveAffine(fit.kind, g, b, res, True, note, axis)
    scale = float(fit.y.abs().max())
    has_bias = bool((fit.bias.abs() > _TOL * max(scale, 1e-300)).any())
    return EffectiveAffine(
        fit.kind,
        fit.gain,
        fit.bias if has_bias else None,
        fit.residual,
        False,
        "fitted: the layer's parameters do not reproduce its outputs",
        axis,
    )


def _pointwise_affine(module: nn.Module, reading, channels: int, layout: ev.Layout) -> EffectiveAffine:
    x = ev.spread(layout, torch.float64, torch.device("cpu"))
    copy = ev.clone(module)
    y = ev.to_rows(ev.run(copy, x), layout[1])
    alpha = copy.alpha.detach()
    a = alpha.reshape(-1) if alpha.numel() == channels else alpha.reshape(()).expand(channels)
    u = ev.to_rows(x, layout[1]) * a
    if reading.shift:
        s = getattr(copy, reading.shift).detach()
        u = u + (s.reshape(-1) if s.numel() == channels else s.reshape(()))
    t = pointwise_function(reading.function, u)
    g, b, res = ev.fit_per_channel(t, y)
    exact = _exact(module, channels, t, y, max(_TOL, 10 * res))
    if exact is not None:
        note, g_attr, b_attr, res_attr = exact
        return EffectiveAffine("dyt", g_attr, b_attr, res_attr, True, note, layout[1])
    has_bias = bool((b.abs() > _TOL * max(float(y.abs().max()), 1e-300)).any())
    return EffectiveAffine(
        "dyt",
        g,
        b if has_bias else None,
        res,
        False,
        "fitted: the layer's parameters do not reproduce its outputs",
        layout[1],
    )
