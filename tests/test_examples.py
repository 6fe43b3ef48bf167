"""Every example runs in a tiny configuration and prints what it promises."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run(script: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_screen_gpt_prints_the_verdict_and_writes_tensorboard(tmp_path):
    out = run("screen_gpt.py", "--steps", "8", "--window", "6", "--logdir", "logs", cwd=tmp_path)
    assert "### satmon verdict:" in out  # the card, printed by the monitor at the verdict
    assert "satmon verdict: " in out and "window 6 steps" in out
    assert "tensorboard --logdir logs" in out
    assert list((tmp_path / "logs" / "screen_gpt").glob("version_0/events.out.tfevents.*"))


def test_llama_abort_stops_at_the_verdict_on_collapse_risk(tmp_path):
    out = run("llama_abort.py", "--steps", "10", "--window", "4", "--logdir", "logs", cwd=tmp_path)
    assert "collapse risk: YES" in out
    assert "satmon stopped training at step 4, reason collapse-risk" in out
    assert "Training ended at step 4 of 10." in out


def test_llama_abort_dry_run_trains_on(tmp_path):
    out = run("llama_abort.py", "--steps", "6", "--window", "3", "--dry-run", "--logdir", "logs", cwd=tmp_path)
    assert "would have stopped at step 3, reason collapse-risk" in out
    assert "Training ran on to step 6 of 6." in out


def test_plain_pytorch_loop_prints_the_verdict(tmp_path):
    out = run("plain_pytorch.py", "--window", "5", "--steps", "7", cwd=tmp_path)
    assert "### satmon verdict:" in out
    assert "| blocks.0.ln_1 |" in out and "| ln_f |" in out  # per-layer table, names from the plain model
    assert "step 7: train loss" in out
    assert out.strip().splitlines()[-1].startswith("satmon verdict: ") and "window 5 steps" in out


def test_regime_flip_smoke(tmp_path):
    out = run("regime_flip.py", "--smoke", "--out", "rf", cwd=tmp_path)
    assert "| few tokens (over-parameterised) |" in out and "| many tokens (data-rich) |" in out
    assert "Sign flip" in out
    data = json.loads((tmp_path / "rf" / "regime_flip.json").read_text())
    assert len(data["runs"]) == 4
    for r in data["runs"]:
        assert math.isfinite(r["val_loss"]) and r["val_loss"] > 0
        if r["norm"] == "dyt":
            assert r["decision"] in ("go", "no-go") and 0.0 <= r["saturation"] <= 1.0 and 0.0 <= r["saturation_end"] <= 1.0
        else:
            assert "decision" not in r
    # one held-out split for every run: the untrained-ish smoke models all score on the same tokens
    assert {r["train_tokens"] for r in data["runs"]} == {data["setup"]["few_tokens"], data["setup"]["many_tokens"]}
    assert (tmp_path / "rf" / "regime_flip.png").stat().st_size > 10_000
    assert (tmp_path / "rf" / "regime_flip.md").read_text().startswith("Mode `smoke`")


def test_replay_finished_run(tmp_path):
    pytest.importorskip("matplotlib")
    out = run("replay_finished_run.py", "--steps", "4", "--every", "2", "--window", "2", "--batches", "1",
              "--workdir", "w", cwd=tmp_path)
    assert "satmon replay " in out
    records = json.loads((tmp_path / "w" / "replay.json").read_text())
    assert [r["global_step"] for r in records] == [2, 4]
    assert all(r["verdict"]["decision"] in ("go", "no-go") for r in records)
    assert (tmp_path / "w" / "replay.md").exists()
    assert "Live monitor over the first 2 steps" in out
