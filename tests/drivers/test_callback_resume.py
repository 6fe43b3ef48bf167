"""Resume: a run resumed mid-window reaches the uninterrupted run's verdict, bit for bit.

One uninterrupted run (4 batches an epoch, shuffle off, window 12, 4 epochs) saves a checkpoint at
the end of every epoch (steps 4, 8, 12, 16). A fresh Trainer, a fresh model (other random init)
and a fresh SaturationMonitor then continue from step 8 (mid-window) and from step 12 (the
verdict has been taken). CPU training with the same weights, optimizer state and batches is
deterministic, so the resumed run's counts, and hence its verdict, must equal the original's exactly.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_callback import satmon_hooks

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder, counts_of
from satmon import SaturationMonitor, find_dyt_layers
from satmon.drivers.lightning import STATE_KEY

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
    return ckpt["callbacks"][STATE_KEY]


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


def _resume(tmp_path: Path, ckpt: Path, **settings):
    """Continue the original run from ``ckpt`` with other satmon settings; returns the monitor and the warnings."""
    torch.manual_seed(7)
    lit = tiny_lit(alpha_init=50.0)
    rec = InputRecorder(lit, [l.name for l in find_dyt_layers(lit)])
    monitor = SaturationMonitor(**{"window": WINDOW, "verbose": False, **settings})
    tr = trainer(tmp_path, max_epochs=EPOCHS, callbacks=[monitor])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.fit(lit, token_loader(PER_EPOCH), ckpt_path=str(ckpt))
    return monitor, rec, [str(w.message) for w in caught if "satmon" in str(w.message)]


def _counts(rec: InputRecorder, level: float, start: int, stop: int) -> tuple[int, int]:
    """Saturated and total elements of forwards ``start:stop`` (all layers), float64, independent of satmon."""
    items = [item for name in rec.inputs for item in rec.inputs[name][start:stop]]
    return counts_of(items, level)


def test_resume_with_another_threshold_keeps_the_counts(original, tmp_path):
    monitor, _, ckpts = original
    resumed, _, said = _resume(tmp_path, ckpts[8], threshold=0.9)
    v = resumed.verdict
    # the counts belong to the window: the saturation is the uninterrupted run's, the decision the new threshold's
    assert v.saturation == monitor.verdict.saturation and v.elements == monitor.verdict.elements
    assert v.threshold == 0.9 and v.decision == ("go" if v.saturation >= 0.9 else "no-go")
    assert any("threshold 0.9 (saved: 0.43)" in n and "kept" in n for n in v.notes)
    assert not [w for w in said if "dropped" in w]


def test_resume_with_another_level_restarts_the_count_loudly(original, tmp_path):
    _, rec, ckpts = original
    resumed, _, said = _resume(tmp_path, ckpts[8], level=1.5)
    assert any("level 1.5 (saved: 2.0)" in w and "dropped" in w and "restarts" in w for w in said)
    v = resumed.verdict
    # only the steps after the resume were counted, at the new level: the original run's forwards 8..11
    sat, total = _counts(rec, 1.5, 8, WINDOW)
    assert (v.elements, v.window, v.step) == (total, WINDOW - 8, WINDOW)
    assert v.saturation == sat / total
    assert any("window restarted at step 8" in n for n in v.notes) and "window restarted at step 8" in v.card()


def test_resume_with_another_window_keeps_the_counts_and_says_so(original, tmp_path):
    _, rec, ckpts = original
    resumed, _, said = _resume(tmp_path, ckpts[8], window=10)
    assert any("window 10 (saved: 12)" in w for w in said)
    v = resumed.verdict
    sat, total = _counts(rec, 2.0, 0, 10)  # the first 8 steps from the checkpoint, 2 more after the resume
    assert (v.step, v.elements, v.saturation) == (10, total, sat / total)
    assert any("window 10 (saved: 12)" in n for n in v.notes)


def test_resume_from_a_satmon_0_1_checkpoint_finds_its_state(original, tmp_path):
    monitor, _, ckpts = original
    ckpt = torch.load(ckpts[8], map_location="cpu", weights_only=False)
    state = ckpt["callbacks"].pop("SaturationMonitor")
    state.pop("settings")  # 0.1 kept the settings in the key, not in the state
    ckpt["callbacks"]["SaturationMonitor{'window': 12, 'threshold': 0.43, 'level': 2.0}"] = state
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    resumed, _, said = _resume(tmp_path, old)
    got, want = resumed.verdict, monitor.verdict
    assert (got.saturation, got.per_layer, got.elements, got.step) == (
        want.saturation,
        want.per_layer,
        want.elements,
        want.step,
    )
    assert not [w for w in said if "dropped" in w]
    # 0.1 counted the exact product; 0.2 counts the module's: the counts are kept and the change is said
    assert any("product 'module' (saved: 'exact')" in w for w in said)


def test_mid_epoch_resume_warns_that_the_data_order_restarts(tmp_path):
    # a checkpoint in the middle of an epoch: a plain DataLoader cannot resume its position
    torch.manual_seed(0)
    save = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2, save_top_k=-1)
    trainer(tmp_path, max_steps=2, callbacks=[_monitor(), save], enable_checkpointing=True).fit(
        tiny_lit(alpha_init=50.0), token_loader(PER_EPOCH)
    )
    resumed, _, said = _resume(tmp_path, tmp_path / "ckpt" / "step=2.ckpt")
    assert any("resumed mid-window at step 2" in w and "cannot resume its position" in w for w in said)
    assert any("data order did not resume" in n for n in resumed.verdict.notes)


def test_gated_model_resumed_mid_window_keeps_gate_statistics_and_offsets(tmp_path):
    # a LLaMA-style DyT model (SwiGLU after DyT): the card's gate statistics and offset readings must survive too
    def fit(path: Path, ckpt: str | None = None, save: bool = False) -> SaturationMonitor:
        torch.manual_seed(0 if ckpt is None else 7)
        lit = tiny_lit(arch="llama", alpha_init=50.0)
        monitor = SaturationMonitor(window=WINDOW, offset_every=3, verbose=False)
        callbacks = [monitor]
        if save:
            callbacks.append(ModelCheckpoint(dirpath=path / "ckpt", filename="{step}", every_n_epochs=1, save_top_k=-1))
        trainer(path, max_epochs=4, callbacks=callbacks, enable_checkpointing=save).fit(
            lit, token_loader(PER_EPOCH), ckpt_path=ckpt
        )
        return monitor

    original = fit(tmp_path / "a", save=True)
    resumed = fit(tmp_path / "b", ckpt=str(tmp_path / "a" / "ckpt" / "step=8.ckpt"))
    assert original.verdict.gated and original.verdict.risk and original.verdict.offset
    assert resumed.verdict.to_dict() == original.verdict.to_dict()
