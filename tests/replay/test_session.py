"""``satmon.replay(paths, ...)``: the replay as a library call. Records checked against a float32-product recount of a
hand-built model, the rule carried from the Settings to the records and the report, the live run's calibration file
used as data, usage errors before any write, and one writer per output (a lock held in this process, a killed
holder's stale lock, and two real processes racing on the same outputs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import satmon
from satmon import Settings
from satmon.dyt import DyT
from satmon.io.lock import exclusive, lock_path
from satmon.replaying.user_code import ReplayUsageError

ALPHAS = {10: 0.5, 20: 2.0, 30: 4.0}  # a step -> the DyT's alpha saved at that step
FACTORY = """
import os, time, torch
from satmon.dyt import DyT

def build():
    wait = os.environ.get("REPLAY_WAIT")
    if wait and torch.empty(0).device.type != "meta":  # a real build (not the meta check): wait for the go file
        start = time.time()
        while not os.path.exists(wait) and time.time() - start < 60:
            time.sleep(0.05)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), DyT(8))
"""


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 8), DyT(8))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Three plain state_dict checkpoints of one Linear -> DyT model (alpha 0.5, 2, 4) and one calibration batch."""
    root = tmp_path_factory.mktemp("session")
    ckpts = root / "ckpts"
    ckpts.mkdir()
    torch.manual_seed(0)
    net = _net()
    for step, alpha in ALPHAS.items():
        with torch.no_grad():
            net[1].alpha.fill_(alpha)
        torch.save({"model": net.state_dict(), "iter_num": step}, ckpts / f"step{step}.pt")
    batch = torch.randn(16, 8)
    torch.save([batch], root / "calib.pt")
    (root / "build.py").write_text(FACTORY)
    return root, ckpts, net, batch


def _recount(net: torch.nn.Module, batch: torch.Tensor, alpha: float) -> float:
    """The pooled saturation of the DyT: |alpha * h| > 2 over the Linear's output h, counted in float64."""
    with torch.no_grad():
        h = net[0](batch)
        product = torch.tensor(alpha, dtype=torch.float32) * h  # the product as the layer computes it
    return float((product.abs() > 2).double().mean())


def test_the_python_entry_yields_one_record_per_checkpoint_matching_a_recount(folder, tmp_path):
    root, ckpts, net, batch = folder
    notes = []
    run = satmon.replay(
        ckpts,
        factory=_net,
        data=root / "calib.pt",
        device="cpu",
        twin=False,
        logdir=tmp_path / "tb",
        json=tmp_path / "r.json",
        on_note=notes.append,
    )
    records = list(run)
    assert [r.global_step for r in records] == [10, 20, 30] and all(r.error is None for r in records)
    for record in records:
        assert record.verdict.saturation == pytest.approx(_recount(net, batch, ALPHAS[record.global_step]), abs=1e-12)
        assert record.verdict.threshold == satmon.study.THRESHOLD and record.verdict.rule.threshold_source == "study"
    written = json.loads((tmp_path / "r.json").read_text())
    assert [w["global_step"] for w in written] == [10, 20, 30] and not (tmp_path / "r.json.partial.jsonl").exists()
    assert run.json_written == tmp_path / "r.json" and run.log_dir.parent == (tmp_path / "tb" / "replay").resolve()
    assert not lock_path(tmp_path / "r.json", folder=False).exists()  # released at the end
    assert notes == []


def test_the_settings_rule_reaches_every_record_and_the_report(folder, tmp_path):
    pytest.importorskip("matplotlib")
    root, ckpts, _, batch = folder
    run = satmon.replay(
        ckpts,
        factory=_net,
        data=[batch],
        settings=Settings(threshold=0.3),
        device="cpu",
        twin=False,
        report=tmp_path / "r.md",
    )
    records = list(run)
    assert {(r.verdict.threshold, r.verdict.rule.threshold_source) for r in records} == {(0.3, "user")}
    text = (tmp_path / "r.md").read_text()
    assert "GO threshold 0.3 on pooled saturation" in text and run.log_dir is None  # no logdir: no TensorBoard run


def test_the_live_runs_calibration_file_is_the_data_when_none_is_given(folder, tmp_path):
    root, ckpts, net, batch = folder
    run_dir = tmp_path / "run"
    (run_dir / "ckpts").mkdir(parents=True)
    for f in ckpts.iterdir():
        (run_dir / "ckpts" / f.name).write_bytes(f.read_bytes())
    torch.save([batch], run_dir / "ckpts" / "satmon_calibration.pt")
    notes = []
    run = satmon.replay(run_dir / "ckpts", factory=_net, device="cpu", twin=False, on_note=notes.append)
    records = list(run)
    assert [r.global_step for r in records] == [10, 20, 30]  # the calibration file is data, not a checkpoint
    assert records[1].verdict.saturation == pytest.approx(_recount(net, batch, ALPHAS[20]), abs=1e-12)
    assert "satmon_calibration.pt" in run.data_text
    assert len(notes) == 1 and "satmon_calibration.pt" in notes[0] and "pass --data or --datamodule" in notes[0]
    with pytest.raises(ReplayUsageError, match="No calibration data"):
        satmon.replay(ckpts, factory=_net, device="cpu")  # none there: said, before any work


def test_a_usage_error_is_raised_before_anything_is_written(folder, tmp_path):
    root, ckpts, _, _ = folder
    with pytest.raises(ReplayUsageError, match="Pass --model MODULE:CLASS"):
        satmon.replay(ckpts, data=root / "calib.pt", logdir=tmp_path / "tb", json=tmp_path / "out" / "r.json")
    with pytest.raises(ReplayUsageError, match=r"does not build the checkpoints' model"):
        satmon.replay(
            ckpts,
            factory=lambda: torch.nn.Linear(3, 3),
            data=root / "calib.pt",
            logdir=tmp_path / "tb",
            json=tmp_path / "out" / "r.json",
        )
    assert list(tmp_path.iterdir()) == []


def test_an_output_another_writer_holds_is_refused_naming_it_and_left_alone(folder, tmp_path):
    root, ckpts, _, _ = folder
    target = tmp_path / "r.json"
    partial = tmp_path / "r.json.partial.jsonl"
    partial.write_text('{"theirs": 1}\n')
    with exclusive(target, "--json", folder=False):
        with pytest.raises(ReplayUsageError, match=rf"--json .*r\.json to be free, got it in use by pid {os.getpid()}"):
            satmon.replay(ckpts, factory=_net, data=root / "calib.pt", device="cpu", json=target)
    assert partial.read_text() == '{"theirs": 1}\n' and not target.exists()


def _python(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def test_a_killed_holders_stale_lock_is_taken_over_and_said(folder, tmp_path):
    root, ckpts, _, _ = folder
    target = tmp_path / "r.json"
    killed = _python(
        "import os, signal, sys\nfrom satmon.io.lock import exclusive\n"
        f"held = exclusive({str(target)!r}, '--json', folder=False)\nheld.__enter__()\n"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL and lock_path(target, folder=False).exists()
    notes = []
    list(
        satmon.replay(
            ckpts, factory=_net, data=root / "calib.pt", device="cpu", twin=False, json=target, on_note=notes.append
        )
    )
    assert len(json.loads(target.read_text())) == 3
    assert any("took over a stale lock" in n and f"pid {killed.pid}" in n for n in notes), notes


def test_two_replays_racing_on_the_same_outputs_never_share_them(folder, tmp_path):
    """Two real processes: the second told to write the first's --json is refused (exit 2, the holder named) and leaves
    its partial records alone; one told to write the same --logdir/--name gets a TensorBoard run of its own."""
    root, ckpts, _, _ = folder
    go = tmp_path / "go"
    cli = [
        sys.executable,
        "-m",
        "satmon.cli.main",
        "replay",
        str(ckpts),
        "--factory",
        f"{root / 'build.py'}:build",
        "--data",
        str(root / "calib.pt"),
        "--logdir",
        str(tmp_path / "tb"),
        "--name",
        "race",
        "--device",
        "cpu",
        "--no-twin",
        "--quiet",
    ]
    first = subprocess.Popen(
        [*cli, "--json", str(tmp_path / "r.json")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REPLAY_WAIT": str(go)},
    )
    try:
        partial = tmp_path / "r.json.partial.jsonl"
        start = time.time()
        while not partial.exists() and first.poll() is None and time.time() - start < 120:
            time.sleep(0.05)
        assert partial.exists(), first.communicate()
        inode = os.stat(partial).st_ino
        second, third = (
            subprocess.Popen(
                [*cli, "--json", str(tmp_path / name)],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in ("r.json", "other.json")
        )
        (_, second_err), (third_out, third_err) = second.communicate(timeout=120), third.communicate(timeout=120)
        assert second.returncode == 2, second_err
        assert f"in use by pid {first.pid}" in second_err and "earlier interrupted replay" not in second_err
        assert os.stat(partial).st_ino == inode and first.poll() is None  # the first's file, untouched
        assert third.returncode == 0, third_err
    finally:
        go.touch()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    runs = sorted(p.name for p in (tmp_path / "tb" / "race").iterdir() if p.is_dir())
    assert runs == ["version_0", "version_1"]  # one run each, never one run with both replays' events
    mine = {
        line.split("TensorBoard run: ")[1].split()[0]
        for line in (out + third_out).splitlines()
        if line.startswith("TensorBoard run: ")
    }
    assert len(mine) == 2
    assert (
        len(json.loads((tmp_path / "r.json").read_text())) == 3
        and len(json.loads((tmp_path / "other.json").read_text())) == 3
    )


def test_a_run_folder_taken_between_the_listing_and_the_mkdir_goes_to_the_next_version(tmp_path, monkeypatch):
    """The race two replays into one --logdir/--name ran: both listed no version_0 and both wrote there."""
    from satmon.io import tensorboard_replay as tbr

    (tmp_path / "replay" / "version_0").mkdir(parents=True)  # made by another process after our listing
    (tmp_path / "replay" / "version_0" / "theirs").write_text("x")
    real, calls = tbr.next_version, []

    def listed_before_the_other_mkdir(root):
        calls.append(root)
        return 0 if len(calls) == 1 else real(root)

    monkeypatch.setattr(tbr, "next_version", listed_before_the_other_mkdir)
    run = tbr.claim_run_folder(tmp_path, "replay")
    assert Path(run).name == "version_1" and len(calls) == 2
    assert os.listdir(tmp_path / "replay" / "version_0") == ["theirs"]


def test_a_replay_stopped_early_leaves_the_json_as_it_was_and_keeps_its_records(folder, tmp_path):
    root, ckpts, _, _ = folder
    target = tmp_path / "r.json"
    target.write_text('["the records of an earlier, complete replay"]')
    before = target.read_bytes()
    with satmon.replay(ckpts, factory=_net, data=root / "calib.pt", device="cpu", twin=False, json=target) as run:
        first = next(iter(run))
    assert first.global_step == 10 and target.read_bytes() == before and run.json_written is None
    kept = (tmp_path / "r.json.partial.jsonl").read_text().splitlines()
    assert [json.loads(line)["global_step"] for line in kept] == [10]
    assert run.stopped("interrupted (Ctrl-C)") == (
        f"satmon replay: interrupted (Ctrl-C) after 1 of 3 checkpoint(s): {target} was left as it "
        "was; the 1 new record(s) "
        f"are in {tmp_path / 'r.json.partial.jsonl'}."
    )
    with exclusive(target, "--json", folder=False):  # released: another writer may take it now
        pass


def test_batches_given_as_a_tensor_are_split_by_batch_size_not_into_rows(folder):
    root, ckpts, net, batch = folder
    run = satmon.replay(ckpts, factory=_net, data=batch, batch_size=8, device="cpu", twin=False)
    records = list(run)
    assert run.batches[0].shape == (8, 8) and len(run.batches) == 2  # two batches of 8 rows, pooled: the 16 rows
    assert records[2].verdict.saturation == pytest.approx(_recount(net, batch, ALPHAS[30]), abs=1e-12)
    with pytest.raises(ReplayUsageError, match="Expected data to be a file, a tensor, a dict of tensors or a list"):
        satmon.replay(ckpts, factory=_net, data=3.5, device="cpu")


def test_a_full_disk_mid_replay_raises_and_leaves_the_json_and_the_complete_records(folder, tmp_path, monkeypatch):
    import errno

    from satmon.io.jsonl import PartialRecords

    root, ckpts, _, _ = folder
    target = tmp_path / "r.json"
    target.write_text("[]")
    real = PartialRecords.add

    def add(self, record):
        if self.count == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real(self, record)

    monkeypatch.setattr(PartialRecords, "add", add)
    run = satmon.replay(ckpts, factory=_net, data=root / "calib.pt", device="cpu", twin=False, json=target)
    with pytest.raises(OSError, match="No space left on device"):
        list(run)
    assert target.read_text() == "[]" and run.done == 2
    assert [json.loads(x)["global_step"] for x in (tmp_path / "r.json.partial.jsonl").read_text().splitlines()] == [
        10,
        20,
    ]
    with exclusive(target, "--json", folder=False):  # the lock went with the failure
        pass
