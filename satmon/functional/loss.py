"""Loss-spike test against a running robust baseline (median and MAD), pure math."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["robust_z", "MAD_TO_SIGMA"]

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
