"""Sum states: the device tensors satmon's hooks add into, summed across processes in one collective.

Every state satmon keeps during a window is a sum (element counts, saturated counts, float64 sums of
statistics), so the only cross-rank operation it needs is an all-reduce with ``SUM``. A
:class:`SumStates` holds named tensors, adds into them with tensor ops only (no host sync, nothing
created on the host), and reads them back summed over ranks with **one** packed ``all_reduce`` per
read: every state is packed into a single float64 vector, an int64 state as two exact 32-bit halves,
so counts stay exact for any value (each half summed over fewer than 2**21 ranks stays below 2**53).

Why not torchmetrics' ``Metric``: its ``update``/``compute`` wrapper keeps Python counters and a
result cache that hooks adding into states from inside a training step (and from a compiled graph,
where the counters become guards) would bypass or recompile on; its ``sync`` gathers every state from
every rank (``all_gather``, one collective per state) where satmon needs one sum; and it costs the
import of torchmetrics in a package whose core must import fast. See docs/reference/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["SumStates", "all_reduce_sum"]

_LOW = 0xFFFFFFFF


def _distributed() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def _pack(tensors: list[Tensor]) -> Tensor:
    """One float64 vector: floating-point tensors as float64, integer ones (non-negative counts) as two
    exact float64 halves of 32 bits each."""
    parts: list[Tensor] = []
    for t in tensors:
        flat = t.reshape(-1)
        if t.dtype.is_floating_point:
            parts.append(flat.to(torch.float64))
        else:
            v = flat.to(torch.int64)
            parts += [(v >> 32).to(torch.float64), (v & _LOW).to(torch.float64)]
    return torch.cat(parts)


def _unpack(packed: Tensor, like: list[Tensor]) -> list[Tensor]:
    """:func:`_pack`'s inverse, for tensors shaped and typed as ``like``."""
    out, i = [], 0
    for t in like:
        n = t.numel()
        if t.dtype.is_floating_point:
            v = packed[i : i + n].to(t.dtype)
            i += n
        else:
            hi, lo = packed[i : i + n].to(torch.int64), packed[i + n : i + 2 * n].to(torch.int64)
            v = ((hi << 32) + lo).to(t.dtype)
            i += 2 * n
        out.append(v.reshape(t.shape))
    return out


def all_reduce_sum(tensors: list[Tensor]) -> list[Tensor]:
    """``tensors`` summed over the processes of the default group, in one ``all_reduce`` (copies; the
    inputs are not changed). Without ``torch.distributed`` (or with one process), copies of the inputs.

    Every rank must call it at the same point with tensors of the same shapes and dtypes. Integer
    tensors (non-negative counts) travel as two float64 halves of 32 bits each: exact; floating-point
    ones as float64.

    Example:
        >>> out = all_reduce_sum([torch.tensor([3, 2**40 + 1]), torch.tensor([0.5])])  # one process
        >>> out[0].tolist(), out[1].tolist()
        ([3, 1099511627777], [0.5])
    """
    if not _distributed():
        return [t.clone() for t in tensors]
    packed = _pack(tensors)  # (sum of numels, integer ones twice,)
    torch.distributed.all_reduce(packed)  # SUM: the one collective of a read
    return _unpack(packed, tensors)


class SumStates:
    """Named device tensors that only ever add up: the states of satmon's hooks.

    Subclasses declare their states with :meth:`add_state` (a name and a zero tensor); the hooks add
    into them (``self.total.select(0, i).add_(n)``, ``index_add_``...). :meth:`synced` reads them
    summed over ranks (one collective), :meth:`reset` zeroes them, :meth:`to` moves them, and
    :meth:`state_dict` / :meth:`load_state_dict` keep them in checkpoints.

    Example:
        >>> class Counts(SumStates):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.add_state("seen", torch.zeros(2, dtype=torch.int64))
        >>> c = Counts()
        >>> c.seen.add_(torch.tensor([1, 2]))
        tensor([1, 2])
        >>> c.synced(sync=False)["seen"].tolist(), c.state_names
        ([1, 2], ('seen',))
        >>> c.reset(); c.seen.tolist()
        [0, 0]
    """

    def __init__(self) -> None:
        self._defaults: dict[str, Tensor] = {}

    def add_state(self, name: str, default: Tensor) -> None:
        """Declare a state ``name`` starting at (a copy of) ``default``, reachable as ``self.<name>``."""
        if not isinstance(default, Tensor):
            raise TypeError(f"Expected a tensor default for state {name!r}, got {type(default).__name__}.")
        self._defaults[name] = default.detach().clone()
        setattr(self, name, default.detach().clone())

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(self._defaults)

    @property
    def device(self) -> torch.device:
        return next(iter(self._states().values())).device

    def _states(self) -> dict[str, Tensor]:
        return {k: getattr(self, k) for k in self._defaults}

    def to(self, device: torch.device | str | None = None):
        """Move every state (and its default) to ``device``; returns ``self``."""
        for k in self._defaults:
            self._defaults[k] = self._defaults[k].to(device)
            setattr(self, k, getattr(self, k).to(device))
        return self

    def reset(self) -> None:
        """Every state back to its default, in place (tensors keep their identity: hooks may hold them)."""
        for k, default in self._defaults.items():
            getattr(self, k).copy_(default)

    def synced(self, sync: bool = True) -> dict[str, Tensor]:
        """Every state by name, summed over ranks with ``sync`` (one ``all_reduce``: every rank must call it at
        the same point); copies either way, so the local states are not changed."""
        states = self._states()
        values = all_reduce_sum(list(states.values())) if sync else [t.clone() for t in states.values()]
        return dict(zip(states, values))

    def state_dict(self) -> dict[str, Tensor]:
        """This process's states (copies)."""
        return {k: t.detach().clone() for k, t in self._states().items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy saved values (tensors or lists) into the states of the same names and sizes.

        Raises:
            ValueError: for a state saved with another size, naming it (the layers or blocks changed).
        """
        for k, v in state.items():
            t = getattr(self, k, None) if k in self._defaults else None
            if t is None:
                continue
            v = torch.as_tensor(v, dtype=t.dtype)
            if v.numel() != t.numel():
                raise ValueError(
                    f"Expected {t.numel()} values for state {k!r}, got {v.numel()}: the saved states come "
                    "from another set of layers. Resume with the same model."
                )
            t.copy_(v.reshape(t.shape))
