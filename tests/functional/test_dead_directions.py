"""Dead-direction math against independent float64 references (numpy, svdvals, hand-built cases)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from satmon.functional.dead_directions import (
    INIT_GAP_FLOOR,
    Alignment,
    CovarianceAccumulator,
    alignment,
    classify_model_norm_type,
    classify_norm_type,
    degenerate_coordinates,
    gram_spectrum,
    init_gap,
    null_space,
    sigma_min,
    sigma_min_profile,
    v_star,
)
from third_party import LlamaRMSNorm

D, TOKENS = 64, 2000


def _layernorm(seed: int, gamma_edit=None, beta_edit=None) -> nn.LayerNorm:
    gen = torch.Generator().manual_seed(seed)
    ln = nn.LayerNorm(D)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.1 * torch.randn(D, generator=gen))
        ln.bias.copy_(torch.randn(D, generator=gen))
        if gamma_edit is not None:
            gamma_edit(ln.weight)
        if beta_edit is not None:
            beta_edit(ln.bias)
    return ln


def _tokens(seed: int, n: int = TOKENS) -> Tensor:
    gen = torch.Generator().manual_seed(1000 + seed)
    return 2 * torch.randn(n, D, generator=gen) + 0.5  # (N, D)


@torch.no_grad()
def _reading(module: nn.Module, x: Tensor) -> Alignment:
    y = module(x)
    return alignment(CovarianceAccumulator(D).update(y).covariance(), module.weight)


def _assert_finite(r: Alignment) -> None:
    for name, value in vars(r).items():
        assert math.isfinite(value), f"{name} = {value}"


# ----------------------------------------------------------------------------- accumulator


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(300, 7), (4, 75, 7)])
def test_accumulator_matches_numpy_and_batched_equals_one_shot(dtype, shape):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3 + 1).to(dtype)
    ref = x.to(torch.float64).reshape(-1, shape[-1]).numpy()
    one = CovarianceAccumulator(shape[-1]).update(x)
    batched = CovarianceAccumulator(shape[-1])
    for chunk in x.reshape(-1, shape[-1]).split(37):
        batched.update(chunk)
    for acc in (one, batched):
        assert acc.count == ref.shape[0] and acc.nonfinite_rows == 0
        np.testing.assert_allclose(acc.mean().numpy(), ref.mean(0), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(acc.covariance().numpy(), np.cov(ref.T, bias=True), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(acc.gram().numpy(), ref.T @ ref, rtol=1e-12)
        assert acc.covariance().dtype == torch.float64


def test_merge_and_state_round_trip_equal_single_accumulator():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(100, 5, generator=gen), torch.randn(60, 5, generator=gen) + 2
    single = CovarianceAccumulator(5).update(torch.cat([a, b]))
    merged = CovarianceAccumulator(5).update(a).merge(CovarianceAccumulator(5).update(b))
    # an all_reduce(SUM) of the state tensors, simulated by adding them
    states_a = CovarianceAccumulator(5).update(a).state_tensors()
    states_b = CovarianceAccumulator(5).update(b).state_tensors()
    summed = [x + y for x, y in zip(states_a, states_b)]
    reduced = CovarianceAccumulator.from_state(summed)
    for acc in (merged, reduced):
        assert acc.count == 160
        torch.testing.assert_close(acc.covariance(), single.covariance(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(acc.mean(), single.mean(), rtol=1e-12, atol=1e-14)


def test_nonfinite_rows_are_skipped_and_counted():
    gen = torch.Generator().manual_seed(2)
    clean = torch.randn(50, 4, generator=gen)
    dirty = torch.cat([clean[:20], torch.full((1, 4), float("nan")), clean[20:]])
    dirty = torch.cat([dirty, torch.tensor([[1.0, float("inf"), 0.0, 0.0], [0.0, 0.0, -float("inf"), 2.0]])])
    acc = CovarianceAccumulator(4).update(dirty)
    assert (acc.count, acc.nonfinite_rows) == (50, 3)
    ref = CovarianceAccumulator(4).update(clean)
    torch.testing.assert_close(acc.covariance(), ref.covariance(), rtol=0, atol=0)
    assert torch.isfinite(acc.covariance()).all()


def test_empty_accumulator_and_bad_input():
    acc = CovarianceAccumulator(3)
    assert acc.covariance().abs().sum() == 0 and acc.mean().abs().sum() == 0
    with pytest.raises(ValueError, match=r"Expected a \(\.\.\., 3\) tensor"):
        acc.update(torch.zeros(4, 5))
    with pytest.raises(ValueError, match="Expected an accumulator with dim 3"):
        acc.merge(CovarianceAccumulator(4))
    with pytest.raises(ValueError, match="Expected `dim` > 0"):
        CovarianceAccumulator(0)


# ----------------------------------------------------------------------------- v*


def test_v_star_matches_reference_and_handles_degenerate_gamma():
    g = torch.tensor([0.5, -2.0, 1.5, 3.0], dtype=torch.float64)
    ref = 1 / g.numpy()
    np.testing.assert_allclose(v_star(g).numpy(), ref / np.linalg.norm(ref), rtol=1e-14)

    tiny = torch.tensor([1.0, 1e-30, 2.0, -3e-30, 0.7])
    v = v_star(tiny)
    ref = np.array([0.0, 1 / 1e-30, 0.0, -1 / 3e-30, 0.0])  # the limit: 1/gamma on the tiny channels only
    np.testing.assert_allclose(v.numpy(), ref / np.linalg.norm(ref), rtol=1e-6, atol=1e-12)
    assert degenerate_coordinates(tiny).tolist() == [1, 3]

    zeros = torch.tensor([1.0, 0.0, 1e-30, 0.0, 2.0])  # exact zeros win over tiny entries
    np.testing.assert_allclose(v_star(zeros).numpy(), np.array([0, 1, 0, 1, 0]) / math.sqrt(2), rtol=1e-15)

    subnormal = torch.tensor([1e-310, 2e-310, 1.0], dtype=torch.float64)  # 1/gamma overflows naively
    v = v_star(subnormal)
    assert torch.isfinite(v).all() and abs(float(v.norm()) - 1) < 1e-15
    np.testing.assert_allclose(v.numpy(), np.array([2, 1, 0]) / math.sqrt(5), rtol=1e-12)

    assert torch.allclose(v_star(torch.zeros(4)), torch.full((4,), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="Expected a finite weight"):
        v_star(torch.tensor([1.0, float("nan")]))


# ----------------------------------------------------------------------------- spectrum


def test_null_space_matches_hand_built_spectrum():
    gen = torch.Generator().manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    lam = torch.tensor([0.0, 0.0, 1e-14, 1.0, 2.0, 3.0], dtype=torch.float64)
    cov = q @ torch.diag(lam) @ q.T
    ns = null_space(cov)
    assert ns.dim == 3
    np.testing.assert_allclose(ns.eigenvalues.numpy(), np.linalg.eigvalsh(cov.numpy()), atol=1e-14)
    projector, expected = ns.basis @ ns.basis.T, q[:, :3] @ q[:, :3].T
    torch.testing.assert_close(projector, expected, rtol=0, atol=1e-12)
    assert null_space(cov, rtol=1e-16).dim <= 2  # a tighter tolerance drops the 1e-14 direction
    assert null_space(torch.zeros(4, 4)).dim == 4
    with pytest.raises(ValueError, match="Expected a finite covariance"):
        null_space(torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]]))
    with pytest.raises(ValueError, match=r"Expected a square \(d, d\) covariance"):
        null_space(torch.zeros(3, 4))


def test_alignment_hand_built_kernel_and_zero_covariance():
    gamma = torch.tensor([1.0, 2.0, -0.5, 4.0, 1.0])
    v = v_star(gamma)
    cov = torch.eye(5, dtype=torch.float64) - torch.outer(v, v)  # kernel exactly v*, other eigenvalues 1
    r = alignment(cov, gamma)
    assert r.null_dim == 1 and r.cosine > 1 - 1e-12 and r.null_projection > 1 - 1e-12
    assert r.depth < 1e-15 and r.depth_diag < 1e-15 and r.lambda_min_rel < 1e-15
    assert classify_norm_type(r) == "layernorm-like"

    zero = alignment(torch.zeros(5, 5), gamma)
    assert zero == Alignment(1.0, 1.0, 5, 0.0, 0.0, 0.0, 5, 0)
    assert classify_norm_type(zero) == "undetermined"
    with pytest.raises(ValueError, match=r"Expected a weight of shape \(5,\)"):
        alignment(cov, torch.ones(4))


def test_layernorm_random_init_has_exact_kernel_along_v_star():
    r = _reading(_layernorm(0), _tokens(0))
    _assert_finite(r)
    assert r.cosine >= 0.9999
    assert r.null_dim == 1 and r.null_projection >= 0.9999
    assert r.depth < 1e-12 and r.depth_diag < 1e-12
    assert classify_norm_type(r) == "layernorm-like"


@pytest.mark.parametrize("seed", range(5))
def test_third_party_rmsnorm_has_no_kernel(seed):
    rms = LlamaRMSNorm(D)
    with torch.no_grad():
        rms.weight.copy_(1 + 0.1 * torch.randn(D, generator=torch.Generator().manual_seed(seed)))
    r = _reading(rms, _tokens(seed))
    _assert_finite(r)
    assert r.null_dim == 0 and r.null_projection == 0.0
    assert r.depth_diag > 0.1
    assert classify_norm_type(r) == "rmsnorm-like"


def test_rmsnorm_with_one_tiny_weight_is_not_mistaken_for_layernorm():
    rms = LlamaRMSNorm(D)
    with torch.no_grad():
        rms.weight[7] = 2e-5  # not degenerate, but pulls v* onto channel 7
    r = _reading(rms, _tokens(0))
    assert r.n_degenerate == 0
    assert r.cosine > 0.99 and r.depth < 1e-7  # cosine and mean-eigenvalue depth alone would be fooled ...
    assert r.depth_diag > 0.1  # ... the per-channel-normalised one does not
    assert classify_norm_type(r) == "rmsnorm-like"


def _set_zero(w: Tensor) -> None:
    w[[3, 17, 40]] = 0.0


def _set_tiny(w: Tensor) -> None:
    w[[3, 17, 40]] = torch.tensor([1e-30, -2e-30, 5e-31])


def _zero_beta(b: Tensor) -> None:
    b[[3, 17, 40]] = 0.0


@pytest.mark.parametrize(
    ("gamma_edit", "beta_edit"),
    [(_set_zero, None), (_set_tiny, None), (_set_tiny, _zero_beta)],
    ids=["zeros", "1e-30", "1e-30-zero-beta"],
)
def test_layernorm_with_dead_gamma_channels(gamma_edit, beta_edit):
    # Output channels with gamma_i = 0 are constant, so each e_i is a kernel vector. The mean-subtraction
    # kernel needs sum_i v_i gamma_i xhat_i constant, i.e. v_i gamma_i = c for all i; dead channels force
    # c = 0, so the kernel is exactly span(e_i : dead) (dim 3) and v* (the limit of gamma^-1) lies in it.
    r = _reading(_layernorm(1, gamma_edit, beta_edit), _tokens(1))
    _assert_finite(r)
    assert r.null_dim == 3 and r.n_degenerate == 3
    assert r.null_projection > 1 - 1e-9
    assert r.depth < 1e-12
    assert classify_norm_type(r) == "undetermined"  # dead channels are a kernel for any norm type


def test_model_level_classification():
    ln = _reading(_layernorm(0), _tokens(0))
    rms = _reading(LlamaRMSNorm(D), _tokens(0))
    dead = _reading(_layernorm(1, _set_zero), _tokens(1))
    assert classify_model_norm_type([ln, ln, dead]) == "layernorm-like"
    assert classify_model_norm_type([rms, rms, rms]) == "rmsnorm-like"
    assert classify_model_norm_type([ln, dead, dead]) == "undetermined"
    assert classify_model_norm_type([ln, ln, rms]) == "undetermined"
    with pytest.raises(ValueError, match="Expected at least one layer reading"):
        classify_model_norm_type([])


# ----------------------------------------------------------------------------- init gap


def test_init_gap_formula_and_floor():
    init = Alignment(1.0, 1.0, 1, depth=1e-3, depth_diag=1e-3, lambda_min_rel=1e-2, dim=8, n_degenerate=0)
    trained = Alignment(1.0, 1.0, 1, depth=1e-6, depth_diag=1e-6, lambda_min_rel=1e-4, dim=8, n_degenerate=0)
    kernel = Alignment(1.0, 1.0, 1, depth=0.0, depth_diag=0.0, lambda_min_rel=3e-15, dim=8, n_degenerate=0)
    gaps = init_gap([trained, kernel], [init, kernel])
    assert gaps[0].depth_deepening == pytest.approx(3.0) and gaps[0].lambda_min_deepening == pytest.approx(2.0)
    assert gaps[1].depth_deepening == 0.0 and gaps[1].lambda_min_deepening == 0.0  # both floored
    floored = init_gap(kernel, init)[0]
    assert floored.depth_deepening == pytest.approx(math.log10(1e-3 / INIT_GAP_FLOOR))
    with pytest.raises(ValueError, match="Expected as many init readings"):
        init_gap([trained], [init, init])


# ----------------------------------------------------------------------------- sigma_min


@pytest.mark.parametrize(("tokens", "d", "seed"), [(50, 8, 0), (200, 16, 1), (33, 32, 2)])
def test_sigma_min_matches_svdvals(tokens, d, seed):
    x = torch.randn(tokens, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ref = float(torch.linalg.svdvals(x).min())
    assert sigma_min(x) == pytest.approx(ref, rel=1e-9)
    acc = CovarianceAccumulator(d)
    for chunk in x.split(7):
        acc.update(chunk)
    assert sigma_min(acc) == pytest.approx(ref, rel=1e-9)


def test_sigma_min_profile_anti_aligned_block_drops_ratio():
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(400, 16, generator=gen)
    a = torch.randn(16, 16, generator=gen)
    x_psd = x0 + x0 @ (a @ a.T / 16)  # sum_i x_i f_i = x^T A x >= 0: cannot shrink sigma_min
    x_anti = x_psd - 0.9 * x_psd  # f = -0.9 x anti-aligns with the stream
    p = sigma_min_profile([x0, x_psd, x_anti])
    assert p.valid and p.reason == ""
    assert p.ratios[0] == 1.0 and p.ratios[1] >= 1.0
    assert p.ratios[2] < 1.0
    assert p.ratios[2] == pytest.approx(0.1 * p.ratios[1], rel=1e-5)


def test_sigma_min_profile_too_few_tokens_is_flagged_not_nan():
    x = torch.randn(10, 16, generator=torch.Generator().manual_seed(5))
    assert sigma_min(x) == 0.0
    p = sigma_min_profile([x, 2 * x])
    assert not p.valid and "fewer finite tokens than channels" in p.reason
    assert p.values == [0.0, 0.0] and p.ratios == [0.0, 0.0]
    singular = torch.zeros(40, 4)
    p = sigma_min_profile([singular, torch.randn(40, 4)])
    assert not p.valid and "numerically singular" in p.reason
    assert all(math.isfinite(r) for r in p.ratios + p.values)


def test_gram_spectrum_matches_eigvalsh_and_profiles_read_from_spectra_equal_those_from_matrices():
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(300, 16, generator=g, dtype=torch.float64) * (1 + i) for i in range(3)]
    for x in xs:
        s = gram_spectrum(x)
        ev = np.linalg.eigvalsh((x.T @ x).numpy())
        assert s.tokens == 300 and s.dim == 16
        assert s.lambda_min == pytest.approx(ev[0], rel=1e-10) and s.lambda_max == pytest.approx(ev[-1], rel=1e-10)
    accs = [CovarianceAccumulator(16).update(x) for x in xs]
    assert sigma_min_profile([gram_spectrum(a) for a in accs]) == sigma_min_profile(accs) == sigma_min_profile(xs)
