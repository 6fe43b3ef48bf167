"""How a batch reaches a model: one rule for the probe, the gating trace, replay and the live probe.

Rule (:func:`feed`): a tensor is ``model(t)``, a tuple/list is ``model(*b)``, a mapping is
``model(**b)``. :func:`feed_first` reads a tuple/list as ``(inputs, targets)`` and feeds only the
inputs, as Lightning language models' ``(x, y)`` batches need. :func:`to_device` moves nested batches
with Lightning's ``apply_to_collection``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn

__all__ = [
    "ForwardFn",
    "as_batch_list",
    "feed",
    "feed_first",
    "first_tensor",
    "peek_batch",
    "split_batch",
    "take_batches",
    "to_device",
]

#: ``forward_fn(model, batch)``: how one batch is fed (its return value is ignored by satmon).
ForwardFn = Callable[[nn.Module, Any], Any]


def feed(model: nn.Module, batch: Any) -> Any:
    """The default rule: ``model(**b)`` for a mapping, ``model(*b)`` for a tuple/list, else ``model(b)``.

    Example:
        >>> feed(torch.nn.Identity(), torch.ones(2)).tolist()
        [1.0, 1.0]
    """
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def feed_first(model: nn.Module, batch: Any) -> Any:
    """A ``forward_fn`` for ``(inputs, targets)`` batches: ``model(batch[0])`` for a tuple/list,
    :func:`feed` otherwise. The live probe's default.

    Example:
        >>> feed_first(torch.nn.Identity(), (torch.ones(2), torch.zeros(2))).tolist()
        [1.0, 1.0]
    """
    if isinstance(batch, (tuple, list)) and len(batch) > 0:
        return model(batch[0])
    return feed(model, batch)


def to_device(batch: Any, device: torch.device | str) -> Any:
    """Every tensor of a nested batch (tuples, named tuples, lists, dicts) moved to ``device``.

    Example:
        >>> to_device({"x": torch.ones(1)}, "cpu")["x"].device.type
        'cpu'
    """
    return apply_to_collection(batch, Tensor, lambda t: t.to(device))


def as_batch_list(batches: Any) -> Iterable[Any]:
    """``batches`` as an iterable of batches: a single tensor or mapping is one batch.

    Raises:
        TypeError: a string, bytes or a non-iterable that is not a tensor or mapping.
    """
    if isinstance(batches, (Tensor, Mapping)):
        return [batches]
    if isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(
            f"Expected `batches` to be a tensor, a dict, or an iterable of batches, got {type(batches).__name__}."
            " Wrap a single (inputs, targets) batch in a list: probe(model, [batch])."
        )
    return batches


def first_tensor(obj: Any) -> Tensor | None:
    """The tensor a module returned: itself, or the first tensor of a tuple/list/dict (HF blocks return tuples).

    Example:
        >>> first_tensor((None, {"h": torch.zeros(1)})).shape
        torch.Size([1])
    """
    if isinstance(obj, Tensor):
        return obj
    values = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (tuple, list)) else ()
    for v in values:
        t = first_tensor(v)
        if t is not None:
            return t
    return None


def split_batch(batch: Any, batch_size: int | None) -> list[Any]:
    """A tensor or a mapping of tensors split along dim 0 into batches of ``batch_size`` rows.

    ``None`` keeps the batch whole; other types are kept whole too.

    Example:
        >>> [b.shape[0] for b in split_batch(torch.zeros(5, 2), 2)]
        [2, 2, 1]
    """
    if batch_size is None:
        return [batch]
    if isinstance(batch, Tensor):
        return list(batch.split(batch_size))
    if isinstance(batch, Mapping):
        keys = list(batch)
        parts = [batch[k].split(batch_size) for k in keys]
        return [dict(zip(keys, chunk)) for chunk in zip(*parts)]
    return [batch]


def take_batches(batches: Any, max_batches: int | None = None, keep: bool = False) -> Iterable[Any]:
    """The first ``max_batches`` of ``batches`` (all with ``None``); a list when they must be run more
    than once (``keep``), else an iterator that runs through them once.

    Example:
        >>> take_batches(iter([1, 2, 3]), 2, keep=True)
        [1, 2]
    """
    batch_iter: Iterable[Any] = as_batch_list(batches)
    if max_batches is not None:
        batch_iter = itertools.islice(batch_iter, max_batches)
    return list(batch_iter) if keep else batch_iter


def peek_batch(batches: Iterable[Any]) -> tuple[Any, Iterable[Any]]:
    """The first batch, and the batches with it still in front (a list stays a list).

    Example:
        >>> first, rest = peek_batch(iter([1, 2]))
        >>> first, list(rest)
        (1, [1, 2])
    """
    if isinstance(batches, list):
        return (batches[0] if batches else None), batches
    it = iter(batches)
    first = next(it, None)
    return first, (itertools.chain([first], it) if first is not None else it)
