"""Checkpoints, format by format: the list of formats satmon reads (:data:`FORMATS`, one module each under
:mod:`satmon.replaying.formats`), how a path is matched to one (:func:`recognise`, the only place that chooses a
format), and the loaders every format's weights go through (:func:`inspect_checkpoint`, :func:`meta_state_dict`,
:func:`state_dict_of`, :func:`load_checkpoint`). The listing is :mod:`satmon.replaying.listing`.

No code runs from a file unless trusted and no file is mapped: each format says how
(:mod:`~satmon.replaying.formats.torch_file`: ``torch.load(weights_only=True)`` unless ``trust=True``; the
others read data only). A format is added as one module exposing ``FORMAT`` (a
:class:`~satmon.replaying.formats.common.CheckpointFormat`) and one line in :data:`FORMATS`.

Example:
    >>> [f.name for f in FORMATS]
    ['torch.distributed.checkpoint folder', 'DeepSpeed folder', 'Hugging Face folder', 'torch', 'safetensors']
    >>> CHECKPOINT_SUFFIXES
    ('.ckpt', '.pt', '.pth', '.safetensors')
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from satmon.replaying.file_info import FileStamp
from satmon.replaying.formats import dcp, deepspeed, hf_folder, safetensors, torch_file
from satmon.replaying.formats.common import (
    TRUST_FLAG,
    CheckpointFormat,
    CheckpointInfo,
    Entries,
    Match,
    natural_key,
)
from satmon.replaying.formats.torch_file import extract_state_dict

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "FORMATS",
    "TRUST_FLAG",
    "CheckpointInfo",
    "extract_state_dict",
    "inspect_checkpoint",
    "load_checkpoint",
    "meta_state_dict",
    "order_checkpoints",
    "recognise",
    "state_dict_of",
]

#: The formats satmon reads (and the one it names without reading), in the order they are tried: folder formats
#: first (a DCP or DeepSpeed folder before a Hugging Face one), then file formats, by suffix.
FORMATS: tuple[CheckpointFormat, ...] = (
    dcp.FORMAT,
    deepspeed.FORMAT,
    hf_folder.FORMAT,
    torch_file.FORMAT,
    safetensors.FORMAT,
)
#: File suffixes a folder's files are listed by (the file formats').
CHECKPOINT_SUFFIXES = tuple(s for f in FORMATS for s in f.suffixes)
#: A file given by name whose suffix no format claims is read as a torch file (``torch.save`` writes any name).
BY_NAME = torch_file.FORMAT


def recognise(path: Path, entries: Entries | None) -> tuple[CheckpointFormat, Match] | None:
    """The first format of :data:`FORMATS` that recognises ``path`` (a file when ``entries`` is ``None``, else a
    folder of those entries), with its :class:`~satmon.replaying.formats.common.Match`; ``None`` when none does.

    Example:
        >>> fmt, match = recognise(Path("run/last.ckpt"), None)
        >>> fmt.name, recognise(Path("notes.txt"), None)
        ('torch', None)
    """
    for fmt in FORMATS:
        match = fmt.recognise(path, entries)
        if match is not None:
            return fmt, match
    return None


def inspect_checkpoint(
    path: str | Path, trust: bool = False, stamps: Sequence[FileStamp] | None = None
) -> CheckpointInfo:
    """Read a checkpoint's index once, by its format: its kind, global step and hyper-parameters; no tensor data is
    kept.

    Never raises: an unreadable, refused, changed or non-checkpoint file comes back with ``error`` set.

    Args:
        path: the file, or a checkpoint folder (Hugging Face, torch.distributed.checkpoint).
        trust: read torch files with ``weights_only=False`` (runs code stored in the file).
        stamps: the files' stamps from :func:`~satmon.replaying.listing.list_checkpoints` (taken now when not given).

    Example:
        >>> import os, tempfile, torch
        >>> f = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"model": {"w": torch.zeros(2)}, "iter_num": 7}, f)
        >>> info = inspect_checkpoint(f)
        >>> info.format, info.kind, info.global_step, info.error, info.checkpoint["model"]["w"].device
        ('torch', 'state_dict', 7, None, device(type='meta'))
    """
    path = Path(path)
    if path.is_dir():
        found = recognise(path, Entries.of(path))
        if found is None:
            folders = " / ".join(f.name for f in FORMATS if not f.suffixes)
            return CheckpointInfo(
                path=path,
                error=f"not a checkpoint: a folder in none of the formats satmon reads "
                f"({folders}) and no .ckpt/.pt file; pass the files inside it",
            )
        return found[0].inspect(path, trust, stamps)
    found = recognise(path, None)
    return (found[0] if found is not None else BY_NAME).inspect(path, trust, stamps)


def order_checkpoints(infos: Sequence[CheckpointInfo]) -> list[CheckpointInfo]:
    """Readable checkpoints by global step (files without one after them, by name); a ``last*.ckpt``
    whose step another file already has is dropped (Lightning's ``save_last`` copy)."""
    good = [i for i in infos if i.error is None]
    good.sort(
        key=lambda i: (i.global_step is None, i.global_step or 0, i.path.name.startswith("last"), natural_key(i.path))
    )
    steps = {i.global_step for i in good if not i.path.name.startswith("last")}
    return [
        i for i in good if not (i.path.name.startswith("last") and i.global_step is not None and i.global_step in steps)
    ]


# ------------------------------------------------------------------------------------------ weights
def meta_state_dict(info: CheckpointInfo) -> dict[str, Tensor]:
    """The checkpoint's weights as meta tensors (names, shapes and dtypes; no data read).

    Raises:
        ValueError: the checkpoint was not inspected successfully, or was already used.
    """
    _require(info)
    out: dict[str, Tensor] = {}
    for w in info.weights:
        out.update(w.meta())
    return out


def _require(info: CheckpointInfo) -> None:
    if info.error is not None:
        raise ValueError(f"Expected a readable checkpoint, got {info.path}: {info.error}")
    if not info.weights or any(w.index is None for w in info.weights):
        raise ValueError(
            f"Expected the index inspect_checkpoint read from {info.path}, got None (already used); "
            "inspect the file again."
        )


def state_dict_of(info: CheckpointInfo) -> dict[str, Tensor]:
    """The weights of an inspected checkpoint, read now from the file(s) with plain reads (the stamps
    checked before and after; only the weights are read, not an optimizer's state).

    Raises:
        ValueError: the file was not inspected successfully (or its index was already released).
        FileChanged: a file changed since it was listed.
    """
    _require(info)
    out: dict[str, Tensor] = {}
    for w in info.weights:
        out.update(w.tensors())
    return out


def load_checkpoint(info: CheckpointInfo) -> dict[str, Any]:
    """A Lightning checkpoint as ``load_from_checkpoint`` sees it, its tensors read now from the file
    (the optimizer and scheduler states are left unread, on the meta device).

    Raises:
        ValueError: not an inspected Lightning checkpoint.
        FileChanged: the file changed since it was listed.
    """
    _require(info)
    if info.kind != "lightning":
        raise ValueError(f"Expected a Lightning checkpoint, got a {info.kind} file: {info.path}")
    (w,) = info.weights  # a Lightning checkpoint is one torch file
    return w.checkpoint()
