"""The trap watch: from step 1, one optimizer step in ``trap_every_n_steps`` is read for the trap
(docs/science/science.md, "the trap"): every DyT layer's saturation and its offset-driven share, and the
gradient that reaches the layers below the final norm (:mod:`satmon.observe.trap`). When the evidence holds
for ``trap_patience`` consecutive checks the run is named **trapped**: it cannot learn as it stands. It is a
reading: it never stops a run.

Cost: the steps it does not check run no satmon code of it but a flag test in the DyT layers' forward hooks
(no tensor op, no host sync); a checked step adds a float64 pass over each DyT input, a float64 squared norm of
each gradient (post-accumulate-grad hooks, attached for that step only) and one host read at the check (two
collectives under DDP, reached by every rank at the same step: the counts summed, the gradient norms maximised).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from satmon.functional.trap import REACH_FLOOR, TRAP_SATURATION
from satmon.io.sink import Sink
from satmon.io.tags import TAG
from satmon.model.discovery import NormLayer
from satmon.model.weak import WeakModel
from satmon.observe.offset import OFFSET_RETAINED_BELOW
from satmon.observe.trap import ForwardOrder, GradReach, Layout, TrapCounter, TrapHooks
from satmon.results.trap import TrapReading, reading_of

__all__ = ["TrapWatch", "trap_scalars", "with_trap_hparam"]


def trap_scalars(r: TrapReading) -> dict[str, float]:
    """One check under its tags: ``satmon_trap/trapped``, the reach (pooled and per group) and the final norm's
    saturation, centered saturation and offset ratio (a DyT final norm only); unknown readings are left out.

    Example:
        >>> r = TrapReading(1, "norm_f", "dyt", {"norm_f": {"saturated": 0.0, "centered": 0.0, "offset_ratio": 0.2,
        ...                 "offset": 0.01, "spread": 0.02}}, 0.5, {"tok_emb": 0.5}, False)
        >>> trap_scalars(r)  # doctest: +NORMALIZE_WHITESPACE
        {'satmon_trap/trapped': 0.0, 'satmon_trap/reach': 0.5, 'satmon_trap/group_reach/tok_emb': 0.5,
         'satmon_trap/final_saturation': 0.0, 'satmon_trap/final_centered': 0.0, 'satmon_trap/final_offset_ratio': 0.2}
    """
    import math

    out = {TAG.trap: float(r.trapped)}
    if r.reach is not None and math.isfinite(r.reach):
        out[TAG.trap_reach] = float(r.reach)
    for g, v in r.reach_by_group.items():
        if v is not None and math.isfinite(v):
            out[TAG.trap_reach_group(g)] = float(v)
    f = r.final_reading
    if f is not None and r.final_kind == "dyt":
        out.update(
            {
                TAG.trap_final_saturation: float(f["saturated"]),
                TAG.trap_final_centered: float(f["centered"]),
                TAG.trap_final_offset_ratio: float(f["offset_ratio"]),
            }
        )
    return out


class _TrapHparam:
    """A sink whose hparams carry the trap reading's state beside the verdict's (``satmon/trap``)."""

    def __init__(self, sink: Sink, state: str) -> None:
        self._sink, self._state = sink, state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self._sink.scalars(values, step)

    def text(self, tag: str, markdown: str, step: int) -> Sequence[str] | None:
        return self._sink.text(tag, markdown, step)

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        self._sink.hparams({**params, TAG.hp_trap: self._state}, metrics, step)

    def close(self) -> None:
        self._sink.close()


def with_trap_hparam(sink: Sink, watch: TrapWatch | None) -> Sink:
    """``sink``, its hparams carrying the trap's state (``trapped``, ``not trapped``, ``unknown``) when a trap watch
    runs: the verdict's hparams session is the one TensorBoard keeps, so the state rides with it."""
    return sink if watch is None else _TrapHparam(sink, watch.state)  # type: ignore[return-value]


class TrapWatch:
    """Read the trap on one optimizer step in ``every`` from step 1, and keep its streak.

    Args:
        model: the model attached to (its forward order says which parameters are below the final norm).
        layers: its DyT layers.
        every: check one optimizer step in this many (the first step is checked).
        patience: consecutive checks with the evidence before the run is named trapped.
        floor: the gradient below the final norm is dead at or under this fraction of the head's (0: exactly 0).
        level: the saturation level.
        refused: layers the saturation hooks refused (shared with them).
    """

    model = WeakModel(required=True)  # weakly (satmon.model.weak)

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[NormLayer],
        every: int,
        patience: int,
        floor: float = REACH_FLOOR,
        level: float = 2.0,
        refused: dict[str, str] | None = None,
    ) -> None:
        self.model = model
        self.every, self.patience, self.floor = every, patience, floor
        device = layers[0].module.alpha.device if layers else torch.device("cpu")
        self.names = [l.name for l in layers]
        self.hooks = TrapHooks(layers, TrapCounter(len(layers)).to(device), level, refused)
        self.order: ForwardOrder | None = ForwardOrder(model)
        self.layout: Layout | None = None
        self.reach: GradReach | None = None
        self._on = False
        self._groups_cache: tuple[Layout, Tensor] | None = None
        self.streak = 0
        self.closed_step: int | None = None
        self.named_step: int | None = None  # the check that named the run trapped (None: not trapped now)
        self.last: TrapReading | None = None
        self.log: list[dict[str, Any]] = []

    @property
    def state(self) -> str:
        """``trapped``, ``not trapped`` (a check read the run) or ``unknown`` (no check yet, or nothing to read)."""
        if self.named_step is not None:
            return "trapped"
        if self.last is None or self.last.status().startswith("unknown"):
            return "unknown"
        return "not trapped"

    def attach(self) -> TrapWatch:
        """Attach the forward hooks, off until a checked step."""
        self.hooks.attach()
        self.hooks.enabled = False
        if self.order is not None and self.layout is None:
            self.order.attach()
            self.order.enabled = False
        return self

    def detach(self) -> None:
        self.hooks.detach()
        if self.order is not None:
            self.order.detach()
        if self.reach is not None:
            self.reach.detach()
        self._on = False

    def _reach(self) -> GradReach:
        """The gradient hooks on every trainable parameter (grouped at the check, once the layout is known)."""
        if self.reach is None:
            seen: dict[int, nn.Parameter] = {}
            for p in self.model.parameters():
                if p.requires_grad:
                    seen.setdefault(id(p), p)
            self.reach = GradReach(Layout(None, None, ["all"], [(p, 0) for p in seen.values()]))
        return self.reach

    def select(self, step: int) -> bool:
        """Before the forwards of the step after ``step`` (steps done): read it when ``step % every == 0``."""
        on = self.hooks.attached and step % self.every == 0
        if on != self._on:
            self.hooks.enabled = on
            if self.order is not None and self.layout is None:
                self.order.enabled = on
            if on:
                self._reach().attach()
            elif self.reach is not None:
                self.reach.detach()
            self._on = on
        return on

    @property
    def measuring(self) -> bool:
        return self._on

    def paused_sets(self) -> list[Any]:
        """The hook sets a paused block switches off (validation, a probe's forwards)."""
        return [h for h in (self.hooks, self.order) if h is not None]

    def _groups(self) -> Layout | None:
        if self.layout is None and self.order is not None and self.order.seen:
            self.order.detach()
            self.layout = self.order.layout()
            self.order = None
        return self.layout

    def _group_of(self, layout: Layout, reach: GradReach) -> Tensor:
        """Each watched parameter's group in ``layout`` (``len(groups)``: on neither side), made once per layout."""
        if self._groups_cache is None or self._groups_cache[0] is not layout:
            g = len(layout.groups)
            group = {id(p): k for p, k in layout.params}
            self._groups_cache = (
                layout,
                torch.tensor([group.get(id(p), g) for p, _ in reach.layout.params], dtype=torch.int64),
            )
        return self._groups_cache[1]

    def check(self, step: int, reduce_max: Callable[[Tensor], Tensor]) -> tuple[TrapReading, str | None]:
        """Read the checked step (offset counts summed over ranks, gradient norms maximised over ranks: every rank
        calls it at the same step), update the streak; returns the reading and what changed (``"trapped"``: named
        now, ``"released"``: gradient came back after it was named, ``None``)."""
        self.hooks.enabled = False
        layers = self.hooks.counter.read(self.names, sync=True)
        self.hooks.counter.reset()
        reach = self._reach()
        reach.detach()
        self._on = False
        layout = self._groups() or (self.order.layout() if self.order is not None else Layout(None, None))
        sq_p, seen_p = reach.square, reach.seen
        g = len(layout.groups)
        group_of = self._group_of(layout, reach).to(sq_p.device)
        sq = torch.zeros(g + 1, dtype=torch.float64, device=sq_p.device).index_add_(0, group_of, sq_p)[:g]
        seen = torch.zeros(g + 1, dtype=torch.float64, device=sq_p.device).index_add_(0, group_of, seen_p)[:g]
        values = reduce_max(torch.cat([sq, seen])).cpu().tolist()
        sq_p.zero_()
        seen_p.zero_()
        reading = reading_of(
            step,
            layout,
            layers,
            values[:g],
            values[g:],
            saturated_at=TRAP_SATURATION,
            retained_below=OFFSET_RETAINED_BELOW,
            floor=self.floor,
        )
        self.streak = self.streak + 1 if reading.found else 0
        if self.streak == 1:
            self.closed_step = step
        elif self.streak == 0:
            self.closed_step = None
        trapped = self.streak >= self.patience
        event = None
        if trapped and self.named_step is None:
            self.named_step, event = step, "trapped"
        elif not trapped and self.named_step is not None and not reading.found:
            self.named_step, event = None, "released"
        reading = replace(
            reading, streak=self.streak, trapped=self.named_step is not None, closed_step=self.closed_step
        )
        self.last = reading
        self.log.append(reading.to_dict())
        return reading, event

    def state_dict(self) -> dict[str, Any]:
        """The streak and what was named (the same on every rank: decided from reduced readings)."""
        return {
            "streak": [self.streak],
            "closed_step": [-1 if self.closed_step is None else self.closed_step],
            "named_step": [-1 if self.named_step is None else self.named_step],
        }

    def load_state_dict(self, state: Mapping[str, Sequence[Any]]) -> None:
        streak, closed, named = (
            int(state.get(k, [d])[0]) for k, d in (("streak", 0), ("closed_step", -1), ("named_step", -1))
        )
        self.streak = streak
        self.closed_step = None if closed < 0 else closed
        self.named_step = None if named < 0 else named
