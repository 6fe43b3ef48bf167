"""convert_to_dyt: positions, alpha overrides, and copy_affine copying the norm's effective gain and bias."""

import pytest
import torch
from torch import nn

from satmon import DyT, convert_to_dyt, find_dyt_layers, find_norm_layers
from satmon.convert import norm_position
from satmon.demos.gpt import GPT, GPTConfig
from third_party import GemmaStyleRMSNorm, LlamaRMSNorm, OddGatedBlock, SkewedLayerNorm, UserLM


class HFModel(nn.Module):  # Hugging Face's layout: 3 layers of two RMSNorms, a final one
    def __init__(self, d=8, n=3):
        super().__init__()
        self.embed_tokens = nn.Embedding(10, d)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "input_layernorm": LlamaRMSNorm(d),
                    "self_attn": nn.Linear(d, d),
                    "post_attention_layernorm": LlamaRMSNorm(d),
                    "mlp": nn.Linear(d, d),
                }
            )
            for _ in range(n)
        )
        self.norm = LlamaRMSNorm(d)


def test_convert_positions_and_copy_affine():
    model = GPT(GPTConfig(norm="layernorm", n_layers=2))
    with torch.no_grad():
        model.blocks[0].ln_1.weight.fill_(3.0)
        model.blocks[0].ln_1.bias.fill_(-0.5)
    pos = norm_position(model)
    assert pos == {
        "blocks.0.ln_1": "attn",
        "blocks.0.ln_2": "mlp",
        "blocks.1.ln_1": "attn",
        "blocks.1.ln_2": "mlp",
        "ln_f": "final",
    }
    convert_to_dyt(
        model, alpha_init=2.0, alpha_init_attn=0.8, alpha_init_mlp=0.2, alpha_init_final=0.3, copy_affine=True
    )
    assert isinstance(model.blocks[0].ln_1, DyT) and not find_norm_layers(model, kinds=("layernorm",))
    assert float(model.blocks[1].ln_1.alpha.detach()) == pytest.approx(0.8)
    assert float(model.blocks[1].ln_2.alpha.detach()) == pytest.approx(0.2)
    assert float(model.ln_f.alpha.detach()) == pytest.approx(0.3)
    assert torch.all(model.blocks[0].ln_1.weight == 3.0) and torch.all(model.blocks[0].ln_1.bias == -0.5)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 256)


def test_convert_rmsnorm_on_request_only():
    model = HFModel()
    with pytest.warns(UserWarning, match=r"converted nothing: the model holds 7 RMSNorm .*Pass rmsnorm=True"):
        convert_to_dyt(model)
    assert not find_dyt_layers(model)
    convert_to_dyt(model, rmsnorm=True, alpha_init=0.5)
    dyts = find_dyt_layers(model)
    assert len(dyts) == 7 and all(l.module.bias is None for l in dyts)  # RMSNorm had no bias


def test_copy_affine_takes_gemma_gain_one_plus_weight_not_the_zero_weight():
    torch.manual_seed(0)
    model = UserLM(OddGatedBlock, norm=GemmaStyleRMSNorm)  # out_norm is Gemma-style; block norms are LayerNorm
    with torch.no_grad():
        model.out_norm.weight.normal_(0, 0.1)
    want = (1 + model.out_norm.weight.detach()).clone()
    convert_to_dyt(model, rmsnorm=True, copy_affine=True, alpha_init=1.0)
    assert isinstance(model.out_norm, DyT) and model.out_norm.bias is None
    torch.testing.assert_close(model.out_norm.weight.detach(), want, rtol=0, atol=0)
    # at Gemma's init (weight = 0) the converted model still computes something: logits vary with the input
    fresh = UserLM(OddGatedBlock, norm=GemmaStyleRMSNorm)
    convert_to_dyt(fresh, rmsnorm=True, copy_affine=True)
    assert torch.all(fresh.out_norm.weight == 1.0)
    logits = fresh(torch.arange(16).reshape(2, 8))
    assert logits.std(dim=-1).min() > 1e-3


def test_a_layer_named_like_a_norm_that_computes_no_norm_is_left_with_a_warning():
    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), SkewedLayerNorm(8))
    with pytest.warns(
        UserWarning, match=r"left as they are: 2 \(SkewedLayerNorm is named like a normaliser but.*computes neither"
    ):
        convert_to_dyt(model, rmsnorm=True, copy_affine=True, position_fn=lambda n, m: "final")
    assert isinstance(model[0], DyT) and isinstance(model[2], SkewedLayerNorm)


def test_copy_affine_refuses_a_layer_whose_gain_cannot_be_read_and_leaves_the_model_untouched():
    class Meta(nn.LayerNorm):  # a LayerNorm, known by what it computes, whose tensors live on the meta device now
        def __init__(self, d):  # a buffer: meta holds no value of it, and a copy of the layer needs one
            super().__init__(d)
            self.register_buffer("steps", torch.zeros(()))

    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), Meta(8))
    from satmon.model.map import model_map

    assert model_map(model).layer("2").kind == "layernorm"
    model[2].to_empty(device="meta")
    with pytest.raises(
        ValueError, match=r"cannot read the gain/bias of 2 \(Meta\).*Convert without copy_affine, or exclude"
    ):
        convert_to_dyt(model, rmsnorm=True, copy_affine=True, position_fn=lambda n, m: "final")
    assert isinstance(model[0], nn.LayerNorm)  # nothing converted before the refusal


def test_bias_false_drops_a_nonzero_bias_with_a_warning():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with torch.no_grad():
        model[1].bias.fill_(0.25)
    with pytest.warns(UserWarning, match="adds a non-zero bias that bias=False drops"):
        convert_to_dyt(model, copy_affine=True, bias=False)
    assert model[1].bias is None


def test_compiled_model_converts_under_the_stripped_names():
    model = GPT(GPTConfig(norm="layernorm", n_layers=1))
    wrapper = nn.Module()
    wrapper._orig_mod = model  # what torch.compile registers
    convert_to_dyt(wrapper, alpha_init=2.0)
    assert [l.name for l in find_dyt_layers(wrapper)] == ["blocks.0.ln_1", "blocks.0.ln_2", "ln_f"]
    assert isinstance(model.ln_f, DyT)


def test_a_layernorm_over_several_dimensions_is_left_as_it_is_with_a_warning():
    model = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 16), nn.Unflatten(-1, (4, 4)), nn.LayerNorm([4, 4]))
    with pytest.warns(UserWarning, match=r"left as they are: 3 \(no known width \(normalized_shape=\(4, 4\)\)"):
        convert_to_dyt(model)
    assert isinstance(model[0], DyT) and type(model[3]) is nn.LayerNorm
    assert model(torch.randn(2, 4)).shape == (2, 4, 4)  # the model still runs


def test_exclude_keeps_a_layer_as_it_is():
    model = GPT(GPTConfig(norm="layernorm", n_layers=1))
    convert_to_dyt(model, exclude=r"^ln_f$")
    assert isinstance(model.ln_f, nn.LayerNorm) and [l.name for l in find_dyt_layers(model)] == [
        "blocks.0.ln_1",
        "blocks.0.ln_2",
    ]
