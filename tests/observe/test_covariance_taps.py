"""satmon.observe.covariance: what a tap accumulates and why it skips, against a float64 reference."""

from __future__ import annotations

import torch
from torch import nn

from satmon.observe.covariance import CovarianceTap, CovarianceTaps, TapTarget


class Block(nn.Module):
    """A block called with Hugging Face's keyword ``hidden_states=`` and returning a tuple."""

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, None]:
        return (2 * hidden_states, None)


def test_output_and_keyword_input_taps_accumulate_the_exact_gram_matrix():
    block = Block()
    taps = CovarianceTaps(
        [TapTarget("in", block, "input", None, 16), TapTarget("out", block, "output", None, 16)]
    ).attach()
    xs = [torch.randn(3, 5, 4) for _ in range(2)]
    for x in xs:
        block(hidden_states=x)
    taps.detach()
    block(hidden_states=xs[0])  # detached: not counted
    rows = torch.cat(xs).reshape(-1, 4).double()
    assert torch.equal(taps.taps["in"].ready().gram(), taps.taps["in"].acc.outer) and taps.taps["in"].acc.count == 30
    assert torch.allclose(taps.taps["in"].acc.gram(), rows.T @ rows, rtol=1e-12)
    assert torch.allclose(taps.taps["out"].acc.gram(), 4 * rows.T @ rows, rtol=1e-12)


def test_disabled_taps_skip_calls():
    ln = nn.LayerNorm(4)
    taps = CovarianceTaps([TapTarget("ln", ln, "output", 4, 8)]).attach()
    taps.enabled = False
    ln(torch.randn(2, 4))
    taps.detach()
    assert taps.taps["ln"].ready() is None and "not called" in taps.taps["ln"].skipped


def test_skip_reasons():
    cases = [
        (CovarianceTap(8, dim=4), [torch.ones(2, 5)], "its output has 5 channels last, its weight 4"),
        (CovarianceTap(4, limit_note="the memory plan's d"), [torch.ones(2, 5)], "d=5 > the memory plan's d=4"),
        (CovarianceTap(8), [torch.ones(2, 4), torch.ones(2, 3)], "width changed between calls (4 -> 3)"),
        (CovarianceTap(8), [torch.ones(2, 4, dtype=torch.long)], "no floating-point tensor output"),
        (CovarianceTap(8), [], "not called during the forward passes (or only non-finite rows)"),
    ]
    for tap, calls, why in cases:
        for x in calls:
            tap.add(x)
        assert tap.ready() is None and tap.skipped == why


def test_release_frees_the_accumulator():
    tap = CovarianceTap(8)
    tap.add(torch.ones(3, 4))
    assert tap.ready().count == 3
    tap.release()
    assert tap.acc is None
