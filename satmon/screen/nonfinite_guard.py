"""A per-step non-finite check that never waits for the device.

At each optimizer step the guard forms one flag on the device (non-finite DyT inputs counted so far,
non-finite ``alpha``, a non-finite loss), takes its maximum over ranks (a collective every rank
reaches at the same step), and copies it to the host without blocking. The copy of step ``s`` is
read at step ``s + 1`` (on the CPU at once): by then the device finished step ``s`` in any loop that
is not more than a step ahead, so the read waits on nothing in practice (an event wait, not a
stream sync). The value read is the same on every rank (a maximum over ranks), so every rank takes
the same decision at the same step, within one step of the first non-finite value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["NonFiniteGuard"]


class NonFiniteGuard:
    """Watch for NaN/inf each optimizer step without a host sync (see the module docstring).

    Example:
        >>> g = NonFiniteGuard("cpu")
        >>> g.push(torch.tensor(0), torch.tensor([2.0]), torch.tensor(1.5), lambda t: t)
        >>> g.poll()
        0
        >>> g.push(torch.tensor(0), torch.tensor([2.0]), torch.tensor(float("nan")), lambda t: t)
        >>> g.poll()
        1
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._inflight: list[tuple[Tensor, Any]] = []
        self.seen = 0  # non-finite findings so far (inputs counted plus bad alphas and losses, all ranks)

    def push(
        self, input_count: Tensor | None, alphas: Tensor | None, loss: Any, reduce_max: Callable[[Tensor], Tensor]
    ) -> None:
        """This step's findings (device tensors), reduced over ranks, copied to the host asynchronously."""
        parts = [torch.zeros((), dtype=torch.float64, device=self.device)]
        if input_count is not None:
            parts.append(input_count.to(torch.float64))
        if alphas is not None:
            parts.append((~torch.isfinite(alphas)).sum().to(torch.float64))
        if isinstance(loss, Tensor) and loss.numel() == 1:
            parts.append((~torch.isfinite(loss.detach())).to(torch.float64).reshape(()))
        flag = reduce_max(torch.stack(parts).sum().reshape(1))
        if flag.is_cuda:
            host = torch.empty(1, dtype=torch.float64, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._inflight.append((host, event))
        else:
            self._inflight.append((flag, None))

    def poll(self) -> int:
        """Findings up to the previous push (on the CPU: up to the last one), the same on every rank."""
        keep = 1 if self._inflight and self._inflight[-1][1] is not None else 0
        while len(self._inflight) > keep:
            host, event = self._inflight.pop(0)
            if event is not None:
                event.synchronize()  # the previous step's copy: long done unless the host runs a step ahead
            self.seen = max(self.seen, int(host.item()))
        return self.seen
