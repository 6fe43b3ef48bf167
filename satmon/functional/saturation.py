"""Saturation counts of DyT inputs: ``|alpha * x| > level``, exactly, on the activations' device.

The regime study (Verma, 2026) calls an element saturated when ``|alpha * x| > 2.0`` (strict),
with ``x`` the DyT input, and pools the fraction over tokens x channels x layers.

Exactness. The product ``alpha * x`` computed in the activation dtype rounds, and near the
boundary rounding can flip an element. satmon instead compares ``|x|`` against a per-layer
threshold ``t = largest float32 number <= level / |alpha|`` (computed on the device in float64,
then corrected by one ulp either way). For any float32 (or bf16/fp16, which embed exactly in
float32) input, ``|x| > t`` holds exactly when the real product ``|alpha| * |x| > level``, which is
what a float64 re-computation gives (the product of two float32 numbers is exact in float64).
So counts are integers that agree with the float64 reference bit for bit, in every dtype, with
one cheap comparison per element.

No host sync: every function here returns device tensors and never calls ``.item()``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["saturation_threshold", "saturation_counts", "saturation_fraction"]


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


def saturation_counts(x: Tensor, alpha: Tensor, level: float) -> tuple[Tensor, Tensor]:
    """Count the saturated and the non-finite elements of one DyT input.

    Args:
        x: the DyT input, any shape (``(B, T, C)`` or channels-first ``(B, C, H, W)``).
        alpha: the layer's ``alpha`` (read at call time, so FSDP-gathered parameters are whole).
        level: saturation level; an element is saturated when ``|alpha * x| > level`` (strict).

    Returns:
        ``(saturated, nonfinite)``: int64 0-dim device tensors. ``inf`` inputs count as saturated
        (``|alpha * inf| > level``) and as non-finite; ``nan`` inputs only as non-finite.

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.5, -1.5, 1.0, float("nan")]])
        >>> sat, bad = saturation_counts(x, torch.tensor([2.0]), level=2.0)
        >>> int(sat), int(bad)
        (1, 1)
    """
    with torch.no_grad():
        ax = x.detach().abs()
        t = saturation_threshold(alpha, level)
        if alpha.numel() != 1 and x.dim() >= 1:
            t = t.to(ax.device)
        saturated = (ax > t).sum()
        # abs(x) <= float max is False exactly for +-inf and nan: one pass counts both.
        nonfinite = ax.numel() - (ax <= torch.finfo(ax.dtype).max).sum()
    return saturated, nonfinite


def saturation_fraction(saturated: Tensor, total: Tensor) -> Tensor:
    """Fraction ``saturated / total`` in float64, 0 where nothing was counted.

    Example:
        >>> import torch
        >>> saturation_fraction(torch.tensor([3, 0]), torch.tensor([4, 0])).tolist()
        [0.75, 0.0]
    """
    total64 = total.to(torch.float64)
    return torch.where(total64 > 0, saturated.to(torch.float64) / total64.clamp_min(1), torch.zeros_like(total64))
