"""The torch.distributed.checkpoint (DCP) folder format, read without a process group and
without running code stored in them.

A DCP folder (``torch.distributed.checkpoint.save``, Lightning's FSDP ``state_dict_type="sharded"``) holds a
``.metadata`` file and ``__R_I.distcp`` shards. torch reads ``.metadata`` with a plain ``pickle.load``: a crafted one
runs any code. satmon reads it with a restricted unpickler whose only globals are DCP's own metadata types,
``torch.Size``, the dtypes, layouts and memory formats, and ``pathlib`` paths (:data:`ALLOWED`): anything else is
refused, named. The shards hold each tensor chunk as a ``torch.save`` archive at an offset the metadata records: each is
read with plain reads (the stamps checked), checked against its CRC-32s and the budget (:mod:`satmon.replaying.budget`),
loaded with ``torch.load(weights_only=True)`` and copied into its place in the whole tensor. Every rank's chunks are
assembled: the result is the consolidated state, as ``dcp_to_torch_save`` would write it.

Which tensors are the model's: those under a top-level ``state_dict``, ``model_state_dict`` or ``model`` key (the key
dropped, as for a plain checkpoint), else every tensor. The step: ``global_step``/``step``/``iter_num`` stored beside
them, or Lightning's ``meta.pt`` in the folder.
"""

from __future__ import annotations

import io
import os
import pickle
import shlex
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from satmon.paths import open_regular
from satmon.replaying.budget import (
    OverBudget,
    check_archive,
    mib,
    pickle_budget,
    pickle_extent,
)
from satmon.replaying.file_info import FileChanged, FileStamp, read_exactly
from satmon.replaying.formats.common import (
    CheckpointFormat,
    CheckpointInfo,
    Entries,
    Match,
    Weights,
    converted_path,
    error_text,
    natural_key,
)
from satmon.replaying.formats.torch_file import SUFFIXES as TORCH_SUFFIXES
from satmon.replaying.formats.torch_file import TorchWeights, load_index, step_of
from satmon.replaying.user_code import printable

__all__ = ["ALLOWED", "DCP_META", "FORMAT", "METADATA", "DcpIndex", "DcpWeights", "inspect", "is_dcp", "recognise"]

#: The metadata file of a DCP folder.
METADATA = ".metadata"
#: Lightning's FSDP writes the rest of a sharded checkpoint (step, hyper-parameters) beside the DCP shards.
DCP_META = "meta.pt"
_META = "torch.distributed.checkpoint.metadata"
#: The globals a DCP ``.metadata`` pickle may name: its own data types, nothing that runs code.
ALLOWED = {
    **{
        (_META, n): None
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): None,
    ("torch", "Size"): None,
    ("torch.serialization", "_get_layout"): None,
    ("pathlib", "PosixPath"): None,
    ("pathlib", "PurePosixPath"): None,
    ("pathlib", "WindowsPath"): None,
    ("pathlib", "PureWindowsPath"): None,
    ("collections", "OrderedDict"): None,
}
_STATE_KEYS = ("state_dict", "model_state_dict", "model")
_STEP_KEYS = ("global_step", "step", "iter_num")


#: Suffixes of other checkpoints: a folder holding one of them beside a stray ``.metadata`` and no shard is not DCP.
_OTHER_WEIGHTS = (*TORCH_SUFFIXES, ".bin", ".safetensors")


def is_dcp(names: set[str]) -> bool:
    """A folder holding these file names is a DCP checkpoint: ``.metadata`` and ``.distcp`` shards, or ``.metadata``
    alone with no other checkpoint beside it (a DCP folder whose shards are missing: inspection names them).

    Example:
        >>> is_dcp({".metadata", "__0_0.distcp"}), is_dcp({".metadata"}), is_dcp({"model.safetensors"})
        (True, True, False)
        >>> is_dcp({".metadata", "last.ckpt"})  # another tool's .metadata beside a checkpoint
        False
    """
    if METADATA not in names:
        return False
    return any(n.endswith(".distcp") for n in names) or not any(n.endswith(_OTHER_WEIGHTS) for n in names)


class _Restricted(pickle.Unpickler):
    """``pickle.Unpickler`` whose globals are :data:`ALLOWED` only (and torch's dtypes, layouts, memory formats)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"its .metadata names GLOBAL {module[:80]}.{name[:80]}, which is not a DCP metadata "
            "type: satmon does not unpickle it (this folder was crafted, or written by a newer "
            "torch: consolidate it with torch's dcp_to_torch if you trust it)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("its .metadata holds a persistent id: not DCP metadata")


@dataclass(frozen=True)
class _Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class DcpIndex:
    """What a DCP folder's ``.metadata`` says: each tensor's dtype, size and chunks (where their bytes are), and the
    small objects stored beside them. No tensor data is read.

    Example:
        >>> import tempfile, warnings, torch.distributed.checkpoint as dcp
        >>> d = tempfile.mkdtemp()
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     _ = dcp.save({"model": {"w": torch.arange(4.0)}, "step": 7}, checkpoint_id=d, no_dist=True)
        >>> stamps = {p.name: FileStamp.of(p) for p in Path(d).iterdir()}
        >>> index = DcpIndex.read(Path(d), stamps)
        >>> index.meta()["w"].shape, index.step(stamps), index.tensors(stamps)["w"].tolist()
        (torch.Size([4]), 7, [0.0, 1.0, 2.0, 3.0])
    """

    folder: Path
    weights: Mapping[str, tuple[torch.dtype, tuple[int, ...], tuple[_Chunk, ...]]]  # name -> dtype, size, chunks
    objects: Mapping[str, _Chunk]  # a top-level small object's fqn -> where it is

    @classmethod
    def read(cls, folder: Path, stamps: Mapping[str, FileStamp]) -> DcpIndex:
        """Parse ``.metadata`` with the restricted unpickler, after its size and opcodes are checked against the budget.

        Raises:
            ValueError: not DCP metadata, a global outside :data:`ALLOWED`, shards outside the folder or missing,
                chunk ranges outside their shard, transformed (compressed) chunks.
            OverBudget: a ``.metadata`` over the pickle budget.
            FileChanged: a file changed since it was listed.
        """
        stamp = stamps[METADATA]
        stamp.check()
        budget = pickle_budget()
        if stamp.size > budget:
            raise OverBudget(
                f"over satmon's read budget: its .metadata is {stamp.size:,} bytes, over the {mib(budget)} "
                "satmon reads of a checkpoint's pickle; set SATMON_MAX_PICKLE_MB=N (MiB) to read it"
            )
        with os.fdopen(open_regular(stamp.path), "rb") as f:
            raw = f.read(stamp.size + 1)
        stamp.check("while it was being read")
        pickle_extent(io.BytesIO(raw), len(raw), budget)  # every length it declares fits
        try:
            md = _Restricted(io.BytesIO(raw)).load()
        except pickle.UnpicklingError as e:
            raise ValueError(f"not read: {e}") from None
        except Exception as e:
            raise ValueError(f"not a checkpoint: its .metadata is not DCP metadata ({type(e).__name__})") from None
        return cls._from_metadata(folder, md, stamps)

    @classmethod
    def _from_metadata(cls, folder: Path, md: Any, stamps: Mapping[str, FileStamp]) -> DcpIndex:
        from torch.distributed.checkpoint.metadata import (
            Metadata,
            TensorStorageMetadata,
        )

        if (
            not isinstance(md, Metadata)
            or not isinstance(md.state_dict_metadata, dict)
            or not isinstance(md.storage_data, dict)
        ):
            raise ValueError("not a checkpoint: its .metadata is not DCP metadata")
        where: dict[tuple[str, tuple[int, ...] | None], _Chunk] = {}
        named = sorted({str(getattr(info, "relative_path", "")) for info in md.storage_data.values()})
        outside = [n for n in named if "/" in n or "\\" in n or n.startswith(".")]
        if outside:
            raise ValueError(f"not a checkpoint: its .metadata names a shard {outside[0][:80]!r} outside the folder")
        missing = [n for n in named if n not in stamps]
        if missing:
            shown = ", ".join(repr(n[:80]) for n in missing[:4]) + (
                f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            )
            raise ValueError(
                f"incomplete DCP folder: its .metadata names {len(named)} shard(s), {len(missing)} missing "
                f"from the folder ({shown}); copy the whole folder, every rank's shards"
            )
        for key, info in md.storage_data.items():
            name = str(getattr(info, "relative_path", ""))
            if getattr(info, "transform_descriptors", None):
                raise ValueError(
                    f"not read: its chunks are transformed ({info.transform_descriptors!r:.60}: compressed or "
                    "encoded); consolidate it with torch's dcp_to_torch"
                )
            offset, length = int(info.offset), int(info.length)
            if offset < 0 or length < 0 or offset + length > stamps[name].size:
                raise ValueError(
                    f"truncated or corrupt DCP folder: a chunk at bytes {offset:,}..{offset + length:,} of "
                    f"{name} ({stamps[name].size:,} bytes)"
                )
            index_offset = None if key.offset is None else tuple(int(x) for x in key.offset)
            where[(str(key.fqn), index_offset)] = _Chunk((), (), name, offset, length)
        planner = md.planner_data if isinstance(md.planner_data, dict) else {}
        tensors: dict[str, tuple[torch.dtype, tuple[int, ...], tuple[_Chunk, ...]]] = {}
        objects: dict[str, _Chunk] = {}
        for fqn, meta in md.state_dict_metadata.items():
            path = tuple(str(p) for p in planner.get(fqn, (fqn,)))
            if isinstance(meta, TensorStorageMetadata):
                chunks = []
                for c in meta.chunks:
                    offsets, sizes = tuple(int(x) for x in c.offsets), tuple(int(x) for x in c.sizes)
                    at = where.get((fqn, offsets))
                    if at is None:
                        raise ValueError(f"incomplete DCP folder: chunk {list(offsets)} of {fqn[:80]!r} is in no shard")
                    chunks.append(_Chunk(offsets, sizes, at.file, at.offset, at.length))
                tensors[".".join(path)] = (meta.properties.dtype, tuple(int(s) for s in meta.size), tuple(chunks))
            elif len(path) == 1 and (fqn, None) in where:
                objects[fqn] = where[(fqn, None)]
        under = [k for k in _STATE_KEYS if any(n.startswith(k + ".") for n in tensors)]
        if under:
            prefix = under[0] + "."
            tensors = {n[len(prefix) :]: v for n, v in tensors.items() if n.startswith(prefix)}
        if not tensors:
            raise ValueError("not a checkpoint: a DCP folder without tensors")
        need = sum(_nbytes(dtype, size) for dtype, size, _ in tensors.values())
        have = sum(s.size for n, s in stamps.items() if n.endswith(".distcp"))
        if need > have:
            raise OverBudget(
                f"over satmon's read budget: its .metadata declares tensors of {need:,} bytes in shards of "
                f"{have:,} bytes: a crafted or cut-short folder; refused before anything was allocated"
            )
        return cls(folder, tensors, objects)

    def meta(self) -> dict[str, Tensor]:
        """Name -> a meta tensor of the stored dtype and whole size (for comparing with a model's)."""
        return {n: torch.empty(size, dtype=dtype, device="meta") for n, (dtype, size, _) in self.weights.items()}

    def _load(self, chunk: _Chunk, stamp: FileStamp, f: Any) -> Any:
        raw = read_exactly(f, chunk.offset, chunk.length, stamp)
        try:
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                check_archive(z, len(raw))
                bad = z.testzip()  # every record against its CRC-32
        except zipfile.BadZipFile:
            raise ValueError(
                f"corrupt DCP chunk in {chunk.file} at byte {chunk.offset:,}: not a torch.save archive"
            ) from None
        if bad is not None:
            raise ValueError(
                f"corrupt: the bytes of {bad[-60:]!r} in {chunk.file} do not match the CRC-32 recorded for "
                "them, so the shard was damaged after it was written; skipped: copy or save it again"
            )
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)

    def tensors(self, stamps: Mapping[str, FileStamp]) -> dict[str, Tensor]:
        """Name -> the whole CPU tensor, every chunk copied into place (the stamps checked before and after).

        Raises:
            FileChanged: a shard changed since it was listed, or while it was read.
            ValueError: a chunk whose bytes, dtype or shape are not what the metadata says.
        """
        out = {n: torch.empty(size, dtype=dtype) for n, (dtype, size, _) in self.weights.items()}
        by_file: dict[str, list[tuple[str, _Chunk]]] = {}
        for name, (_, _, chunks) in self.weights.items():
            for c in chunks:
                by_file.setdefault(c.file, []).append((name, c))
        for file, items in sorted(by_file.items()):
            stamp = stamps[file]
            stamp.check()
            with open(stamp.path, "rb", buffering=0) as f:
                stamp.check("since it was listed", os.fstat(f.fileno()))
                for name, c in sorted(items, key=lambda i: i[1].offset):
                    part = self._load(c, stamp, f)
                    target = out[name][tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))]
                    if not isinstance(part, Tensor) or tuple(part.shape) != c.sizes or part.dtype != target.dtype:
                        raise ValueError(
                            f"corrupt DCP folder: chunk {list(c.offsets)} of {name[:80]!r} is not the "
                            f"{target.dtype} {list(c.sizes)} its .metadata says"
                        )
                    target.copy_(part)
                stamp.check("while it was being read", os.fstat(f.fileno()))
            stamp.check("while it was being read")
        return out

    def step(self, stamps: Mapping[str, FileStamp]) -> int | None:
        """The step stored beside the tensors (``global_step``, ``step`` or ``iter_num``), or ``None``."""
        for key in _STEP_KEYS:
            chunk = self.objects.get(key)
            if chunk is None:
                continue
            stamp = stamps[chunk.file]
            with open(stamp.path, "rb", buffering=0) as f:
                value = self._load(chunk, stamp, f)
            if isinstance(value, Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        return None


def _nbytes(dtype: torch.dtype, size: Sequence[int]) -> int:
    n = 1
    for s in size:
        n *= max(int(s), 0)
    return n * dtype.itemsize


@dataclass(frozen=True)
class DcpWeights(Weights):
    """A DCP folder's weights: its index is the folder's :class:`DcpIndex`, read from ``.metadata`` (``stamp``), its
    tensors from every shard (``stamps``, by file name); every chunk checked against its CRC-32s."""

    stamps: Mapping[str, FileStamp] = field(default_factory=dict, repr=False, compare=False)

    def meta(self) -> dict[str, Tensor]:
        return self.index.meta()

    def tensors(self) -> dict[str, Tensor]:
        return self.index.tensors(self.stamps)


def recognise(path: Path, entries: Entries | None) -> Match | None:
    """A folder of ``.metadata`` and shards (:func:`is_dcp`): the whole folder is one checkpoint, its metadata, shards
    and Lightning's ``meta.pt`` stamped."""
    if entries is None or not is_dcp(set(entries.names)):
        return None
    shards = sorted((n for n in entries.names if n.endswith(".distcp") or n == DCP_META), key=natural_key)
    return Match(files=(METADATA, *shards), used=entries.names, whole=True)


def inspect(folder: Path, trust: bool = False, stamps: Sequence[FileStamp] | None = None) -> CheckpointInfo:
    """A torch.distributed.checkpoint folder (never trusted: ``trust`` is not used): its ``.metadata`` read with a
    restricted unpickler (no code runs, trusted or not), its tensors assembled from every shard at their turn; its step
    stored beside them or in Lightning's ``meta.pt``."""
    info = CheckpointInfo(path=folder, kind="state_dict", format=FORMAT.name)
    try:
        given = {s.path.name: s for s in stamps or ()}
        if not given:
            given = {
                p.name: FileStamp.of(p)
                for p in folder.iterdir()
                if p.name == METADATA or p.name.endswith(".distcp") or p.name == DCP_META
            }
        index = DcpIndex.read(folder, given)
        info.weights = (DcpWeights(given[METADATA], index, "dcp", checksummed=True, stamps=given),)
        info.global_step = index.step(given)
        if info.global_step is None and DCP_META in given:  # Lightning's FSDP: the rest of the checkpoint
            meta = load_index(given[DCP_META], trust=False)
            if isinstance(meta, Mapping):
                info.global_step, _ = step_of(meta, TorchWeights(given[DCP_META], meta, "zip", checksummed=True))
    except FileChanged as e:
        info.error, info.weights = str(e), ()
        return info
    except Exception as e:
        info.weights = ()
        text = error_text(e)
        info.error = (
            text
            if text.startswith("incomplete")
            else (
                f"{text}; a torch.distributed.checkpoint folder can also be consolidated into one file with "
                "`python -m torch.distributed.checkpoint.format_utils dcp_to_torch "
                f"{printable(shlex.quote(str(folder)))} "
                f"{printable(shlex.quote(str(converted_path(folder, '.pt'))))}` (it unpickles .metadata: "
                "only for a folder you trust)"
            )
        )
        return info
    if info.global_step is None:
        info.notes.append("no global step in the folder: ordered and logged by its position instead")
    return info


#: The torch.distributed.checkpoint folder format.
FORMAT = CheckpointFormat("torch.distributed.checkpoint folder", recognise, inspect)
