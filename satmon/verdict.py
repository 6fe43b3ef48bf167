"""The GO / NO-GO verdict: the rule, its provenance, and how it reads (card, console line)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Verdict", "decide", "CAVEAT", "INCONCLUSIVE_BAND"]

CAVEAT = (
    "Caveat: 0.43 was fit on 12 cells of one study (75% in-sample, 50% leave-one-scale-out), on ~5k-step "
    "checkpoints with alpha_init 2.0: a measurement, not a model-selection rule."
)
#: |margin| below this is reported as inconclusive (the decision is still given). The study's
#: calibration gap between the highest "DyT hurts" cell (0.4295) and the threshold is 0.0005, so
#: any cell within a few hundredths sits where seeds disagree; satmon flags +-0.02.
INCONCLUSIVE_BAND = 0.02


@dataclass
class Verdict:
    """What the screening window concluded.

    Attributes:
        decision: ``"go"`` (DyT acts as a regulariser: keep it) or ``"no-go"`` (convergence penalty,
            or collapse risk in a gated model: switch back to LayerNorm/RMSNorm).
        saturation: pooled fraction of DyT input elements with ``|alpha * x| > level``.
        threshold: the GO threshold used (study: 0.43).
        margin: ``saturation - threshold``.
        per_layer: layer name -> saturation fraction.
        step: optimizer step at which the verdict was taken.
        window: window length in optimizer steps.
        level: the saturation level.
        reason: one human sentence.
        elements: number of elements counted (all layers, all ranks).
        nonfinite: DyT layer inputs (one layer, one forward pass each) that held any ``inf``/``nan``
            in the window. ``inf`` elements count as saturated, ``nan`` ones do not; any non-zero
            value deserves a look.
        inconclusive: ``|margin| < INCONCLUSIVE_BAND``.
        gated: whether a DyT layer feeds a gated (SwiGLU/GeGLU) MLP; ``None`` when not checked.
        gated_layers: the DyT layers that feed a gated MLP.
        collapse_risk: gated model with saturation >= ``collapse_threshold``; ``None`` when not gated.
        collapse_threshold: the pooled-saturation level that flags collapse in gated models (study: 0.5).
        risk: per gated block readings (DyT saturation, gate statistics).
        gating_message: what architecture detection found, in words.
    """

    decision: Literal["go", "no-go"]
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

    @property
    def go(self) -> bool:
        return self.decision == "go"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (also what the callback keeps in its ``state_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def summary(self) -> str:
        """One console line.

        Example:
            >>> v = decide(0.5, {"a": 0.5}, threshold=0.43, step=500, window=500)
            >>> v.summary()
            'satmon verdict: GO  saturation 0.5000 >= threshold 0.43 (margin +0.0700, window 500 steps)'
        """
        op = ">=" if self.saturation >= self.threshold else "<"
        head = "GO" if self.go else "NO-GO"
        extra = " [collapse risk]" if self.collapse_risk else ""
        extra += " [inconclusive]" if self.inconclusive else ""
        return (
            f"satmon verdict: {head}{extra}  saturation {self.saturation:.4f} {op} threshold {self.threshold:g} "
            f"(margin {self.margin:+.4f}, " + (f"window {self.window} steps)" if self.window > 0 else f"probe at step {self.step})")
        )

    def card(self) -> str:
        """The verdict as a markdown card (TensorBoard text, console, reports).

        Example:
            >>> v = decide(0.3, {"blocks.0.ln_1": 0.1, "ln_f": 0.5}, threshold=0.43, step=500, window=500)
            >>> print(v.card().splitlines()[0])
            ### satmon verdict: **NO-GO**: DyT looks like a convergence penalty here; switch back to LayerNorm
        """
        if self.collapse_risk:
            head = "**NO-GO**: collapse risk: DyT feeds a gated MLP and saturates; switch back to RMSNorm/LayerNorm"
        elif self.go:
            head = "**GO**: DyT acts as a useful regulariser here; keep it"
        else:
            head = "**NO-GO**: DyT looks like a convergence penalty here; switch back to LayerNorm"
        op = ">=" if self.saturation >= self.threshold else "<"
        lines = [
            f"### satmon verdict: {head}",
            "",
            f"Pooled saturation **{self.saturation:.4f}** {op} threshold **{self.threshold:g}** "
            f"(margin {self.margin:+.4f}{', inconclusive' if self.inconclusive else ''}) "
            + (f"over a window of {self.window} optimizer steps (verdict at step {self.step}); " if self.window > 0
               else f"from a probe on calibration batches (step {self.step}, no training window); ")
            + f"saturated means |alpha x| > {self.level:g}; {self.elements:,} elements counted.",
        ]
        if self.reason:
            lines += ["", f"Reason: {self.reason}"]
        if self.gated is not None:
            lines += ["", f"Gated MLP after DyT: {'yes' if self.gated else 'no'}"
                      + (f" ({', '.join(self.gated_layers)})" if self.gated_layers else "")
                      + (f"; collapse risk: {'YES' if self.collapse_risk else 'no'} "
                         f"(pooled saturation vs {self.collapse_threshold:g})" if self.gated else "")]
        if self.nonfinite:
            lines += ["", f"Warning: {self.nonfinite:,} DyT layer input(s) held non-finite values in the window."]
        lines += ["", "| layer | saturation |", "|---|---|"]
        lines += [f"| {name} | {frac:.4f} |" for name, frac in self.per_layer.items()]
        if self.risk:
            keys = sorted({k for r in self.risk.values() for k in r})
            lines += ["", "| gated block | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
            lines += [f"| {b} | " + " | ".join(f"{r.get(k, float('nan')):.4f}" for k in keys) + " |" for b, r in self.risk.items()]
        lines += ["", f"_{self.caveat}_"]
        return "\n".join(lines)


def decide(
    saturation: float,
    per_layer: dict[str, float],
    *,
    threshold: float = 0.43,
    step: int,
    window: int,
    level: float = 2.0,
    elements: int = 0,
    nonfinite: int = 0,
    gated: bool | None = None,
    gated_layers: list[str] | None = None,
    collapse_threshold: float = 0.5,
    risk: dict[str, dict[str, float]] | None = None,
    gating_message: str = "",
) -> Verdict:
    """Apply the screening rule.

    Non-gated model (or gating unknown): GO when ``saturation >= threshold``, NO-GO otherwise.
    Gated model (a DyT feeds a SwiGLU/GeGLU MLP): ``saturation >= collapse_threshold`` is a
    collapse risk and forces NO-GO; below it the 0.43 rule applies as usual.
    ``saturation`` is the pooled DyT saturation for both rules, as in the study.

    Example:
        >>> decide(0.43, {}, step=500, window=500).decision
        'go'
        >>> decide(0.4299, {}, step=500, window=500).decision
        'no-go'
        >>> v = decide(0.6, {}, step=500, window=500, gated=True, gated_layers=["blocks.0.mlp_norm"])
        >>> v.decision, v.collapse_risk
        ('no-go', True)
    """
    if not math.isfinite(saturation):
        raise ValueError(f"Expected a finite pooled saturation, got {saturation}.")
    margin = saturation - threshold
    collapse = bool(gated) and saturation >= collapse_threshold
    if collapse:
        decision, reason = "no-go", (
            f"collapse risk: DyT feeds a gated MLP and pooled saturation {saturation:.4f} >= {collapse_threshold:g} "
            "(the study flagged 4/4 collapses at this level, 0/5 false alarms)"
        )
    elif saturation >= threshold:
        decision, reason = "go", (
            f"pooled saturation {saturation:.4f} >= {threshold:g}: DyT bounds activations enough to act as a regulariser"
        )
    else:
        decision, reason = "no-go", (
            f"pooled saturation {saturation:.4f} < {threshold:g}: DyT is expected to slow convergence; LayerNorm is the safer choice"
        )
    return Verdict(
        decision=decision, saturation=float(saturation), threshold=float(threshold), margin=float(margin),
        per_layer={k: float(v) for k, v in per_layer.items()}, step=int(step), window=int(window), level=float(level),
        reason=reason, elements=int(elements), nonfinite=int(nonfinite), inconclusive=abs(margin) < INCONCLUSIVE_BAND,
        gated=gated, gated_layers=list(gated_layers or []), collapse_risk=collapse if gated is not None and gated else (False if gated is False else None),
        collapse_threshold=float(collapse_threshold), risk=dict(risk or {}), gating_message=gating_message,
    )
