"""Saturation counts as sum states: per-layer int64 sums that add up across DDP ranks.

The counter only holds states. Which inputs are counted, and when, is the hooks' business
(:mod:`satmon.observe.saturation`); the per-element math is :mod:`satmon.functional.saturation`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from satmon.functional.saturation import Product, check_product, saturation_fraction
from satmon.observe.states import SumStates

__all__ = ["SaturationCounter"]


class SaturationCounter(SumStates):
    """Per-layer counts of saturated, non-finite and total DyT input elements.

    States are int64 tensors of shape ``(L,)``, summed over ranks when read (:meth:`synced`, one
    packed ``all_reduce``): DDP ranks add raw counts, never averaged fractions, so the pooled
    fraction over ranks equals the one a single process would get over the same global data.

    Args:
        num_layers: number of monitored layers ``L``.
        level: the saturation level the counts use (kept with the counts: ``|alpha * x| > level`` for
            DyT; other point-wise functions use their own cut-off at this level,
            :func:`satmon.functional.saturation.pointwise_cutoff`).
        product: which product the counts compare (kept with the counts too): ``"module"`` the
            product as the layer's forward rounds it (``torch.result_type(alpha, x)``, the study's
            measure), ``"exact"`` the real product (:mod:`satmon.functional.saturation`).

    Example:
        >>> c = SaturationCounter(num_layers=2)
        >>> c.update(torch.tensor([0, 1]), saturated=torch.tensor([2, 0]), total=torch.tensor([3, 4]))
        >>> c.compute()["per_layer"].tolist(), c.compute()["pooled"].item()
        ([0.6666666666666666, 0.0], 0.2857142857142857)
    """

    saturated: Tensor
    total: Tensor
    nonfinite: Tensor

    def __init__(self, num_layers: int, level: float = 2.0, product: Product = "module", **kwargs) -> None:
        if "keep_inputs" in kwargs:
            raise TypeError(
                "SaturationCounter(keep_inputs=...) moved to SaturationHooks(keep_inputs=...) in satmon 0.2: "
                "the counter holds states only."
            )
        if kwargs:
            raise TypeError(
                f"Expected SaturationCounter(num_layers, level=, product=), got unknown options {sorted(kwargs)} "
                "(satmon 0.3's counters are sum states, not torchmetrics metrics: no torchmetrics options)."
            )
        super().__init__()
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"Expected num_layers to be an int >= 1, got {num_layers!r}.")
        check_product(product)
        self.level = float(level)
        self.product = product
        for name in ("saturated", "total", "nonfinite"):
            self.add_state(name, torch.zeros(num_layers, dtype=torch.int64))

    @property
    def num_layers(self) -> int:
        return self.total.numel()

    def update(
        self, index: Tensor | int, saturated: Tensor | int, total: Tensor | int, nonfinite: Tensor | int = 0
    ) -> None:
        """Add counts to layers ``index`` (an int, or a 1-d tensor of layer indices with matching counts;
        an int count applies to every index). Tensor ops only: no host sync."""
        if isinstance(index, int):
            for state, v in ((self.saturated, saturated), (self.total, total), (self.nonfinite, nonfinite)):
                state.select(0, index).add_(v)
            return
        idx = index.to(self.total.device, non_blocking=True)
        for state, v in ((self.saturated, saturated), (self.total, total), (self.nonfinite, nonfinite)):
            if isinstance(v, Tensor):
                state.index_add_(0, idx, v.to(device=state.device, dtype=torch.int64, non_blocking=True))
            elif v:
                state.index_add_(0, idx, torch.full(idx.shape, int(v), dtype=torch.int64, device=state.device))

    #: the name compiled hooks and the queue's fold use (0.2 kept it apart from torchmetrics' ``update`` wrapper)
    add_counts = update

    def compute(self, sync: bool = False) -> dict[str, Tensor]:
        """Fractions (float64): ``pooled`` (0-dim) and ``per_layer`` (``(L,)``), plus copies of the raw counts.

        Args:
            sync: sum the counts over ranks first (one collective: every rank must call it at the same point).
        """
        s = self.synced(sync)
        return {
            "pooled": saturation_fraction(s["saturated"].sum(), s["total"].sum()),
            "per_layer": saturation_fraction(s["saturated"], s["total"]),
            **s,
        }
