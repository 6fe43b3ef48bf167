"""What SaturationMonitor writes to TensorBoard through the writer, read back from the event files.

Expected values come from the float64 reference (``helpers.InputRecorder``), not from satmon:
the running pooled / per-layer saturation at logging step ``s`` is the count over the first ``s``
training forwards, ``|alpha|`` at step ``s`` is the alpha the next forward used. TensorBoard stores
scalars as float32, so each expected value is rounded to float32 and compared exactly.

Window 7 with ``log_every_n_steps=2``: running readings at steps 2, 4, 6, the verdict at step 7.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder
from satmon import SaturationMonitor, find_dyt_layers

WINDOW, STEPS, EVERY = 7, 9, 2
LOG_STEPS = [2, 4, 6, WINDOW]
# threshold -> decision for the tiny model (pooled saturation about 0.27 at alpha_init 50)
CASES = {"no-go": dict(threshold=None, default_hp_metric=True), "go": dict(threshold=0.05, default_hp_metric=False)}


def _fit(tb, tmp_path: Path, threshold: float, default_hp_metric: bool):
    torch.manual_seed(0)
    lit = tiny_lit(alpha_init=50.0)
    rec = InputRecorder(lit, [l.name for l in find_dyt_layers(lit)])
    monitor = SaturationMonitor(window=WINDOW, threshold=threshold, verbose=False)
    logger = TensorBoardLogger(str(tmp_path), name="tb", version=0, default_hp_metric=default_hp_metric)
    tr = trainer(tmp_path, max_steps=STEPS, callbacks=[monitor], logger=logger, log_every_n_steps=EVERY)
    tr.fit(lit, token_loader(STEPS))
    return monitor, rec, tb.accumulate(logger.log_dir), tmp_path


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory, tb):
    return request.param, _fit(tb, tmp_path_factory.mktemp(request.param), **CASES[request.param])


def _f32(x: float) -> float:
    return float(np.float32(x))


def _running(rec: InputRecorder, step: int) -> tuple[float, dict[str, float], dict[str, float]]:
    """Reference pooled and per-layer saturation over the first ``step`` forwards, and ``|alpha|`` at ``step``."""
    counts = rec.counts(first=step)
    pooled = sum(s for s, _ in counts.values()) / sum(t for _, t in counts.values())
    per_layer = {n: s / t for n, (s, t) in counts.items()}
    alpha = {n: float(items[step][1].abs().mean()) for n, items in rec.inputs.items()}
    return pooled, per_layer, alpha


def test_running_and_verdict_scalars(run, tb):
    decision, (monitor, rec, ea, _) = run
    v = monitor.verdict
    assert v.decision == decision and v.step == WINDOW
    pooled = tb.scalars(ea, "Satmon/saturation")
    assert sorted({s for s, _ in pooled}) == LOG_STEPS  # the verdict writes the pooled value again at step 7
    for step in LOG_STEPS:
        ref_pooled, ref_layers, ref_alpha = _running(rec, step)
        assert {val for s, val in pooled if s == step} == {_f32(ref_pooled)}, step
        for name in monitor.layer_names:
            assert (step, _f32(ref_layers[name])) in tb.scalars(ea, f"satmon_saturation/{name}")
            assert (step, _f32(ref_alpha[name])) in tb.scalars(ea, f"satmon_alpha/{name}")
    for name in monitor.layer_names:
        assert [s for s, _ in tb.scalars(ea, f"satmon_saturation/{name}")] == LOG_STEPS
        assert [s for s, _ in tb.scalars(ea, f"satmon_alpha/{name}")] == LOG_STEPS
    # the callback's verdict numbers are the reference's, and are what TensorBoard holds
    ref_pooled, ref_layers, _ = _running(rec, WINDOW)
    assert v.saturation == ref_pooled and v.per_layer == ref_layers
    assert v.margin == pytest.approx(ref_pooled - v.threshold, rel=1e-12)
    # once each, at the verdict step, in the run itself (no sub-run)
    assert tb.scalars(ea, "Satmon/decision") == [(WINDOW, 1.0 if decision == "go" else 0.0)]
    # its chart's description says the decision and its trust (TensorBoard shows it with the chart)
    described = ea.SummaryMetadata("Satmon/decision").summary_description
    by = "by the study's rule" if decision == "no-go" else f"by your threshold {v.threshold:g}"  # CASES' thresholds
    assert described.startswith(
        f"{'GO' if decision == 'go' else 'NO-GO'} {by} at step {WINDOW}, "
        f"trust: {v.trust} (a measurement, not a forecast"
    )
    assert tb.scalars(ea, "Satmon/margin") == [(WINDOW, _f32(v.margin))]
    assert tb.scalars(ea, "Satmon/nonfinite") == [(s, 0.0) for s in LOG_STEPS]


def test_verdict_text_card(run, tb):
    decision, (monitor, _, ea, _) = run
    v = monitor.verdict
    [(step, card)] = tb.text(ea, "satmon/verdict")
    assert step == WINDOW and card == v.card()
    head = card.splitlines()[0]
    if decision == "go":
        assert "**GO**" in head and "NO-GO" not in card
    else:
        assert "**NO-GO**" in head and "**GO**" not in card
    assert f"threshold **{v.threshold:g}**" in card and f"**{v.saturation:.4f}**" in card
    assert f"window of {WINDOW} optimizer steps" in card
    lines = card.splitlines()
    # one table
    start = next(i for i, line in enumerate(lines) if line.startswith("| layer | saturation (window) |")) + 2
    rows = lines[start : start + len(monitor.layer_names)]
    assert [r.split(" | ")[:2] for r in rows] == [[f"| {n}", f"{v.per_layer[n]:.4f}"] for n in monitor.layer_names]
    caveat = [line for line in card.splitlines() if "12 cells" in line and line.lstrip("_").startswith("Caveat")]
    # one line, with room for one more sentence of evidence (satmon.study.FAITHFUL_GRID_FINDING)
    assert len(caveat) == 1 and "75%" in caveat[0] and "alpha_init 2.0" in caveat[0] and len(caveat[0]) < 320
    assert "custom_scalars__config__" in ea.Tags()["tensors"]  # the per-layer layout


def test_hparams_plugin_data_exist_in_the_run_itself(run, tb):
    _, (_, _, _, root) = run
    run_dir = root / "tb" / "version_0"
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(
        tb.accumulate(run_dir).PluginTagToContent("hparams")
    )
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == []  # one run per run: no satmon_hparams sub-run


def _check_verdict_in_hparams_view(tb, case: str, tmp_path: Path) -> None:
    monitor, _, _, root = _fit(tb, tmp_path, **CASES[case])
    v = monitor.verdict
    sessions = tb.hparams_sessions(root)
    mine = [s for s in sessions if "satmon/decision" in s["hparams"]]
    assert len(mine) == 1, f"TensorBoard shows {len(mine)} satmon hparams sessions, expected 1 among {sessions}"
    hp = mine[0]["hparams"]
    # each key with its exact protobuf kind: a decision stored as a number (or a number as a string) fails
    assert {k: hp[k] for k in hp if k.startswith("satmon/")} == {
        "satmon/decision": ("string_value", v.decision),
        "satmon/trust": ("string_value", v.trust),
        "satmon/source": ("string_value", "window"),
        "satmon/window": ("number_value", float(WINDOW)),
        "satmon/threshold": ("number_value", v.threshold),
        "satmon/level": ("number_value", 2.0),
        "satmon/partial": ("number_value", 0.0),
        "satmon/forecast": ("string_value", v.planned_forecast["outcome"]),
        "satmon/trap": ("string_value", monitor.screen.trap.state),  # the trap watch's state rides with the verdict
        # the run's scale, as data (satmon report --plot places the run from these)
        **{
            f"satmon/{k}": ("number_value", float(v.planned_forecast[k]))
            for k in ("params", "unique_tokens", "planned_tokens")
        },
    }
    assert {"Satmon/decision", "Satmon/margin", "Satmon/saturation"} <= set(mine[0]["metrics"])


def test_verdict_in_hparams_view_without_default_hp_metric(tmp_path, tb):
    _check_verdict_in_hparams_view(tb, "go", tmp_path)


def test_the_default_loggers_own_session_is_said(tmp_path, tb):
    """Lightning's default logger wrote its hp_metric session first, and TensorBoard shows a run's first session:
    satmon says so (with the option); the logger's hyper-parameters hold the decision all the same."""
    with pytest.warns(UserWarning, match=r"default_hp_metric=True.*default_hp_metric=False"):
        monitor, _, ea, root = _fit(tb, tmp_path, **CASES["no-go"])
    assert [s for s in tb.hparams_sessions(root) if "satmon/decision" in s["hparams"]] == []  # what the warning says
    assert tb.scalars(ea, "Satmon/decision") == [(WINDOW, 0.0)] and tb.text(ea, "satmon/verdict")
