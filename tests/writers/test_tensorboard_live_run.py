"""What SaturationMonitor writes to TensorBoard, read back from the event files.

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
from helpers import InputRecorder, tiny_lit, token_loader, trainer
from lightning.pytorch.loggers import TensorBoardLogger

from satmon import SaturationMonitor
from satmon.discovery import find_dyt_layers

EventAccumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator").EventAccumulator
EventMultiplexer = pytest.importorskip("tensorboard.backend.event_processing.event_multiplexer").EventMultiplexer
plugin_data_pb2 = pytest.importorskip("tensorboard.plugins.hparams.plugin_data_pb2")

WINDOW, STEPS, EVERY = 7, 9, 2
LOG_STEPS = [2, 4, 6, WINDOW]
GUIDANCE = {k: 0 for k in ("compressedHistograms", "images", "audio", "scalars", "histograms", "tensors")}
# threshold -> decision for the tiny model (pooled saturation about 0.27 at alpha_init 50)
CASES = {"no-go": dict(threshold=0.43, default_hp_metric=True), "go": dict(threshold=0.05, default_hp_metric=False)}


def _fit(tmp_path: Path, threshold: float, default_hp_metric: bool):
    torch.manual_seed(0)
    lit = tiny_lit(alpha_init=50.0)
    rec = InputRecorder(lit, [l.name for l in find_dyt_layers(lit)])
    monitor = SaturationMonitor(window=WINDOW, threshold=threshold, verbose=False)
    logger = TensorBoardLogger(str(tmp_path), name="tb", version=0, default_hp_metric=default_hp_metric)
    tr = trainer(tmp_path, max_steps=STEPS, callbacks=[monitor], logger=logger, log_every_n_steps=EVERY)
    tr.fit(lit, token_loader(STEPS))
    ea = EventAccumulator(logger.log_dir, size_guidance=GUIDANCE)
    ea.Reload()
    return monitor, rec, ea, tmp_path


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory):
    return request.param, _fit(tmp_path_factory.mktemp(request.param), **CASES[request.param])


def _f32(x: float) -> float:
    return float(np.float32(x))


def _scalars(ea, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def _running(rec: InputRecorder, step: int) -> tuple[float, dict[str, float], dict[str, float]]:
    """Reference pooled and per-layer saturation over the first ``step`` forwards, and ``|alpha|`` at ``step``."""
    counts = rec.counts(first=step)
    pooled = sum(s for s, _ in counts.values()) / sum(t for _, t in counts.values())
    per_layer = {n: s / t for n, (s, t) in counts.items()}
    alpha = {n: float(items[step][1].abs().mean()) for n, items in rec.inputs.items()}
    return pooled, per_layer, alpha


def test_running_and_verdict_scalars(run):
    decision, (monitor, rec, ea, _) = run
    v = monitor.verdict
    assert v.decision == decision and v.step == WINDOW
    pooled = _scalars(ea, "satmon/saturation")
    assert sorted({s for s, _ in pooled}) == LOG_STEPS  # the verdict writes the pooled value again at step 7
    for step in LOG_STEPS:
        ref_pooled, ref_layers, ref_alpha = _running(rec, step)
        assert {val for s, val in pooled if s == step} == {_f32(ref_pooled)}, step
        for name in monitor.layer_names:
            assert (step, _f32(ref_layers[name])) in _scalars(ea, f"satmon/saturation/{name}")
            assert (step, _f32(ref_alpha[name])) in _scalars(ea, f"satmon/alpha/{name}")
    for name in monitor.layer_names:
        assert [s for s, _ in _scalars(ea, f"satmon/saturation/{name}")] == LOG_STEPS
        assert [s for s, _ in _scalars(ea, f"satmon/alpha/{name}")] == LOG_STEPS
    # the callback's verdict numbers are the reference's, and are what TensorBoard holds
    ref_pooled, ref_layers, _ = _running(rec, WINDOW)
    assert v.saturation == ref_pooled and v.per_layer == ref_layers
    assert v.margin == pytest.approx(ref_pooled - v.threshold, rel=1e-12)
    # Lightning's log_hyperparams(metrics=...) also writes the hparams metrics as scalars at step 0.
    verdict = [(s, val) for s, val in _scalars(ea, "satmon/verdict") if s != 0]
    margin = [(s, val) for s, val in _scalars(ea, "satmon/margin") if s != 0]
    assert verdict == [(WINDOW, 1.0 if decision == "go" else 0.0)]
    assert margin == [(WINDOW, _f32(v.margin))]
    assert {val for _, val in _scalars(ea, "satmon/verdict")} == {verdict[0][1]}
    assert {val for _, val in _scalars(ea, "satmon/margin")} == {margin[0][1]}
    assert _scalars(ea, "satmon/nonfinite") == [(s, 0.0) for s in LOG_STEPS]


def test_verdict_text_card(run):
    decision, (monitor, _, ea, _) = run
    v = monitor.verdict
    events = ea.Tensors("satmon/verdict/text_summary")
    assert [e.step for e in events] == [WINDOW]
    card = events[0].tensor_proto.string_val[0].decode()
    assert card == v.card()
    head = card.splitlines()[0]
    if decision == "go":
        assert "**GO**" in head and "NO-GO" not in card
    else:
        assert "**NO-GO**" in head and "**GO**" not in card
    assert f"threshold **{v.threshold:g}**" in card and f"**{v.saturation:.4f}**" in card
    assert f"window of {WINDOW} optimizer steps" in card
    rows = [line for line in card.splitlines() if line.startswith("| ") and not line.startswith("| layer")]
    assert rows == [f"| {n} | {v.per_layer[n]:.4f} |" for n in monitor.layer_names]
    caveat = [line for line in card.splitlines() if "12 cells" in line]
    assert len(caveat) == 1 and "75%" in caveat[0] and "alpha_init 2.0" in caveat[0] and len(caveat[0]) < 250
    assert "custom_scalars__config__" in ea.Tags()["tensors"]  # the per-layer layout


def _hparams_sessions(log_root: Path) -> list[tuple[dict, list[str]]]:
    """(hparams, metric tags) of every hparams session TensorBoard would show under ``log_root``."""
    mux = EventMultiplexer(size_guidance=GUIDANCE).AddRunsFromDirectory(str(log_root))
    mux.Reload()
    out = []
    for run, tags in mux.PluginRunToTagToContent("hparams").items():
        start = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/session_start_info"]).session_start_info
        exp = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/experiment"]).experiment
        hp = {k: (val.string_value or val.number_value) for k, val in start.hparams.items()}
        out.append((hp, [m.name.tag for m in exp.metric_infos]))
    return out


def test_hparams_plugin_data_exist(run):
    _, (_, _, _, root) = run
    sub = EventAccumulator(str(root / "tb" / "version_0" / "satmon_hparams"), size_guidance=GUIDANCE).Reload()
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(sub.PluginTagToContent("hparams"))


def _check_verdict_in_hparams_view(case: str, tmp_path: Path) -> None:
    monitor, _, _, root = _fit(tmp_path, **CASES[case])
    sessions = _hparams_sessions(root)
    mine = [(hp, metrics) for hp, metrics in sessions if "satmon/decision" in hp]
    assert mine, f"TensorBoard shows no satmon hparams session, only {sessions}"
    hp, metrics = mine[0]
    assert hp["satmon/decision"] == monitor.verdict.decision and hp["satmon/threshold"] == monitor.verdict.threshold
    assert {"satmon/verdict", "satmon/margin"} <= set(metrics)


def test_verdict_in_hparams_view_without_default_hp_metric(tmp_path):
    _check_verdict_in_hparams_view("go", tmp_path)


def test_verdict_in_hparams_view_with_default_logger(tmp_path):
    _check_verdict_in_hparams_view("no-go", tmp_path)
