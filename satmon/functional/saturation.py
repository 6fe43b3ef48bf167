"""Saturation counts of DyT inputs: ``|alpha * x| > level``, exactly, on the activations' device.

The regime study (Verma, 2026) calls an element saturated when ``|alpha * x| > 2.0`` (strict),
with ``x`` the DyT input, and pools the fraction over tokens x channels x layers.

Exactness. The product ``alpha * x`` computed in the activation dtype rounds, and near the
boundary rounding can flip an element. satmon instead compares ``|x|`` against a per-layer
threshold ``t = largest float32 number <= level / |alpha|`` (computed on the device in float64,
then corrected by one ulp either way; for a scalar ``alpha`` on the CPU, the same value in plain
Python by :func:`saturation_threshold_host`). For any float32 (or bf16/fp16, which embed exactly in
float32) input, ``|x| > t`` holds exactly when the real product ``|alpha| * |x| > level``, which is
what a float64 re-computation gives (the product of two float32 numbers is exact in float64).
So counts are integers that agree with the float64 reference bit for bit, in every dtype, with
one cheap comparison per element.

No host sync: every tensor function here returns device tensors and never calls ``.item()``
(:func:`saturation_threshold_host` takes a host float; satmon calls it for CPU parameters only).
"""

from __future__ import annotations

import math
import struct

import torch
from torch import Tensor

__all__ = ["saturation_threshold", "saturation_threshold_host", "saturation_sums", "saturation_counts", "saturation_fraction"]


def saturation_threshold(alpha: Tensor, level: float) -> Tensor:
    """Largest float32 ``t`` with ``|alpha| * t <= level``: ``|x| > t`` iff ``|alpha * x| > level``.

    Runs on ``alpha``'s device, without a host sync.

    Args:
        alpha: the DyT scale, a scalar (any shape with one element) or per-channel tensor.
        level: the saturation level (study: 2.0).

    Returns:
        A float32 tensor with at least one dimension (so that comparing it with bf16/fp16 activations
        promotes them to float32 instead of rounding the threshold to the activation dtype).

    Example:
        >>> import torch
        >>> t = saturation_threshold(torch.tensor([2.0]), 2.0)
        >>> t.item()
        1.0
        >>> bool(torch.tensor([1.0]) > t), bool(torch.tensor([1.0000001]) > t)
        (False, True)
    """
    a = alpha.detach().to(torch.float64).abs().reshape(-1) if alpha.numel() == 1 else alpha.detach().to(torch.float64).abs()
    t = (level / a).to(torch.float32)  # round to nearest: within one ulp of the answer (inf when alpha == 0)
    too_big = t.to(torch.float64) * a > level
    t = torch.where(too_big, torch.nextafter(t, torch.zeros_like(t)), t)
    up = torch.nextafter(t, torch.full_like(t, float("inf")))
    fits = up.to(torch.float64) * a <= level
    return torch.where(fits & torch.isfinite(up), up, t)


def saturation_threshold_host(alpha: float, level: float) -> float:
    """:func:`saturation_threshold` for a scalar ``alpha`` already on the host, in plain Python.

    The same value, bit for bit, as the tensor version (the tests check both against each other and
    against a float64 count): for CPU training, where reading ``alpha`` is free (no device to wait
    for), this costs a few microseconds instead of a dozen tensor ops per optimizer step.

    Args:
        alpha: the DyT scale, a float32 value (e.g. ``param.item()``).
        level: the saturation level.

    Returns:
        The largest float32 ``t`` with ``|alpha| * t <= level`` (``inf`` when ``alpha == 0``).

    Example:
        >>> saturation_threshold_host(2.0, 2.0)
        1.0
        >>> a = torch.tensor([0.8])  # float32
        >>> saturation_threshold_host(a.item(), 2.0) == saturation_threshold(a, 2.0).item()
        True
    """
    a = abs(float(alpha))
    if a == 0.0:
        return math.inf
    t = _f32(level / a)  # round to nearest, inf past the float32 range: as ``.to(torch.float32)``
    if t * a > level:  # a product of two float32 values is exact in float64
        t = _f32_step(t, -1)
    up = _f32_step(t, +1)
    if math.isfinite(up) and up * a <= level:
        t = up
    return t


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def _f32(v: float) -> float:
    """``v`` rounded to the nearest float32 (``inf`` when it overflows)."""
    try:
        return _F32.unpack(_F32.pack(v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _f32_step(t: float, direction: int) -> float:
    """The float32 neighbour of a non-negative float32 ``t``: ``+1`` up (``inf`` past the top), ``-1`` down (not below 0)."""
    if math.isinf(t):
        return t if direction > 0 else _f32_from_bits(0x7F7FFFFF)
    bits = _U32.unpack(_F32.pack(t))[0]
    if direction < 0 and bits == 0:
        return 0.0
    return _f32_from_bits(bits + direction)


def _f32_from_bits(bits: int) -> float:
    return _F32.unpack(_U32.pack(bits))[0]


def saturation_counts(x: Tensor, alpha: Tensor, level: float) -> tuple[Tensor, Tensor]:
    """Count the saturated elements of one DyT input, and flag non-finite ones.

    Cost: :func:`saturation_sums` (one ``abs``, one sum, one in-place comparison and one more sum
    over ``x``; a bool comparison followed by a bool sum is several times slower on CPUs, and an
    exact count of non-finite elements would need another full comparison pass) plus three tiny
    ops on the two sums. The hooks skip those three per call and convert all calls' sums at once
    (:meth:`satmon.SaturationCounter.defer_input`, which also caches the threshold and reuses a
    work buffer).

    Args:
        x: the DyT input, any shape (``(B, T, C)`` or channels-first ``(B, C, H, W)``).
        alpha: the layer's ``alpha`` (read at call time, so FSDP-gathered parameters are whole).
        level: saturation level; an element is saturated when ``|alpha * x| > level`` (strict).

    Returns:
        ``(saturated, nonfinite)``: int64 0-dim device tensors. ``saturated`` counts ``inf`` inputs
        (``|alpha * inf| > level``) and never ``nan``; ``nonfinite`` is 1 when ``x`` holds any
        ``inf``/``nan``, else 0 (so summed over calls it counts the inputs that had one).

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.5, -1.5, 1.0, float("nan")]])
        >>> sat, bad = saturation_counts(x, torch.tensor([2.0]), level=2.0)
        >>> int(sat), int(bad)
        (1, 1)
    """
    with torch.no_grad():
        x = x.detach()
        if x.dtype == torch.float64:  # float64 activations: compare the product itself
            ax = x.abs()
            a = alpha.detach().to(torch.float64).abs().reshape(-1 if alpha.numel() == 1 else alpha.shape)
            return (ax * a > level).sum(), (~torch.isfinite(ax.sum())).to(torch.int64)
        abs_sum, saturated = saturation_sums(x, saturation_threshold(alpha, level))
        return saturated.to(torch.int64), (~torch.isfinite(abs_sum)).to(torch.int64)


def saturation_sums(x: Tensor, threshold: Tensor | float, scratch: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The hot path of :func:`saturation_counts`: four tensor ops, nothing else.

    ``abs(x)``, its sum, an in-place ``> threshold`` and the sum of the resulting 0/1 values. The
    results stay floating-point device tensors; :func:`saturation_counts` (or a caller that batches
    many calls, like :class:`satmon.SaturationHooks`) turns them into integer counts and a flag.
    Every extra tiny op per call costs measurable time in a real training step (on a CPU about as
    much as a pass over a 131k-element activation), which is why the conversions are left out.

    Args:
        x: a float32/bf16/fp16 DyT input, any shape (float64 needs the product; use
            :func:`saturation_counts`).
        threshold: ``saturation_threshold(alpha, level)``, or the Python float of
            :func:`saturation_threshold_host` (exact too: a float32 value compared with float32 data).
        scratch: optional float32 work buffer of ``x``'s shape and device (content overwritten).

    Returns:
        ``(abs_sum, saturated)``: 0-dim float tensors. ``abs_sum`` is non-finite exactly when ``x``
        holds an ``inf``/``nan`` (or, for finite data, when the sum of ``|x|`` overflows float32,
        i.e. values near 1e38, which are not meaningful activations either). ``saturated`` is the
        exact count ``#{|x| > threshold}`` (float32 below ``2**24`` elements, float64 above).

    Example:
        >>> import torch
        >>> s, n = saturation_sums(torch.tensor([0.5, -1.5, 1.0]), saturation_threshold(torch.tensor([2.0]), 2.0))
        >>> float(s), float(n)
        (3.0, 1.0)
    """
    x = x.detach()
    if scratch is not None and scratch.shape == x.shape and scratch.dtype == torch.float32:  # (another device: torch raises)
        ax = torch.abs(x, out=scratch) if x.dtype == torch.float32 else scratch.copy_(x).abs_()
    else:
        ax = x.abs() if x.dtype == torch.float32 else x.to(torch.float32).abs_()  # a fresh float32 buffer
    abs_sum = ax.sum()  # non-finite exactly when some element is
    ax.gt_(threshold)  # 1.0 where |x| > t, in place
    # a float32 sum of 0/1 is exact below 2**24 elements; beyond, accumulate in float64
    return abs_sum, (ax.sum() if ax.numel() < 2**24 else ax.sum(dtype=torch.float64))


def saturation_fraction(saturated: Tensor, total: Tensor) -> Tensor:
    """Fraction ``saturated / total`` in float64, 0 where nothing was counted.

    Example:
        >>> import torch
        >>> saturation_fraction(torch.tensor([3, 0]), torch.tensor([4, 0])).tolist()
        [0.75, 0.0]
    """
    total64 = total.to(torch.float64)
    return torch.where(total64 > 0, saturated.to(torch.float64) / total64.clamp_min(1), torch.zeros_like(total64))
