"""The one-sided exact binomial test: against hand-counted tails and a float recount."""

from __future__ import annotations

import itertools
import math

import pytest

from satmon.functional.significance import ALPHA, beats, binomial_tail, correct_of


def _tail_by_enumeration(k: int, n: int, rate: float) -> float:
    """P(X >= k) by listing every outcome sequence (independent of the closed form)."""
    total = 0.0
    for seq in itertools.product((0, 1), repeat=n):
        s = sum(seq)
        if s >= k:
            total += rate**s * (1 - rate) ** (n - s)
    return total


@pytest.mark.parametrize(("k", "n", "rate"), [(9, 12, 8 / 12), (5, 6, 0.5), (3, 3, 0.5), (0, 4, 0.3), (7, 10, 0.6)])
def test_tail_matches_enumeration(k, n, rate):
    assert binomial_tail(k, n, rate) == pytest.approx(_tail_by_enumeration(k, n, rate), rel=1e-12)


def test_hand_counted_cases():
    # 9/12 against the 8/12 of guessing: p = P(X >= 9 | 12, 2/3) = 0.393, one cell above is no forecast
    assert binomial_tail(9, 12, 2 / 3) == pytest.approx(
        sum(math.comb(12, i) * (2 / 3) ** i * (1 / 3) ** (12 - i) for i in range(9, 13))
    )
    assert not beats(9, 12, 8 / 12)
    # 12/12 against 6/12: p = 2^-12
    assert binomial_tail(12, 12, 0.5) == 2.0**-12 and beats(12, 12, 0.5)
    # all of n agreeing beats a coin from n = 5 (1/32 < 0.05), not at n = 4 (1/16)
    assert [beats(n, n, 0.5) for n in range(1, 7)] == [False, False, False, False, True, True]
    # at or below the rate never beats it, whatever n
    assert not beats(60, 100, 0.6) and not beats(0, 0, 0.5) and ALPHA == 0.05


def test_bad_input_says_what_was_expected():
    with pytest.raises(ValueError, match="Expected the successes k"):
        binomial_tail(5, 4, 0.5)
    with pytest.raises(ValueError, match="Expected a rate in"):
        beats(1, 2, 1.5)
    with pytest.raises(ValueError, match="Expected the number of cells"):
        correct_of(0.5, 0)
    assert correct_of(0.8333333, 6) == 5
