"""Resume: a run resumed mid-window reaches the uninterrupted run's verdict, bit for bit.

One uninterrupted run (4 batches an epoch, shuffle off, window 12, 4 epochs) saves a checkpoint at
the end of every epoch (steps 4, 8, 12, 16). A fresh Trainer, a fresh model (other random init)
and a fresh SaturationMonitor then continue from step 8 (mid-window) and from step 12 (the
verdict has been taken). CPU training with the same weights, optimizer state and batches is
deterministic, so the resumed run's counts, and hence its verdict, must equal the original's exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import InputRecorder, tiny_lit, token_loader, trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from satmon import SaturationMonitor
from satmon.discovery import find_dyt_layers
from test_callback import satmon_hooks

WINDOW, PER_EPOCH, EPOCHS = 12, 4, 4


def _monitor() -> SaturationMonitor:
    return SaturationMonitor(window=WINDOW, verbose=False)


def _fit(tmp_path: Path, seed: int, ckpt_path: str | None = None, epochs: int = EPOCHS, save: bool = False):
    torch.manual_seed(seed)
    lit = tiny_lit(alpha_init=50.0)
    rec = InputRecorder(lit, [l.name for l in find_dyt_layers(lit)])
    monitor = _monitor()
    callbacks = [monitor]
    if save:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_epochs=1, save_top_k=-1))
    tr = trainer(tmp_path, max_epochs=epochs, callbacks=callbacks, enable_checkpointing=save)
    tr.fit(lit, token_loader(PER_EPOCH), ckpt_path=ckpt_path)
    return monitor, rec, tr


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("original")
    monitor, rec, tr = _fit(tmp, seed=0, save=True)
    assert tr.global_step == PER_EPOCH * EPOCHS
    ckpts = {int(p.stem.split("=")[1]): p for p in (tmp / "ckpt").glob("step=*.ckpt")}
    assert sorted(ckpts) == [4, 8, 12, 16]
    return monitor, rec, ckpts


def _callback_state(path: Path) -> dict:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt["callbacks"][_monitor().state_key]


def test_mid_window_checkpoint_holds_the_counts_so_far(original):
    monitor, rec, ckpts = original
    state = _callback_state(ckpts[8])
    assert state["verdict"] is None and state["steps_seen"] == 8
    ref = rec.counts(first=8)  # the float64 reference over the first 8 training forwards
    assert state["layers"] == monitor.layer_names
    assert state["saturated"] == [ref[n][0] for n in monitor.layer_names]
    assert state["total"] == [ref[n][1] for n in monitor.layer_names]
    assert state["nonfinite"] == [0] * len(monitor.layer_names)


def test_resume_mid_window_reproduces_uninterrupted_verdict(original, tmp_path):
    monitor, rec, ckpts = original
    resumed, rec2, tr = _fit(tmp_path, seed=123, ckpt_path=str(ckpts[8]))
    assert tr.global_step == PER_EPOCH * EPOCHS
    assert len(rec2.inputs[monitor.layer_names[0]]) == PER_EPOCH * EPOCHS - 8  # it really resumed at step 8
    assert resumed.verdict is not None and monitor.verdict is not None
    assert resumed.verdict.saturation == monitor.verdict.saturation
    assert resumed.verdict.decision == monitor.verdict.decision
    assert resumed.verdict.to_dict() == monitor.verdict.to_dict()  # per-layer fractions, elements, step, margin, ...
    assert resumed.screen.hooks.counter.saturated.tolist() == monitor.screen.hooks.counter.saturated.tolist()
    assert resumed.screen.hooks.counter.total.tolist() == monitor.screen.hooks.counter.total.tolist()
    # and both equal the float64 reference over the window (first 12 forwards of the original run)
    ref = rec.counts(first=WINDOW)
    assert resumed.screen.hooks.counter.saturated.tolist() == [ref[n][0] for n in monitor.layer_names]
    assert monitor.verdict.step == WINDOW and resumed.steps_seen == WINDOW


def test_resume_after_verdict_restores_it_and_keeps_hooks_off(original, tmp_path):
    monitor, _, ckpts = original
    state = _callback_state(ckpts[12])
    assert state["verdict"] == monitor.verdict.to_dict()
    resumed, _, tr = _fit(tmp_path, seed=7, ckpt_path=str(ckpts[12]))
    assert tr.global_step == PER_EPOCH * EPOCHS
    assert resumed.verdict is not None and resumed.verdict.to_dict() == monitor.verdict.to_dict()
    assert resumed.screen.hooks is not None and resumed.screen.hooks.attached is False
    for layer in find_dyt_layers(tr.lightning_module):
        owners = [o for _, o in satmon_hooks(layer.module)]
        assert resumed.screen.hooks not in owners  # the window's hooks were never attached in this run
        assert all(o.enabled is False for o in owners)  # whatever else satmon keeps there is off
    # nothing was counted after the verdict: the counts are the checkpoint's
    assert resumed.screen.hooks.counter.saturated.tolist() == state["saturated"]
    assert resumed.screen.hooks.counter.total.tolist() == state["total"]


@pytest.mark.parametrize("step", [8, 16])
def test_state_dict_round_trip(original, step):
    monitor, _, ckpts = original
    state = _callback_state(ckpts[step]) if step != 16 else monitor.state_dict()
    fresh = _monitor()
    fresh.load_state_dict(state)
    assert fresh.steps_seen == state["steps_seen"]
    if state["verdict"] is None:
        assert fresh.verdict is None
    else:
        assert fresh.verdict.to_dict() == monitor.verdict.to_dict()
    again = fresh.state_dict()  # before any Trainer: the counts come back from what was loaded
    for key in ("saturated", "total", "nonfinite", "steps_seen", "verdict", "stop", "version"):
        assert again[key] == state[key], key


def test_state_dict_round_trip_keeps_layer_names(original):
    monitor, _, _ = original
    fresh = _monitor()
    fresh.load_state_dict(monitor.state_dict())
    assert fresh.state_dict() == monitor.state_dict()
