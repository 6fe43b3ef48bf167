"""Layer discovery on satmon's, third-party and hand-built models; DyT and convert_to_dyt."""

import pytest
import torch
from torch import nn

from satmon import DyT, convert_to_dyt, find_blocks, find_dyt_layers, find_norm_layers
from satmon.convert import norm_position
from satmon.demos.gpt import GPT, GPTConfig


class DynamicTanh(nn.Module):  # the official repo's class, written out: not satmon's
    def __init__(self, normalized_shape, channels_last, alpha_init_value=0.5):
        super().__init__()
        self.channels_last = channels_last
        self.alpha = nn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        x = torch.tanh(self.alpha * x)
        if self.channels_last:
            return x * self.weight + self.bias
        return x * self.weight[:, None, None] + self.bias[:, None, None]


class ScaledThing(nn.Module):  # owns `alpha` but is not tanh-bounded: must not be taken for DyT
    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.alpha * x


class MyRMSNorm(nn.Module):  # a third-party RMSNorm (as Hugging Face's LlamaRMSNorm)
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


class HFLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input_layernorm = MyRMSNorm(d)
        self.self_attn = nn.Linear(d, d)
        self.post_attention_layernorm = MyRMSNorm(d)
        self.mlp = nn.Linear(d, d)


class HFModel(nn.Module):
    def __init__(self, d=8, n=3):
        super().__init__()
        self.embed_tokens = nn.Embedding(10, d)
        self.layers = nn.ModuleList([HFLayer(d) for _ in range(n)])
        self.norm = MyRMSNorm(d)


def test_finds_satmon_and_third_party_dyt_but_not_alpha_scalers():
    model = nn.Sequential(DyT(4), DynamicTanh(4, True), ScaledThing(), nn.LayerNorm(4))
    assert [l.name for l in find_dyt_layers(model)] == ["0", "1"]
    kinds = {l.name: l.kind for l in find_norm_layers(model)}
    assert kinds == {"0": "dyt", "1": "dyt", "3": "layernorm"}


def test_include_exclude_by_regex_and_predicate():
    model = nn.Sequential(DyT(4), DyT(4), ScaledThing())
    assert [l.name for l in find_dyt_layers(model, exclude=r"^1$")] == ["0"]
    assert [l.name for l in find_dyt_layers(model, include=lambda n, m: isinstance(m, ScaledThing))] == ["0", "1", "2"]
    with pytest.raises(TypeError, match="Expected `include`"):
        find_dyt_layers(model, include=3)


def test_third_party_rmsnorm_and_hf_blocks():
    model = HFModel()
    kinds = {l.name: l.kind for l in find_norm_layers(model)}
    assert kinds["layers.0.input_layernorm"] == "rmsnorm" and kinds["norm"] == "rmsnorm" and len(kinds) == 7
    assert [n for n, _ in find_blocks(model)] == ["layers.0", "layers.1", "layers.2"]
    with pytest.raises(ValueError, match="Expected block names"):
        find_blocks(model, names=["nope"])


def test_compiled_and_wrapped_names_are_stripped():
    model = GPT(GPTConfig(n_layers=1))
    compiled = torch.compile(model, backend="eager")
    assert [l.name for l in find_dyt_layers(compiled)] == [l.name for l in find_dyt_layers(model)]


@pytest.mark.parametrize("channels_last", [True, False])
def test_dyt_forward_matches_formula(channels_last):
    torch.manual_seed(0)
    norm = DyT(6, alpha_init=0.7, channels_last=channels_last)
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    x = torch.randn(2, 6, 3, 5) if not channels_last else torch.randn(2, 5, 6)
    y = norm(x)
    if channels_last:
        ref = norm.weight * torch.tanh(0.7 * x) + norm.bias
    else:
        ref = norm.weight[:, None, None] * torch.tanh(0.7 * x) + norm.bias[:, None, None]
    torch.testing.assert_close(y, ref)
    assert DyT(6, bias=False).bias is None
    with pytest.raises(ValueError, match="Expected `normalized_shape`"):
        DyT((3, 4))


def test_convert_positions_and_copy_affine():
    model = GPT(GPTConfig(norm="layernorm", n_layers=2))
    with torch.no_grad():
        model.blocks[0].ln_1.weight.fill_(3.0)
    pos = norm_position(model)
    assert pos == {"blocks.0.ln_1": "attn", "blocks.0.ln_2": "mlp", "blocks.1.ln_1": "attn", "blocks.1.ln_2": "mlp", "ln_f": "final"}
    convert_to_dyt(model, alpha_init=2.0, alpha_init_attn=0.8, alpha_init_mlp=0.2, alpha_init_final=0.3, copy_affine=True)
    assert isinstance(model.blocks[0].ln_1, DyT) and not find_norm_layers(model, kinds=("layernorm",))
    assert float(model.blocks[1].ln_1.alpha) == pytest.approx(0.8)
    assert float(model.blocks[1].ln_2.alpha) == pytest.approx(0.2)
    assert float(model.ln_f.alpha) == pytest.approx(0.3)
    assert torch.all(model.blocks[0].ln_1.weight == 3.0)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 256)


def test_convert_rmsnorm_on_request_only():
    model = HFModel()
    convert_to_dyt(model)
    assert not find_dyt_layers(model)
    convert_to_dyt(model, rmsnorm=True, alpha_init=0.5)
    dyts = find_dyt_layers(model)
    assert len(dyts) == 7 and all(l.module.bias is None for l in dyts)  # RMSNorm had no bias


def test_convert_rejects_multi_dim_layernorm():
    with pytest.raises(ValueError, match="one channel dimension"):
        convert_to_dyt(nn.Sequential(nn.LayerNorm([4, 4])))


@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_gpt_emb_scale_multiplies_the_embeddings_the_first_block_sees(scale):
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2, seq_len=8, emb_scale=scale))
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    idx = torch.tensor([[3, 1, 4, 1, 5]])
    model(idx)
    ref = (model.tok_emb.weight[idx[0]] + model.pos_emb.weight[:5]).detach() * scale
    torch.testing.assert_close(seen[0][0], ref)
    assert GPTConfig().emb_scale == 1.0  # GPT-2's: the demo model is unchanged
