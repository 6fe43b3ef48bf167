"""Outputs that never lose what was there: every file satmon writes is replaced only by a complete one.

:func:`atomic_write` writes to a temporary file beside the target (same folder, so the rename stays on
one file system), flushes it to disk and renames it over the target only once it is complete: an
interrupt, a crash or a full disk leaves the previous file exactly as it was. An existing target's
permission bits are kept. :func:`check_output` finds what would block an output before any work is
done (a missing or read-only folder, a folder where the file goes, a read-only file, an empty name,
a wrong suffix), so a command can refuse at once instead of failing after an hour of work.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["OutputError", "atomic_open", "atomic_write", "check_output"]


class OutputError(ValueError):
    """An output path that cannot be written; the message names the path, what blocks it and what to do."""


def check_output(path: str | os.PathLike | None, what: str, suffixes: Sequence[str] = ()) -> Path | None:
    """Check, before any work, that ``path`` can be written as a file; returns it as a ``Path`` (``None`` stays ``None``).

    Args:
        path: the output file (``None``: no such output asked for).
        what: how the user named it (``"--json"``), for the message.
        suffixes: the accepted suffixes (``(".json", ".jsonl")``); empty: any.

    Raises:
        OutputError: an empty name, a wrong suffix, a folder at the path, a read-only file, a parent
            that is a file or is not writable.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> check_output(d / "out.json", "--json", (".json",)) == d / "out.json"
        True
        >>> check_output(d, "--json", (".json",))
        Traceback (most recent call last):
        ...
        satmon.io.atomic.OutputError: Expected --json to name a file ending in .json, got ... (a folder): ...
    """
    if path is None:
        return None
    text = os.fspath(path)
    if not text.strip():
        raise OutputError(f"Expected {what} to name a file, got an empty name: pass a path such as out{suffixes[0] if suffixes else '.txt'}.")
    p = Path(text).expanduser()
    want = " or ".join(suffixes)
    if p.is_dir():
        raise OutputError(f"Expected {what} to name a file{' ending in ' + want if want else ''}, got {text!r} (a folder): "
                          f"name a file inside it, e.g. {str(p / ('out' + (suffixes[0] if suffixes else '.txt')))!r}.")
    if suffixes and p.suffix not in suffixes:
        raise OutputError(f"Expected {what} to end in {want}, got {text!r}: rename it, e.g. {str(p.with_suffix(suffixes[0]))!r}.")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"Expected the folder of {what} {text!r} to be a folder, got a file at {str(parent)!r}: choose another path.")
    existing = next((a for a in (parent, *parent.parents) if a.exists()), None)
    if existing is not None and not existing.is_dir():
        raise OutputError(f"Expected {what} {text!r} under a folder, got a file at {str(existing)!r}: choose another path.")
    if existing is not None and (not os.access(existing, os.W_OK | os.X_OK) or _read_only(existing)):
        raise OutputError(f"Expected a writable folder for {what} {text!r}, got {str(existing)!r}, which this user cannot "
                          "write to: choose another path or fix its permissions.")
    if p.exists() and (not os.access(p, os.W_OK) or _read_only(p)):
        raise OutputError(f"Expected {what} {text!r} to be writable, got a read-only file: make it writable "
                          f"(chmod u+w {text}) or choose another path. It was left as it is.")
    return p


def _read_only(p: Path) -> bool:
    """No write bit for anyone: the user marked it read-only (respected even when running as root)."""
    return not stat.S_IMODE(os.stat(p).st_mode) & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit it replaces ``path``, on an exception it is removed.

    The target keeps its permission bits when it existed (a new file gets the usual ``0o666 & ~umask``).

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> with atomic_open(target) as f:
        ...     _ = f.write("complete")
        >>> target.read_text()
        'complete'
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        try:
            mode_bits = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode_bits = 0o666 & ~umask
        os.chmod(tmp, mode_bits)
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:  # KeyboardInterrupt included: the target stays as it was
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(path: str | os.PathLike, data: str | bytes) -> bool:
    """Replace ``path`` by ``data`` in one rename; returns whether a file was there before (it was replaced).

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "r.json"
        >>> atomic_write(target, "[]"), atomic_write(target, "[1]"), target.read_text()
        (False, True, '[1]')
    """
    existed = Path(path).exists()
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return existed
