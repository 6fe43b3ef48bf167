"""The listing of checkpoints: files as given, folders searched recursively (symlinks followed, loops detected),
each real file listed once and stamped (:class:`~satmon.replaying.file_info.FileStamp`), what is a checkpoint
decided by the formats (:func:`satmon.replaying.checkpoints.recognise`), and everything else named with why it was
left out: satmon's own files (:data:`SATMON_FILES`), the Trainer's state, FIFOs, sockets, devices, broken links,
loops, folders that cannot be read, formats satmon does not read. Only ``stat`` is called: no file is opened.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from satmon.paths import CALIBRATION_FILE, STATE_FILE, PathKind, kind_of
from satmon.replaying.checkpoints import CHECKPOINT_SUFFIXES, recognise
from satmon.replaying.file_info import FileStamp
from satmon.replaying.formats.common import Entries, natural_key
from satmon.replaying.formats.hf_folder import TRAINER_STATE_FILES
from satmon.replaying.user_code import ReplayUsageError, printable

__all__ = ["SATMON_FILES", "Listing", "find_checkpoints", "list_checkpoints", "nothing_to_replay", "satmon_file"]

#: satmon's own files, by name, and what each is: never a checkpoint, never an error (the names are satmon's:
#: ``drivers/live_probe.py``, ``drivers/hf.py``'s ``STATE_FILE``, ``io/trackers.py``, ``io/lock.py``, the replay's
#: partial records, ``io/atomic.py``'s temporaries; ``tests/replay/test_listing_kinds.py`` checks them against these).
SATMON_FILES = (
    (
        re.compile(re.escape(CALIBRATION_FILE)),
        "satmon's calibration batches (the live probe saved them; usable as --data)",
    ),
    (
        re.compile(re.escape(STATE_FILE)),
        "satmon's screening state (the Hugging Face callback's; it holds the live verdict)",
    ),
    (re.compile(r"satmon_\w+\.md"), "satmon's verdict card"),
    (
        re.compile(r".+\.partial\.jsonl"),
        "satmon's partial records of a replay still running or interrupted (--json FILE.partial.jsonl)",
    ),
    (re.compile(r"\.(.+\.)?satmon-lock"), "satmon's lock file (one writer per output)"),
    (re.compile(r"\..+\.[a-z0-9_]{8}\.tmp"), "satmon's temporary file of a write that was cut short"),
)


def satmon_file(name: str) -> str | None:
    """What satmon's own file ``name`` is (``None``: not one of satmon's).

    Example:
        >>> satmon_file("satmon_calibration.pt")
        "satmon's calibration batches (the live probe saved them; usable as --data)"
        >>> satmon_file(".replay.json.satmon-lock"), satmon_file("last.ckpt")
        ("satmon's lock file (one writer per output)", None)
    """
    return next((what for pattern, what in SATMON_FILES if pattern.fullmatch(name)), None)


@dataclass
class Listing:
    """What :func:`list_checkpoints` found: the checkpoints (with each file's stamp) and what it left out, and why.

    Attributes:
        paths: the checkpoints, files and Hugging Face folders, each real file once.
        stamps: path -> the stamps of the files it is read from (a folder's weight files).
        left_out: ``(path, why)`` of every file not listed (not a checkpoint suffix, Trainer state, the
            ``--data`` file, a second link to a listed file, a FIFO or a device, a symlink loop...).
        explicit: the paths given on the command line that were left out (said on stderr).
        satmon_files: ``(path, what)`` of satmon's own files (its calibration batches, its state, its cards, partial
            records, locks): neither checkpoints nor left out.
        calibration: the first ``satmon_calibration.pt`` found (the live probe's batches: usable as ``--data``).
        states: the ``satmon_state.pt`` files found (a Hugging Face run's satmon state, with its live verdict).
        unsupported: ``(path, why)`` of checkpoint folders in a format satmon does not read (DeepSpeed, DCP), with
            the command that converts each: the replay is incomplete without them.
    """

    paths: list[Path] = field(default_factory=list)
    stamps: dict[Path, tuple[FileStamp, ...]] = field(default_factory=dict)
    left_out: list[tuple[Path, str]] = field(default_factory=list)
    explicit: list[tuple[Path, str]] = field(default_factory=list)
    satmon_files: list[tuple[Path, str]] = field(default_factory=list)
    calibration: Path | None = None
    states: list[Path] = field(default_factory=list)
    unsupported: list[tuple[Path, str]] = field(default_factory=list)
    #: ``(path, why)`` that may hold checkpoints and could not be read (a folder that cannot be listed, an entry
    #: whose kind cannot be read, a path over the system's limits).
    unreadable: list[tuple[Path, str]] = field(default_factory=list)
    #: ``(path, why)`` of entries said on stderr that hold no checkpoint: not regular files, broken links, loops.
    odd: list[tuple[Path, str]] = field(default_factory=list)

    def unread(self) -> list[tuple[Path, str]]:
        """What may hold checkpoints and was not read: a folder that cannot be listed, an entry whose kind cannot be
        read (it may be a folder of checkpoints), a path over the system's limits, a checkpoint folder in a format
        satmon does not read. A replay that leaves any of them out is incomplete. An entry whose kind is known and
        holds no checkpoint (a FIFO, a device, a broken link, a symlink loop, a second name of a listed file) is no
        such thing: it is named, and the replay is complete without it."""
        return self.unreadable + self.unsupported

    def broken_links(self) -> list[tuple[Path, str]]:
        """Broken symlinks, symlink loops and entries that are not regular files: said, not counted as unread."""
        return list(self.odd)

    def notes(self) -> list[tuple[Path, str]]:
        """Everything a replay says on stderr about the listing, ``(path, why)``: the paths given that were left
        out, what could not be read, the entries that are not regular files, broken links and loops."""
        return self.explicit + self.unread() + self.odd

    def found_instead(self, limit: int = 6) -> str:
        """The files left out, in words, for "nothing to replay" (``"nothing"`` when the folders were empty)."""
        found = self.unsupported + self.left_out + self.satmon_files
        if not found:
            return "nothing (empty folders)"
        shown = [f"{printable(p.name)} ({why})" for p, why in found[:limit]]
        more = len(found) - limit
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def list_checkpoints(paths: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> Listing:
    """Files as given, directories searched recursively (symlinks followed, loops detected) for
    ``CHECKPOINT_SUFFIXES`` files and Hugging Face ``checkpoint-N`` folders; each real file once;
    ``exclude`` (e.g. the calibration data file), Trainer state files and satmon's own files left out.

    Each entry's kind is read with ``lstat``/``stat`` (:func:`satmon.paths.kind_of`) before anything else: a FIFO,
    a socket, a device or a link to one is left out and named with its kind, never opened. What is a checkpoint is
    each format's to say (:func:`satmon.replaying.checkpoints.recognise`, in the formats' order); a folder in a
    format satmon does not read (DeepSpeed) is named once with the command that converts it. Only ``stat`` is
    called: no file is opened.

    Raises:
        ReplayUsageError: a path does not exist, or is not a file or a folder (a FIFO, a device...), or is over the
            system's limits.

    Example:
        >>> list_checkpoints(["no/such/dir"])
        Traceback (most recent call last):
        ...
        satmon.replaying.user_code.ReplayUsageError: No such checkpoint file or directory: 'no/such/dir'.
    """
    out = Listing()
    seen_files: dict[tuple[int, int], Path] = {}
    for p in map(Path, exclude):
        try:
            st = os.stat(p)
            seen_files[(st.st_dev, st.st_ino)] = p
        except (OSError, ValueError):
            pass
    excluded = dict(seen_files)
    seen_dirs: set[tuple[int, int]] = set()

    def add(path: Path, stamps: tuple[FileStamp, ...], explicit: bool) -> None:
        key = (stamps[0].device, stamps[0].inode) if stamps else None
        if key in seen_files:
            other = seen_files[key]
            if key in excluded:
                why = "the --data file"
            elif os.path.abspath(other) == os.path.abspath(path):
                return  # the same path given twice (or a file inside a folder also given): listed once, nothing to say
            else:
                why = f"the same file as {other} (a link)"
            (out.explicit if explicit else out.left_out).append((path, why))
            return
        if key is not None:
            seen_files[key] = path
        out.paths.append(path)
        out.stamps[path] = stamps

    def own(path: Path, what: str, explicit: bool) -> None:
        out.satmon_files.append((path, what))
        if path.name == CALIBRATION_FILE and out.calibration is None:
            out.calibration = path
        elif path.name == STATE_FILE:
            out.states.append(path)
        if explicit:
            out.explicit.append((path, f"{what}, not model weights"))

    def entry(path: Path, kind: PathKind) -> Path | None:
        """One entry of a folder: listed, left out or said; returns it when it is a folder to search."""
        what = satmon_file(path.name)
        if kind.kind == "folder":
            return path
        if kind.kind == "unstattable":  # its kind is unknown: it may be a folder of checkpoints
            out.unreadable.append((path, f"cannot stat it: {kind.reason}"))
        elif kind.kind == "too-long":
            out.unreadable.append((path, f"cannot read it: {kind.describe()}"))
        elif kind.kind in ("broken-link", "link-loop") or kind.special:
            why = kind.describe() + ("" if kind.kind in ("broken-link", "link-loop") else ": not read")
            out.left_out.append((path, why))
            out.odd.append((path, why))
        elif what is not None:
            own(path, what, explicit=False)
        elif TRAINER_STATE_FILES.fullmatch(path.name):
            out.left_out.append((path, "Trainer state, not model weights"))
        elif recognise(path, None) is None:
            out.left_out.append((path, f"not {'/'.join(CHECKPOINT_SUFFIXES)}"))
        else:
            add(path, (FileStamp.of(path, kind.st),), explicit=False)
        return None

    def walk(root: Path) -> None:
        stack = [root]
        while stack:
            folder = stack.pop()
            try:
                st = os.stat(folder)
                entries = sorted(os.scandir(folder), key=lambda e: natural_key(e.name))
            except OSError as e:
                found = kind_of(folder)
                why = found.describe() if found.kind == "too-long" else (e.strerror or type(e).__name__)
                out.unreadable.append((folder, f"cannot read the folder: {why}"))
                continue
            if (st.st_dev, st.st_ino) in seen_dirs:
                out.left_out.append((folder, "a folder already searched (a symlink loop or a second link)"))
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            kinds = [(Path(e.path), kind_of(e.path, entry=e)) for e in entries]
            found = recognise(
                folder,
                Entries(
                    frozenset(p.name for p, k in kinds if k.regular), tuple(p for p, k in kinds if k.kind == "folder")
                ),
            )
            match = None if found is None else found[1]
            used: frozenset[str] = frozenset()
            if match is not None and match.unsupported is not None:  # a format satmon does not read: named once
                out.unsupported.append((folder, match.unsupported))
                continue
            if match is not None:  # the folder is a checkpoint (a DCP folder, a Hugging Face folder...)
                st = {p.name: k.st for p, k in kinds}
                try:
                    stamps = tuple(FileStamp.of(folder / n, st.get(n)) for n in match.files)
                except OSError as e:
                    if match.whole:
                        out.unreadable.append((folder, f"cannot stat it: {e.strerror}"))
                        continue
                    stamps = ()
                add(folder, stamps, explicit=folder == root)
                if match.whole:  # nothing else under it is searched
                    continue
                used = match.used
            subfolders = []
            for path, kind in kinds:
                if path.name in used:
                    continue
                sub = entry(path, kind)
                if sub is not None:
                    subfolders.append(sub)
            stack.extend(reversed(subfolders))

    for p in map(Path, paths):
        kind = kind_of(p)
        if kind.kind == "folder":
            walk(p)
        elif kind.regular:
            what = satmon_file(p.name)
            if what is not None:
                own(p, what, explicit=True)
                out.left_out.append((p, f"{what}, not model weights"))
            elif TRAINER_STATE_FILES.fullmatch(p.name):
                leave = (p, "Trainer state (optimizer, scheduler or RNG), not model weights")
                out.left_out.append(leave)
                out.explicit.append(leave)
            else:
                add(p, (FileStamp.of(p, kind.st),), explicit=True)
        elif kind.kind == "missing":
            raise ReplayUsageError(f"No such checkpoint file or directory: {printable(str(p)[:240])!r}.")
        else:  # never opened: a FIFO would block, a device would be read forever
            todo = (
                "pass a shorter path (cd to a folder nearer the checkpoints, or link them there)"
                if kind.kind == "too-long"
                else "pass the checkpoints' files or folder"
            )
            raise ReplayUsageError(
                f"Expected checkpoint files or directories, got {printable(str(p)[:240])!r}, which is "
                f"{kind.describe()}: {todo} (it was not opened)."
            )
    return out


def find_checkpoints(paths: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> list[Path]:
    """The checkpoints :func:`list_checkpoints` finds under ``paths`` (files and Hugging Face folders).

    Raises:
        ReplayUsageError: a path does not exist, or nothing under the paths is a checkpoint (the
            message says what was found instead).

    Example:
        >>> find_checkpoints(["no/such/dir"])
        Traceback (most recent call last):
        ...
        satmon.replaying.user_code.ReplayUsageError: No such checkpoint file or directory: 'no/such/dir'.
    """
    listing = list_checkpoints(paths, exclude)
    if not listing.paths:
        raise ReplayUsageError(nothing_to_replay(paths, listing))
    return listing.paths


def nothing_to_replay(paths: Sequence[str | Path], listing: Listing) -> str:
    """The one-line message for a listing without a checkpoint: what was searched, and what was found instead."""
    where = ", ".join(repr(printable(str(p)[:240])) for p in list(paths)[:3]) + (" ..." if len(paths) > 3 else "")
    if listing.unsupported:
        path, why = listing.unsupported[0]
        more = f" (and {len(listing.unsupported) - 1} more such folder(s))" if len(listing.unsupported) > 1 else ""
        return f"Nothing satmon can replay under {where}: {printable(str(path))} is {why}{more}."
    return (
        f"Nothing to replay under {where}: no {', '.join(CHECKPOINT_SUFFIXES)} file and no Hugging Face checkpoint "
        f"folder; found {listing.found_instead()}. Pass the checkpoints' folder or files."
    )
