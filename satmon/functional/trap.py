"""The trap's arithmetic: how far gradient reaches below a model's head, and when a run cannot learn.

A DyT model whose final norm sits on a large per-channel offset outputs ``tanh`` of exactly +-1 (float32
rounds ``tanh(z)`` to 1 past ``|z|`` ~ 9): the derivative ``1 - tanh^2`` is exactly 0 there, so no gradient
passes the final norm, and the embedding and every block stop learning while the head learns the unigram
(docs/science/science.md, "the trap"). Three readings name it, each a pure function here:

- the final norm's saturation and how much of it survives removing each channel's mean
  (:func:`satmon.functional.offset.offset_sums` measures both; :func:`offset_share` turns them into
  the share a per-channel offset explains);
- the gradient reach: the gradient norm of the parameters below the final norm against the norm of
  those at and above it (:func:`grad_square`, :func:`reach_ratio`);
- the decision for one check (:func:`trap_found`): the final norm is DyT, saturated at or above
  ``saturated_at``, mostly by an offset, and the gradient below it is dead (``reach <= floor``; the
  default floor 0 means exactly zero: a gradient tiny but not zero is not dead, since runs like that have
  escaped late).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["REACH_FLOOR", "TRAP_SATURATION", "grad_square", "offset_share", "reach_ratio", "trap_found"]

#: The gradient below the final norm is dead when its norm is at most this fraction of the head's: 0, exactly zero
#: (the trap's float32 arithmetic gives exact zeros; a tiny non-zero gradient can still move the run).
REACH_FLOOR = 0.0
#: The final norm counts as saturated by the trap at or above this saturated fraction (the trap reads 1.0).
TRAP_SATURATION = 0.5


@torch.no_grad()
def grad_square(grad: Tensor) -> Tensor:
    """The squared norm of one gradient, in float64 on its device (no host sync): exactly 0 only when every
    element is 0 (a float32 or bf16 element squares to at least ~1e-90 in float64, never to 0).

    Example:
        >>> grad_square(torch.tensor([3.0, 4.0])).item(), grad_square(torch.tensor([1e-30])).item() > 0
        (25.0, True)
    """
    g = grad.detach()
    if hasattr(g, "to_local"):  # a DTensor shard (FSDP2): this rank's part; the screen combines ranks by maximum
        g = g.to_local()
    return g.to(torch.float64).square().sum()


def reach_ratio(below_square: Tensor, head_square: Tensor) -> Tensor:
    """How far gradient reaches below the head: ``sqrt(below / head)`` of squared norms (float64, element-wise);
    NaN where the head has no gradient (nothing to compare with).

    Example:
        >>> below = torch.tensor([0.0, 4.0, 1.0], dtype=torch.float64)
        >>> reach_ratio(below, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)).tolist()
        [0.0, 2.0, nan]
    """
    below, head = below_square.to(torch.float64), head_square.to(torch.float64)
    ratio = (below / head.clamp_min(torch.finfo(torch.float64).tiny)).sqrt()
    return torch.where(head > 0, ratio, torch.full_like(ratio, float("nan")))


def offset_share(saturated: float, centered: float) -> float | None:
    """The share of a layer's saturation that a per-channel offset explains: ``1 - centered / saturated``
    (``None`` when nothing is saturated). Offset-driven saturation keeps little once each channel's mean is
    removed (:data:`satmon.observe.offset.OFFSET_RETAINED_BELOW`).

    Example:
        >>> offset_share(1.0, 0.0), offset_share(0.8, 0.2), offset_share(0.0, 0.0)
        (1.0, 0.75, None)
    """
    if saturated <= 0:
        return None
    return max(0.0, 1.0 - centered / saturated)


def trap_found(
    final_is_dyt: bool | None,
    saturated: float,
    centered: float,
    reach: float | None,
    *,
    saturated_at: float = TRAP_SATURATION,
    retained_below: float = 0.25,
    floor: float = REACH_FLOOR,
) -> bool:
    """One check's evidence of the trap: the final norm is a DyT, saturated at or above ``saturated_at`` with less
    than ``retained_below`` of it left once each channel's mean is removed, and the gradient below it dead
    (``reach <= floor``). Unknown readings (``None``, NaN: no head gradient to compare with) are no evidence.

    Example:
        >>> trap_found(True, 1.0, 0.0, 0.0)
        True
        >>> trap_found(True, 1.0, 0.0, 1e-7), trap_found(False, 1.0, 0.0, 0.0), trap_found(True, 0.9, 0.8, 0.0)
        (False, False, False)
        >>> trap_found(None, 1.0, 0.0, 0.0), trap_found(True, 1.0, 0.0, None), trap_found(True, 1.0, 0.0, float("nan"))
        (False, False, False)
    """
    if final_is_dyt is not True or reach is None or math.isnan(reach) or saturated < saturated_at or saturated <= 0:
        return False
    return centered / saturated < retained_below and reach <= floor
