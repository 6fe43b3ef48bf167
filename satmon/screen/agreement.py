"""How ranks agree on a decision. The core asks; a driver answers with its framework's collectives.

Every method is a collective when more than one process runs: every rank must call it at the same
point of the same step (satmon calls them only at optimizer-step ends that every rank reaches).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["Agreement", "TorchDistributed"]


@runtime_checkable
class Agreement(Protocol):
    """The three things satmon needs from a distributed back end."""

    rank: int
    world_size: int

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        ...

    def max(self, values: Tensor) -> Tensor:
        """Element-wise maximum over ranks of a float64 tensor."""
        ...


class TorchDistributed:
    """``torch.distributed`` when it is initialised; a single process otherwise.

    Example:
        >>> a = TorchDistributed()
        >>> a.any(True), a.max(torch.tensor([1.0, 2.0])).tolist(), a.world_size
        (True, [1.0, 2.0], 1)
    """

    @staticmethod
    def _on() -> bool:
        return torch.distributed.is_available() and torch.distributed.is_initialized()

    @property
    def rank(self) -> int:
        return torch.distributed.get_rank() if self._on() else 0

    @property
    def world_size(self) -> int:
        return torch.distributed.get_world_size() if self._on() else 1

    def any(self, flag: bool) -> bool:
        if not self._on():
            return bool(flag)
        return bool(self.max(torch.tensor([float(flag)], dtype=torch.float64)).item())

    def max(self, values: Tensor) -> Tensor:
        if not self._on():
            return values
        out = values.clone()
        if torch.distributed.get_backend() == "nccl" and not out.is_cuda:
            out = out.cuda()
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MAX)
        return out.to(values.device)
