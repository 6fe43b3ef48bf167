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
from torchmetrics import Metric

from satmon.observe.hookset import HookSet, recomputing
from satmon.model.discovery import NormLayer
from satmon.functional.offset import offset_summary, offset_sums

__all__ = ["OFFSET_RETAINED_BELOW", "OffsetCounter", "OffsetHooks", "offset_driven"]

#: A layer's saturation is offset-driven when less than this share of it survives removing each
#: channel's mean (centered saturation / saturation). Measured: 0.008 on a stalled model (0.006 of
#: 0.741), 0.78 on a healthy one (0.608 of 0.779): docs/science.md.
OFFSET_RETAINED_BELOW = 0.25


class OffsetCounter(Metric):
    """Per-layer sums of the offset statistics of sampled batches (sum-reduced over ranks)."""

    full_state_update = False
    _COUNTS = ("total", "saturated", "centered", "offset_channel", "batches")

    def __init__(self, num_layers: int, **kwargs) -> None:
        kwargs.setdefault("compute_with_cache", False)
        super().__init__(**kwargs)
        for name in self._COUNTS:
            self.add_state(name, default=torch.zeros(num_layers, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("ratio_median", default=torch.zeros(num_layers, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, index: int, x: Tensor, alpha: Tensor, level: float, channel_dim: int) -> None:  # type: ignore[override]
        s = offset_sums(x, alpha, level, channel_dim)
        ratio = offset_summary(s).offset_ratio_median  # this batch's median over channels of |m_c| / s_c
        for name, v in zip(self._COUNTS, (s.total, s.saturated, s.centered_saturated, s.offset_channel_saturated, 1)):
            getattr(self, name).select(0, index).add_(v)
        self.ratio_median.select(0, index).add_(ratio.clamp_max(1e12))  # an offset with no spread reads 1e12

    def compute(self) -> dict[str, Tensor]:
        n = self.total.to(torch.float64).clamp_min(1)
        return {"saturated": self.saturated / n, "centered": self.centered / n,
                "offset_ratio": self.ratio_median / self.batches.clamp_min(1)}


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
    """Forward hooks that feed an :class:`OffsetCounter` (enable them on sampled steps only)."""

    def __init__(self, layers: Sequence[NormLayer], counter: OffsetCounter, level: float,
                 refused: dict[str, str] | None = None) -> None:
        super().__init__()
        self.layers, self.counter, self.level = list(layers), counter, float(level)
        self.refused = refused if refused is not None else {}  # shared with the saturation hooks: they refuse first
        self.enabled = False

    def _make_hook(self, index: int):
        name = self.layers[index].name

        def hook(mod: nn.Module, args: tuple, output: Tensor) -> None:
            # eager only: under torch.compile the statistics are left out (no offset readings on the card)
            if self.enabled and args and not torch.compiler.is_compiling() and name not in self.refused and not recomputing():
                x, alpha = args[0], mod.alpha
                self.counter.update(index, x, alpha, self.level, _channel_dim(mod, x, alpha))

        return hook

    def _register(self) -> list[RemovableHandle]:
        return [l.module.register_forward_hook(self._make_hook(i)) for i, l in enumerate(self.layers)]

    def read(self, names: Sequence[str], sync: bool = True) -> dict[str, dict[str, float]]:
        """Per layer: ``saturated``, ``centered`` (fractions of the sampled batches) and ``offset_ratio``."""
        c = self.counter
        with c.sync_context(should_sync=sync, should_unsync=True):  # compute() would squeeze a single layer
            n = c.total.to(torch.float64).clamp_min(1)
            rows = torch.stack([c.saturated / n, c.centered / n, c.ratio_median / c.batches.clamp_min(1)]).cpu().tolist()
            seen = c.batches.clone()
        return {n: {"saturated": s, "centered": c, "offset_ratio": r}
                for n, s, c, r, b in zip(names, *rows, seen.cpu().tolist()) if b}


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
