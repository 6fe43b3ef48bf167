"""``satmon report LOGDIR``: the verdict card and trajectories of a live run, a replayed run, and a
non-finite verdict with notes written by the writer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from helpers import tiny_lit, token_loader
from satmon import SaturationMonitor
from satmon.cli.main import main
from satmon.io.tensorboard import SummaryWriterSink, log_scalars, log_verdict, window_scalars
from satmon.results.verdict import build_verdict

pytestmark = pytest.mark.filterwarnings("ignore:.*validation_step.*", "ignore:.*logging interval.*")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A live run: SaturationMonitor + TensorBoardLogger, checkpoints every 4 steps."""
    root = tmp_path_factory.mktemp("live")
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        max_steps=8,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(str(root / "logs"), name="live"),
        callbacks=[
            SaturationMonitor(window=6, log_every_n_steps=2, verbose=False),
            ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=4, save_top_k=-1),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(tiny_lit(), token_loader(8))
    return root


def test_report_prints_the_live_verdict_and_trajectories(live, capsys):
    for target in (live / "logs", live / "logs" / "live" / "version_0"):  # a parent folder or the version folder
        assert main(["report", str(target)]) == 0
        out = capsys.readouterr().out
        # the hparams sub-run is not a run of its own
        assert "live/version_0" in out and out.count("== satmon run") == 1
        assert "\nsatmon verdict:" in out and "threshold 0.43" in out and "verdict at step 6" in out
        assert "###" not in out and "**" not in out  # the console gets the card in plain text
        assert "| saturation (pooled)" in out and "@ 6" in out  # the trajectory table, with steps
        assert "| verdict (1 GO, 0 NO-GO, -1 non-finite)" in out
        assert "Per layer, last value:" in out and "model.ln_f" in out


def test_report_on_a_replayed_run(live, tmp_path, capsys):
    torch.save([b for _, b in zip(range(2), token_loader(2))], tmp_path / "calib.pt")
    code = main(
        [
            "replay",
            str(live / "ckpts"),
            "--model",
            "satmon.demos.lit:LitLM",
            "--data",
            str(tmp_path / "calib.pt"),
            "--logdir",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["report", str(tmp_path / "replay")]) == 0
    out = capsys.readouterr().out
    assert "(step 8, no training window)" in out and "sigma_min ratio (min over depth)" in out
    assert "@ 4" in out and "@ 8" in out  # the checkpoints' global steps


def test_no_satmon_data_exits_1(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path / "other")) as w:
        w.add_scalar("loss", 1.0, 0)
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no satmon data" in err and "1 TensorBoard run folder(s)" in err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_console_script_entry_point(live):
    script = shutil.which("satmon") or str(Path(sys.executable).parent / "satmon")
    proc = subprocess.run(
        [script, "report", str(live / "logs"), "--latest"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "\nsatmon verdict:" in proc.stdout


def test_report_shows_a_non_finite_verdict_and_its_notes(tmp_path, capsys):
    sink = SummaryWriterSink(tmp_path / "diverged" / "version_0")
    log_scalars(sink, window_scalars(0.5, {"ln_f": 0.5}, {"ln_f": 2.0}, 2), 4)
    note = "window restarted at step 3 after a resume"
    verdict = build_verdict({"ln_f": (3, 4, 2)}, step=8, window=8, notes=(note,))
    log_verdict(sink, verdict)
    sink.close()
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert verdict.text() in out  # the card as written, in plain text: headline, reason, notes, per-layer table
    assert "satmon verdict: NON-FINITE" in out and f"Note: {note}" in out
    row = next(line for line in out.splitlines() if line.startswith("| verdict"))
    assert "-1.0000 @ 8" in row and "nan" not in row.lower()
    per_layer = out[out.index("Per layer, last value:") :].splitlines()
    assert [c.strip() for c in per_layer[3].split("|")[1:-1]] == ["ln_f", "0.5000", "2.0000"]  # saturation, alpha


def test_reading_a_run_loads_no_lightning(live):
    """`satmon report RUN` needs the TensorBoard reader and satmon's tag table, never Lightning (checked in a
    fresh interpreter, on the live run's folder)."""
    script = (
        "import contextlib, io, json, sys\nfrom satmon.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n    code = main(sys.argv[1:])\n"
        "print(json.dumps({'code': code, 'out': out.getvalue(), 'modules': sorted(sys.modules)}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "report", str(live / "logs")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    got = __import__("json").loads(proc.stdout.splitlines()[-1])
    assert got["code"] == 0 and "\nsatmon verdict:" in got["out"]
    frameworks = sorted(
        m for m in got["modules"] if m.split(".")[0] in ("lightning", "lightning_fabric", "pytorch_lightning")
    )
    assert frameworks == [], frameworks[:8]
