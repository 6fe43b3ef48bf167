"""Read-only containers for frozen results: :class:`FrozenMap`, and :func:`freeze` / :func:`thaw`.

A frozen dataclass is only as frozen as its fields: a ``dict`` field can still be changed in place.
satmon's results hold tuples and :class:`FrozenMap` instead, which cannot be changed, compare equal
to the ``dict`` they were made from, hash (so a frozen result does too) and pickle (checkpoints).
``types.MappingProxyType`` would not pickle. ``to_dict`` methods :func:`thaw` them back to plain
``dict`` and ``list`` (JSON, ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

__all__ = ["FrozenMap", "freeze", "thaw"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only mapping, in insertion order: equal to a ``dict`` of the same items, hashable, picklable.

    Example:
        >>> m = FrozenMap({"ln_f": 0.5})
        >>> m["ln_f"], m == {"ln_f": 0.5}, dict(m)
        (0.5, True, {'ln_f': 0.5})
        >>> m["ln_f"] = 1.0
        Traceback (most recent call last):
        ...
        TypeError: 'FrozenMap' object does not support item assignment
    """

    __slots__ = ("_data", "_hash")

    def __init__(self, items: Mapping[K, V] | Any = ()) -> None:
        object.__setattr__(self, "_data", dict(items))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(tuple(self._data.items())))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._data,))


def freeze(value: Any) -> Any:
    """``value`` with every ``dict`` (any mapping) made a :class:`FrozenMap` and every ``list`` a tuple, deeply.

    Example:
        >>> freeze({"blocks.0.mlp": {"flat_fraction": 0.25}, "layers": ["a", "b"]})
        FrozenMap({'blocks.0.mlp': FrozenMap({'flat_fraction': 0.25}), 'layers': ('a', 'b')})
    """
    if isinstance(value, Mapping):
        return FrozenMap({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):  # a NamedTuple keeps its type
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of :func:`freeze` for writing: mappings become ``dict``, tuples ``list``, deeply.

    Example:
        >>> thaw(freeze({"notes": ["a"], "risk": {"mlp": {"x": 1.0}}}))
        {'notes': ['a'], 'risk': {'mlp': {'x': 1.0}}}
    """
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return [thaw(v) for v in value]
    return value
