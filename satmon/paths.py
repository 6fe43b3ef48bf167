"""What a path is, decided once, by ``os.lstat``/``os.stat`` (never by opening it), and said in one phrase.

Every satmon command that lists, opens or writes a path asks :func:`kind_of` first: a FIFO would block ``open``
forever, a device would be read forever, a socket cannot be opened at all, and none of them holds a checkpoint,
an event file or a calibration. A symlink is followed, and said as one (``"a symlink to a FIFO"``), so a link to
``/dev/zero`` is never called "a broken symlink". A link that leads back to itself is a loop; a name over the
file system's ``NAME_MAX`` or a path over ``PATH_MAX`` is said with the limit (never ``[Errno 36] File name too
long``). :func:`open_regular` opens a file without blocking and checks the opened file again (a FIFO put at the
name since it was checked is not read). This module uses the standard library only, so every layer may use it.

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.mkfifo(os.path.join(d, "w.ckpt"))
    >>> os.symlink("/dev/zero", os.path.join(d, "zero.pt"))
    >>> kind_of(os.path.join(d, "w.ckpt")).describe(), kind_of(os.path.join(d, "zero.pt")).describe()
    ('a FIFO (named pipe)', 'a symlink to a character device (/dev/zero)')
    >>> kind_of(os.path.join(d, "x" * 300)).describe()
    "a name of 300 bytes, over the file system's limit of 255 (NAME_MAX)"
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

#: satmon's own files, named once: the Hugging Face callback's resume state in each ``checkpoint-N/`` and the
#: live probe's calibration batches beside a run's logs (a replay uses them as ``--data``).
STATE_FILE = "satmon_state.pt"
CALIBRATION_FILE = "satmon_calibration.pt"

__all__ = [
    "CALIBRATION_FILE",
    "LOCK_SUFFIX",
    "STATE_FILE",
    "TEMP_EXTRA",
    "NotRegular",
    "PathKind",
    "PathTooLong",
    "beside",
    "check_room",
    "describe_mode",
    "event_file",
    "kind_of",
    "kind_phrase",
    "length_problem",
    "not_a_folder",
    "open_regular",
    "require_regular",
    "shorten",
]

#: What satmon's atomic replace adds to a file's name for its temporary: ``.NAME.`` + 8 random characters + ``.tmp``.
TEMP_EXTRA = len("..") + 8 + len(".tmp")
#: The one-writer lock's companion file: ``.NAME`` + this beside a file, this alone inside a folder.
LOCK_SUFFIX = ".satmon-lock"

#: ``kind`` -> the phrase that names it.
_WORDS = {
    "file": "a regular file",
    "folder": "a folder",
    "fifo": "a FIFO (named pipe)",
    "socket": "a socket",
    "char-device": "a character device",
    "block-device": "a block device",
    "other": "not a regular file",
    "missing": "no such file or folder",
    "broken-link": "a broken symlink",
    "link-loop": "a symlink loop",
    "too-long": "a path too long for the system",
    "unstattable": "a path that cannot be examined",
}
#: Kinds that are something on disk satmon never opens.
SPECIAL = ("fifo", "socket", "char-device", "block-device", "other")


def _kind_of_mode(mode: int) -> str:
    for test, kind in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "folder"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "char-device"),
        (stat.S_ISBLK, "block-device"),
    ):
        if test(mode):
            return kind
    return "other"


def describe_mode(mode: int) -> str:
    """The phrase for a ``stat`` mode, a symlink not followed (``os.lstat``'s): ``"a symbolic link"``, ``"a FIFO (named
    pipe)"``...

    Example:
        >>> describe_mode(stat.S_IFIFO | 0o644), describe_mode(stat.S_IFLNK | 0o777)
        ('a FIFO (named pipe)', 'a symbolic link')
    """
    return "a symbolic link" if stat.S_ISLNK(mode) else _WORDS[_kind_of_mode(mode)]


@dataclass(frozen=True)
class PathKind:
    """What a path names, read with ``lstat``/``stat`` only.

    Attributes:
        path: the path as given.
        kind: ``"file"``, ``"folder"``, ``"fifo"``, ``"socket"``, ``"char-device"``, ``"block-device"``, ``"other"``
            (something else that is not a regular file), ``"missing"``, ``"broken-link"``, ``"link-loop"``,
            ``"too-long"`` (a name over ``NAME_MAX`` or a path over ``PATH_MAX``) or ``"unstattable"`` (``stat``
            failed: a folder above it that cannot be searched...).
        link: the path is a symlink (what it leads to is ``kind``).
        target: where the link points (``os.readlink``), for the phrase; ``""`` when not a link.
        detail: the limit or the error, for ``"too-long"`` and ``"unstattable"``.
        st: the ``stat`` result (symlinks followed) when there is one.
        reason: the system's words for why ``stat`` failed (``"Permission denied"``), for ``"unstattable"``.
    """

    path: str
    kind: str
    link: bool = False
    target: str = ""
    detail: str = ""
    st: os.stat_result | None = None
    reason: str = ""  #: the system's words for why ``stat`` failed (``"Permission denied"``)

    @property
    def regular(self) -> bool:
        """A regular file (through a link or not): the only kind satmon opens for reading."""
        return self.kind == "file"

    @property
    def special(self) -> bool:
        """A FIFO, a socket, a device or another non-file on disk: listed as such, never opened."""
        return self.kind in SPECIAL

    @property
    def exists(self) -> bool:
        """Something is at the path (a broken link or a loop included)."""
        return self.kind != "missing"

    def describe(self) -> str:
        """The phrase for messages: ``"a FIFO (named pipe)"``, ``"a symlink to a socket"``, ``"a broken symlink (to
        gone.ckpt)"``, ``"a name of 300 bytes, over the file system's limit of 255 (NAME_MAX)"``."""
        if self.kind in ("too-long", "unstattable"):
            return self.detail
        if self.kind == "broken-link":
            return f"a broken symlink (to {_shown(self.target)}, which does not exist)"
        if self.kind == "link-loop":
            return "a symlink loop (the link leads back to itself: there is no file at its end)"
        words = _WORDS[self.kind]
        if self.link:
            return f"a symlink to {words}" + (f" ({_shown(self.target)})" if self.special else "")
        return words


def _shown(text: str, limit: int = 80) -> str:
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text[:400])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _limit(path: str, name: str, default: int) -> int:
    """The file system's ``pathconf`` limit at the nearest existing folder above ``path``."""
    folder = os.path.dirname(os.path.abspath(path)) if len(path) < 4096 else os.getcwd()
    while folder and folder != os.path.dirname(folder):
        try:
            return int(os.pathconf(folder, name))
        except (OSError, ValueError):
            folder = os.path.dirname(folder)
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError, AttributeError):
        return default


def length_problem(path: str | os.PathLike) -> str | None:
    """Which of the system's limits ``path`` is over, in words, or ``None``: a name over ``NAME_MAX`` (checked first:
    it is what to shorten), a path over ``PATH_MAX``.

    Example:
        >>> length_problem("ok/name.pt") is None
        True
        >>> length_problem("a/" * 2100 + "w.pt")
        "a path of 4,204 bytes, over the system's limit of 4,096 (PATH_MAX)"
    """
    text = os.fspath(path)
    raw = os.fsencode(text)
    name_max = _limit(text, "PC_NAME_MAX", 255)
    for part in raw.split(b"/"):
        if len(part) > name_max:
            return f"a name of {len(part):,} bytes, over the file system's limit of {name_max:,} (NAME_MAX)"
    path_max = _limit(text, "PC_PATH_MAX", 4096)
    if len(raw) >= path_max:
        return f"a path of {len(raw):,} bytes, over the system's limit of {path_max:,} (PATH_MAX)"
    return None


def shorten(path: str | os.PathLike, limit: int = 100) -> str:
    """``path`` for a one-line message: printable, and a long one cut in its middle (its start and its end, where the
    name is, kept), so that the reason after it is never cut off.

    Example:
        >>> shorten("/tmp/" + "d" * 300 + "/.satmon-lock", 40)
        '/tmp/dddddddd...ddddddddddd/.satmon-lock'
    """
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in os.fspath(path))
    if len(text) <= limit:
        return text
    tail = min(len(text) // 2, max(limit * 3 // 5, len(os.path.basename(text)) + 10))
    head = max(limit - tail - 3, 10)
    return text[:head] + "..." + text[-tail:]


def beside(path: str | os.PathLike) -> list[str]:
    """What satmon writes beside a file it writes: the temporary of its atomic replace and its one-writer lock (the
    longest each can be), for :func:`check_room`.

    Example:
        >>> beside("out/r.json")
        ['out/.r.json.XXXXXXXX.tmp', 'out/.r.json.satmon-lock']
    """
    folder, name = os.path.split(os.fspath(path))
    return [os.path.join(folder, f".{name}.XXXXXXXX.tmp"), os.path.join(folder, f".{name}{LOCK_SUFFIX}")]


def event_file(folder: str | os.PathLike) -> str:
    """The longest name TensorBoard's writer can give an event file in ``folder`` on this machine
    (``events.out.tfevents.TIME.HOST.PID.N``: a 10-digit time, this host's name, a 7-digit pid, a 4-digit count).

    Example:
        >>> os.path.basename(event_file("run")).startswith("events.out.tfevents.9999999999.")
        True
    """
    import socket

    return os.path.join(os.fspath(folder), f"events.out.tfevents.{'9' * 10}.{socket.gethostname()}.{'9' * 7}.{'9' * 4}")


class PathTooLong(ValueError):
    """A path the user gave, or one satmon writes beneath it, over the system's ``NAME_MAX`` or ``PATH_MAX``; the
    message names the option, the length, the limit and what to do.

    Attributes:
        option: how the user named the path (``"--logdir"``).
        length: the bytes of the name or path that is over.
        limit: the limit it is over.
    """

    def __init__(self, message: str, option: str, length: int, limit: int) -> None:
        super().__init__(message)
        self.option, self.length, self.limit = option, length, limit


def _absolute_lengths(text: str) -> int:
    """The bytes of ``text`` as the writers pass it: the longest of it as given, made absolute, and resolved."""
    lengths = [len(os.fsencode(text)), len(os.fsencode(os.path.abspath(text)))]
    try:
        lengths.append(len(os.fsencode(os.path.realpath(text))))
    except (OSError, ValueError):
        pass
    return max(lengths)


def check_room(
    option: str, given: str | os.PathLike, writes: Iterable[str | os.PathLike] = (), names: str = ""
) -> None:
    """Refuse, before any work, a path the user gave when it, or any path satmon will write beneath or beside it,
    is over the system's limits: each name against ``NAME_MAX``, each whole path (made absolute, and resolved, as the
    writers use it) against ``PATH_MAX``, both read with ``os.pathconf`` where the path is.

    The one check every command makes for every output it is given (``--logdir``, ``--out``, ``--json``, ``--report``,
    ``--plot``...): the writers say which paths they make (:func:`beside` for a file's temporary and lock,
    :func:`event_file` for TensorBoard's, ``version_N``, cards, checkpoints, grid cells...), counted at the longest
    they can be, so a command is never stopped by ``[Errno 36] File name too long`` after its work.

    Args:
        option: how the user named the path, for the message (``"--logdir"``).
        given: the path the user gave.
        writes: the paths satmon will write, each starting with ``given`` (or beside it).
        names: what the user shortens when a name satmon makes beneath is over ``NAME_MAX`` (``"--vary value"``: the
            grid names its cells by them); default: ``option`` or the name.

    Raises:
        PathTooLong: one line: the option, the length, the limit and what to do.

    Example:
        >>> check_room("--out", "out", ["out/calibration.json", *beside("out/calibration.json")]) is None
        True
        >>> check_room("--logdir", "/tmp/" + "d" * 250, [os.path.join("/tmp/" + "d" * 250, "v" * 10)])
        >>> check_room("--logdir", "logs", ["logs/" + "n" * 300])  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.paths.PathTooLong: Expected the names satmon writes in --logdir to fit the file system, got a name of
        300 bytes ('nnnnnnnnnnnnnnnnnnnn...', which satmon makes there) over the file system's limit of 255 (NAME_MAX):
        pass a shorter --logdir or name.
    """
    text = os.fspath(given)
    name_max = _limit(text, "PC_NAME_MAX", 255)
    path_max = _limit(text, "PC_PATH_MAX", 4096)
    for part in os.fsencode(text).split(b"/"):
        if len(part) > name_max:
            shown = _shown(os.fsdecode(part), 40)
            raise PathTooLong(
                f"Expected {option} to be a path whose names are at most {name_max:,} bytes each (the file "
                f"system's limit, NAME_MAX), got {len(part):,} bytes in {shown!r}: pass a shorter path.",
                option,
                len(part),
                name_max,
            )
    own = _absolute_lengths(text)
    if own >= path_max:
        raise PathTooLong(
            f"Expected {option} to be a path shorter than {path_max:,} bytes (the system's limit, PATH_MAX), "
            f"got {own:,} bytes once made absolute: pass a shorter path, or one nearer /.",
            option,
            own,
            path_max,
        )
    base = os.path.abspath(text)
    grown = max(own - len(os.fsencode(base)), 0)  # resolved longer than absolute: the writers that resolve get there
    deepest, deepest_len = "", 0
    for written in writes:
        full = os.path.abspath(os.fspath(written))
        under = full.startswith(base.rstrip("/") + "/")
        rel = os.path.relpath(full, base if under else os.path.dirname(base))
        for part in os.fsencode(rel).split(b"/"):
            if len(part) > name_max:
                shown = _shown(os.fsdecode(part), 40)
                raise PathTooLong(
                    f"Expected the names satmon writes in {option} to fit the file system, got a name of "
                    f"{len(part):,} bytes ({shown!r}, which satmon makes there) over the file system's "
                    f"limit of {name_max:,} (NAME_MAX): pass a shorter {names or option + ' or name'}.",
                    option,
                    len(part),
                    name_max,
                )
        n = len(os.fsencode(full)) + grown
        if n > deepest_len:
            deepest, deepest_len = rel, n
    if deepest_len >= path_max:
        room = path_max - 1 - (deepest_len - own)
        made = " (made absolute)" if own > len(os.fsencode(text)) else ""
        raise PathTooLong(
            f"Expected {option} to leave room for the paths satmon writes beneath it, got a path of {own:,} "
            f"bytes{made} whose deepest file ({_shown(deepest, 90)}) would be {deepest_len:,} bytes, over the "
            f"system's limit of {path_max:,} (PATH_MAX): pass a {option} of at most {max(room, 0):,} bytes{made} "
            "(a shorter folder, or one nearer /).",
            option,
            deepest_len,
            path_max,
        )


def kind_of(path: str | os.PathLike, entry: os.DirEntry | None = None) -> PathKind:
    """What ``path`` names, by ``os.lstat`` then (for a link) ``os.stat``: nothing is opened.

    ``entry``: the ``os.scandir`` entry of ``path`` when it comes from a listing (its ``stat`` calls are used).

    Example:
        >>> import tempfile
        >>> kind_of(tempfile.mkdtemp()).kind, kind_of("/no/such/file").kind, kind_of("/dev/null").describe()
        ('folder', 'missing', 'a character device')
    """
    text = os.fspath(path)
    lstat_ = (lambda: entry.stat(follow_symlinks=False)) if entry is not None else (lambda: os.lstat(text))
    stat_ = (lambda: entry.stat(follow_symlinks=True)) if entry is not None else (lambda: os.stat(text))
    try:
        lst = lstat_()
    except FileNotFoundError:
        return PathKind(text, "missing")
    except OSError as e:
        return _failed(text, e)
    except ValueError as e:  # a NUL byte in the name
        return PathKind(text, "unstattable", detail=f"a path the system cannot take ({e})")
    if not stat.S_ISLNK(lst.st_mode):
        return PathKind(text, _kind_of_mode(lst.st_mode), st=lst)
    try:
        target = os.readlink(text)
    except OSError:
        target = "?"
    try:
        st = stat_()
    except FileNotFoundError:
        return PathKind(text, "broken-link", link=True, target=target)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return PathKind(text, "link-loop", link=True, target=target)
        if e.errno == errno.ENAMETOOLONG:  # the link is short: where it points is not
            limit = length_problem(os.path.join(os.path.dirname(text), target)) or "a path too long for the system"
            return PathKind(text, "too-long", link=True, target=target, detail=f"a symlink to {limit}")
        found = _failed(text, e)
        return PathKind(text, found.kind, link=True, target=target, detail=found.detail, reason=found.reason)
    return PathKind(text, _kind_of_mode(st.st_mode), link=True, target=target, st=st)


def _failed(text: str, e: OSError) -> PathKind:
    if e.errno == errno.ENAMETOOLONG:
        return PathKind(
            text, "too-long", detail=length_problem(text) or "a path too long for the system (ENAMETOOLONG)"
        )
    if e.errno == errno.ELOOP:
        return PathKind(text, "link-loop")
    reason = e.strerror or type(e).__name__
    return PathKind(text, "unstattable", detail=f"a path that cannot be examined ({reason})", reason=reason)


def not_a_folder(path: str | os.PathLike) -> str | None:
    """What is at ``path`` where a folder goes (an output folder, created if missing), or ``None``: a folder, nothing
    yet, or a path whose kind cannot be read (a name too long, a file above it: the length and folder checks say).

    Example:
        >>> import tempfile
        >>> not_a_folder(tempfile.mkdtemp()), not_a_folder("/dev/null")
        (None, 'a character device')
    """
    kind = kind_of(path)
    if kind.kind in ("folder", "missing", "too-long", "unstattable"):
        return None
    return "a file" if kind.regular else kind.describe()


def kind_phrase(path: str | os.PathLike) -> str:
    """What is at ``path`` in a message's words (:func:`satmon.paths.kind_of`): ``"a file"`` for a regular file, else
    its kind (``"a socket"``, ``"a FIFO (named pipe)"``, ``"a symlink loop ..."``), never "a file" for what is not one.

    Example:
        >>> kind_phrase("/dev/null")
        'a character device'
    """
    kind = kind_of(path)
    return "a file" if kind.regular and not kind.link else kind.describe()


class NotRegular(ValueError):
    """A path that is not a regular file where one is needed; the message names its kind and what to do."""

    def __init__(self, message: str, kind: PathKind) -> None:
        super().__init__(message)
        self.kind = kind


def require_regular(path: str | os.PathLike, what: str, todo: str) -> PathKind:
    """``path``'s kind when it is a regular file; else :class:`NotRegular` in one line naming what it is.

    Args:
        path: the path the user gave.
        what: how the user named it (``"--data"``).
        todo: what to do instead (``"pass the calibration batches' file"``).

    Example:
        >>> require_regular("/dev/null", "--data", "pass a torch.save'd file")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.paths.NotRegular: Expected --data to be a regular file, got '/dev/null', which is a character device:
        pass a torch.save'd file (it was not opened).
    """
    kind = kind_of(path)
    if kind.regular:
        return kind
    raise NotRegular(
        f"Expected {what} to be a regular file, got {_shown(os.fspath(path), 240)!r}, which is "
        f"{kind.describe()}: {todo} (it was not opened).",
        kind,
    )


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of ``path``, opened without blocking and checked again once open: a FIFO or a device
    put at the name after it was checked is closed unread (:class:`NotRegular`). The descriptor blocks as usual.

    Raises:
        NotRegular: the opened file is not a regular file.
        OSError: it cannot be opened.
    """
    fd = os.open(
        path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(
                f"Expected a regular file at {_shown(os.fspath(path), 240)!r}, got "
                f"{_WORDS[_kind_of_mode(st.st_mode)]}: not read.",
                PathKind(os.fspath(path), _kind_of_mode(st.st_mode), st=st),
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
