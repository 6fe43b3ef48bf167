"""The trap reading in words and scalars: what one check found, and, when the evidence says the run cannot
learn, the one line that says **trapped** with the layer, the offset against the token spread, the step the
trap closed and what changes it (a measurement, docs/science/science.md, "the trap").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from satmon import study
from satmon.functional.trap import (
    REACH_FLOOR,
    TRAP_SATURATION,
    offset_share,
    trap_found,
)
from satmon.results.frozen import freeze

__all__ = ["REMEDY", "TrapReading", "reading_of"]

#: What the evidence says changes it: a measurement, with the option that gives it.
REMEDY = (
    f"Measured (docs/science/abort_policy.md): {study.TRAP_RECORD}. In satmon's LLaMA demo (500 steps, seeds 11 and "
    "6; data/llama_final_norm.json) DyT blocks with an RMSNorm final norm learned (1.96 and 1.97 nats/byte) where a "
    "DyT final norm stayed at the unigram level (3.07 and 3.06 against 3.06). The option that gives it: a LayerNorm "
    "or RMSNorm final norm (`final_norm=` in satmon.demos.llama and `satmon grid llama`; in your model, the last norm "
    "before the head). In satmon's GPT demo (`satmon demo --stalled`) the embedding drawn at std d_model ** -0.5 "
    "instead of 0.02 is what lets the same model train (its default)."
)


@dataclass(frozen=True)
class TrapReading:
    """One trap check, on the host.

    Attributes:
        step: the optimizer step read.
        final: the final norm's name (the last normaliser to run before the head); ``None``: unknown.
        final_kind: ``"dyt"``, ``"layernorm"``, ``"rmsnorm"``; ``None``: unknown.
        layers: DyT layer -> ``saturated``, ``centered`` (fractions), ``offset_ratio`` (median ``|m_c| / s_c``),
            ``offset`` and ``spread`` (medians over channels of ``|m_c|`` and of ``s_c``).
        reach: the gradient norm below the final norm over the head's (``None``: not read, NaN: no head gradient).
        reach_by_group: each group below (the embedding, each block) -> its reach (``None``: no gradient computed).
        found: this check's evidence of the trap (:func:`satmon.functional.trap.trap_found`).
        streak: consecutive checks with the evidence, this one included.
        trapped: the streak reached the watch's patience: the run cannot learn as it stands.
        closed_step: the first step of the streak (the step the trap was first seen closed).
        unknown: modules whose parameters are on neither side (their forward encloses the final norm).

    Example:
        >>> r = TrapReading(60, "norm_f", "dyt", {"norm_f": {"saturated": 1.0, "centered": 0.0, "offset_ratio": 90.0,
        ...                 "offset": 94.0, "spread": 1.04}}, 0.0, {"tok_emb": 0.0}, True, 3, True, 40)
        >>> print(r.line())  # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
        satmon: trapped at step 60: the final norm norm_f (DyT) is 100% saturated, 100% of
        it by a per-channel offset ...
    """

    step: int
    final: str | None
    final_kind: str | None
    layers: Mapping[str, Mapping[str, float]]
    reach: float | None
    reach_by_group: Mapping[str, float | None]
    found: bool
    streak: int = 0
    trapped: bool = False
    closed_step: int | None = None
    unknown: Sequence[str] = ()
    note: str = ""  # why the final norm is unknown, when it is

    def __post_init__(self) -> None:
        for name in ("layers", "reach_by_group", "unknown"):
            object.__setattr__(self, name, freeze(getattr(self, name)))

    @property
    def final_reading(self) -> Mapping[str, float] | None:
        return self.layers.get(self.final) if self.final is not None else None

    def status(self) -> str:
        """Where the reading stands, in one clause (not trapped, why not, or trapped)."""
        if self.trapped:
            return "trapped"
        if self.final is None:
            return (
                f"unknown: {self.note or 'no normaliser ran before the head'}, so satmon cannot tell which layers are "
                "below the final norm"
            )
        if self.final_kind != "dyt":
            return (
                f"not trapped: the final norm {self.final} is {self.final_kind or 'of an unknown kind'}, not a DyT "
                "(the trap closes at a DyT final norm)"
            )
        if self.reach is None or math.isnan(self.reach):
            return f"unknown: no gradient reached the head side of {self.final} in the checked step"
        if self.final_reading is None:
            return (
                f"unknown: {self.final} has no offset reading (a learned shift of its own, or an input its alpha "
                f"does not broadcast against); gradient below it {self.reach:.3g} of the head's"
            )
        if self.found:
            return f"the trap's evidence in {self.streak} consecutive check(s), not yet the watch's patience"
        if self.reach > REACH_FLOOR:
            tiny = (
                " (tiny, but not zero: runs like this have escaped late; `trap_floor` names them)"
                if self.reach < 1e-4
                else ""
            )
            return f"not trapped: gradient reaches below {self.final} ({self.reach:.3g} of the head's{tiny})"
        return f"not trapped: no gradient reaches below {self.final}, but {self.final} is not saturated by an offset"

    def line(self) -> str:
        """The console line: ``trapped`` with the layer, the offset against the token spread, the step it closed and
        what changes it; else the status."""
        if not self.trapped:
            return f"satmon: trap reading at step {self.step}: {self.status()}."
        f = self.final_reading or {}
        sat, cen = f.get("saturated", 0.0), f.get("centered", 0.0)
        share = offset_share(sat, cen) or 0.0
        below = ", ".join(self.reach_by_group) or "the layers below it"
        return (
            f"satmon: trapped at step {self.step}: the final norm {self.final} (DyT) is {sat:.0%} saturated, "
            f"{share:.0%} of it by a per-channel offset (median |offset| {f.get('offset', math.nan):.3g} against a "
            f"token spread of {f.get('spread', math.nan):.3g}), and the gradient below it is exactly 0 ({below}; "
            f"only the head side learns) in every check since step {self.closed_step}. The run cannot learn as it "
            f"stands. {REMEDY}"
        )

    def markdown(self) -> str:
        """The text logged under ``satmon/trap``: the line, then each DyT layer's reading and each group's reach."""
        rows = [
            f"| {n} | {r['saturated']:.3f} | {r['centered']:.3f} | {r['offset']:.3g} | {r['spread']:.3g} |"
            for n, r in self.layers.items()
        ]
        reach = [
            f"| {g} | {'no gradient computed' if v is None else f'{v:.3g}'} |" for g, v in self.reach_by_group.items()
        ]
        title = "trapped" if self.trapped else "trap reading"
        return "\n".join(
            [
                f"### satmon: {title} (step {self.step})",
                "",
                self.line().removeprefix("satmon: "),
                "",
                "| DyT layer | saturated | centered | median abs offset | median token spread |",
                "|---|---|---|---|---|",
                *rows,
                "",
                "| below the final norm | gradient norm / head's |",
                "|---|---|",
                *reach,
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "final": self.final,
            "final_kind": self.final_kind,
            "reach": self.reach,
            "found": self.found,
            "streak": self.streak,
            "trapped": self.trapped,
            "closed_step": self.closed_step,
        }


def reading_of(
    step: int,
    layout: Any,
    layers: Mapping[str, Mapping[str, float]],
    square: Sequence[float],
    seen: Sequence[float],
    *,
    saturated_at: float = TRAP_SATURATION,
    retained_below: float = 0.25,
    floor: float = REACH_FLOOR,
) -> TrapReading:
    """A :class:`TrapReading` from a check's numbers: the layout (:class:`satmon.observe.trap.Layout`), the DyT
    layers' offset readings, and per group the squared gradient norm and the parameters that got a gradient (the
    head's side first).

    Example:
        >>> from satmon.observe.trap import Layout
        >>> lay = Layout("norm_f", "dyt", ["head", "emb"], [])
        >>> r = reading_of(5, lay, {"norm_f": {"saturated": 1.0, "centered": 0.0}}, [4.0, 0.0], [1.0, 1.0])
        >>> r.found, r.reach, dict(r.reach_by_group)
        (True, 0.0, {'emb': 0.0})
    """
    head_sq, head_seen = (square[0], seen[0]) if square else (0.0, 0.0)
    by_group: dict[str, float | None] = {}
    below_sq, below_seen = 0.0, 0.0
    for g, sq, n in zip(layout.groups[1:], square[1:], seen[1:]):
        by_group[g] = math.sqrt(sq / head_sq) if n and head_sq > 0 else (math.nan if n else None)
        if n:
            below_sq, below_seen = below_sq + sq, below_seen + n
    reach = None
    if below_seen and head_seen:
        reach = math.sqrt(below_sq / head_sq) if head_sq > 0 else math.nan
    f = layers.get(layout.final) if layout.final is not None else None
    found = f is not None and trap_found(
        layout.final_kind == "dyt",
        f["saturated"],
        f["centered"],
        reach,
        saturated_at=saturated_at,
        retained_below=retained_below,
        floor=floor,
    )
    return TrapReading(
        step,
        layout.final,
        layout.final_kind,
        layers,
        reach,
        by_group,
        found,
        unknown=layout.unknown,
        note=getattr(layout, "note", ""),
    )
