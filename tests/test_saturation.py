"""Saturation counts against an independent float64 re-computation, in every dtype."""

import pytest
import torch

from satmon.functional.saturation import saturation_counts, saturation_threshold
from satmon.saturation import SaturationCounter


def reference(x: torch.Tensor, alpha: torch.Tensor, level: float) -> tuple[int, int]:
    x64, a64 = x.to(torch.float64), alpha.to(torch.float64)
    return int(((a64 * x64).abs() > level).sum()), int((~torch.isfinite(x64)).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("alpha", [0.37, 2.0, -1.3, 0.8001, 5.5])
@pytest.mark.parametrize("level", [2.0, 0.5, 3.0, 1.7])
def test_counts_equal_float64_reference(dtype, alpha, level):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 33, 64, generator=g) * 3).to(dtype)
    a = torch.tensor([alpha])
    assert saturation_counts(x, a, level)[0].item() == reference(x, a, level)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_boundary_elements_are_exact(dtype):
    """Elements within one ulp of the boundary: where naive ``alpha * x`` in the activation dtype rounds."""
    a = torch.tensor([0.7], dtype=torch.float32)
    t = (2.0 / a.double()).to(dtype)
    around = torch.cat([torch.nextafter(t, torch.zeros_like(t)), t, torch.nextafter(t, torch.full_like(t, 1e9))])
    x = torch.cat([around, -around]).reshape(-1).repeat(100)
    assert saturation_counts(x, a, 2.0)[0].item() == reference(x, a, 2.0)[0]


def test_randomised_boundary_sweep_float32():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        a = torch.rand(1, generator=g) * 4 + 0.01
        t = saturation_threshold(a, 2.0)
        x = t + (torch.randint(-3, 4, (1000,), generator=g).float() * torch.finfo(torch.float32).eps * t)
        assert saturation_counts(x, a, 2.0)[0].item() == reference(x, a, 2.0)[0]


def test_threshold_is_largest_float32_not_saturating():
    for a in [0.3, 0.7, 1.1, 2.0, 3.3]:
        alpha = torch.tensor([a])
        t = saturation_threshold(alpha, 2.0)
        assert float(alpha.double() * t.double()) <= 2.0
        up = torch.nextafter(t, torch.tensor([1e9]))
        assert float(alpha.double() * up.double()) > 2.0
        assert t.dtype == torch.float32 and t.dim() == 1


def test_nonfinite_counted_separately_never_raises():
    x = torch.tensor([1.0, float("inf"), -float("inf"), float("nan"), 0.1])
    sat, bad = saturation_counts(x, torch.tensor([1.0]), 2.0)
    ref_sat, ref_bad = reference(x, torch.tensor([1.0]), 2.0)
    assert sat.item() == ref_sat == 2 and ref_bad == 3 and bad.item() == 1  # a flag per input
    assert saturation_counts(torch.tensor([1.0, 3.0]), torch.tensor([1.0]), 2.0)[1].item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_input_is_never_modified(dtype):
    x = torch.randn(4, 8).to(dtype)
    before = x.clone()
    saturation_counts(x, torch.tensor([2.0]), 2.0)
    assert torch.equal(x, before)


def test_cached_threshold_follows_alpha_changes():
    from satmon import DyT
    from satmon.discovery import find_dyt_layers
    from satmon.saturation import SaturationHooks

    norm = DyT(64, alpha_init=2.0)
    layers = find_dyt_layers(torch.nn.Sequential(norm))
    hooks = SaturationHooks(layers, SaturationCounter(1)).attach()
    g = torch.Generator().manual_seed(4)
    expected = 0
    for alpha in (2.0, 2.0, 0.7, 3.1):
        with torch.no_grad():
            norm.alpha.fill_(alpha)  # in place, as an optimizer step: bumps the version counter
        x = torch.randn(8, 64, generator=g) * 2
        norm(x)
        expected += reference(x, torch.tensor([alpha]), 2.0)[0]
        assert hooks.counter.saturated.item() == expected


def test_zero_alpha_saturates_nothing():
    x = torch.randn(100) * 1e6
    assert saturation_counts(x, torch.tensor([0.0]), 2.0)[0].item() == 0


def test_per_channel_alpha():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 16, generator=g) * 3
    alpha = torch.rand(16, generator=g) * 2
    assert saturation_counts(x, alpha, 2.0)[0].item() == reference(x, alpha, 2.0)[0]


def test_counter_batched_equals_one_shot():
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(5, 7, 8, generator=g) * 2 for _ in range(4)]
    a = torch.tensor([1.3])
    batched, one = SaturationCounter(1), SaturationCounter(1)
    for x in xs:
        batched.update(0, x, a)
    one.update(0, torch.cat(xs), a)
    assert torch.equal(batched.saturated, one.saturated) and torch.equal(batched.total, one.total)
    out = batched.compute()
    assert out["pooled"].item() == pytest.approx(reference(torch.cat(xs), a, 2.0)[0] / torch.cat(xs).numel(), abs=0)


def test_counts_stay_on_device_dtype_int64():
    c = SaturationCounter(2)
    c.update(1, torch.randn(3, 4), torch.tensor([2.0]))
    assert c.saturated.dtype == torch.int64 and c.saturated[0].item() == 0 and c.total.tolist() == [0, 12]
