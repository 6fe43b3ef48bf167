"""Loss-spike test against a running robust baseline (median and MAD), pure math."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["robust_z", "loss_trend", "MAD_TO_SIGMA", "STALL_IMPROVEMENT"]

#: MAD of a normal distribution times this is its standard deviation.
MAD_TO_SIGMA = 1.4826


def robust_z(recent: Sequence[float], baseline: Sequence[float], rel_floor: float = 0.01) -> float:
    """How far the median of ``recent`` losses sits above the ``baseline`` median, in robust sigmas.

    ``z = (median(recent) - median(baseline)) / max(1.4826 * MAD(baseline), rel_floor * |median(baseline)|)``.
    The floor keeps a flat baseline (MAD ~ 0) from turning noise into spikes. Non-finite values
    must be handled by the caller (they are a breach of their own).

    Args:
        recent: losses since the last check.
        baseline: losses before them (the running baseline window).
        rel_floor: smallest scale, relative to the baseline median.

    Returns:
        The z-score; 0.0 when either list is empty.

    Example:
        >>> round(robust_z([9.0, 9.5], [2.0, 2.1, 1.9, 2.0, 2.05]), 1)
        97.8
        >>> robust_z([2.0], [2.0, 2.1, 1.9])
        0.0
    """
    if not recent or not baseline:
        return 0.0
    med = _median(baseline)
    mad = _median([abs(v - med) for v in baseline])
    scale = max(MAD_TO_SIGMA * mad, rel_floor * abs(med), 1e-12)
    return (_median(recent) - med) / scale


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        return math.nan
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


#: the share of the window's first-segment loss the last half must still gain for the loss to count as improving
STALL_IMPROVEMENT = 0.02


def loss_trend(segment_means: Sequence[float], stall_improvement: float = STALL_IMPROVEMENT) -> dict[str, float | bool]:
    """The training loss over a window, from the mean loss of equal segments of it (oldest first).

    ``first`` and ``last`` are the first and last segments' means; ``change`` is ``last / first - 1``;
    ``late_change`` is the relative change over the window's second half (mean of the middle segment
    to the last); the loss has ``stalled`` when the second half improved it by less than
    ``stall_improvement`` of the first segment's loss (a loss that fell and then sat flat).
    Segments without a finite mean are skipped.

    Example:
        >>> t = loss_trend([5.5, 4.0, 3.3, 3.25, 3.24, 3.24, 3.23, 3.23, 3.23, 3.22])
        >>> round(t["change"], 3), round(t["late_change"], 4), t["stalled"]
        (-0.415, -0.0062, True)
        >>> loss_trend([5.5, 4.0, 3.3, 3.0, 2.8, 2.7, 2.6, 2.5, 2.45, 2.4])["stalled"]
        False
    """
    values = [v for v in segment_means if math.isfinite(v)]
    if len(values) < 4:
        return {"first": math.nan, "last": math.nan, "change": math.nan, "late_change": math.nan, "stalled": False}
    first, last, mid = values[0], values[-1], values[len(values) // 2 - 1]
    gained = (mid - last) / abs(first) if first else 0.0
    return {
        "first": first,
        "last": last,
        "change": last / first - 1 if first else math.nan,
        "late_change": last / mid - 1 if mid else math.nan,
        "stalled": gained < stall_improvement,
    }
