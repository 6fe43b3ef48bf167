"""Forward hooks that stream activations into float64 ``d x d`` accumulators (the probe's covariances).

A :class:`CovarianceTap` holds one :class:`~satmon.functional.dead_directions.CovarianceAccumulator`,
made on the first call at the activations' width and device; :class:`CovarianceTaps` hooks a set of
them on module outputs (a norm layer, a residual block) or inputs (``X_0``, the first block's input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import nn
from torch.utils.hooks import RemovableHandle

from satmon.batches import first_tensor
from satmon.functional.dead_directions import CovarianceAccumulator
from satmon.observe.hookset import HookSet

__all__ = ["CovarianceTap", "CovarianceTaps", "TapTarget"]


class CovarianceTap:
    """Streams one module's output (or input) rows ``(..., d)`` into a float64 accumulator, made on first use.

    A call it cannot use (no floating-point tensor, a width other than ``dim``, wider than
    ``max_dim``, a width that changes) marks the tap skipped, with the reason in :attr:`skipped`;
    later calls are ignored.

    Args:
        max_dim: widest activation accepted.
        dim: the width the layer's weight says (``None``: any width up to ``max_dim``).
        limit_note: why ``max_dim`` is what it is, for the skip reason (default ``"max_dim"``).
        axis: the dimension holding the channels (``-1``; ``1`` for a channels-first layer's ``(B, C, H, W)``).

    Example:
        >>> import torch
        >>> tap = CovarianceTap(max_dim=8)
        >>> tap.add(torch.ones(5, 4)); tap.ready().count
        5
        >>> wide = CovarianceTap(max_dim=2); wide.add(torch.ones(5, 4)); wide.skipped
        'd=4 > max_dim=2'
    """

    def __init__(self, max_dim: int, dim: int | None = None, limit_note: str = "max_dim", axis: int = -1) -> None:
        self.max_dim, self.dim, self.limit_note, self.axis = max_dim, dim, limit_note, axis
        self.acc: CovarianceAccumulator | None = None
        self.skipped = ""

    def add(self, out: Any) -> None:
        """Add the rows of the first tensor in ``out`` (a tensor, or a tuple/list/dict holding one)."""
        if self.skipped:
            return
        x = first_tensor(out)
        if x is None or not x.is_floating_point() or x.dim() == 0:
            self.skipped = "no floating-point tensor output"
            return
        if self.axis != -1:
            if x.dim() <= self.axis:
                self.skipped = f"its output has {x.dim()} dimension(s), no channel axis {self.axis}"
                return
            x = x.movedim(self.axis, -1)  # (B, C, H, W) -> (B, H, W, C): every position is a token
        d = x.shape[-1]
        if self.acc is None:
            if self.dim is not None and d != self.dim:
                self.skipped = f"its output has {d} channels last, its weight {self.dim}"
                return
            if d > self.max_dim:
                self.skipped = f"d={d} > {self.limit_note}={self.max_dim}"
                return
            self.acc = CovarianceAccumulator(d, device=x.device)
        elif d != self.acc.dim:
            self.skipped = f"width changed between calls ({self.acc.dim} -> {d})"
            return
        self.acc.update(x)

    def ready(self) -> CovarianceAccumulator | None:
        """The accumulator when it holds at least one row and the tap was not skipped, else ``None``."""
        if self.skipped:
            return None
        if self.acc is None or self.acc.count == 0:
            self.skipped = "not called during the forward passes (or only non-finite rows)"
            return None
        return self.acc

    def release(self) -> None:
        """Drop the accumulator (its ``d x d`` matrix): the reading was taken."""
        self.acc = None


@dataclass(frozen=True)
class TapTarget:
    """Where one covariance is taken.

    Attributes:
        name: the reading's name (a layer, a block, or ``"embedding"``).
        module: the module hooked.
        site: ``"output"`` (its forward's output) or ``"input"`` (its first positional input, or
            Hugging Face's ``hidden_states=`` keyword).
        dim: the expected width (a norm layer's weight), ``None`` when any width is accepted.
        max_dim: widest activation accepted.
        limit_note: why ``max_dim`` is what it is (shown when a wider activation is skipped).
        width: the width expected before the forward, for memory planning (``None``: unknown).
        axis: the dimension holding the channels (``-1``, or ``1`` for a channels-first norm layer).
    """

    name: str
    module: nn.Module
    site: Literal["output", "input"]
    dim: int | None
    max_dim: int
    limit_note: str = "max_dim"
    width: int | None = None
    axis: int = -1


class CovarianceTaps(HookSet):
    """One :class:`CovarianceTap` per :class:`TapTarget`, fed by forward (pre-)hooks.

    Args:
        targets: where to tap.

    Example:
        >>> import torch
        >>> ln = torch.nn.LayerNorm(4)
        >>> taps = CovarianceTaps([TapTarget("ln", ln, "output", 4, 8)]).attach()
        >>> _ = ln(torch.randn(10, 4)); taps.detach()
        >>> taps.taps["ln"].ready().count
        10
    """

    def __init__(self, targets: list[TapTarget]) -> None:
        super().__init__()
        self.targets = list(targets)
        self.taps = {t.name: CovarianceTap(t.max_dim, t.dim, t.limit_note, t.axis) for t in self.targets}

    def _register(self) -> list[RemovableHandle]:
        handles = []
        for t in self.targets:
            tap = self.taps[t.name]
            if t.site == "input":
                handles.append(t.module.register_forward_pre_hook(self._input_hook(tap), with_kwargs=True))
            else:
                handles.append(t.module.register_forward_hook(self._output_hook(tap)))
        return handles

    def _output_hook(self, tap: CovarianceTap):
        def hook(_m: nn.Module, _args: tuple, out: Any) -> None:
            if self.enabled:
                tap.add(out)

        return hook

    def _input_hook(self, tap: CovarianceTap):
        """Forward pre-hook: the module's hidden-state input (positional, or HF's ``hidden_states=``)."""

        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self.enabled:
                return
            if args:
                tap.add(args[0])
            else:
                tap.add(kwargs["hidden_states"] if "hidden_states" in kwargs else first_tensor(kwargs))

        return hook
