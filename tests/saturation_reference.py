"""Independent re-counts of ``|alpha * x| > level`` for the saturation tests (no satmon code), and a hook-set builder."""

from __future__ import annotations

import torch
from torch import nn

from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import SaturationHooks
from satmon import find_dyt_layers


def float64_count(x: torch.Tensor, alpha: torch.Tensor, level: float = 2.0) -> int:
    """The real product in float64 (exact for float32-or-narrower operands)."""
    return int(((alpha.detach().to(torch.float64) * x.detach().to(torch.float64)).abs() > level).sum())


def module_count(x: torch.Tensor, alpha: torch.Tensor, level: float = 2.0) -> int:
    """The product as the layer's forward computes it: torch's own ``alpha * x`` in ``result_type(alpha, x)``."""
    return int(((alpha.detach() * x.detach()).abs() > level).sum())


def reference(x: torch.Tensor, alpha: torch.Tensor, level: float = 2.0) -> int:
    """The float64 re-count, for data off the level's rounding boundary (checked: there the module product,
    satmon's default rule, falls on the same side)."""
    exact = float64_count(x, alpha, level)
    assert module_count(x, alpha, level) == exact, "data within one rounding of the level: pick other data"
    return exact


def hooked(model: nn.Module, keep_inputs: bool = False, **counter) -> SaturationHooks:
    """Attached saturation hooks on every DyT layer of ``model`` (``counter``: SaturationCounter options)."""
    layers = find_dyt_layers(model)
    return SaturationHooks(layers, SaturationCounter(len(layers), **counter), keep_inputs=keep_inputs).attach()
