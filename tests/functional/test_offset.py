"""satmon.functional.offset against a float64 numpy re-computation."""

import numpy as np
import pytest
import torch

from satmon.functional.offset import OffsetSums, offset_summary, offset_sums


def reference(x: torch.Tensor, alpha: torch.Tensor, level: float, channel_dim: int = -1) -> dict:
    """Per-batch offset statistics in numpy float64, written from the definitions."""
    xn = np.moveaxis(x.to(torch.float64).numpy(), channel_dim, -1)
    xn = xn.reshape(-1, xn.shape[-1])  # (tokens, C)
    a = np.abs(alpha.to(torch.float64).numpy()).reshape(-1)  # (C,) or (1,)
    m, s = xn.mean(axis=0), xn.std(axis=0)  # population std over the batch's tokens
    sat = np.abs(a * xn) > level
    return {
        "total": xn.size,
        "saturated": int(sat.sum()),
        "centered_saturated": int((np.abs(a * (xn - m)) > level).sum()),
        "offset_channel_saturated": int(sat[:, np.abs(a * m) > level].sum()),
        "abs_mean": np.abs(m),
        "spread": s,
    }


def check(sums: OffsetSums, ref: dict) -> None:
    for name in ("total", "saturated", "centered_saturated", "offset_channel_saturated"):
        value = getattr(sums, name)
        assert value.dtype == torch.int64 and value.dim() == 0 and int(value) == ref[name], name
    for name in ("abs_mean", "spread"):
        value = getattr(sums, name)
        assert value.dtype == torch.float64
        np.testing.assert_allclose(value.numpy(), ref[name], rtol=1e-12, atol=1e-300)


def offset_batch(g: torch.Generator, shape=(4, 32, 24), offset: float = 0.0, spread: float = 1.0) -> torch.Tensor:
    """Tokens with a per-channel constant of size ``offset`` (random sign) and token variation ``spread``."""
    c = shape[-1]
    const = offset * (torch.randint(0, 2, (c,), generator=g) * 2 - 1) * (0.5 + torch.rand(c, generator=g))
    return const + spread * torch.randn(shape, generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_sums_equal_float64_reference(dtype, per_channel):
    g = torch.Generator().manual_seed(0)
    x = offset_batch(g, offset=2.0, spread=1.5).to(dtype)
    alpha = torch.rand(24, generator=g) + 0.5 if per_channel else torch.tensor([1.3])
    check(offset_sums(x, alpha, 2.0), reference(x, alpha, 2.0))


@pytest.mark.parametrize("alpha_shape", [(16, 1, 1), (1, 16, 1, 1), (1,)])
def test_channels_first(alpha_shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, 5, 6, generator=g) * 2 + torch.linspace(-4, 4, 16).view(16, 1, 1)
    alpha = torch.rand(alpha_shape, generator=g) + 0.5
    check(offset_sums(x, alpha, 2.0, channel_dim=1), reference(x, alpha, 2.0, channel_dim=1))


def test_batches_add_and_the_summary_equals_the_pooled_reference():
    g = torch.Generator().manual_seed(2)
    alpha = torch.tensor([0.9])
    xs = [offset_batch(g, offset=o, spread=s) for o, s in ((3.0, 0.5), (0.0, 3.0), (2.5, 1.0))]
    total = offset_sums(xs[0], alpha) + offset_sums(xs[1], alpha) + offset_sums(xs[2], alpha)
    refs = [reference(x, alpha, 2.0) for x in xs]
    check(total, {k: sum(r[k] for r in refs) for k in refs[0]})
    out = offset_summary(total)
    n, sat = sum(r["total"] for r in refs), sum(r["saturated"] for r in refs)
    assert out.saturated_fraction.item() == pytest.approx(sat / n, rel=1e-15)
    assert out.centered_fraction.item() == pytest.approx(sum(r["centered_saturated"] for r in refs) / n, rel=1e-15)
    assert out.offset_channel_share.item() == pytest.approx(
        sum(r["offset_channel_saturated"] for r in refs) / sat, rel=1e-15
    )
    ratio = sum(r["abs_mean"] for r in refs) / sum(r["spread"] for r in refs)
    assert out.offset_ratio_median.item() == pytest.approx(float(np.median(ratio)), rel=1e-12)


def test_stacked_layers_read_as_each_layer_alone():
    g = torch.Generator().manual_seed(3)
    per_layer = [offset_sums(offset_batch(g, offset=o, spread=1.0), torch.tensor([1.1])) for o in (0.0, 4.0, 20.0)]
    stacked = OffsetSums(*(torch.stack(v) for v in zip(*per_layer)))  # (L,) counts, (L, C) sums: a per-layer state
    out = offset_summary(stacked)
    for i, sums in enumerate(per_layer):
        alone = offset_summary(sums)
        for name in out._fields:
            assert getattr(out, name)[i].item() == getattr(alone, name).item(), name


def test_offset_driven_and_token_driven_saturation_read_apart():
    """A channel constant with little token variation (the stalled run) against zero-mean tokens with a wide
    spread: similar saturation, opposite readings."""
    g = torch.Generator().manual_seed(4)
    alpha = torch.tensor([0.5])
    stalled = offset_summary(offset_sums(offset_batch(g, offset=8.0, spread=0.25), alpha))
    healthy = offset_summary(offset_sums(offset_batch(g, offset=0.0, spread=8.0), alpha))
    assert stalled.saturated_fraction.item() > 0.6 and healthy.saturated_fraction.item() > 0.6
    assert stalled.centered_fraction.item() < 0.01 < 0.5 < healthy.centered_fraction.item()
    assert stalled.offset_ratio_median.item() > 10 > 1 > healthy.offset_ratio_median.item()


def test_degenerate_channels():
    x = torch.zeros(6, 3)
    x[:, 1] = 5.0  # an offset without spread
    x[:, 2] = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    s = offset_sums(x, torch.tensor([1.0]))
    out = offset_summary(s)
    assert s.spread.tolist() == [0.0, 0.0, 1.0] and out.offset_ratio_median.item() == 0.0  # ratios 0, inf, 0
    assert out.offset_channel_share.item() == 1.0 and out.centered_fraction.item() == 0.0
    nothing = offset_summary(offset_sums(torch.zeros(4, 2), torch.tensor([1.0])))
    assert nothing.offset_channel_share.item() == 0.0 and nothing.saturated_fraction.item() == 0.0
    assert offset_summary(
        offset_sums(torch.full((4, 1), 3.0), torch.tensor([1.0]))
    ).offset_ratio_median.item() == float("inf")


def test_alpha_must_be_per_channel_along_the_channel_dimension():
    x = torch.randn(2, 8, 4, 4)
    with pytest.raises(ValueError, match="Expected alpha to be a scalar or per-channel along dimension -1"):
        offset_sums(x, torch.ones(8))  # (C,) multiplies the last dimension (4), not the channels
    with pytest.raises(ValueError, match="Pass channel_dim"):
        offset_sums(x, torch.ones(8, 4, 1), channel_dim=1)
    check(offset_sums(x, torch.ones(8, 1, 1), channel_dim=1), reference(x, torch.ones(8), 2.0, channel_dim=1))


def test_input_is_not_modified_and_no_grad_is_recorded():
    x = (torch.randn(4, 8) * 3).requires_grad_()
    before = x.detach().clone()
    s = offset_sums(x, torch.tensor([1.0], requires_grad=True))
    assert torch.equal(x.detach(), before) and not any(v.requires_grad for v in s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_saturated_count_on_the_level_boundary_equals_the_float64_product(dtype):
    """The float32/bf16/fp16 path counts |alpha * x| > level with a per-channel threshold on |x|: inputs a few
    ulps either side of level / alpha must split exactly as the float64 product splits them."""
    alpha = torch.tensor([0.7001, 1.3, 2.9, 0.4])
    boundary = (2.0 / alpha.double()).to(dtype)  # (C,)
    bits = boundary.view(torch.int16 if dtype != torch.float32 else torch.int32)
    steps = torch.arange(-3, 4, dtype=bits.dtype).reshape(-1, 1)
    near = (bits.reshape(1, -1) + steps).view(dtype)  # (7, C): each channel around its own boundary
    x = torch.cat([near, -near, torch.randn(50, 4, generator=torch.Generator().manual_seed(3)).to(dtype) * 3])
    check(offset_sums(x, alpha, 2.0), reference(x, alpha, 2.0))
