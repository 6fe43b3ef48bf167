"""The torch file format: ``torch.save`` files (``.ckpt``, ``.pt``, ``.pth``; zip archives, and legacy pickles of
torch < 1.6), Lightning's checkpoints and plain state dicts. No code runs from a file unless trusted; no file mapped.

A pickle can run any code while it is read, so every torch file is read with
``torch.load(weights_only=True)`` (tensors, containers and torch's allow-list only). A file that
needs more is refused, named with the global torch refused, unless the caller passes ``trust=True``
(``satmon replay --trust-checkpoints``), which reads it with ``weights_only=False``. A global that
runs code (``posix.system``, ``exec``...) is named as not safe to allow, with no advice to trust it.
Lightning's own checkpoints (and those of runs with satmon's callback) need nothing beyond torch's
allow-list, so no type is registered with ``torch.serialization.add_safe_globals``; register your
own safe types there before inspecting if your hyper-parameters hold some.

Reading (:mod:`satmon.replaying.file_info` for the stamps): inspection reads the index only,
``torch.load(map_location="meta")`` unpickling the pickle once (the code of a trusted file runs once) and leaving
every tensor on the meta device, with its offset in the archive (checked against the zip directory). At its turn
the stamp is checked, each tensor's bytes are copied out of the file with plain reads (a read past a shortened end
returns short: it cannot fault), and the stamp is checked again.

Damaged files (:class:`~satmon.replaying.file_info.CorruptFile`): ``torch.load`` checks no checksum, so a zip archive
whose bytes were damaged after it was written (a bad copy, a failing disk) would replay as a clean reading. Every
record satmon reads from a zip archive is checked against the CRC-32 its zip directory records: the pickle and the
other small records at inspection, each tensor's bytes as they are copied (the optimizer's state, left unread, is
not). Legacy (pre-zip) torch files record no checksum: their bytes cannot be verified (only their structure); they
hold their tensors inside the pickle stream, so their index is read with ``map_location="meta"`` and the whole file
is read again at its turn.

Declared sizes are checked against the pickle budget before anything is inflated (:mod:`satmon.replaying.budget`).
A compressed file or an archive saved under a checkpoint's name is named, with the command that unpacks it
(:func:`~satmon.replaying.formats.common.packed_as`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    pickle_budget,
    pickle_extent,
)
from satmon.replaying.file_info import FileChanged, FileStamp, corrupt_file, read_exactly
from satmon.replaying.formats.common import (
    TRUST_FLAG,
    CheckpointFormat,
    CheckpointInfo,
    Entries,
    Match,
    Weights,
    error_text,
    file_head,
    is_text,
    packed_as,
)
from satmon.replaying.user_code import error_line, short

__all__ = [
    "FORMAT",
    "SUFFIXES",
    "TorchWeights",
    "copy_tensors",
    "extract_state_dict",
    "inspect",
    "load_index",
    "load_whole",
    "meta_tensors",
    "recognise",
    "refusal",
    "step_of",
]

#: The suffixes of torch files a folder's files are listed by (a file given by name is read as one whatever its suffix).
SUFFIXES = (".ckpt", ".pt", ".pth")

#: Keys under which plain checkpoints keep their weights and their step (nanoGPT uses model / iter_num).
_STATE_KEYS = ("state_dict", "model_state_dict", "model")


_STEP_KEYS = ("global_step", "step", "iter_num")


#: Parts of a Lightning checkpoint that building the model does not read: left unread (on the meta device).
_UNREAD = ("optimizer_states", "lr_schedulers")


#: Containers deeper than this are not searched for tensors (a crafted file cannot exhaust the stack).
MAX_DEPTH = 32


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
    """A legacy file's pickles, scanned opcode by opcode (:func:`satmon.replaying.budget.pickle_extent`): each length
    they declare fits the file and the budget, before torch unpickles anything."""
    with open(stamp.path, "rb") as f:
        budget, used = pickle_budget(), 0
        for _ in range(_LEGACY_PICKLES):
            used += pickle_extent(f, stamp.size, budget - used)
        f.seek(0)
        for _ in range(3):  # magic number, protocol, system info: then the object, whose storages torch allocates first
            pickle_extent(f, stamp.size, budget)
        claimed = legacy_storage_claims(f)
    if claimed is not None and claimed > stamp.size:
        raise OverBudget(
            f"over satmon's read budget: its pickle declares tensor storages of {claimed:,} bytes in a "
            f"{stamp.size:,}-byte file (their bytes would have to be in it): a crafted or cut-short file; "
            "refused before anything was allocated"
        )


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
            raise corrupt_file(f"the bytes of its record {info.filename[-80:]!r}") from None


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
        raise ValueError(
            f"written on a {order}-endian machine: satmon replay reads only "
            f"{sys.byteorder}-endian archives; load and re-save it with torch.save on this machine"
        )


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
            raise ValueError(
                "a tensor without its offset in the archive: not read with torch.load(map_location='meta')"
            )
        storages.setdefault(offset, storage.nbytes())
    sizes = {off: size for _, off, size, _ in records}
    if all(sizes.get(off) == n for off, n in storages.items()):
        return {off: off for off in storages}
    by_key = sorted(records, key=lambda r: (not r[0].isdigit(), int(r[0]) if r[0].isdigit() else 0, r[0]))
    mine = sorted(storages.items())
    if len(by_key) == len(mine) and all(size == n for (_, _, size, _), (_, n) in zip(by_key, mine)):
        return {off: real for (off, _), (_, real, _, _) in zip(mine, by_key)}
    raise ValueError(
        f"its {len(mine)} tensor storage(s) do not match the {len(records)} record(s) of its zip "
        "directory: the archive is corrupt or was not written by torch.save"
    )


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
                storages[offset] = read_exactly(f, where[offset], nbytes, stamp)
                key, expected = crc[where[offset]]
                if zlib.crc32(storages[offset]) != expected:
                    damaged.append(key)
        stamp.check("while it was being read", os.fstat(f.fileno()))
    stamp.check("while it was being read")  # the path still names the file that was read: a change is said as one
    if damaged:
        raise corrupt_file(
            f"the bytes of {len(damaged)} tensor record(s) (data/{', data/'.join(damaged[:3])}"
            + (", ..." if len(damaged) > 3 else "")
            + ")"
        )

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


# ------------------------------------------------------------------------------ what a file is
def _not_a_checkpoint(path: Path) -> str | None:
    """What the file is not, read from its first bytes (``None`` when it may be a checkpoint).

    torch's own errors on such files read ``IndexError: pop from empty list`` or ``KeyError: 101``.
    """
    found = file_head(path)  # opened without blocking (a FIFO put there since the listing), read if a regular file
    if isinstance(found, str):
        return found
    size, head = found
    if size == 0:
        return "not a PyTorch checkpoint: an empty file"
    if head[:4] == b"PK\x03\x04":
        if not zipfile.is_zipfile(path):
            return (
                f"truncated or corrupt: a torch.save zip archive without its directory, {size:,} bytes; "
                "was the copy or save cut short?"
            )
        with zipfile.ZipFile(path) as z:
            if not any(n.endswith("data.pkl") for n in z.namelist()):
                return "not a PyTorch checkpoint: a zip archive without the data.pkl of torch.save"
        return None
    if head[:1] == b"\x80":  # a pickle (torch.save's legacy format)
        return None
    packed = packed_as(path, head)
    if packed is not None:
        return packed
    head = head[:64]
    text = head.decode("utf-8", errors="strict") if is_text(head) else None
    if text is not None:
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        return f"not a PyTorch checkpoint: a text file (starts {first!r})"
    return f"not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle (starts {head[:8]!r})"


#: Modules whose globals run commands or code, or reach anything: a checkpoint never needs them.
_UNSAFE_MODULES = {
    "os",
    "posix",
    "nt",
    "subprocess",
    "commands",
    "sys",
    "shutil",
    "socket",
    "importlib",
    "runpy",
    "pickle",
    "cPickle",
    "_pickle",
    "marshal",
    "ctypes",
    "code",
    "codeop",
    "pty",
    "multiprocessing",
    "webbrowser",
    "asyncio",
    "signal",
    "threading",
    "_thread",
    "pdb",
    "timeit",
    "types",
    "operator",
    "functools",
    "inspect",
    "io",
    "_io",
    "builtins",
    "__builtin__",
    "site",
    "torch.hub",
}


_UNSAFE_NAMES = {
    "exec",
    "eval",
    "compile",
    "open",
    "getattr",
    "setattr",
    "delattr",
    "__import__",
    "globals",
    "locals",
    "vars",
    "breakpoint",
    "input",
    "execfile",
    "apply",
    "system",
    "popen",
    "spawn",
    "Popen",
    "call",
    "check_call",
    "check_output",
    "run",
    "exec_module",
}


def _what_it_does(name: str, blocked: bool) -> str | None:
    """Why the global ``name`` is not safe to allow, or ``None`` when it looks like a data type."""
    module, _, attr = name.rpartition(".")
    top = module.split(".")[0]
    if attr in ("system", "popen", "Popen", "spawn", "call", "check_call", "check_output", "run") and top in (
        "os",
        "posix",
        "nt",
        "subprocess",
        "commands",
    ):
        return "runs a shell command"
    if attr in ("exec", "eval", "compile", "execfile", "exec_module"):
        return "runs Python code"
    if attr == "__import__" or top in ("importlib", "runpy"):
        return "imports and runs modules"
    if blocked or top in _UNSAFE_MODULES or module in _UNSAFE_MODULES or attr in _UNSAFE_NAMES:
        return "can run arbitrary code"
    return None


def refusal(e: Exception) -> tuple[str, bool]:
    """The message for a file ``torch.load(weights_only=True)`` refused, and whether trusting it may be advised.

    The message names the global torch refused. A global that runs code (``posix.system``, ``exec``,
    ``__import__``...) is called unsafe, with no advice to trust the file.
    """
    text = str(e)[:20_000]
    found = re.search(r"GLOBAL ([\w.]+)", text)
    name = found.group(1) if found else None
    blocked = bool(re.search(r"whose module \S+ is blocked", text))
    does = _what_it_does(name, blocked) if name else None
    if does is not None:
        return (
            f"refused by torch.load(weights_only=True): its pickle calls {name} (GLOBAL {name}), which {does}: "
            "not safe to allow. A checkpoint needs no such call: this file was crafted or is not a checkpoint; "
            "do not load it"
        ), False
    if name is None:
        reason = re.search(r"WeightsUnpickler error:\s*(.+)", text)
        what = reason.group(1).split(". ")[0] if reason else error_line(e)
        return (
            f"refused by torch.load(weights_only=True): {what[:300]}. If you made or trust this file, pass "
            f"{TRUST_FLAG} (API: trust=True) to load it: that runs code stored in the file"
        ), True
    return (
        f"refused by torch.load(weights_only=True): it holds GLOBAL {name}, a type not on torch's allow-list. If you "
        f"made or trust this file, pass {TRUST_FLAG} (API: trust=True), which runs code stored in it, or allow "
        f"the type from Python with torch.serialization.add_safe_globals([{name}])"
    ), True


def step_of(obj: Mapping[str, Any], weights: TorchWeights) -> tuple[int | None, str | None]:
    """The step stored under ``_STEP_KEYS``, and a note when it cannot be read before the checkpoint's turn."""
    for k in _STEP_KEYS:
        v = obj.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, Tensor)):
            continue
        if isinstance(v, Tensor):
            if v.numel() != 1:
                continue
            if v.is_meta:
                if weights.layout != "zip":
                    return (
                        None,
                        f"its step ({k!r}) is a tensor inside a legacy file: ordered and logged by its position",
                    )
                v = copy_tensors({k: v}, weights.stamp, index=obj)[k]
        return int(v), None
    return None, None


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, Tensor) for v in obj.values())


def extract_state_dict(obj: Any) -> dict[str, Tensor]:
    """The weights inside a loaded checkpoint: the object itself, or under
    ``state_dict``/``model_state_dict``/``model``.

    Example:
        >>> import torch
        >>> sorted(extract_state_dict({"model": {"w": torch.zeros(1)}, "iter_num": 3}))
        ['w']
    """
    if _is_state_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping):
        for k in _STATE_KEYS:
            if _is_state_dict(obj.get(k)):
                return dict(obj[k])
    what = ""
    if isinstance(obj, Mapping):
        keys = [short(k, 40) for k in list(obj)[:8]]
        what = f" with keys [{', '.join(sorted(keys))}{', ...' if len(obj) > 8 else ''}]"
    raise ValueError(
        "not a checkpoint: expected a state_dict (a mapping of names to tensors, or one under "
        f"'state_dict'/'model_state_dict'/'model'), got {type(obj).__name__}{what}"
    )


def _copy_small(obj: Any, weights: TorchWeights) -> Any:
    """Hyper-parameters as stored: their (rare) tensors copied from a zip archive at inspection."""
    return copy_tensors(obj, weights.stamp, index=weights.index) if weights.layout == "zip" else obj


@dataclass(frozen=True)
class TorchWeights(Weights):
    """A torch file's weights: its index is the stored object, every tensor on the meta device.

    Attributes:
        lightning: a Lightning checkpoint (its weights under ``state_dict``).
        trust: read with ``weights_only=False`` (a legacy file is read again whole at its turn).
    """

    lightning: bool = False
    trust: bool = False

    def _part(self, obj: Any) -> dict[str, Tensor]:
        return dict(obj["state_dict"]) if self.lightning else extract_state_dict(obj)

    def meta(self) -> dict[str, Tensor]:
        return self._part(self.index)

    def tensors(self) -> dict[str, Tensor]:
        if self.layout == "zip":
            return copy_tensors(self._part(self.index), self.stamp, index=self.index)
        return self._part(load_whole(self.stamp, trust=self.trust))

    def checkpoint(self) -> dict[str, Any]:
        """The whole stored object as ``load_from_checkpoint`` sees it, its tensors read now (the optimizer and
        scheduler states left unread, on the meta device)."""
        if self.layout == "zip":
            return copy_tensors(self.index, self.stamp, skip=_UNREAD)
        return load_whole(self.stamp, trust=self.trust)


def recognise(path: Path, entries: Entries | None) -> Match | None:
    """A file with a torch suffix (:data:`SUFFIXES`)."""
    return Match() if entries is None and path.suffix in SUFFIXES else None


def inspect(path: Path, trust: bool = False, stamps: Sequence[FileStamp] | None = None) -> CheckpointInfo:
    """Read a torch file's index once: its kind, global step and hyper-parameters; no tensor data is kept.

    Never raises: an unreadable, refused, changed or non-checkpoint file comes back with ``error`` set.

    Example:
        >>> import os, tempfile
        >>> f = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"model": {"w": torch.zeros(2)}, "iter_num": 7}, f)
        >>> info = inspect(Path(f))
        >>> info.kind, info.global_step, info.error, info.checkpoint["model"]["w"].device
        ('state_dict', 7, None, device(type='meta'))
    """
    info = CheckpointInfo(path=path, weights_only=not trust, format=FORMAT.name)
    info.error = _not_a_checkpoint(path)
    if info.error is not None:
        return info
    try:
        stamp = stamps[0] if stamps else FileStamp.of(path)
        layout = "zip" if zipfile.is_zipfile(path) else "legacy"
        obj = load_index(stamp, trust)
        weights = TorchWeights(stamp, obj, layout, checksummed=layout == "zip", trust=trust)
        info.weights = (weights,)
        if (
            isinstance(obj, Mapping)
            and "state_dict" in obj
            and ("pytorch-lightning_version" in obj or "global_step" in obj)
        ):
            info.kind = "lightning"
            info.weights = (weights := dataclasses.replace(weights, lightning=True),)
            info.hparams = dict(_copy_small(obj.get("hyper_parameters") or {}, weights))
            name = obj.get("hparams_name")
            info.hparams_name = name if isinstance(name, str) else None
            info.datamodule_hparams = dict(_copy_small(obj.get("datamodule_hyper_parameters") or {}, weights))
        else:
            extract_state_dict(obj)  # raises with what the file holds instead
        if isinstance(obj, Mapping):
            info.global_step, note = step_of(obj, weights)
            if note:
                info.notes.append(note)
        info.checkpoint = obj
    except FileChanged as e:
        info.error, info.checkpoint, info.weights = str(e), None, ()
        return info
    except Exception as e:  # any unreadable file is a per-file failure, never the end of the replay
        info.checkpoint, info.weights = None, ()
        if "weights only load failed" in str(e)[:2000].lower():
            info.refused = True
            info.error, trustable = refusal(e)
            info.unsafe = not trustable
        else:
            info.error = error_text(e)
        return info
    if info.global_step is None and not info.notes:
        info.notes.append("no global step in the file: ordered and logged by its position instead")
    return info


#: The torch file format (the last file format tried: a file given by name is read as one whatever its suffix).
FORMAT = CheckpointFormat("torch", recognise, inspect, SUFFIXES)
