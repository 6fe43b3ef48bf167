"""Reading checkpoint files that may change underneath: the index holds no tensor data, the tensors are
copied with plain reads and equal ``torch.load``'s, a change at any point is named, a file that shrinks
between the check and the read gives a clean error (never SIGBUS), archives rewritten by another zip tool
are read from their directory, safetensors headers are parsed without the library."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

from satmon.replaying.file_info import FileChanged, FileStamp
from satmon.replaying.formats import torch_file as reading
from satmon.replaying.formats.safetensors import SafetensorsIndex
from satmon.replaying.formats.torch_file import copy_tensors, load_index, meta_tensors


def _checkpoint() -> dict:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 5, generator=g)
    return {
        "state_dict": {
            "w": w,
            "tied": w,
            "view": torch.arange(12.0)[3:9].view(2, 3),
            "t": w.t(),
            "half": torch.randn(4, generator=g).half(),
            "bf": torch.randn(3, generator=g).bfloat16(),
            "flags": torch.tensor([True, False]),
            "empty": torch.zeros(0, 3),
            "ids": torch.arange(5),
        },
        "global_step": torch.tensor(7),
        "nested": [1, (torch.ones(2), "x"), {"deep": torch.full((2,), 3.0)}],
        "optimizer_states": [{"exp_avg": torch.ones(1000)}],
    }


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


def _data_offset(path, key: str) -> tuple[int, int]:
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(f"/data/{key}"))
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        n, m = struct.unpack("<HH", f.read(30)[26:30])
    return info.header_offset + 30 + n + m, info.file_size


def test_index_holds_no_data_and_the_copy_equals_torch_load(tmp_path):
    path = tmp_path / "c.pt"
    torch.save(_checkpoint(), path)
    want = torch.load(path, weights_only=True)
    stamp = FileStamp.of(path)
    index = load_index(stamp, trust=False)
    assert all(t.is_meta for t in meta_tensors(index)) and len(meta_tensors(index)) == 13
    got = copy_tensors(index, stamp, skip=("optimizer_states",))
    for k, v in want["state_dict"].items():
        assert _same(got["state_dict"][k], v), k
    assert got["state_dict"]["w"].data_ptr() == got["state_dict"]["tied"].data_ptr()  # tied tensors stay tied
    assert int(got["global_step"]) == 7 and _same(got["nested"][1][0], torch.ones(2)) and got["nested"][1][1] == "x"
    assert _same(got["nested"][2]["deep"], want["nested"][2]["deep"])
    assert got["optimizer_states"][0]["exp_avg"].is_meta  # left unread


def test_archive_rewritten_by_another_zip_tool_is_read_from_its_directory(tmp_path):
    torch.save(_checkpoint(), tmp_path / "c.pt")
    with zipfile.ZipFile(tmp_path / "c.pt") as zi, zipfile.ZipFile(tmp_path / "r.pt", "w") as zo:
        for info in zi.infolist():
            zo.writestr(info.filename, zi.read(info.filename))
    stamp = FileStamp.of(tmp_path / "r.pt")
    index = load_index(stamp, trust=False)
    got = copy_tensors(index, stamp)
    want = torch.load(tmp_path / "r.pt", weights_only=True)
    for k, v in want["state_dict"].items():
        assert _same(got["state_dict"][k], v), k
    assert _same(got["optimizer_states"][0]["exp_avg"], torch.ones(1000))


@pytest.mark.parametrize("change", ["truncated", "rewritten-same-size", "replaced", "deleted"])
def test_a_file_changed_after_its_listing_is_named_not_read(tmp_path, change):
    path = tmp_path / "c.pt"
    torch.save(_checkpoint(), path)
    stamp = FileStamp.of(path)
    index = load_index(stamp, trust=False)
    offset, size = _data_offset(path, "0")
    if change == "truncated":
        os.truncate(path, offset + size // 2)
    elif change == "rewritten-same-size":  # new bytes under the old index: NaN where the weights were
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(struct.pack("<f", float("nan")) * (size // 4))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock may not tick between writes
    elif change == "replaced":
        os.replace(tmp_path / "c.pt", tmp_path / "old.pt")
        torch.save(_checkpoint(), path)
    else:
        path.unlink()
    with pytest.raises(FileChanged, match="changed since it was listed") as e:
        copy_tensors(index, stamp)
    said = {
        "truncated": "bytes",
        "rewritten-same-size": "modified",
        "replaced": "replaced by another file",
        "deleted": "deleted",
    }[change]
    assert said in str(e.value) and "skipped" in str(e.value)


def test_a_file_that_shrinks_between_the_check_and_the_read_fails_cleanly_without_sigbus(tmp_path):
    """The race a stamp cannot close: the file is cut right after the last check. Plain reads return short;
    a memory-mapped read (satmon 0.2) would have killed the process with SIGBUS (exit -7)."""
    path = tmp_path / "c.pt"
    torch.save({"state_dict": {"w": torch.randn(256, 1024)}}, path)
    script = textwrap.dedent(f"""
        import os, sys
        from satmon.replaying.formats import torch_file as reading
        stamp = reading.FileStamp.of({str(path)!r})
        index = reading.load_index(stamp, trust=False)
        real_records = reading._zip_records
        def records_then_cut(p):  # the directory is read, then a writer truncates the file
            out = real_records(p)
            os.truncate(p, 4096)
            return out
        reading._zip_records = records_then_cut
        reading.FileStamp.check = lambda self, *a, **k: None  # the cut lands after every check
        try:
            reading.copy_tensors(index, stamp)
        except reading.FileChanged as e:
            print("FileChanged:", e)
            sys.exit(0)
        sys.exit(5)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "changed while it was being read (it ends at byte" in done.stdout


def test_a_legacy_file_index_keeps_no_tensor_in_memory(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"state_dict": {"w": torch.randn(512, 512)}, "step": 3}, path, _use_new_zipfile_serialization=False)
    index = load_index(FileStamp.of(path), trust=False)
    assert index["step"] == 3 and index["state_dict"]["w"].is_meta and index["state_dict"]["w"].shape == (512, 512)
    whole = reading.load_whole(FileStamp.of(path), trust=False)
    assert torch.equal(whole["state_dict"]["w"], torch.load(path, weights_only=True)["state_dict"]["w"])


def test_containers_deeper_than_the_limit_are_not_searched_and_do_not_recurse():
    deep: list = [torch.empty(2, device="meta")]
    for _ in range(60_000):
        deep = [deep]
    assert meta_tensors({"w": torch.empty(1, device="meta"), "deep": deep}) != []  # no RecursionError
    assert len(meta_tensors({"deep": deep})) == 0


def test_safetensors_index_and_tensors_equal_the_library(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    weights = {
        "w": torch.randn(4, 3),
        "h": torch.randn(5).half(),
        "b": torch.randn(2).bfloat16(),
        "i": torch.arange(3),
        "e": torch.zeros(0, 2),
    }
    st.save_file(weights, str(tmp_path / "w.safetensors"), metadata={"format": "pt"})
    stamp = FileStamp.of(tmp_path / "w.safetensors")
    index = SafetensorsIndex.read(stamp)
    assert index.metadata == {"format": "pt"}
    assert {k: (v.dtype, v.shape) for k, v in index.meta().items()} == {
        k: (v.dtype, v.shape) for k, v in weights.items()
    }
    got, want = index.tensors(stamp), st.load_file(str(tmp_path / "w.safetensors"))
    assert got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b[:8] + b"[1, 2]" + b[14:], "not a safetensors file"),
        (lambda b: b[: len(b) - 4], "truncated or corrupt safetensors file"),
    ],
)
def test_safetensors_header_that_lies_is_refused(tmp_path, edit, message):
    st = pytest.importorskip("safetensors.torch")
    st.save_file({"w": torch.randn(4, 3)}, str(tmp_path / "w.safetensors"))
    (tmp_path / "w.safetensors").write_bytes(edit((tmp_path / "w.safetensors").read_bytes()))
    with pytest.raises(ValueError, match=message):
        SafetensorsIndex.read(FileStamp.of(tmp_path / "w.safetensors"))


def test_stamp_reads_changes_in_words(tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"1234")
    stamp = FileStamp.of(f)
    assert stamp.difference() is None
    stamp.check()
    f.write_bytes(b"12")
    assert stamp.difference().startswith("size 4 -> 2 bytes")
    with pytest.raises(FileChanged, match="a job may be writing it"):
        stamp.check()
    assert reading.MAX_DEPTH >= 8


def test_an_archive_of_the_other_byte_order_is_refused_before_torch_reads_it(tmp_path):
    """torch's meta load byte-swaps storages that hold no data and kills the process (SIGSEGV): the
    index refuses such an archive first, with what to do (run in a child: a regression must not kill pytest)."""
    other = "big" if sys.byteorder == "little" else "little"
    script = textwrap.dedent(f"""
        import os, sys, zipfile, torch
        from satmon.replaying.formats import torch_file as reading
        a, b = os.path.join({str(tmp_path)!r}, "a.pt"), os.path.join({str(tmp_path)!r}, "b.pt")
        torch.save({{"w": torch.arange(4.0)}}, a)
        with zipfile.ZipFile(a) as zi, zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as zo:
            for i in zi.infolist():
                zo.writestr(i, {other!r}.encode() if i.filename.endswith("/byteorder") else zi.read(i.filename))
        try:
            reading.load_index(reading.FileStamp.of(b), trust=False)
        except ValueError as e:
            print("ValueError:", e)
            sys.exit(0)
        sys.exit(5)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert f"written on a {other}-endian machine" in done.stdout and "re-save it with torch.save" in done.stdout
