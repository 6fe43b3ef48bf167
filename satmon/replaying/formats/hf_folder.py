"""The Hugging Face folder format: a Trainer ``checkpoint-N/`` or ``save_pretrained`` folder, its weights in
``model.safetensors``, ``pytorch_model.bin`` or a sharded index (each shard read as its own file's format, weights
only, always), its step in ``trainer_state.json`` (else the folder's name).

The Trainer's ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth`` and ``training_args.bin``
(:data:`TRAINER_STATE_FILES`) hold no model weights: never listed, never an error. The folder's JSON is read only when
it is a regular file within the pickle budget (:mod:`satmon.replaying.budget`): a ``trainer_state.json`` over it is
named with its size, the budget and the variable that raises it.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

from satmon.paths import open_regular
from satmon.replaying.budget import BUDGET_ENV, OverBudget, mib, pickle_budget
from satmon.replaying.file_info import FileChanged, FileStamp
from satmon.replaying.formats.common import (
    CheckpointFormat,
    CheckpointInfo,
    Entries,
    Match,
    error_text,
    natural_key,
)
from satmon.replaying.formats.safetensors import SUFFIX, weights_of
from satmon.replaying.formats.torch_file import (
    TorchWeights,
    extract_state_dict,
    load_index,
    refusal,
)
from satmon.replaying.user_code import error_line, short

__all__ = ["FORMAT", "HF_WEIGHTS", "TRAINER_STATE_FILES", "inspect", "recognise"]

#: Files of a Hugging Face Trainer checkpoint that hold no model weights (optimizer, scheduler, grad
#: scaler and RNG state, the training arguments): never replayed, never an error.
TRAINER_STATE_FILES = re.compile(
    r"(optimizer\.(pt|bin)|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|training_args\.bin)"
)


#: A Hugging Face model folder's weights, in the order ``transformers`` prefers them.
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


_HF_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")


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


def recognise(path: Path, entries: Entries | None) -> Match | None:
    """A folder holding a Hugging Face weights file (:data:`HF_WEIGHTS`): its main file is stamped; its shards, its
    JSON and the Trainer's state files are its own. Its other entries (subfolders...) are still searched."""
    found = None if entries is None else _hf_files(set(entries.names))
    if found is None:
        return None
    main, used = found
    return Match(files=(main,), used=frozenset(used))


def inspect(folder: Path, trust: bool = False, stamps: Sequence[FileStamp] | None = None) -> CheckpointInfo:
    """A Hugging Face folder: its weight files (single or sharded), read weights-only; its step from
    ``trainer_state.json`` (else the folder's ``checkpoint-N`` name)."""
    info = CheckpointInfo(path=folder, hf=True, format=FORMAT.name)  # weights only: a Trainer writes tensors only
    names = {p.name for p in folder.iterdir() if p.is_file()}
    found = _hf_files(names)
    if found is None:
        info.error = (
            f"not a checkpoint: a folder without {' / '.join(HF_WEIGHTS)} (a Hugging Face checkpoint) "
            "or .ckpt/.pt files; pass the files inside it"
        )
        return info
    main = found[0]
    try:
        files = [main]
        if main.endswith(".index.json"):
            index = json.loads(_bounded_text(folder / main))
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"not a checkpoint: {main} has no weight_map")
            files = sorted({str(v) for v in weight_map.values()}, key=natural_key)
            if any("/" in f or "\\" in f or f.startswith(".") for f in files):
                raise ValueError(f"not a checkpoint: {main} names shards outside its folder")
            missing = [f for f in files if not (folder / f).is_file()]
            if missing:
                raise ValueError(
                    f"incomplete sharded checkpoint: {main} names {len(files)} shard(s), "
                    f"{len(missing)} missing ({', '.join(missing[:3])})"
                )
        given = {s.path.name: s for s in stamps or ()}
        weights = []
        for name in files:
            stamp = given.get(name) or FileStamp.of(folder / name)
            if name.endswith(SUFFIX):
                weights.append(weights_of(stamp))
            else:  # pytorch_model*.bin: weights only, always (a Trainer writes tensors only)
                obj = load_index(stamp, trust=False)
                layout = "zip" if zipfile.is_zipfile(stamp.path) else "legacy"
                extract_state_dict(obj)
                weights.append(TorchWeights(stamp, obj, layout, checksummed=layout == "zip"))
        info.weights = tuple(weights)
        if main.endswith(".index.json"):
            have = {k for w in weights for k in w.meta()}
            absent = [k for k in weight_map if k not in have]
            if absent:
                raise ValueError(
                    f"incomplete sharded checkpoint: {len(absent)} tensor(s) of {main} in no shard "
                    f"({', '.join(short(k, 60) for k in absent[:3])})"
                )
    except FileChanged as e:
        info.error, info.weights = str(e), ()
        return info
    except Exception as e:
        info.weights = ()
        if "weights only load failed" in str(e)[:2000].lower():
            info.refused = info.unsafe = True  # never trusted: a Trainer writes tensors only
            info.error = (
                refusal(e)[0].split(". If you")[0] + ": a Hugging Face weights file holds tensors only, so "
                "this one is not what transformers or the Trainer writes; do not load it"
            )
        else:
            info.error = error_text(e)
        return info
    info.global_step, note = _hf_step(folder)
    if note:
        info.notes.append(note)
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
            raise OverBudget(
                f"over satmon's read budget: {path.name} is {size:,} bytes, over the {mib(budget)} "
                f"satmon reads of a checkpoint's metadata; set {BUDGET_ENV}=N (MiB) to read it"
            )
        return f.read(budget + 1).decode("utf-8", errors="replace")


#: The Hugging Face folder format.
FORMAT = CheckpointFormat("Hugging Face folder", recognise, inspect)
