"""The trap's arithmetic against float64 and by hand: a gradient is zero only when every element is, in any
input dtype; the reach is the float64 ratio of norms; the decision needs all four facts at once."""

from __future__ import annotations

import math

import pytest
import torch

from satmon.functional.trap import grad_square, offset_share, reach_ratio, trap_found


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_tiny_gradient_is_not_read_as_zero(dtype):
    tiny = torch.finfo(dtype).smallest_normal
    g = torch.zeros(1000, dtype=dtype)
    g[17] = tiny
    assert (g.square().sum() == 0).item()  # squared in its own dtype it vanishes: the reason for float64
    assert grad_square(g).item() == pytest.approx(float(tiny) ** 2, rel=1e-12)
    assert grad_square(torch.zeros(5, dtype=dtype)).item() == 0.0


def test_reach_is_the_float64_ratio_of_norms():
    g = torch.Generator().manual_seed(0)
    below, head = torch.randn(50, generator=g), torch.randn(30, generator=g)
    want = math.sqrt(sum(v * v for v in below.double().tolist()) / sum(v * v for v in head.double().tolist()))
    got = reach_ratio(grad_square(below), grad_square(head)).item()
    assert got == pytest.approx(want, rel=1e-13)
    assert math.isnan(
        reach_ratio(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)).item()
    )


def test_the_decision_needs_a_dyt_final_norm_saturated_by_an_offset_and_a_dead_gradient():
    assert trap_found(True, 1.0, 0.0, 0.0)
    assert not trap_found(True, 1.0, 0.0, 1e-30)  # tiny, not zero
    assert trap_found(True, 1.0, 0.0, 1e-30, floor=1e-6)  # a floor of the user's
    assert not trap_found(True, 0.49, 0.0, 0.0)  # not saturated enough
    assert not trap_found(True, 1.0, 0.3, 0.0)  # 30% left once channel means are removed: not an offset's
    assert not trap_found(False, 1.0, 0.0, 0.0) and not trap_found(None, 1.0, 0.0, 0.0)
    assert offset_share(1.0, 0.25) == 0.75 and offset_share(0.0, 0.0) is None
