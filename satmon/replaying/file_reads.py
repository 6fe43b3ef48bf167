"""Reading checkpoint files that may change while they are replayed, without ever mapping them.

A training job may rewrite ``last.ckpt`` (or any checkpoint) while its folder is replayed. A file
that is memory-mapped and then shrinks kills the process with SIGBUS; one rewritten in place is read
as new bytes under the old index (a false "non-finite"). So satmon never maps a checkpoint:

* the listing records each file's :class:`FileStamp` (size, modification time, inode, device);
* inspection reads the index only: ``torch.load(map_location="meta")`` unpickles the pickle
  (once: the code of a trusted file runs once) and leaves every tensor on the meta device, with its
  offset in the archive (checked against the zip directory); a ``.safetensors`` header is JSON;
* at its turn the stamp is checked, each tensor's bytes are copied out of the file with plain reads
  (a read past a shortened end returns short: it cannot fault), and the stamp is checked again. A file
  that changed at any point is named and skipped (:class:`FileChanged`), never read half old, half new.

Damaged files (:class:`CorruptFile`): ``torch.load`` checks no checksum, so a zip archive whose bytes were damaged
after it was written (a bad copy, a failing disk) would replay as a clean reading. Every record satmon reads from a
zip archive is checked against the CRC-32 its zip directory records: the pickle and the other small records at
inspection, each tensor's bytes as they are copied (the optimizer's state, left unread, is not). Legacy (pre-zip)
torch files and ``.safetensors`` files record no checksum: their bytes cannot be verified (only their structure).

Legacy (non-zip, torch < 1.6) files hold their tensors inside the pickle stream: their index is read
with ``map_location="meta"`` (nothing kept in memory), and the whole file is read again at its turn.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from satmon.replaying.budget import (
    OverBudget,
    check_archive,
    check_storages,
    legacy_storage_claims,
    mib,
    pickle_budget,
    pickle_extent,
)

__all__ = ["CorruptFile", "FileChanged", "FileStamp", "SafetensorsIndex", "copy_tensors", "load_index", "load_whole",
           "meta_tensors"]

#: Containers deeper than this are not searched for tensors (a crafted file cannot exhaust the stack).
MAX_DEPTH = 32
#: A ``.safetensors`` header larger than this is refused (the format's own limit is 100 MB).
MAX_HEADER = 100_000_000
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "C64": torch.complex64,
    **{k: getattr(torch, v) for k, v in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
                                         ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")) if hasattr(torch, v)},
}


class FileChanged(Exception):
    """A checkpoint changed (size, modification time, inode) since it was listed: it is skipped."""


class CorruptFile(ValueError):
    """A zip archive whose bytes do not match the CRC-32 its directory records (damaged after it was written): skipped."""


def _damaged(what: str) -> CorruptFile:
    return CorruptFile(f"corrupt: {what} do not match the CRC-32 its zip directory records, so the file was damaged "
                       "after it was written (a cut-short or bad copy, a failing disk); skipped: copy or save it again")


def _clock(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) + f".{ns % 1_000_000_000 // 1_000_000:03d}"


@dataclass(frozen=True)
class FileStamp:
    """A file's identity when it was listed: what must still hold when it is read.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "w.pt"
        >>> _ = f.write_bytes(b"12345678")
        >>> stamp = FileStamp.of(f)
        >>> stamp.size, stamp.difference() is None
        (8, True)
        >>> _ = f.write_bytes(b"1234")
        >>> stamp.difference().startswith("size 8 -> 4 bytes")
        True
    """

    path: Path
    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, path: str | os.PathLike, st: os.stat_result | None = None) -> FileStamp:
        """The stamp of ``path`` now (symlinks followed)."""
        st = os.stat(path) if st is None else st
        return cls(Path(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)

    def difference(self, st: os.stat_result | None = None) -> str | None:
        """What changed since the stamp, in words (``None`` when nothing did)."""
        try:
            st = os.stat(self.path) if st is None else st
        except FileNotFoundError:
            return "deleted"
        except OSError as e:
            return f"no longer readable ({type(e).__name__}: {e.strerror})"
        what = []
        if (st.st_ino, st.st_dev) != (self.inode, self.device):
            what.append("replaced by another file")
        if st.st_size != self.size:
            what.append(f"size {self.size:,} -> {st.st_size:,} bytes")
        if st.st_mtime_ns != self.mtime_ns:
            what.append(f"modified {_clock(self.mtime_ns)} -> {_clock(st.st_mtime_ns)}")
        return "; ".join(what) or None

    def check(self, when: str = "since it was listed", st: os.stat_result | None = None) -> None:
        """Raise :class:`FileChanged` naming what changed."""
        diff = self.difference(st)
        if diff is not None:
            raise FileChanged(f"changed {when} ({diff}): a job may be writing it; skipped (replay it again once it is "
                              "complete)")


# ------------------------------------------------------------------------------ torch.save files
def load_index(stamp: FileStamp, trust: bool) -> Any:
    """The object stored in a ``torch.save`` file, every tensor on the meta device (no tensor data kept).

    Its pickle is read once, here (``weights_only=not trust``). Zip archives' tensors keep their offset
    in the file for :func:`copy_tensors`.

    Raises:
        FileChanged: the file changed since ``stamp`` was taken, or while it was read.
        ValueError: a zip archive written on a machine of the other byte order (refused before torch reads
            it: torch's meta load byte-swaps storages that hold no data, and the process dies).
    """
    stamp.check()
    try:
        with zipfile.ZipFile(stamp.path) as z:
            check_archive(z, stamp.size)  # declared sizes against the budget: nothing inflated yet
            _check_byteorder(_byteorder(z))
            _check_small_records(z)
        legacy = False
    except zipfile.BadZipFile:  # a legacy (non-zip) file: torch reads it whole, in its own byte order
        legacy = True
        _check_legacy_pickles(stamp)
    obj = torch.load(stamp.path, map_location="meta", weights_only=not trust)
    stamp.check("while it was being read")
    check_storages((t.untyped_storage() for t in meta_tensors(obj)), stamp.size, legacy)  # before any is allocated
    return obj


#: The pickles a legacy ``torch.save`` file starts with (magic number, protocol, system info, the object, its storage
#: keys), before the storages' bytes.
_LEGACY_PICKLES = 5


def _check_legacy_pickles(stamp: FileStamp) -> None:
    """A legacy file's pickles, scanned opcode by opcode (:func:`satmon.replaying.budget.pickle_extent`): each length they
    declare fits the file and the budget, before torch unpickles anything."""
    with open(stamp.path, "rb") as f:
        budget, used = pickle_budget(), 0
        for _ in range(_LEGACY_PICKLES):
            used += pickle_extent(f, stamp.size, budget - used)
        f.seek(0)
        for _ in range(3):  # magic number, protocol, system info: then the object, whose storages torch allocates first
            pickle_extent(f, stamp.size, budget)
        claimed = legacy_storage_claims(f)
    if claimed is not None and claimed > stamp.size:
        raise OverBudget(f"over satmon's read budget: its pickle declares tensor storages of {claimed:,} bytes in a "
                         f"{stamp.size:,}-byte file (their bytes would have to be in it): a crafted or cut-short file; "
                         "refused before anything was allocated")


def _check_small_records(z: zipfile.ZipFile) -> None:
    """Read every record that is not tensor data (the pickle, the version, the byte order...): ``zipfile`` checks each
    one's CRC-32 as it reads it, before torch unpickles anything. They are small (the tensors are checked as copied).

    Raises:
        CorruptFile: a record whose bytes (or local header) are damaged.
    """
    for info in z.infolist():
        parts = info.filename.split("/")
        if len(parts) >= 2 and parts[-2] == "data":
            continue
        try:
            with z.open(info) as f:
                while f.read(1 << 20):
                    pass
        except zipfile.BadZipFile:
            raise _damaged(f"the bytes of its record {info.filename[-80:]!r}") from None


def load_whole(stamp: FileStamp, trust: bool) -> Any:
    """The object of a legacy (non-zip) file, read whole with plain reads, the stamp checked before and after."""
    stamp.check()
    obj = torch.load(stamp.path, map_location="cpu", weights_only=not trust)
    stamp.check("while it was being read")
    return obj


def meta_tensors(obj: Any, skip: Iterable[str] = ()) -> list[Tensor]:
    """Every meta tensor in ``obj`` reached through mappings, lists and tuples (up to :data:`MAX_DEPTH`
    levels), except under the top-level keys ``skip``."""
    out: list[Tensor] = []
    _walk(obj, lambda t: out.append(t) or t, set(skip), 0)
    return out


def _walk(obj: Any, fn: Callable[[Tensor], Tensor], skip: set[str], depth: int) -> Any:
    """``obj`` with each meta tensor ``t`` replaced by ``fn(t)``: mappings and lists in place, tuples rebuilt."""
    if isinstance(obj, Tensor):
        return fn(obj) if obj.is_meta else obj
    if depth >= MAX_DEPTH:
        return obj
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            if depth == 0 and k in skip:
                continue
            new = _walk(v, fn, skip, depth + 1)
            if new is not v:
                obj[k] = new
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            new = _walk(v, fn, skip, depth + 1)
            if new is not v:
                obj[i] = new
    elif isinstance(obj, tuple):
        items = [_walk(v, fn, skip, depth + 1) for v in obj]
        if any(a is not b for a, b in zip(items, obj)):
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def _zip_records(path: Path) -> tuple[list[tuple[str, int, int, int]], str]:
    """``(key, data offset, size, CRC-32)`` of every stored (uncompressed) tensor record of a torch zip archive,
    read from the zip directory and each record's local header (independently of torch's offset arithmetic),
    and the archive's byte order (``"little"`` when it records none); the directory is read once."""
    out = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        order = _byteorder(z)
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) < 2 or parts[-2] != "data" or info.compress_type != zipfile.ZIP_STORED:
                continue
            f.seek(info.header_offset)
            head = f.read(30)
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                raise ValueError(f"corrupt zip archive: no local header for {info.filename}")
            name_len, extra_len = struct.unpack("<HH", head[26:30])
            out.append((parts[-1], info.header_offset + 30 + name_len + extra_len, info.file_size, info.CRC))
    return out, order


def _byteorder(z: zipfile.ZipFile) -> str:
    """The byte order a torch zip archive records (``"little"`` when it records none)."""
    names = [n for n in z.namelist() if n.endswith("/byteorder") and n.count("/") == 1]
    return z.read(names[0]).decode(errors="replace").strip()[:20] if names else "little"


def _check_byteorder(order: str) -> None:
    if order != sys.byteorder:
        raise ValueError(f"written on a {order}-endian machine: satmon replay reads only "
                         f"{sys.byteorder}-endian archives; load and re-save it with torch.save on this machine")


def _offsets(obj: Any, records: list[tuple[str, int, int, int]]) -> dict[int, int]:
    """torch's offset of each storage (``_checkpoint_offset``) -> where its bytes really are.

    torch computes the offsets of a meta load from the layout its own zip writer produces; an archive
    rewritten by another zip tool (same records, other headers) puts them elsewhere. The zip directory
    decides: the offsets are used when each is a record of the storage's size; otherwise the storages,
    in the order torch met them (the order ``torch.save`` wrote them), are matched with the records in
    key order, sizes checked pairwise.
    """
    storages: dict[int, int] = {}
    for t in meta_tensors(obj):
        storage = t.untyped_storage()
        offset = getattr(storage, "_checkpoint_offset", None)
        if offset is None:
            raise ValueError("a tensor without its offset in the archive: not read with torch.load(map_location='meta')")
        storages.setdefault(offset, storage.nbytes())
    sizes = {off: size for _, off, size, _ in records}
    if all(sizes.get(off) == n for off, n in storages.items()):
        return {off: off for off in storages}
    by_key = sorted(records, key=lambda r: (not r[0].isdigit(), int(r[0]) if r[0].isdigit() else 0, r[0]))
    mine = sorted(storages.items())
    if len(by_key) == len(mine) and all(size == n for (_, _, size, _), (_, n) in zip(by_key, mine)):
        return {off: real for (off, _), (_, real, _, _) in zip(mine, by_key)}
    raise ValueError(f"its {len(mine)} tensor storage(s) do not match the {len(records)} record(s) of its zip "
                     "directory: the archive is corrupt or was not written by torch.save")


def _read_exactly(f: Any, offset: int, nbytes: int, stamp: FileStamp) -> bytearray:
    buf = bytearray(nbytes)
    view, done = memoryview(buf), 0
    f.seek(offset)
    while done < nbytes:
        n = f.readinto(view[done:])
        if not n:  # the file ends before its index says: it shrank since it was checked
            raise FileChanged(f"changed while it was being read (it ends at byte {offset + done:,}, its index needs "
                              f"{offset + nbytes:,}; {stamp.difference() or 'rewritten'}): a job may be writing it; "
                              "skipped (replay it again once it is complete)")
        done += n
    return buf


def copy_tensors(obj: Any, stamp: FileStamp, skip: Iterable[str] = (), index: Any = None) -> Any:
    """``obj`` (from :func:`load_index` on a zip archive, or a part of it) with its meta tensors replaced
    by CPU tensors copied from the file with plain reads; the tensors under the top-level keys ``skip``
    stay on meta. ``index``: the whole object :func:`load_index` returned, when ``obj`` is a part of it.

    Each storage is read once (tied tensors stay tied); offsets and sizes are checked against the zip
    directory first, and each storage's bytes against the CRC-32 the directory records for them.

    Raises:
        FileChanged: the file changed since ``stamp``, or while it was read (a short read included).
        CorruptFile: bytes that do not match their CRC-32 (a file that did not change since it was listed).
        ValueError: an archive whose tensors are not where its directory says.
    """
    tensors = meta_tensors(obj, skip)
    stamp.check()
    if not tensors:
        return obj
    records, order = _zip_records(stamp.path)
    _check_byteorder(order)
    where = _offsets(obj if index is None else index, records)
    crc = {off: (key, value) for key, off, _, value in records}
    storages: dict[int, bytearray] = {}
    damaged: list[str] = []
    with open(stamp.path, "rb", buffering=0) as f:
        stamp.check("since it was listed", os.fstat(f.fileno()))
        for t in tensors:
            storage = t.untyped_storage()
            offset, nbytes = storage._checkpoint_offset, storage.nbytes()
            if offset not in storages and nbytes:
                storages[offset] = _read_exactly(f, where[offset], nbytes, stamp)
                key, expected = crc[where[offset]]
                if zlib.crc32(storages[offset]) != expected:
                    damaged.append(key)
        stamp.check("while it was being read", os.fstat(f.fileno()))
    stamp.check("while it was being read")  # the path still names the file that was read: a change is said as one
    if damaged:
        raise _damaged(f"the bytes of {len(damaged)} tensor record(s) (data/{', data/'.join(damaged[:3])}"
                       + (", ..." if len(damaged) > 3 else "") + ")")

    def real(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or t.numel() == 0:
            new = torch.empty(t.shape, dtype=t.dtype)
        else:
            raw = storages[storage._checkpoint_offset]
            base = torch.frombuffer(raw, dtype=t.dtype, count=len(raw) // t.element_size())
            new = base.as_strided(t.shape, t.stride(), t.storage_offset())
        if isinstance(t, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
        return new

    return _walk(obj, real, set(skip), 0)


# ------------------------------------------------------------------------------------- safetensors
@dataclass(frozen=True)
class SafetensorsIndex:
    """A ``.safetensors`` file's header: each tensor's dtype, shape and byte range (no tensor data read).

    Example:
        >>> import tempfile, pathlib
        >>> from safetensors.torch import save_file
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "w.safetensors"
        >>> save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(f))
        >>> index = SafetensorsIndex.read(FileStamp.of(f))
        >>> index.meta()["w"].shape, index.tensors(FileStamp.of(f))["w"][1].tolist()
        (torch.Size([2, 3]), [3.0, 4.0, 5.0])
    """

    entries: Mapping[str, tuple[torch.dtype, tuple[int, ...], int, int]]  # name -> dtype, shape, begin, end (in the file)
    metadata: Mapping[str, str]

    @classmethod
    def read(cls, stamp: FileStamp) -> SafetensorsIndex:
        """Parse the header (plain reads), checking every range against the file size.

        Raises:
            ValueError: not a valid ``.safetensors`` file (the message says what is wrong).
            FileChanged: the file changed since ``stamp``.
        """
        stamp.check()
        with open(stamp.path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            if not 0 < n <= min(MAX_HEADER, stamp.size - 8):
                raise ValueError("not a safetensors file: no JSON header of a plausible size")
            if n > pickle_budget():  # its JSON is parsed whole: the same budget as a pickle
                raise OverBudget(f"over satmon's read budget: its JSON header declares {n:,} bytes, over the "
                                 f"{mib(pickle_budget())} satmon reads of a checkpoint's index; refused unread. For a "
                                 "file you trust that needs more, set SATMON_MAX_PICKLE_MB=N (MiB)")
            raw = f.read(n)
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"not a safetensors file: its header is not JSON ({type(e).__name__})") from None
        if not isinstance(header, dict):
            raise ValueError("not a safetensors file: its header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        data_start, entries = 8 + n, {}
        for name, e in header.items():
            try:
                dtype = _SAFETENSORS_DTYPES[e["dtype"]]
                shape = tuple(int(s) for s in e["shape"])
                begin, end = (int(x) for x in e["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"not a safetensors file: entry {name[:80]!r} has no valid dtype/shape/data_offsets") from None
            numel = 1
            for s in shape:
                numel *= s
            if min(shape, default=1) < 0 or end - begin != numel * dtype.itemsize or begin < 0 or data_start + end > stamp.size:
                raise ValueError(f"truncated or corrupt safetensors file: tensor {name[:80]!r} ({e['dtype']} {list(shape)}) "
                                 f"does not fit bytes {begin:,}..{end:,} of a {stamp.size - data_start:,}-byte data section")
            entries[str(name)] = (dtype, shape, data_start + begin, data_start + end)
        if not entries:
            raise ValueError("not a checkpoint: a safetensors file without tensors")
        at = data_start  # the format indexes its whole data section, without gaps or overlaps (no polyglot files)
        for name, (_, _, begin, end) in sorted(entries.items(), key=lambda e: (e[1][2], e[1][3])):
            if begin != at:
                raise ValueError(f"corrupt safetensors file: tensor {name[:80]!r} starts at byte {begin - data_start:,} of "
                                 f"the data section, where {at - data_start:,} was expected (a gap or an overlap: the "
                                 "format has none)")
            at = end
        if at != stamp.size:
            raise ValueError(f"corrupt safetensors file: {stamp.size - at:,} byte(s) after its last tensor (the format "
                             "ends with it)")
        stamp.check("while it was being read")
        return cls(entries, {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {})

    def meta(self) -> dict[str, Tensor]:
        """Name -> a meta tensor of the stored dtype and shape (for comparing with a model's)."""
        return {n: torch.empty(shape, dtype=dtype, device="meta") for n, (dtype, shape, _, _) in self.entries.items()}

    def tensors(self, stamp: FileStamp) -> dict[str, Tensor]:
        """Name -> CPU tensor, copied from the file with plain reads, the stamp checked before and after.

        Raises:
            FileChanged: the file changed since ``stamp``, or while it was read.
        """
        stamp.check()
        out: dict[str, Tensor] = {}
        with open(stamp.path, "rb", buffering=0) as f:
            stamp.check("since it was listed", os.fstat(f.fileno()))
            for name, (dtype, shape, begin, end) in self.entries.items():
                if end == begin:
                    out[name] = torch.empty(shape, dtype=dtype)
                    continue
                raw = _read_exactly(f, begin, end - begin, stamp)
                out[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
            stamp.check("while it was being read", os.fstat(f.fileno()))
        stamp.check("while it was being read")
        return out
