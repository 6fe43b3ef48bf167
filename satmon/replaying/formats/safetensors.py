"""The safetensors format: ``.safetensors`` files, read as their header (JSON) and byte ranges, with plain reads.

safetensors holds tensors only: nothing to trust, nothing that runs. Its header is parsed within the pickle budget
(:mod:`satmon.replaying.budget`), every range checked against the file (no gap, no overlap, nothing after the last
tensor); the format records no checksum, so its bytes cannot be verified (only its structure).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from satmon.replaying.budget import OverBudget, mib, pickle_budget
from satmon.replaying.file_info import FileChanged, FileStamp, read_exactly
from satmon.replaying.formats.common import (
    CheckpointFormat,
    CheckpointInfo,
    Entries,
    Match,
    Weights,
    error_text,
    file_head,
    packed_as,
)

__all__ = ["FORMAT", "SUFFIX", "SafetensorsIndex", "SafetensorsWeights", "inspect", "recognise"]

#: The format's file suffix.
SUFFIX = ".safetensors"

#: A ``.safetensors`` header larger than this is refused (the format's own limit is 100 MB).
MAX_HEADER = 100_000_000


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
    **{
        k: getattr(torch, v)
        for k, v in (
            ("U16", "uint16"),
            ("U32", "uint32"),
            ("U64", "uint64"),
            ("F8_E4M3", "float8_e4m3fn"),
            ("F8_E5M2", "float8_e5m2"),
        )
        if hasattr(torch, v)
    },
}


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

    # name -> dtype, shape, begin, end (in the file)
    entries: Mapping[str, tuple[torch.dtype, tuple[int, ...], int, int]]
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
                raise OverBudget(
                    f"over satmon's read budget: its JSON header declares {n:,} bytes, over the "
                    f"{mib(pickle_budget())} satmon reads of a checkpoint's index; refused unread. For a "
                    "file you trust that needs more, set SATMON_MAX_PICKLE_MB=N (MiB)"
                )
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
                raise ValueError(
                    f"not a safetensors file: entry {name[:80]!r} has no valid dtype/shape/data_offsets"
                ) from None
            numel = 1
            for s in shape:
                numel *= s
            if (
                min(shape, default=1) < 0
                or end - begin != numel * dtype.itemsize
                or begin < 0
                or data_start + end > stamp.size
            ):
                raise ValueError(
                    f"truncated or corrupt safetensors file: tensor {name[:80]!r} ({e['dtype']} {list(shape)}) "
                    f"does not fit bytes {begin:,}..{end:,} of a {stamp.size - data_start:,}-byte data section"
                )
            entries[str(name)] = (dtype, shape, data_start + begin, data_start + end)
        if not entries:
            raise ValueError("not a checkpoint: a safetensors file without tensors")
        at = data_start  # the format indexes its whole data section, without gaps or overlaps (no polyglot files)
        for name, (_, _, begin, end) in sorted(entries.items(), key=lambda e: (e[1][2], e[1][3])):
            if begin != at:
                raise ValueError(
                    f"corrupt safetensors file: tensor {name[:80]!r} starts at byte {begin - data_start:,} of "
                    f"the data section, where {at - data_start:,} was expected (a gap or an overlap: the "
                    "format has none)"
                )
            at = end
        if at != stamp.size:
            raise ValueError(
                f"corrupt safetensors file: {stamp.size - at:,} byte(s) after its last tensor (the format ends with it)"
            )
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
                raw = read_exactly(f, begin, end - begin, stamp)
                out[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
            stamp.check("while it was being read", os.fstat(f.fileno()))
        stamp.check("while it was being read")
        return out


@dataclass(frozen=True)
class SafetensorsWeights(Weights):
    """A ``.safetensors`` file's weights: its index is its :class:`SafetensorsIndex`."""

    def meta(self) -> dict[str, Tensor]:
        return self.index.meta()

    def tensors(self) -> dict[str, Tensor]:
        return self.index.tensors(self.stamp)


def weights_of(stamp: FileStamp) -> SafetensorsWeights:
    """A ``.safetensors`` file's weights, its header read now (a Hugging Face folder's shards are read so too)."""
    return SafetensorsWeights(stamp, SafetensorsIndex.read(stamp), "safetensors")


def _not_safetensors(path: Path) -> str | None:
    """What the file is instead, read from its first bytes (``None`` when it may be a safetensors file)."""
    found = file_head(path)
    if isinstance(found, str):
        return found
    size, head = found
    if size == 0:
        return "not a PyTorch checkpoint: an empty file"
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    return (
        None
        if 0 < n <= size - 8 and head[8:9] == b"{"
        else packed_as(path, head) or ("not a safetensors file: no JSON header")
    )


def recognise(path: Path, entries: Entries | None) -> Match | None:
    """A file with the ``.safetensors`` suffix."""
    return Match() if entries is None and path.suffix == SUFFIX else None


def inspect(path: Path, trust: bool = False, stamps: Sequence[FileStamp] | None = None) -> CheckpointInfo:
    """Read a ``.safetensors`` file's header: its tensors' names, dtypes and shapes (no step: it stores none).

    Never raises: an unreadable, changed or invalid file comes back with ``error`` set.
    """
    info = CheckpointInfo(path=path, weights_only=True, format=FORMAT.name)  # tensors only: nothing to trust
    info.error = _not_safetensors(path)
    if info.error is not None:
        return info
    try:
        info.weights = (weights_of(stamps[0] if stamps else FileStamp.of(path)),)
    except FileChanged as e:
        info.error = str(e)
        return info
    except Exception as e:
        info.error = error_text(e)
        return info
    info.notes.append("no global step in the file: ordered and logged by its position instead")
    return info


#: The safetensors format.
FORMAT = CheckpointFormat("safetensors", recognise, inspect, (SUFFIX,))
