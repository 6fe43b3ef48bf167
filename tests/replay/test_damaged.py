"""Damaged checkpoints and unreadable folders, one layer below the CLI (issue 30).

``torch.load`` checks no checksum; satmon checks every zip record it reads against its CRC-32. Each test damages a
real ``torch.save`` file the way a bad copy or a failing disk does and asserts what is read, what is refused and
that a file changed underneath is still said as changed, not as damaged.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from satmon.replaying.checkpoints import inspect_checkpoint, state_dict_of
from satmon.replaying.data import load_data_file
from satmon.replaying.file_info import CorruptFile, FileChanged, FileStamp
from satmon.replaying.formats.torch_file import copy_tensors, load_index
from satmon.replaying.listing import list_checkpoints
from satmon.replaying.user_code import ReplayUsageError

ROOT = Path(__file__).resolve().parents[2]


def _record(path: Path, which: str) -> tuple[int, int]:
    """(data offset, size) of the zip record whose name ends with ``which``."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(which))
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        n, m = struct.unpack("<HH", f.read(30)[26:30])
    return info.header_offset + 30 + n + m, info.file_size


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def weights(tmp_path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "w.pt"
    torch.save({"model": {"a": torch.randn(64, 64), "b": torch.randn(32)}, "iter_num": 5}, path)
    return path


def test_an_intact_file_reads_back_bit_for_bit(weights):
    sd = state_dict_of(inspect_checkpoint(weights))
    ref = torch.load(weights, weights_only=True)["model"]
    assert all(torch.equal(sd[k], ref[k]) for k in ref)


@pytest.mark.parametrize("which", ["data/0", "data/1"])
def test_one_flipped_bit_in_a_tensor_is_caught_naming_its_record(weights, which):
    at, size = _record(weights, which)
    _flip(weights, at + size // 2)
    assert torch.load(weights, weights_only=True)["model"]  # torch reads it without a word
    info = inspect_checkpoint(weights)  # the index (the pickle) is intact
    assert info.error is None
    with pytest.raises(
        CorruptFile,
        match=rf"corrupt: the bytes of 1 tensor record\(s\) \({which}\) do not match the "
        r"CRC-32 its zip directory records",
    ):
        state_dict_of(info)


def test_a_damaged_pickle_is_caught_before_torch_unpickles_it(weights):
    at, size = _record(weights, "data.pkl")
    _flip(weights, at + size - 3)
    info = inspect_checkpoint(weights)
    assert info.error.startswith("corrupt: the bytes of its record 'w/data.pkl' do not match the CRC-32")
    assert info.checkpoint is None


def test_a_file_changed_underneath_is_said_as_changed_not_as_damaged(weights):
    stamp = FileStamp.of(weights)
    index = load_index(stamp, trust=False)
    at, size = _record(weights, "data/0")
    _flip(weights, at)
    st = os.stat(weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(FileChanged, match="changed"):
        copy_tensors(index, stamp)


def test_a_damaged_data_file_is_refused_before_any_work(tmp_path):
    path = tmp_path / "calib.pt"
    torch.save([torch.randint(0, 256, (4, 16)) for _ in range(2)], path)
    at, size = _record(path, "data/0")
    _flip(path, at + 1)
    with pytest.raises(ReplayUsageError, match=r"--data .*corrupt: the bytes of its record '.*data/0' do not match"):
        load_data_file(path, 2)


def test_a_legacy_file_and_safetensors_are_read_though_they_record_no_checksum(tmp_path):
    from safetensors.torch import save_file

    sd = {"a": torch.randn(8, 8)}
    torch.save({"model": sd}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    save_file(sd, str(tmp_path / "w.safetensors"))
    for name in ("old.pt", "w.safetensors"):
        info = inspect_checkpoint(tmp_path / name)
        assert info.error is None and torch.equal(state_dict_of(info)["a"], sd["a"])
        assert [w.layout for w in info.weights] == ["legacy" if name == "old.pt" else "safetensors"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads every file and folder")
def test_modes_000_and_r_are_an_incomplete_replay_for_an_ordinary_user(tmp_path):
    """For real, as an ordinary user (CI): a folder of mode 000, one of mode r-- and a file of mode 000."""
    torch.save({"model": {"a": torch.randn(4)}}, tmp_path / "ok.pt")
    for name, mode in (("locked", 0o000), ("listed", 0o444)):
        (tmp_path / name).mkdir()
        torch.save({"model": {"a": torch.randn(4)}}, tmp_path / name / "in.pt")
        os.chmod(tmp_path / name, mode)
    (tmp_path / "secret.pt").write_bytes((tmp_path / "ok.pt").read_bytes())
    os.chmod(tmp_path / "secret.pt", 0)
    try:
        listing = list_checkpoints([tmp_path])
        unread = {p.name: why for p, why in listing.unread()}
        assert unread["locked"].startswith("cannot read the folder") and unread["in.pt"].startswith("cannot stat it")
        assert inspect_checkpoint(tmp_path / "secret.pt").error.startswith("cannot read it: PermissionError")
    finally:
        for name in ("locked", "listed"):
            os.chmod(tmp_path / name, 0o755)
        os.chmod(tmp_path / "secret.pt", 0o644)


def test_a_fifo_named_like_a_checkpoint_is_never_opened(tmp_path):
    """Listed as not a regular file, and inspected without blocking even when it replaced a file since the listing."""
    torch.save({"model": {"a": torch.randn(4)}}, tmp_path / "a.pt")
    os.mkfifo(tmp_path / "b.pt")
    listing = list_checkpoints([tmp_path])
    assert [p.name for p in listing.paths] == ["a.pt"] and ("b.pt", "a FIFO (named pipe): not read") in [
        (p.name, w) for p, w in listing.left_out
    ]
    code = (
        "import sys; from satmon.replaying.checkpoints import inspect_checkpoint; "
        f"print(inspect_checkpoint({str(tmp_path / 'b.pt')!r}).error)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.strip() == "a FIFO (named pipe): not read", done.stderr
