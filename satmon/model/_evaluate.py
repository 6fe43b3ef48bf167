"""Running a copy of one module on known inputs: the evaluation behind discovery and the affine map.

A copy (float64 on the CPU, or the module's own device and dtype when its kernels only run there)
shares nothing with the module and runs no hooks, so reading a layer never changes it. A module on
the meta device is read the same way: the values a reading draws or sets need no data, so its copy
is a CPU twin with the same parameter shapes and the same draws (:func:`clone`). Inputs are
laid out channels-last ``(B, T, C)``, channels-first ``(B, C, H, W)`` / ``(B, C, T)``, or as rows
``(N, C)``; :func:`to_rows` brings any layout back to ``(rows, C)`` so one fit serves every axis.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

__all__ = [
    "Layout",
    "OnMeta",
    "clone",
    "fit_per_channel",
    "from_rows",
    "layouts",
    "on_host",
    "on_meta",
    "run",
    "spread",
    "to_rows",
    "tolerance",
    "whole",
]

#: (shape, channel axis) of one evaluation input
Layout = tuple[tuple[int, ...], int]


def whole(t: Tensor) -> Tensor:
    """An FSDP2 parameter outside the forward is a sharded ``DTensor``: gather it (a collective every rank reaches)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def _as(dtype: torch.dtype, target: torch.dtype) -> torch.dtype:
    return target if dtype.is_floating_point else dtype


def clone(
    module: nn.Module,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float64,
    fill: Mapping[str, float] | None = None,
    randomize: tuple[str, ...] = (),
) -> nn.Module:
    """A copy of ``module`` on ``device`` in ``dtype`` that shares nothing with it and runs no hooks.

    ``fill`` sets own parameters to a constant, ``randomize`` draws them around 1 (seeded): what a
    layer computes can then be read independently of its trained values. That also reads a module on
    the meta device (a model built under ``torch.device("meta")``): the copy is its twin on ``device``,
    with the same draws as a copy of the module on the CPU, so the reading is the same; a parameter or
    buffer whose value the copy needs (neither filled nor drawn) raises :class:`OnMeta`.
    """
    out = copy.copy(module)  # shallow: the instance dict is new, its values are shared
    gen = torch.Generator().manual_seed(1234)
    params = {}
    for k, p in module._parameters.items():
        if p is None:
            params[k] = None
            continue
        if p.is_meta and (fill and k in fill or k in randomize and p.is_floating_point()):
            v = torch.zeros(p.shape, dtype=_as(p.dtype, torch.float64))  # set below: the twin needs no value meta lacks
        else:
            v = _host(whole(p), k).to("cpu", _as(p.dtype, torch.float64)).clone()
        if fill and k in fill:
            v.fill_(fill[k])
        elif k in randomize and v.is_floating_point():
            v = 1.0 + 0.5 * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        params[k] = nn.Parameter(v.to(device, _as(v.dtype, dtype)), requires_grad=False)
    out.__dict__["_parameters"] = params
    out.__dict__["_buffers"] = {
        k: None if b is None else _host(b, k).to(device, _as(b.dtype, dtype)).clone()
        for k, b in module._buffers.items()
    }
    out.__dict__["_modules"] = {k: None if m is None else clone(m, device, dtype) for k, m in module._modules.items()}
    for hooks in (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_always_called",
    ):
        if hooks in out.__dict__:
            out.__dict__[hooks] = type(out.__dict__[hooks])()
    return out


class OnMeta(RuntimeError):
    """A value the copy needs is on the meta device (shape and dtype only): the module cannot be run from it."""


def _host(t: Tensor, name: str) -> Tensor:
    if t.is_meta:
        raise OnMeta(f"{name} is on the meta device: its values, which this reading needs, are not there")
    return t.detach()


def on_host() -> torch.device:
    """A context in which the tensors an evaluation makes are on the CPU, also inside ``with torch.device("meta")``
    (a model factory run on the meta device converts its norms there: its test inputs must still hold values).

    Example:
        >>> with torch.device("meta"), on_host():
        ...     torch.zeros(2).device
        device(type='cpu')
    """
    return torch.device("cpu")


def on_meta(module: nn.Module) -> bool:
    """Whether ``module`` holds a parameter or buffer of its own on the meta device.

    Example:
        >>> on_meta(nn.Linear(2, 2)), on_meta(nn.Linear(2, 2, device="meta"))
        (False, True)
    """
    return any(t.is_meta for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)))


def spread(layout: Layout, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """An input of ``layout`` whose values cover tanh's curved range (about +-5), different in every channel and row.

    Example:
        >>> x = spread(((2, 3, 4), -1), torch.float64, "cpu")
        >>> tuple(x.shape), len(set(x.flatten().tolist()))
        ((2, 3, 4), 24)
    """
    shape, _ = layout
    n = int(torch.tensor(shape).prod())
    x = torch.linspace(-3.0, 3.0, n, dtype=torch.float64).reshape(shape)
    perm = torch.randperm(shape[-1], generator=torch.Generator().manual_seed(0))
    return (x[..., perm] * 1.7).to(device, dtype)


def tolerance(dtype: torch.dtype) -> float:
    """Relative fit residual accepted for an evaluation in ``dtype`` (float64: 1e-4)."""
    return {torch.float64: 1e-4, torch.float32: 2e-3}.get(dtype, 5e-2)


def _other(n: int, c: int) -> int:
    return n if n != c else n + 1


def layouts(c: int) -> Iterator[Layout]:
    """Channels-last ``(2, 8, C)``, channels-first ``(2, C, H, W)`` and ``(2, C, T)``, rows ``(16, C)``:
    every size other than ``C`` differs from it, so a layer that normalises the wrong axis cannot fit."""
    t = _other(8, c)
    h, w = _other(3, c), _other(4, c)
    if w == h:
        w = _other(w + 1, c)
    yield (2, t, c), -1
    yield (2, c, h, w), 1
    yield (2, c, t), 1
    yield (16, c), -1


def to_rows(x: Tensor, axis: int) -> Tensor:
    """``(..., C on axis, ...)`` -> ``(rows, C)``."""
    return x.movedim(axis, -1).reshape(-1, x.shape[axis])


def from_rows(rows: Tensor, layout: Layout) -> Tensor:
    """``(rows, C)`` -> the layout's shape (the inverse of :func:`to_rows`)."""
    shape, axis = layout
    moved = list(shape)
    c = moved.pop(axis)
    return rows.reshape(*moved, c).movedim(-1, axis)


def rows_of(layout: Layout) -> int:
    shape, axis = layout
    n = 1
    for i, s in enumerate(shape):
        if i != axis % len(shape):
            n *= s
    return n


def run(module: nn.Module, x: Tensor) -> Tensor:
    """``module.forward(x)`` without grad or autocast; a non-tensor or reshaped output raises."""
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        y = module.forward(x)
    if not isinstance(y, Tensor) or y.shape != x.shape:
        raise TypeError(f"returned {type(y).__name__} of shape {tuple(getattr(y, 'shape', ()))}, not {tuple(x.shape)}")
    return y


def fit_per_channel(t: Tensor, y: Tensor) -> tuple[Tensor, Tensor, float]:
    """Per-channel least squares ``y = g * t + b`` on ``(rows, C)``; returns ``g, b, relative residual``.

    The residual is ``inf`` when a channel of ``t`` does not vary (nothing to fit a gain on).
    """
    t, y = t.to(torch.float64), y.to(torch.float64)
    tm, ym = t.mean(0), y.mean(0)
    dt = t - tm
    var = dt.pow(2).sum(0)
    g = (dt * (y - ym)).sum(0) / var.clamp_min(1e-300)
    b = ym - g * tm
    if not bool((var > 0).all()):
        return g, b, float("inf")
    return g, b, residual(y, g * t + b)


def residual(y: Tensor, fitted: Tensor) -> float:
    """Largest absolute misfit relative to the largest output."""
    return float((y - fitted).abs().max() / y.abs().max().clamp_min(1e-300))
