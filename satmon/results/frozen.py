"""Read-only containers for frozen results: :class:`FrozenMap`, and :func:`freeze` / :func:`thaw`.

A frozen dataclass is only as frozen as its fields: a ``dict`` field can still be changed in place.
satmon's results hold tuples and :class:`FrozenMap` instead: a ``dict`` that refuses every change,
so it still reads, compares, prints to JSON and ``isinstance(..., dict)``-checks as the dict it was
made from, and it hashes (a frozen result does too) and pickles (checkpoints). ``to_dict`` methods
:func:`thaw` them back to plain ``dict`` and ``list`` (``torch.load(weights_only=True)`` takes only those).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NoReturn, TypeVar

__all__ = ["FrozenMap", "freeze", "thaw"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(dict[K, V]):
    """A ``dict`` that cannot be changed: equal to a ``dict`` of the same items, JSON-serialisable, hashable, picklable.

    Example:
        >>> import json
        >>> m = FrozenMap({"ln_f": 0.5})
        >>> m["ln_f"], m == {"ln_f": 0.5}, json.dumps(m)
        (0.5, True, '{"ln_f": 0.5}')
        >>> m["ln_f"] = 1.0  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        TypeError: 'FrozenMap' object does not support item assignment (satmon results are
        frozen: use dataclasses.replace)
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__!r} object does not support item assignment "
            "(satmon results are frozen: use dataclasses.replace)"
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (dict(self),))

    def __copy__(self) -> FrozenMap[K, V]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenMap[K, V]:
        return FrozenMap(copy.deepcopy(dict(self), memo))


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
