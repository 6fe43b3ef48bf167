"""The forecast's domain: where a run lies against the configurations that bear on it, and the exact interval.

A run gets a confident answer only inside what was measured: inside the convex hull of the bearing configurations in
(log10 parameters, log10 unique tokens per parameter), up to :data:`HULL_TOLERANCE`, and within
:data:`NEAREST_LIMIT` of the nearest of them (the hull of a few far-apart configurations holds wide regions where no
cell is: a run there is "uncertain").

What the cells recorded of DyT itself bounds it too. **alpha_init** (:func:`alpha_differs`): a cell records one
initial alpha or a range over its layers (``alpha_init`` to ``alpha_init_max``: LLaMA-style models init the norm
before attention and the one before the MLP differently); the run's range (lowest, highest) must lie inside one
interval of the union of the cells' ranges, each widened by a factor :data:`ALPHA_TOLERANCE` either way (a run between
two cells' inits lies where none was measured); a cell that did not record it bars a confident answer. **The final
norm** (:func:`final_norm_differs`), the DyT arm's norm before the head (``dyt`` or ``norm``, LayerNorm or RMSNorm):
where any bearing cell records it, the run's must be known and equal to every recorded one; cells that do not record
it do not bar a confident answer on their own (the study's cells do not say whether the study's final norm was DyT).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from satmon.functional.significance import binomial_tail
from satmon.results.forecast.cells import BUDGET_TOLERANCE, KnownCell

__all__ = [
    "ALPHA_TOLERANCE",
    "HULL_TOLERANCE",
    "NEAREST_LIMIT",
    "UNKNOWN_SCHEDULE",
    "WARMUP_TOLERANCE",
    "alpha_differs",
    "alpha_reach",
    "clopper_pearson",
    "final_norm_differs",
    "hull",
    "hull_distance",
]

#: A run may lie at most this far (decades, Euclidean in log10 parameters and log10 unique tokens per parameter) from
#: the nearest configuration that bears on it: half a decade, about the widest step between neighbouring measured
#: sizes at one budget (the study's 354M and 1.3B lie 0.57 decades apart): a run farther from every cell than the
#: cells are from each other lies where nothing was measured, even inside their hull.
NEAREST_LIMIT = 0.5

#: The run's point may lie this far (in decades of log10 parameters and log10 unique tokens per parameter) outside the
#: convex hull of its supporting configurations: the grain of the measurement (the study's "64M" is a label), no more.
HULL_TOLERANCE = 0.1
#: A run's warm-up share (warm-up steps over steps) may differ this much from the supporting cells' range.
WARMUP_TOLERANCE = 0.05
#: The learning-rate shape of a run whose scheduler could not be read.
UNKNOWN_SCHEDULE = "unknown"
#: A run's DyT alpha_init may lie this factor beyond the cells' ranges (the budget's tolerance, 1.1).
ALPHA_TOLERANCE = BUDGET_TOLERANCE
_FINAL_WORDS = {"dyt": "DyT", "norm": "LayerNorm or RMSNorm"}


def _span(r: tuple[float, float], fmt: str = "g") -> str:
    return f"{r[0]:{fmt}}" if r[0] == r[1] else f"{r[0]:{fmt}}-{r[1]:{fmt}}"


def alpha_reach(ranges: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``ranges`` (each ``(lowest, highest)``), each widened by :data:`ALPHA_TOLERANCE` either way, as
    disjoint intervals in increasing order.

    Example:
        >>> [(round(a, 3), round(b, 3)) for a, b in alpha_reach([(2.0, 2.0), (0.2, 0.8), (0.5, 0.5)])]
        [(0.182, 0.88), (1.818, 2.2)]
    """
    out: list[tuple[float, float]] = []
    for lo, hi in sorted((lo / ALPHA_TOLERANCE, hi * ALPHA_TOLERANCE) for lo, hi in ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def alpha_differs(cells: Sequence[KnownCell], run: tuple[float, float] | None) -> str | None:
    """Why the run's DyT alpha_init (``(lowest, highest)`` over its layers; ``None``: not known) is outside what
    ``cells`` recorded (:func:`alpha_reach` of their ranges: inside one of its intervals), or ``None`` when inside.

    Example:
        >>> cells = [KnownCell("a", 1e5, 2.0, 0.1, "g", "m", alpha_init=2.0),
        ...          KnownCell("b", 1e5, 2.0, 0.1, "h", "m", alpha_init=0.2, alpha_init_max=0.8)]
        >>> alpha_differs(cells, (0.2, 0.8)) is None, alpha_differs(cells, (2.1, 2.1)) is None
        (True, True)
        >>> print(alpha_differs(cells, (0.8, 2.0)))  # between the two cells' inits: nothing measured there
        its DyT alpha_init is 0.8-2, theirs 0.2-0.8 and 2 (each within a factor 1.1: 0.182-0.88, 1.82-2.2)
    """
    missing = sum(c.alpha_range is None for c in cells)
    if missing:
        return f"{missing} of the cells did not record DyT's alpha_init"
    ranges = sorted({c.alpha_range for c in cells})  # type: ignore[type-var]
    theirs = ", ".join(_span(r) for r in ranges[:-1]) + (" and " if len(ranges) > 1 else "") + _span(ranges[-1])
    if run is None:
        return f"its DyT alpha_init is not given (alpha_init=; theirs {theirs})"
    reach = alpha_reach(ranges)  # type: ignore[arg-type]
    if any(lo <= run[0] and run[1] <= hi for lo, hi in reach):
        return None
    within = ", ".join(_span(r, ".3g") for r in reach)
    return f"its DyT alpha_init is {_span(run)}, theirs {theirs} (each within a factor {ALPHA_TOLERANCE:g}: {within})"


def final_norm_differs(cells: Sequence[KnownCell], run: str | None) -> str | None:
    """Why the run's final norm (``"dyt"``, ``"norm"``; ``None``: not known) differs from the one ``cells`` recorded,
    or ``None`` where it equals every recorded one or no cell recorded one.

    Example:
        >>> cells = [KnownCell("a", 1e5, 2.0, 0.1, "g", "m", final_norm="dyt"), KnownCell("b", 1e5, 2.0, 0.1, "h", "m")]
        >>> final_norm_differs(cells, "dyt") is None, final_norm_differs(cells[1:], None) is None
        (True, True)
        >>> print(final_norm_differs(cells, "norm"))
        its final norm is LayerNorm or RMSNorm (final_norm='norm'), theirs DyT in 1 of the 2 cells
    """
    recorded = [c.final_norm for c in cells if c.final_norm is not None]
    kinds = sorted(set(recorded))  # type: ignore[type-var]
    if not kinds or kinds == [run]:
        return None
    theirs = " and ".join(f"{_FINAL_WORDS[k]} in {recorded.count(k)}" for k in kinds) + f" of the {len(cells)} cells"
    if run is None:
        return (
            "its final norm (the norm before the head) is not known (final_norm='dyt' for DyT, 'norm' for LayerNorm "
            "or RMSNorm; a Screen reads it from the model's forward, Settings(final_norm=) where it cannot: a "
            f"compiled model), theirs {theirs}"
        )
    return f"its final norm is {_FINAL_WORDS[run]} (final_norm={run!r}), theirs {theirs}"


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def hull(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The convex hull of ``points``, counter-clockwise (Andrew's monotone chain; 1 or 2 points when degenerate).

    Example:
        >>> hull([(0, 0), (1, 0), (0, 1), (1, 1), (0.5, 0.5)])
        [(0, 0), (1, 0), (1, 1), (0, 1)]
    """
    pts = sorted(set(points))
    if len(pts) <= 2:
        return pts
    lower: list[tuple[float, float]] = []
    upper: list[tuple[float, float]] = []
    for chain, seq in ((lower, pts), (upper, pts[::-1])):
        for q in seq:
            while len(chain) >= 2 and _cross(chain[-2], chain[-1], q) <= 0:
                chain.pop()
            chain.append(q)
    return lower[:-1] + upper[:-1]


def _segment_distance(q: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    dx, dy = b[0] - a[0], b[1] - a[1]
    t = 0.0 if dx == dy == 0 else max(0.0, min(1.0, ((q[0] - a[0]) * dx + (q[1] - a[1]) * dy) / (dx * dx + dy * dy)))
    return math.hypot(q[0] - a[0] - t * dx, q[1] - a[1] - t * dy)


def hull_distance(q: tuple[float, float], points: Sequence[tuple[float, float]]) -> float:
    """How far ``q`` lies outside the convex hull of ``points`` (0 inside or on it; ``inf`` with no points).

    Example:
        >>> square = [(0, 0), (1, 0), (0, 1), (1, 1)]
        >>> hull_distance((0.5, 0.5), square), hull_distance((2, 0.5), square)
        (0.0, 1.0)
    """
    h = hull(points)
    if not h:
        return math.inf
    if len(h) >= 3 and all(_cross(h[i], h[(i + 1) % len(h)], q) >= 0 for i in range(len(h))):
        return 0.0
    edges = [(h[i], h[(i + 1) % len(h)]) for i in range(len(h))] if len(h) > 1 else [(h[0], h[0])]
    return min(_segment_distance(q, a, b) for a, b in edges)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``level`` interval of a rate seen as ``k`` of ``n``, by
    bisection on the binomial tail.

    Example:
        >>> [round(x, 3) for x in clopper_pearson(14, 15)]
        [0.681, 0.998]
    """
    a = (1 - level) / 2

    def solve(f: Any) -> float:  # f increasing in the rate, f(r) = a
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < a else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda r: binomial_tail(k, n, r))  # P(X >= k | r) = a
    high = 1.0 if k == n else solve(lambda r: binomial_tail(k + 1, n, r) - (1 - a) + a)  # P(X <= k | r) = a
    return low, high
