"""The GO / NO-GO rule: its defaults (stated once), whose threshold it is, the decision and the trust.

A :class:`Rule` is made once, by :class:`satmon.Settings` (``settings.rule``, through :meth:`Rule.resolve`), and
carried whole to :func:`satmon.results.reading.verdict_of` and :func:`satmon.results.verdict.build_verdict`. Its
:meth:`Rule.decide` is the study's decision (GO, NO-GO, NON-FINITE, collapse risk) with the comparison it made
(``">="`` / ``"<"``), which the card and the CLI print as made, never re-derived; :meth:`Rule.cautions` is the trust.
Whose threshold it is (``source``) is carried by the rule, never found by comparing numbers.

Example:
    >>> Rule().decide(0.5, gated=False).decision, Rule(threshold=0.6, threshold_source="user").decide(0.5).comparison
    ('go', '<')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from satmon import study
from satmon.functional.significance import ALPHA, beats, correct_of
from satmon.results.calibration import Calibration, short_repr

__all__ = ["CALIBRATED_FUNCTION", "THRESHOLD_SOURCES", "TRUST", "Decided", "Decision", "Rule", "Trust"]

Decision = Literal["go", "no-go", "non-finite"]
Trust = Literal["ok", "uncalibrated", "flagged", "partial", "inconclusive", "unproven"]
#: What ``Verdict.trust`` can say, most serious first: the order in which ``cautions`` are listed and
#: the one ``trust`` names. ``"ok"``: nothing undercuts the decision. ``"uncalibrated"``: a layer applies a
#: point-wise function the study did not calibrate (not tanh) and the threshold is the study's (give your own
#: ``threshold=`` or ``calibration=``). ``"flagged"``: a flag (offset-driven, stalled-loss) says the saturation is
#: from a pattern the study's cells were not read for. ``"partial"``: training ended before the window closed; the verdict is
#: provisional (a resume from a checkpoint finishes the window). ``"inconclusive"``: ``|margin|`` is within
#: :data:`~satmon.study.INCONCLUSIVE_BAND`. ``"unproven"``: the rule was not shown to predict DyT's effect on cells it
#: was not fit on (its held-out record does not beat guessing the commoner outcome by a one-sided exact binomial test at
#: p < 0.05, or it has none: the study's 0.43,
#: a threshold given without calibration): the decision is a measurement, not a forecast. It comes last: it says
#: nothing about this run, only about the rule. A ``"non-finite"`` decision is a fact, not a rule's call: its trust is ``"ok"``.
TRUST: tuple[str, ...] = ("ok", "uncalibrated", "flagged", "partial", "inconclusive", "unproven")
#: Whose threshold the decision used: the study's 0.43 (and caveat), one the user gave, or a calibration's.
THRESHOLD_SOURCES: tuple[str, ...] = ("study", "user", "calibration")
#: The point-wise function the study's threshold was calibrated for (DyT's).
CALIBRATED_FUNCTION = "tanh"


class Decided(NamedTuple):
    """What :meth:`Rule.decide` decided: the decision, its reason, the collapse risk (``None``: not gated or not read)
    and the comparison of the pooled saturation with the threshold (``">="`` or ``"<"``), as printed."""

    decision: Decision
    reason: str
    collapse_risk: bool | None
    comparison: str


@dataclass(frozen=True)
class Rule:
    """How a reading is judged: the threshold, the collapse threshold, the caveat, and whose threshold it is.

    Attributes:
        threshold: the GO threshold on pooled saturation (the study's :data:`satmon.study.THRESHOLD`, 0.43).
        collapse_threshold: pooled saturation at which a gated model is a collapse risk (the study's 0.5).
        caveat: the card's provenance line.
        threshold_source: ``"study"`` (the study's 0.43 and caveat), ``"user"`` (a threshold or caveat the user
            gave) or ``"calibration"`` (a ``calibration.json``'s) (:data:`THRESHOLD_SOURCES`).
        held_out_accuracy, no_skill_accuracy: how well the threshold was shown to predict on cells it was not
            fit on, and guessing the commoner outcome there (a calibration's; ``None`` with the study's: the
            study's figures; ``None`` with a user's: no evidence).
        held_out_cells: how many cells ``held_out_accuracy`` was scored on (a calibration's ``n``): the
            significance test counts them.

    Example:
        >>> from satmon import Settings
        >>> Settings().rule.threshold_source, Settings(threshold=0.5).rule.threshold_source
        ('study', 'user')
    """

    threshold: float = study.THRESHOLD
    collapse_threshold: float = study.COLLAPSE_THRESHOLD
    caveat: str = study.CAVEAT
    threshold_source: str = "study"
    held_out_accuracy: float | None = None
    no_skill_accuracy: float | None = None
    held_out_cells: int | None = None

    def __post_init__(self) -> None:
        if self.threshold_source not in THRESHOLD_SOURCES:
            raise ValueError(f"Expected `threshold_source` in {THRESHOLD_SOURCES}, got {self.threshold_source!r}.")
        if self.threshold_source == "study" and self.threshold != study.THRESHOLD:  # the study's cells were read at 0.43 only
            raise ValueError(f"Expected the study's threshold {study.THRESHOLD:g} with threshold_source='study', got "
                             f"{self.threshold!r}: a threshold of your own is threshold_source='user' (or 'calibration').")

    @classmethod
    def resolve(cls, carried: Any, cal: Calibration | None, threshold: Any, caveat: str | None, resolved: float,
                collapse: float) -> Rule:
        """The settings' one rule; whose threshold it is comes from what was given (see :class:`satmon.Settings`).

        Args:
            carried: the rule a ``dataclasses.replace`` of the settings carried (``None``: none).
            cal: the calibration given, if any.
            threshold: the threshold as given (``None``: not given).
            caveat: the caveat as given.
            resolved, collapse: the threshold and collapse threshold in force, checked.
        """
        if carried is not None and not isinstance(carried, Rule):
            raise ValueError(f"Expected `rule` to be left out (Settings makes it from threshold, caveat and calibration), "
                             f"got {short_repr(carried)} ({type(carried).__name__}).")
        text = caveat or study.CAVEAT
        if cal is not None:
            return cls(resolved, collapse, text, "calibration", cal.loso_accuracy, cal.no_skill, cal.n if cal.n > 0 else None)
        if (carried is not None and carried.threshold_source != "calibration" and carried.threshold == resolved
                and carried.caveat == text):  # dataclasses.replace that left the rule as it was: the same rule
            return cls(resolved, collapse, text, carried.threshold_source)
        source = "study" if threshold is None and text == study.CAVEAT else "user"
        return cls(resolved, collapse, text, source)

    def compare(self, saturation: float) -> str:
        """``">="`` when ``saturation`` is at or above the threshold, else ``"<"``: the one comparison."""
        return ">=" if saturation >= self.threshold else "<"

    def decide(self, saturation: float, gated: bool | None = None, nonfinite: int = 0,
               weights: Mapping[str, int] | None = None) -> Decided:
        """The study's decision; non-finite inputs and weights come first, then the collapse risk of a gated model.

        Example:
            >>> Rule().decide(0.6, gated=True).reason.split(":")[0], Rule().decide(0.3).decision
            ('collapse risk', 'no-go')
        """
        weights = weights or {}
        op = self.compare(saturation)
        bad_weights = sum(weights.values())
        if nonfinite or bad_weights:
            what = []
            if nonfinite:
                what.append(f"{nonfinite:,} DyT layer input(s) or alpha(s) held NaN/inf")
            if bad_weights:
                names = ", ".join(f"{n} ({c:,})" for n, c in list(weights.items())[:6]) + (", ..." if len(weights) > 6 else "")
                what.append(f"{bad_weights:,} weight element(s) are NaN/inf ({names})")
            return Decided("non-finite", (
                "; ".join(what) + ": the run diverged, and a NaN element counts as unsaturated, so the pooled saturation "
                "is not a reading of a healthy run. Lower the learning rate, clip gradients or check the data, then screen "
                "again"), None, op)
        collapse = None if gated is None else bool(gated) and saturation >= self.collapse_threshold
        if collapse:
            return Decided("no-go", (
                f"collapse risk: DyT feeds a gated MLP and pooled saturation {saturation:.4f} >= {self.collapse_threshold:g} "
                "(the study flagged 4/4 collapses at this level, 0/5 false alarms)"), True, op)
        decision: Decision = "go" if op == ">=" else "no-go"
        said = f"measured pooled saturation {saturation:.4f} {op} {self.threshold:g}"
        if self.threshold_source == "study":  # the study's cells on that side of its threshold (satmon.study.MEANING)
            return Decided(decision, f"{said}; {study.ON_SIDE[decision]}", collapse, op)
        return Decided(decision, f"{said} (the study's cells were counted against {study.THRESHOLD:g}, not this threshold)",
                       collapse, op)

    def evidence(self) -> tuple[float | None, float | None, int | None]:
        """The rule's held-out evidence ``(accuracy, no-skill accuracy, cells)``: as given, or the study's for its own."""
        held_out, no_skill, cells = self.held_out_accuracy, self.no_skill_accuracy, self.held_out_cells
        if self.threshold_source == "study" and held_out is None and no_skill is None:
            return study.HELD_OUT_ACCURACY, study.NO_SKILL_ACCURACY, study.HELD_OUT_CELLS
        return ((None if held_out is None else float(held_out)), (None if no_skill is None else float(no_skill)),
                None if cells is None or int(cells) <= 0 else int(cells))

    def forecasts(self) -> bool:
        """The rule forecasts when its held-out record beats guessing the commoner outcome by a one-sided exact
        binomial test at p < :data:`~satmon.functional.significance.ALPHA`."""
        return forecasts(*self.evidence())

    def cautions(self, decision: str, functions: tuple[str, ...], flags: tuple[str, ...], partial: bool,
                 inconclusive: bool) -> tuple[str, ...]:
        """What undercuts a decision, most serious first (:data:`TRUST`); nothing for a non-finite one (a fact)."""
        if decision == "non-finite":
            return ()
        found = {
            "uncalibrated": self.threshold_source == "study" and any(f != CALIBRATED_FUNCTION for f in functions),
            "flagged": bool(flags),
            "partial": partial,
            "inconclusive": inconclusive,
            "unproven": not self.forecasts(),
        }
        return tuple(t for t in TRUST if found.get(t))


def forecasts(held_out: float | None, no_skill: float | None, cells: int | None) -> bool:
    """Whether a held-out record (``held_out`` of ``cells`` right) beats guessing the commoner outcome (``no_skill``)."""
    if held_out is None or no_skill is None or cells is None or not 0.0 <= held_out <= 1.0 or not 0.0 <= no_skill <= 1.0:
        return False
    return beats(correct_of(held_out, cells), cells, no_skill, ALPHA)
