"""The GO / NO-GO rule: its defaults (stated once), whose threshold it is, the decision and the trust.

A :class:`Rule` is made once, by :class:`satmon.Settings` (``settings.rule``, through :meth:`Rule.resolve`), and
carried whole to :func:`satmon.results.reading.verdict_of` and :func:`satmon.results.verdict.build_verdict`, and kept
whole in the verdict (``verdict.rule``). Its :meth:`Rule.decide` is the study's :class:`Decision` (GO, NO-GO,
NON-FINITE, collapse risk) with the comparison it made (``">="`` / ``"<"``), which the card and the CLI print as made,
never re-derived; :meth:`Rule.cautions` is the trust.
Whose threshold it is (``source``) is carried by the rule, never found by comparing numbers.

Example:
    >>> Rule().decide(0.5, gated=False).decision == Decision.GO == "go"
    True
    >>> Rule(threshold=0.6, threshold_source="user").decide(0.5).comparison
    '<'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Literal, NamedTuple

from satmon import study
from satmon.functional.significance import ALPHA, beats, correct_of
from satmon.results.calibration import Calibration

__all__ = ["CALIBRATED_FUNCTION", "THRESHOLD_SOURCES", "TRUST", "Decided", "Decision", "Rule", "Trust"]


class Decision(str, Enum):
    """The study's decision on a reading. A ``str``: ``Decision.GO == "go"``, and JSON, logs, f-strings and reprs
    read ``"go"``, ``"no-go"``, ``"non-finite"`` as before (a script that compared strings keeps working).

    Example:
        >>> Decision("no-go") is Decision.NO_GO, Decision.NON_FINITE, Decision.GO.word
        (True, 'non-finite', 'GO')
    """

    GO = "go"  #: pooled saturation at or above the threshold
    NO_GO = "no-go"  #: below the threshold, or a collapse risk in a gated model
    NON_FINITE = "non-finite"  #: DyT inputs, alphas or weights held NaN/inf: the run diverged, the rule does not apply

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # as the str it is: printed tuples and logs read as before
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def word(self) -> str:
        """How the card and the console print it: ``"GO"``, ``"NO-GO"``, ``"NON-FINITE"``."""
        return self.value.upper()


Trust = Literal["ok", "uncalibrated", "flagged", "partial", "inconclusive", "unproven"]
#: What ``Verdict.trust`` can say, most serious first: the order in which ``cautions`` are listed and
#: the one ``trust`` names. ``"ok"``: nothing undercuts the decision. ``"uncalibrated"``: a layer applies a
#: point-wise function the study did not calibrate (not tanh) and the threshold is the study's (give your own
#: ``threshold=`` or ``calibration=``). ``"flagged"``: a flag (offset-driven, stalled-loss) says the saturation is
#: from a pattern the study's cells were not read for. ``"partial"``: training ended before the window closed; the
#: verdict is provisional (a resume from a checkpoint finishes the window). ``"inconclusive"``: ``|margin|`` is within
#: :data:`~satmon.study.INCONCLUSIVE_BAND`. ``"unproven"``: the rule was not shown to predict DyT's effect on cells it
#: was not fit on (its held-out record does not beat guessing the commoner outcome by a one-sided exact binomial test at
#: p < 0.05, or it has none: the study's 0.43,
#: a threshold given without calibration): the decision is a measurement, not a forecast. It comes last: it says
#: nothing about this run, only about the rule. A ``"non-finite"`` decision is a fact, not a rule's call: its trust
#: is ``"ok"``.
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
        if self.threshold_source == "study" and self.threshold != study.THRESHOLD:  # the study read its cells at 0.43
            raise ValueError(
                f"Expected the study's threshold {study.THRESHOLD:g} with threshold_source='study', got "
                f"{self.threshold!r}: a threshold of your own is threshold_source='user' (or "
                "'calibration')."
            )

    @classmethod
    def resolve(
        cls,
        *,
        threshold: float | None = None,
        caveat: str | None = None,
        calibration: Calibration | None = None,
        collapse_threshold: float = study.COLLAPSE_THRESHOLD,
    ) -> Rule:
        """The rule made from what was given; whose threshold it is comes from what was given, never from its value.

        ``calibration`` -> ``"calibration"`` (its threshold, caveat and held-out record); no ``threshold`` and no
        caveat of one's own -> ``"study"``; a ``threshold`` or caveat given -> ``"user"``, even the study's number.
        The numbers are checked by :class:`satmon.Settings`, which calls this.

        Args:
            threshold: the threshold as given (``None``: the study's, or the calibration's).
            caveat: the card's provenance line as given (``None``: the study's, or the calibration's).
            calibration: the calibration given, if any (its threshold and caveat apply).
            collapse_threshold: the collapse threshold in force.

        Example:
            >>> Rule.resolve().threshold_source, Rule.resolve(threshold=0.43).threshold_source
            ('study', 'user')
            >>> mine = Rule.resolve(threshold=0.5, collapse_threshold=0.6)
            >>> mine.threshold, mine.collapse_threshold, mine.threshold_source
            (0.5, 0.6, 'user')
        """
        if calibration is not None:
            cells = calibration.n if calibration.n > 0 else None
            return cls(
                calibration.threshold if threshold is None else threshold,
                collapse_threshold,
                caveat or calibration.caveat(),
                "calibration",
                calibration.loso_accuracy,
                calibration.no_skill,
                cells,
            )
        text = caveat or study.CAVEAT
        source = "study" if threshold is None and text == study.CAVEAT else "user"
        return cls(study.THRESHOLD if threshold is None else threshold, collapse_threshold, text, source)

    def to_dict(self) -> dict[str, Any]:
        """The rule's fields as plain values (what ``Verdict.to_dict`` nests under ``"rule"``).

        Example:
            >>> Rule.from_dict(Rule(0.5, threshold_source="user").to_dict()) == Rule(0.5, threshold_source="user")
            True
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rule:
        """Read back :meth:`to_dict` (keys this version does not know are left out)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def compare(self, saturation: float) -> str:
        """``">="`` when ``saturation`` is at or above the threshold, else ``"<"``: the one comparison."""
        return ">=" if saturation >= self.threshold else "<"

    def decide(
        self, saturation: float, gated: bool | None = None, nonfinite: int = 0, weights: Mapping[str, int] | None = None
    ) -> Decided:
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
                names = ", ".join(f"{n} ({c:,})" for n, c in list(weights.items())[:6])
                names += ", ..." if len(weights) > 6 else ""
                what.append(f"{bad_weights:,} weight element(s) are NaN/inf ({names})")
            return Decided(
                Decision.NON_FINITE,
                (
                    "; ".join(what) + ": the run diverged, and a NaN element counts as unsaturated, so the pooled "
                    "saturation is not a reading of a healthy run. Lower the learning rate, "
                    "clip gradients or check the "
                    "data, then screen again"
                ),
                None,
                op,
            )
        collapse = None if gated is None else bool(gated) and saturation >= self.collapse_threshold
        if collapse:
            return Decided(
                Decision.NO_GO,
                (
                    f"collapse risk: DyT feeds a gated MLP and pooled saturation {saturation:.4f} >= "
                    f"{self.collapse_threshold:g} "
                    "(the study flagged 4/4 collapses at this level, 0/5 false alarms)"
                ),
                True,
                op,
            )
        decision = Decision.GO if op == ">=" else Decision.NO_GO
        said = f"measured pooled saturation {saturation:.4f} {op} {self.threshold:g}"
        if self.threshold_source == "study":  # the study's cells on that side of its threshold (satmon.study.MEANING)
            return Decided(decision, f"{said}; {study.ON_SIDE[decision]}", collapse, op)
        said += f" (the study's cells were counted against {study.THRESHOLD:g}, not this threshold)"
        return Decided(decision, said, collapse, op)

    def evidence(self) -> tuple[float | None, float | None, int | None]:
        """The rule's held-out evidence ``(accuracy, no-skill accuracy, cells)``: as given, or the study's for its
        own."""
        held_out, no_skill, cells = self.held_out_accuracy, self.no_skill_accuracy, self.held_out_cells
        if self.threshold_source == "study" and held_out is None and no_skill is None:
            return study.HELD_OUT_ACCURACY, study.NO_SKILL_ACCURACY, study.HELD_OUT_CELLS
        return (
            (None if held_out is None else float(held_out)),
            (None if no_skill is None else float(no_skill)),
            None if cells is None or int(cells) <= 0 else int(cells),
        )

    def forecasts(self) -> bool:
        """The rule forecasts when its held-out record beats guessing the commoner outcome by a one-sided exact
        binomial test at p < :data:`~satmon.functional.significance.ALPHA`."""
        return forecasts(*self.evidence())

    def cautions(
        self,
        decision: Decision | str,
        functions: tuple[str, ...],
        flags: tuple[str, ...],
        partial: bool,
        inconclusive: bool,
    ) -> tuple[str, ...]:
        """What undercuts a decision, most serious first (:data:`TRUST`); nothing for a non-finite one (a fact)."""
        if decision == Decision.NON_FINITE:
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
    """Whether a held-out record (``held_out`` of ``cells`` right) beats guessing the commoner outcome
    (``no_skill``)."""
    if held_out is None or no_skill is None or cells is None:
        return False
    if not 0.0 <= held_out <= 1.0 or not 0.0 <= no_skill <= 1.0:
        return False
    return beats(correct_of(held_out, cells), cells, no_skill, ALPHA)
