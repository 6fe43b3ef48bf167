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

Files that change underneath (:mod:`satmon.replay.reading`): the listing stamps each file (size,
modification time, inode); inspection reads the pickle once with every tensor left on the meta
device; the tensors are copied from the file with plain reads at the checkpoint's turn, the stamp
checked before and after. A file that changed is named and skipped.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from satmon.replay.reading import (
    FileChanged,
    FileStamp,
    SafetensorsIndex,
    copy_tensors,
    load_index,
    load_whole,
)
from satmon.replay.user_code import ReplayUsageError, error_line, printable, short

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
    layout: str  #: "zip", "legacy" (torch.save before 1.6) or "safetensors"
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


@dataclass
class Listing:
    """What :func:`list_checkpoints` found: the checkpoints (with each file's stamp) and what it left out, and why.

    Attributes:
        paths: the checkpoints, files and Hugging Face folders, each real file once.
        stamps: path -> the stamps of the files it is read from (a folder's weight files).
        left_out: ``(path, why)`` of every file not listed (not a checkpoint suffix, Trainer state, the
            ``--data`` file, a second link to a listed file, a symlink loop...).
        explicit: the paths given on the command line that were left out (said on stderr).
    """

    paths: list[Path] = field(default_factory=list)
    stamps: dict[Path, tuple[FileStamp, ...]] = field(default_factory=dict)
    left_out: list[tuple[Path, str]] = field(default_factory=list)
    explicit: list[tuple[Path, str]] = field(default_factory=list)

    def unread(self) -> list[tuple[Path, str]]:
        """What may hold checkpoints and could not be read: a folder that cannot be listed, an entry that cannot be
        stat'ed. A replay that leaves any of them out is incomplete. (A broken symlink is no such thing: what it
        names is not there to read, as after Lightning's ``save_last="link"`` lost its target.)"""
        return [(p, why) for p, why in self.left_out if why.startswith("cannot")]

    def broken_links(self) -> list[tuple[Path, str]]:
        """Broken symlinks named like checkpoints: said, not counted as unread."""
        return [(p, why) for p, why in self.left_out if why == "a broken symlink" and p.suffix in CHECKPOINT_SUFFIXES]

    def found_instead(self, limit: int = 6) -> str:
        """The files left out, in words, for "nothing to replay" (``"nothing"`` when the folders were empty)."""
        if not self.left_out:
            return "nothing (empty folders)"
        shown = [f"{p.name} ({why})" for p, why in self.left_out[:limit]]
        more = len(self.left_out) - limit
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


def list_checkpoints(paths: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> Listing:
    """Files as given, directories searched recursively (symlinks followed, loops detected) for
    ``CHECKPOINT_SUFFIXES`` files and Hugging Face ``checkpoint-N`` folders; each real file once;
    ``exclude`` (e.g. the calibration data file) and Trainer state files left out. Only ``stat`` is
    called: no file is opened.

    Raises:
        ReplayUsageError: a path does not exist.

    Example:
        >>> list_checkpoints(["no/such/dir"])
        Traceback (most recent call last):
        ...
        satmon.replay.user_code.ReplayUsageError: No such checkpoint file or directory: 'no/such/dir'.
    """
    out = Listing()
    seen_files: dict[tuple[int, int], Path] = {}
    for p in map(Path, exclude):
        try:
            st = os.stat(p)
            seen_files[(st.st_dev, st.st_ino)] = p
        except OSError:
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

    def leave(path: Path, why: str, explicit: bool) -> None:
        out.left_out.append((path, why))
        if explicit:
            out.explicit.append((path, why))

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

    def walk(root: Path) -> None:
        stack = [root]
        while stack:
            folder = stack.pop()
            try:
                st = os.stat(folder)
                entries = sorted(os.scandir(folder), key=lambda e: _natural_key(e.name))
            except OSError as e:
                out.left_out.append((folder, f"cannot read the folder: {e.strerror}"))
                continue
            if (st.st_dev, st.st_ino) in seen_dirs:
                out.left_out.append((folder, "a folder already searched (a symlink loop or a second link)"))
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            used = hf_folder(folder, {e.name for e in entries if _is_file(e)}, explicit=folder == root)
            subfolders = []
            for e in entries:
                path = Path(e.path)
                if e.name in used:
                    continue
                why = _unstattable(e)
                if why is not None:
                    out.left_out.append((path, why))
                elif _is_dir(e):
                    subfolders.append(path)
                elif not _is_file(e):  # a FIFO, a socket, a device: never opened (a FIFO would block)
                    out.left_out.append((path, "not a regular file"))
                elif TRAINER_STATE_FILES.fullmatch(e.name):
                    out.left_out.append((path, "Trainer state, not model weights"))
                elif path.suffix not in CHECKPOINT_SUFFIXES:
                    out.left_out.append((path, f"not {'/'.join(CHECKPOINT_SUFFIXES)}"))
                else:
                    try:
                        add(path, (FileStamp.of(path),), explicit=False)
                    except OSError as err:
                        out.left_out.append((path, f"cannot stat it: {err.strerror}"))
            stack.extend(reversed(subfolders))

    for p in map(Path, paths):
        if p.is_dir():
            walk(p)
        elif p.is_file():
            if TRAINER_STATE_FILES.fullmatch(p.name):
                leave(p, "Trainer state (optimizer, scheduler or RNG), not model weights", explicit=True)
            else:
                add(p, (FileStamp.of(p),), explicit=True)
        elif p.exists():  # never opened: a FIFO would block, a device would be read forever
            raise ReplayUsageError(f"Expected checkpoint files or directories, got {printable(str(p))!r}, which is not a "
                                   "regular file (a device, a pipe or a socket): pass the checkpoints' files or folder.")
        else:
            raise ReplayUsageError(f"No such checkpoint file or directory: {str(p)!r}.")
    return out


def _unstattable(entry: os.DirEntry) -> str | None:
    """Why ``entry`` cannot be stat'ed (a broken symlink; a folder this user may list but not search), or ``None``."""
    try:
        entry.stat(follow_symlinks=True)
    except FileNotFoundError:
        return "a broken symlink" if entry.is_symlink() else "cannot stat it: it disappeared while listed"
    except OSError as e:
        return f"cannot stat it: {e.strerror or type(e).__name__}"
    return None


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file(follow_symlinks=True)
    except OSError:
        return False


def find_checkpoints(paths: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> list[Path]:
    """The checkpoints :func:`list_checkpoints` finds under ``paths`` (files and Hugging Face folders).

    Raises:
        ReplayUsageError: a path does not exist, or nothing under the paths is a checkpoint (the
            message says what was found instead).

    Example:
        >>> find_checkpoints(["no/such/dir"])
        Traceback (most recent call last):
        ...
        satmon.replay.user_code.ReplayUsageError: No such checkpoint file or directory: 'no/such/dir'.
    """
    listing = list_checkpoints(paths, exclude)
    if not listing.paths:
        raise ReplayUsageError(nothing_to_replay(paths, listing))
    return listing.paths


def nothing_to_replay(paths: Sequence[str | Path], listing: Listing) -> str:
    """The one-line message for a listing without a checkpoint: what was searched, and what was found instead."""
    where = ", ".join(repr(str(p)) for p in list(paths)[:3]) + (" ..." if len(paths) > 3 else "")
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
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return "not a regular file (a device, a pipe or a socket): not read"
            size, head = st.st_size, os.read(fd, 64)
        finally:
            os.close(fd)
    except OSError as e:
        return f"cannot read it: {error_line(e)}"
    if size == 0:
        return "not a PyTorch checkpoint: an empty file"
    if path.suffix == ".safetensors":
        n = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
        return None if 0 < n <= size - 8 and head[8:9] == b"{" else "not a safetensors file: no JSON header"
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
    text = head.decode("utf-8", errors="strict") if _is_text(head) else None
    if text is not None:
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        return f"not a PyTorch checkpoint: a text file (starts {first!r})"
    return f"not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle (starts {head[:8]!r})"


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
        return _inspect_hf(path, stamps)
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
            info.error = str(e)[:400] if str(e).startswith(("not a checkpoint", "not a safetensors", "truncated", "corrupt")) \
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
            index = json.loads((folder / main).read_text()[:50_000_000])
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
            info.error = str(e)[:400] if str(e).startswith(("not a", "incomplete", "truncated", "corrupt")) else error_line(e)
        return info
    info.global_step, note = _hf_step(folder)
    if note:
        info.notes.append(note)
    return info


def _hf_step(folder: Path) -> tuple[int | None, str | None]:
    state = folder / "trainer_state.json"
    if state.is_file():
        try:
            step = json.loads(state.read_text()[:200_000_000]).get("global_step")
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return step, None
            note = "trainer_state.json holds no global_step"
        except (ValueError, RecursionError, AttributeError, OSError) as e:
            note = f"trainer_state.json is unreadable ({type(e).__name__})"
    else:
        note = "no trainer_state.json"
    found = re.fullmatch(r"checkpoint-(\d+)", folder.name)
    if found:
        return int(found.group(1)), f"{note}: step {found.group(1)} read from the folder name"
    return None, f"{note}: ordered and logged by its position instead"


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
