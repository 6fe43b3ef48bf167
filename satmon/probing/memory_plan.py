"""How many ``d x d`` float64 matrices the probe holds at once: groups of taps, one pass each.

The probe's extra memory is its covariance matrices (``8 d^2`` bytes each, one per LayerNorm/RMSNorm
layer and per residual stream) plus the readout of one of them (the covariance, its symmetric
copy, the scaled copy ``eigh`` factorises, the eigenvectors and LAPACK's workspace:
:data:`READOUT_MATRICES` matrices of ``8 d^2`` bytes, measured in docs/science/performance_measurements.md). Under a
budget, the taps are split into groups that each fit beside one readout, and the calibration
batches run once per group: the readings do not depend on the grouping.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from satmon.results.plan import UPDATE_BYTES_PER_VALUE, MemoryPlan, format_bytes, matrix_bytes

__all__ = [
    "READOUT_MATRICES",
    "UPDATE_BYTES_PER_VALUE",
    "MemoryPlan",
    "format_bytes",
    "matrix_bytes",
    "parse_bytes",
    "plan_memory",
]

#: ``8 d^2``-byte matrices one readout holds beside its accumulator, at its peak (5.7 measured, CPU).
READOUT_MATRICES = 6

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(size: int | str) -> int:
    """Bytes from an int or a string with a unit (``"2GiB"``, ``"512MB"``, ``"1.5 GiB"``).

    Example:
        >>> parse_bytes("2GiB"), parse_bytes("1.5 kB"), parse_bytes(4096)
        (2147483648, 1500, 4096)
    """
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    m = _SIZE.match(size) if isinstance(size, str) else None
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in _UNITS) or float(m.group(1)) <= 0:
        raise ValueError(
            f"Expected `memory_budget` as a positive number of bytes or a string like '2GiB' or '512MB', got {size!r}."
            f" Units: {', '.join(sorted(_UNITS, key=_UNITS.get))} (case-insensitive)."
        )
    return int(float(m.group(1)) * _UNITS[unit or "b"])


def _readout_bytes(d: int | None) -> int:
    return READOUT_MATRICES * 8 * d * d if d else 0


def plan_memory(dims: Sequence[tuple[str, int | None]], budget: int | str | None = None) -> MemoryPlan:
    """Group taps, in the given order, so that each group's matrices and one readout fit in ``budget``.

    Args:
        dims: ``(name, d)`` per tap, in the order they should be read (``d`` may be ``None`` only
            without a budget).
        budget: bytes (int, or a string like ``"2GiB"``); ``None``: one group holds them all.

    Raises:
        ValueError: the budget cannot hold the widest tap's matrix and its readout, or a width is unknown.

    Example:
        >>> plan = plan_memory([("a", 1024), ("b", 1024), ("c", 1024)], budget="72MiB")
        >>> plan.groups, plan.passes, format_bytes(plan.peak_bytes)
        ((('a', 'b'), ('c',)), 2, '64.0 MiB')
    """
    limit = None if budget is None else parse_bytes(budget)
    unknown = [name for name, d in dims if d is None]
    if limit is not None and unknown:
        raise ValueError(
            "Expected every width to be known to plan `memory_budget`, got none for "
            f"{unknown}. Pass memory_budget=None."
        )
    need = {name: matrix_bytes(d) + _readout_bytes(d) for name, d in dims}
    if limit is not None and need and max(need.values()) > limit:
        name, d = max(dims, key=lambda nd: need[nd[0]])
        raise ValueError(
            "Expected `memory_budget` to hold at least one covariance matrix and its readout, "
            f"got {format_bytes(limit)}:"
            f" {name!r} (d={d}) needs {format_bytes(need[name])} ({format_bytes(matrix_bytes(d))} for the matrix,"
            f" {format_bytes(_readout_bytes(d))} for its eigendecomposition). Raise `memory_budget` to at least that,"
            " or leave wide layers out with `max_dim=`, `layers=` or `blocks=`."
        )
    groups: list[list[tuple[str, int]]] = []
    for name, d in dims:
        trial = (groups[-1] if groups else []) + [(name, d)]
        if groups and (limit is None or _group_peak(trial) <= limit):
            groups[-1] = trial
        else:
            groups.append([(name, d)])
    peak = max((_group_peak(g) for g in groups), default=0)
    return MemoryPlan(tuple(tuple(n for n, _ in g) for g in groups), dict(dims), limit, peak)


def _group_peak(group: Sequence[tuple[str, int | None]]) -> int:
    return sum(matrix_bytes(d) for _, d in group) + _readout_bytes(max(d or 0 for _, d in group))
