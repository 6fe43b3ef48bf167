"""satmon.io.tensorboard: the tag table, the reading -> tag maps, and what lands in the event files.

Each test writes through both TensorBoard sinks (``SummaryWriterSink``, and ``LightningSink`` over a
real ``TensorBoardLogger``: satmon 0.2's writer) and reads the files back with TensorBoard's own
``EventAccumulator`` (conftest ``tb``), checking every value and step. Expected values are written
out by hand from counts with a known answer; TensorBoard stores float32, so they are rounded to
float32 and compared exactly.
"""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from satmon.io.lightning import LightningSink
from satmon.io.tags import TAG
from satmon.io.tensorboard import (
    SummaryWriterSink,
    add_layout,
    log_scalars,
    log_verdict,
    probe_scalars,
    watch_scalars,
    window_scalars,
)
from satmon.results.stop import StopReason
from satmon.results.verdict import GatingInfo, build_verdict

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["blocks.0.ln_1", "ln_f"]


def _f32(x: float) -> float:
    return float(np.float32(x))


class Run(NS):
    """A sink writing the run ``log_dir``; ``finish()`` closes what was opened."""


def _run(kind: str, root: Path) -> Run:
    if kind == "summary_writer":
        sink = SummaryWriterSink(root / "tb" / "version_0")
        return Run(sink=sink, log_dir=sink.log_dir, finish=sink.close)
    logger = TensorBoardLogger(str(root), name="tb", version=0, default_hp_metric=False)
    sink = LightningSink([logger])
    return Run(sink=sink, log_dir=logger.log_dir, finish=lambda: (sink.close(), logger.finalize("success")))


SINKS = ["summary_writer", "lightning"]


def test_every_tag_literal_is_in_the_tag_table():
    """No string literal that starts a satmon tag outside io/tags.py (comments do not count): 0.3's
    groups (``Satmon/``, ``satmon/``, ``satmon_<family>/``), the hparams sub-run, or 0.2's ``satmon/...``."""
    groups = "|".join(re.escape(g) for g in (TAG.summary, "satmon", *TAG.families))
    tag = re.compile(rf"""^[rbfRBF]*['"]{{1,3}}(({groups})/|{TAG.hparams_run})""")
    assert tag.match('"satmon_alpha/x"') and tag.match("f'Satmon/{x}'") and not tag.match('"satmon_logs"')
    found = []
    for path in sorted((ROOT / "satmon").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() == "satmon/io/tags.py":
            continue
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.STRING and tag.match(tok.string):
                found.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {tok.string}")
    assert found == [], "tags belong in satmon.io.tags.TAG:\n" + "\n".join(found)


@pytest.mark.parametrize("kind", SINKS)
def test_window_scalars_round_trip(kind, tmp_path, tb):
    run = _run(kind, tmp_path)
    readings = {
        2: (0.25, {"blocks.0.ln_1": 0.0, "ln_f": 0.5}, {"blocks.0.ln_1": 1.5, "ln_f": 2.25}, 0),
        4: (0.375, {"blocks.0.ln_1": 0.125, "ln_f": 0.625}, {"blocks.0.ln_1": 1.25, "ln_f": 2.5}, 3),
    }
    for step, r in readings.items():
        log_scalars(run.sink, window_scalars(*r), step)
    run.finish()
    ea = tb.accumulate(run.log_dir)
    expected = {
        "Satmon/saturation": [(2, 0.25), (4, 0.375)],
        "Satmon/nonfinite": [(2, 0.0), (4, 3.0)],
        "satmon_saturation/blocks.0.ln_1": [(2, 0.0), (4, 0.125)],
        "satmon_saturation/ln_f": [(2, 0.5), (4, 0.625)],
        "satmon_alpha/blocks.0.ln_1": [(2, 1.5), (4, 1.25)],
        "satmon_alpha/ln_f": [(2, 2.25), (4, 2.5)],
    }
    assert {t: tb.scalars(ea, t) for t in tb.scalar_tags(ea)} == expected  # values chosen exact in float32


def test_watch_scalars_tags_and_values():
    got = watch_scalars(
        2,
        0.625,
        {"blocks.0.mlp": {"flat_fraction": 0.25, "mean_abs_hidden": 1.5}},
        7.5,
        {StopReason.COLLAPSE_RISK: True, StopReason.NONFINITE: True, StopReason.LOSS_SPIKE: False},
    )
    assert got == {
        "satmon_collapse/nonfinite": 2.0,
        "satmon_collapse/saturation": 0.625,
        "satmon_collapse/flat_fraction/blocks.0.mlp": 0.25,
        "satmon_collapse/mean_abs_hidden/blocks.0.mlp": 1.5,
        "satmon_collapse/loss_z": 7.5,
        "satmon_collapse/breach/collapse-risk": 1.0,
        "satmon_collapse/breach/nonfinite": 1.0,
        "satmon_collapse/breach/loss-spike": 0.0,
    }
    assert all(type(v) is float for v in got.values())
    # no gated MLP and no loss reading yet: those tags are left out, not written as 0
    assert watch_scalars(0, None, None, None, {"nonfinite": False}) == {
        "satmon_collapse/nonfinite": 0.0,
        "satmon_collapse/breach/nonfinite": 0.0,
    }


def _report(saturation=0.5, min_ratio=0.25, valid=True):
    gap = NS(depth_deepening=0.125)
    return NS(
        saturation=saturation,
        layers={
            "h.0.ln": NS(kind="layernorm", alignment=0.875, null_dim=1, null_projection=float("nan"), init_gap=gap),
            "h.1.dyt": NS(kind="dyt", saturation=0.5, alpha=np.float32(2.0), init_gap=None),
            "h.2.dyt": NS(kind="dyt", saturation=None, alpha=1.0, init_gap=None),  # counted no element
            "h.3.rms": NS(kind="rmsnorm", alignment=None, init_gap=None),  # no kernel reading
        },
        sigma_min=NS(valid=valid, blocks=["h.0", "h.1", "h.2"], ratios=[None, 0.5, 0.25], min_ratio=min_ratio),
    )


def test_probe_scalars_maps_each_reading_and_drops_missing_and_nonfinite():
    # the NaN null_projection is left out: TensorBoard would draw a gap
    assert probe_scalars(_report()) == {
        "Satmon/saturation": 0.5,
        "satmon_deadir/h.0.ln/alignment": 0.875,
        "satmon_deadir/h.0.ln/null_dim": 1.0,
        "satmon_init_gap/h.0.ln": 0.125,
        "satmon_saturation/h.1.dyt": 0.5,
        "satmon_alpha/h.1.dyt": 2.0,
        "satmon_sigma_min/ratio/h.1": 0.5,
        "satmon_sigma_min/ratio/h.2": 0.25,
        "satmon_sigma_min/min_ratio": 0.25,
    }
    no_dyt = probe_scalars(_report(valid=False), saturation=False)  # the live window writes saturation itself
    assert no_dyt == {
        "satmon_deadir/h.0.ln/alignment": 0.875,
        "satmon_deadir/h.0.ln/null_dim": 1.0,
        "satmon_init_gap/h.0.ln": 0.125,
    }


VERDICTS = {  # decision -> (counts, the satmon/verdict scalar): 3 of 4 saturated >= 0.43; 1 of 4 < 0.43; a NaN input
    "go": ({"blocks.0.ln_1": (2, 2), "ln_f": (1, 2)}, 1.0),
    "no-go": ({"blocks.0.ln_1": (0, 2), "ln_f": (1, 2)}, 0.0),
    "non-finite": ({"blocks.0.ln_1": (2, 2), "ln_f": (1, 2, 1)}, -1.0),
}


@pytest.mark.parametrize("kind", SINKS)
@pytest.mark.parametrize("decision", list(VERDICTS))
def test_log_verdict_scalars_card_and_hparams(decision, kind, tmp_path, tb):
    counts, value = VERDICTS[decision]
    verdict = build_verdict(counts, step=9, window=9, notes=("window restarted at step 3 after a resume",))
    assert verdict.decision == decision
    run = _run(kind, tmp_path)
    log_verdict(run.sink, verdict)
    run.finish()
    pooled = sum(c[0] for c in counts.values()) / 4
    ea = tb.accumulate(run.log_dir)
    # not gated: no risk tag
    assert set(tb.scalar_tags(ea)) == {
        "Satmon/decision",
        "Satmon/margin",
        "Satmon/saturation",
    }
    assert tb.scalars(ea, "Satmon/decision") == [(9, value)]
    described = ea.SummaryMetadata("Satmon/decision").summary_description  # the chart's description: decision and trust
    assert described.startswith(
        {
            "go": "GO by the study's rule at step 9, trust: unproven (a measurement, not a forecast;",
            "no-go": "NO-GO by the study's rule at step 9, trust: unproven (a measurement, not a forecast;",
            "non-finite": "NON-FINITE at step 9: the run diverged.",
        }[decision]
    )
    assert tb.scalars(ea, "Satmon/margin") == [(9, _f32(pooled - 0.43))]
    assert tb.scalars(ea, "Satmon/saturation") == [(9, _f32(pooled))]
    [(step, card)] = tb.text(ea, "satmon/verdict")
    assert step == 9 and card == verdict.card()
    assert "Note: window restarted at step 3 after a resume" in card
    assert ("**NON-FINITE**" in card.splitlines()[0]) == (decision == "non-finite")

    [session] = tb.hparams_sessions(tmp_path)
    assert session["run"] == "tb/version_0"  # in the run itself: one run per run
    assert session["hparams"] == {
        "satmon/decision": ("string_value", decision),
        "satmon/trust": ("string_value", verdict.trust),
        "satmon/source": ("string_value", "window"),
        "satmon/window": ("number_value", 9.0),
        "satmon/threshold": ("number_value", 0.43),
        "satmon/level": ("number_value", 2.0),
        "satmon/partial": ("number_value", 0.0),
    }
    assert session["domains"] == {
        "satmon/decision": ["go", "no-go", "non-finite"],
        "satmon/source": ["window", "probe", "replay"],
        "satmon/trust": ["ok", "uncalibrated", "flagged", "partial", "inconclusive", "unproven"],
    }
    assert sorted(session["metrics"]) == ["Satmon/decision", "Satmon/margin", "Satmon/saturation"]


@pytest.mark.parametrize("kind", SINKS)
def test_log_verdict_partial_gated_probe(kind, tmp_path, tb):
    """A gated model saturating past 0.5 is a collapse risk (scalar 1); a probe's source and a
    cut window reach the hparams."""
    gating = GatingInfo(True, ("ln_f",), "ln_f feeds a SwiGLU MLP")
    probe = build_verdict({"ln_f": (3, 4)}, step=5, source="probe", gating=gating)
    cut = build_verdict({"ln_f": (1, 4)}, step=12, window=3, planned_window=9, gating=gating)
    for name, verdict in (("probe", probe), ("cut", cut)):
        run = _run(kind, tmp_path / name)
        log_verdict(run.sink, verdict)
        run.finish()
    ea = tb.accumulate(tmp_path / "probe" / "tb" / "version_0")
    assert tb.scalars(ea, "Satmon/decision") == [(5, 0.0)] and tb.scalars(ea, "satmon_collapse/risk") == [(5, 1.0)]
    assert tb.scalars(tb.accumulate(tmp_path / "cut" / "tb" / "version_0"), "satmon_collapse/risk") == [(12, 0.0)]
    [hp_probe] = [s["hparams"] for s in tb.hparams_sessions(tmp_path / "probe")]
    [hp_cut] = [s["hparams"] for s in tb.hparams_sessions(tmp_path / "cut")]
    assert hp_probe["satmon/source"] == ("string_value", "probe") and hp_probe["satmon/window"] == ("number_value", 0.0)
    assert hp_cut["satmon/partial"] == ("number_value", 1.0) and hp_cut["satmon/window"] == ("number_value", 3.0)


def test_log_verdict_rejects_an_unknown_decision(tmp_path):
    """A verdict cannot hold a decision the rule does not make (satmon.results.rule.Decision): none reaches a sink."""
    with pytest.raises(ValueError, match=r"Expected a decision in \('go', 'no-go', 'non-finite'\), got 'maybe'"):
        dataclasses.replace(build_verdict({"ln_f": (1, 2)}, step=1, window=1), decision="maybe")


def test_a_list_of_loggers_is_refused_with_what_to_pass(tmp_path):
    """satmon 0.2 took Lightning loggers; 0.3 takes a sink and says how to wrap them."""
    logger = TensorBoardLogger(str(tmp_path), name="tb", version=0, default_hp_metric=False)
    with pytest.raises(TypeError, match=r"Expected a satmon.io.sink.Sink .*got list.*LightningSink\(trainer.loggers\)"):
        log_verdict([logger], build_verdict({"ln_f": (1, 2)}, step=1, window=1))


@pytest.mark.parametrize("kind", SINKS)
def test_layout_regexes_match_the_tags_written(kind, tmp_path, tb):
    from tensorboard.plugins.custom_scalar import layout_pb2

    run = _run(kind, tmp_path)
    add_layout(run.sink)
    run.finish()
    config = tb.accumulate(run.log_dir).Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    layout = layout_pb2.Layout.FromString(config)
    charts = {c.title: c.multiline.tag for cat in layout.category for c in cat.chart}
    written = [*window_scalars(0.5, dict.fromkeys(LAYERS, 0.5), dict.fromkeys(LAYERS, 2.0), 0), TAG.verdict, TAG.margin]

    def matched(title: str) -> list[str]:
        return [t for t in written if any(re.search(rx, t) for rx in charts[title])]

    # one scale per chart: the decision (0/1) never shares an axis with the margin (+-0.3)
    assert [c.title for c in layout.category[0].chart][0] == "decision (1 GO, 0 NO-GO, -1 non-finite)"
    assert matched("decision (1 GO, 0 NO-GO, -1 non-finite)") == ["Satmon/decision"]
    assert matched("margin (saturation - threshold)") == ["Satmon/margin"]
    assert matched("pooled saturation") == ["Satmon/saturation"]
    assert matched("saturation per layer") == [f"satmon_saturation/{n}" for n in LAYERS]
    assert matched("alpha per layer") == [f"satmon_alpha/{n}" for n in LAYERS]
