"""Replay satmon's diagnostics over saved checkpoints.

Which files, in what order, built how, fed with which batches: this module decides; the readings
themselves come from :func:`satmon.probe`, the same code the live callback runs, so a replayed
checkpoint and the live probe at the same step read the same numbers. ``satmon replay``
(:mod:`satmon.cli.replay`) is a thin command line over it.

Loading is ``torch.load(weights_only=True)`` (no code runs from the file) whenever the file allows
it; a checkpoint whose pickle holds other objects (e.g. hyper-parameters that are custom classes)
is loaded with ``weights_only=False`` only when the caller allows it, and the record says so.
"""

from __future__ import annotations

import dataclasses

import gc
import importlib
import importlib.util
import pickle
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from satmon.verdict import Source

__all__ = [
    "CHECKPOINT_SUFFIXES", "ReplayUsageError", "CheckpointInfo", "import_object", "find_checkpoints",
    "inspect_checkpoint", "order_checkpoints", "ModelLoader", "load_data_file", "datamodule_batches",
    "input_forward_fn", "replay", "summary_row", "TensorBoardReplay",
]

#: File suffixes a directory expands to.
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".safetensors")
#: Keys under which plain checkpoints keep their weights and their step (nanoGPT uses model / iter_num).
_STATE_KEYS = ("state_dict", "model_state_dict", "model")
_STEP_KEYS = ("global_step", "step", "iter_num")
#: Seed of the random-init twin: the same twin (and so the same init readings) for every checkpoint.
TWIN_SEED = 0


class ReplayUsageError(ValueError):
    """The command line cannot work as given (wrong ``MODULE:CLASS``, missing data...): exit code 2."""


@dataclass
class CheckpointInfo:
    """What :func:`inspect_checkpoint` read from a file without building a model.

    Attributes:
        path: the file.
        kind: ``"lightning"`` (a Lightning ``.ckpt`` dict) or ``"state_dict"`` (plain weights).
        global_step: the optimizer step stored in the file; ``None`` when it holds none.
        hparams: the model's hyper-parameters (Lightning ``hyper_parameters``), ``{}`` if absent.
        datamodule_hparams: the datamodule's hyper-parameters, ``{}`` if absent.
        weights_only: whether ``torch.load(weights_only=True)`` could read the file.
        notes: things the user should know (fallback to ``weights_only=False``, no step in file...).
        error: why the file cannot be replayed; ``None`` when it can.
    """

    path: Path
    kind: str = "state_dict"
    global_step: int | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    datamodule_hparams: dict[str, Any] = field(default_factory=dict)
    weights_only: bool = True
    notes: list[str] = field(default_factory=list)
    error: str | None = None


# ------------------------------------------------------------------------------------ user objects
def import_object(spec: str, option: str, example: str) -> Any:
    """Import ``MODULE:NAME`` (``MODULE`` may also be a ``path/to/file.py``).

    The current directory is importable, as with ``python -m``, so ``--model mymodels:Net`` works
    from the folder that holds ``mymodels.py``.

    Example:
        >>> import_object("satmon.demos.lit:LitLM", "--model", "satmon.demos.lit:LitLM").__name__
        'LitLM'
    """
    hint = f"Pass {option} MODULE:NAME, e.g. {option} {example}"
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ReplayUsageError(f"Expected {option} as MODULE:NAME, got {spec!r}. {hint}.")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ReplayUsageError(f"{option} {spec}: no such file {module_name!r}. {hint}.")
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loaded)  # type: ignore[arg-type]
            sys.modules[path.stem] = module
            loaded.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except ReplayUsageError:
        raise
    except ImportError as e:
        raise ReplayUsageError(f"{option} {spec}: cannot import module {module_name!r} ({e}). {hint}; the module must "
                               "be importable from the current directory or installed.") from e
    except Exception as e:  # the user's module raised while importing
        raise ReplayUsageError(f"{option} {spec}: importing {module_name!r} failed: {type(e).__name__}: {e}") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))[:15]
            raise ReplayUsageError(f"{option} {spec}: module {module_name!r} has no attribute {attr!r} "
                                   f"(it has {', '.join(public)}...). {hint}.")
        obj = getattr(obj, part)
    return obj


# ------------------------------------------------------------------------------ finding and ordering
def _natural_key(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_checkpoints(paths: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> list[Path]:
    """Files as given, directories expanded (recursively) to their ``CHECKPOINT_SUFFIXES`` files,
    except ``exclude`` (e.g. the calibration data file, when it sits among the checkpoints).

    Raises:
        ReplayUsageError: a path does not exist, or nothing to replay was found.
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


def _first_line(e: BaseException) -> str:
    """``Type: first line`` of an exception (and the next line when the first only announces it)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    return f"{type(e).__name__}: {text}".rstrip(": ")


def _torch_load(path: Path, weights_only: bool) -> Any:
    try:  # mmap: reading global_step and hparams does not page the tensors in
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
    except Exception:  # legacy (non-zip) files refuse mmap; a broken file fails again below, with torch's clearer reason
        return torch.load(path, map_location="cpu", weights_only=weights_only)


def _load_any(path: Path, allow_unsafe: bool) -> tuple[Any, bool, str]:
    """``(object, weights_only, note)``: ``weights_only=True`` first; the unsafe fallback only when
    torch refused the file *because of* ``weights_only`` and the caller allows it."""
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise ImportError("reading .safetensors needs the `safetensors` package: pip install safetensors") from e
        return load_file(str(path), device="cpu"), True, ""
    try:
        return _torch_load(path, weights_only=True), True, ""
    except pickle.UnpicklingError as e:
        if "weights only" not in str(e).lower():
            raise
        found = re.search(r"GLOBAL (\S+)", str(e))
        reason = f"it holds {found.group(1)}, not on torch's allow-list" if found else _first_line(e)
        if not allow_unsafe:
            raise pickle.UnpicklingError(
                f"torch.load(weights_only=True) refused it ({reason}); rerun without --weights-only if you trust the file"
            ) from e
        note = (f"loaded with weights_only=False: torch.load(weights_only=True) refused it ({reason}); "
                "this runs code from the file: replay only checkpoints you trust, or pass --weights-only to skip such files")
        return _torch_load(path, weights_only=False), False, note


def _step_of(obj: Mapping[str, Any]) -> int | None:
    for k in _STEP_KEYS:
        v = obj.get(k)
        if isinstance(v, (int, Tensor)) and not isinstance(v, bool) and (not isinstance(v, Tensor) or v.numel() == 1):
            return int(v)
    return None


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, Tensor) for v in obj.values())


def extract_state_dict(obj: Any) -> dict[str, Tensor]:
    """The weights inside a loaded checkpoint: the object itself, or under ``state_dict``/``model_state_dict``/``model``."""
    if _is_state_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping):
        for k in _STATE_KEYS:
            if _is_state_dict(obj.get(k)):
                return dict(obj[k])
    raise ValueError("Expected a state_dict (a mapping of names to tensors, or one under 'state_dict'/'model_state_dict'/"
                     f"'model'), got {type(obj).__name__}" + (f" with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, Mapping) else ""))


def inspect_checkpoint(path: str | Path, allow_unsafe: bool = True) -> CheckpointInfo:
    """Read a checkpoint's kind, global step and hyper-parameters; never raises (errors go to ``.error``).

    Args:
        path: the file.
        allow_unsafe: fall back to ``weights_only=False`` when ``weights_only=True`` refuses the file.
    """
    info = CheckpointInfo(path=Path(path))
    try:
        obj, info.weights_only, note = _load_any(info.path, allow_unsafe)
        if note:
            info.notes.append(note)
        if isinstance(obj, Mapping) and "state_dict" in obj and ("pytorch-lightning_version" in obj or "global_step" in obj):
            info.kind = "lightning"
            info.hparams = dict(obj.get("hyper_parameters") or {})
            info.datamodule_hparams = dict(obj.get("datamodule_hyper_parameters") or {})
        else:
            extract_state_dict(obj)  # raises with the reason when there are no weights
        info.global_step = _step_of(obj) if isinstance(obj, Mapping) else None
        if info.global_step is None:
            info.notes.append("no global step in the file: ordered and logged by its position instead")
        del obj
    except Exception as e:  # any unreadable file is a per-file failure, never the end of the replay
        info.error = _first_line(e) + _diagnose(info.path)
    return info


def _diagnose(path: Path) -> str:
    """What is wrong with a file torch could not read, when its bytes tell (torch's own message may be
    a bare ``OSError: [Errno 22]``)."""
    import zipfile

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return ""
    if size == 0:
        return " (empty file)"
    if head == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        return f" (truncated or corrupt: a torch.save zip archive without its directory, {size:,} bytes; was the copy or save cut short?)"
    if head != b"PK\x03\x04" and head[:1] != b"\x80" and path.suffix != ".safetensors":
        return " (not a torch.save file: neither a zip archive nor a pickle)"
    return ""


def order_checkpoints(infos: Sequence[CheckpointInfo]) -> list[CheckpointInfo]:
    """Readable checkpoints by global step (files without one after them, by name); a ``last*.ckpt``
    whose step another file already has is dropped (Lightning's ``save_last`` copy)."""
    good = [i for i in infos if i.error is None]
    good.sort(key=lambda i: (i.global_step is None, i.global_step or 0, i.path.name.startswith("last"), _natural_key(i.path)))
    out: list[CheckpointInfo] = []
    steps = {i.global_step for i in good if not i.path.name.startswith("last")}
    for i in good:
        if i.path.name.startswith("last") and i.global_step is not None and i.global_step in steps:
            continue
        out.append(i)
    return out


# ------------------------------------------------------------------------------------ building models
class ModelLoader:
    """Builds the trained model of a checkpoint, and its random-init twin, one at a time.

    Args:
        model_cls: a ``LightningModule`` class: ``.ckpt`` files go through ``model_cls.load_from_checkpoint``
            and the twin is ``model_cls(**hyper_parameters)``.
        factory: a callable returning a fresh ``nn.Module``: plain state-dict files (and ``.ckpt`` files
            when no ``model_cls`` is given) are loaded into it with ``load_state_dict(strict=True)``;
            the twin is another ``factory()``.
        device: where the model lives.
    """

    def __init__(self, model_cls: type | None = None, factory: Callable[[], nn.Module] | None = None,
                 device: torch.device | str = "cpu") -> None:
        if model_cls is None and factory is None:
            raise ReplayUsageError("Pass --model MODULE:CLASS (a LightningModule, for .ckpt files) or --factory "
                                   "MODULE:FUNCTION (returns the nn.Module, for plain state_dict files).")
        self.model_cls, self.factory, self.device = model_cls, factory, torch.device(device)

    def check(self, info: CheckpointInfo) -> str | None:
        """Why this loader cannot build ``info`` (``None`` when it can)."""
        if info.kind == "lightning" and self.model_cls is None and self.factory is None:
            return "a Lightning checkpoint needs --model MODULE:CLASS"
        if info.kind == "state_dict" and self.factory is None:
            return "a plain state_dict file needs --factory MODULE:FUNCTION (a function returning the nn.Module)"
        return None

    def load(self, info: CheckpointInfo) -> nn.Module:
        if info.kind == "lightning" and self.model_cls is not None:
            if not hasattr(self.model_cls, "load_from_checkpoint"):
                raise TypeError(f"Expected --model to be a LightningModule class, got {self.model_cls!r}")
            model = self.model_cls.load_from_checkpoint(info.path, map_location=self.device, weights_only=info.weights_only)
        else:
            obj, _, _ = _load_any(info.path, allow_unsafe=not info.weights_only)
            state = extract_state_dict(obj)
            del obj
            model = self._fresh()
            _load_weights(model, state)
            del state
        return model.to(self.device).eval()

    def twin(self, info: CheckpointInfo) -> nn.Module:
        """A random-init instance of the same architecture, seeded with ``TWIN_SEED``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TWIN_SEED)
            if info.kind == "lightning" and self.model_cls is not None:
                model = self.model_cls(**info.hparams)
            else:
                model = self._fresh()
        return model.to(self.device).eval()

    def _fresh(self) -> nn.Module:
        assert self.factory is not None
        model = self.factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"Expected --factory to return an nn.Module, got {type(model).__name__}")
        return model


def _load_weights(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """``load_state_dict`` that also accepts files without the duplicate of a tied weight (safetensors
    stores a shared tensor once): a missing key is fine when its tensor is shared with a loaded one."""
    result = model.load_state_dict(state, strict=False)
    own = model.state_dict(keep_vars=True)
    loaded = {own[k].data_ptr() for k in state if k in own}
    missing = [k for k in result.missing_keys if own[k].data_ptr() not in loaded]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}: missing keys {missing[:6]}, "
                           f"unexpected keys {list(result.unexpected_keys)[:6]}: is --factory building the right architecture?")


# ---------------------------------------------------------------------------------- calibration data
def _split(batch: Any, batch_size: int | None) -> list[Any]:
    if batch_size is None:
        return [batch]
    if isinstance(batch, Tensor):
        return list(batch.split(batch_size))
    if isinstance(batch, Mapping):
        keys = list(batch)
        parts = [batch[k].split(batch_size) for k in keys]
        return [dict(zip(keys, chunk)) for chunk in zip(*parts)]
    return [batch]


def load_data_file(path: str | Path, n_batches: int, batch_size: int | None = None) -> list[Any]:
    """Calibration batches from a ``torch.save``d file.

    * a tensor: one batch (or ``batch_size`` rows each, split along dim 0);
    * a list or tuple: one batch per item (a tensor, a tuple of positional inputs or a dict);
    * a dict of tensors: one batch of keyword inputs (or split along dim 0).

    The first ``n_batches`` are kept.
    """
    p = Path(path)
    if not p.is_file():
        raise ReplayUsageError(f"--data {str(p)!r}: no such file. Pass --data FILE (a torch.save'd tensor, list of "
                               "batches or dict of tensors) or --datamodule MODULE:CLASS.")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ReplayUsageError(f"--data {str(p)!r}: cannot read it with torch.load(weights_only=True): {_first_line(e)}. "
                               "Save it with torch.save(tensor | [batch, ...] | {name: tensor}).") from e
    if isinstance(obj, Tensor) or isinstance(obj, Mapping) and obj and all(isinstance(v, Tensor) for v in obj.values()):
        batches = _split(obj, batch_size)
    elif isinstance(obj, (list, tuple)) and obj:
        batches = list(obj)
    else:
        raise ReplayUsageError(f"--data {str(p)!r}: expected a tensor, a non-empty list of batches or a dict of tensors, "
                               f"got {type(obj).__name__}.")
    return batches[:n_batches]


def datamodule_batches(dm_cls: type, hparams: Mapping[str, Any], n_batches: int) -> list[Any]:
    """The first ``n_batches`` of ``dm_cls(**hparams).train_dataloader()`` (after ``prepare_data``/``setup``)."""
    try:
        dm = dm_cls(**dict(hparams))
    except TypeError as e:
        raise ReplayUsageError(f"--datamodule: {dm_cls.__name__}(**{dict(hparams)}) failed: {e}. The checkpoint's "
                               "datamodule hyper-parameters do not fit this class; pass the right --datamodule.") from e
    if not hasattr(dm, "train_dataloader"):
        raise ReplayUsageError(f"--datamodule: expected a LightningDataModule class with train_dataloader(), got {dm_cls!r}.")
    if hasattr(dm, "prepare_data"):
        dm.prepare_data()
    if hasattr(dm, "setup"):
        dm.setup("fit")
    batches = []
    for batch in dm.train_dataloader():
        batches.append(batch)
        if len(batches) >= n_batches:
            break
    if not batches:
        raise ReplayUsageError(f"--datamodule {dm_cls.__name__}: its train_dataloader() yielded no batch.")
    return batches


def input_forward_fn(batches: Sequence[Any], input_key: str | None = None) -> Callable[[nn.Module, Any], Any] | None:
    """How a batch reaches the model; ``None`` leaves it to :func:`satmon.probe`'s own rule
    (tensor: ``model(t)``, tuple/list: ``model(*b)``, dict: ``model(**b)``).

    Rule: with ``input_key`` given, the model gets ``batch[input_key]`` only (an integer index for
    tuples/lists, a key for dicts). Otherwise a tuple/list of two tensors whose second is an integer
    tensor of the first's shape is read as ``(inputs, targets)`` and only the inputs are fed, as in
    Lightning language models' ``(x, y)`` batches.

    Example:
        >>> x = torch.zeros(2, 8, dtype=torch.long)
        >>> input_forward_fn([(x, x)]) is not None, input_forward_fn([x]) is None
        (True, True)
    """
    if input_key is not None:
        key: int | str = int(input_key) if input_key.lstrip("-").isdigit() else input_key
        first = batches[0]
        try:
            first[key]
        except (KeyError, IndexError, TypeError) as e:
            raise ReplayUsageError(f"--input-key {input_key!r} does not select anything in a batch of type "
                                   f"{type(first).__name__}: {_first_line(e)}.") from e
        return lambda model, batch: model(batch[key])
    first = batches[0]
    if (isinstance(first, (tuple, list)) and len(first) == 2 and all(isinstance(t, Tensor) for t in first)
            and not first[1].is_floating_point() and not first[1].is_complex() and first[1].shape == first[0].shape):
        from satmon.probing import feed_first  # the live probe's own rule for (inputs, targets) batches

        return feed_first
    return None


# ---------------------------------------------------------------------------------------- the loop
def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def replay(
    infos: Sequence[CheckpointInfo],
    loader: ModelLoader,
    batches: Sequence[Any],
    *,
    probe_kwargs: Mapping[str, Any] | None = None,
    twin: bool = True,
    on_record: Callable[[dict[str, Any], Any], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Probe each checkpoint in turn, one model in memory at a time; yields one record per file.

    A good record has ``checkpoint``, ``global_step``, ``seconds``, ``weights_only``, ``notes``, the
    probe report's keys (``layers``, ``sigma_min``, ``norm_type``, ``saturation``, ``verdict``,
    ``init_gap``...), with the verdict stepped at the checkpoint's global step. A failed one has
    ``checkpoint``, ``global_step`` (when known) and ``error``; the loop goes on.

    Args:
        infos: from :func:`inspect_checkpoint`; unreadable ones (``error`` set) become error records.
        loader: builds each model and its twin.
        batches: calibration batches, the same for every checkpoint.
        probe_kwargs: passed to :func:`satmon.probe` (``forward_fn``, ``device``, ``autocast_dtype``,
            ``threshold``, ``level``...).
        twin: also probe a random-init twin, for the init-to-trained readout.
        on_record: called with ``(record, report)`` (``report`` is ``None`` on failure) before the
            record is yielded, e.g. to write TensorBoard.
    """
    from satmon.discovery import find_norm_layers
    from satmon.probing import probe

    kwargs = dict(probe_kwargs or {})
    position = 0
    for info in infos:
        if info.error is None and info.global_step is None:
            step: int | None = position
        else:
            step = info.global_step
        position += info.error is None
        record: dict[str, Any] = {"checkpoint": str(info.path), "global_step": step}
        report = None
        if info.error is None:
            info.error = loader.check(info)
        if info.error is not None:
            record["error"] = info.error
        else:
            t0 = time.perf_counter()
            model = twin_model = None
            try:
                model = loader.load(info)
                # the twin only feeds the LayerNorm/RMSNorm init-gap: a DyT-only model skips it (half the cost)
                twin_model = loader.twin(info) if twin and find_norm_layers(model, kinds=("layernorm", "rmsnorm")) else None
                report = probe(model, batches, twin=twin_model, **kwargs)
                record.update(report.to_dict())
                if report.verdict is not None:
                    report.verdict = dataclasses.replace(report.verdict, step=step, source=Source.REPLAY.value,
                                                         reason=report.verdict.reason.replace("probe (", "replay (", 1))
                    record["verdict"] = report.verdict.to_dict()
                record.update(seconds=round(time.perf_counter() - t0, 3), weights_only=info.weights_only)
            except Exception as e:  # an incompatible checkpoint (shapes, missing keys...) is skipped, not fatal
                record = {"checkpoint": str(info.path), "global_step": step, "error": _first_line(e)}
                report = None
            finally:
                del model, twin_model
                _release(loader.device)
        if info.notes:
            record["notes"] = list(info.notes)
        if on_record is not None:
            on_record(record, report)
        yield record
        report = None


# ------------------------------------------------------------------------------------------ outputs
def _pooled_saturation(record: Mapping[str, Any]) -> float | None:
    verdict = record.get("verdict") or {}
    if verdict.get("saturation") is not None:
        return float(verdict["saturation"])
    sat = record.get("saturation")
    if isinstance(sat, Mapping):
        sat = sat.get("pooled")
    return float(sat) if isinstance(sat, (int, float)) else None


def summary_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The key readings of one record, flat: ``step``, ``name``, ``saturation``, ``decision``, ``margin``,
    ``norm_type``, ``min_ratio`` (sigma_min over depth), ``min_alignment``, ``seconds``, ``error``."""
    verdict = record.get("verdict") or {}
    decision = None
    if verdict.get("decision"):
        decision = str(verdict["decision"]).upper() + (" (collapse risk)" if verdict.get("collapse_risk") else "")
    sigma = record.get("sigma_min") or {}
    ratios = [r for r in (sigma.get("ratios") or []) if isinstance(r, (int, float)) and r == r]
    min_ratio = sigma.get("min_ratio", min(ratios) if ratios else None)
    aligns = [v["alignment"] for v in (record.get("layers") or {}).values()
              if isinstance(v, Mapping) and isinstance(v.get("alignment"), (int, float))]
    norm_type = record.get("norm_type")
    if isinstance(norm_type, Mapping):
        norm_type = norm_type.get("type") or norm_type.get("norm_type")
    return {
        "step": record.get("global_step"), "name": Path(str(record["checkpoint"])).name,
        "saturation": _pooled_saturation(record), "decision": decision, "margin": verdict.get("margin"),
        "norm_type": norm_type, "min_ratio": min_ratio, "min_alignment": min(aligns) if aligns else None,
        "seconds": record.get("seconds"), "error": record.get("error"),
    }


class TensorBoardReplay:
    """Writes each replayed checkpoint to a TensorBoard run, with the live callback's tags and writers,
    stepped by the checkpoint's global step (pass an instance as ``replay(on_record=...)``)."""

    def __init__(self, logdir: str | Path, name: str = "replay") -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        self.logger = TensorBoardLogger(str(logdir), name=name, default_hp_metric=False)
        self._layout = False

    @property
    def log_dir(self) -> str:
        return self.logger.log_dir

    def __call__(self, record: Mapping[str, Any], report: Any) -> None:
        from satmon.writers.tensorboard import TAG, add_layout, log_scalars, log_text, log_verdict

        loggers = [self.logger]
        step = int(record["global_step"] or 0)
        if report is None:
            log_text(loggers, "satmon/replay/error", f"`{record['checkpoint']}`: {record.get('error')}", step)
            return
        if not self._layout:
            dyt = [n for n, v in (record.get("layers") or {}).items() if isinstance(v, Mapping) and v.get("kind") == "dyt"]
            if dyt:
                add_layout(loggers, dyt)
            self._layout = True
        scalars = report.scalars()
        if report.verdict is not None:
            scalars.pop(TAG.saturation, None)  # log_verdict writes the pooled saturation itself: once per step
        log_scalars(loggers, scalars, step)
        if report.verdict is not None:
            log_verdict(loggers, report.verdict)
        log_text(loggers, "satmon/replay/checkpoint", f"`{record['checkpoint']}`", step)

    def close(self) -> None:
        self.logger.finalize("success")
