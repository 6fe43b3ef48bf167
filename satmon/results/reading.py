"""One reading of a model's DyT layers, live or from a checkpoint, and the one function that turns it into a verdict.

Every path that screens a model counts with the same hook sets
(:class:`satmon.observe.reading_hooks.ReadingHooks`) and reads them into one :class:`Reading`: the live
window (:class:`satmon.Screen`, over training forwards), :func:`satmon.probe` (calibration batches),
``satmon replay`` (a probe per checkpoint) and the live probe. :func:`verdict_of` turns a reading and a
:class:`Rule` into the :class:`~satmon.results.verdict.Verdict` (through
:func:`~satmon.results.verdict.build_verdict`, the only constructor), so a checkpoint's verdict carries
the same offset table, flags, gate readings and non-finite checks as the window's.

Example:
    >>> r = Reading("probe", step=0, counts={"ln_f": LayerCounts(60, 100)}, level=2.0, functions={"ln_f": "tanh"},
    ...             offset={"ln_f": {"saturated": 0.6, "centered": 0.01, "offset_ratio": 40.0}}, offset_driven=True)
    >>> v = verdict_of(r, Rule())
    >>> v.decision, v.flags, v.trust
    ('go', ('offset-driven',), 'flagged')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from satmon.results.frozen import FrozenMap, freeze, thaw
from satmon.results.rule import Rule  # re-exported: its home is satmon.results.rule
from satmon.results.verdict import (
    GatingInfo,
    LayerCounts,
    Source,
    Verdict,
    build_verdict,
)

__all__ = ["Reading", "Rule", "verdict_of"]


#: Reading fields that hold containers (frozen at construction)
_CONTAINERS = ("counts", "alphas", "functions", "offset", "gate", "loss", "nonfinite_weights", "refused", "notes")


@dataclass(frozen=True)
class Reading:
    """What the hooks counted on a model's DyT layers, over a training window or a probe's batches.

    Attributes:
        source: ``"window"``, ``"probe"`` or ``"replay"`` (:class:`~satmon.results.verdict.Source` values).
        step: the (optimizer or checkpoint) step the reading was taken at.
        counts: layer -> :class:`~satmon.results.verdict.LayerCounts` (saturated, total, non-finite inputs; a
            non-finite ``alpha`` counts as one non-finite input of its layer), in layer order.
        level: the per-element cut-off the counts used (``|alpha * x| > level``).
        product: which product was compared with ``level`` (``"module"`` or ``"exact"``).
        alphas: layer -> ``|alpha|`` when read.
        functions: layer -> the point-wise function it applies (``"tanh"`` for DyT).
        window: optimizer steps counted (0 for a probe or a replay).
        planned_window: the window asked for (``window`` is less when training ended early).
        offset: layer -> offset readings (``saturated``, ``centered`` fractions and ``offset_ratio``), of the
            forwards they were taken on (sampled window steps; every batch of a probe).
        offset_every: the offset readings come from every this many counted window steps (0: every forward).
        offset_driven: the offset readings say most of the saturation is per-channel constants
            (:func:`satmon.observe.offset.offset_driven`).
        gate: DyT layer -> gate statistics of the gated MLP it feeds.
        gating: what gated-MLP detection found (``None``: not checked).
        loss: the training loss trend over the window (:func:`satmon.functional.loss.loss_trend`; empty: no loss).
        nonfinite_weights: parameter -> NaN/inf element count (only those with any).
        refused: layer -> why it was not counted.
        notes: what the reader must know beside the counts (a restarted window, a resume...).
    """

    source: str
    step: int
    counts: Mapping[str, LayerCounts]
    level: float
    product: str = "module"
    alphas: Mapping[str, float] = FrozenMap()
    functions: Mapping[str, str] = FrozenMap()
    window: int = 0
    planned_window: int = 0
    offset: Mapping[str, Mapping[str, float]] = FrozenMap()
    offset_every: int = 0
    offset_driven: bool = False
    gate: Mapping[str, Mapping[str, float]] = FrozenMap()
    gating: GatingInfo | None = None
    loss: Mapping[str, Any] = FrozenMap()
    nonfinite_weights: Mapping[str, int] = FrozenMap()
    refused: Mapping[str, str] = FrozenMap()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", Source(self.source).value)
        object.__setattr__(self, "counts", {n: LayerCounts(*c) for n, c in self.counts.items()})
        for name in _CONTAINERS:
            object.__setattr__(self, name, freeze(getattr(self, name)))

    @property
    def elements(self) -> int:
        """Elements counted, all layers."""
        return sum(c.total for c in self.counts.values())

    @property
    def pooled(self) -> float | None:
        """Pooled saturation (``None`` when nothing was counted)."""
        n = self.elements
        return sum(c.saturated for c in self.counts.values()) / n if n else None

    @property
    def per_layer(self) -> dict[str, float]:
        """Layer -> saturation (layers that counted nothing left out)."""
        return {n: c.saturated / c.total for n, c in self.counts.items() if c.total}

    @property
    def nonfinite_inputs(self) -> int:
        """DyT inputs (one layer, one forward each) that held NaN/inf, and non-finite alphas."""
        return sum(c.nonfinite for c in self.counts.values())

    def risk(self) -> dict[str, dict[str, float]]:
        """Per gated MLP (by module name): the saturation of the DyT feeding it and its gate statistics."""
        if self.gating is None:
            return {}
        per_layer = self.per_layer
        return {
            p.mlp: {"dyt_saturation": per_layer.get(norm, math.nan), **self.gate.get(norm, {})}
            for norm, p in self.gating.pairings.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain values."""
        out = {f.name: thaw(getattr(self, f.name)) for f in fields(self)}
        out["counts"] = {n: list(c) for n, c in self.counts.items()}
        out["gating"] = self.gating.to_dict() if self.gating is not None else None
        return out


def verdict_of(reading: Reading, rule: Rule | None = None) -> Verdict | None:
    """The verdict a reading gives under ``rule`` (default: the study's): the one reading -> verdict function.

    Per gated MLP the card's ``risk`` (DyT saturation and gate statistics), the offset table and the
    ``offset-driven`` flag, the ``stalled-loss`` flag from the loss trend, non-finite inputs and weights,
    the refused layers as notes, and the trust (a function other than tanh under the study's threshold is
    ``"uncalibrated"``) all come from the reading, whatever path took it.

    Returns:
        The verdict, or ``None`` when the reading counted no element.

    Example:
        >>> r = Reading("replay", step=500, counts={"ln_f": (20, 100)}, level=2.0, nonfinite_weights={"head.weight": 3})
        >>> v = verdict_of(r)
        >>> v.decision, v.nonfinite_weights, v.source
        ('non-finite', 3, 'replay')
    """
    rule = rule or Rule()
    r = reading
    refused = [f"layer {n} not counted: {why}" for n, why in r.refused.items()]
    return build_verdict(
        r.counts,
        step=r.step,
        window=r.window,
        source=r.source,
        planned_window=r.planned_window,
        level=r.level,
        gating=r.gating,
        risk=r.risk(),
        notes=[*r.notes, *refused],
        loss=r.loss,
        offset=r.offset,
        offset_flag=bool(r.offset) and r.offset_driven,
        nonfinite_weights=r.nonfinite_weights,
        offset_every=r.offset_every,
        functions=[r.functions.get(n, "tanh") for n in r.counts],
        rule=rule,
    )
