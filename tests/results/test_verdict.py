"""The GO/NO-GO rule: a model tuned just above and just below 0.43, the card, bad inputs."""

import dataclasses
import math

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import tiny_lit, token_loader, trainer
from satmon import DyT, SaturationMonitor
from satmon._compat import SatmonDeprecationWarning
from satmon.results.rule import Decision, Rule
from satmon.results.verdict import Verdict, build_verdict


class Tuned(pl.LightningModule):
    """One DyT over inputs |x| = 0.005, 0.015, ..., 0.995: exactly the share above 2/alpha saturates."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.norm = DyT(100, alpha_init=alpha)
        self.head = nn.Linear(100, 1)

    def training_step(self, batch, batch_idx):
        return self.head(self.norm(batch[0])).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)  # alpha stays where it was put


def tuned_loader():
    x = (torch.arange(100, dtype=torch.float32) + 0.5) / 100
    signs = torch.where(torch.arange(100) % 2 == 0, 1.0, -1.0)
    return DataLoader(TensorDataset((x * signs).repeat(8, 1)), batch_size=4)


@pytest.mark.parametrize(("cut", "expected_sat", "decision"), [(0.56, 0.44, "go"), (0.58, 0.42, "no-go")])
def test_decision_flips_at_threshold(tmp_path, cut, expected_sat, decision):
    monitor = SaturationMonitor(window=2, verbose=False)
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(Tuned(alpha=2.0 / cut), tuned_loader())
    v = monitor.verdict
    assert v.saturation == pytest.approx(expected_sat, abs=1e-12)
    assert v.decision == decision and v.margin == pytest.approx(expected_sat - 0.43, abs=1e-12)
    assert v.per_layer == {"norm": pytest.approx(expected_sat, abs=1e-12)} and v.step == 2 and v.window == 2


def test_user_threshold_changes_the_call(tmp_path):
    monitor = SaturationMonitor(window=2, threshold=0.45, verbose=False)
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(Tuned(alpha=2.0 / 0.56), tuned_loader())
    assert monitor.verdict.decision == "no-go" and monitor.verdict.threshold == 0.45


def test_calibration_file_sets_the_threshold_and_the_caveat(tmp_path):
    from satmon.calibrate.fit import Cell, calibrate, write_calibration

    # cells whose midpoint rule lands at 0.45 (0.44 hurt, 0.46 helped): the tuned model's 0.44 reads NO-GO there
    rows = [
        (0.30, False, "a"),
        (0.44, False, "a"),
        (0.46, True, "a"),
        (0.60, True, "b"),
        (0.35, False, "b"),
        (0.70, True, "b"),
    ]
    cells = [Cell(f"c{i}", g, helps, {"saturation": s}) for i, (s, helps, g) in enumerate(rows)]
    path = tmp_path / "calibration.json"
    cal = write_calibration(calibrate(cells, source="mine"), path)
    assert cal.threshold == pytest.approx(0.45)
    monitor = SaturationMonitor(window=2, calibration=str(path), verbose=False)
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(Tuned(alpha=2.0 / 0.56), tuned_loader())
    v = monitor.verdict
    assert v.threshold == pytest.approx(0.45) and v.decision == "no-go" and v.saturation == pytest.approx(0.44)
    assert v.rule.caveat == cal.caveat() and "satmon calibrate" in v.card() and "12 cells" not in v.card()
    with pytest.raises(ValueError, match="either `threshold` or `calibration`"):
        SaturationMonitor(threshold=0.5, calibration=str(path))


def test_card_shows_decision_threshold_window_table_and_one_line_caveat():
    v = build_verdict({"a": (1, 4), "b": (3, 4)}, Rule(), step=500, window=500)
    card = v.card()
    assert "**GO**" in card and "0.43" in card and "500" in card
    assert "| a | 0.2500 |" in card and "| b | 0.7500 |" in card
    caveat = [l for l in card.splitlines() if "Caveat" in l]
    assert len(caveat) == 1 and "12 cells" in caveat[0] and "75%" in caveat[0] and "alpha_init 2.0" in caveat[0]
    assert build_verdict({"a": (44, 100)}, step=1, window=1).inconclusive
    assert not build_verdict({"a": (60, 100)}, step=1, window=1).inconclusive


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 0}, "Expected `window` to be a positive int"),
        ({"window": -3}, "Expected `window`"),
        ({"threshold": 0.0}, r"Expected `threshold` in \(0, 1\)"),
        ({"threshold": 1.0}, r"Expected `threshold` in \(0, 1\)"),
        ({"level": 0}, "Expected `level` > 0"),
        ({"level": float("nan")}, "Expected `level` > 0"),
        ({"abort_on": "sometimes"}, "Expected `abort_on` in"),
        ({"abort_mode": "explode"}, "Expected `abort_mode` in"),
        ({"sample_every": 0}, "Expected `sample_every`"),
    ],
)
def test_bad_arguments_fail_in_init(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SaturationMonitor(**kwargs)


def test_model_without_dyt_errors_at_setup_when_asked(tmp_path):
    model = tiny_lit(norm="layernorm")
    with pytest.raises(ValueError, match=r"no DyT layer.*found 5 LayerNorm/RMSNorm.*convert_to_dyt.*include="):
        trainer(tmp_path, max_steps=1, callbacks=[SaturationMonitor(window=1, on_missing="raise")]).fit(
            model, token_loader(2)
        )


def test_model_without_dyt_trains_by_default_and_says_why(tmp_path):
    # adding a monitor must never be what stops training: no screen, a warning and a card say so
    monitor = SaturationMonitor(window=1)
    t = trainer(tmp_path, max_steps=2, callbacks=[monitor])
    with pytest.warns(UserWarning, match=r"no DyT layer.*screen is off.*found 5 LayerNorm/RMSNorm"):
        t.fit(tiny_lit(norm="layernorm"), token_loader(2))
    assert t.global_step == 2 and monitor.verdict is None and "screen is off" in monitor.screen.status


class Poisoned(Tuned):
    def training_step(self, batch, batch_idx):
        x = batch[0].clone()
        if batch_idx == 1:
            x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
        return self.head(self.norm(x)).nan_to_num().mean()


def test_nonfinite_activations_are_counted_and_reported(tmp_path):
    monitor = SaturationMonitor(window=2, verbose=False)
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(Poisoned(alpha=2.0 / 0.56), tuned_loader())
    v = monitor.verdict
    # one poisoned forward, and its NaN gradient made alpha NaN (SGD with lr=0 still computes 0 * NaN = NaN)
    assert v.nonfinite == 2 and "2 DyT layer input(s) or alpha(s) held non-finite values" in v.card()
    assert math.isnan(monitor.screen.hooks.alphas()[0].item())
    # a diverged run is neither GO nor NO-GO (0.1 said NO-GO: "switch back to LayerNorm")
    assert v.decision == "non-finite" and not v.go and "NON-FINITE" in v.card().splitlines()[0]
    # inf counts as saturated (|alpha * inf| > 2), nan does not: 44 of 100 per row, row 0 of batch 1 changed
    expected = (8 * 44 - 0 + 2 - sum(1 for i in range(3) if (i + 0.5) / 100 > 0.56)) / 800
    assert v.saturation == pytest.approx(expected, abs=1e-12)


def test_flags_qualify_a_high_saturation_and_never_change_the_decision():
    from satmon.results.verdict import LayerCounts, build_verdict

    stalled = {"first": 4.2, "last": 3.14, "change": -0.25, "late_change": -0.003, "stalled": True}
    high = build_verdict({"a": LayerCounts(60, 100)}, step=9, window=9, loss=stalled, offset_flag=True)
    low = build_verdict({"a": LayerCounts(10, 100)}, step=9, window=9, loss=stalled, offset_flag=True)
    assert high.decision == "go" and high.flags == ("stalled-loss", "offset-driven")
    assert low.decision == "no-go" and low.flags == ()  # below the threshold the advice is NO-GO either way
    assert "flagged (stalled-loss, offset-driven): a measurement, not a forecast" in high.headline()
    assert "(trust: flagged: stalled-loss, offset-driven)" in high.summary()
    assert "Flag: offset-driven" in high.card() and high.trust == "flagged" and low.trust == "unproven"


def test_a_threshold_given_is_never_read_as_the_studys_and_a_study_rule_holds_only_its_own():
    """A threshold of the caller's never borrows the study's cells or its held-out record, whatever its value."""
    from satmon import Settings, study

    mine = build_verdict({"a": (50, 100)}, Settings(threshold=0.5).rule, step=1, window=1)
    assert mine.rule.threshold_source == "user" and mine.rule.evidence() == (None, None, None)
    assert "not this threshold" in mine.reason and study.ON_SIDE["go"] not in mine.reason
    same = build_verdict({"a": (50, 100)}, Settings(threshold=study.THRESHOLD).rule, step=1, window=1)  # still given
    assert same.rule.threshold_source == "user" and same.rule.evidence() == (None, None, None)
    theirs = build_verdict({"a": (50, 100)}, step=1, window=1)
    assert theirs.rule == Rule() and theirs.rule.evidence()[0] == study.HELD_OUT_ACCURACY
    with pytest.raises(ValueError, match=r"Expected the study's threshold 0.43 with threshold_source='study', got 0.5"):
        Rule(threshold=0.5)
    with pytest.raises(ValueError, match="got both"):
        build_verdict({"a": (50, 100)}, Rule(), step=1, threshold=0.5)


def test_build_verdict_takes_one_rule_and_the_loose_rule_arguments_are_deprecated():
    """satmon 0.4's seven loose rule arguments still build the same verdict, with a warning that says to build a
    Rule."""
    rule = Rule(0.3, 0.6, "Caveat: mine.", "user")
    counts = {"a": (45, 100)}
    with pytest.warns(
        SatmonDeprecationWarning,
        match=r"build_verdict\(threshold=, collapse_threshold=, caveat=\) is deprecated.*"
        r"build_verdict\(counts, Rule\(threshold=\.\.\., threshold_source='user'\)",
    ):
        old = build_verdict(counts, step=9, window=9, threshold=0.3, collapse_threshold=0.6, caveat="Caveat: mine.")
    assert old == build_verdict(counts, rule, step=9, window=9) and old.rule == rule
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        build_verdict(counts, step=9, treshold=0.3)
    with pytest.raises(TypeError, match="Expected `rule` to be a satmon.results.rule.Rule"):
        build_verdict(counts, 0.3, step=9)


def test_the_verdict_holds_the_rule_whole_and_its_old_flat_fields_are_deprecated():
    v = build_verdict({"a": (45, 100)}, Rule(0.5, threshold_source="user"), step=9, window=9)
    assert v.to_dict()["rule"] == {
        "threshold": 0.5,
        "collapse_threshold": 0.5,
        "caveat": v.rule.caveat,
        "threshold_source": "user",
        "held_out_accuracy": None,
        "no_skill_accuracy": None,
        "held_out_cells": None,
    }
    assert not {"threshold", "caveat", "threshold_source", "held_out_accuracy"} & set(v.to_dict())  # said once, nested
    assert v.threshold == 0.5 and v.margin == pytest.approx(-0.05)
    for old, new in [
        ("caveat", v.rule.caveat),
        ("threshold_source", "user"),
        ("collapse_threshold", 0.5),
        ("held_out_accuracy", None),
        ("no_skill_accuracy", None),
        ("held_out_cells", None),
    ]:
        with pytest.warns(
            SatmonDeprecationWarning, match=rf"Verdict.{old} is deprecated since satmon 0.5: use Verdict.rule"
        ):
            assert getattr(v, old) == new


def test_the_decision_is_an_enum_that_reads_as_the_strings_it_was():
    import json

    v = build_verdict({"a": (20, 100)}, step=9, window=9)
    assert v.decision is Decision.NO_GO and v.decision == "no-go" and not v.go
    assert json.dumps(v.to_dict()["decision"]) == '"no-go"'
    assert type(v.to_dict()["decision"]) is str  # torch.load(weights_only=True) loads it
    assert f"{v.decision}" == str(v.decision) == "no-go" and repr(v.decision) == "'no-go'"
    assert Verdict.from_dict(v.to_dict()).decision is Decision.NO_GO


@pytest.mark.parametrize("name", ["study_window", "user_probe", "calibration_replay", "nonfinite_partial"])
def test_a_flat_verdict_written_by_satmon_0_4_loads_with_its_rule_nested(name):
    """data/verdicts_satmon_0_4.json was written by satmon 0.4's build_verdict(...).to_dict() (commit c5837f7): the
    rule's seven fields at the top. Each loads into the verdict today's build_verdict makes from the same counts and
    Rule."""
    import json
    from pathlib import Path

    flat = json.loads((Path(__file__).parent / "data" / "verdicts_satmon_0_4.json").read_text())[name]
    rules = {
        "study_window": Rule(),
        "user_probe": Rule(0.3, caveat="Caveat: my own threshold.", threshold_source="user"),
        "calibration_replay": Rule(
            0.45,
            caveat="Caveat: threshold 0.45 fit by satmon calibrate.",
            threshold_source="calibration",
            held_out_accuracy=11 / 12,
            no_skill_accuracy=7 / 12,
            held_out_cells=12,
        ),
        "nonfinite_partial": Rule(collapse_threshold=0.6),
    }
    counts = {
        "study_window": ({"blocks.0.ln_1": (60, 100), "ln_f": (20, 100)}, dict(step=500, window=500)),
        "user_probe": ({"ln_f": (45, 100)}, dict(step=9, source="probe")),
        "calibration_replay": ({"ln_f": (5, 10)}, dict(step=9, source="replay")),
        "nonfinite_partial": ({"ln_f": (5, 10, 2)}, dict(step=3, window=3, planned_window=10)),
    }[name]
    loaded = Verdict.from_dict(flat)
    # the study's caveat is words of the release that wrote it (they name where the evidence is): a 0.4 verdict keeps
    # its own; every other field of the rule is today's
    rule = dataclasses.replace(rules[name], caveat=flat["caveat"])
    assert loaded.rule == rule
    assert loaded == build_verdict(counts[0], rule, **counts[1])
    assert (loaded.decision, loaded.trust) == (flat["decision"], flat["trust"])
    assert loaded.cautions == tuple(flat["cautions"])
    assert Verdict.from_dict(loaded.to_dict()) == loaded  # and written again nested
