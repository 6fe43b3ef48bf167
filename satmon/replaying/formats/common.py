"""The shape every checkpoint format has, and what the formats share.

A format is one module of this package exposing ``FORMAT``, a :class:`CheckpointFormat`: its name, the file
suffixes a folder's files are listed by (files only), ``recognise(path, entries)`` (does this file, or this folder
of ``entries``, hold a checkpoint of the format: a :class:`Match` naming the files to stamp, or ``None``) and
``inspect(path, trust, stamps)`` (read its index once: a :class:`CheckpointInfo` whose ``weights`` are
:class:`Weights`, each of which gives its tensors as meta tensors and, at the checkpoint's turn, for real).
:mod:`satmon.replaying.checkpoints` holds the list of formats, in the order they are tried; nothing else dispatches
on a format.

Example:
    >>> Match(files=("model.safetensors",)).whole, natural_key("step-10.ckpt") > natural_key("step-9.ckpt")
    (False, True)
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from satmon.paths import NotRegular, open_regular
from satmon.replaying.file_info import FileStamp
from satmon.replaying.user_code import error_line, printable

__all__ = [
    "CheckpointFormat",
    "CheckpointInfo",
    "Entries",
    "Match",
    "Weights",
    "converted_path",
    "error_text",
    "file_head",
    "is_text",
    "natural_key",
    "packed_as",
]

#: The command-line opt-in named in the refusals that may be trusted.
TRUST_FLAG = "--trust-checkpoints"


def natural_key(path: Path | str) -> list[Any]:
    """Sort key in which ``step-9`` comes before ``step-10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


@dataclass(frozen=True)
class Entries:
    """A folder's entries as the listing read them: the names of its regular files and its subfolders."""

    names: frozenset[str]
    folders: tuple[Path, ...] = ()

    @classmethod
    def of(cls, folder: Path) -> Entries:
        """The entries of ``folder`` now (links followed)."""
        files, folders = set(), []
        for p in folder.iterdir():
            if p.is_file():
                files.add(p.name)
            elif p.is_dir():
                folders.append(p)
        return cls(frozenset(files), tuple(folders))


@dataclass(frozen=True)
class Match:
    """A checkpoint a format recognised.

    Attributes:
        files: the files (of a folder) its weights and index are read from, stamped by the listing in this order;
            ``()`` for a single file (the file itself).
        used: every file name of the folder the checkpoint accounts for (not listed on their own).
        whole: the folder is the checkpoint: nothing else under it is searched.
        unsupported: why satmon does not read this format, with the command that converts it (``None``: it reads it).
    """

    files: tuple[str, ...] = ()
    used: frozenset[str] = frozenset()
    whole: bool = False
    unsupported: str | None = None


@dataclass(frozen=True)
class Weights:
    """One file holding weights: its stamp from the listing and its index (no tensor data); each format subclasses it.

    Attributes:
        stamp: the file's identity when it was listed.
        index: what inspection read (``None`` once released).
        layout: how the file stores its tensors, in words for messages and tests (``"zip"``, ``"safetensors"``...).
        checksummed: its bytes are checked against checksums the file records as they are read.
    """

    stamp: FileStamp
    index: Any = field(default=None, repr=False, compare=False)
    layout: str = ""
    checksummed: bool = False

    def meta(self) -> dict[str, Tensor]:
        """The model's weights in this file as meta tensors (names, shapes, dtypes; nothing read)."""
        raise NotImplementedError

    def tensors(self) -> dict[str, Tensor]:
        """The model's weights in this file, read now (the stamp checked before and after)."""
        raise NotImplementedError


@dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint format: how it is recognised and inspected (its module's ``FORMAT``).

    Attributes:
        name: the format, in words (``"torch"``, ``"safetensors"``, ``"Hugging Face folder"``...).
        recognise: ``(path, entries)`` -> a :class:`Match` or ``None``; ``entries`` is ``None`` for a file.
        inspect: ``(path, trust, stamps)`` -> a :class:`CheckpointInfo` (never raises: ``error`` set instead).
        suffixes: the suffixes a folder's files are listed by (a file format's).
    """

    name: str
    recognise: Callable[[Path, Entries | None], Match | None]
    inspect: Callable[[Path, bool, Sequence[FileStamp] | None], Any]
    suffixes: tuple[str, ...] = ()


@dataclass
class CheckpointInfo:
    """One checkpoint (a file, or a Hugging Face ``checkpoint-N`` folder) as :func:`inspect_checkpoint` read it.

    Attributes:
        path: the file or folder.
        kind: ``"lightning"`` (a Lightning ``.ckpt`` dict) or ``"state_dict"`` (plain weights).
        global_step: the optimizer step stored with it; ``None`` when it holds none.
        hparams: the model's hyper-parameters (Lightning ``hyper_parameters``), ``{}`` if absent.
        datamodule_hparams: the datamodule's hyper-parameters, ``{}`` if absent.
        weights_only: read with ``torch.load(weights_only=True)`` (``False`` only when trusted).
        notes: things the user should know (no step in the file...).
        error: why the checkpoint cannot be replayed; ``None`` when it can.
        refused: ``weights_only=True`` refused the file (``trust=True`` would read it).
        unsafe: what torch refused is a global that runs code (``posix.system``, ``exec``...): not safe
            to allow, so no advice to trust the file is given.
        hparams_name: the ``__init__`` argument the hyper-parameters were saved from, when one was
            (Lightning's ``hparams_name``: ``save_hyperparameters(config)`` passes them back as ``config``).
        checkpoint: the index that was read: the stored object with every tensor on the meta device
            (``None`` for ``.safetensors``, unreadable files, and once the replay loop has used it).
        hf: a Hugging Face Trainer/``save_pretrained`` folder.
        weights: the files its weights are read from, each with its index (:class:`Weights`).
        format: the name of the :class:`CheckpointFormat` that read it (``"torch"``, ``"safetensors"``...).
    """

    path: Path
    kind: str = "state_dict"
    global_step: int | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    datamodule_hparams: dict[str, Any] = field(default_factory=dict)
    weights_only: bool = True
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    refused: bool = False
    unsafe: bool = False
    hparams_name: str | None = None
    checkpoint: Any = field(default=None, repr=False, compare=False)
    hf: bool = False
    weights: tuple[Weights, ...] = field(default=(), repr=False, compare=False)
    format: str = ""

    def release(self) -> None:
        """Drop the index (the loop calls this once the model holds the weights)."""
        self.checkpoint = None
        self.weights = tuple(dataclasses.replace(w, index=None) for w in self.weights)


#: Compressed and archive formats a checkpoint is shipped in, by their first bytes: (magic, what, unpack command).
_PACKED = (
    (b"\x1f\x8b", "gzip-compressed", "gunzip -c {src} > {out}"),
    (b"BZh", "bzip2-compressed", "bunzip2 -c {src} > {out}"),
    (b"\xfd7zXZ\x00", "xz-compressed", "xz -dc {src} > {out}"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -dc {src} -o {out}"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "7z x {src} -o{folder}"),
)


_TAR_COMMAND = "mkdir -p {folder} && tar -x{z}f {src} -C {folder}"


def _is_tar(block: bytes) -> bool:
    return block[257:262] == b"ustar"


def packed_as(path: Path, head: bytes) -> str | None:
    """What a file is when it is a compressed file or an archive (a checkpoint shipped as ``.pt.gz``, a tar of a
    checkpoint folder) rather than a checkpoint, from its first bytes, with the command that unpacks it beside it;
    ``None`` when it is neither.

    Example:
        >>> import gzip
        >>> print(packed_as(Path("run/w.pt"), gzip.compress(b"\\x80\\x02")).split("; ")[0])
        not a PyTorch checkpoint: a gzip-compressed file
        >>> print(packed_as(Path("run/w.pt"), gzip.compress(b"\\x80\\x02")).split(": ")[-1])
        `gunzip -c run/w.pt > run/w-unpacked.pt`
    """
    src = shlex.quote(str(path))
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    out, folder = (
        shlex.quote(str(path.with_name(f"{stem or 'checkpoint'}-unpacked{s}"))) for s in (path.suffix or ".pt", "")
    )
    if _is_tar(head):
        what, command = "a tar archive", _TAR_COMMAND.format(folder=folder, z="", src=src)
    else:
        found = next(((what, command) for magic, what, command in _PACKED if head.startswith(magic)), None)
        if found is None:
            return None
        what, command = found
        if head.startswith(b"\x1f\x8b"):  # a tar inside? its first block says (a few KiB inflated, never more)
            try:
                inner = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 512)
            except zlib.error:
                inner = b""
            if _is_tar(inner):
                what, command = (
                    "a gzip-compressed tar archive (.tar.gz)",
                    _TAR_COMMAND.format(folder=folder, z="z", src=src),
                )
            else:
                what = "a gzip-compressed file"
        elif not what.startswith("a "):
            what = f"{'an' if what[0] in 'aeiox' else 'a'} {what} file"
        command = command.format(src=src, out=out, folder=folder)
    return printable(f"not a PyTorch checkpoint: {what}; unpack it and replay what it holds: `{command}`")


def is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(b >= 32 or b in b"\t\n\r\f" for b in head)


def converted_path(
    folder: Path, suffix: str, suffixes: Sequence[str] = (".ckpt", ".pt", ".pth", ".safetensors")
) -> Path:
    """Where a consolidated copy of ``folder`` goes: beside it, ``NAME-consolidated.SUFFIX``."""
    stem = folder.name[: -len(folder.suffix)] if folder.suffix in suffixes else folder.name
    return folder.with_name(f"{stem or 'checkpoint'}-consolidated{suffix}")


#: How the errors satmon words itself begin: kept as they are (anything else is cut to its first line).
OWN_ERRORS = ("not a", "not read", "incomplete", "truncated", "corrupt", "over satmon's")


def error_text(e: BaseException) -> str:
    """An inspection's error in one line: satmon's own words kept (:data:`OWN_ERRORS`), anything else ``Type: line``."""
    return str(e)[:400] if str(e).startswith(OWN_ERRORS) else error_line(e)


def file_head(path: Path, n: int = 4096) -> tuple[int, bytes] | str:
    """``(size, first n bytes)`` of a regular file, opened without blocking; what it is instead when it cannot be
    read (a FIFO put there since the listing, a file gone...), in words."""
    try:
        fd = open_regular(path)
        try:
            return os.fstat(fd).st_size, os.read(fd, n)
        finally:
            os.close(fd)
    except NotRegular as e:
        return f"{e.kind.describe()}: not read"
    except OSError as e:
        return f"cannot read it: {error_line(e)}"
