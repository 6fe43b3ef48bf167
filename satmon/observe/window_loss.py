"""The training loss over the screening window: mean per segment, summed on the device across ranks."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["WindowLoss"]


class WindowLoss(Metric):
    """Sum and count of the training loss in each of ``segments`` equal parts of the window.

    Pushes are device ops only (no host sync); :meth:`means` reads all segments in one transfer,
    summed over DDP ranks when asked (every rank at the same step).

    Example:
        >>> w = WindowLoss(window=4, segments=2)
        >>> for step, loss in enumerate([4.0, 3.0, 2.0, 1.0]):
        ...     w.push(torch.tensor(loss), step)
        >>> w.means(sync=False)
        [3.5, 1.5]
    """

    full_state_update = False
    sums: Tensor
    counts: Tensor

    def __init__(self, window: int, segments: int = 10, **kwargs) -> None:
        kwargs.setdefault("compute_with_cache", False)
        super().__init__(**kwargs)
        self.window, self.segments = window, max(1, min(segments, window))
        self.add_state("sums", default=torch.zeros(self.segments, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("counts", default=torch.zeros(self.segments, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, loss: Tensor, step: int) -> None:  # type: ignore[override]
        self.push(loss, step)

    def push(self, loss: Tensor, step: int) -> None:
        """Add the loss of optimizer step ``step`` (0-based, inside the window); non-finite losses are left out."""
        if not 0 <= step < self.window:
            return
        i = step * self.segments // self.window
        v = loss.detach().to(torch.float64).reshape(())
        ok = torch.isfinite(v)
        self.sums[i] += torch.where(ok, v, torch.zeros_like(v))
        self.counts[i] += ok.to(torch.int64)

    def means(self, sync: bool = True) -> list[float]:
        """Mean loss of each segment (NaN where none was pushed), oldest first."""
        with self.sync_context(should_sync=sync, should_unsync=True):
            packed = torch.stack([self.sums, self.counts.to(torch.float64)]).cpu().tolist()
        return [s / c if c else float("nan") for s, c in zip(*packed)]

    def compute(self) -> Tensor:
        return self.sums / self.counts.clamp_min(1)
