"""The probe's memory plan as a result: which ``d x d`` float64 matrices each pass over the calibration
batches holds, and how many bytes that is.

:func:`satmon.probing.memory_plan.plan_memory` makes the plan; a
:class:`~satmon.results.probe_report.ProbeReport` keeps it (``report.plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from satmon.results.frozen import freeze

__all__ = ["UPDATE_BYTES_PER_VALUE", "MemoryPlan", "format_bytes", "matrix_bytes"]

#: Transient bytes per activation value while one batch is added (float64 copy, masked copy, mask).
UPDATE_BYTES_PER_VALUE = 20


def format_bytes(n: float) -> str:
    """Binary units, three significant digits.

    Example:
        >>> format_bytes(512 * 2**20), format_bytes(1536)
        ('512 MiB', '1.50 KiB')
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"
    return f"{int(n)} B"


def matrix_bytes(d: int | None) -> int:
    """One accumulator's state: ``X^T X`` ``(d, d)`` and the row sum ``(d,)`` in float64, two int64 counts
    (0 for an unknown width).

    Example:
        >>> matrix_bytes(1024) == 8 * 1024 * 1024 + 8 * 1024 + 16, matrix_bytes(None)
        (True, 0)
    """
    return 8 * d * d + 8 * d + 16 if d else 0


@dataclass(frozen=True)
class MemoryPlan:
    """Which covariance matrices each pass over the calibration batches holds.

    Attributes:
        groups: tap names per pass; empty when nothing needs a matrix (then one pass runs).
        dims: tap name -> its width ``d`` (``None``: unknown before the forward, not counted; only without a
            budget), read-only.
        budget: the budget in bytes (``None``: no budget, one pass holds every matrix).
        peak_bytes: the most the probe holds at once: a group's matrices plus one readout.

    Example:
        >>> plan = MemoryPlan((("a", "b"), ("c",)), {"a": 64, "b": 64, "c": 64}, None, 0)
        >>> plan.matrices, plan.passes
        (3, 2)
    """

    groups: tuple[tuple[str, ...], ...]
    dims: Mapping[str, int | None]
    budget: int | None
    peak_bytes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", freeze(self.groups))
        object.__setattr__(self, "dims", freeze(self.dims))

    @property
    def matrices(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def passes(self) -> int:
        return max(1, len(self.groups))

    def describe(self) -> str:
        """The plan in one line, e.g. for the console before the run."""
        widths = sorted({d for d in self.dims.values() if d is not None})
        sizes = [", ".join(f"d={d}: {format_bytes(matrix_bytes(d))}" for d in widths) + " each"] if widths else []
        unknown = sum(d is None for d in self.dims.values())
        sizes += [f"{unknown} of unknown width, not counted"] if unknown else []
        budget = "no budget" if self.budget is None else f"budget {format_bytes(self.budget)}"
        most = max((len(g) for g in self.groups), default=0)
        return (
            f"satmon probe plan: {self.matrices} covariance matrices ({'; '.join(sizes) or 'none'}) in "
            f"{self.passes} pass(es) of <= {most},"
            f" peak {format_bytes(self.peak_bytes)} ({budget}); plus {UPDATE_BYTES_PER_VALUE} B x rows "
            "x d while a batch is added"
        )
