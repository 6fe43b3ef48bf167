"""The Lightning callback: a window that training cut short is finished by a resume, equal to the uninterrupted run.

One uninterrupted run screens a 16-step window (4 batches an epoch, shuffle off, 4 epochs). The
interrupted run trains 2 epochs (8 steps): its verdict is provisional ("partial window (8 of 16 steps)"),
and ``trainer.save_checkpoint`` after ``fit`` keeps it with the counts. A fresh Trainer, model and monitor
resumed from that file train on to step 16, and the verdict must equal the uninterrupted one field for
field (0.2 kept the step-8 verdict). A resume at an epoch boundary gives no data-order warning; a resume
with a window shorter than the steps counted (20 -> 5 after 8) closes at once, with window and elements
that agree. The verdict is printed once, in plain text, on stdout.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder
from satmon import SaturationMonitor, find_dyt_layers

WINDOW, PER_EPOCH, EPOCHS = 16, 4, 4


def _fit(
    path: Path,
    seed: int,
    epochs: int,
    ckpt: str | None = None,
    window: int = WINDOW,
    save_every: int | None = None,
    verbose: bool = False,
    record: bool = False,
):
    torch.manual_seed(seed)
    lit = tiny_lit(alpha_init=50.0)
    rec = InputRecorder(lit, [l.name for l in find_dyt_layers(lit)]) if record else None
    monitor = SaturationMonitor(window=window, verbose=verbose)
    callbacks = [monitor]
    if save_every:
        callbacks.append(
            ModelCheckpoint(dirpath=path / "ckpt", filename="{step}", every_n_train_steps=save_every, save_top_k=-1)
        )
    tr = trainer(path, max_epochs=epochs, callbacks=callbacks, enable_checkpointing=bool(save_every))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.fit(lit, token_loader(PER_EPOCH), ckpt_path=ckpt)
    return monitor, tr, [str(w.message) for w in caught if "satmon" in str(w.message)], rec


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    monitor, *_ = _fit(tmp_path_factory.mktemp("full"), seed=0, epochs=EPOCHS)
    assert monitor.verdict.window == WINDOW and not monitor.verdict.partial
    return monitor


@pytest.fixture(scope="module")
def cut_short(tmp_path_factory):
    """Training that ends at step 8 of the 16-step window, saved after fit (and every 4 steps during it)."""
    tmp = tmp_path_factory.mktemp("short")
    monitor, tr, said, rec = _fit(tmp, seed=0, epochs=2, save_every=PER_EPOCH, record=True)
    tr.save_checkpoint(tmp / "after_fit.ckpt")
    return monitor, tmp, said, rec


def test_a_window_cut_short_is_provisional_and_its_checkpoint_keeps_the_counts(cut_short):
    monitor, tmp, said, rec = cut_short
    v = monitor.verdict
    assert v.partial and v.trust == "partial" and (v.window, v.planned_window, v.step) == (8, WINDOW, 8)
    assert "partial window (8 of 16 steps): a measurement, not a forecast" in monitor.card()
    assert any("the verdict is provisional" in w for w in said)
    state = torch.load(tmp / "after_fit.ckpt", map_location="cpu", weights_only=False)["callbacks"][monitor.state_key]
    ref = rec.counts()
    assert state["verdict"]["trust"] == "partial"
    assert state["total"] == [ref[n][1] for n in monitor.layer_names]
    assert state["saturated"] == [ref[n][0] for n in monitor.layer_names]


def test_resuming_after_the_provisional_verdict_finishes_the_window_field_for_field(uninterrupted, cut_short, tmp_path):
    _, tmp, _, _ = cut_short
    resumed, tr, said, _ = _fit(tmp_path, seed=7, epochs=EPOCHS, ckpt=str(tmp / "after_fit.ckpt"))
    assert tr.global_step == PER_EPOCH * EPOCHS
    assert resumed.verdict.to_dict() == uninterrupted.verdict.to_dict()
    assert resumed.verdict.trust == uninterrupted.verdict.trust and not resumed.verdict.partial
    assert not [w for w in said if "data order" in w]


def test_a_resume_at_an_epoch_boundary_gives_no_data_order_warning(uninterrupted, cut_short, tmp_path):
    # step=8.ckpt was written by every_n_train_steps at the epoch's last batch: the next epoch starts afresh
    _, tmp, _, _ = cut_short
    resumed, _, said, _ = _fit(tmp_path, seed=7, epochs=EPOCHS, ckpt=str(tmp / "ckpt" / "step=8.ckpt"))
    assert not [w for w in said if "data order" in w or "cannot resume its position" in w]
    assert resumed.verdict.to_dict() == uninterrupted.verdict.to_dict()  # no note either: bit-identical


def test_a_resume_with_a_window_shorter_than_the_steps_counted_closes_at_once(cut_short, tmp_path):
    _, tmp, _, rec = cut_short
    ref = rec.counts()
    resumed, _, said, _ = _fit(tmp_path, seed=7, epochs=EPOCHS, ckpt=str(tmp / "after_fit.ckpt"), window=5)
    v = resumed.verdict
    total = sum(t for _, t in ref.values())
    assert (v.step, v.window, v.planned_window, v.elements) == (8, 8, 5, total)  # window and elements agree
    assert v.saturation == sum(s for s, _ in ref.values()) / total
    assert "8 optimizer steps (5 asked for; verdict at step 8)" in v.card()
    assert any("closes at once" in w for w in said)


def test_the_verdict_is_printed_once_in_plain_text_on_stdout(tmp_path, capsys):
    monitor, *_ = _fit(tmp_path, seed=0, epochs=1, window=4, verbose=True)
    out, err = capsys.readouterr()
    assert out.count("satmon verdict:") == 1 and "satmon verdict:" not in err
    assert monitor.verdict.text() in out and "###" not in out and "**" not in out
