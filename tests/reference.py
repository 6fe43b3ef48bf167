"""The tests' one float64 reference: saturation counts ``|alpha * x| > level`` (and the gate statistics) recounted
with no satmon code, in the spirit of torchmetrics' shared tester. Every test that checks a count against an
independent recount takes it from here, so that the reference itself is written, and tested
(``tests/test_reference.py``), once.

Two products, as :mod:`satmon.functional.saturation` defines them:

- ``"exact"``: the real product ``alpha * x (+ shift)``, in float64 (exact for float32-or-narrower operands: a
  product of two 24-bit significands fits in 53 bits);
- ``"module"``: the product as the layer's forward computes it, rounded to ``torch.result_type(alpha, x)``, then
  compared with ``level`` exactly (in float64: a level such as erf's cut-off is no float32 value).

What is recorded: :class:`InputRecorder` keeps every DyT-family input (and its ``alpha``, in float64) of the
forwards a test chooses (training forwards by default) from hooks of its own; :func:`model_counts` counts a
model's DyT inputs over given batches in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from satmon.results.verdict import LayerCounts

__all__ = [
    "InputRecorder",
    "count",
    "counts_of",
    "exact_count",
    "gate_stats",
    "model_counts",
    "module_count",
    "pooled",
    "reference",
]


def exact_count(x: Tensor, alpha: Tensor, level: float = 2.0, shift: Tensor | None = None) -> int:
    """``|alpha * x (+ shift)| > level`` with the real product, in float64."""
    u = alpha.detach().to(torch.float64) * x.detach().to(torch.float64)
    if shift is not None:
        u = u + shift.detach().to(torch.float64)
    return int((u.abs() > level).sum())


def module_count(x: Tensor, alpha: Tensor, level: float = 2.0, shift: Tensor | None = None) -> int:
    """``|alpha * x (+ shift)| > level`` with the product the forward's ``tanh`` receives: every operand rounded to
    ``dt = result_type(alpha, x (, shift))`` and the arithmetic in ``dt``, then compared with ``level`` exactly (in
    float64: a level such as erf's cut-off is no float32 value)."""
    alpha, x = alpha.detach(), x.detach()
    dt = torch.result_type(alpha, x) if shift is None else (alpha * x + shift.detach()).dtype  # torch's own promotion
    u = alpha.to(dt) * x.to(dt)
    if shift is not None:
        u = u + shift.detach().to(dt)
    return int((u.abs().to(torch.float64) > level).sum())


def count(x: Tensor, alpha: Tensor, level: float = 2.0, product: str = "exact") -> int:
    """The recount under ``product`` (``"exact"`` or ``"module"``)."""
    if product not in ("exact", "module"):
        raise ValueError(f"Expected product 'exact' or 'module', got {product!r}")
    return exact_count(x, alpha, level) if product == "exact" else module_count(x, alpha, level)


def reference(x: Tensor, alpha: Tensor, level: float = 2.0) -> int:
    """The exact recount, for data off the level's rounding boundary (checked: there the module product, satmon's
    default rule, falls on the same side)."""
    exact = exact_count(x, alpha, level)
    assert module_count(x, alpha, level) == exact, "data within one rounding of the level: pick other data"
    return exact


def counts_of(items: Iterable[tuple[Tensor, Tensor]], level: float = 2.0) -> tuple[int, int]:
    """``(saturated, total)`` elements over recorded ``(x, alpha)`` pairs (an :class:`InputRecorder`'s list)."""
    sat = total = 0
    for x, alpha in items:
        sat += exact_count(x, alpha, level)
        total += x.numel()
    return sat, total


def pooled(per_layer: Mapping[str, tuple[int, int]]) -> float:
    """The pooled fraction of ``{layer: (saturated, total)}``: summed counts over summed elements."""
    return sum(s for s, _ in per_layer.values()) / sum(t for _, t in per_layer.values())


def gate_stats(g: Tensor, hidden: Tensor, flat_threshold: float) -> tuple[float, float]:
    """A gated MLP's ``(flat fraction, mean |hidden|)`` in float64: the share of gate pre-activations ``g`` below the
    activation's flat-tail edge, and the mean magnitude of ``act(g) * u`` (``hidden``, the down projection's input)."""
    g, hidden = g.detach().to(torch.float64), hidden.detach().to(torch.float64)
    return float((g < flat_threshold).to(torch.float64).mean()), float(hidden.abs().mean())


class InputRecorder:
    """Every input of the named DyT-family layers, with its ``alpha``, in float64, as the forwards see them.

    Args:
        model: the model.
        names: the layers' qualified names in ``model``.
        when: which forwards to record, from the layer (default: training forwards only, ``mod.training``).
    """

    def __init__(
        self, model: nn.Module, names: Iterable[str], when: Callable[[nn.Module], bool] = lambda mod: mod.training
    ) -> None:
        modules = dict(model.named_modules())
        self.when = when
        self.inputs: dict[str, list[tuple[Tensor, Tensor]]] = {n: [] for n in names}
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in self.inputs]

    def _hook(self, name: str):
        def hook(mod: nn.Module, args: tuple, out: object) -> None:
            if self.when(mod):
                self.inputs[name].append(
                    (args[0].detach().to(torch.float64).clone(), mod.alpha.detach().to(torch.float64).clone())
                )

        return hook

    def counts(self, level: float = 2.0, first: int | None = None) -> dict[str, tuple[int, int]]:
        """``{layer: (saturated, total)}`` over the recorded inputs (the ``first`` forwards of each layer, or all)."""
        return {
            name: counts_of(items if first is None else items[:first], level) for name, items in self.inputs.items()
        }

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def model_counts(
    model: nn.Module, inputs: Iterable[Tensor], level: float = 2.0, names: Iterable[str] | None = None
) -> dict[str, LayerCounts]:
    """Saturated / total DyT input elements of ``model`` over ``inputs`` (eval mode, no grad), in float64: the layers
    ``names`` (default: every :class:`satmon.DyT`)."""
    from satmon import DyT

    names = [n for n, m in model.named_modules() if isinstance(m, DyT)] if names is None else list(names)
    recorder = InputRecorder(model, names, when=lambda mod: True)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for x in inputs:
                model(x)
    finally:
        recorder.remove()
        model.train(was_training)
    return {n: LayerCounts(*c) for n, c in recorder.counts(level).items()}
