"""What satmon knows of a checkpoint file between its listing and its reading: its stamp (size, modification
time, inode, device), the errors of a file that changed or was damaged, and plain reads that cannot fault.

A training job may rewrite ``last.ckpt`` (or any checkpoint) while its folder is replayed. A file that is
memory-mapped and then shrinks kills the process with SIGBUS; one rewritten in place is read as new bytes under the
old index (a false "non-finite"). So satmon never maps a checkpoint: the listing records each file's
:class:`FileStamp`; every format checks it before and after it reads (:mod:`satmon.replaying.formats`), and reads
with :func:`read_exactly`. A file that changed at any point is named and skipped (:class:`FileChanged`), never read
half old, half new; one whose bytes do not match the checksums it records is :class:`CorruptFile`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CorruptFile", "FileChanged", "FileStamp", "corrupt_file", "read_exactly"]


class FileChanged(Exception):
    """A checkpoint changed (size, modification time, inode) since it was listed: it is skipped."""


class CorruptFile(ValueError):
    """A zip archive whose bytes do not match the CRC-32 its directory records (damaged
    after it was written): skipped."""


def corrupt_file(what: str) -> CorruptFile:
    """The error for ``what`` (``"the bytes of its record 'data.pkl'"``) not matching its recorded CRC-32."""
    return CorruptFile(
        f"corrupt: {what} do not match the CRC-32 its zip directory records, so the file was damaged "
        "after it was written (a cut-short or bad copy, a failing disk); skipped: copy or save it again"
    )


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
            raise FileChanged(
                f"changed {when} ({diff}): a job may be writing it; skipped (replay it again once it is complete)"
            )


def read_exactly(f: Any, offset: int, nbytes: int, stamp: FileStamp) -> bytearray:
    """``nbytes`` bytes of the open file ``f`` from ``offset``, with plain reads (never a map: a file that shrinks
    cannot fault); a short read is the file changing under it (:class:`FileChanged`)."""
    buf = bytearray(nbytes)
    view, done = memoryview(buf), 0
    f.seek(offset)
    while done < nbytes:
        n = f.readinto(view[done:])
        if not n:  # the file ends before its index says: it shrank since it was checked
            raise FileChanged(
                f"changed while it was being read (it ends at byte {offset + done:,}, its index needs "
                f"{offset + nbytes:,}; {stamp.difference() or 'rewritten'}): a job may be writing it; "
                "skipped (replay it again once it is complete)"
            )
        done += n
    return buf
