"""examples/plain_pytorch.py: a plain training loop prints satmon's verdict."""

from __future__ import annotations

from conftest import run_script


def test_plain_pytorch_loop_prints_the_verdict(tmp_path):
    out = run_script("plain_pytorch.py", "--window", "5", "--steps", "7", cwd=tmp_path)
    assert "\nsatmon verdict:" in out and "###" not in out and "**" not in out  # the card, in plain text
    assert "| blocks.0.ln_1 |" in out and "| ln_f |" in out  # per-layer table, names from the plain model
    assert "step 7: train loss" in out
    assert out.strip().splitlines()[-1].startswith("satmon verdict: ") and "window 5 steps" in out
