"""When a count of successes beats a rate by more than chance: the one-sided exact binomial test.

satmon calls a rule "a forecast" only when its held-out record beats the trivial rate (guessing the
commoner outcome) by this test, and :func:`satmon.forecast` gives a confident outcome only when the
known cells that agree are too many to be a coin's luck. Both use :func:`beats`:

    p = P(X >= k),  X ~ Binomial(n, rate)        beats  <=>  p < alpha  (alpha = 0.05 by default)

computed exactly in rationals (:class:`fractions.Fraction`: no rounding at any ``n``). Nothing here
touches tensors, files or modules.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["ALPHA", "beats", "binomial_tail", "correct_of"]

#: The significance level of every test satmon makes on a record of cells (one-sided).
ALPHA = 0.05


def _check(k: int, n: int, rate: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"Expected the number of cells n as an integer >= 0, got {n!r}.")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise ValueError(f"Expected the successes k as an integer in [0, n={n}], got {k!r}.")
    if isinstance(rate, bool) or not isinstance(rate, (int, float, Fraction)) or not 0.0 <= float(rate) <= 1.0:
        raise ValueError(f"Expected a rate in [0, 1], got {rate!r}.")


def binomial_tail(k: int, n: int, rate: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, rate)``: the one-sided p-value of ``k`` successes in ``n`` tries.

    Args:
        k: successes (cells right, cells that agree).
        n: tries (cells).
        rate: the chance of a success under the null (the trivial rate; 1/2 for a coin).

    Example:
        >>> binomial_tail(5, 5, 0.5), binomial_tail(4, 4, 0.5)
        (0.03125, 0.0625)
        >>> round(binomial_tail(9, 12, 8 / 12), 3), round(binomial_tail(12, 12, 0.5), 6)
        (0.393, 0.000244)
    """
    _check(k, n, rate)
    p = Fraction(rate).limit_denominator(10**9) if isinstance(rate, float) else Fraction(rate)
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def beats(k: int, n: int, rate: float, alpha: float = ALPHA) -> bool:
    """Whether ``k`` successes of ``n`` beat ``rate`` by the one-sided exact binomial test (``P(X >= k) < alpha``).

    No cells (``n == 0``) beat nothing. A record at or below the rate never beats it.

    Example:
        >>> beats(9, 12, 8 / 12), beats(12, 12, 0.5), beats(5, 5, 0.5), beats(4, 4, 0.5), beats(0, 0, 0.5)
        (False, True, True, False, False)
    """
    _check(k, n, rate)
    if n == 0 or k <= rate * n:
        return False
    return binomial_tail(k, n, rate) < alpha


def correct_of(accuracy: float, n: int) -> int:
    """The cells right of ``n`` that an ``accuracy`` stands for (the nearest whole count).

    Raises:
        ValueError: ``n`` not a positive integer, or an accuracy outside [0, 1].

    Example:
        >>> correct_of(0.75, 12), correct_of(2 / 3, 12)
        (9, 8)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"Expected the number of cells n as an integer > 0, got {n!r}.")
    if not (isinstance(accuracy, (int, float)) and 0.0 <= accuracy <= 1.0):
        raise ValueError(f"Expected an accuracy in [0, 1], got {accuracy!r}.")
    return int(round(accuracy * n))
