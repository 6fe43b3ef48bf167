"""How a :class:`~satmon.results.verdict.Verdict` reads: its title, its console line and its markdown card."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from satmon.results.verdict import Verdict

__all__ = ["FLAG_TEXT", "card", "headline", "summary"]

#: What each flag means, in the card. Flags sit beside the study's rule; they never change the decision.
FLAG_TEXT = {
    "stalled-loss": "saturation at or above the threshold while the training loss stopped improving over the "
                    "window's second half: the stalled-run pattern (docs/faq.md), not DyT regularising. Check the "
                    "offset reading and the loss before keeping DyT.",
    "offset-driven": "most of the saturation comes from per-channel constants in the DyT inputs (each channel sits on "
                     "an offset far above its token-to-token spread), not from informative activations: the stalled-run "
                     "pattern (docs/faq.md), not a regulariser at work.",
}


def headline(v: Verdict) -> str:
    """The decision in words (the card's title)."""
    if v.decision == "non-finite":
        return "**NON-FINITE**: DyT inputs held NaN/inf: the run diverged; fix that before judging the norm"
    if v.collapse_risk:
        return "**NO-GO**: collapse risk: DyT feeds a gated MLP and saturates; switch back to RMSNorm/LayerNorm"
    if v.go:
        return "**GO**: DyT acts as a useful regulariser here; keep it"
    return "**NO-GO**: DyT looks like a convergence penalty here; switch back to LayerNorm"


def _where(v: Verdict) -> str:
    if v.source == "window":
        return f"window {v.window} steps)"
    return f"{v.source} at step {v.step})"


def summary(v: Verdict) -> str:
    """One console line: decision, saturation against the threshold, margin, window."""
    op = ">=" if v.saturation >= v.threshold else "<"
    head = {"go": "GO", "no-go": "NO-GO", "non-finite": "NON-FINITE"}[v.decision]
    extra = " [collapse risk]" if v.collapse_risk else ""
    extra += " [inconclusive]" if v.inconclusive else ""
    extra += " [partial window]" if v.partial else ""
    extra += "".join(f" [{flag}]" for flag in v.flags)
    return (f"satmon verdict: {head}{extra}  saturation {v.saturation:.4f} {op} threshold {v.threshold:g} "
            f"(margin {v.margin:+.4f}, " + _where(v))


def card(v: Verdict) -> str:
    """The markdown card: title, the numbers, reason, gating, loss and offset readings, flags, notes, layers, caveat."""
    op = ">=" if v.saturation >= v.threshold else "<"
    if v.source == "window":
        where = f"over a window of {v.window} optimizer steps (verdict at step {v.step}); "
    else:
        where = f"from a {v.source} on calibration batches (step {v.step}, no training window); "
    lines = [
        f"### satmon verdict: {headline(v)}", "",
        f"Pooled saturation **{v.saturation:.4f}** {op} threshold **{v.threshold:g}** "
        f"(margin {v.margin:+.4f}{', inconclusive' if v.inconclusive else ''}) " + where
        + f"saturated means |alpha x| > {v.level:g}; {v.elements:,} elements counted.",
    ]
    if v.reason:
        lines += ["", f"Reason: {v.reason}"]
    lines += _gating_lines(v)
    if v.nonfinite:
        lines += ["", f"Warning: {v.nonfinite:,} DyT layer input(s) or alpha(s) held non-finite values."]
    lines += _reading_lines(v)
    lines += [f"\nNote: {n}" for n in v.notes]
    lines += ["", "| layer | saturation |", "|---|---|"]
    lines += [f"| {name} | {frac:.4f} |" for name, frac in v.per_layer.items()]
    if v.risk:
        keys = sorted({k for r in v.risk.values() for k in r})
        lines += ["", "| gated block | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        lines += [f"| {b} | " + " | ".join(f"{r.get(k, float('nan')):.4f}" for k in keys) + " |" for b, r in v.risk.items()]
    lines += ["", f"_{v.caveat}_"]
    return "\n".join(lines)


def _reading_lines(v: Verdict) -> list[str]:
    """The loss beside the verdict, and what the flags mean."""
    out = []
    if v.loss and v.loss.get("first") == v.loss.get("first"):  # not NaN
        out += ["", f"Training loss over the window: {v.loss['first']:.4f} -> {v.loss['last']:.4f} "
                    f"({100 * v.loss['change']:+.1f}%; second half {100 * v.loss['late_change']:+.1f}%)"
                    + (": stopped improving" if v.loss.get("stalled") else "")]
    if v.offset:
        out += ["", "| layer | saturation (sampled) | after removing channel means | median abs(mean)/spread |",
                "|---|---|---|---|"]
        out += [f"| {n} | {r['saturated']:.4f} | {r['centered']:.4f} | {r['offset_ratio']:.3g} |" for n, r in v.offset.items()]
    for flag in v.flags:
        out += ["", f"**Flag: {flag}**: {FLAG_TEXT[flag]}"]
    return out


def _gating_lines(v: Verdict) -> list[str]:
    if v.gated is None:
        return ["", f"Gated MLP after DyT: unknown ({v.gating_message})"] if v.gating_message else []
    line = f"Gated MLP after DyT: {'yes' if v.gated else 'no'}"
    line += f" ({', '.join(v.gated_layers)})" if v.gated_layers else ""
    if v.gated:
        line += (f"; collapse risk: {'YES' if v.collapse_risk else 'no'} "
                 f"(pooled saturation vs {v.collapse_threshold:g})")
    return ["", line]
