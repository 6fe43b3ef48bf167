"""Why a DyT layer saturates: sampled hooks that measure how much of its saturation a per-channel
constant explains (:mod:`satmon.functional.offset`), summed on the device across steps and ranks.

The statistics cost a float64 pass over the input, so they run on sampled window steps only
(``offset_every``); the screened count itself runs on every counted step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from satmon.functional.offset import offset_summary, offset_sums
from satmon.functional.saturation import pointwise_cutoff
from satmon.model.discovery import NormLayer
from satmon.observe.hookset import HookSet, recomputing
from satmon.observe.states import SumStates

__all__ = ["OFFSET_RETAINED_BELOW", "OffsetCounter", "OffsetHooks", "offset_driven"]

#: A layer's saturation is offset-driven when less than this share of it survives removing each
#: channel's mean (centered saturation / saturation). Measured: 0.008 on a stalled model (0.006 of
#: 0.741), 0.78 on a healthy one (0.608 of 0.779): docs/science/science.md.
OFFSET_RETAINED_BELOW = 0.25


class OffsetCounter(SumStates):
    """Per-layer sums of the offset statistics of sampled batches (summed over ranks when read).

    Example:
        >>> c = OffsetCounter(1)
        >>> x = torch.tensor([[10.0, 0.5], [10.5, -0.5], [9.5, 0.0]])  # channel 0 sits on an offset
        >>> c.update(0, x, torch.tensor([1.0]), 2.0, -1)
        >>> {k: v.tolist() for k, v in c.compute().items()}
        {'saturated': [0.5], 'centered': [0.0], 'offset_ratio': [12.24744871391589], 'batches': [1]}
    """

    _COUNTS = ("total", "saturated", "centered", "offset_channel", "batches")
    total: Tensor
    saturated: Tensor
    centered: Tensor
    offset_channel: Tensor
    batches: Tensor
    ratio_median: Tensor

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        for name in self._COUNTS:
            self.add_state(name, torch.zeros(num_layers, dtype=torch.int64))
        self.add_state("ratio_median", torch.zeros(num_layers, dtype=torch.float64))

    def update(self, index: int, x: Tensor, alpha: Tensor, level: float, channel_dim: int) -> None:
        """Add one batch of layer ``index`` (its input ``x``, ``alpha``, the cut-off ``level``; device ops only)."""
        s = offset_sums(x, alpha, level, channel_dim)
        ratio = offset_summary(s).offset_ratio_median  # this batch's median over channels of |m_c| / s_c
        for name, v in zip(self._COUNTS, (s.total, s.saturated, s.centered_saturated, s.offset_channel_saturated, 1)):
            getattr(self, name).select(0, index).add_(v)
        self.ratio_median.select(0, index).add_(ratio.clamp_max(1e12))  # an offset with no spread reads 1e12

    def compute(self, sync: bool = False) -> dict[str, Tensor]:
        """Per layer (float64 ``(L,)``): ``saturated`` and ``centered`` fractions of the sampled elements,
        the mean per-batch ``offset_ratio``, and the number of ``batches`` (int64); ``sync`` sums over ranks first."""
        s = self.synced(sync)
        n = s["total"].to(torch.float64).clamp_min(1)
        return {
            "saturated": s["saturated"] / n,
            "centered": s["centered"] / n,
            "offset_ratio": s["ratio_median"] / s["batches"].clamp_min(1),
            "batches": s["batches"],
        }


def _channel_dim(module: nn.Module, x: Tensor, alpha: Tensor) -> int:
    """Where the channels are, as the layer's ``alpha`` (or its gain) broadcasts against ``x``."""
    if alpha.numel() > 1:
        varying = [i for i, n in enumerate(alpha.shape) if n != 1]
        return x.dim() - alpha.dim() + varying[0] if len(varying) == 1 else -1
    weight = getattr(module, "weight", None)
    c = weight.numel() if isinstance(weight, Tensor) else None
    if c is not None and x.shape[-1] != c and x.dim() > 2 and x.shape[1] == c:
        return 1
    return -1


class OffsetHooks(HookSet):
    """Forward hooks that feed an :class:`OffsetCounter` (enable them on sampled steps only).

    Each layer's statistics use its function's cut-off at ``level``
    (:func:`~satmon.functional.saturation.pointwise_cutoff`); a layer with a shift (Derf's
    ``alpha * x + s``) has no offset readings (its pre-activation carries a learned offset of its own).
    """

    def __init__(
        self, layers: Sequence[NormLayer], counter: OffsetCounter, level: float, refused: dict[str, str] | None = None
    ) -> None:
        super().__init__()
        self.layers, self.counter, self.level = list(layers), counter, float(level)
        self.cutoffs = [pointwise_cutoff(l.function or "tanh", self.level) for l in self.layers]
        self.refused = refused if refused is not None else {}  # shared with the saturation hooks: they refuse first
        self.enabled = False

    def _make_hook(self, index: int):
        name, cutoff = self.layers[index].name, self.cutoffs[index]

        def hook(mod: nn.Module, args: tuple, output: Tensor) -> None:
            # eager only: under torch.compile the statistics are left out (no offset readings on the card)
            if (
                self.enabled
                and args
                and not torch.compiler.is_compiling()
                and name not in self.refused
                and not recomputing()
            ):
                x, alpha = args[0], mod.alpha
                self.counter.update(index, x, alpha, cutoff, _channel_dim(mod, x, alpha))

        return hook

    def _register(self) -> list[RemovableHandle]:
        return [
            l.module.register_forward_hook(self._make_hook(i)) for i, l in enumerate(self.layers) if l.shift is None
        ]

    def read(self, names: Sequence[str], sync: bool = True) -> dict[str, dict[str, float]]:
        """Per layer that saw a sampled batch: ``saturated``, ``centered`` (fractions of the sampled batches) and
        ``offset_ratio``, in one transfer; ``sync`` sums over ranks first (every rank at the same point)."""
        r = self.counter.compute(sync)
        rows = (
            torch.stack([r["saturated"], r["centered"], r["offset_ratio"], r["batches"].to(torch.float64)])
            .cpu()
            .tolist()
        )
        return {n: {"saturated": s, "centered": c, "offset_ratio": o} for n, s, c, o, b in zip(names, *rows) if b}


def offset_driven(readings: dict[str, dict[str, float]], retained_below: float = OFFSET_RETAINED_BELOW) -> bool:
    """Whether most of the sampled saturation is explained by per-channel constants: the pooled
    centered saturation keeps less than ``retained_below`` of the pooled saturation.

    Example:
        >>> offset_driven({"ln_f": {"saturated": 0.741, "centered": 0.006, "offset_ratio": 102.0}})
        True
        >>> offset_driven({"ln_f": {"saturated": 0.779, "centered": 0.608, "offset_ratio": 1.99}})
        False
    """
    sat = sum(r["saturated"] for r in readings.values())
    cen = sum(r["centered"] for r in readings.values())
    return sat > 0 and cen / sat < retained_below
