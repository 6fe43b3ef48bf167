"""Saturation counts as torchmetrics states: per-layer sums that add up across DDP ranks.

The counter only holds states. Which inputs are counted, and when, is the hooks' business
(:mod:`satmon.observe.saturation`); the per-element math is :mod:`satmon.functional.saturation`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from satmon.functional.saturation import Product, check_product, saturation_fraction

__all__ = ["SaturationCounter"]


class SaturationCounter(Metric):
    """Per-layer counts of saturated, non-finite and total DyT input elements.

    States are int64 tensors of shape ``(L,)`` declared with ``dist_reduce_fx="sum"``: DDP ranks
    add up raw counts, never averaged fractions, so the pooled fraction over ranks equals the one
    a single process would get over the same global data.

    Args:
        num_layers: number of monitored layers ``L``.
        level: the saturation level the counts use (kept with the counts: ``|alpha * x| > level``).
        product: which product the counts compare with ``level`` (kept with the counts too):
            ``"module"`` the product as the layer's forward rounds it (``torch.result_type(alpha, x)``,
            the study's measure), ``"exact"`` the real product (:mod:`satmon.functional.saturation`).

    Example:
        >>> c = SaturationCounter(num_layers=2)
        >>> c.update(torch.tensor([0, 1]), saturated=torch.tensor([2, 0]), total=torch.tensor([3, 4]))
        >>> c.compute()["per_layer"].tolist(), c.compute()["pooled"].item()
        ([0.6666666666666666, 0.0], 0.2857142857142857)
    """

    full_state_update = False
    higher_is_better = None
    is_differentiable = False

    saturated: Tensor
    total: Tensor
    nonfinite: Tensor

    def __init__(self, num_layers: int, level: float = 2.0, product: Product = "module", **kwargs) -> None:
        if "keep_inputs" in kwargs:
            raise TypeError("SaturationCounter(keep_inputs=...) moved to SaturationHooks(keep_inputs=...) in satmon 0.2: "
                            "the counter holds states only.")
        # compiled hooks add counts outside ``update()``, so torchmetrics' result cache could go stale
        kwargs.setdefault("compute_with_cache", False)
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"Expected num_layers to be an int >= 1, got {num_layers!r}.")
        check_product(product)
        self.level = float(level)
        self.product = product
        for name in ("saturated", "total", "nonfinite"):
            self.add_state(name, default=torch.zeros(num_layers, dtype=torch.int64), dist_reduce_fx="sum")

    @property
    def num_layers(self) -> int:
        return self.total.numel()

    def update(self, index: Tensor | int, saturated: Tensor | int, total: Tensor | int,  # type: ignore[override]
               nonfinite: Tensor | int = 0) -> None:
        """Add counts to layers ``index`` (an int, or a 1-d tensor of layer indices with matching counts)."""
        self.add_counts(index, saturated, total, nonfinite)

    def add_counts(self, index: Tensor | int, saturated: Tensor | int, total: Tensor | int,
                   nonfinite: Tensor | int = 0) -> None:
        """:meth:`update` without torchmetrics' wrapper (tensor ops only: the path of compiled hooks,
        where the wrapper's Python call counter would be a guard that recompiles every step)."""
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

    def compute(self) -> dict[str, Tensor]:
        """Fractions (float64): ``pooled`` (0-dim) and ``per_layer`` (``(L,)``), plus raw counts."""
        return {
            "pooled": saturation_fraction(self.saturated.sum(), self.total.sum()),
            "per_layer": saturation_fraction(self.saturated, self.total),
            "saturated": self.saturated.clone(),
            "total": self.total.clone(),
            "nonfinite": self.nonfinite.clone(),
        }
