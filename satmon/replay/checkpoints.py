"""Find, inspect, order and load checkpoints: each file read once, and no code run from it unless trusted.

A pickle can run any code while it is read, so every torch file is read with
``torch.load(weights_only=True)`` (tensors, containers and torch's allow-list only). A file that
needs more is refused, named with the type torch refused, unless the caller passes ``trust=True``
(``satmon replay --trust-checkpoints``), which reads it with ``weights_only=False``. Lightning's own
checkpoints (and those of runs with satmon's callback) need nothing beyond torch's allow-list, so
no type is registered with ``torch.serialization.add_safe_globals``; register your own safe types
there before calling :func:`inspect_checkpoint` if your hyper-parameters hold some.

The file is read once: :func:`inspect_checkpoint` keeps what it loaded (memory-mapped when the file
allows) in :attr:`CheckpointInfo.checkpoint`, and the model is built from that. ``.safetensors``
files hold no code: their header is read at inspection, their tensors when the model is built.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from satmon.replay.user_code import ReplayUsageError, error_line

__all__ = [
    "CHECKPOINT_SUFFIXES", "TRUST_FLAG", "CheckpointInfo", "extract_state_dict", "find_checkpoints",
    "inspect_checkpoint", "order_checkpoints", "state_dict_of",
]

#: File suffixes a directory expands to.
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".safetensors")
#: The command-line opt-in named in every refusal.
TRUST_FLAG = "--trust-checkpoints"
#: Keys under which plain checkpoints keep their weights and their step (nanoGPT uses model / iter_num).
_STATE_KEYS = ("state_dict", "model_state_dict", "model")
_STEP_KEYS = ("global_step", "step", "iter_num")


@dataclass
class CheckpointInfo:
    """One checkpoint file as :func:`inspect_checkpoint` read it.

    Attributes:
        path: the file.
        kind: ``"lightning"`` (a Lightning ``.ckpt`` dict) or ``"state_dict"`` (plain weights).
        global_step: the optimizer step stored in the file; ``None`` when it holds none.
        hparams: the model's hyper-parameters (Lightning ``hyper_parameters``), ``{}`` if absent.
        datamodule_hparams: the datamodule's hyper-parameters, ``{}`` if absent.
        weights_only: the file was read with ``torch.load(weights_only=True)`` (``False`` only when trusted).
        notes: things the user should know (no step in the file...).
        error: why the file cannot be replayed; ``None`` when it can.
        refused: ``weights_only=True`` refused the file (``trust=True`` would read it).
        hparams_name: the ``__init__`` argument the hyper-parameters were saved from, when one was
            (Lightning's ``hparams_name``: ``save_hyperparameters(config)`` passes them back as ``config``).
        checkpoint: what was loaded (kept so that the model is built without reading the file again);
            ``None`` for ``.safetensors`` and unreadable files, and once the replay loop has used it.
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
    hparams_name: str | None = None
    checkpoint: Any = field(default=None, repr=False, compare=False)


# ------------------------------------------------------------------------------ finding and ordering
def _natural_key(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_checkpoints(paths: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> list[Path]:
    """Files as given, directories expanded (recursively) to their ``CHECKPOINT_SUFFIXES`` files,
    except ``exclude`` (e.g. the calibration data file, when it sits among the checkpoints). No file is opened.

    Raises:
        ReplayUsageError: a path does not exist, or a directory holds no checkpoint.

    Example:
        >>> find_checkpoints(["no/such/dir"])
        Traceback (most recent call last):
        ...
        satmon.replay.user_code.ReplayUsageError: No such checkpoint file or directory: 'no/such/dir'.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted((f for f in p.rglob("*") if f.is_file() and f.suffix in CHECKPOINT_SUFFIXES), key=_natural_key)
            if not found:
                raise ReplayUsageError(f"No checkpoint ({', '.join(CHECKPOINT_SUFFIXES)}) under directory {str(p)!r}.")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise ReplayUsageError(f"No such checkpoint file or directory: {str(p)!r}.")
    seen: set[Path] = {Path(p).resolve() for p in exclude}
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]  # type: ignore[func-returns-value]


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
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
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


def _refusal(e: Exception) -> str:
    """The line of torch's weights_only message that names what it refused."""
    found = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))
    reason = found.group(1).split(". ")[0] if found else error_line(e)
    return (f"refused by torch.load(weights_only=True): {reason}. Pass {TRUST_FLAG} (API: trust=True) to load it: "
            "that runs code stored in the file, so only for files you trust")


def _torch_load(path: Path, trust: bool) -> Any:
    try:  # mmap: the tensors are paged in when the model is built, not while the steps are read
        return torch.load(path, map_location="cpu", weights_only=not trust, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
    return torch.load(path, map_location="cpu", weights_only=not trust)  # legacy (non-zip) files refuse mmap


def _step_of(obj: Mapping[str, Any]) -> int | None:
    for k in _STEP_KEYS:
        v = obj.get(k)
        if isinstance(v, (int, Tensor)) and not isinstance(v, bool) and (not isinstance(v, Tensor) or v.numel() == 1):
            return int(v)
    return None


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, Tensor) for v in obj.values())


def extract_state_dict(obj: Any) -> dict[str, Tensor]:
    """The weights inside a loaded checkpoint: the object itself, or under ``state_dict``/``model_state_dict``/``model``.

    Example:
        >>> sorted(extract_state_dict({"model": {"w": torch.zeros(1)}, "iter_num": 3}))
        ['w']
    """
    if _is_state_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping):
        for k in _STATE_KEYS:
            if _is_state_dict(obj.get(k)):
                return dict(obj[k])
    what = f" with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, Mapping) else ""
    raise ValueError("not a checkpoint: expected a state_dict (a mapping of names to tensors, or one under "
                     f"'state_dict'/'model_state_dict'/'model'), got {type(obj).__name__}{what}")


def inspect_checkpoint(path: str | Path, trust: bool = False) -> CheckpointInfo:
    """Read a checkpoint once: its kind, global step and hyper-parameters, and the loaded object itself.

    Never raises: an unreadable, refused or non-checkpoint file comes back with ``error`` set.

    Args:
        path: the file.
        trust: read torch files with ``weights_only=False`` (runs code stored in the file).

    Example:
        >>> import os, tempfile
        >>> f = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"model": {"w": torch.zeros(2)}, "iter_num": 7}, f)
        >>> info = inspect_checkpoint(f)
        >>> info.kind, info.global_step, info.error
        ('state_dict', 7, None)
    """
    info = CheckpointInfo(path=Path(path), weights_only=not trust)
    info.error = _not_a_checkpoint(info.path)
    if info.error is not None:
        return info
    try:
        if info.path.suffix == ".safetensors":
            info.weights_only = True  # safetensors holds tensors only: nothing to trust
            _safetensors_keys(info.path)
        else:
            obj = _torch_load(info.path, trust)
            if isinstance(obj, Mapping) and "state_dict" in obj and ("pytorch-lightning_version" in obj or "global_step" in obj):
                info.kind = "lightning"
                info.hparams = dict(obj.get("hyper_parameters") or {})
                info.hparams_name = obj.get("hparams_name")
                info.datamodule_hparams = dict(obj.get("datamodule_hyper_parameters") or {})
            else:
                extract_state_dict(obj)  # raises with what the file holds instead
            info.global_step = _step_of(obj) if isinstance(obj, Mapping) else None
            info.checkpoint = obj
    except Exception as e:  # any unreadable file is a per-file failure, never the end of the replay
        refused = not trust and "weights only load failed" in str(e).lower()
        info.refused = refused
        info.error = _refusal(e) if refused else (str(e) if str(e).startswith("not a checkpoint") else error_line(e))
        return info
    if info.global_step is None:
        info.notes.append("no global step in the file: ordered and logged by its position instead")
    return info


def _safetensors_keys(path: Path) -> list[str]:
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise ImportError("reading .safetensors needs the `safetensors` package: pip install safetensors") from e
    with safe_open(str(path), framework="pt", device="cpu") as f:
        keys = list(f.keys())
    if not keys:
        raise ValueError("not a checkpoint: a safetensors file without tensors")
    return keys


def state_dict_of(info: CheckpointInfo) -> dict[str, Tensor]:
    """The weights of an inspected checkpoint: from what inspection loaded, or the ``.safetensors`` tensors.

    Raises:
        ValueError: the file was not inspected successfully (or its loaded object was already released).
    """
    if info.error is not None:
        raise ValueError(f"Expected a readable checkpoint, got {info.path}: {info.error}")
    if info.path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(info.path), device="cpu")
    if info.checkpoint is None:
        raise ValueError(f"Expected the object inspect_checkpoint loaded from {info.path}, got None (already used); "
                         "inspect the file again.")
    return extract_state_dict(info.checkpoint)
