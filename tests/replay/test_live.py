"""A replay names the run it reads and shows that run's live verdict beside its own: found in the checkpoints'
SaturationMonitor state, in the TensorBoard events beside them, or where ``--live`` points; each source read
back against the monitor's own verdict."""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

import satmon
from helpers import tiny_lit, token_loader
from satmon import SaturationMonitor
from satmon.cli.main import main
from satmon.io.tags import TAG
from satmon.io.tensorboard_reader import read_run
from satmon.replaying import checkpoints as ck
from satmon.replaying import listing as lst
from satmon.replaying.live import (
    find_source,
    live_from_checkpoints,
    live_from_tensorboard,
    run_name,
    source_run,
)
from satmon.replaying.outputs import live_lines
from satmon.replaying.user_code import ReplayUsageError

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*validation_step.*", "ignore:.*logging interval.*", "ignore:.*hp_metric.*"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A live run in Lightning's layout: TensorBoard events in version_0, checkpoints in version_0/checkpoints at
    steps 2 (window open), 4 and 6 (after the verdict)."""
    root = tmp_path_factory.mktemp("live")
    pl.seed_everything(0, verbose=False)
    logger = TensorBoardLogger(str(root / "logs"), name="live", default_hp_metric=False)
    monitor = SaturationMonitor(window=4, log_every_n_steps=2, verbose=False)
    trainer = pl.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        logger=logger,
        callbacks=[monitor, ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(tiny_lit(), token_loader(8))
    version = root / "logs" / "live" / "version_0"
    torch.save([b for _, b in zip(range(2), token_loader(2))], root / "calib.pt")
    return root, version, monitor.verdict


def _infos(version):
    listing = lst.list_checkpoints([version / "checkpoints"])
    return ck.order_checkpoints([ck.inspect_checkpoint(p, stamps=listing.stamps[p]) for p in listing.paths])


def test_the_checkpoints_hold_the_live_verdict_whole(run):
    _, version, verdict = run
    infos = _infos(version)
    assert [i.global_step for i in infos] == [2, 4, 6]
    live = live_from_checkpoints(infos)
    assert (live.decision, live.saturation, live.threshold, live.step, live.window, live.trust) == (
        verdict.decision,
        verdict.saturation,
        verdict.threshold,
        verdict.step,
        verdict.window,
        verdict.trust,
    )
    assert live.found == "the SaturationMonitor state saved in `epoch=0-step=6.ckpt`"
    assert live_from_checkpoints(infos[:1]) is None  # step 2: the window was still open
    assert source_run([i.path for i in infos]).resolve() == version.resolve()  # Lightning's layout: the version folder


def test_without_the_state_the_tensorboard_events_beside_the_checkpoints_say_it(run):
    _, version, verdict = run
    infos = _infos(version)
    for info in infos:
        info.checkpoint.pop("callbacks")  # checkpoints saved without the monitor's state
    source = find_source(source_run([version / "checkpoints"]), infos)
    live = source.live
    assert (live.decision, live.step, live.window, live.trust) == (
        verdict.decision,
        verdict.step,
        verdict.window,
        verdict.trust,
    )
    assert live.saturation == pytest.approx(verdict.saturation, rel=1e-6)  # float32 in the event file
    assert live.threshold == pytest.approx(verdict.threshold, abs=1e-6) and "TensorBoard events in" in live.found
    elsewhere = find_source(source_run([version / "checkpoints"]), [])
    assert elsewhere.live is not None  # found from the folder even with no checkpoint index at hand


def test_live_points_at_one_live_run_or_is_refused(run, tmp_path):
    _, version, verdict = run
    assert live_from_tensorboard(version.parent).step == verdict.step  # a folder above exactly one live run
    with pytest.raises(ReplayUsageError, match=r"--live '.*nowhere': no such file or folder"):
        live_from_tensorboard(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReplayUsageError, match=r"no live satmon verdict there"):
        live_from_tensorboard(tmp_path / "empty")
    import shutil

    shutil.copytree(version, tmp_path / "two" / "a", ignore=shutil.ignore_patterns("checkpoints"))
    shutil.copytree(version, tmp_path / "two" / "b", ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(ReplayUsageError, match=r"2 live runs there .*pass the one these checkpoints come from"):
        live_from_tensorboard(tmp_path / "two")


def test_the_replay_card_tensorboard_and_json_show_both_readings(run, tmp_path):
    root, version, verdict = run
    replay = satmon.replay(
        version / "checkpoints",
        model="satmon.demos.lit:LitLM",
        data=root / "calib.pt",
        logdir=tmp_path,
        json=tmp_path / "r.json",
        on_note=None,
    )
    replayed_records = list(replay)
    records = json.loads((tmp_path / "r.json").read_text())
    assert len(records) == len(replayed_records) == 3
    for record in records:
        mine = record["replay_of"]
        assert mine["live"]["saturation"] == verdict.saturation and mine["live"]["step"] == verdict.step
    # named after its run
    replayed = read_run(tmp_path / f"replay of {run_name(source_run([version / 'checkpoints']))}")
    assert replay.log_dir == replayed.path.resolve()
    card = replayed.last_text(TAG.verdict_text)  # the last checkpoint's (step 6)
    lines = card.splitlines()
    assert lines[0].startswith("### satmon verdict:") and lines[2].startswith("Replay of `")
    sat6 = next(r["verdict"]["saturation"] for r in records if r["global_step"] == 6)
    assert (
        f"| live window | {verdict.decision.upper()}" in card
        and f"| {verdict.saturation:.4f} | the 4 training steps up to step 4, train mode |" in card
    )
    assert f"| {sat6:.4f} | checkpoint `epoch=0-step=6.ckpt` at step 6, eval mode, calibration batches |" in card
    assert "Why they can differ:" in card
    # the summary: the checkpoint nearest the live verdict's step (4), and the last (6)
    table = [
        line for block in live_lines(replayed_records) for line in block.splitlines() if line.startswith("| replay ")
    ]
    assert [("step=4" in t, "step=6" in t) for t in table] == [(True, False), (False, True)]
    assert not math.isnan(verdict.saturation)


def test_live_that_is_missing_is_a_usage_error_before_any_work(run, tmp_path):
    root, version, _ = run
    with pytest.raises(ReplayUsageError, match=r"^--live '.*nope': no such file or folder"):
        satmon.replay(
            version / "checkpoints",
            model="satmon.demos.lit:LitLM",
            data=root / "calib.pt",
            logdir=tmp_path,
            live=tmp_path / "nope",
        )
    assert list(tmp_path.iterdir()) == []


def test_the_cli_says_a_missing_live_in_one_line(run, tmp_path, capsys):
    root, version, _ = run
    code = main(
        [
            "replay",
            str(version / "checkpoints"),
            "--model",
            "satmon.demos.lit:LitLM",
            "--data",
            str(root / "calib.pt"),
            "--logdir",
            str(tmp_path),
            "--live",
            str(tmp_path / "nope"),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--live" in err and "no such file or folder" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "replay").exists()
