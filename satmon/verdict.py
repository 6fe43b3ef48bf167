"""The GO / NO-GO verdict: one constructor (:func:`build_verdict`), an immutable result, how it reads.

Every verdict satmon gives (the live window, a probe, a replayed checkpoint, the examples) is made
by :func:`build_verdict` from per-layer counts. A :class:`Verdict` is frozen: what it says is fixed
when it is made, and where it came from is its ``source`` field.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Literal, NamedTuple

from satmon import verdict_card
from satmon.verdict_card import FLAG_TEXT

__all__ = [
    "CAVEAT", "FLAG_TEXT", "INCONCLUSIVE_BAND", "Decision", "GatingInfo", "LayerCounts", "Source", "Verdict", "build_verdict", "decide",
]

CAVEAT = (
    "Caveat: 0.43 was fit on 12 cells of one study (75% in-sample, 50% leave-one-scale-out) on ~5k-step checkpoints, "
    "alpha_init 2.0; on satmon's CPU grid the 500-step reading predicted DyT's effect no better than chance "
    "(docs/calibration.md)."
)
#: ``|margin|`` below this is reported as inconclusive (the decision is still given). The study's own
#: midpoint search puts its boundary at 0.43985, between its cells 0.4135 (DyT hurt, +5.9%) and 0.4662
#: (DyT helped, -9.6%); the paper rounds it to 0.43. Cells within a few hundredths of the boundary sit
#: where seeds and scales disagree, so satmon flags +-0.02.
INCONCLUSIVE_BAND = 0.02


Decision = Literal["go", "no-go", "non-finite"]


class Source(str, Enum):
    """Where a verdict's counts came from.

    Example:
        >>> Source("probe") is Source.PROBE, Source.REPLAY.value
        (True, 'replay')
    """

    WINDOW = "window"  #: the live screening window (training forwards)
    PROBE = "probe"  #: one :func:`satmon.probe` call on calibration batches (no training window)
    REPLAY = "replay"  #: a probe on a saved checkpoint (``satmon replay``)


class LayerCounts(NamedTuple):
    """Counts of one layer: saturated elements, all elements, inputs that held a non-finite value.

    Example:
        >>> c = LayerCounts(saturated=3, total=12)
        >>> c.saturated / c.total, c.nonfinite
        (0.25, 0)
    """

    saturated: int
    total: int
    nonfinite: int = 0


@dataclass(frozen=True)
class GatingInfo:
    """What architecture detection found, as the verdict needs it.

    Attributes:
        gated: a DyT feeds a gated MLP (``True``), none does (``False``), or satmon could not tell (``None``).
        gated_layers: the DyT layers that feed a gated MLP.
        message: the finding in words (names the layers and the option that resolves an unknown).
    """

    gated: bool | None
    gated_layers: tuple[str, ...] = ()
    message: str = ""

    @classmethod
    def of(cls, report: Any) -> GatingInfo | None:
        """From a :class:`~satmon.core.gated_mlp.GatingReport` (``None`` stays ``None``)."""
        return None if report is None else cls(report.gated, tuple(report.pairings), report.message)


@dataclass(frozen=True)
class Verdict:
    """What a screen concluded. Made only by :func:`build_verdict`; immutable.

    Attributes:
        decision: ``"go"`` (DyT acts as a regulariser: keep it), ``"no-go"`` (convergence penalty, or
            collapse risk in a gated model: switch back to LayerNorm/RMSNorm), or ``"non-finite"``
            (DyT inputs held NaN/inf: the run diverged; the saturation rule does not apply).
        saturation: pooled fraction of DyT input elements with ``|alpha * x| > level``.
        threshold: the GO threshold used (study: 0.43).
        margin: ``saturation - threshold``.
        per_layer: layer name -> saturation fraction (layers that counted no element are left out).
        step: optimizer step (or checkpoint step) at which the verdict was taken.
        window: optimizer steps counted (0 for a probe or a replay: no training window).
        level: the saturation level.
        reason: one human sentence.
        elements: number of elements counted (all layers, all ranks).
        nonfinite: DyT layer inputs (one layer, one forward pass each) that held any ``inf``/``nan``, plus
            layers whose ``alpha`` is non-finite when the verdict is made.
        inconclusive: ``|margin| < INCONCLUSIVE_BAND``.
        gated: whether a DyT layer feeds a gated (SwiGLU/GeGLU) MLP; ``None`` when unknown.
        gated_layers: the DyT layers that feed a gated MLP.
        collapse_risk: gated model with saturation >= ``collapse_threshold``; ``None`` when not gated.
        collapse_threshold: the pooled-saturation level that flags collapse in gated models (study: 0.5).
        risk: per gated block readings (DyT saturation, gate statistics).
        gating_message: what architecture detection found, in words.
        caveat: the threshold's provenance.
        source: where the counts came from (:class:`Source` value).
        planned_window: the window length asked for (``window`` is less when training ended early).
        notes: what the reader must know beside the decision (restarted window, unclassified layers...).
        loss: the training loss over the window (:func:`satmon.functional.loss.loss_trend`: ``first``,
            ``last``, ``change``, ``late_change``, ``stalled``); empty when not measured.
        flags: warnings derived from the readings beside the rule (``"stalled-loss"``, ``"offset-driven"``).
        offset: per-layer offset readings (``centered`` saturation, ``offset_ratio``), when measured.

    Example:
        >>> v = build_verdict({"ln_f": LayerCounts(45, 100)}, step=500, window=500)
        >>> v.decision, v.margin > 0, v.source, Verdict.from_dict(v.to_dict()) == v
        ('go', True, 'window', True)
    """

    decision: Decision
    saturation: float
    threshold: float
    margin: float
    per_layer: dict[str, float]
    step: int
    window: int
    level: float = 2.0
    reason: str = ""
    elements: int = 0
    nonfinite: int = 0
    inconclusive: bool = False
    gated: bool | None = None
    gated_layers: list[str] = field(default_factory=list)
    collapse_risk: bool | None = None
    collapse_threshold: float = 0.5
    risk: dict[str, dict[str, float]] = field(default_factory=dict)
    gating_message: str = ""
    caveat: str = CAVEAT
    source: str = Source.WINDOW.value
    planned_window: int = 0
    notes: tuple[str, ...] = ()
    loss: dict[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    offset: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def go(self) -> bool:
        return self.decision == "go"

    @property
    def partial(self) -> bool:
        """The live window ended before ``planned_window`` steps."""
        return self.source == Source.WINDOW.value and 0 < self.window < self.planned_window

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (also what the callback keeps in its ``state_dict``)."""
        d = asdict(self)
        d["notes"], d["flags"] = list(self.notes), list(self.flags)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """Read back :meth:`to_dict` (also a v0.1 dict: a probe was ``window == 0`` there)."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known.setdefault("source", Source.WINDOW.value if known.get("window", 0) > 0 else Source.PROBE.value)
        known.setdefault("planned_window", known.get("window", 0))
        known["notes"] = tuple(known.get("notes", ()))
        known["flags"] = tuple(known.get("flags", ()))
        return cls(**known)

    def headline(self) -> str:
        """The decision in words (the card's title)."""
        return verdict_card.headline(self)

    def summary(self) -> str:
        """One console line.

        Example:
            >>> v = build_verdict({"a": LayerCounts(1, 2)}, step=500, window=500)
            >>> v.summary()
            'satmon verdict: GO  saturation 0.5000 >= threshold 0.43 (margin +0.0700, window 500 steps)'
        """
        return verdict_card.summary(self)

    def card(self) -> str:
        """The verdict as a markdown card (TensorBoard text, console, reports).

        Example:
            >>> v = build_verdict({"blocks.0.ln_1": LayerCounts(1, 10), "ln_f": LayerCounts(5, 10)}, step=500, window=500)
            >>> print(v.card().splitlines()[0])
            ### satmon verdict: **NO-GO**: DyT looks like a convergence penalty here; switch back to LayerNorm
        """
        return verdict_card.card(self)


def _rule(saturation: float, threshold: float, gated: bool | None, collapse_threshold: float,
          nonfinite: int) -> tuple[Decision, str, bool | None]:
    """The study's rule: ``(decision, reason, collapse_risk)``; non-finite inputs come first."""
    if nonfinite:
        return "non-finite", (
            f"{nonfinite:,} DyT layer input(s) or alpha(s) held NaN/inf: the run diverged, and a NaN element counts as "
            "unsaturated, so the pooled saturation is not a reading of a healthy run. Lower the learning rate, "
            "clip gradients or check the data, then screen again"), None
    collapse = None if gated is None else bool(gated) and saturation >= collapse_threshold
    if collapse:
        return "no-go", (
            f"collapse risk: DyT feeds a gated MLP and pooled saturation {saturation:.4f} >= {collapse_threshold:g} "
            "(the study flagged 4/4 collapses at this level, 0/5 false alarms)"), True
    if saturation >= threshold:
        return "go", (f"pooled saturation {saturation:.4f} >= {threshold:g}: DyT bounds activations enough to act "
                      "as a regulariser"), collapse
    return "no-go", (f"pooled saturation {saturation:.4f} < {threshold:g}: DyT is expected to slow convergence; "
                     "LayerNorm is the safer choice"), collapse


def build_verdict(
    counts: Mapping[str, LayerCounts | Sequence[int]],
    *,
    step: int,
    window: int = 0,
    source: Source | str = Source.WINDOW,
    planned_window: int | None = None,
    threshold: float = 0.43,
    level: float = 2.0,
    gating: GatingInfo | None = None,
    collapse_threshold: float = 0.5,
    risk: Mapping[str, Mapping[str, float]] | None = None,
    notes: Sequence[str] = (),
    loss: Mapping[str, Any] | None = None,
    offset: Mapping[str, Mapping[str, float]] | None = None,
    offset_flag: bool = False,
    caveat: str = "",
) -> Verdict | None:
    """Build the verdict from per-layer counts: the one place a :class:`Verdict` is made.

    Rule (the study's): non-gated model, GO when the pooled saturation ``sum(saturated) / sum(total)``
    is ``>= threshold``, NO-GO below. Gated model (a DyT feeds a SwiGLU/GeGLU MLP): pooled saturation
    ``>= collapse_threshold`` is a collapse risk and forces NO-GO. Any non-finite DyT input makes the
    decision ``"non-finite"``: a diverged run, not a norm choice.

    Args:
        counts: layer name -> :class:`LayerCounts` (or a ``(saturated, total[, nonfinite])`` tuple).
        step: the step the verdict is taken at.
        window: optimizer steps counted (0 for a probe or replay).
        source: :class:`Source` of the counts.
        planned_window: the window asked for; a shorter ``window`` adds a "partial window" note.
        threshold: GO threshold on pooled saturation.
        level: the per-element cut-off ``|alpha * x| > level`` the counts used.
        gating: gated-MLP detection; ``None``: not checked (the card says nothing about gating).
        collapse_threshold: pooled saturation that flags collapse in a gated model.
        risk: per gated block readings, shown in the card.
        notes: extra lines for the card (what the reader must know).
        loss: the window's loss trend (:func:`satmon.functional.loss.loss_trend`); a stalled loss with
            saturation at or above ``threshold`` adds the ``"stalled-loss"`` flag.
        offset: per-layer offset readings to show; ``offset_flag`` adds the ``"offset-driven"`` flag when the
            saturation is at or above ``threshold`` (what the flag qualifies is a high saturation, a GO).
        caveat: the threshold's provenance (default: the study's, :data:`CAVEAT`).

    Returns:
        The verdict, or ``None`` when no element was counted.

    Example:
        >>> v = build_verdict({"blocks.0.ln_1": LayerCounts(60, 100), "ln_f": (20, 100)}, step=500, window=500)
        >>> v.decision, v.saturation, v.per_layer
        ('no-go', 0.4, {'blocks.0.ln_1': 0.6, 'ln_f': 0.2})
        >>> build_verdict({"x": (0, 10, 3)}, step=9, window=9).decision
        'non-finite'
    """
    rows = {name: LayerCounts(*c) for name, c in counts.items()}
    n = sum(c.total for c in rows.values())
    if n == 0:
        return None
    saturation = sum(c.saturated for c in rows.values()) / n
    nonfinite = sum(c.nonfinite for c in rows.values())
    gated = gating.gated if gating is not None else None
    decision, reason, collapse = _rule(saturation, threshold, gated, collapse_threshold, nonfinite)
    planned = window if planned_window is None else int(planned_window)
    source = Source(source).value
    if source == Source.WINDOW.value and window < planned:
        reason = f"window cut short at {window} of {planned} steps; " + reason
    elif source != Source.WINDOW.value:
        reason = f"{source} (no training window): " + reason
    margin = saturation - threshold
    flags = []
    if loss and loss.get("stalled") and saturation >= threshold and decision != "non-finite":
        flags.append("stalled-loss")
    if offset_flag and saturation >= threshold and decision != "non-finite":  # it qualifies a high saturation
        flags.append("offset-driven")
    return Verdict(
        decision=decision, saturation=float(saturation), threshold=float(threshold), margin=float(margin),
        per_layer={k: c.saturated / c.total for k, c in rows.items() if c.total}, step=int(step), window=int(window),
        level=float(level), reason=reason, elements=int(n), nonfinite=int(nonfinite),
        inconclusive=abs(margin) < INCONCLUSIVE_BAND, gated=gated,
        gated_layers=list(gating.gated_layers) if gating is not None else [], collapse_risk=collapse,
        collapse_threshold=float(collapse_threshold), risk={k: dict(v) for k, v in (risk or {}).items()},
        gating_message=gating.message if gating is not None else "", source=source, planned_window=planned,
        notes=tuple(notes), caveat=caveat or CAVEAT, loss=dict(loss or {}), flags=tuple(flags), offset={k: dict(v) for k, v in (offset or {}).items()},
    )


def decide(saturation: float, per_layer: Mapping[str, float], *, threshold: float = 0.43, step: int, window: int,
           level: float = 2.0, elements: int = 0, nonfinite: int = 0, gated: bool | None = None,
           gated_layers: Sequence[str] | None = None, collapse_threshold: float = 0.5,
           risk: Mapping[str, Mapping[str, float]] | None = None, gating_message: str = "") -> Verdict:
    """Deprecated since 0.2: use :func:`build_verdict` (it takes counts, not fractions).

    Kept for one release; it applies the same rule to a pooled fraction.
    """
    warnings.warn("satmon.decide is deprecated; use satmon.build_verdict(counts, ...)", DeprecationWarning, stacklevel=2)
    if not math.isfinite(saturation):
        raise ValueError(f"Expected a finite pooled saturation, got {saturation}. Count non-finite inputs in `nonfinite`.")
    decision, reason, collapse = _rule(saturation, threshold, gated, collapse_threshold, nonfinite)
    margin = saturation - threshold
    return Verdict(
        decision=decision, saturation=float(saturation), threshold=float(threshold), margin=float(margin),
        per_layer={k: float(v) for k, v in per_layer.items()}, step=int(step), window=int(window), level=float(level),
        reason=reason, elements=int(elements), nonfinite=int(nonfinite), inconclusive=abs(margin) < INCONCLUSIVE_BAND,
        gated=gated, gated_layers=list(gated_layers or []), collapse_risk=collapse,
        collapse_threshold=float(collapse_threshold), risk={k: dict(v) for k, v in (risk or {}).items()},
        gating_message=gating_message, source=Source.WINDOW.value if window > 0 else Source.PROBE.value,
        planned_window=int(window),
    )
