"""examples/plain_pytorch.py's loop (``satmon.Screen`` only) gives the Lightning callback's verdict on the same
model, data and seed, stops where the callback stops, and counts what a float64 re-count of its inputs finds."""

from __future__ import annotations

import pytest

import satmon
from integration_recipe import WINDOW, comparable, gpt, lightning_run, load_example, loader, plain_run
from reference import InputRecorder


@pytest.fixture(scope="module")
def lightning_verdict(tmp_path_factory):
    return lightning_run(tmp_path_factory.mktemp("lightning")).verdict


def test_plain_loop_verdict_equals_the_lightning_callbacks(lightning_verdict):
    screen, ran = plain_run()
    assert ran == 8 and screen.stop is None
    assert comparable(screen.verdict) == comparable(lightning_verdict, strip="model.")
    per_layer = list(screen.verdict.per_layer.values())
    assert max(per_layer) - min(per_layer) > 0.3  # the layers differ: a shifted step or layer would show


def test_plain_loop_counts_equal_a_float64_recount():
    model = gpt()
    names = [l.name for l in satmon.find_dyt_layers(model)]
    recorder = InputRecorder(model, names)  # before the screen: it sees every training forward too
    screen = satmon.Screen(window=WINDOW, verbose=False).attach(model)
    load_example("plain_pytorch").fit(model, iter(loader()), screen, 8, lr=3e-2)
    recount = recorder.counts(first=WINDOW)  # one forward per step: the window's inputs are the first WINDOW
    assert {n: recount[n][0] / recount[n][1] for n in names} == screen.verdict.per_layer
    assert screen.verdict.elements == sum(t for _, t in recount.values())


def test_plain_loop_stops_where_the_callback_stops(tmp_path):
    monitor = lightning_run(tmp_path, abort_on="no-go", threshold=0.9)  # saturation ~0.36 < 0.9: NO-GO at the window
    screen, ran = plain_run(abort_on="no-go", threshold=0.9)
    assert ran == WINDOW and screen.should_stop
    assert screen.stop.reason == monitor.stop.reason == satmon.StopReason.NO_GO
    assert screen.stop.step == monitor.stop.step == WINDOW
