"""examples/screen_gpt.py: the verdict it prints is the one a float64 re-count of its own run gives."""

from __future__ import annotations

import runpy
import sys

from conftest import EXAMPLES
from satmon.results.verdict import build_verdict


def test_screen_gpt_verdict_equals_float64_recount(tmp_path, monkeypatch, recorded_lit, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["screen_gpt.py", "--steps", "8", "--window", "6", "--logdir", "logs"])
    ns = runpy.run_path(str(EXAMPLES / "screen_gpt.py"), run_name="__main__")
    out = capsys.readouterr().out

    (rec,) = recorded_lit
    verdict = ns["monitor"].verdict
    ref = build_verdict(rec.counts(first=6), step=6, window=6)  # the window: the first 6 training forwards
    assert (verdict.decision, verdict.window, verdict.step) == (ref.decision, 6, 6)
    assert verdict.saturation == ref.saturation and verdict.per_layer == ref.per_layer
    assert len(rec.inputs[next(iter(rec.inputs))]) == 8  # it trained on past the window
    # what it prints: the card (plain text) and the summary line of that verdict, and where the logs are
    assert verdict.text() in out and verdict.summary() in out
    assert "tensorboard --logdir logs" in out
    assert list((tmp_path / "logs" / "screen_gpt").glob("version_0/events.out.tfevents.*"))
