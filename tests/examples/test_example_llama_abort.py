"""examples/llama_abort.py: the abort policy stops a gated LLaMA-style DyT run at the verdict."""

from __future__ import annotations

from conftest import run_script


def test_llama_abort_stops_at_the_verdict_on_collapse_risk(tmp_path):
    out = run_script("llama_abort.py", "--steps", "10", "--window", "4", "--logdir", "logs", cwd=tmp_path)
    assert "collapse risk: YES" in out
    assert "satmon stopped training at step 4, reason collapse-risk" in out
    assert "Training ended at step 4 of 10." in out


def test_llama_abort_dry_run_trains_on(tmp_path):
    out = run_script("llama_abort.py", "--steps", "6", "--window", "3", "--dry-run", "--logdir", "logs", cwd=tmp_path)
    assert "would have stopped at step 3, reason collapse-risk" in out
    assert "Training ran on to step 6 of 6." in out
