"""What a user sees when the commands run as the README runs them, in fresh processes, output piped:

- the first line of ``satmon demo``, ``replay``, ``report`` and ``calibrate`` comes before torch is imported
  (the deterministic half of "within 2 s": the slow imports come after it), and within a bound generous
  enough for a busy shared machine;
- piped output holds no carriage return (no bar redrawn into a file) and its progress lines carry an ETA;
- the demo's checkpoints, replayed, name their source run and show its live verdict beside the replay's,
  with the one line that says why they can differ; ``satmon report`` prints both runs, and ``--plot``
  places the demo on the phase diagram (the replay, whose card gives no parameter count, is listed as not placed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the first line's bound: the issue's 2 s, made generous for a shared, busy 2-core machine (the proof that it
#: comes first is that torch is not imported yet when it is written)
FIRST_LINE_S = 15.0

#: runs ``satmon ARGS`` with a stdout that records, at its first write, the time and whether torch, Lightning and
#: TensorBoard were imported yet
RUNNER = r"""
import json, sys, time
class Spy:
    def __init__(self, out, marker):
        self.out, self.marker, self.seen = out, marker, False
    def write(self, text):
        if not self.seen and text.strip():
            self.seen = True
            with open(self.marker, "w") as f:
                json.dump({"torch": "torch" in sys.modules, "lightning": "lightning" in sys.modules,
                           "line": text.splitlines()[0]}, f)
        return self.out.write(text)
    def __getattr__(self, name):
        return getattr(self.out, name)
sys.stdout = Spy(sys.stdout, sys.argv[1])
from satmon.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def _run(tmp: Path, name: str, *argv: str, timeout: float = 600) -> dict:
    """Run ``satmon argv`` piped; the first line's time and what was imported then, the output and the exit code."""
    marker = tmp / f"{name}.first.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": ""}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(marker), *argv],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    first = proc.stdout.readline()
    first_s = time.perf_counter() - start
    rest, err = proc.communicate(timeout=timeout)
    out = (first + rest).decode()
    return {
        "first_s": first_s,
        "first": json.loads(marker.read_text()) if marker.exists() else None,
        "out": out,
        "err": err.decode(),
        "code": proc.returncode,
    }


def _first_line_is_prompt(r: dict, command: str) -> None:
    assert r["first"] is not None, r["err"]
    assert not r["first"]["torch"] and not r["first"]["lightning"], (
        f"satmon {command} imported torch before its first line"
    )
    assert r["first_s"] < FIRST_LINE_S, f"satmon {command}: first line after {r['first_s']:.1f} s"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """The README's flow, tiny: the demo (checkpoints every 2 steps), a replay of its checkpoints, a report."""
    tmp = tmp_path_factory.mktemp("flow")
    demo = _run(
        tmp,
        "demo",
        "demo",
        "--window",
        "4",
        "--train-tokens",
        "20000",
        "--checkpoint-every",
        "2",
        "--threads",
        "1",
        "--logdir",
        "logs",
    )
    assert demo["code"] == 0, demo["err"]
    ckpts = tmp / "logs" / "demo" / "version_0" / "checkpoints"
    replay = _run(
        tmp,
        "replay",
        "replay",
        str(ckpts),
        "--model",
        "satmon.demos.lit:LitLM",
        "--datamodule",
        "satmon.demos.corpus:CorpusDataModule",
        "--batches",
        "2",
        "--logdir",
        "logs",
        "--threads",
        "1",
    )
    assert replay["code"] == 0, replay["err"]
    return tmp, demo, replay


def test_demo_first_line_comes_at_once_and_piped_progress_is_plain_lines_with_an_eta(session):
    _, demo, _ = session
    _first_line_is_prompt(demo, "demo")
    assert demo["first"]["line"].startswith("satmon demo: GPT-2-style model")
    assert "\r" not in demo["out"] and "\r" not in demo["err"]
    progress = [line for line in demo["out"].splitlines() if line.startswith("satmon demo: steps (window 4) [")]
    assert progress and all("ETA" in line or "done in" in line for line in progress), demo["out"]
    assert progress[-1].startswith("satmon demo: steps (window 4) [4/4]") and "done in" in progress[-1]
    assert "GPU available" not in demo["err"] and "Tip:" not in demo["err"]  # Lightning's info lines stay quiet


def test_replay_first_line_progress_and_the_live_verdict_beside_the_replay(session):
    tmp, demo, replay = session
    _first_line_is_prompt(replay, "replay")
    assert replay["first"]["line"].startswith("satmon replay: replaying the checkpoints in")
    out = replay["out"]
    assert "\r" not in out and "\r" not in replay["err"]
    lines = [line for line in out.splitlines() if line.startswith("satmon replay: [")]
    assert [line.split("]")[0] for line in lines] == ["satmon replay: [1/2", "satmon replay: [2/2"]
    assert "ETA" in lines[0] and "done in" in lines[-1]
    # the source run is named, and its live verdict (from the checkpoints' SaturationMonitor state) sits beside
    import torch

    saved = torch.load(tmp / "logs" / "demo" / "version_0" / "checkpoints" / "epoch=0-step=4.ckpt", weights_only=True)
    live_sat = saved["callbacks"]["SaturationMonitor"]["verdict"]["saturation"]  # what the live window said
    assert (
        "Replay of logs/demo/version_0; its live verdict read from the SaturationMonitor state saved in epoch=" in out
    )
    row = next(line for line in out.splitlines() if line.startswith("| live window"))
    assert f"{live_sat:.4f}" in row and "the 4 training steps up to step 4, train mode" in row
    assert "| replay " in out and "checkpoint epoch=0-step=4.ckpt at step 4, eval mode" in out
    assert "Why they can differ: the live window averages every training step of the window, in train mode" in out
    assert "The study's 0.43 was fit on the second kind of reading (end-of-training checkpoints, eval mode)" in out


def test_report_prints_both_runs_and_places_the_demo_on_the_phase_diagram(session):
    tmp, _, _ = session
    pytest.importorskip("matplotlib")
    report = _run(tmp, "report", "report", "logs", "--plot", "--plot-file", "phase.png")
    assert report["code"] == 0, report["err"]
    _first_line_is_prompt(report, "report")
    assert report["first"]["line"].startswith("== satmon run ")
    out = report["out"]
    assert (
        out.count("== satmon run ") == 2
        and "demo/version_0" in out
        and "== satmon run logs/replay of demo/version_0" in out
    )
    assert "Replay of " in out and "| live window |" in out  # the replay's card carries the comparison
    assert "Note: Phase diagram: " in out and "unique training tokens (312 samples x 64 tokens in WindowDataset)" in out
    assert (
        "1 run(s) placed" in out and "not placed: replay of demo/version_0: its verdict gives no parameter count" in out
    )
    assert (tmp / "phase.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrate_first_line_comes_before_torch(tmp_path):
    r = _run(tmp_path, "calibrate", "calibrate", "--study", "--out", "cal", "--no-plot")
    assert r["code"] == 0, r["err"]
    _first_line_is_prompt(r, "calibrate")
    assert r["first"]["line"].startswith("satmon calibrate: 12 cells in 4 groups")
