"""Records as they come: a JSON-lines file where each line is on disk before it counts.

:class:`PartialRecords` is what an interrupted (even killed) replay keeps of its records
(``FILE.partial.jsonl`` beside ``--json FILE``): each record is written whole and fsync'd; a write that
fails half-way (a full disk) is cut back off with ``ftruncate``, so the file always ends on a complete
record. The one writer of the file is whoever holds ``--json``'s lock (:func:`satmon.io.lock.exclusive`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["PartialRecords"]


class PartialRecords:
    """Append-only JSON lines, fsync'd per record, always ending on a complete record.

    The file is made afresh (a file or link already at ``path`` is unlinked, never written through: a
    symlink's target and a hard link's other names are left as they are) and gets the permissions of
    ``like``, the file it stands for, when that exists (a private ``--json`` stays private).

    Args:
        path: the file of partial records.
        like: the file whose permissions it takes.

    Attributes:
        replaced: a file was at ``path`` before (an earlier interrupted replay's records).
        count: records written.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "r.json.partial.jsonl"
        >>> w = PartialRecords(p, p.with_name("r.json"))
        >>> w.add({"step": 1}); w.add({"step": 2}); w.close()
        >>> p.read_text().splitlines(), w.count, w.replaced
        (['{"step": 1}', '{"step": 2}'], 2, False)
    """

    def __init__(self, path: Path, like: Path) -> None:
        self.path, self.count, self.size = Path(path), 0, 0
        self.replaced = os.path.lexists(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.replaced:
            os.unlink(self.path)
        self.fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666
        )
        if Path(like).exists():
            os.chmod(self.path, stat.S_IMODE(os.stat(like).st_mode))

    def add(self, record: Mapping[str, Any]) -> None:
        """Append one record, on disk before it counts; a write that fails (a full disk) is cut back off, so the
        file always ends on a complete record."""
        if self.fd is None:
            raise ValueError(
                f"Expected an open file of partial records, got {self.path} closed: make a new PartialRecords."
            )
        data = (json.dumps(record, allow_nan=False) + "\n").encode("utf-8")
        try:
            done = 0
            while done < len(data):
                done += os.write(self.fd, data[done:])
            os.fsync(self.fd)
        except BaseException:
            try:
                os.ftruncate(self.fd, self.size)  # freeing space always works
                os.lseek(self.fd, self.size, os.SEEK_SET)
            except OSError:
                pass
            raise
        self.size += len(data)
        self.count += 1

    def remove(self) -> None:
        """Close and remove the file (the complete records went to their final file)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
