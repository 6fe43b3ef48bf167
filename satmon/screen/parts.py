"""What a :class:`~satmon.screen.screen.Screen` builds when it attaches: the window's hooks and states,
the collapse watch and the non-finite guard, all on the DyT layers' device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from satmon.results.stop import StopReason, breaches
from satmon.screen.watch import CollapseWatch, LossHistory
from satmon.observe.counters import SaturationCounter
from satmon.observe.gate import GateCounter, GateHooks
from satmon.screen.nonfinite_guard import NonFiniteGuard
from satmon.observe.offset import OffsetCounter, OffsetHooks
from satmon.observe.saturation import SaturationHooks
from satmon.settings import Settings
from satmon.observe.window_loss import WindowLoss
from satmon.model.discovery import NormLayer

__all__ = ["ScreenParts", "build_parts"]


@dataclass
class ScreenParts:
    """The hook sets and device states of one attached screen (``None``: switched off by the settings)."""

    hooks: SaturationHooks
    window_loss: WindowLoss
    losses: LossHistory | None = None  # the watch's loss history
    offset_hooks: OffsetHooks | None = None
    gate_hooks: GateHooks | None = None
    watch: CollapseWatch | None = None
    guard: NonFiniteGuard | None = None


def build_parts(s: Settings, layers: list[NormLayer], gating: Any, model: nn.Module, keep_inputs: bool | None) -> ScreenParts:
    """Make (not attach) every hook set and state the settings ask for (``keep_inputs=None``: on a CPU model)."""
    device = layers[0].module.alpha.device
    n = len(layers)
    keep = device.type == "cpu" if keep_inputs is None else keep_inputs  # kept: counted when the model's forward returns

    def saturation_hooks(refused: dict[str, str] | None = None) -> SaturationHooks:
        return SaturationHooks(layers, SaturationCounter(n, level=s.level, product=s.product).to(device), keep,
                               refused=refused, root=model)

    hooks = saturation_hooks()
    parts = ScreenParts(hooks, WindowLoss(s.window).to(device))
    if s.offset_every:  # the hook sets share one record of refused layers: each warns once per run
        parts.offset_hooks = OffsetHooks(layers, OffsetCounter(n).to(device), s.level, hooks.refused)
    pairings = gating.pairings if gating is not None else {}
    if pairings:
        parts.gate_hooks = GateHooks(model, gating, GateCounter(len(pairings)).to(device))
    if s.watch_every_n_steps:
        parts.losses = LossHistory(s.loss_baseline + s.watch_every_n_steps, device=device)
        gated = [i for i, layer in enumerate(layers) if layer.name in pairings]
        parts.watch = CollapseWatch(saturation_hooks(hooks.refused), gated, parts.gate_hooks,
                                    {k: p.mlp for k, p in pairings.items()}, s.watch_every_n_steps,
                                    s.collapse_threshold, s.loss_spike_z, s.patience, parts.losses)
    if breaches(s.abort_on, StopReason.NONFINITE):
        parts.guard = NonFiniteGuard(device)
    return parts
