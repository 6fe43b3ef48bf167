"""Calibration batches for a replay: a data file, a datamodule, or batches captured from a loader.

The same batches feed every checkpoint (and its random-init twin), so readings at different steps
form a trajectory. How each batch reaches the model is :mod:`satmon.batches`' rule;
:func:`input_forward_fn` only picks the ``(inputs, targets)`` or ``--input-key`` variant of it.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor

from satmon.batches import ForwardFn, feed_first, split_batch
from satmon.paths import kind_of
from satmon.replaying.budget import OverBudget
from satmon.replaying.file_info import FileStamp
from satmon.replaying.formats.torch_file import load_index
from satmon.replaying.user_code import ReplayUsageError, error_line, printable, short

__all__ = ["capture_batches", "datamodule_batches", "fed_token_ids", "input_forward_fn", "load_data_file"]


def capture_batches(batches: Iterable[Any], n_batches: int) -> list[Any]:
    """The first ``n_batches`` of ``batches``, every tensor detached, on the CPU and cloned (safe to keep).

    Example:
        >>> [b.tolist() for b in capture_batches(iter(torch.arange(5).split(2)), 2)]
        [[0, 1], [2, 3]]
    """
    out: list[Any] = []
    if n_batches < 1:
        return out
    for batch in batches:
        out.append(apply_to_collection(batch, Tensor, lambda t: t.detach().cpu().clone()))
        if len(out) >= n_batches:
            break
    return out


def _damaged_record(path: Path) -> str | None:
    """The first record of a ``torch.save`` zip archive whose bytes do not match their CRC-32 (``None``: none, or not a
    zip archive: a legacy file records no checksum)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip()
    except zipfile.BadZipFile as e:
        return None if not zipfile.is_zipfile(path) else f"(its zip structure: {e})"
    except OSError:
        return None  # torch.load says why it cannot read it


def check_data_file(path: str | Path) -> Path:
    """``path`` as a ``Path`` when it is a regular file (symlinks followed), checked by
    its kind only: nothing is opened.

    Raises:
        ReplayUsageError: no such file, or not a regular file (a folder, a FIFO, a socket, a device, a link to one, a
            broken link, a path over the system's limits), in one line naming what it is.

    Example:
        >>> check_data_file("/dev/zero")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.replaying.user_code.ReplayUsageError: --data '/dev/zero': a character device, not a regular
        file (it was not opened). Pass --data FILE (a torch.save'd tensor, list of batches or dict of
        tensors) or --datamodule MODULE:CLASS.
    """
    kind = kind_of(path)
    if kind.regular:
        return Path(path)
    what = "no such file" if kind.kind == "missing" else f"{kind.describe()}, not a regular file (it was not opened)"
    raise ReplayUsageError(
        f"--data {printable(str(path)[:240])!r}: {what}. Pass --data FILE (a torch.save'd tensor, list "
        "of batches or dict of tensors) or --datamodule MODULE:CLASS."
    )


def load_data_file(path: str | Path, n_batches: int, batch_size: int | None = None) -> list[Any]:
    """The first ``n_batches`` calibration batches of a ``torch.save``d file (read with ``weights_only=True``).

    * a tensor: one batch (or ``batch_size`` rows each, split along dim 0);
    * a list or tuple: one batch per item (a tensor, a tuple of positional inputs or a dict);
    * a dict of tensors: one batch of keyword inputs (or split along dim 0).

    Raises:
        ReplayUsageError: no such file, unreadable, or none of the forms above.

    Example:
        >>> import os, tempfile
        >>> f = os.path.join(tempfile.mkdtemp(), "calib.pt")
        >>> torch.save(torch.zeros(10, 4, dtype=torch.long), f)
        >>> [b.shape[0] for b in load_data_file(f, n_batches=2, batch_size=4)]
        [4, 4]
    """
    p = check_data_file(path)
    damaged = _damaged_record(p)
    if damaged is not None:  # torch.load checks no checksum: damaged batches would be read as good ones
        raise ReplayUsageError(
            f"--data {str(p)!r}: corrupt: the bytes of its record {damaged!r} do not match the CRC-32 "
            "its zip directory records (the file was damaged after it was written); save it again."
        )
    # its declared sizes first (satmon.replaying.budget): a bomb is refused before anything is inflated or allocated
    try:
        load_index(FileStamp.of(p), trust=False)
    except OverBudget as e:
        raise ReplayUsageError(f"--data {str(p)!r}: {e}.") from None
    except Exception:  # torch.load below says why it cannot read it
        pass
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ReplayUsageError(
            f"--data {str(p)!r}: cannot read it with torch.load(weights_only=True): {error_line(e)}. "
            "Save it with torch.save(tensor | [batch, ...] | {name: tensor})."
        ) from e
    if isinstance(obj, Tensor) or isinstance(obj, Mapping) and obj and all(isinstance(v, Tensor) for v in obj.values()):
        batches = split_batch(obj, batch_size)
    elif isinstance(obj, (list, tuple)) and obj:
        batches = list(obj)
    else:
        raise ReplayUsageError(
            f"--data {str(p)!r}: expected a tensor, a non-empty list of batches or a dict of tensors, "
            f"got {type(obj).__name__}."
        )
    return batches[:n_batches]


def datamodule_batches(dm_cls: type, hparams: Mapping[str, Any], n_batches: int) -> list[Any]:
    """The first ``n_batches`` of ``dm_cls(**hparams).train_dataloader()`` (after
    ``prepare_data`` and ``setup("fit")``).

    Raises:
        ReplayUsageError: one line naming the class, the hyper-parameters and what to do, whatever
            went wrong in the datamodule (hyper-parameters that do not fit it, ``seq_len=0``...).
    """
    hp = dict(hparams)
    where = f"--datamodule {dm_cls.__name__}(**{short(hp)})" if hp else f"--datamodule {dm_cls.__name__}()"
    origin = "the datamodule hyper-parameters stored in the checkpoint" if hp else "its default arguments"
    todo = (
        "Pass --data FILE with saved calibration batches (a run with the live probe saves satmon_calibration.pt "
        "beside its logs), or a --datamodule that works with " + origin + "."
    )
    try:
        dm = dm_cls(**hp)
    except Exception as e:
        raise ReplayUsageError(f"{where} failed ({origin}): {error_line(e)}. {todo}") from e
    if not callable(getattr(dm, "train_dataloader", None)):
        raise ReplayUsageError(
            f"--datamodule: expected a LightningDataModule class with train_dataloader(), got {dm_cls!r}."
        )
    try:
        if hasattr(dm, "prepare_data"):
            dm.prepare_data()
        if hasattr(dm, "setup"):
            dm.setup("fit")
        batches = capture_batches(dm.train_dataloader(), n_batches)
    except Exception as e:  # the user's datamodule code: any failure is a usage problem, in one line
        raise ReplayUsageError(
            f"{where}: reading its train_dataloader() failed with {origin}: {error_line(e)}. {todo}"
        ) from e
    if not batches:
        raise ReplayUsageError(f"{where}: its train_dataloader() yielded no batch. {todo}")
    return batches


def input_forward_fn(batches: Sequence[Any], input_key: str | None = None) -> ForwardFn | None:
    """How a batch reaches the model; ``None`` leaves it to :func:`satmon.batches.feed`
    (tensor: ``model(t)``, tuple/list: ``model(*b)``, dict: ``model(**b)``).

    Rule: with ``input_key`` given, the model gets ``batch[input_key]`` only (an integer index for
    tuples/lists, a key for dicts). Otherwise a tuple/list of two tensors whose second is an integer
    tensor of the first's shape is read as ``(inputs, targets)`` and only the inputs are fed
    (:func:`satmon.batches.feed_first`), as in Lightning language models' ``(x, y)`` batches.

    Example:
        >>> x = torch.zeros(2, 8, dtype=torch.long)
        >>> input_forward_fn([(x, x)]) is feed_first, input_forward_fn([x]) is None
        (True, True)
    """
    if not batches:
        raise ReplayUsageError("Expected at least one calibration batch, got none.")
    first = batches[0]
    if input_key is not None:
        key: int | str = int(input_key) if input_key.lstrip("-").isdigit() else input_key
        try:
            first[key]
        except (KeyError, IndexError, TypeError) as e:
            raise ReplayUsageError(
                f"--input-key {input_key!r} does not select anything in a batch of type "
                f"{type(first).__name__}: {error_line(e)}."
            ) from e
        return lambda model, batch: model(batch[key])
    if (
        isinstance(first, (tuple, list))
        and len(first) == 2
        and all(isinstance(t, Tensor) for t in first)
        and not first[1].is_floating_point()
        and not first[1].is_complex()
        and first[1].shape == first[0].shape
    ):
        return feed_first
    return None


def fed_token_ids(batches: Sequence[Any], input_key: str | None = None) -> int | None:
    """The largest token id the model is fed from ``batches`` (by :func:`input_forward_fn`'s rule: ``batch[input_key]``,
    the inputs of an ``(inputs, targets)`` pair, a tensor batch itself, a dict's ``input_ids``); ``None`` when what is
    fed holds no integer tensor. Read once, before the first checkpoint (not on any hot path).

    Example:
        >>> x = torch.tensor([[1, 7], [3, 2]])
        >>> fed_token_ids([(x, x + 100)]), fed_token_ids([{"input_ids": x}]), fed_token_ids([x.float()])
        (7, 7, None)
    """
    if not batches:
        return None
    fed = input_forward_fn(batches, input_key)
    found = None
    for batch in batches:
        if input_key is not None:
            key: int | str = int(input_key) if input_key.lstrip("-").isdigit() else input_key
            inputs = batch[key]
        elif fed is feed_first or isinstance(batch, (tuple, list)):
            inputs = batch[0] if len(batch) else None
        elif isinstance(batch, Mapping):
            inputs = batch.get("input_ids")
        else:
            inputs = batch
        if (
            isinstance(inputs, Tensor)
            and inputs.numel()
            and not inputs.is_floating_point()
            and not inputs.is_complex()
            and inputs.dtype != torch.bool
        ):
            top = int(inputs.max())
            found = top if found is None else max(found, top)
    return found
