"""A verdict made because training ended early is provisional, and a resume finishes the window.

A plain loop (satmon.Screen, no framework) on the demo GPT: the uninterrupted run screens a 10-step
window. The interrupted run's training ends at step 4 (``finish()``: a provisional verdict, trust
"partial"); its state is saved AFTER that verdict (the case 0.2 got wrong: the partial verdict stuck),
read back with ``torch.load(weights_only=True)``, and a fresh model, optimizer and Screen continue. CPU
training from the same weights, optimizer state and batches is deterministic, so the resumed window's
verdict must equal the uninterrupted one field for field. A resume with a window shorter than the steps
already counted closes at once, with a window and an element count that agree (against float64).
"""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

# the plain loop: forward, backward, step, end_step, begin_step
from test_state import (
    _train,
)

from reference import InputRecorder
from satmon import find_dyt_layers
from satmon.demos.llama import LlamaLM
from satmon.screen.screen import Screen

WINDOW, STEPS = 10, 12


def _batches(vocab: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab, (STEPS, 4, 17), generator=torch.Generator().manual_seed(0))


def _model() -> LlamaLM:
    torch.manual_seed(0)  # a gated model: the gate statistics must survive the resume too
    return LlamaLM(vocab_size=256, d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=4.0)


def _opt(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)


OPTIONS = {"watch_every_n_steps": 2, "offset_every": 2, "verbose": False}


def _save(model, opt, screen: Screen) -> dict:
    """A checkpoint as a user writes one, read back as torch.load(weights_only=True) does."""
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "satmon": screen.state_dict()}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _resume(saved: dict, at: int, stop: int, **settings) -> Screen:
    batches, model = _batches(), _model()
    model.load_state_dict(saved["model"])
    opt = _opt(model)
    opt.load_state_dict(saved["opt"])
    screen = Screen(**{"window": WINDOW, **OPTIONS, **settings})
    screen.load_state_dict(copy.deepcopy(saved["satmon"]))
    screen.attach(model, step=at, example_input=batches[0, :, :-1])
    _train(model, opt, screen, batches, at, stop)
    return screen


def _first(stop: int, finish: bool, window: int = WINDOW, record: bool = False):
    batches, model = _batches(), _model()
    opt = _opt(model)
    screen = Screen(window=window, **OPTIONS).attach(model, example_input=batches[0, :, :-1])
    rec = InputRecorder(model, [l.name for l in find_dyt_layers(model)]) if record else None  # training forwards only
    _train(model, opt, screen, batches, 0, stop)
    if finish:
        with pytest.warns(
            UserWarning, match=r"training ended after \d+ of the \d+ window steps; the verdict is provisional"
        ):
            screen.finish(stop)
    return (screen, _save(model, opt, screen)) + ((rec,) if record else ())


@pytest.fixture(scope="module")
def uninterrupted() -> Screen:
    batches, model = _batches(), _model()
    screen = Screen(window=WINDOW, **OPTIONS).attach(model, example_input=batches[0, :, :-1])
    _train(model, _opt(model), screen, batches, 0, STEPS)
    return screen


def test_training_that_ends_early_gives_a_provisional_verdict_that_says_so():
    screen, saved = _first(4, finish=True)
    v = screen.verdict
    assert v.partial and v.trust == "partial" and (v.window, v.planned_window) == (4, WINDOW)
    assert "partial window (4 of 10 steps): a measurement, not a forecast" in v.headline()
    assert "Resuming from a checkpoint continues the window" in v.text()
    # the checkpoint keeps the counts beside the provisional verdict
    assert saved["satmon"]["verdict"]["trust"] == "partial" and sum(saved["satmon"]["total"]) == v.elements


def test_a_resume_after_the_provisional_verdict_finishes_the_window_as_the_uninterrupted_run(uninterrupted):
    _, saved = _first(4, finish=True)
    resumed = _resume(saved, 4, STEPS)
    want = uninterrupted.verdict
    assert want.window == WINDOW and want.gated and want.risk and want.offset and want.loss
    assert resumed.verdict.to_dict() == want.to_dict()  # counts, offsets, gates, loss trend, notes: field for field
    assert resumed.hooks.counter.total.tolist() == uninterrupted.hooks.counter.total.tolist()


def test_a_resume_saved_before_the_end_finishes_the_window_too(uninterrupted):
    _, saved = _first(4, finish=False)
    assert saved["satmon"]["verdict"] is None
    assert _resume(saved, 4, STEPS).verdict.to_dict() == uninterrupted.verdict.to_dict()


@pytest.mark.parametrize("finish", [False, True])
def test_a_resume_with_a_window_shorter_than_the_steps_counted_closes_at_once(finish):
    _, saved, rec = _first(8, finish=finish, window=20, record=True)
    ref = rec.counts()  # float64, independent of satmon: |alpha * x| > 2 over the 8 training forwards
    counted = sum(t for _, t in ref.values())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _resume(saved, 8, STEPS, window=5)
    v = resumed.verdict
    # closed at the resume, on the 8 steps counted: window and elements agree
    assert (v.step, v.window, v.planned_window, v.elements) == (8, 8, 5, counted)
    assert not v.partial and v.trust in ("unproven", "inconclusive", "flagged")  # never partial
    assert any("after 8 window steps were counted: the window closed at the resume" in n for n in v.notes)
    assert "over a window of 8 optimizer steps (5 asked for; verdict at step 8)" in v.card()
    assert any("closes at once" in str(w.message) for w in caught)
    assert v.saturation == sum(s for s, _ in ref.values()) / counted
    assert resumed.hooks.attached is False  # nothing more was counted after the window closed
