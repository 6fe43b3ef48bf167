"""The layers that change while the window counts: a DyT layer added, replaced, moved or removed mid-window is
followed at its first forward (or, unregistered, at the window's end). :class:`FollowingChanges` is the part of
:class:`~satmon.screen.screen.Screen` that does it: the layers that appeared get hook sets of their own, counted from
their first forward; the counts of the ones that went are kept; the verdict's notes name each change (layer and step).
It holds no state of its own (the screen's attributes below).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from satmon.model.map import ModelMap, model_map
from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import HookReadings, SaturationHooks
from satmon.settings import Settings

__all__ = ["FollowingChanges"]


class FollowingChanges:
    """How a :class:`~satmon.screen.screen.Screen` follows the DyT layers that change during the window (a base class:
    the attributes below are the screen's)."""

    settings: Settings
    verdict: Any
    hooks: SaturationHooks | None
    notes: list[str]
    layer_names: list[str]
    _map: ModelMap | None
    _model: nn.Module | None
    _last_step: int
    _keep_inputs: bool
    _counted: dict[str, nn.Module]
    _late: list[SaturationHooks]
    _first_forward_hooks: list[Any]

    def _registered(self, _map: ModelMap, name: str, submodule: nn.Module | None) -> None:
        """A module is being registered under the model: its first forward (the screen's next chance to see it
        in place) follows the change, so that the DyT layers it holds are counted from their first forward."""
        if self.verdict is None and self.hooks is not None and self.hooks.attached and isinstance(submodule, nn.Module):
            self._first_forward_hooks.append(submodule.register_forward_pre_hook(self._first_forward))

    def _first_forward(self, _module: nn.Module, _args: Any) -> None:
        self._drop_first_forward_hooks()
        if self._map is not None and self.hooks is not None and self.hooks.attached:
            self._follow_changes(max(self._last_step, 0))

    def _drop_first_forward_hooks(self) -> None:
        for h in self._first_forward_hooks:
            h.remove()
        self._first_forward_hooks = []

    def _count_sets(self) -> list[SaturationHooks]:
        """The window's saturation hook sets: the layers found at attach, then those of the
        layers that appeared since."""
        assert self.hooks is not None
        return [self.hooks, *self._late]

    def _follow_sampling(self, hooks: SaturationHooks) -> None:
        """``hooks`` count this step when the window's hooks do, with its thresholds refreshed before the forward
        (one batched op per step instead of one per layer)."""
        assert self.hooks is not None
        hooks.enabled = self.hooks.enabled
        if hooks.enabled:
            hooks.refresh_thresholds()

    def _stop_counting(self, name: str) -> None:
        """The module counted under ``name`` left that name: its hook goes (its counts stay), so that a module moved
        to another name is counted once, under the name it now runs as."""
        for hooks in reversed(self._count_sets()):  # the latest set holding the name counts its module now
            names = [l.name for l in hooks.layers]
            if name in names and hooks.attached:
                hooks._handles[names.index(name)].remove()
                return

    def _follow_changes(self, step: int, at_end: bool = False) -> None:
        """The model's point-wise layers changed: count the ones that appeared from their first forward, keep the
        counts of the ones that went, and say so in the verdict's notes (layer and step)."""
        assert self._map is not None and self.hooks is not None
        try:
            model = self._map.model
        except RuntimeError:  # the model is gone: nothing to follow
            self._map = None
            return
        s = self.settings
        new = model_map(model)
        if new is self._map:
            return
        current = {l.name: l for l in new.layers(("dyt",), include=s.include, exclude=s.exclude)}
        self._drop_first_forward_hooks()  # the change is followed now
        when = f"before step {step}" if at_end else f"at step {step}"
        for name in [n for n in self._counted if n not in current]:
            there = new.module(name)
            if there is None or self._map.name_of(there) is not None:  # nothing there, or a module renamed (del)
                self.notes.append(f"layer {name} was removed {when}: its counts up to then are kept")
            else:  # another module under the name, no DyT (a LayerNorm put back, an Identity)
                self.notes.append(
                    f"layer {name} was replaced by {type(there).__name__} (not a DyT) {when}: its DyT "
                    "counts up to then are kept, and it is not counted after"
                )
            self._stop_counting(name)
            del self._counted[name]
        fresh = [l for n, l in current.items() if self._counted.get(n) is not l.module]
        for l in fresh:
            how = "replaced" if l.name in self._counted else "added"
            if at_end:  # seen only now (ModuleList.insert and the like register nothing): it was not counted
                self.notes.append(f"layer {l.name} was {how} {when} without a module registration: not counted")
                continue
            self.notes.append(
                f"layer {l.name} was {how} {when}: counted from its first forward"
                + (" (the replaced module's counts are kept)" if how == "replaced" else "")
            )
            if how == "replaced":
                self._stop_counting(l.name)
        self._map = new
        new.listen(self._registered)
        if fresh and not at_end:
            device = fresh[0].module.alpha.device
            late = SaturationHooks(
                fresh,
                SaturationCounter(len(fresh), level=s.level, product=s.product).to(device),
                self._keep_inputs,
                refused=self.hooks.refused,
                root=self._model,
            )
            self._follow_sampling(late)  # this step's (begin_step ran before)
            late.attach()
            self._late.append(late)
            self._counted.update({l.name: l.module for l in fresh})

    def _window_readings(self, sync: bool, final: bool = True) -> tuple[HookReadings, list[str]]:
        """The window's counts by layer name: the layers found at attach and those that appeared since (a replaced
        layer's counts are the sum of its modules'; its alpha the latest module's). ``final``: the window is over,
        the late hook sets are detached."""
        assert self.hooks is not None
        names = list(self.layer_names)
        r = self.hooks.read(sync=sync)
        if not self._late:
            return r, names
        rows = {n: [s, t, b, a] for n, s, t, b, a in zip(names, r.saturated, r.total, r.nonfinite, r.alphas)}
        for late in self._late:
            lr = late.read(sync=sync)
            if final:
                late.detach()
            for n, s, t, b, a in zip((l.name for l in late.layers), lr.saturated, lr.total, lr.nonfinite, lr.alphas):
                old = rows.get(n)
                rows[n] = [s, t, b, a] if old is None else [old[0] + s, old[1] + t, old[2] + b, a]
                if old is None:
                    names.append(n)
        return HookReadings(*(list(col) for col in zip(*(rows[n] for n in names)))), names
