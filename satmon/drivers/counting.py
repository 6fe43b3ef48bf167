"""Count a run's parameters and the unique tokens it trains on: its point on the study's phase diagram.

Framework-free (a model and a DataLoader, a Dataset, or a list or dict of them): the Lightning driver
calls :func:`run_scale` at train start with ``trainer.train_dataloader``.

The unique tokens are counted from the training dataset when it can say them without a pass over the
data: a map-style dataset's length times the tokens of one sample (the integer token ids of its inputs:
a tensor, the first element of an ``(inputs, targets)`` pair, or ``input_ids`` of a dict, less padding
where an ``attention_mask`` marks it). A few samples are read to find the length; samples that overlap
(sliding windows: sample ``i + 1`` repeats sample ``i`` shifted by ``s`` tokens) count each token once,
``(n - 1) x s + length``; samples of varying length give an estimate from their mean, said as such.
The random state of Python, NumPy and torch is restored after the samples are read, so a dataset that
draws random numbers does not change the training that follows. When the tokens cannot be counted (an
``IterableDataset``, samples that are not token ids), :class:`~satmon.results.scale.RunScale` says
why and the card says how to give them (``unique_tokens=``).
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from satmon.results.scale import RunScale

__all__ = [
    "count_parameters",
    "count_train_tokens",
    "planned_tokens",
    "optimizer_name",
    "put_scale_note",
    "run_scale",
    "sample_tokens",
    "scale_note",
]

#: samples read to find a sample's length (first, second, last and evenly between)
_SAMPLES = 8


def count_parameters(model: nn.Module) -> int:
    """The model's parameters, each shared (tied) tensor once; a DTensor counts its global size.

    Example:
        >>> count_parameters(torch.nn.Linear(4, 3))
        15
    """
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Python's, NumPy's (when imported) and torch's CPU random state, as they were, after the block."""
    state = random.getstate()
    numpy = sys.modules.get("numpy")
    np_state = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(state)
        if np_state is not None:
            numpy.random.set_state(np_state)


def _token_ids(sample: Any) -> tuple[Tensor | None, str]:
    """The integer token ids of one sample, and how many of them are tokens (not padding); or ``None`` and why."""
    if isinstance(sample, Mapping):
        if "input_ids" not in sample:
            return None, f"its samples are dicts without 'input_ids' (keys {sorted(map(str, sample))[:6]})"
        ids, _ = _token_ids(sample["input_ids"])
        mask = sample.get("attention_mask")
        if ids is not None and mask is not None:
            mask = torch.as_tensor(mask)
            if mask.shape == ids.shape:
                return ids, "mask"
        return ids, "" if ids is not None else "its 'input_ids' are not integer token ids"
    if isinstance(sample, (tuple, list)) and sample and not isinstance(sample[0], (int, bool)):
        return _token_ids(sample[0])  # (inputs, targets): the inputs
    try:
        ids = torch.as_tensor(sample)
    except (TypeError, ValueError, RuntimeError):
        return None, f"its samples are {type(sample).__name__}, not token ids"
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool or ids.numel() == 0:
        return None, f"its samples hold {ids.dtype} values, not integer token ids"
    return ids, ""


def _stride(first: Tensor, second: Tensor) -> int | None:
    """``s`` when ``second`` is ``first`` shifted left by ``s`` tokens (overlapping windows), else ``None``."""
    a, b = first.reshape(-1), second.reshape(-1)
    n = a.numel()
    if b.numel() != n or n < 2:
        return None
    k = min(8, n - 1)
    starts = (a.unfold(0, k, 1) == b[:k]).all(dim=1).nonzero().flatten().tolist()  # where b's first k tokens sit in a
    for s in starts:
        if 0 < s < n and torch.equal(a[s:], b[: n - s]) and a[s:].unique().numel() > 1:
            return int(s)
    return None


def _dataset_tokens(dataset: Any) -> tuple[int | None, str]:
    """``(unique tokens, how they were counted)`` of a map-style dataset, or ``(None, why not)``."""
    name = type(dataset).__name__
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return None, f"the training data is an IterableDataset ({name}), which has no length"
    try:
        n = len(dataset)
    except TypeError:
        return None, f"the training dataset ({name}) has no len()"
    if n < 1:
        return None, f"the training dataset ({name}) is empty"
    picks = sorted({0, min(1, n - 1), n - 1, *(i * (n - 1) // (_SAMPLES - 1) for i in range(_SAMPLES))})
    try:
        with _random_state_kept():
            samples = [dataset[i] for i in picks]
    except Exception as e:  # a dataset that cannot be indexed: unknown, never a failed run
        return None, f"reading a sample of {name} failed ({type(e).__name__})"
    found = [_token_ids(s) for s in samples]
    for ids, why in found:
        if ids is None:
            return None, why
    lengths = [
        int(torch.as_tensor(s["attention_mask"]).sum()) if how == "mask" else ids.numel()
        for (ids, how), s in zip(found, samples)
    ]
    padded = any(how == "mask" for _, how in found)
    if len(set(lengths)) > 1 or padded:
        mean = sum(lengths) / len(lengths)
        what = "tokens the attention mask keeps" if padded else "tokens (lengths vary)"
        return round(n * mean), f"about {n:,} samples x {mean:,.0f} {what}, the mean of {len(picks)} samples of {name}"
    length = lengths[0]
    stride = _stride(found[0][0], found[1][0]) if n > 1 and picks[1] == 1 else None
    if stride is not None:
        return (
            (n - 1) * stride + length,
            f"{n:,} overlapping samples of {length} tokens, each {stride} token(s) after the "
            f"last, in {name}: (n - 1) x {stride} + {length}",
        )
    return n * length, f"{n:,} samples x {length} tokens in {name}"


def count_train_tokens(data: Any) -> tuple[int | None, str]:
    """The unique tokens of the training data (a DataLoader, a Dataset, or a list/dict of them, summed), and how
    they were counted; or ``(None, why not)``.

    Example:
        >>> loader = torch.utils.data.DataLoader(torch.arange(1000).reshape(10, 100), batch_size=2)
        >>> count_train_tokens(loader)
        (1000, '10 samples x 100 tokens in Tensor')
    """
    if data is None:
        return None, "the trainer has no training dataloader"
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (list, tuple)) and data and all(hasattr(d, "dataset") for d in data):
        counted = [count_train_tokens(d) for d in data]
        missing = [why for n, why in counted if n is None]
        if missing:
            return None, missing[0]
        return sum(n for n, _ in counted), "; ".join(why for _, why in counted)
    return _dataset_tokens(getattr(data, "dataset", data))


def run_scale(model: nn.Module, data: Any, unique_tokens: int | None = None) -> RunScale:
    """The run's :class:`~satmon.results.scale.RunScale`: its parameters, and ``unique_tokens`` when given, else the
    tokens counted from ``data`` (:func:`count_train_tokens`). Never raises: what cannot be counted is said.

    Example:
        >>> run_scale(torch.nn.Linear(4, 3), None, unique_tokens=600).tokens_per_param
        40.0
    """
    params = count_parameters(model)
    if unique_tokens is not None:
        return RunScale(params, int(unique_tokens), counted="given: unique_tokens=")
    try:
        tokens, how = count_train_tokens(data)
    except Exception as e:  # counting must never stop training
        tokens, how = None, f"counting them failed ({type(e).__name__}: {str(e)[:80]})"
    return RunScale(params, tokens, counted=how) if tokens is not None else RunScale(params, missing=how)


def sample_tokens(data: Any) -> tuple[int | None, str]:
    """The tokens of one training sample (its first; padding left out where an attention mask marks it), and how they
    were read; or ``(None, why not)``. A list or dict of loaders: the first's.

    Example:
        >>> sample_tokens(torch.utils.data.DataLoader(torch.arange(1000).reshape(10, 100), batch_size=2))
        (100, 'a sample of Tensor holds 100 tokens')
    """
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (list, tuple)) and data and all(hasattr(d, "dataset") for d in data):
        data = data[0]
    if data is None:
        return None, "the trainer has no training dataloader"
    dataset = getattr(data, "dataset", data)
    name = type(dataset).__name__
    try:
        with _random_state_kept():
            sample = next(iter(dataset)) if isinstance(dataset, torch.utils.data.IterableDataset) else dataset[0]
    except Exception as e:  # never a failed run
        return None, f"reading a sample of {name} failed ({type(e).__name__})"
    ids, how = _token_ids(sample)
    if ids is None:
        return None, how
    if how == "mask":
        return int(
            torch.as_tensor(sample["attention_mask"]).sum()
        ), f"the first sample of {name}: tokens its attention mask keeps"
    return int(ids.numel()), f"a sample of {name} holds {ids.numel()} tokens"


def planned_tokens(
    steps: float | None, batch_size: int | None, data: Any, accumulation: int = 1, world_size: int = 1
) -> tuple[int | None, str]:
    """The tokens a run will process: optimizer ``steps`` x global batch (``batch_size`` samples per device and
    micro-batch x ``accumulation`` x ``world_size``) x the tokens of a sample of ``data``; or ``(None, why not)``.

    Example:
        >>> loader = torch.utils.data.DataLoader(torch.arange(6400).reshape(100, 64), batch_size=16)
        >>> planned_tokens(500, 16, loader, accumulation=2, world_size=4)  # doctest: +NORMALIZE_WHITESPACE
        (4096000, '500 optimizer steps x 16 samples x 2 accumulated x 4 ranks x 64 tokens (a
        sample of Tensor holds 64 tokens)')
    """
    if steps is None or not (isinstance(steps, (int, float)) and 0 < steps < float("inf")):
        return None, "the trainer plans no finite number of optimizer steps (set max_steps, or give planned_tokens=)"
    if not isinstance(batch_size, int) or batch_size < 1:
        return None, "the training dataloader's batch size is unknown (a batch sampler)"
    length, how = sample_tokens(data)
    if length is None:
        return None, how
    tokens = int(steps) * batch_size * int(accumulation) * int(world_size) * length
    return tokens, (
        f"{int(steps):,} optimizer steps x {batch_size} samples x {int(accumulation)} accumulated x "
        f"{int(world_size)} rank{'s' if world_size != 1 else ''} x {length} tokens ({how})"
    )


def scale_note(model: nn.Module, data: Any, unique_tokens: int | None = None) -> str:
    """The card's phase-diagram line of a run: :func:`run_scale` placed against the study's cells (what every driver
    that sees the training data writes on its card)."""
    from satmon.io.phase_diagram import study_points

    return run_scale(model, data, unique_tokens).note(study_points())


def optimizer_name(optimizer: Any) -> str | None:
    """The optimizer's name as the forecast's domain reads it (``"adamw"``: its class,
    lower case), ``None`` without one.

    Example:
        >>> optimizer_name(torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())), optimizer_name(None)
        ('adamw', None)
    """
    inner = getattr(optimizer, "optimizer", None)  # Lightning's and accelerate's wrappers hold the torch optimizer
    optimizer = inner if isinstance(inner, torch.optim.Optimizer) else optimizer
    return None if optimizer is None else type(optimizer).__name__.lower()


def put_scale_note(notes: list[str], note: str) -> None:
    """Put ``note`` among a screen's ``notes``, in place of a phase-diagram line a resumed state brought back."""
    if note:
        notes[:] = [n for n in notes if not RunScale.is_note(n)] + [note]
