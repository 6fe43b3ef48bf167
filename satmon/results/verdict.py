"""The GO / NO-GO verdict: one constructor (:func:`build_verdict`), an immutable result, how it reads.

Every verdict satmon gives (the live window, a probe, a replayed checkpoint, the examples) is made
by :func:`build_verdict` from per-layer counts; the screening paths reach it through one reading
(:class:`satmon.results.reading.Reading` and :func:`~satmon.results.reading.verdict_of`). A
:class:`Verdict` is frozen, down to its fields (tuples and read-only mappings,
:mod:`satmon.results.frozen`): what it says is fixed when it is made, and where it came from is its
``source`` field. A variant is made with :func:`dataclasses.replace`.

Two fields say what the verdict is worth: ``decision`` is the study's rule, always (scripts that read
it keep their contract), and ``trust`` says how far to rely on it (:data:`TRUST`): ``"ok"``, or the
first of ``cautions``, the qualifications that apply, most serious first. How well the rule itself was
shown to predict is ``held_out_accuracy`` on ``held_out_cells`` against ``no_skill_accuracy``: a rule whose
held-out record does not beat guessing the commoner outcome by a one-sided exact binomial test (p < 0.05,
:func:`satmon.functional.significance.beats`) gives a measurement, not a forecast (trust ``"unproven"``).
What GO and NO-GO say and what the study's rule is worth: :data:`satmon.study.MEANING`, :data:`satmon.study.WORTH`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, NamedTuple

from satmon._compat import deprecated
from satmon.results import card as verdict_card
from satmon.results.card import FLAG_TEXT
from satmon.results.frozen import FrozenMap, freeze, thaw
from satmon.results.gating import GatingInfo
from satmon.results.rule import CALIBRATED_FUNCTION, THRESHOLD_SOURCES, TRUST, Decision, Rule, Trust
from satmon.study import CAVEAT, COLLAPSE_THRESHOLD, INCONCLUSIVE_BAND, LEVEL, THRESHOLD

__all__ = [
    "CAVEAT",
    "FLAG_TEXT",
    "INCONCLUSIVE_BAND",
    "THRESHOLD_SOURCES",
    "TRUST",
    "Decision",
    "GatingInfo",
    "LayerCounts",
    "Rule",
    "Source",
    "Trust",
    "Verdict",
    "build_verdict",
]


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


#: the Verdict fields that hold containers (frozen at construction, thawed by to_dict)
_CONTAINERS = (
    "per_layer",
    "gated_layers",
    "risk",
    "notes",
    "loss",
    "flags",
    "offset",
    "cautions",
    "functions",
    "planned_forecast",
)


@dataclass(frozen=True)
class Verdict:
    """What a screen concluded. Made only by :func:`build_verdict`; immutable.

    Attributes:
        decision: the study's rule (a :class:`~satmon.results.rule.Decision`, a ``str``): ``"go"`` (saturation at or
            above the threshold), ``"no-go"`` (below it; or collapse risk in a gated model), or ``"non-finite"`` (DyT
            inputs, alphas or the model's weights held NaN/inf: the run diverged; the saturation rule does not apply).
            What GO and NO-GO say: :data:`satmon.study.MEANING`; ``trust`` says how far to rely on it.
        saturation: pooled fraction of DyT input elements with ``|alpha * x| > level``.
        rule: the :class:`~satmon.results.rule.Rule` the decision was made by, whole: its ``threshold`` (study: 0.43),
            ``collapse_threshold`` (study: 0.5), ``caveat`` (the threshold's provenance), ``threshold_source`` (whose
            threshold it is, :data:`THRESHOLD_SOURCES`) and held-out record (:meth:`Rule.evidence`).
        margin: ``saturation - rule.threshold`` (:attr:`threshold` reads ``rule.threshold``).
        per_layer: layer name -> saturation fraction (layers that counted no element are left out), read-only.
        step: optimizer step (or checkpoint step) at which the verdict was taken.
        window: optimizer steps counted (0 for a probe or a replay: no training window).
        level: the saturation level.
        reason: one human sentence.
        elements: number of elements counted (all layers, all ranks).
        nonfinite: DyT layer inputs (one layer, one forward pass each) that held any ``inf``/``nan``, plus
            layers whose ``alpha`` is non-finite when the verdict is made.
        nonfinite_weights: parameter elements of the model that were NaN/inf when the verdict was made
            (any makes the decision ``"non-finite"``; the reason names the parameters).
        inconclusive: ``|margin| < INCONCLUSIVE_BAND``.
        gated: whether a DyT layer feeds a gated (SwiGLU/GeGLU) MLP; ``None`` when unknown.
        gated_layers: the DyT layers that feed a gated MLP.
        collapse_risk: gated model with saturation >= ``rule.collapse_threshold``; ``None`` when not gated.
        risk: per gated block readings (DyT saturation, gate statistics).
        gating_message: what architecture detection found, in words.
        source: where the counts came from (:class:`Source` value).
        planned_window: the window length asked for (``window`` is less when training ended early).
        notes: what the reader must know beside the decision (restarted window, unclassified layers...).
        loss: the training loss over the window (:func:`satmon.functional.loss.loss_trend`: ``first``,
            ``last``, ``change``, ``late_change``, ``stalled``); empty when not measured.
        flags: warnings derived from the readings beside the rule (``"stalled-loss"``, ``"offset-driven"``).
        offset: per-layer offset readings (``saturated`` and ``centered`` fractions, ``offset_ratio``), when measured.
        offset_every: the offset readings come from every this many counted window steps (``0``: from every
            forward counted, as in a probe).
        functions: the point-wise functions the screened layers apply (``"tanh"`` for DyT, ``"erf"``,
            ``"hardtanh"``); the study calibrated its threshold for tanh only.
        trust: how far to rely on the decision (:data:`TRUST`): ``"ok"`` or the first of ``cautions``.
        cautions: every qualification that applies, most serious first (empty when ``trust == "ok"``).
        planned_forecast: the forecast of DyT's effect from the run's planned passes over its data
            (:meth:`satmon.results.forecast.Forecast.to_dict`: ``outcome``, ``passes``, ``evidence``...), set by the
            driver beside the decision, which it never changes; empty when not made (a probe, a replay).
        comparison: the pooled saturation against the threshold as the rule compared them (``">="`` or ``"<"``,
            :meth:`satmon.results.rule.Rule.decide`): what the card and the CLI print.

    How well the rule was shown to predict (the study's leave-one-scale-out record, a calibration's
    leave-one-group-out one, none for a threshold given without calibration) is ``rule.evidence()``.

    Mappings are read-only (:class:`~satmon.results.frozen.FrozenMap`) and sequences tuples, also when
    a verdict is made with :func:`dataclasses.replace`; :meth:`to_dict` gives plain ``dict``, ``list`` and ``str``
    (the rule nested under ``"rule"``).

    Example:
        >>> v = build_verdict({"ln_f": LayerCounts(45, 100)}, step=500, window=500)
        >>> v.decision, v.margin > 0, v.source, Verdict.from_dict(v.to_dict()) == v
        ('go', True, 'window', True)
        >>> v.rule.threshold_source, v.to_dict()["rule"]["threshold"], v.to_dict()["decision"]
        ('study', 0.43, 'go')
        >>> v.per_layer == {"ln_f": 0.45}, type(v.to_dict()["per_layer"]).__name__
        (True, 'dict')
        >>> v.trust, v.forecast
        ('unproven', False)
        >>> build_verdict({"ln_f": LayerCounts(45, 100)}, step=3, window=3, planned_window=500).trust
        'partial'
    """

    decision: Decision
    saturation: float
    rule: Rule
    margin: float
    per_layer: Mapping[str, float]
    step: int
    window: int
    level: float = LEVEL
    reason: str = ""
    elements: int = 0
    nonfinite: int = 0
    inconclusive: bool = False
    gated: bool | None = None
    gated_layers: tuple[str, ...] = ()
    collapse_risk: bool | None = None
    risk: Mapping[str, Mapping[str, float]] = FrozenMap()
    gating_message: str = ""
    source: str = Source.WINDOW.value
    planned_window: int = 0
    notes: tuple[str, ...] = ()
    loss: Mapping[str, Any] = FrozenMap()
    flags: tuple[str, ...] = ()
    offset: Mapping[str, Mapping[str, float]] = FrozenMap()
    nonfinite_weights: int = 0
    offset_every: int = 0
    functions: tuple[str, ...] = ()
    trust: str = "ok"
    cautions: tuple[str, ...] = ()
    planned_forecast: Mapping[str, Any] = FrozenMap()
    comparison: str = ">="

    def __post_init__(self) -> None:
        if self.decision not in tuple(Decision):
            raise ValueError(
                f"Expected a decision in {tuple(d.value for d in Decision)}, got {self.decision!r}: "
                "verdicts "
                "are made by build_verdict, whose Rule decides."
            )
        object.__setattr__(self, "decision", Decision(self.decision))
        if not isinstance(self.rule, Rule):
            raise TypeError(
                f"Expected `rule` to be a satmon.results.rule.Rule, got {type(self.rule).__name__}: build "
                "verdicts with build_verdict(counts, rule, ...)."
            )
        for name in _CONTAINERS:
            object.__setattr__(self, name, freeze(getattr(self, name)))

    @property
    def go(self) -> bool:
        return self.decision == Decision.GO

    @property
    def threshold(self) -> float:
        """The GO threshold the saturation was compared with (``rule.threshold``; study: 0.43)."""
        return self.rule.threshold

    @property
    def partial(self) -> bool:
        """The live window ended before ``planned_window`` steps (training ended early): a provisional verdict."""
        return _partial(self.source, self.window, self.planned_window)

    @property
    def forecast(self) -> bool:
        """Whether the rule was shown to predict: its held-out record beats guessing the commoner outcome by a
        one-sided exact binomial test (``p < 0.05``; :func:`satmon.functional.significance.beats`)."""
        return self.rule.forecasts()

    # satmon 0.4 kept the rule as seven loose fields; their reads stay for one release (deprecated)
    @property
    def collapse_threshold(self) -> float:
        """Deprecated: ``verdict.rule.collapse_threshold``."""
        deprecated("Verdict.collapse_threshold", "Verdict.rule.collapse_threshold")
        return self.rule.collapse_threshold

    @property
    def caveat(self) -> str:
        """Deprecated: ``verdict.rule.caveat``."""
        deprecated("Verdict.caveat", "Verdict.rule.caveat")
        return self.rule.caveat

    @property
    def threshold_source(self) -> str:
        """Deprecated: ``verdict.rule.threshold_source``."""
        deprecated("Verdict.threshold_source", "Verdict.rule.threshold_source")
        return self.rule.threshold_source

    @property
    def held_out_accuracy(self) -> float | None:
        """Deprecated: ``verdict.rule.evidence()[0]``."""
        deprecated("Verdict.held_out_accuracy", "Verdict.rule.evidence()[0]")
        return self.rule.evidence()[0]

    @property
    def no_skill_accuracy(self) -> float | None:
        """Deprecated: ``verdict.rule.evidence()[1]``."""
        deprecated("Verdict.no_skill_accuracy", "Verdict.rule.evidence()[1]")
        return self.rule.evidence()[1]

    @property
    def held_out_cells(self) -> int | None:
        """Deprecated: ``verdict.rule.evidence()[2]``."""
        deprecated("Verdict.held_out_cells", "Verdict.rule.evidence()[2]")
        return self.rule.evidence()[2]

    @property
    def uncalibrated_functions(self) -> tuple[str, ...]:
        """The screened point-wise functions the study calibrated no threshold for (every one but tanh)."""
        return tuple(f for f in self.functions if f != CALIBRATED_FUNCTION)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of plain ``dict``, ``list``, ``str`` and numbers, the rule nested under ``"rule"``
        (also what the callback keeps in its ``state_dict``: it loads with ``torch.load(weights_only=True)``)."""
        out = {f.name: thaw(getattr(self, f.name)) for f in fields(self) if f.name not in ("decision", "rule")}
        return {"decision": self.decision.value, **out, "rule": self.rule.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """Read back :meth:`to_dict`, and the flat dicts of satmon 0.1 to 0.4 (the rule's seven fields at the top).

        A flat dict's rule is read from its fields (``threshold``, ``collapse_threshold``, ``caveat``,
        ``threshold_source``, the held-out record; a file from before ``threshold_source`` used the study's rule
        when its threshold was 0.43). A verdict saved before the rule's held-out evidence was recorded (satmon 0.2
        and 0.3, whose trust could read ``"ok"`` under the study's threshold) gets that evidence by whose threshold
        it used (the study's figures; none for a user's or a calibration's, which those files did not keep), and
        its trust is read again from its fields: an old "ok" under the study's 0.43 loads as ``"unproven"``; so does
        a 0.4 verdict whose calibration beat guessing by one cell (0.4 kept no cell count, which the significance
        test needs). A v0.1 dict's probe was ``window == 0``.

        Example:
            >>> new = build_verdict({"ln_f": (5, 10)}, step=500, window=500)
            >>> old = {k: v for k, v in new.to_dict().items() if k not in ("rule", "cautions")}
            >>> old.update(threshold=0.43, caveat=new.rule.caveat, trust="ok")  # as 0.3 saved it: no held-out record
            >>> Verdict.from_dict(old).trust, Verdict.from_dict(old).rule == new.rule
            ('unproven', True)
        """
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known.setdefault("source", Source.WINDOW.value if known.get("window", 0) > 0 else Source.PROBE.value)
        known.setdefault("planned_window", known.get("window", 0))
        if isinstance(d.get("rule"), Mapping):
            known["rule"] = Rule.from_dict(d["rule"])
            return cls(**known)  # lists and dicts are frozen by __post_init__
        known["rule"] = rule = _flat_rule(d)  # satmon 0.1 to 0.4: the rule's fields at the top
        if any(k not in d for k in ("held_out_accuracy", "held_out_cells", "trust")):  # before 0.5: trust from fields
            known["cautions"] = rule.cautions(
                known["decision"],
                tuple(known.get("functions", ())),
                tuple(known.get("flags", ())),
                _partial(known["source"], known.get("window", 0), known["planned_window"]),
                bool(known.get("inconclusive")),
            )
            known["trust"] = known["cautions"][0] if known["cautions"] else "ok"
        if "comparison" not in known and "saturation" in known:  # before 0.5: as the rule compares
            known["comparison"] = rule.compare(known["saturation"])
        return cls(**known)

    def headline(self) -> str:
        """The decision and how far to trust it, in plain text (the card's title without its markdown).

        Example:
            >>> print(build_verdict({"a": LayerCounts(3, 10)}, step=3, window=3, planned_window=10).headline())
            ... # doctest: +NORMALIZE_WHITESPACE
            NO-GO by the study's rule, partial window (3 of 10 steps): a measurement, not a forecast (held-out
            accuracy 50% vs 67% for guessing the commoner outcome)
        """
        return verdict_card.headline(self)

    def summary(self, where: Sequence[str] | None = None) -> str:
        """One console line: the decision and how far to trust it, the saturation against the threshold, and
        ``where`` the card went (each place a sink named; ``None``: not said).

        Example:
            >>> v = build_verdict({"a": LayerCounts(1, 2)}, step=500, window=500)
            >>> print(v.summary())  # doctest: +NORMALIZE_WHITESPACE
            satmon verdict: GO by the study's rule (trust: unproven), saturation 0.5000 >= threshold 0.43 (margin
            +0.0700, window 500 steps)
            >>> v.summary(["tb/version_0 (TensorBoard, Text tab: satmon/verdict)"]).split("; ")[-1]
            'card: tb/version_0 (TensorBoard, Text tab: satmon/verdict)'
        """
        return verdict_card.summary(self, where)

    def card(self) -> str:
        """The verdict as a markdown card (TensorBoard text, reports); :meth:`text` is the console's.

        Example:
            >>> v = build_verdict({"blocks.0.ln_1": LayerCounts(1, 10), "ln_f": LayerCounts(5, 10)}, step=500,
            ...                   window=500)
            >>> print(v.card().splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
            ### satmon verdict: **NO-GO** by the study's rule: a measurement, not a forecast (held-out accuracy 50% vs
            67% for guessing the commoner outcome)
        """
        return verdict_card.card(self)

    def text(self) -> str:
        """The card in plain text, for a console (what the drivers print): the same lines as :meth:`card`.

        Example:
            >>> v = build_verdict({"ln_f": LayerCounts(5, 10)}, step=500, window=500)
            >>> print(v.text().splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
            satmon verdict: GO by the study's rule: a measurement, not a forecast (held-out accuracy 50% vs 67% for
            guessing the commoner outcome)
        """
        return verdict_card.plain(verdict_card.card(self))


#: the rule's own arguments ``build_verdict`` took until satmon 0.4 (deprecated: pass a :class:`Rule`)
_RULE_ARGUMENTS = (
    "threshold",
    "collapse_threshold",
    "caveat",
    "threshold_source",
    "held_out_accuracy",
    "no_skill_accuracy",
    "held_out_cells",
)


def build_verdict(
    counts: Mapping[str, LayerCounts | Sequence[int]],
    rule: Rule | None = None,
    *,
    step: int,
    window: int = 0,
    source: Source | str = Source.WINDOW,
    planned_window: int | None = None,
    level: float = LEVEL,
    gating: GatingInfo | None = None,
    risk: Mapping[str, Mapping[str, float]] | None = None,
    notes: Sequence[str] = (),
    loss: Mapping[str, Any] | None = None,
    offset: Mapping[str, Mapping[str, float]] | None = None,
    offset_flag: bool = False,
    nonfinite_weights: Mapping[str, int] | int = 0,
    offset_every: int = 0,
    functions: Sequence[str] = (),
    **rule_arguments: Any,
) -> Verdict | None:
    """Build the verdict from per-layer counts under one :class:`~satmon.results.rule.Rule`: the one place a
    :class:`Verdict` is made.

    The rule decides (:meth:`Rule.decide`): non-gated model, GO when the pooled saturation
    ``sum(saturated) / sum(total)`` is ``>= rule.threshold``, NO-GO below. Gated model (a DyT feeds a SwiGLU/GeGLU
    MLP): pooled saturation ``>= rule.collapse_threshold`` is a collapse risk and forces NO-GO. Any non-finite DyT
    input makes the decision ``"non-finite"``, and so does any NaN/inf weight (``nonfinite_weights``): a diverged
    run, not a norm choice.

    Trust (:data:`TRUST`, :meth:`Rule.cautions`): the decision stays the rule's; ``cautions`` lists what undercuts
    it, most serious first (an uncalibrated function with the study's threshold, a flag, a window cut short, a
    margin within the inconclusive band, a rule not shown to predict held out), and ``trust`` is the first of
    them, or ``"ok"``.

    Args:
        counts: layer name -> :class:`LayerCounts` (or a ``(saturated, total[, nonfinite])`` tuple).
        rule: the :class:`~satmon.results.rule.Rule`, whole (``settings.rule``; default: the study's, ``Rule()``).
            A threshold of one's own is ``Rule(threshold=0.5, threshold_source="user")``; a calibration's is
            ``Settings(calibration=...).rule``.
        step: the step the verdict is taken at.
        window: optimizer steps counted (0 for a probe or replay).
        source: :class:`Source` of the counts.
        planned_window: the window asked for; a shorter ``window`` adds a "partial window" note.
        level: the per-element cut-off ``|alpha * x| > level`` the counts used.
        gating: gated-MLP detection; ``None``: not checked (the card says nothing about gating).
        risk: per gated block readings, shown in the card.
        notes: extra lines for the card (what the reader must know).
        loss: the window's loss trend (:func:`satmon.functional.loss.loss_trend`); a stalled loss with
            saturation at or above the threshold adds the ``"stalled-loss"`` flag.
        offset: per-layer offset readings to show; ``offset_flag`` adds the ``"offset-driven"`` flag when the
            saturation is at or above the threshold (what the flag qualifies is a high saturation, a GO).
        nonfinite_weights: parameter name -> NaN/inf element count (or the total): any makes it ``"non-finite"``.
        offset_every: the offset readings' sampling (every this many counted window steps; 0: every forward).
        functions: the screened layers' point-wise functions (``"tanh"``, ``"erf"``, ``"hardtanh"``).
        **rule_arguments: deprecated since satmon 0.5: the rule's seven fields given loose (``threshold``,
            ``collapse_threshold``, ``caveat``, ``threshold_source``, ``held_out_accuracy``, ``no_skill_accuracy``,
            ``held_out_cells``), read as the :class:`Rule` they make, with a warning to build the Rule.

    Returns:
        The verdict, or ``None`` when no element was counted.

    Example:
        >>> v = build_verdict({"blocks.0.ln_1": LayerCounts(60, 100), "ln_f": (20, 100)}, step=500, window=500)
        >>> v.decision, v.saturation, dict(v.per_layer)
        ('no-go', 0.4, {'blocks.0.ln_1': 0.6, 'ln_f': 0.2})
        >>> build_verdict({"x": (0, 10, 3)}, step=9, window=9).decision == Decision.NON_FINITE
        True
        >>> build_verdict({"x": (5, 10)}, step=9, nonfinite_weights={"head.weight": 4}, source="replay").decision
        'non-finite'
        >>> build_verdict({"x": (5, 10)}, step=9, source="probe", functions=("erf",)).trust
        'uncalibrated'
        >>> fitted = Rule(0.45, threshold_source="calibration", held_out_accuracy=11 / 12, no_skill_accuracy=7 / 12,
        ...               held_out_cells=12)
        >>> mine = build_verdict({"x": (5, 10)}, fitted, step=9, source="probe")
        >>> mine.trust, mine.forecast, mine.rule is fitted
        ('ok', True, True)
        >>> one_more = Rule(0.45, threshold_source="calibration", held_out_accuracy=9 / 12, no_skill_accuracy=8 / 12,
        ...                 held_out_cells=12)
        >>> build_verdict({"x": (5, 10)}, one_more, step=9, source="probe").trust  # p = 0.39 by the binomial test
        'unproven'
    """
    if rule_arguments:
        rule = _loose_rule(rule, rule_arguments)
    elif rule is None:
        rule = Rule()
    elif not isinstance(rule, Rule):
        raise TypeError(
            f"Expected `rule` to be a satmon.results.rule.Rule or None (the study's), got "
            f"{type(rule).__name__}: pass settings.rule, or Rule(threshold=..., threshold_source='user')."
        )
    rows = {name: LayerCounts(*c) for name, c in counts.items()}
    n = sum(c.total for c in rows.values())
    if n == 0:
        return None
    saturation = sum(c.saturated for c in rows.values()) / n
    nonfinite = sum(c.nonfinite for c in rows.values())
    weights = {"model": int(nonfinite_weights)} if isinstance(nonfinite_weights, int) else dict(nonfinite_weights)
    weights = {k: int(c) for k, c in weights.items() if c}
    gated = gating.gated if gating is not None else None
    decision, reason, collapse, comparison = rule.decide(saturation, gated, nonfinite, weights)
    planned = window if planned_window is None else int(planned_window)
    source = Source(source).value
    if source == Source.WINDOW.value and window < planned:
        reason = f"window cut short at {window} of {planned} steps; " + reason
    elif source != Source.WINDOW.value:
        reason = f"{source} (no training window): " + reason
    margin = saturation - rule.threshold
    high = saturation >= rule.threshold and decision != Decision.NON_FINITE  # what the flags qualify: a high saturation
    flags = []
    if loss and loss.get("stalled") and high:
        flags.append("stalled-loss")
    if offset_flag and high:
        flags.append("offset-driven")
    functions = tuple(dict.fromkeys(str(f) for f in functions))  # each once, in layer order
    inconclusive = abs(margin) < INCONCLUSIVE_BAND
    cautions = rule.cautions(decision, functions, tuple(flags), _partial(source, window, planned), inconclusive)
    return Verdict(
        decision=decision,
        saturation=float(saturation),
        rule=rule,
        margin=float(margin),
        per_layer={k: c.saturated / c.total for k, c in rows.items() if c.total},
        step=int(step),
        window=int(window),
        level=float(level),
        reason=reason,
        elements=int(n),
        nonfinite=int(nonfinite),
        inconclusive=inconclusive,
        gated=gated,
        gated_layers=gating.gated_layers if gating is not None else (),
        collapse_risk=collapse,
        risk=risk or {},
        gating_message=gating.message if gating is not None else "",
        source=source,
        planned_window=planned,
        notes=tuple(notes),
        loss=loss or {},
        flags=tuple(flags),
        offset=offset or {},
        nonfinite_weights=sum(weights.values()),
        offset_every=int(offset_every),
        functions=functions,
        trust=cautions[0] if cautions else "ok",
        cautions=cautions,
        comparison=comparison,
    )


def _loose_rule(rule: Rule | None, given: Mapping[str, Any]) -> Rule:
    """The :class:`Rule` of ``build_verdict``'s deprecated loose rule arguments (satmon 0.4's), with a warning."""
    unknown = sorted(set(given) - set(_RULE_ARGUMENTS))
    if unknown:
        raise TypeError(
            f"build_verdict() got unexpected keyword argument(s) {unknown}: expected the counts, a Rule "
            "and "
            f"the reading's own arguments (step, window, source, ...)."
        )
    if rule is not None:
        raise ValueError(
            f"Expected either `rule` or the rule's own arguments, got both ({sorted(given)}): put them in the Rule."
        )
    deprecated(
        f"build_verdict({', '.join(f'{k}=' for k in given)})",
        "a Rule: build_verdict(counts, Rule(threshold=..., threshold_source='user'), ...), or settings.rule",
        stacklevel=4,
    )
    threshold = given.get("threshold")
    whose = given.get("threshold_source") or ("study" if threshold is None else "user")  # never inferred from its value
    return Rule(
        THRESHOLD if threshold is None else threshold,
        given.get("collapse_threshold", COLLAPSE_THRESHOLD),
        given.get("caveat") or CAVEAT,
        whose,
        given.get("held_out_accuracy"),
        given.get("no_skill_accuracy"),
        given.get("held_out_cells"),
    )


def _flat_rule(d: Mapping[str, Any]) -> Rule:
    """The rule of a verdict dict saved by satmon 0.1 to 0.4, which kept its seven fields at the top."""
    threshold = d.get("threshold", THRESHOLD)
    source = d.get("threshold_source") or ("study" if threshold == THRESHOLD else "user")  # before threshold_source
    record = (d.get("held_out_accuracy"), d.get("no_skill_accuracy"), d.get("held_out_cells"))
    if source == "study" and record in ((None, None, None), Rule().evidence()):
        record = (None, None, None)  # the study's own figures (0.4 wrote them out): the study's rule as built today
    return Rule(threshold, d.get("collapse_threshold", COLLAPSE_THRESHOLD), d.get("caveat") or CAVEAT, source, *record)


def _partial(source: str, window: int, planned_window: int) -> bool:
    """A live window that ended before ``planned_window`` steps (:attr:`Verdict.partial`)."""
    return source == Source.WINDOW.value and 0 < window < planned_window
