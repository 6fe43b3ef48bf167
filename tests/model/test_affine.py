"""effective_affine: a norm layer's gain and bias read from what it computes, against hand-known answers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from satmon.model.affine import effective_affine
from third_party import GemmaStyleRMSNorm, LlamaRMSNorm, SkewedLayerNorm

D = 12


def _randomised(norm: nn.Module, seed: int = 0) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return norm


def _reference_output(
    kind: str, gain: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, eps: float
) -> torch.Tensor:
    """The textbook formula in float64, written independently of satmon."""
    x = x.double()
    if kind == "layernorm":
        x_hat = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    else:
        x_hat = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return gain * x_hat + (0 if bias is None else bias)


@pytest.mark.parametrize(
    ("make", "kind", "gain", "bias", "note"),
    [
        (lambda: nn.LayerNorm(D), "layernorm", lambda m: m.weight, lambda m: m.bias, "gain = weight, bias"),
        (lambda: nn.LayerNorm(D, bias=False), "layernorm", lambda m: m.weight, lambda m: None, "gain = weight"),
        (
            lambda: nn.LayerNorm(D, elementwise_affine=False),
            "layernorm",
            lambda m: torch.ones(D),
            lambda m: None,
            "gain = 1 (no weight)",
        ),
        (lambda: nn.RMSNorm(D), "rmsnorm", lambda m: m.weight, lambda m: None, "gain = weight"),
        (
            lambda: nn.RMSNorm(D, elementwise_affine=False),
            "rmsnorm",
            lambda m: torch.ones(D),
            lambda m: None,
            "gain = 1 (no weight)",
        ),
        (lambda: LlamaRMSNorm(D), "rmsnorm", lambda m: m.weight, lambda m: None, "gain = weight"),
        (lambda: GemmaStyleRMSNorm(D), "rmsnorm", lambda m: 1 + m.weight, lambda m: None, "gain = 1 + weight"),
    ],
    ids=[
        "layernorm",
        "layernorm-no-bias",
        "layernorm-no-affine",
        "torch-rmsnorm",
        "torch-rmsnorm-no-affine",
        "hf-llama",
        "gemma",
    ],
)
@pytest.mark.parametrize("trained", [False, True])
def test_known_layers_give_their_exact_affine_map(make, kind, gain, bias, note, trained):
    norm = _randomised(make()) if trained else make()
    a = effective_affine(norm)
    want_gain = gain(norm).detach().double()
    want_bias = bias(norm)
    assert a.kind == kind and a.exact and a.note.startswith(note.split(",")[0])
    assert torch.equal(a.gain, want_gain) and a.gain.dtype == torch.float64
    if want_bias is None or not bool(want_bias.ne(0).any()):
        assert a.bias is None
    else:
        assert torch.equal(a.bias, want_bias.detach().double())
    # the map it returns reproduces the layer on fresh inputs (float32 layer vs float64 formula)
    x = 3 * torch.randn(64, D, generator=torch.Generator().manual_seed(5)) + 1.0
    eps = float(getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", 0.0) or 0.0)
    torch.testing.assert_close(norm(x).double(), _reference_output(kind, a.gain, a.bias, x, eps), rtol=1e-5, atol=1e-5)


def test_gemma_gain_is_one_at_init_not_the_zero_weight():
    a = effective_affine(GemmaStyleRMSNorm(D))
    assert torch.equal(a.gain, torch.ones(D, dtype=torch.float64)) and a.note == "gain = 1 + weight"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dtype_of_the_layer_does_not_matter_and_state_is_untouched(dtype):
    norm = _randomised(nn.LayerNorm(D)).to(dtype)
    hook_calls = []
    norm.register_forward_hook(lambda *a: hook_calls.append(1))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    norm.train()
    a = effective_affine(norm)
    assert torch.equal(a.gain, norm.weight.detach().double()) and torch.equal(a.bias, norm.bias.detach().double())
    assert all(torch.equal(before[k], v) and v.dtype == dtype for k, v in norm.state_dict().items())
    assert hook_calls == [] and norm.training and norm.weight.requires_grad  # no hook ran, nothing switched


def test_an_attribute_that_does_not_reproduce_the_output_is_not_trusted():
    class HalfGain(nn.Module):  # reads like a LayerNorm, multiplies by weight / 2
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.full((D,), 3.0))

        def forward(self, x):
            return nn.functional.layer_norm(x, (D,)) * self.weight / 2

    a = effective_affine(HalfGain())
    assert a.kind == "layernorm" and not a.exact and a.note.startswith("fitted")
    torch.testing.assert_close(a.gain, torch.full((D,), 1.5, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_undetermined_layers_are_refused_with_the_class_and_what_to_do():
    with pytest.raises(
        ValueError, match=r"Expected SkewedLayerNorm to compute gain \* normalize\(x\) \+ bias.*exclude it"
    ):
        effective_affine(SkewedLayerNorm(D))
    with pytest.raises(
        ValueError, match=r"Expected Identity to have a vector parameter or `normalized_shape`.*Pass `dim=`"
    ):
        effective_affine(nn.Identity())
    with pytest.raises(ValueError, match=r"Expected Identity to compute gain"):
        effective_affine(nn.Identity(), dim=D)  # runs, but does not normalise
    with pytest.raises(ValueError, match="one channel dimension"):
        effective_affine(nn.LayerNorm([3, 4]))
