"""How a :class:`~satmon.results.verdict.Verdict` reads: its headline, its console line and its card.

The headline says the decision, what qualifies it, and what the rule's evidence makes of it: the
study's rule decides; a flag, a window cut short, a function the study did not calibrate or a margin
inside the inconclusive band qualify it; and its held-out accuracy, against guessing the commoner
outcome (by a one-sided exact binomial test, p < 0.05), says whether the decision is "a forecast" or "a
measurement, not a forecast". What GO and NO-GO say and what the study's rule is worth are
:data:`satmon.study.MEANING` and :data:`satmon.study.WORTH`, worded there once. It gives no
advice in the imperative: what to do is the card's and the docs' to say, beside their evidence. The
card is markdown (TensorBoard, reports): the headline, the numbers, the trust, the reason, the flags
and the caveat come first, then one per-layer table. :func:`plain` renders the same card for a
console; :func:`summary` is the one console line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from satmon import study
from satmon.functional.saturation import pointwise_cutoff
from satmon.functional.significance import ALPHA, binomial_tail, correct_of
from satmon.results.rule import Decision
from satmon.study import INCONCLUSIVE_BAND

if TYPE_CHECKING:
    from satmon.results.verdict import Verdict

__all__ = ["FLAG_TEXT", "TRUST_TEXT", "card", "cut_off", "evidence", "headline", "plain", "summary", "whose_rule"]

#: What each flag means, in the card. Flags sit beside the study's rule; they never change the decision.
FLAG_TEXT = {
    "stalled-loss": "saturation at or above the threshold while the training loss stopped improving over the "
    "window's second half: the stalled-run pattern (docs/guides/faq.md), which the study's cells were "
    "not "
    "read for; the offset reading and the loss say whether the model learns.",
    "offset-driven": "most of the saturation comes from per-channel constants in the DyT inputs (each channel sits on "
    "an offset far above its token-to-token spread), not from informative activations: the "
    "stalled-run "
    "pattern (docs/guides/faq.md), which the study's cells were not read for.",
}
#: What each trust value means, in the card (docs/science/science.md, "How far to trust a verdict").
TRUST_TEXT = {
    "ok": "the rule forecasts on held-out cells ({evidence}) and nothing satmon measured undercuts the decision; the "
    "caveat below still applies.",
    "uncalibrated": "the screened layers apply {functions}, for which no threshold was calibrated: the study's "
    "{threshold:g} "
    "and its collapse rule were fit on DyT (tanh) only. Read the saturation as a measurement; "
    "calibrate "
    "a threshold on your own runs with `satmon calibrate`, or pass `threshold=`.",
    "flagged": "the flags below say the saturation comes from a pattern the study's cells were not read for.",
    "partial": "training ended after {window} of the {planned} window steps: the verdict is provisional. Resuming "
    "from a checkpoint continues the window; or lower `window`.",
    "inconclusive": "the margin {margin:+.4f} is within {band:g} of the threshold, where the study's cells disagree "
    "(0.4135 hurt, 0.4662 helped).",
    "unproven": "{unproven} So the decision says where the saturation sits against the threshold: a measurement, not a "
    "forecast of DyT's effect. A threshold fitted on your own runs with `satmon calibrate` whose "
    "leave-one-group-out record beats guessing the commoner outcome by a one-sided exact binomial test "
    "(p < 0.05) reads as a forecast.",
}


def whose_rule(v: Verdict) -> str:
    """Whose rule decided, in words ("by the study's rule", "by your threshold 0.3", ...)."""
    if v.rule.threshold_source == "calibration":
        return f"by your calibration's threshold {v.threshold:g}"
    if v.rule.threshold_source == "user":
        return f"by your threshold {v.threshold:g}"
    return "by the study's rule"


def _qualifiers(v: Verdict) -> list[str]:
    """Each caution in a few words, most serious first."""
    words = {
        "uncalibrated": "no calibrated threshold for " + ", ".join(v.uncalibrated_functions),
        "flagged": f"flagged ({', '.join(v.flags)})",
        "partial": f"partial window ({v.window} of {v.planned_window} steps)",
        "inconclusive": f"inconclusive (margin {v.margin:+.4f})",
    }
    return [words[c] for c in v.cautions if c in words]


def evidence(v: Verdict) -> str:
    """How well the verdict's rule was shown to predict, in a few words (the headline's last part).

    Example:
        >>> from satmon.results.verdict import Rule, build_verdict
        >>> evidence(build_verdict({"a": (1, 2)}, step=1, source="probe"))
        'held-out accuracy 50% vs 67% for guessing the commoner outcome'
        >>> evidence(build_verdict({"a": (1, 2)}, Rule(0.3, threshold_source="user"), step=1, source="probe"))
        'no held-out accuracy: a threshold given without calibration'
    """
    held, guess, _ = v.rule.evidence()
    if held is None:
        return (
            "no held-out accuracy: a threshold given without calibration"
            if v.rule.threshold_source == "user"
            else ("no held-out accuracy recorded for this threshold")
        )
    if guess is None:
        return f"held-out accuracy {held:.0%}, no baseline recorded to compare it with"
    return f"held-out accuracy {held:.0%} vs {guess:.0%} for guessing the commoner outcome"


def _unproven_text(v: Verdict) -> str:
    """Why the rule is no forecast, with its figures (the ``unproven`` trust text)."""
    if v.rule.threshold_source == "study":
        return study.WORTH.split(". So ")[0] + "; no window reading fit on those grids beat that held out."
    if v.rule.threshold_source == "user":
        return (
            f"the threshold {v.threshold:g} was given without a calibration, so nothing shows how well it predicts "
            "(`calibration=` a file of `satmon calibrate` carries its held-out accuracy)."
        )
    return f"your calibration's threshold {v.threshold:g} has {evidence(v)}{_significance(v)}."


def _significance(v: Verdict) -> str:
    """The binomial test's p-value of a calibration's held-out record against guessing, in words (or why there is
    none)."""
    held, guess, n = v.rule.evidence()
    if held is None or guess is None:
        return ""
    if n is None:
        return (
            ": the number of held-out cells is not recorded, so no significance test can be made (calibrate again "
            "with this satmon)"
        )
    k = correct_of(held, n)
    return (
        f": {k} of {n} cells right, p = {binomial_tail(k, n, guess):.2g} by a one-sided exact binomial test "
        "against "
        f"the {guess:.0%} of guessing, not below {ALPHA:g}"
    )


def _nonfinite_what(v: Verdict) -> str:
    # ``nonfinite`` counts non-finite DyT inputs and alphas together: the headline names both
    parts = (["DyT inputs or alphas"] if v.nonfinite else []) + (["weights"] if v.nonfinite_weights else [])
    return " and ".join(parts) or "DyT inputs or alphas"


def headline(v: Verdict, markdown: bool = False) -> str:
    """The decision, what qualifies it and how well its rule predicts, in one line (the card's title;
    ``markdown`` bolds the decision). Never advice in the imperative.

    Its words follow the evidence: a rule whose held-out record beats guessing the commoner outcome by a one-sided
    exact binomial test (p < 0.05) gives "a forecast" (with what it forecasts, when nothing qualifies it; "not a
    reliable forecast" when something does); any other rule gives "a measurement, not a forecast". The held-out
    accuracy ends the line.

    Example:
        >>> from satmon.results.verdict import Rule, build_verdict
        >>> fitted = Rule(0.4, threshold_source="calibration", held_out_accuracy=0.9, no_skill_accuracy=0.5,
        ...               held_out_cells=20)
        >>> print(headline(build_verdict({"a": (1, 2)}, fitted, step=1, source="probe")))
        ... # doctest: +NORMALIZE_WHITESPACE
        GO by your calibration's threshold 0.4: a forecast, DyT's final loss expected below LayerNorm's (held-out
        accuracy 90% vs 50% for guessing the commoner outcome)
    """
    word = v.decision.word
    shown = f"**{word}**" if markdown else word
    if v.decision == Decision.NON_FINITE:
        return f"{shown}: NaN/inf in the {_nonfinite_what(v)}: the run diverged, and the saturation rule does not apply"
    head = f"{shown} {whose_rule(v)}" + (" (collapse risk)" if v.collapse_risk else "")
    quals = _qualifiers(v)
    if quals:
        head += ", " + ", ".join(quals)
    if not v.forecast:
        reading = "a measurement, not a forecast"
    elif quals:
        reading = "not a reliable forecast"
    elif v.collapse_risk:
        reading = "a forecast, collapse expected (DyT feeds a gated MLP and saturates)"
    elif v.go:
        reading = "a forecast, DyT's final loss expected below LayerNorm's"
    else:
        reading = "a forecast, DyT's final loss expected above LayerNorm's"
    return f"{head}: {reading} ({evidence(v)})"


def _where(v: Verdict) -> str:
    if v.source == "window":
        return f"window {v.window} steps)"
    return f"{v.source} at step {v.step})"


def summary(v: Verdict, where: Sequence[str] | None = None) -> str:
    """One console line: the decision and its trust, the saturation against the threshold, margin, window, the
    forecast from the planned passes when made, and ``where`` the card went (``None``: not said; empty: nowhere)."""
    op = v.comparison  # as the rule compared them
    if v.decision == Decision.NON_FINITE:
        head = f"NON-FINITE (NaN/inf in the {_nonfinite_what(v)}: the run diverged)"
    else:
        qualified = v.trust + (f": {', '.join(v.flags)}" if v.trust == "flagged" else "")
        head = f"{v.decision.word} {whose_rule(v)}" + (" (collapse risk)" if v.collapse_risk else "")
        head += f" (trust: {qualified})"
    line = (
        f"satmon verdict: {head}, saturation {v.saturation:.4f} {op} threshold {v.threshold:g} "
        f"(margin {v.margin:+.4f}, " + _where(v)
    )
    if v.planned_forecast:  # the forecast from the planned passes, beside the decision (the card says what it rests on)
        from satmon.results.forecast import passes_text

        passes = v.planned_forecast.get("passes")
        line += f"; forecast from the planned passes: {v.planned_forecast.get('outcome')}" + (
            f" ({passes_text(passes)})" if isinstance(passes, (int, float)) else " (passes unknown)"
        )
    if where is None:
        return line
    return line + "; card: " + (", ".join(where) if where else "not written anywhere (no logger, no logdir)")


def card(v: Verdict) -> str:
    """The markdown card: headline, the numbers, trust, reason, flags, gating, loss, notes, caveat, then the tables."""
    op = v.comparison  # as the rule compared them
    if v.source == "window":
        asked = f"{v.planned_window} asked for; " if v.planned_window and v.planned_window != v.window else ""
        where = f"over a window of {v.window} optimizer steps ({asked}verdict at step {v.step}); "
    else:
        where = f"from a {v.source} on calibration batches (step {v.step}, no training window); "
    lines = [
        f"### satmon verdict: {headline(v, markdown=True)}",
        "",
        f"Pooled saturation **{v.saturation:.4f}** {op} threshold **{v.threshold:g}** "
        f"(margin {v.margin:+.4f}{', inconclusive' if v.inconclusive else ''}) "
        + where
        + f"saturated means {cut_off(v)}; {v.elements:,} elements counted.",
    ]
    lines += _forecast_lines(v)
    lines += ["", _trust_line(v)]
    if v.reason:
        lines += ["", f"Reason: {v.reason}"]
    for flag in v.flags:
        lines += ["", f"**Flag: {flag}**: {FLAG_TEXT[flag]}"]
    if v.nonfinite:
        lines += ["", f"Warning: {v.nonfinite:,} DyT layer input(s) or alpha(s) held non-finite values."]
    if v.nonfinite_weights:
        lines += ["", f"Warning: {v.nonfinite_weights:,} weight element(s) of the model are NaN/inf."]
    lines += _gating_lines(v)
    lines += _loss_lines(v)
    lines += [f"\nNote: {n}" for n in v.notes]
    lines += ["", f"_{v.rule.caveat}_"]
    lines += _layer_table(v)
    if v.risk:
        keys = sorted({k for r in v.risk.values() for k in r})
        lines += ["", "| gated block | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        lines += [
            f"| {b} | " + " | ".join(f"{r.get(k, float('nan')):.4f}" for k in keys) + " |" for b, r in v.risk.items()
        ]
    return "\n".join(lines)


def cut_off(v: Verdict) -> str:
    """The cut-off the counts used: the study's ``|alpha x| > level`` for tanh, the equal-gain one of the others.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> cut_off(build_verdict({"a": (1, 2)}, step=1, source="probe", functions=("hardtanh",)))
        '|u| > 1 for hardtanh (u = alpha x plus any shift; the gain tanh has at 2, docs/science/science.md)'
    """
    if all(f == "tanh" for f in v.functions):
        return f"|alpha x| > {v.level:g}"
    cuts = [
        f"|alpha x| > {v.level:g} for tanh" if f == "tanh" else f"|u| > {pointwise_cutoff(f, v.level):.4g} for {f}"
        for f in v.functions
    ]
    return ", ".join(cuts) + f" (u = alpha x plus any shift; the gain tanh has at {v.level:g}, docs/science/science.md)"


def _trust_line(v: Verdict) -> str:
    """``Trust: **<trust>**: what it means``, then each further caution in a sentence of its own."""
    if not v.cautions:
        if v.decision == Decision.NON_FINITE:
            return "Trust: **ok**: NaN/inf is a fact of the run, not a call of the rule."
        return f"Trust: **ok**: {TRUST_TEXT['ok'].format(evidence=evidence(v))}"
    values = {
        "functions": ", ".join(v.uncalibrated_functions),
        "threshold": v.threshold,
        "window": v.window,
        "planned": v.planned_window,
        "margin": v.margin,
        "band": INCONCLUSIVE_BAND,
    }
    if "unproven" in v.cautions:
        values["unproven"] = _unproven_text(v)[0].upper() + _unproven_text(v)[1:]
    first, *more = v.cautions
    line = f"Trust: **{first}**" + (f" (also {', '.join(more)})" if more else "")
    line += f": {TRUST_TEXT[first].format(**values)}"
    return line + "".join(f" {c.capitalize()}: {TRUST_TEXT[c].format(**values)}" for c in more)


def _forecast_lines(v: Verdict) -> list[str]:
    """The forecast from the planned passes, beside the decision (:class:`satmon.results.forecast.Forecast`)."""
    if not v.planned_forecast:
        return []
    from satmon.results.forecast import Forecast

    known = {k: v.planned_forecast[k] for k in Forecast.__dataclass_fields__ if k in v.planned_forecast}
    try:
        return ["", Forecast(**known).line()]
    except TypeError:  # a record missing a field: say what it holds rather than fail the card
        outcome, evidence = known.get("outcome", "uncertain"), known.get("evidence", "")
        return ["", f"Forecast from the planned passes: {outcome}: {evidence}"]


def _loss_lines(v: Verdict) -> list[str]:
    if v.loss and v.loss.get("first") == v.loss.get("first"):  # not NaN
        return [
            "",
            f"Training loss over the window: {v.loss['first']:.4f} -> {v.loss['last']:.4f} "
            f"({100 * v.loss['change']:+.1f}%; second half {100 * v.loss['late_change']:+.1f}%)"
            + (": stopped improving" if v.loss.get("stalled") else ""),
        ]
    return []


def _layer_table(v: Verdict) -> list[str]:
    """One row per layer: its saturation over everything counted, then the offset readings (sampled in a window)."""
    if not v.offset:
        counted = "window" if v.source == "window" else "all batches"
        out = ["", f"| layer | saturation ({counted}) |", "|---|---|"]
        return out + [f"| {name} | {frac:.4f} |" for name, frac in v.per_layer.items()]
    if v.source == "window":
        counted, label = "window", "sampled"
        scope = (
            f"sampled on every {v.offset_every}th counted window step"
            if v.offset_every > 1
            else "sampled on every counted window step"
        )
    else:
        counted = label = "all batches"
        scope = "read on every calibration batch"
    out = [
        "",
        f"| layer | saturation ({counted}) | after removing channel means ({label}) | median abs(mean)/spread "
        f"({label}) |",
        "|---|---|---|---|",
    ]
    for name, frac in v.per_layer.items():
        r = v.offset.get(name)
        cells = f"{r['centered']:.4f} | {r['offset_ratio']:.3g}" if r is not None else "- | -"
        out.append(f"| {name} | {frac:.4f} | {cells} |")
    out += [
        "",
        (
            f"Offset columns: {scope}, with the exact product alpha x. After removing channel means: the "
            "saturation "
            "left once each channel's mean over a batch's tokens is subtracted. Median abs(mean)/spread: over "
            "channels, "
            "a channel's abs(mean) over its token-to-token standard deviation; far above 1, each channel sits on "
            "a "
            "constant and its saturation carries little token information (the offset-driven flag)."
        ),
    ]
    return out


def _gating_lines(v: Verdict) -> list[str]:
    if v.gated is None:
        return ["", f"Gated MLP after DyT: unknown ({v.gating_message})"] if v.gating_message else []
    line = f"Gated MLP after DyT: {'yes' if v.gated else 'no'}"
    line += f" ({', '.join(v.gated_layers)})" if v.gated_layers else ""
    if not v.gated:
        return ["", line]
    line += (
        f"; collapse risk: {'YES' if v.collapse_risk else 'no'} (pooled saturation vs {v.rule.collapse_threshold:g})"
    )
    out = ["", line, "", f"Collapse record: {study.COLLAPSE_RECORD} (docs/science/abort_policy.md)."]
    if v.collapse_risk:
        out += ["", f"What changed it: {study.COLLAPSE_REMEDY}."]
    return out


_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]*)`")


def plain(markdown: str) -> str:
    """A satmon card (or any short markdown of headings, bold, code and an italic line) as plain text.

    Headings lose their ``#``, ``**bold**`` and ```code``` their marks, a line in ``_underscores_`` its
    underscores; tables stay (pipes read well in a console).

    Example:
        >>> print(plain("### satmon verdict: **GO** by the study's rule\\n\\nrun `satmon calibrate`\\n\\n_Caveat: x._"))
        satmon verdict: GO by the study's rule
        <BLANKLINE>
        run satmon calibrate
        <BLANKLINE>
        Caveat: x.
    """
    out = []
    for line in markdown.splitlines():
        line = re.sub(r"^#+\s+", "", line)
        if len(line) > 2 and line.startswith("_") and line.endswith("_"):
            line = line[1:-1]
        out.append(_CODE.sub(r"\1", _BOLD.sub(r"\1", line)))
    return "\n".join(out)
