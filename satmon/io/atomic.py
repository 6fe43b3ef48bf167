"""Outputs that never lose what was there: every file satmon writes is replaced only by a complete one.

:func:`atomic_write` writes to a temporary file beside the target (same folder, so the rename stays on
one file system), flushes it to disk and renames it over the target only once it is complete: an
interrupt, a crash or a full disk leaves the previous file exactly as it was. An existing target's
permission bits are kept. :func:`check_output` finds what would block an output before any work is
done (a missing or read-only folder, a folder where the file goes, a read-only file, an empty name,
a wrong suffix, a name too long for the file system once its temporary companion is counted), and
:func:`check_output_dir` the same for an output folder, so a command can refuse at once instead of failing
after an hour of work. Paths are used literally: no ``~`` or ``$VAR`` is expanded (a shell already did
that for unquoted words), so what is checked is what is written.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from satmon.paths import (
    LOCK_SUFFIX,
    TEMP_EXTRA,  # what atomic_open's temporary adds to a name, counted once where the path-limit check reads it
    PathTooLong,
    beside,
    check_room,
    kind_of,
    kind_phrase,
    not_a_folder,
)

__all__ = [
    "TEMP_EXTRA",
    "OutputError",
    "atomic_open",
    "atomic_write",
    "check_name_lengths",
    "check_output",
    "check_output_dir",
    "kind_phrase",
    "room",
]


class OutputError(ValueError):
    """An output path that cannot be written; the message names the path, what blocks it and what to do."""


def room(what: str, given: str | os.PathLike, writes: Sequence[str | os.PathLike] = (), names: str = "") -> None:
    """:func:`satmon.paths.check_room` (``given`` and every path written beneath or beside it within the system's
    limits) as an :class:`OutputError`."""
    try:
        check_room(what, given, writes, names)
    except PathTooLong as e:
        raise OutputError(str(e)) from None


def _limit(folder: Path, name: str, default: int) -> int:
    """The file system's ``pathconf`` limit ``name`` at the nearest existing folder at or above ``folder``."""
    existing = next((a for a in (folder, *folder.parents) if os.path.exists(a)), Path("."))  # False past PATH_MAX
    try:
        return int(os.pathconf(existing, name))
    except (OSError, ValueError, AttributeError):
        return default


def check_name_lengths(path: str | os.PathLike, what: str, extra: int = 0) -> None:
    """Every component of ``path`` (its last one ``extra`` bytes longer: a temporary companion) fits the file
    system's name limit, and the whole path its path limit; no part holds a control character (every message
    that names the path would send it to the terminal).

    Raises:
        OutputError: a name or path too long, or a control character, with the limit and what to do.

    Example:
        >>> check_name_lengths("out/r.json", "--json", TEMP_EXTRA) is None
        True
        >>> check_name_lengths("x" * 250 + ".json", "--json", TEMP_EXTRA)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.io.atomic.OutputError: Expected --json to name a file of at most 241 bytes (the file system's names are
        at most 255 bytes, and satmon writes it through a 14-byte longer temporary '.NAME.XXXXXXXX.tmp' beside it), got
        255 bytes: pass a shorter name.
    """
    text = os.fspath(path)
    if not text.isprintable():
        from satmon.io.safe_text import printable

        raise OutputError(
            f"Expected {what} to be a name without control characters (every message naming it would send "
            f"them to the terminal), got '{printable(text)}': pass another name."
        )
    real = _real(Path(path))
    name_max = _limit(real.parent, "PC_NAME_MAX", 255)
    parts = [part for part in Path(os.fspath(path)).parts if part != os.sep]
    for i, part in enumerate(parts):
        n = len(os.fsencode(part))
        if i == len(parts) - 1 and extra and n + extra > name_max:
            raise OutputError(
                f"Expected {what} to name a file of at most {name_max - extra} bytes (the file system's names "
                f"are at most {name_max} bytes, and satmon writes it through a {extra}-byte longer temporary "
                f"'.NAME.XXXXXXXX.tmp' beside it), got {n} bytes: pass a shorter name."
            )
        if n > name_max:
            raise OutputError(
                f"Expected {what} to be a path whose names are at most {name_max} bytes each (the file "
                f"system's limit), got {n} bytes in {part[:40]!r}...: pass a shorter path."
            )
    room(what, path, beside(path) if extra else ())  # the whole path, and its temporary's, within PATH_MAX


def check_output(path: str | os.PathLike | None, what: str, suffixes: Sequence[str] = ()) -> Path | None:
    """Check, before any work, that ``path`` can be written as a file; returns it as a
    ``Path`` (``None`` stays ``None``).

    Args:
        path: the output file (``None``: no such output asked for).
        what: how the user named it (``"--json"``), for the message.
        suffixes: the accepted suffixes (``(".json", ".jsonl")``), compared case-insensitively; empty: any.

    Raises:
        OutputError: an empty name, a name ending in a path separator, a wrong suffix, a folder (or a
            device, a pipe: anything but a regular file) at the path, a read-only file, a parent that is
            a file or is not writable.

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
    example = "out" + (suffixes[0] if suffixes else ".txt")
    if not text.strip():
        raise OutputError(f"Expected {what} to name a file, got an empty name: pass a path such as {example}.")
    p = Path(text)  # literally: no ~ or $VAR expansion
    want = " or ".join(suffixes)
    kind = kind_of(p)  # by lstat/stat: a FIFO, a socket, a device or a link to one is named, never opened
    if kind.kind == "too-long":
        raise OutputError(
            f"Expected {what} to be a path within the system's limits, got {kind.describe()}: pass a shorter path."
        )
    if kind.kind == "folder" or text.endswith((os.sep, "/")):
        raise OutputError(
            f"Expected {what} to name a file{' ending in ' + want if want else ''}, got {text!r} (a folder): "
            f"name a file inside it, e.g. {str(p / example)!r}."
        )
    if kind.special or kind.kind == "link-loop":
        raise OutputError(
            f"Expected {what} to name a regular file, got {text!r}, which is {kind.describe()}: choose "
            "another path (it was not opened)."
        )
    if suffixes and p.suffix.lower() not in {s.lower() for s in suffixes}:
        raise OutputError(
            f"Expected {what} to end in {want}, got {text!r}: rename it, e.g. {str(p.with_suffix(suffixes[0]))!r}."
        )
    check_name_lengths(p, what, TEMP_EXTRA)
    room(what, p, beside(p))  # its temporary and its lock, made absolute and resolved as they are written
    _check_folder(p.parent, what, text)  # as given: a broken link or a loop above it is named, never made through
    _check_folder(_real(p).parent, what, text)
    if p.exists() and (not os.access(p, os.W_OK) or _read_only(p)):
        raise OutputError(
            f"Expected {what} {text!r} to be writable, got a read-only file: make it writable "
            f"(chmod u+w {text}) or choose another path. It was left as it is."
        )
    return p


def check_output_dir(
    path: str | os.PathLike | None, what: str, beneath: Sequence[str | os.PathLike] = (), names: str = ""
) -> Path | None:
    """Check, before any work, that ``path`` is a folder that exists and is writable or can be made, with room
    beneath it for what satmon writes there (:func:`satmon.paths.check_room`).

    Args:
        path: the output folder (``None``: not asked for).
        what: how the user named it (``"--out"``), for the message.
        beneath: the paths the command writes under ``path`` (the deepest of each writer; the folder's lock
            ``.satmon-lock`` is always counted).
        names: what to shorten when a name made beneath is too long (:func:`satmon.paths.check_room`).

    Raises:
        OutputError: an empty name, a file (or anything but a folder) at the path or above it, a
            folder this user cannot write to.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> check_output_dir(d / "new" / "folder", "--out") == d / "new" / "folder"
        True
        >>> _ = (d / "f").write_text("x")
        >>> check_output_dir(d / "f", "--out")
        Traceback (most recent call last):
        ...
        satmon.io.atomic.OutputError: Expected --out to name a folder, got ... (a file): ...
    """
    if path is None:
        return None
    text = os.fspath(path)
    if not text.strip():
        raise OutputError(f"Expected {what} to name a folder, got an empty name: pass a path such as ./satmon_out.")
    p = Path(text)  # literally: no ~ or $VAR expansion
    check_name_lengths(p, what)
    room(what, p, [p / LOCK_SUFFIX, *beneath], names)
    said = not_a_folder(p)  # by lstat/stat: never opened
    if said is not None:
        raise OutputError(
            f"Expected {what} to name a folder, got {text!r} ({said}): choose another path; it was left as it is."
        )
    _check_folder(p, what, text)  # as given: a broken link or a loop above it is named, never made through
    _check_folder(_real(p) if p.exists() else _real(p).parent, what, text)
    return p


def _real(p: Path) -> Path:
    """``p`` with symlinks resolved where they exist (an output through a link goes where the link points)."""
    return Path(os.path.realpath(p))


def _check_folder(folder: Path, what: str, text: str) -> None:
    """The nearest existing folder at or above ``folder`` must be a folder this user can write to."""
    # the nearest entry, a link that leads nowhere or to itself included (os.path.exists says False for those)
    existing = next((a for a in (folder, *folder.parents) if os.path.lexists(a)), None)  # False past PATH_MAX
    if existing is not None and kind_of(existing).kind != "folder":
        raise OutputError(
            f"Expected {what} {text!r} under a folder, got {kind_phrase(existing)} at {str(existing)!r}: "
            "choose another path."
        )
    if existing is not None and (not os.access(existing, os.W_OK | os.X_OK) or _read_only(existing)):
        raise OutputError(
            f"Expected a writable folder for {what} {text!r}, got {str(existing)!r}, which this user cannot "
            "write to: choose another path or fix its permissions."
        )


def _read_only(p: Path) -> bool:
    """No write bit for anyone: the user marked it read-only (respected even when running as root)."""
    return not stat.S_IMODE(os.stat(p).st_mode) & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit it replaces ``path``, on an exception it is removed.

    The target keeps its permission bits when it existed (a new file gets the usual ``0o666 & ~umask``).
    A target that is a symlink is written where the link points (the link stays). A process killed
    in the middle (SIGKILL, power loss) can leave the hidden ``.<name>.<random>.tmp`` beside the
    target; the target itself is never partial.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> with atomic_open(target) as f:
        ...     _ = f.write("complete")
        >>> target.read_text()
        'complete'
    """
    target = _real(Path(path))
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
    _fsync_folder(target.parent)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: some file systems cannot open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: str | bytes) -> bool:
    """Replace ``path`` by ``data`` in one rename; returns whether a file was there before (it was replaced).

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "r.json"
        >>> atomic_write(target, "[]"), atomic_write(target, "[1]"), target.read_text()
        (False, True, '[1]')
    """
    existed = _real(Path(path)).exists()
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return existed
