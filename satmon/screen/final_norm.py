"""The run's final norm for the forecast's domain (:func:`satmon.results.forecast.forecast_from`): the kind of the
norm before the head, read by what the model computes, the last normaliser (DyT, LayerNorm or RMSNorm) to start in a
forward (:class:`~satmon.observe.trap.ForwardOrder`, the trap watch's reading of the forward's module order), never
by names.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from satmon.observe.trap import ForwardOrder

__all__ = ["FinalNorm"]


class FinalNorm:
    """The final norm's kind for the forecast (``"dyt"``, ``"layernorm"``, ``"rmsnorm"``; ``None``: not known), by
    what the model computes: the last normaliser to start in the first forward after :meth:`attach`
    (:meth:`~satmon.observe.trap.ForwardOrder.final_kind`; unknown where a module that looks like a normaliser but
    could not be read started after it). The :class:`~satmon.observe.trap.ForwardOrder` keeps host-side counters
    only (no tensor is read) and is detached at the next :meth:`settle` once that forward ran. A compiled model's
    forward is not recorded: the kind stays unknown.

    Example:
        >>> import torch
        >>> from satmon.dyt import DyT
        >>> model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 4), DyT(4), torch.nn.Linear(4, 2))
        >>> final = FinalNorm(model).attach()
        >>> _ = model(torch.randn(1, 4)); final.settle()
        >>> final.kind, final.order
        ('dyt', None)
    """

    def __init__(self, model: nn.Module) -> None:
        self.order: ForwardOrder | None = ForwardOrder(model)
        self._kind: str | None = None

    def attach(self) -> FinalNorm:
        if self.order is not None:
            self.order.attach()
        return self

    def detach(self) -> None:
        if self.order is not None:
            self.order.detach()

    def paused_sets(self) -> list[Any]:
        """The hook set a paused block switches off (validation, a probe's forwards) until the kind is read."""
        return [] if self.order is None else [self.order]

    def settle(self) -> None:
        """Between steps: once a forward was recorded, read the final norm's kind and detach (O(1) until then)."""
        if self.order is not None and not self.order.alive:  # the model was freed: its kind stays unknown
            self.order = None
        if self.order is not None and self.order.seen:
            self.order.detach()
            self._kind, self.order = self.order.final_kind(), None

    @property
    def kind(self) -> str | None:
        self.settle()
        return self._kind
