"""One writer per output: an exclusive lock beside what a command writes, that names who holds it.

Two satmon processes told to write the same output (the same ``--json``, the same TensorBoard run
folder, the same grid ``--out``) must never share or clobber it. :func:`exclusive` takes a lock on a
small companion file (``.<name>.satmon-lock`` beside a file, ``.satmon-lock`` inside a folder) before any
work, and refuses at once with :class:`OutputBusy` when another live process holds it, naming that
process (pid, host, command, since when) and what to do.

The lock is an ``flock`` on the companion file: the kernel drops it when its process ends, however it
ends (a crash, ``kill -9``, a lost terminal), so a lock left by a killed process is recognised as stale
and taken over, and the holder it named is reported (:attr:`Lock.stale`). The companion file is opened
without following a symlink and must be a regular file: a FIFO, a device or a link put there is refused
by kind, never opened for reading or writing. Where ``flock`` is missing (not POSIX) an ``O_EXCL`` file
with the holder's pid stands in; a pid that no longer runs is stale.

On a network file system whose ``flock`` is local to each client, two machines can both take the lock:
give each machine its own output.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from satmon.io.atomic import OutputError
from satmon.paths import LOCK_SUFFIX, describe_mode, shorten

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["Lock", "OutputBusy", "exclusive", "hold", "lock_path"]

#: The companion file's name: beside a file output ``.NAME`` + this, inside a folder output this alone.
SUFFIX = LOCK_SUFFIX


class OutputBusy(OutputError):
    """Another live process holds the output's lock; the message names it and what to do."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass(frozen=True)
class Lock:
    """A held lock: its companion file, and the holder of a stale lock taken over (``None`` if none was).

    Attributes:
        path: the companion file.
        stale: what the stale lock's file said of its holder (``pid``, ``host``, ``command``, ``since``).
    """

    path: Path
    stale: dict[str, Any] | None = None

    def note(self) -> str | None:
        """One line about a stale lock taken over, or ``None``."""
        if not self.stale:
            return None
        return f"took over a stale lock on {self.path.parent} (left by {describe(self.stale)}, which no longer runs)"


def lock_path(path: str | os.PathLike, folder: bool | None = None) -> Path:
    """The companion file that guards ``path``: ``.NAME.satmon-lock`` beside a file, ``.satmon-lock`` in a folder.

    Example:
        >>> lock_path("out/replay.json", folder=False).as_posix()
        'out/.replay.json.satmon-lock'
        >>> lock_path("grid_out", folder=True).as_posix()
        'grid_out/.satmon-lock'
    """
    p = Path(path)
    if folder is None:
        folder = p.is_dir()
    return p / SUFFIX if folder else p.with_name(f".{p.name}{SUFFIX}")


def describe(holder: dict[str, Any]) -> str:
    """``pid 123 on host h (satmon replay ...), since 2026-12-02 06:40:00 UTC``, from what the holder wrote."""
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("host"):
        parts.append(f"on {holder['host']}")
    text = " ".join(parts)
    if holder.get("command"):
        text += f" ({shorten(str(holder['command']), 160)})"
    since = holder.get("since")
    if isinstance(since, (int, float)):
        text += ", since " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
    return text


def _me() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300],
        "since": time.time(),
    }


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        data = json.loads(raw.decode("utf-8")) if raw else {}
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _cannot(path: Path, what: str, e: OSError) -> OutputError:
    """One line, the reason first and the path shortened (a path near PATH_MAX never pushes the reason out)."""
    import errno

    reason = e.strerror or type(e).__name__
    todo = {
        errno.ENAMETOOLONG: "pass a shorter output path, or one nearer /",
        errno.EACCES: "check the folder's permissions, or pass another output",
        errno.EPERM: "check the folder's permissions, or pass another output",
        errno.EROFS: "pass an output on a writable file system",
        errno.ENOSPC: "free some space, or pass an output on another disk",
    }.get(e.errno or 0, "pass another output")
    return OutputError(
        f"Expected to take the one-writer lock of {what}, got {reason} ({type(e).__name__}) making "
        f"{shorten(path, 120)}: {todo}."
    )


def _open_regular(path: Path, what: str) -> int:
    """Open (creating) the companion file without following a link, refusing anything but a regular file."""
    flags = (
        os.O_RDWR
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _cannot(path, what, e) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(
            f"Expected the lock satmon keeps for {what} to be a regular file, got {describe_mode(st.st_mode)} "
            f"at {shorten(path, 120)}: remove it, or pass another output."
        )
    try:
        fd = os.open(path, flags, 0o644)
    # another user's lock file (a killed run's, or a live one's): flock needs no write access
    except PermissionError as e:
        if st is None:
            raise _cannot(path, what, e) from None
        try:
            fd = os.open(path, os.O_RDONLY | (flags & ~(os.O_RDWR | os.O_CREAT)))
        except OSError:
            raise _cannot(path, what, e) from None
    except OSError as e:
        raise _cannot(path, what, e) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between lstat and open
        os.close(fd)
        raise OutputError(
            f"Expected the lock satmon keeps for {what} to be a regular file, got something else at "
            f"{shorten(path, 120)}: remove it, or pass another output."
        )
    return fd


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@contextmanager
def exclusive(path: str | os.PathLike, what: str, folder: bool | None = None) -> Iterator[Lock]:
    """Hold the one-writer lock of the output ``path`` for the ``with`` block; refuse if another process holds it.

    Args:
        path: the output (a file or a folder; ``folder`` says which when it does not exist yet).
        what: how the message names the output, e.g. ``"--json"`` or ``"the grid folder --out"``.
        folder: ``True`` for a folder output, ``False`` for a file; ``None``: whatever ``path`` is now.

    Raises:
        OutputBusy: another live process holds the lock (its pid, host, command and start are in the message).
        OutputError: the companion file cannot be made, or is not a regular file.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "r.json"
        >>> with exclusive(out, "--json", folder=False) as held:
        ...     held.path.name
        '.r.json.satmon-lock'
        >>> held.path.exists()  # removed on exit
        False
    """
    lp = lock_path(path, folder)
    if fcntl is None:  # pragma: no cover - not POSIX
        with _exclusive_pidfile(lp, what) as held:
            yield held
        return
    while True:
        fd = _open_regular(lp, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise OutputBusy(
                f"Expected {what} {shorten(path, 120)} to be free, got it in use by {describe(holder)}: wait "
                "for that process to finish, or pass another output.",
                holder,
            ) from None
        except OSError as e:
            os.close(fd)
            raise OutputError(
                f"Expected to lock {what}, got {e.strerror or type(e).__name__} ({type(e).__name__}) on "
                f"{shorten(lp, 120)}: pass an output on a local file system."
            ) from None
        try:  # the file we locked must still be the one at the path (a holder may have removed it as we opened it)
            same = os.stat(lp, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _read_holder(fd)
    stale = (
        previous
        if previous.get("pid") not in (None, os.getpid()) or previous.get("host") not in (None, socket.gethostname())
        else None
    )
    try:  # who holds it, for messages (the kernel's flock is the lock): not said in another user's read-only lock file
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(_me()).encode("utf-8"))
    except OSError:
        pass
    try:
        yield Lock(lp, stale or None)
    finally:
        try:
            os.unlink(lp)  # while still held: a process that opened it now re-checks the inode and retries
        except OSError:
            pass
        os.close(fd)


@contextmanager
def hold(outputs: Iterable[tuple[str | os.PathLike, str, bool]]) -> Iterator[list[Lock]]:
    """Hold the one-writer lock of every output a command writes, for the ``with`` block: the one call each command
    makes once every argument and input has been checked (a refused command makes no lock file, no folder) and
    before its first write. Outputs are locked in one order (by their lock's path; one lock a path), so two commands
    that share some outputs never both write: the second is refused at the first lock it shares, and holds none.

    Args:
        outputs: ``(path, what, folder)`` for each output (as :func:`exclusive` takes them); the folders a lock goes in
            are made (they were checked writable).

    Raises:
        OutputBusy: another live process holds one of them (every lock taken so far is released).
        OutputError: a lock file cannot be made.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> with hold([(d / "a.json", "--json", False), (d / "out", "--out", True)]) as held:
        ...     sorted(p.path.name for p in held)
        ['.a.json.satmon-lock', '.satmon-lock']
        >>> with hold([(d / "a.json", "--json", False)]):
        ...     with hold([(d / "b.json", "--report", False), (d / "a.json", "--json", False)]):
        ...         pass  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        satmon.io.lock.OutputBusy: Expected --json .../a.json to be free, got it in use by pid ...
    """
    wanted: dict[str, tuple[str | os.PathLike, str, bool]] = {}
    for path, what, folder in outputs:
        wanted.setdefault(os.path.abspath(lock_path(path, folder)), (path, what, folder))
    with ExitStack() as stack:
        held = []
        for key in sorted(wanted):
            path, what, folder = wanted[key]
            try:
                Path(key).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _cannot(Path(key), what, e) from None
            held.append(stack.enter_context(exclusive(path, what, folder=folder)))
        yield held


@contextmanager
def _exclusive_pidfile(lp: Path, what: str) -> Iterator[Lock]:  # pragma: no cover - not POSIX
    stale = None
    for _ in range(2):
        try:
            fd = os.open(lp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            try:
                holder = json.loads(lp.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                holder = {}
            if _alive(holder.get("pid")):
                raise OutputBusy(
                    f"Expected {what} to be free, got it in use by {describe(holder)}: wait for that process "
                    f"to finish, or pass another output.",
                    holder,
                ) from None
            stale = holder
            lp.unlink(missing_ok=True)
    else:
        raise OutputError(f"Expected to take the lock {lp} for {what}: remove it if no satmon process runs.")
    try:
        os.write(fd, json.dumps(_me()).encode("utf-8"))
        yield Lock(lp, stale)
    finally:
        os.close(fd)
        lp.unlink(missing_ok=True)
