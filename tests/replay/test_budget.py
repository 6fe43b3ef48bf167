"""Bounded work before refusal (issue 36 class 3): files that declare far more than they hold, built here.

Each bomb is inspected in a subprocess whose peak resident memory (``resource.getrusage``) is compared with the same
process's peak before the bomb: a refusal that inflated or allocated what the file declares would show.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from satmon.replaying import checkpoints as ck
from satmon.replaying.budget import BUDGET_ENV, OverBudget, pickle_extent

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _deflate_bomb_fast(path: Path, inflated: int) -> None:
    """The same bomb, its record compressed once (zeros deflate ~1000:1): a file of about ``inflated / 1000`` bytes."""
    torch.save({"model": {"w": torch.zeros(4)}}, path.with_suffix(".src"))
    with (
        zipfile.ZipFile(path.with_suffix(".src")) as src,
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as out,
    ):
        for info in src.infolist():
            if info.filename.endswith("data.pkl"):
                entry = zipfile.ZipInfo(info.filename)
                entry.compress_type = zipfile.ZIP_DEFLATED
                with out.open(entry, "w", force_zip64=True) as w:
                    chunk = bytes(16 << 20)
                    for _ in range(inflated // len(chunk)):
                        w.write(chunk)
            else:
                out.writestr(info, src.read(info), compress_type=zipfile.ZIP_STORED)
    path.with_suffix(".src").unlink()


class _Storage:
    """Stands for a storage in the pickle: ``persistent_id`` turns it into torch's storage id."""

    def __init__(self, numel: int, key: str = "0") -> None:
        self.numel, self.key = numel, key


class _Tensor:
    def __init__(self, numel: int) -> None:
        self.storage = _Storage(numel)

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, (self.storage, 0, (self.storage.numel,), (1,), False, OrderedDict())


def _pickler(f, legacy: bool):
    class P(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _Storage):
                return (
                    ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel, None)
                    if legacy
                    else ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
                )
            return None

    return P(f, protocol=2)


def _zip_storage_claim(path: Path, numel: int) -> None:
    """A torch zip archive whose pickle declares a storage of ``numel`` floats, with a 16-byte record."""
    buf = io.BytesIO()
    _pickler(buf, legacy=False).dump({"model": {"w": _Tensor(numel)}})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", bytes(16))
        z.writestr("archive/version", "3\n")


def _legacy_storage_claim(path: Path, numel: int) -> None:
    """A legacy torch.save file (magic, protocol, system info, the object, its storage keys, the storage's bytes)
    whose pickle declares a storage of ``numel`` floats, 16 bytes of which follow."""
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    with open(path, "wb") as f:
        for obj in (
            MAGIC_NUMBER,
            PROTOCOL_VERSION,
            {
                "protocol_version": PROTOCOL_VERSION,
                "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 8},
            },
        ):
            pickle.dump(obj, f, protocol=2)
        _pickler(f, legacy=True).dump({"model": {"w": _Tensor(numel)}})
        pickle.dump(["0"], f, protocol=2)
        f.write(struct.pack("<q", 4) + bytes(16))


def _legacy_opcode_claim(path: Path, opcode: bytes) -> None:
    """A legacy file whose object pickle holds ``opcode`` declaring 2**40 bytes (``BINBYTES8``, ``BINUNICODE8``,
    a protocol-4 ``FRAME``)."""
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    with open(path, "wb") as f:
        for obj in (MAGIC_NUMBER, PROTOCOL_VERSION, {"little_endian": True}):
            pickle.dump(obj, f, protocol=2)
        f.write(b"\x80\x04" + opcode + struct.pack("<Q", 1 << 40) + b"x" * 64 + b".")


def _safetensors_header_claim(path: Path, n: int) -> None:
    """A sparse ``.safetensors`` file whose header declares ``n`` bytes (the file is that long, and holds nothing)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + b"{")
        f.truncate(n + 8)


BOMBS = {
    "zip-deflate-1GiB": (lambda p: _deflate_bomb_fast(p, GIB), "over satmon's read budget: its record 'bomb/data.pkl'"),
    "zip-storage-claims-1TiB": (
        lambda p: _zip_storage_claim(p, 1 << 38),
        "declares tensor storages of 1,099,511,627,776",
    ),
    "legacy-storage-claims-64GiB": (lambda p: _legacy_storage_claim(p, 1 << 34), "declares tensor storages of"),
    "legacy-binbytes8-1TiB": (lambda p: _legacy_opcode_claim(p, b"\x8e"), "pickle opcode BINBYTES8"),
    "legacy-binunicode8-1TiB": (lambda p: _legacy_opcode_claim(p, b"\x8d"), "pickle opcode BINUNICODE8"),
    "legacy-frame-1TiB": (lambda p: _legacy_opcode_claim(p, b"\x95"), "a pickle FRAME"),
    "safetensors-header-80MiB": (
        lambda p: _safetensors_header_claim(p.with_suffix(".safetensors"), 80 << 20),
        "over satmon's read budget: its JSON header declares 83,886,080 bytes",
    ),
}

_PROBE = """
import resource, sys, torch
from satmon.replaying.checkpoints import inspect_checkpoint
torch.save({"model": {"w": torch.zeros(4)}}, sys.argv[2])
inspect_checkpoint(sys.argv[2])  # the same code path on a small file: the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
info = inspect_checkpoint(sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(after - before)
print(info.error)
"""


@pytest.mark.parametrize("member", list(BOMBS))
def test_a_bomb_is_refused_from_its_declared_sizes_with_a_small_peak(tmp_path, member):
    make, said = BOMBS[member]
    bomb = tmp_path / "bomb.ckpt"
    make(bomb)
    if not bomb.exists():
        bomb = bomb.with_suffix(".safetensors")
    assert bomb.stat().st_blocks * 512 < 4 << 20  # a small (or sparse) file declaring a huge one
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(bomb), str(tmp_path / "small.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    grew_kb, error = done.stdout.strip().split("\n", 1)
    assert said in error, error
    assert int(grew_kb) < 16 * 1024, f"peak grew by {int(grew_kb) / 1024:.0f} MiB"  # KiB on Linux
    if "budget" in error and "record" in error:
        assert f"set {BUDGET_ENV}=N (MiB)" in error  # how to raise it


def test_the_budget_is_said_and_raising_it_reads_the_file(tmp_path, monkeypatch):
    """A legitimate file over a lowered budget is refused naming the variable; raised again, it is read."""
    path = tmp_path / "w.ckpt"
    torch.save(
        {"state_dict": {"w": torch.zeros(2)}, "global_step": 3, "hyper_parameters": {"vocab": ["t"] * 20_000}}, path
    )
    monkeypatch.setenv(BUDGET_ENV, "0.01")
    info = ck.inspect_checkpoint(path)
    assert info.error.startswith("over satmon's read budget: its record 'w/data.pkl'") and "0.01 MiB" in info.error
    assert f"set {BUDGET_ENV}=N (MiB)" in info.error
    monkeypatch.setenv(BUDGET_ENV, "16")
    info = ck.inspect_checkpoint(path)
    assert info.error is None and info.global_step == 3 and len(info.hparams["vocab"]) == 20_000


@pytest.mark.parametrize("value", ["0", "-5", "nan", "lots", "inf"])
def test_a_budget_that_is_not_a_positive_number_is_said(tmp_path, monkeypatch, value):
    path = tmp_path / "w.pt"
    torch.save({"w": torch.zeros(2)}, path)
    monkeypatch.setenv(BUDGET_ENV, value)
    info = ck.inspect_checkpoint(path)
    assert f"Expected {BUDGET_ENV} to be a positive number of MiB" in info.error


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_extent_finds_the_end_of_real_pickles_without_reading_payloads(protocol):
    obj = {"a": [1, 2.5, "x" * 300, b"y" * 70_000, (None, True)], "b": {"c": 10**30}, "d": bytearray(b"z" * 10)}
    raw = pickle.dumps(obj, protocol=protocol)
    assert pickle_extent(io.BytesIO(raw + b"after"), len(raw) + 5, budget=1 << 20) == len(raw)
    with pytest.raises(OverBudget):
        pickle_extent(io.BytesIO(raw), len(raw), budget=1000)


def test_the_data_file_is_checked_against_the_same_budget(tmp_path):
    from satmon.replaying.data import load_data_file
    from satmon.replaying.user_code import ReplayUsageError

    bomb = tmp_path / "calib.pt"
    _zip_storage_claim(bomb, 1 << 38)
    with pytest.raises(ReplayUsageError, match="over satmon's read budget"):
        load_data_file(bomb, 2)


def test_calibrate_text_inputs_are_sized_before_they_are_read(tmp_path):
    """A 1 TB sparse file named like replay records is refused by its size, not read (satmon calibrate)."""
    from satmon.calibrate.fit import CalibrationError, read_text

    huge = tmp_path / "runs.json"
    with open(huge, "wb") as f:
        f.truncate(1 << 40)
    with pytest.raises(CalibrationError, match=r"of at most 256 MiB .* got 1,099,511,627,776 bytes"):
        read_text(huge, "replay records (JSON or JSONL)")
