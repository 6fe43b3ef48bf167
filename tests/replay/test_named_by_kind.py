"""A checkpoint's fault is named by its kind and its cause: a DCP folder missing shards names them, a compressed file or
an archive saved as a checkpoint says what it is and the command that unpacks it (run here, as written), a metadata
file over the read budget says its size, the budget and the variable, and satmon's calibration file is checked (its
kind, and its token ids against the model) before the first checkpoint, named, instead of every checkpoint being
blamed."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import shutil
import subprocess
import tarfile
import warnings

import pytest
import torch
from torch import nn

import satmon
from satmon.replaying.checkpoints import inspect_checkpoint
from satmon.replaying.listing import list_checkpoints
from satmon.replaying.user_code import ReplayUsageError


def _dcp(folder, tensors):
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(tensors, checkpoint_id=str(folder), no_dist=True)


@pytest.mark.parametrize("lost", ["__0_0.distcp", "all"])
def test_a_dcp_folder_missing_its_shards_is_dcp_and_names_them(tmp_path, lost):
    folder = tmp_path / "step10"
    _dcp(folder, {"model": {"w": torch.arange(4.0)}, "step": 10})
    shards = sorted(p.name for p in folder.glob("*.distcp"))
    assert shards == ["__0_0.distcp"]
    for name in shards:
        (folder / name).unlink()
    listing = list_checkpoints([tmp_path])
    assert listing.paths == [folder]  # recognised by its .metadata, not "nothing to replay"
    error = inspect_checkpoint(folder, stamps=listing.stamps[folder]).error
    assert error.startswith("incomplete DCP folder: its .metadata names 1 shard(s), 1 missing")
    assert "'__0_0.distcp'" in error


def test_a_dcp_folder_of_two_shards_missing_one_names_that_one(tmp_path):
    folder = tmp_path / "ckpt"
    _dcp(folder, {"model": {"w": torch.arange(4.0)}})
    (folder / "__0_0.distcp").rename(folder / "__1_0.distcp")  # the folder now holds a shard .metadata does not name
    info = inspect_checkpoint(folder)
    assert "1 missing from the folder ('__0_0.distcp')" in info.error


def test_a_stray_metadata_file_beside_a_checkpoint_does_not_make_a_dcp_folder(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "last.ckpt")
    (tmp_path / ".metadata").write_bytes(b"another tool's")
    assert list_checkpoints([tmp_path]).paths == [tmp_path / "last.ckpt"]


def _raw(tmp_path):
    raw = tmp_path / "raw.pt"
    torch.save({"model": {"w": torch.arange(3.0)}, "iter_num": 3}, raw)
    return raw


def _unpacked_command(error: str) -> str:
    return re.search(r"`(.+)`$", error).group(1)


@pytest.mark.parametrize("pack", ["gzip", "tar", "tar.gz"])
def test_a_packed_checkpoint_is_named_and_its_unpack_command_runs_as_written(tmp_path, pack):
    raw = _raw(tmp_path)
    packed = tmp_path / "my run" / "w.pt"  # a space: the command is quoted
    packed.parent.mkdir()
    if pack == "gzip":
        packed.write_bytes(gzip.compress(raw.read_bytes()))
    else:
        with tarfile.open(packed, "w:gz" if pack == "tar.gz" else "w") as t:
            t.add(raw, arcname="raw.pt")
    error = inspect_checkpoint(packed).error
    what = {
        "gzip": "a gzip-compressed file",
        "tar": "a tar archive",
        "tar.gz": "a gzip-compressed tar archive (.tar.gz)",
    }
    assert error.startswith(f"not a PyTorch checkpoint: {what[pack]}; unpack it and replay what it holds: `")
    tool = "gunzip" if pack == "gzip" else "tar"
    if shutil.which(tool) is None:
        pytest.skip(f"no {tool} here to run the command")
    subprocess.run(_unpacked_command(error), shell=True, check=True, cwd=tmp_path)
    out = packed.with_name("w-unpacked.pt") if pack == "gzip" else packed.with_name("w-unpacked") / "raw.pt"
    info = inspect_checkpoint(out)
    assert info.error is None and info.global_step == 3


@pytest.mark.parametrize(
    ("compress", "what"), [(bz2.compress, "a bzip2-compressed file"), (lzma.compress, "an xz-compressed file")]
)
def test_other_compressions_are_named_too(tmp_path, compress, what):
    raw = _raw(tmp_path)
    for name in ("w.ckpt", "w.safetensors"):
        (tmp_path / name).write_bytes(compress(raw.read_bytes()))
        assert inspect_checkpoint(tmp_path / name).error.startswith(f"not a PyTorch checkpoint: {what}; unpack it")


def test_a_trainer_state_over_the_read_budget_names_its_size_the_budget_and_the_variable(tmp_path, monkeypatch):
    st = pytest.importorskip("safetensors.torch")
    folder = tmp_path / "checkpoint-40"
    folder.mkdir()
    st.save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    (folder / "trainer_state.json").write_text('{"global_step": 40, "log_history": [' + "0, " * 2000 + "0]}")
    monkeypatch.setenv("SATMON_MAX_PICKLE_MB", "0.004")  # 4,194 bytes: the file stands for a 1 TiB one
    info = inspect_checkpoint(folder)
    size = (folder / "trainer_state.json").stat().st_size
    assert info.error is None and info.global_step == 40  # the folder's name still gives the step
    (note,) = info.notes
    assert f"trainer_state.json is {size:,} bytes, over the 0.004 MiB" in note and "set SATMON_MAX_PICKLE_MB=N" in note


class _Tiny(nn.Module):
    """A language model whose token table has 16 ids; its position table (64) is larger."""

    def __init__(self, input_embeddings: bool = False) -> None:
        super().__init__()
        self.tok = nn.Embedding(16, 8)
        self.pos = nn.Embedding(64, 8)
        self.norm = nn.LayerNorm(8)
        if input_embeddings:
            self.get_input_embeddings = lambda: self.tok

    def forward(self, ids):
        return self.norm(self.tok(ids) + self.pos(torch.arange(ids.shape[1])))


def _run_folder(tmp_path, ids, name="satmon_calibration.pt"):
    torch.manual_seed(0)
    torch.save({"model": _Tiny().state_dict(), "iter_num": 2}, tmp_path / "w.pt")
    torch.save(ids, tmp_path / name)
    return tmp_path


def test_a_calibration_file_from_another_model_is_named_before_the_first_checkpoint(tmp_path):
    folder = _run_folder(tmp_path, torch.tensor([[3, 70, 1]]))  # 70: past both tables
    with pytest.raises(ReplayUsageError) as caught:
        satmon.replay(folder, factory=_Tiny, twin=False, device="cpu", on_note=None)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'satmon_calibration.pt'} (satmon's calibration batches, found beside")
    assert "token ids up to 70, past the model's vocabulary of 64 (nn.Embedding pos" in message
    assert "another model's" in message and "checkpoint(s) skipped" not in message


def test_data_given_is_checked_against_the_table_the_model_names(tmp_path):
    folder = _run_folder(tmp_path, torch.tensor([[3, 40]]), name="calib.pt")  # 40: past the token table only
    with pytest.raises(
        ReplayUsageError,
        match=r"--data .*calib.pt: its batches feed token ids up to 40, past the "
        r"model's vocabulary of 16 \(nn.Embedding tok",
    ):
        satmon.replay(
            folder,
            factory=lambda: _Tiny(input_embeddings=True),
            data=folder / "calib.pt",
            twin=False,
            device="cpu",
            on_note=None,
        )


def test_ids_inside_the_vocabulary_replay(tmp_path):
    folder = _run_folder(tmp_path, torch.tensor([[3, 15, 0]]))
    (record,) = list(satmon.replay(folder, factory=_Tiny, twin=False, device="cpu", on_note=None))
    assert record.error is None and record.global_step == 2


@pytest.mark.parametrize("kind", ["fifo", "folder", "broken-link"])
def test_a_calibration_name_that_is_not_a_file_is_named_by_kind(tmp_path, kind):
    torch.save({"model": _Tiny().state_dict()}, tmp_path / "w.pt")
    odd = tmp_path / "satmon_calibration.pt"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "folder":
        odd.mkdir()
    else:
        odd.symlink_to(tmp_path / "gone.pt")
    said = {"fifo": "a FIFO (named pipe)", "folder": "a folder", "broken-link": "a broken symlink"}[kind]
    with pytest.raises(
        ReplayUsageError,
        match=f"No calibration data: '{re.escape(str(odd))}' has the name of satmon's "
        f"calibration batches but is {re.escape(said)}",
    ):
        satmon.replay(tmp_path, factory=_Tiny, twin=False, device="cpu", on_note=None)
