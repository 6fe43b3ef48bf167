"""How much of a DyT layer's saturation a per-channel constant explains (offset-driven saturation).

A DyT input ``x`` of shape ``(..., C)`` can saturate because its tokens vary widely, or because each
channel sits on a large constant offset while carrying little token-to-token variation (the stalled
run of docs/guides/faq.md: channel means ~17-20 against a spread of ~0.25). Per batch (one DyT input, all
its tokens), with ``m_c`` the channel's mean over the batch's tokens and ``s_c`` their spread
(population standard deviation):

- centered saturation: the fraction of elements with ``|alpha * (x - m_c)| > level``: what is left
  once each channel's constant is removed;
- offset ratio: ``|m_c| / s_c`` per channel (its median over channels is reported);
- offset-channel share: the share of saturated elements that lie in channels whose mean alone
  saturates (``|alpha * m_c| > level``).

:func:`offset_sums` returns sums that add across batches and DDP ranks (int64 counts, float64
per-channel sums), computed on ``x``'s device in float64 without a host sync; :func:`offset_summary`
turns accumulated sums into the three readings. Products here are the exact (float64) ones; the
statistics are diagnostics beside the screened count, not the count itself.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from satmon.functional.saturation import _exact_threshold, saturation_fraction

__all__ = ["OffsetSums", "OffsetSummary", "offset_sums", "offset_summary"]


class OffsetSums(NamedTuple):
    """Sums over batches of one DyT layer (or ``(L,)``/``(L, C)`` stacks of layers); ``+`` adds them.

    Attributes:
        total: elements seen (int64).
        saturated: elements with ``|alpha * x| > level`` (int64, exact product).
        centered_saturated: elements with ``|alpha * (x - m_c)| > level`` (int64).
        offset_channel_saturated: saturated elements in channels with ``|alpha * m_c| > level`` (int64).
        abs_mean: ``|m_c|`` summed over batches (float64, ``(C,)``).
        spread: ``s_c`` summed over batches (float64, ``(C,)``).
    """

    total: Tensor
    saturated: Tensor
    centered_saturated: Tensor
    offset_channel_saturated: Tensor
    abs_mean: Tensor
    spread: Tensor

    def __add__(self, other: OffsetSums) -> OffsetSums:  # type: ignore[override]
        """Field-wise sum (batches, ranks), not tuple concatenation."""
        return OffsetSums(*(a + b for a, b in zip(self, other)))


class OffsetSummary(NamedTuple):
    """Readings from :class:`OffsetSums` (float64 tensors of the sums' leading shape).

    Attributes:
        saturated_fraction: ``|alpha * x| > level`` over all elements (exact product).
        centered_fraction: ``|alpha * (x - m_c)| > level`` over all elements.
        offset_ratio_median: median over channels of ``sum |m_c| / sum s_c`` (``inf`` for a channel
            with an offset and no spread, 0 for an all-zero channel).
        offset_channel_share: saturated elements in channels whose mean alone saturates, over all
            saturated elements (0 when none saturated).
    """

    saturated_fraction: Tensor
    centered_fraction: Tensor
    offset_ratio_median: Tensor
    offset_channel_share: Tensor


def _channel_alpha(alpha: Tensor, shape: torch.Size, dim: int) -> Tensor:
    """``|alpha|`` per channel (float64, ``(C,)`` or ``(1,)``), applied as ``alpha * x`` broadcasts."""
    a = alpha.detach().to(torch.float64).abs()
    if a.numel() == 1:
        return a.reshape(1)
    lead = len(shape) - a.dim()
    varying = [lead + i for i, n in enumerate(a.shape) if n != 1]
    if lead < 0 or varying != [dim] or a.shape[dim - lead] != shape[dim]:
        raise ValueError(
            f"Expected alpha to be a scalar or per-channel along dimension {dim - len(shape)} of "
            "the input, as `alpha * x` "
            f"broadcasts; got alpha of shape {tuple(alpha.shape)} for an input of shape "
            f"{tuple(shape)}. Pass channel_dim "
            "for channels-first inputs (e.g. channel_dim=1 with alpha of shape (C, 1, 1))."
        )
    return a.reshape(-1)


@torch.no_grad()
def offset_sums(x: Tensor, alpha: Tensor, level: float = 2.0, channel_dim: int = -1) -> OffsetSums:
    """The offset statistics of one DyT input ``x`` (one batch), as sums that add over batches.

    Args:
        x: the DyT input; its tokens are every element of one channel (all dimensions but ``channel_dim``).
        alpha: the layer's ``alpha``, scalar or per-channel (broadcast as ``alpha * x``).
        level: the saturation level (study: 2.0).
        channel_dim: the channel dimension (``-1`` channels-last, ``1`` for ``(B, C, H, W)``).

    Returns:
        :class:`OffsetSums` on ``x``'s device: 0-dim int64 counts and ``(C,)`` float64 sums.

    Example:
        >>> x = torch.tensor([[10.0, 0.5], [10.5, -0.5], [9.5, 0.0]])  # (tokens, C): channel 0 sits on an offset
        >>> s = offset_sums(x, torch.tensor([1.0]))
        >>> int(s.saturated), int(s.centered_saturated), int(s.offset_channel_saturated), s.abs_mean.tolist()
        (3, 0, 3, [10.0, 0.0])
    """
    dim = channel_dim % x.dim()
    a = _channel_alpha(alpha, x.shape, dim)  # (C,) or (1,)
    c = x.shape[dim]
    x = x.detach()
    # (N, C) float64, a copy written in place below (one conversion; float64 ops on float64 operands only:
    # torch's mixed-dtype kernels are several times slower than same-dtype ones on the CPU)
    flat = x.to(torch.float64, copy=True).movedim(dim, -1).reshape(-1, c)
    mean = flat.mean(0)  # (C,)
    if x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        # |alpha * x| > level for the exact (float64) product: |x| > the exact float32 threshold, per channel
        ax = x.movedim(dim, -1).reshape(-1, c).to(torch.float32).abs()  # (N, C) float32
        ones = ax.gt_(_exact_threshold(a, level))
        # (C,)
        saturated_c = (ones.sum(0) if ones.shape[0] < 2**24 else ones.sum(0, dtype=torch.float64)).to(torch.int64)
    else:
        saturated_c = None
    dev = flat - mean  # (N, C), two passes: a large offset does not cancel the spread away
    if saturated_c is None:  # float64 input: the product itself, in place
        saturated_c = flat.abs_().mul_(a).gt_(level).sum(0).to(torch.int64)  # (C,)
    sq = torch.mul(dev, dev, out=flat)  # dev ** 2, rounded once (as dev.square())
    spread = sq.mean(0).sqrt()  # (C,) population std over tokens
    offset_channel = mean.abs() * a > level  # (C,) channels whose mean alone saturates
    return OffsetSums(
        total=torch.full((), dev.numel(), dtype=torch.int64, device=x.device),  # a fill, not a host-to-device copy
        saturated=saturated_c.sum(),
        centered_saturated=torch.abs(dev, out=sq).mul_(a).gt_(level).sum().to(torch.int64),
        offset_channel_saturated=(saturated_c * offset_channel).sum(),
        abs_mean=mean.abs(),
        spread=spread,
    )


def offset_summary(sums: OffsetSums) -> OffsetSummary:
    """The readings of accumulated :class:`OffsetSums` (per layer when the sums are stacked ``(L,)``/``(L, C)``).

    Example:
        >>> x = torch.tensor([[10.0, 0.5], [10.5, -0.5], [9.5, 0.0]])
        >>> r = offset_summary(offset_sums(x, torch.tensor([1.0])) + offset_sums(x, torch.tensor([1.0])))
        >>> r.saturated_fraction.item(), r.centered_fraction.item(), r.offset_channel_share.item()
        (0.5, 0.0, 1.0)
    """
    ratio = sums.abs_mean / sums.spread  # inf for an offset without spread, nan for an all-zero channel
    ratio = torch.where(sums.abs_mean == 0, torch.zeros_like(ratio), ratio)
    ordered = ratio.sort(dim=-1).values
    c = ordered.shape[-1]
    median = (ordered[..., (c - 1) // 2] + ordered[..., c // 2]) / 2  # the mean of the two middles, as numpy
    return OffsetSummary(
        saturated_fraction=saturation_fraction(sums.saturated, sums.total),
        centered_fraction=saturation_fraction(sums.centered_saturated, sums.total),
        offset_ratio_median=median,
        offset_channel_share=saturation_fraction(sums.offset_channel_saturated, sums.saturated),
    )
