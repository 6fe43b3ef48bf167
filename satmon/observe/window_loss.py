"""The training loss over the screening window: mean per segment, summed on the device across ranks."""

from __future__ import annotations

import torch
from torch import Tensor

from satmon.observe.states import SumStates

__all__ = ["WindowLoss"]


class WindowLoss(SumStates):
    """Sum and count of the training loss in each of ``segments`` equal parts of the window.

    Pushes are device ops only (no host sync, nothing made on the host); :meth:`means` reads all
    segments in one transfer, summed over DDP ranks when asked (every rank at the same step). A
    non-finite loss is left out of its segment's sum and count.

    Args:
        window: the window's length in optimizer steps.
        segments: how many equal parts (at most ``window``; at least 1).

    Example:
        >>> w = WindowLoss(window=4, segments=2)
        >>> for step, loss in enumerate([4.0, 3.0, 2.0, 1.0]):
        ...     w.push(torch.tensor(loss), step)
        >>> w.means(sync=False)
        [3.5, 1.5]
    """

    sums: Tensor
    counts: Tensor

    def __init__(self, window: int, segments: int = 10) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"Expected a window of at least one step (an int), got {window!r}.")
        super().__init__()
        self.window, self.segments = window, max(1, min(segments, window))
        self.add_state("sums", torch.zeros(self.segments, dtype=torch.float64))
        self.add_state("counts", torch.zeros(self.segments, dtype=torch.int64))
        self._views: list[tuple[Tensor, Tensor]] | None = None

    def segment(self, step: int) -> int | None:
        """The segment of optimizer step ``step`` (0-based), ``None`` outside the window."""
        return step * self.segments // self.window if 0 <= step < self.window else None

    def push(self, loss: Tensor, step: int) -> None:
        """Add the loss of optimizer step ``step`` (0-based, inside the window); a non-finite loss is left out.

        Five tensor ops a step (the segment's views of the states are made once)."""
        i = self.segment(step)
        if i is None:
            return
        views = self._views
        if views is None or views[0][0].data_ptr() != self.sums.data_ptr():  # first push, or the states moved
            views = self._views = [
                (self.sums.narrow(0, k, 1), self.counts.narrow(0, k, 1)) for k in range(self.segments)
            ]
        v = loss.detach().reshape(1)
        sums, counts = views[i]
        sums.add_(v.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0))  # added in float64: the value as loss.double()
        counts.add_(torch.isfinite(v))

    update = push

    def means(self, sync: bool = True) -> list[float]:
        """Mean loss of each segment (NaN where none was pushed), oldest first, in one transfer."""
        s = self.synced(sync)
        packed = torch.stack([s["sums"], s["counts"].to(torch.float64)]).cpu().tolist()
        return [total / n if n else float("nan") for total, n in zip(*packed)]

    def compute(self, sync: bool = False) -> Tensor:
        """The segment means as a float64 device tensor (0 where none was pushed)."""
        s = self.synced(sync)
        return s["sums"] / s["counts"].clamp_min(1)
