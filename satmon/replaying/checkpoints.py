"""Find, inspect, order and load checkpoints: no code run from a file unless trusted, no file mapped.

A pickle can run any code while it is read, so every torch file is read with
``torch.load(weights_only=True)`` (tensors, containers and torch's allow-list only). A file that
needs more is refused, named with the global torch refused, unless the caller passes ``trust=True``
(``satmon replay --trust-checkpoints``), which reads it with ``weights_only=False``. A global that
runs code (``posix.system``, ``exec``...) is named as not safe to allow, with no advice to trust it.
Lightning's own checkpoints (and those of runs with satmon's callback) need nothing beyond torch's
allow-list, so no type is registered with ``torch.serialization.add_safe_globals``; register your
own safe types there before calling :func:`inspect_checkpoint` if your hyper-parameters hold some.

What is a checkpoint (:func:`list_checkpoints`): ``.ckpt``/``.pt``/``.pth``/``.safetensors`` files,
and Hugging Face Trainer ``checkpoint-N/`` folders (weights in ``model.safetensors``,
``pytorch_model.bin`` or a sharded index; the step in ``trainer_state.json``). Folders are searched
recursively, symlinks followed (a loop is detected), each real file listed once. The Trainer's
``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth`` and ``training_args.bin`` are
not checkpoints: never listed, never an error.

Files that change underneath (:mod:`satmon.replaying.file_reads`): the listing stamps each file (size,
modification time, inode); inspection reads the pickle once with every tensor left on the meta
device; the tensors are copied from the file with plain reads at the checkpoint's turn, the stamp
checked before and after. A file that changed is named and skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from satmon.paths import NotRegular, PathKind, kind_of, open_regular

from satmon.replaying.budget import BUDGET_ENV, OverBudget, mib, pickle_budget
from satmon.replaying.dcp import METADATA, DcpIndex, is_dcp
from satmon.replaying.file_reads import (
    FileChanged,
    FileStamp,
    SafetensorsIndex,
    copy_tensors,
    load_index,
    load_whole,
)
from satmon.replaying.user_code import ReplayUsageError, error_line, printable, short

__all__ = [
    "CHECKPOINT_SUFFIXES", "TRAINER_STATE_FILES", "TRUST_FLAG", "CheckpointInfo", "Listing", "extract_state_dict",
    "find_checkpoints", "inspect_checkpoint", "list_checkpoints", "load_checkpoint", "meta_state_dict",
    "nothing_to_replay", "order_checkpoints", "state_dict_of",
]

#: File suffixes a directory expands to.
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".safetensors")
#: The command-line opt-in named in the refusals that may be trusted.
TRUST_FLAG = "--trust-checkpoints"
#: Files of a Hugging Face Trainer checkpoint that hold no model weights (optimizer, scheduler, grad
#: scaler and RNG state, the training arguments): never replayed, never an error.
TRAINER_STATE_FILES = re.compile(r"(optimizer\.(pt|bin)|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|training_args\.bin)")
#: A Hugging Face model folder's weights, in the order ``transformers`` prefers them.
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_HF_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")
#: Keys under which plain checkpoints keep their weights and their step (nanoGPT uses model / iter_num).
_STATE_KEYS = ("state_dict", "model_state_dict", "model")
_STEP_KEYS = ("global_step", "step", "iter_num")
#: Parts of a Lightning checkpoint that building the model does not read: left unread (on the meta device).
_UNREAD = ("optimizer_states", "lr_schedulers")


@dataclass(frozen=True)
class _Weights:
    """One file holding weights: its stamp from the listing, its layout, and its index (no tensor data)."""

    stamp: FileStamp
    layout: str  #: "zip", "legacy" (torch.save before 1.6), "safetensors" or "dcp" (index: the DcpIndex and its stamps)
    index: Any = field(default=None, repr=False, compare=False)  #: torch: the object, tensors on meta; safetensors: its header


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
    weights: tuple[_Weights, ...] = field(default=(), repr=False, compare=False)

    def release(self) -> None:
        """Drop the index (the loop calls this once the model holds the weights)."""
        self.checkpoint = None
        self.weights = tuple(_Weights(w.stamp, w.layout) for w in self.weights)


# ------------------------------------------------------------------------------ finding and ordering
def _natural_key(path: Path | str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


#: satmon's own files, by name, and what each is: never a checkpoint, never an error (the names are satmon's:
#: ``drivers/live_probe.py``, ``drivers/hf.py``'s ``STATE_FILE``, ``io/trackers.py``, ``io/lock.py``, the replay's
#: partial records, ``io/atomic.py``'s temporaries; ``tests/replay/test_listing_kinds.py`` checks them against these).
from satmon.paths import CALIBRATION_FILE, STATE_FILE  # noqa: E402
SATMON_FILES = (
    (re.compile(re.escape(CALIBRATION_FILE)), "satmon's calibration batches (the live probe saved them; usable as --data)"),
    (re.compile(re.escape(STATE_FILE)), "satmon's screening state (the Hugging Face callback's; it holds the live verdict)"),
    (re.compile(r"satmon_\w+\.md"), "satmon's verdict card"),
    (re.compile(r".+\.partial\.jsonl"), "satmon's partial records of a replay still running or interrupted (--json FILE.partial.jsonl)"),
    (re.compile(r"\.(.+\.)?satmon-lock"), "satmon's lock file (one writer per output)"),
    (re.compile(r"\..+\.[a-z0-9_]{8}\.tmp"), "satmon's temporary file of a write that was cut short"),
)
#: Lightning's FSDP writes the rest of a sharded checkpoint (step, hyper-parameters) beside the DCP shards.
DCP_META = "meta.pt"
_DEEPSPEED_MODEL = re.compile(r"(zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt")
_DEEPSPEED_OPTIM = re.compile(r"(bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt")


def satmon_file(name: str) -> str | None:
    """What satmon's own file ``name`` is (``None``: not one of satmon's).

    Example:
        >>> satmon_file("satmon_calibration.pt"), satmon_file(".replay.json.satmon-lock"), satmon_file("last.ckpt")
        ("satmon's calibration batches (the live probe saved them; usable as --data)", "satmon's lock file (one writer per output)", None)
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


def _hf_files(names: set[str]) -> tuple[str, set[str]] | None:
    """A Hugging Face model folder's main weights file (of its file ``names``) and every name it accounts for;
    ``None`` if it is not one."""
    main = next((n for n in HF_WEIGHTS if n in names), None)
    if main is None:
        return None
    used = {main, "trainer_state.json", "config.json", "generation_config.json"}
    used |= {n for n in names if TRAINER_STATE_FILES.fullmatch(n)}
    used |= {n for n in names if _HF_SHARD.fullmatch(n)}
    return main, used


def _converted(folder: Path, suffix: str) -> Path:
    """Where a consolidated copy of ``folder`` goes: beside it, ``NAME-consolidated.SUFFIX``."""
    stem = folder.name[: -len(folder.suffix)] if folder.suffix in CHECKPOINT_SUFFIXES else folder.name
    return folder.with_name(f"{stem or 'checkpoint'}-consolidated{suffix}")


def unsupported_format(folder: Path, names: set[str], subfolders: Sequence[Path] = ()) -> str | None:
    """Why ``folder`` (holding the files ``names`` and the folders ``subfolders``) is a checkpoint in a format satmon
    does not read, with the command that makes a file it reads; ``None`` when it is not one.

    DeepSpeed (Lightning's ``DeepSpeedStrategy`` included): ``latest``, ``zero_to_fp32.py`` and a tag folder of
    ``mp_rank_*_model_states.pt`` and ``zero_*_optim_states.pt`` (the tag folder itself when given). Its weights are
    partitioned across the ranks' optimizer files (ZeRO), in DeepSpeed's own objects: consolidating them needs
    deepspeed. (A torch.distributed.checkpoint folder is read: :mod:`satmon.replaying.dcp`.)

    Example:
        >>> print(unsupported_format(Path("run/ds"), {"mp_rank_00_model_states.pt"}).split(":")[0])
        a DeepSpeed checkpoint folder (mp_rank_*_model_states.pt, ZeRO-partitioned zero_*_optim_states.pt beside it)
    """
    tag = None
    if any(_DEEPSPEED_MODEL.fullmatch(n) or _DEEPSPEED_OPTIM.fullmatch(n) for n in names):
        tag = folder
    elif "latest" in names or "zero_to_fp32.py" in names:
        for sub in subfolders:
            try:
                if any(_DEEPSPEED_MODEL.fullmatch(e.name) or _DEEPSPEED_OPTIM.fullmatch(e.name) for e in os.scandir(sub)):
                    tag = sub
                    break
            except OSError:
                continue
    if tag is None:
        return None
    root = folder if tag is not folder else tag.parent
    where = f"{printable(tag.name)}/mp_rank_*_model_states.pt" if tag is not folder else "mp_rank_*_model_states.pt"
    code = ("from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict as c; "
            f"c({str(root)!r}, {str(_converted(root, '.ckpt'))!r})")
    lightning = f"python -c {shlex.quote(code)}"
    script = " ".join(shlex.quote(str(p)) for p in (root / "zero_to_fp32.py", root, _converted(root, ".pt")))
    return printable(f"a DeepSpeed checkpoint folder ({where}, ZeRO-partitioned zero_*_optim_states.pt beside it): "
                     "satmon reads single-file checkpoints; consolidate it first (both ways need the deepspeed package): "
                     f"for a Lightning run `{lightning}` makes a .ckpt for --model, else `python {script}` (DeepSpeed's "
                     "script saved with the checkpoint: it is code, run it only for a folder you trust) makes a "
                     "state_dict for --factory; then replay that file")


def list_checkpoints(paths: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> Listing:
    """Files as given, directories searched recursively (symlinks followed, loops detected) for
    ``CHECKPOINT_SUFFIXES`` files and Hugging Face ``checkpoint-N`` folders; each real file once;
    ``exclude`` (e.g. the calibration data file), Trainer state files and satmon's own files left out.

    Each entry's kind is read with ``lstat``/``stat`` (:func:`satmon.paths.kind_of`) before anything else: a FIFO,
    a socket, a device or a link to one is left out and named with its kind, never opened; a folder in a format
    satmon does not read (DeepSpeed, DCP) is named once with the command that converts it. Only ``stat`` is
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

    def hf_folder(folder: Path, names: set[str], explicit: bool) -> set[str]:
        found = _hf_files(names)
        if found is None:
            return set()
        main, used = found
        try:
            stamps: tuple[FileStamp, ...] = (FileStamp.of(folder / main),)
        except OSError:
            stamps = ()
        add(folder, stamps, explicit)
        return used

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
        elif path.suffix not in CHECKPOINT_SUFFIXES:
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
                entries = sorted(os.scandir(folder), key=lambda e: _natural_key(e.name))
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
            names = {p.name for p, k in kinds if k.regular}
            dirs = [p for p, k in kinds if k.kind == "folder"]
            if is_dcp(names):  # a torch.distributed.checkpoint folder: one checkpoint, read without a process group
                files = [METADATA, *sorted((n for n in names if n.endswith(".distcp") or n == DCP_META), key=_natural_key)]
                try:
                    add(folder, tuple(FileStamp.of(folder / n, k.st) for n in files for p, k in kinds if p.name == n),
                        explicit=folder == root)
                except OSError as e:
                    out.unreadable.append((folder, f"cannot stat it: {e.strerror}"))
                continue
            unsupported = unsupported_format(folder, names, dirs)
            if unsupported is not None:
                out.unsupported.append((folder, unsupported))
                continue
            used = hf_folder(folder, {n for n in names if satmon_file(n) is None}, explicit=folder == root)
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
            todo = ("pass a shorter path (cd to a folder nearer the checkpoints, or link them there)"
                    if kind.kind == "too-long" else "pass the checkpoints' files or folder")
            raise ReplayUsageError(f"Expected checkpoint files or directories, got {printable(str(p)[:240])!r}, which is "
                                   f"{kind.describe()}: {todo} (it was not opened).")
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
    return (f"Nothing to replay under {where}: no {', '.join(CHECKPOINT_SUFFIXES)} file and no Hugging Face checkpoint "
            f"folder; found {listing.found_instead()}. Pass the checkpoints' folder or files.")


def order_checkpoints(infos: Sequence[CheckpointInfo]) -> list[CheckpointInfo]:
    """Readable checkpoints by global step (files without one after them, by name); a ``last*.ckpt``
    whose step another file already has is dropped (Lightning's ``save_last`` copy)."""
    good = [i for i in infos if i.error is None]
    good.sort(key=lambda i: (i.global_step is None, i.global_step or 0, i.path.name.startswith("last"), _natural_key(i.path)))
    steps = {i.global_step for i in good if not i.path.name.startswith("last")}
    return [i for i in good if not (i.path.name.startswith("last") and i.global_step is not None and i.global_step in steps)]


# ------------------------------------------------------------------------------------------ reading
def _not_a_checkpoint(path: Path) -> str | None:
    """What the file is not, read from its first bytes (``None`` when it may be a checkpoint).

    torch's own errors on such files read ``IndexError: pop from empty list`` or ``KeyError: 101``.
    """
    try:  # opened without blocking (a FIFO put there since the listing), and read only if it is a regular file
        fd = open_regular(path)
        try:
            size, head = os.fstat(fd).st_size, os.read(fd, 4096)
        finally:
            os.close(fd)
    except NotRegular as e:
        return f"{e.kind.describe()}: not read"
    except OSError as e:
        return f"cannot read it: {error_line(e)}"
    if size == 0:
        return "not a PyTorch checkpoint: an empty file"
    if path.suffix == ".safetensors":
        n = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
        return None if 0 < n <= size - 8 and head[8:9] == b"{" else packed_as(path, head) or (
            "not a safetensors file: no JSON header")
    if head[:4] == b"PK\x03\x04":
        if not zipfile.is_zipfile(path):
            return (f"truncated or corrupt: a torch.save zip archive without its directory, {size:,} bytes; "
                    "was the copy or save cut short?")
        with zipfile.ZipFile(path) as z:
            if not any(n.endswith("data.pkl") for n in z.namelist()):
                return "not a PyTorch checkpoint: a zip archive without the data.pkl of torch.save"
        return None
    if head[:1] == b"\x80":  # a pickle (torch.save's legacy format)
        return None
    packed = packed_as(path, head)
    if packed is not None:
        return packed
    head = head[:64]
    text = head.decode("utf-8", errors="strict") if _is_text(head) else None
    if text is not None:
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        return f"not a PyTorch checkpoint: a text file (starts {first!r})"
    return f"not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle (starts {head[:8]!r})"


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
        >>> print(packed_as(Path("run/w.pt"), gzip.compress(b"\\x80\\x02")))
        not a PyTorch checkpoint: a gzip-compressed file; unpack it and replay what it holds: `gunzip -c run/w.pt > run/w-unpacked.pt`
    """
    src = shlex.quote(str(path))
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    out, folder = (shlex.quote(str(path.with_name(f"{stem or 'checkpoint'}-unpacked{s}")))
                   for s in (path.suffix or ".pt", ""))
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
                what, command = "a gzip-compressed tar archive (.tar.gz)", _TAR_COMMAND.format(folder=folder, z="z",
                                                                                               src=src)
            else:
                what = "a gzip-compressed file"
        elif not what.startswith("a "):
            what = f"{'an' if what[0] in 'aeiox' else 'a'} {what} file"
        command = command.format(src=src, out=out, folder=folder)
    return printable(f"not a PyTorch checkpoint: {what}; unpack it and replay what it holds: `{command}`")


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(b >= 32 or b in b"\t\n\r\f" for b in head)


#: Modules whose globals run commands or code, or reach anything: a checkpoint never needs them.
_UNSAFE_MODULES = {"os", "posix", "nt", "subprocess", "commands", "sys", "shutil", "socket", "importlib", "runpy",
                   "pickle", "cPickle", "_pickle", "marshal", "ctypes", "code", "codeop", "pty", "multiprocessing",
                   "webbrowser", "asyncio", "signal", "threading", "_thread", "pdb", "timeit", "types", "operator",
                   "functools", "inspect", "io", "_io", "builtins", "__builtin__", "site", "torch.hub"}
_UNSAFE_NAMES = {"exec", "eval", "compile", "open", "getattr", "setattr", "delattr", "__import__", "globals", "locals",
                 "vars", "breakpoint", "input", "execfile", "apply", "system", "popen", "spawn", "Popen", "call",
                 "check_call", "check_output", "run", "exec_module"}


def _what_it_does(name: str, blocked: bool) -> str | None:
    """Why the global ``name`` is not safe to allow, or ``None`` when it looks like a data type."""
    module, _, attr = name.rpartition(".")
    top = module.split(".")[0]
    if attr in ("system", "popen", "Popen", "spawn", "call", "check_call", "check_output", "run") and top in (
            "os", "posix", "nt", "subprocess", "commands"):
        return "runs a shell command"
    if attr in ("exec", "eval", "compile", "execfile", "exec_module"):
        return "runs Python code"
    if attr == "__import__" or top in ("importlib", "runpy"):
        return "imports and runs modules"
    if blocked or top in _UNSAFE_MODULES or module in _UNSAFE_MODULES or attr in _UNSAFE_NAMES:
        return "can run arbitrary code"
    return None


def _refusal(e: Exception) -> tuple[str, bool]:
    """The message for a file ``torch.load(weights_only=True)`` refused, and whether trusting it may be advised.

    The message names the global torch refused. A global that runs code (``posix.system``, ``exec``,
    ``__import__``...) is called unsafe, with no advice to trust the file.
    """
    text = str(e)[:20_000]
    found = re.search(r"GLOBAL ([\w.]+)", text)
    name = found.group(1) if found else None
    blocked = bool(re.search(r"whose module \S+ is blocked", text))
    does = _what_it_does(name, blocked) if name else None
    if does is not None:
        return (f"refused by torch.load(weights_only=True): its pickle calls {name} (GLOBAL {name}), which {does}: "
                "not safe to allow. A checkpoint needs no such call: this file was crafted or is not a checkpoint; "
                "do not load it"), False
    if name is None:
        reason = re.search(r"WeightsUnpickler error:\s*(.+)", text)
        what = reason.group(1).split(". ")[0] if reason else error_line(e)
        return (f"refused by torch.load(weights_only=True): {what[:300]}. If you made or trust this file, pass "
                f"{TRUST_FLAG} (API: trust=True) to load it: that runs code stored in the file"), True
    return (f"refused by torch.load(weights_only=True): it holds GLOBAL {name}, a type not on torch's allow-list. If you "
            f"made or trust this file, pass {TRUST_FLAG} (API: trust=True), which runs code stored in it, or allow "
            f"the type from Python with torch.serialization.add_safe_globals([{name}])"), True


def _step_of(obj: Mapping[str, Any], weights: _Weights) -> tuple[int | None, str | None]:
    """The step stored under ``_STEP_KEYS``, and a note when it cannot be read before the checkpoint's turn."""
    for k in _STEP_KEYS:
        v = obj.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, Tensor)):
            continue
        if isinstance(v, Tensor):
            if v.numel() != 1:
                continue
            if v.is_meta:
                if weights.layout != "zip":
                    return None, f"its step ({k!r}) is a tensor inside a legacy file: ordered and logged by its position"
                v = copy_tensors({k: v}, weights.stamp, index=obj)[k]
        return int(v), None
    return None, None


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, Tensor) for v in obj.values())


def extract_state_dict(obj: Any) -> dict[str, Tensor]:
    """The weights inside a loaded checkpoint: the object itself, or under ``state_dict``/``model_state_dict``/``model``.

    Example:
        >>> import torch
        >>> sorted(extract_state_dict({"model": {"w": torch.zeros(1)}, "iter_num": 3}))
        ['w']
    """
    if _is_state_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping):
        for k in _STATE_KEYS:
            if _is_state_dict(obj.get(k)):
                return dict(obj[k])
    what = ""
    if isinstance(obj, Mapping):
        keys = [short(k, 40) for k in list(obj)[:8]]
        what = f" with keys [{', '.join(sorted(keys))}{', ...' if len(obj) > 8 else ''}]"
    raise ValueError("not a checkpoint: expected a state_dict (a mapping of names to tensors, or one under "
                     f"'state_dict'/'model_state_dict'/'model'), got {type(obj).__name__}{what}")


def _copy_small(obj: Any, weights: _Weights) -> Any:
    """Hyper-parameters as stored: their (rare) tensors copied from a zip archive at inspection."""
    return copy_tensors(obj, weights.stamp, index=weights.index) if weights.layout == "zip" else obj


def inspect_checkpoint(path: str | Path, trust: bool = False, stamps: Sequence[FileStamp] | None = None) -> CheckpointInfo:
    """Read a checkpoint's index once: its kind, global step and hyper-parameters; no tensor data is kept.

    Never raises: an unreadable, refused, changed or non-checkpoint file comes back with ``error`` set.

    Args:
        path: the file, or a Hugging Face ``checkpoint-N`` folder.
        trust: read torch files with ``weights_only=False`` (runs code stored in the file).
        stamps: the files' stamps from :func:`list_checkpoints` (taken now when not given).

    Example:
        >>> import os, tempfile, torch
        >>> f = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"model": {"w": torch.zeros(2)}, "iter_num": 7}, f)
        >>> info = inspect_checkpoint(f)
        >>> info.kind, info.global_step, info.error, info.checkpoint["model"]["w"].device
        ('state_dict', 7, None, device(type='meta'))
    """
    path = Path(path)
    if path.is_dir():
        names = {p.name for p in path.iterdir()}
        return _inspect_dcp(path, stamps) if is_dcp(names) else _inspect_hf(path, stamps)
    info = CheckpointInfo(path=path, weights_only=not trust)
    info.error = _not_a_checkpoint(path)
    if info.error is not None:
        return info
    try:
        stamp = stamps[0] if stamps else FileStamp.of(path)
        if path.suffix == ".safetensors":
            info.weights_only = True  # safetensors holds tensors only: nothing to trust
            info.weights = (_Weights(stamp, "safetensors", SafetensorsIndex.read(stamp)),)
        else:
            layout = "zip" if zipfile.is_zipfile(path) else "legacy"
            obj = load_index(stamp, trust)
            weights = _Weights(stamp, layout, obj)
            info.weights = (weights,)
            if isinstance(obj, Mapping) and "state_dict" in obj and ("pytorch-lightning_version" in obj or "global_step" in obj):
                info.kind = "lightning"
                info.hparams = dict(_copy_small(obj.get("hyper_parameters") or {}, weights))
                name = obj.get("hparams_name")
                info.hparams_name = name if isinstance(name, str) else None
                info.datamodule_hparams = dict(_copy_small(obj.get("datamodule_hyper_parameters") or {}, weights))
            else:
                extract_state_dict(obj)  # raises with what the file holds instead
            if isinstance(obj, Mapping):
                info.global_step, note = _step_of(obj, weights)
                if note:
                    info.notes.append(note)
            info.checkpoint = obj
    except FileChanged as e:
        info.error, info.checkpoint, info.weights = str(e), None, ()
        return info
    except Exception as e:  # any unreadable file is a per-file failure, never the end of the replay
        info.checkpoint, info.weights = None, ()
        if "weights only load failed" in str(e)[:2000].lower():
            info.refused = True
            info.error, trustable = _refusal(e)
            info.unsafe = not trustable
        else:
            info.error = str(e)[:400] if str(e).startswith(("not a checkpoint", "not a safetensors", "truncated", "corrupt", "over satmon's")) \
                else error_line(e)
        return info
    if info.global_step is None and not info.notes:
        info.notes.append("no global step in the file: ordered and logged by its position instead")
    return info


def _inspect_hf(folder: Path, stamps: Sequence[FileStamp] | None) -> CheckpointInfo:
    """A Hugging Face folder: its weight files (single or sharded), read weights-only; its step from
    ``trainer_state.json`` (else the folder's ``checkpoint-N`` name)."""
    info = CheckpointInfo(path=folder, hf=True)
    names = {p.name for p in folder.iterdir() if p.is_file()}
    found = _hf_files(names)
    if found is None:
        info.error = (f"not a checkpoint: a folder without {' / '.join(HF_WEIGHTS)} (a Hugging Face checkpoint) "
                      "or .ckpt/.pt files; pass the files inside it")
        return info
    main = found[0]
    try:
        files = [main]
        if main.endswith(".index.json"):
            index = json.loads(_bounded_text(folder / main))
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"not a checkpoint: {main} has no weight_map")
            files = sorted({str(v) for v in weight_map.values()}, key=_natural_key)
            if any("/" in f or "\\" in f or f.startswith(".") for f in files):
                raise ValueError(f"not a checkpoint: {main} names shards outside its folder")
            missing = [f for f in files if not (folder / f).is_file()]
            if missing:
                raise ValueError(f"incomplete sharded checkpoint: {main} names {len(files)} shard(s), "
                                 f"{len(missing)} missing ({', '.join(missing[:3])})")
        given = {s.path.name: s for s in stamps or ()}
        weights = []
        for name in files:
            stamp = given.get(name) or FileStamp.of(folder / name)
            if name.endswith(".safetensors"):
                weights.append(_Weights(stamp, "safetensors", SafetensorsIndex.read(stamp)))
            else:  # pytorch_model*.bin: weights only, always (a Trainer writes tensors only)
                obj = load_index(stamp, trust=False)
                layout = "zip" if zipfile.is_zipfile(stamp.path) else "legacy"
                extract_state_dict(obj)
                weights.append(_Weights(stamp, layout, obj))
        info.weights = tuple(weights)
        if main.endswith(".index.json"):
            have = {k for w in weights for k in _index_keys(w)}
            absent = [k for k in weight_map if k not in have]
            if absent:
                raise ValueError(f"incomplete sharded checkpoint: {len(absent)} tensor(s) of {main} in no shard "
                                 f"({', '.join(short(k, 60) for k in absent[:3])})")
    except FileChanged as e:
        info.error, info.weights = str(e), ()
        return info
    except Exception as e:
        info.weights = ()
        if "weights only load failed" in str(e)[:2000].lower():
            info.refused = info.unsafe = True  # never trusted: a Trainer writes tensors only
            info.error = (_refusal(e)[0].split(". If you")[0] + ": a Hugging Face weights file holds tensors only, so "
                          "this one is not what transformers or the Trainer writes; do not load it")
        else:
            info.error = str(e)[:400] if str(e).startswith(("not a", "incomplete", "truncated", "corrupt", "over satmon's")) else error_line(e)
        return info
    info.global_step, note = _hf_step(folder)
    if note:
        info.notes.append(note)
    return info


def _inspect_dcp(folder: Path, stamps: Sequence[FileStamp] | None) -> CheckpointInfo:
    """A torch.distributed.checkpoint folder (:mod:`satmon.replaying.dcp`): its ``.metadata`` read with a restricted
    unpickler (no code runs, trusted or not), its tensors assembled from every shard at their turn; its step stored
    beside them or in Lightning's ``meta.pt``."""
    info = CheckpointInfo(path=folder, kind="state_dict")
    try:
        given = {s.path.name: s for s in stamps or ()}
        if not given:
            given = {p.name: FileStamp.of(p) for p in folder.iterdir()
                     if p.name == METADATA or p.name.endswith(".distcp") or p.name == DCP_META}
        index = DcpIndex.read(folder, given)
        info.weights = (_Weights(given[METADATA], "dcp", (index, given)),)
        info.global_step = index.step(given)
        if info.global_step is None and DCP_META in given:  # Lightning's FSDP: the rest of the checkpoint
            meta = load_index(given[DCP_META], trust=False)
            if isinstance(meta, Mapping):
                info.global_step, _ = _step_of(meta, _Weights(given[DCP_META], "zip", meta))
    except FileChanged as e:
        info.error, info.weights = str(e), ()
        return info
    except Exception as e:
        info.weights = ()
        text = str(e)[:400] if str(e).startswith(("not", "incomplete", "truncated", "corrupt", "over satmon's")) \
            else error_line(e)
        info.error = text if text.startswith("incomplete") else (
                      f"{text}; a torch.distributed.checkpoint folder can also be consolidated into one file with "
                      f"`python -m torch.distributed.checkpoint.format_utils dcp_to_torch {printable(shlex.quote(str(folder)))} "
                      f"{printable(shlex.quote(str(_converted(folder, '.pt'))))}` (it unpickles .metadata: only for a folder you trust)")
        return info
    if info.global_step is None:
        info.notes.append("no global step in the folder: ordered and logged by its position instead")
    return info


def _hf_step(folder: Path) -> tuple[int | None, str | None]:
    state = folder / "trainer_state.json"
    if state.is_file():
        try:
            step = json.loads(_bounded_text(state)).get("global_step")
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return step, None
            note = "trainer_state.json holds no global_step"
        except OverBudget as e:  # its size, the budget and the variable that raises it
            note = str(e)
        except (ValueError, RecursionError, AttributeError, OSError) as e:
            note = f"trainer_state.json is unreadable ({error_line(e)[:200]})"
    else:
        note = "no trainer_state.json"
    found = re.fullmatch(r"checkpoint-(\d+)", folder.name)
    if found:
        return int(found.group(1)), f"{note}: step {found.group(1)} read from the folder name"
    return None, f"{note}: ordered and logged by its position instead"


def _bounded_text(path: Path) -> str:
    """A Hugging Face folder's JSON (its index, ``trainer_state.json``), read only when it is a regular file within the
    pickle budget (:mod:`satmon.replaying.budget`): its size is checked before it is read."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        size, budget = os.fstat(fd).st_size, pickle_budget()
        if size > budget:
            raise OverBudget(f"over satmon's read budget: {path.name} is {size:,} bytes, over the {mib(budget)} "
                             f"satmon reads of a checkpoint's metadata; set {BUDGET_ENV}=N (MiB) to read it")
        return f.read(budget + 1).decode("utf-8", errors="replace")


def _index_keys(w: _Weights) -> list[str]:
    return list(w.index.entries) if w.layout == "safetensors" else list(extract_state_dict(w.index))


# ------------------------------------------------------------------------------------------ weights
def meta_state_dict(info: CheckpointInfo) -> dict[str, Tensor]:
    """The checkpoint's weights as meta tensors (names, shapes and dtypes; no data read).

    Raises:
        ValueError: the checkpoint was not inspected successfully, or was already used.
    """
    _require(info)
    out: dict[str, Tensor] = {}
    for w in info.weights:
        if w.layout == "safetensors":
            out.update(w.index.meta())
        elif w.layout == "dcp":
            out.update(w.index[0].meta())
        elif info.kind == "lightning":
            out.update(w.index["state_dict"])
        else:
            out.update(extract_state_dict(w.index))
    return out


def _require(info: CheckpointInfo) -> None:
    if info.error is not None:
        raise ValueError(f"Expected a readable checkpoint, got {info.path}: {info.error}")
    if not info.weights or any(w.index is None for w in info.weights):
        raise ValueError(f"Expected the index inspect_checkpoint read from {info.path}, got None (already used); "
                         "inspect the file again.")


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
        if w.layout == "safetensors":
            out.update(w.index.tensors(w.stamp))
        elif w.layout == "dcp":
            out.update(w.index[0].tensors(w.index[1]))
        elif w.layout == "zip":
            part = extract_state_dict(w.index) if info.kind != "lightning" else dict(w.index["state_dict"])
            out.update(copy_tensors(part, w.stamp, index=w.index))
        else:
            whole = load_whole(w.stamp, trust=not info.weights_only)
            out.update(whole["state_dict"] if info.kind == "lightning" else extract_state_dict(whole))
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
    (w,) = info.weights
    if w.layout == "zip":
        return copy_tensors(w.index, w.stamp, skip=_UNREAD)
    return load_whole(w.stamp, trust=not info.weights_only)
