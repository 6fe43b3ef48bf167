"""The forecast's domain: where a run lies against the configurations that bear on it, and the exact interval.

A run gets a confident answer only inside what was measured: inside the convex hull of the bearing configurations in
(log10 parameters, log10 unique tokens per parameter), up to :data:`HULL_TOLERANCE`, and within
:data:`NEAREST_LIMIT` of the nearest of them (the hull of a few far-apart configurations holds wide regions where no
cell is: a run there is "uncertain").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from satmon.functional.significance import binomial_tail

__all__ = [
    "HULL_TOLERANCE",
    "NEAREST_LIMIT",
    "UNKNOWN_SCHEDULE",
    "WARMUP_TOLERANCE",
    "clopper_pearson",
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
