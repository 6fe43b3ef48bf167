"""One reading -> one verdict: what a Reading carries reaches the verdict, and the verdict says how far to trust it.

The trust set (``ok``, ``uncalibrated``, ``flagged``, ``partial``, ``inconclusive``, ``unproven``), its order and
how it combines; the headline's words follow the rule's held-out evidence and never advise in the imperative;
NaN/inf weights read NON-FINITE; whose threshold it is; the console text carries no markdown.
"""

from __future__ import annotations

import pytest

from satmon import Settings, study
from satmon.results.gating import GatedPairing
from satmon.results.reading import Reading, Rule, verdict_of
from satmon.results.verdict import (
    TRUST,
    GatingInfo,
    LayerCounts,
    Verdict,
    build_verdict,
)

#: words no headline may hold: advice in the imperative (satmon 0.3 said "keep it" above a caveat of chance accuracy)
IMPERATIVES = ("keep it", "switch back", "do not rely", "fix that", "go back")
#: a calibration that forecasts: 80% held out where guessing the commoner outcome gets 60%
FORECAST = Rule(0.43, study.COLLAPSE_THRESHOLD, "Caveat: mine.", "calibration", 0.8, 0.6, 50)  # 40/50 vs 0.6: p = 0.002
MEASURED = "a measurement, not a forecast (held-out accuracy 50% vs 67% for guessing the commoner outcome)"
STALLED = {"first": 4.2, "last": 3.14, "change": -0.25, "late_change": -0.003, "stalled": True}
OFFSET = {"a": {"saturated": 0.6, "centered": 0.01, "offset_ratio": 40.0}}


def _reading(sat: int = 60, total: int = 100, **kw) -> Reading:
    fields = {
        "source": "window",
        "step": 10,
        "counts": {"a": LayerCounts(sat, total)},
        "level": 2.0,
        "window": 10,
        "planned_window": 10,
    }
    fields.update(kw)
    return Reading(**fields)


def test_a_reading_carries_everything_the_verdict_shows():
    gating = GatingInfo(
        True,
        ("a",),
        "a feeds a SwiGLU MLP",
        pairings={
            "a": GatedPairing(
                "a", "blocks.0.mlp", "blocks.0.mlp.w1", "blocks.0.mlp.w3", "blocks.0.mlp.w2", False, "silu", "trace"
            )
        },
    )
    r = _reading(
        offset=OFFSET,
        offset_driven=True,
        offset_every=5,
        loss=STALLED,
        gating=gating,
        gate={"a": {"flat_fraction": 0.25, "mean_abs_hidden": 0.5}},
        refused={"b": "alpha reshaped"},
        notes=("resumed at step 4",),
    )
    v = verdict_of(r)
    assert (v.decision, v.saturation, v.elements, v.step, v.window) == ("no-go", 0.6, 100, 10, 10)
    assert v.collapse_risk and v.gated_layers == ("a",)  # 0.6 >= 0.5 in a gated model
    assert v.risk == {"blocks.0.mlp": {"dyt_saturation": 0.6, "flat_fraction": 0.25, "mean_abs_hidden": 0.5}}
    assert v.flags == ("stalled-loss", "offset-driven") and v.offset == OFFSET and v.offset_every == 5
    assert v.notes == ("resumed at step 4", "layer b not counted: alpha reshaped")
    assert v.trust == "flagged" and v.cautions == ("flagged", "unproven")
    # the reading's pooled numbers are the verdict's
    assert r.pooled == v.saturation and r.elements == v.elements and r.per_layer == dict(v.per_layer)


def test_an_offset_reading_without_the_flag_and_a_flag_without_offsets_do_not_flag():
    assert verdict_of(_reading(offset=OFFSET, offset_driven=False)).flags == ()
    assert verdict_of(_reading(offset_driven=True)).flags == ()  # no offset readings: nothing to flag from


@pytest.mark.parametrize("weights", [{"head.weight": 3}, {"head.weight": 1, "head.bias": 2}])
def test_nonfinite_weights_read_nonfinite_whatever_the_saturation(weights):
    v = verdict_of(_reading(sat=90, source="replay", window=0, planned_window=0, nonfinite_weights=weights))
    assert v.decision == "non-finite" and not v.go and v.nonfinite_weights == sum(weights.values()) and v.nonfinite == 0
    assert all(name in v.reason for name in weights) and v.trust == "ok" and v.flags == ()
    assert v.headline().startswith("NON-FINITE: NaN/inf in the weights")
    assert v.card().splitlines()[0].startswith("### satmon verdict: **NON-FINITE**")


def test_the_settings_rule_says_whose_threshold_it_is_from_what_was_given():
    import dataclasses

    assert Settings().rule == Rule(study.THRESHOLD, study.COLLAPSE_THRESHOLD, study.CAVEAT, "study")
    # a threshold given is the user's, even the study's number: the source is never found by comparing numbers
    assert Settings(threshold=study.THRESHOLD).rule.threshold_source == "user"
    assert Settings(threshold=0.5).rule.threshold_source == "user"
    assert Settings(caveat="my own runs").rule.threshold_source == "user"
    mine = Settings(threshold=0.5)
    # dataclasses.replace carries the rule when it leaves the rule alone, and remakes it when it does not
    assert dataclasses.replace(Settings(), window=7).rule.threshold_source == "study"
    assert dataclasses.replace(mine, window=7).rule == mine.rule
    assert dataclasses.replace(Settings(), threshold=0.3).rule == Rule(
        0.3, study.COLLAPSE_THRESHOLD, study.CAVEAT, "user"
    )
    assert dataclasses.replace(mine, collapse_threshold=0.6).rule.collapse_threshold == 0.6
    assert dataclasses.replace(mine, threshold=None).rule.threshold_source == "study"  # back to the study's
    with pytest.raises(TypeError, match="unexpected keyword argument 'rule'"):  # computed, not an option
        Settings(rule=Rule())
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(mine, rule=Rule())
    assert "rule" not in Settings.names()


def test_rule_of_a_calibration_is_the_calibration(tmp_path):
    from satmon.calibrate.fit import Cell, calibrate, write_calibration

    rows = [
        (0.30, False, "a"),
        (0.44, False, "a"),
        (0.46, True, "a"),
        (0.60, True, "b"),
        (0.35, False, "b"),
        (0.70, True, "b"),
    ]
    cal = write_calibration(
        calibrate([Cell(f"c{i}", g, h, {"saturation": s}) for i, (s, h, g) in enumerate(rows)], source="mine"),
        tmp_path / "calibration.json",
    )
    rule = Settings(calibration=cal).rule
    assert rule.threshold_source == "calibration" and rule.threshold == pytest.approx(cal.threshold)
    v = verdict_of(_reading(counts={"a": LayerCounts(60, 100)}, functions={"a": "erf"}), rule)
    assert v.rule is rule and "uncalibrated" not in v.cautions  # calibrated on the user's runs
    assert f"by your calibration's threshold {cal.threshold:g}" in v.headline()
    # its own held-out evidence, from the file: leave-one-group-out against guessing the commoner outcome (3 of 6)
    assert v.rule.evidence() == (cal.loso_accuracy, 0.5, 6) == (rule.held_out_accuracy, rule.no_skill_accuracy, 6)
    # 5 of 6 right against 3 of 6: p = 7/64 = 0.11 by the one-sided exact binomial test, so no forecast
    assert round(cal.loso_accuracy * 6) == 5
    assert not v.forecast and v.trust == "unproven" and "5 of 6 cells right, p = 0.11" in v.card()


@pytest.mark.parametrize("function", ["erf", "hardtanh"])
def test_a_function_the_study_did_not_calibrate_says_so_unless_the_user_gave_a_threshold(function):
    r = _reading(source="probe", window=0, planned_window=0, functions={"a": function})
    v = verdict_of(r)
    assert v.decision == "go" and v.trust == "uncalibrated" and v.functions == (function,)
    assert v.headline() == f"GO by the study's rule, no calibrated threshold for {function}: {MEASURED}"
    assert "satmon calibrate" in v.card() and not any(w in v.card() for w in IMPERATIVES)
    mine = verdict_of(r, Settings(threshold=0.55).rule)
    # a bare threshold of the user's is no calibration either: no evidence, a measurement
    assert mine.trust == "unproven" and mine.cautions == ("unproven",) and mine.rule.evidence() == (None, None, None)
    assert mine.headline() == (
        "GO by your threshold 0.55: a measurement, not a forecast (no held-out accuracy: a threshold "
        "given without calibration)"
    )


def test_dyt_with_the_study_threshold_is_calibrated_but_unproven():
    v = verdict_of(_reading(functions={"a": "tanh"}))
    # the study's 0.43 scored 6/12 held out (leave-one-scale-out), below 8/12 for always NO-GO: no trust "ok"
    assert v.trust == "unproven" and v.cautions == ("unproven",) and not v.forecast
    assert v.rule.evidence()[:2] == (study.HELD_OUT_ACCURACY, study.NO_SKILL_ACCURACY) == (0.5, 8 / 12)
    assert v.headline() == f"GO by the study's rule: {MEASURED}"
    assert (
        "Trust: **unproven**: The 0.43 rule was right on 9 of the study's 12 cells in-sample and on 50% of them"
        in v.card()
    )
    assert v.rule.evidence()[2] == study.HELD_OUT_CELLS == 12


@pytest.mark.parametrize(
    ("sat", "word", "meaning"),
    [
        (60, "GO", "DyT's final loss expected below LayerNorm's"),
        (10, "NO-GO", "DyT's final loss expected above LayerNorm's"),
    ],
)
def test_a_calibration_that_beats_guessing_reads_as_a_forecast_with_trust_ok(sat, word, meaning):
    v = verdict_of(_reading(sat=sat), FORECAST)
    assert v.forecast and v.trust == "ok" and v.cautions == ()
    assert v.headline() == (
        f"{word} by your calibration's threshold 0.43: a forecast, {meaning} "
        "(held-out accuracy 80% vs 60% for guessing the commoner outcome)"
    )
    assert "Trust: **ok**: the rule forecasts on held-out cells (held-out accuracy 80%" in v.card()
    # qualified, it is still no reliable forecast; at or below the baseline, no forecast at all
    assert verdict_of(_reading(sat=sat, window=3, planned_window=10), FORECAST).headline().split(": ")[1] == (
        "not a reliable forecast (held-out accuracy 80% vs 60% for guessing the commoner outcome)"
    )
    level = Rule(0.43, study.COLLAPSE_THRESHOLD, "Caveat: mine.", "calibration", 0.6, 0.6, 50)
    assert verdict_of(_reading(sat=sat), level).trust == "unproven"
    # the same 80% against 60% on 10 cells is 8/10: p = 0.17, no forecast; without a cell count, no test, no forecast
    few = Rule(0.43, study.COLLAPSE_THRESHOLD, "Caveat: mine.", "calibration", 0.8, 0.6, 10)
    assert (
        verdict_of(_reading(sat=sat), few).trust == "unproven"
        and "8 of 10 cells right, p = 0.17" in verdict_of(_reading(sat=sat), few).card()
    )
    uncounted = Rule(0.43, study.COLLAPSE_THRESHOLD, "Caveat: mine.", "calibration", 0.8, 0.6)
    assert verdict_of(_reading(sat=sat), uncounted).trust == "unproven"


def test_no_headline_advises_in_the_imperative():
    gating = GatingInfo(True, ("a",), "a feeds a SwiGLU MLP")
    readings = [
        _reading(sat=s, **kw)
        for s in (10, 44, 60)
        for kw in ({}, {"window": 3}, {"loss": STALLED}, {"gating": gating}, {"functions": {"a": "erf"}})
    ]
    readings.append(_reading(nonfinite_weights={"w": 1}))
    for r in readings:
        for rule in (Rule(), FORECAST, Settings(threshold=0.3).rule):
            v = verdict_of(r, rule)
            for text in (v.headline(), v.summary(), v.card().splitlines()[0]):
                assert not any(w in text.lower() for w in IMPERATIVES), text


def test_cautions_combine_most_serious_first_and_trust_names_the_first():
    # 44.5% over 3 of 10 steps, stalled loss and offsets, erf under the study's threshold: everything at once
    v = verdict_of(
        _reading(
            sat=445,
            total=1000,
            window=3,
            planned_window=10,
            loss=STALLED,
            offset=OFFSET,
            offset_driven=True,
            functions={"a": "erf"},
        )
    )
    assert v.trust == "uncalibrated"
    assert list(v.cautions) == [t for t in TRUST if t in v.cautions]
    assert v.cautions == ("uncalibrated", "flagged", "partial", "inconclusive", "unproven")
    assert v.headline() == (
        "GO by the study's rule, no calibrated threshold for erf, flagged (stalled-loss, offset-driven), "
        f"partial window (3 of 10 steps), inconclusive (margin +0.0150): {MEASURED}"
    )
    card = v.card()
    assert "Trust: **uncalibrated** (also flagged, partial, inconclusive, unproven)" in card
    assert "Partial: training ended after 3 of the 10 window steps" in card


@pytest.mark.parametrize(
    ("kw", "trust", "words"),
    [
        ({"window": 3, "planned_window": 10}, "partial", "partial window (3 of 10 steps)"),
        ({"loss": STALLED}, "flagged", "flagged (stalled-loss)"),
        ({"offset": OFFSET, "offset_driven": True}, "flagged", "flagged (offset-driven)"),
    ],
)
def test_a_go_undercut_by_a_flag_or_a_short_window_says_so_first(kw, trust, words):
    v = verdict_of(_reading(**kw))
    assert v.decision == "go" and v.trust == trust  # the decision keeps the study's rule: scripts keep their contract
    assert v.headline() == f"GO by the study's rule, {words}: {MEASURED}"
    assert f"(trust: {trust}" in v.summary()
    for text in (v.card(), v.text()):
        assert words in text.splitlines()[0] and not any(w in text.splitlines()[0] for w in IMPERATIVES)


def test_a_partial_no_go_is_not_a_confident_switch_back_either():
    v = verdict_of(_reading(sat=10, window=3, planned_window=10))
    assert (
        v.decision == "no-go"
        and v.trust == "partial"
        and "switch back" not in v.headline()
        and "forecast" in v.headline()
    )


def test_the_console_gets_plain_text_and_the_card_markdown():
    v = verdict_of(_reading(offset=OFFSET, offset_driven=True, offset_every=10))
    card, text = v.card(), v.text()
    assert card.startswith("### satmon verdict: **GO** by the study's rule, flagged (offset-driven)")
    assert text.startswith("satmon verdict: GO by the study's rule, flagged (offset-driven)")
    assert "###" not in text and "**" not in text and "`" not in text and "\n_" not in text
    assert len(card.splitlines()) == len(text.splitlines())  # the same lines, rendered twice
    assert v.summary() == (
        "satmon verdict: GO by the study's rule (trust: flagged: offset-driven), saturation 0.6000 >= "
        "threshold 0.43 (margin +0.1700, window 10 steps)"
    )
    assert v.summary(["tb/version_0", "csv/satmon_verdict.md"]).endswith("; card: tb/version_0, csv/satmon_verdict.md")
    assert v.summary([]).endswith("; card: not written anywhere (no logger, no logdir)")


def test_the_card_puts_headline_numbers_trust_flags_and_caveat_before_one_table():
    v = verdict_of(
        _reading(offset=OFFSET, offset_driven=True, offset_every=10, counts={"a": (60, 100), "b": (30, 100)})
    )
    lines = v.card().splitlines()
    table = [i for i, l in enumerate(lines) if l.startswith("| layer |")]
    assert len(table) == 1  # one per-layer table (0.2 had two, with different numbers for one layer)
    first_table = table[0]
    for marker in ("Pooled saturation", "Trust:", "Reason:", "**Flag: offset-driven**", "_Caveat:"):
        assert next(i for i, l in enumerate(lines) if l.startswith(marker)) < first_table, marker
    assert "(sampled)" in lines[first_table] and "saturation (window)" in lines[first_table]
    assert "| a | 0.6000 | 0.0100 | 40 |" in lines and "| b | 0.3000 | - | - |" in lines  # b had no sampled step
    explained = [l for l in lines if l.startswith("Offset columns:")]
    assert len(explained) == 1 and "every 10th counted window step" in explained[0] and "abs(mean)" in explained[0]


def test_a_probe_labels_its_offset_columns_as_every_batch():
    v = verdict_of(_reading(source="replay", window=0, planned_window=0, offset=OFFSET, offset_driven=True))
    header = next(l for l in v.card().splitlines() if l.startswith("| layer |"))
    assert "(all batches)" in header and "sampled" not in header
    assert "read on every calibration batch" in v.card()


def _flat(v: Verdict) -> dict:
    """The verdict as satmon 0.4 wrote it: the rule's seven fields at the top, with the evidence in force."""
    held_out, no_skill, cells = v.rule.evidence()
    flat = {k: x for k, x in v.to_dict().items() if k != "rule"}
    return {
        **flat,
        "threshold": v.rule.threshold,
        "collapse_threshold": v.rule.collapse_threshold,
        "caveat": v.rule.caveat,
        "threshold_source": v.rule.threshold_source,
        "held_out_accuracy": held_out,
        "no_skill_accuracy": no_skill,
        "held_out_cells": cells,
    }


def test_a_verdict_of_satmon_0_2_reads_back_with_its_trust():
    old = _flat(build_verdict({"a": (45, 100)}, step=3, window=3, planned_window=10))
    for key in (
        "trust",
        "cautions",
        "functions",
        "threshold_source",
        "nonfinite_weights",
        "offset_every",
        "held_out_accuracy",
        "no_skill_accuracy",
    ):
        old.pop(key)
    again = Verdict.from_dict(old)
    assert again.trust == "partial" and again.cautions == ("partial", "unproven")


@pytest.mark.parametrize(
    ("source", "trust"), [("study", "unproven"), ("user", "unproven"), ("calibration", "unproven")]
)
def test_a_verdict_of_satmon_0_3_with_trust_ok_loads_and_reads_by_todays_evidence(source, trust):
    old = _flat(
        build_verdict(
            {"a": (45, 100)}, Rule(0.3 if source != "study" else 0.43, threshold_source=source), step=500, window=500
        )
    )
    for key in ("held_out_accuracy", "no_skill_accuracy"):
        old.pop(key)
    old.update(trust="ok", cautions=[])  # what 0.3 saved: "ok" under a rule at chance
    again = Verdict.from_dict(old)
    assert again.decision == "go" and again.trust == trust and "ok" not in again.cautions
    assert again.rule.evidence()[0] == (study.HELD_OUT_ACCURACY if source == "study" else None)
    assert "forecast" in again.headline() and Verdict.from_dict(again.to_dict()) == again


def test_a_bad_threshold_source_is_refused():
    with pytest.raises(
        ValueError, match=r"Expected `threshold_source` in \('study', 'user', 'calibration'\), got 'mine'"
    ):
        build_verdict({"a": (1, 2)}, Rule(0.5, threshold_source="mine"), step=1)
