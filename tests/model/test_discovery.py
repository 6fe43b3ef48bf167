"""Layer discovery on satmon's, third-party and hand-built models; the DyT module."""

import pytest
import torch
from torch import nn

from satmon import DyT, find_blocks, find_dyt_layers, find_norm_layers
from satmon.demos.gpt import GPT, GPTConfig
from satmon.model.discovery import modules_by_name, norm_kind, strip_wrappers
from third_party import DynamicTanh, LlamaRMSNorm, ScaledThing, SquashBlock, SquashNorm, UserLM


class HFLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(d)
        self.self_attn = nn.Linear(d, d)
        self.post_attention_layernorm = LlamaRMSNorm(d)
        self.mlp = nn.Linear(d, d)


class HFModel(nn.Module):
    def __init__(self, d=8, n=3):
        super().__init__()
        self.embed_tokens = nn.Embedding(10, d)
        self.layers = nn.ModuleList([HFLayer(d) for _ in range(n)])
        self.norm = LlamaRMSNorm(d)


def test_finds_satmon_and_third_party_dyt_but_not_alpha_scalers():
    model = nn.Sequential(DyT(4), DynamicTanh(4, True), ScaledThing(), nn.LayerNorm(4))
    assert [l.name for l in find_dyt_layers(model)] == ["0", "1"]
    kinds = {l.name: l.kind for l in find_norm_layers(model)}
    assert kinds == {"0": "dyt", "1": "dyt", "3": "layernorm"}


def test_dyt_is_found_by_behaviour_however_tanh_is_spelled():
    model = UserLM(SquashBlock, n_layers=2, norm=SquashNorm)  # nn.Tanh() submodule, no "tanh"/"DyT" in any name
    found = find_dyt_layers(model)
    assert [l.name for l in found] == ["stack.0.pre", "stack.0.post", "stack.1.pre", "stack.1.post", "out_norm"]
    assert all(l.kind == "dyt" for l in found)
    # channels-first official DyT, a per-channel affine that is not ones, and alpha = 0 are DyT all the same
    cf = DynamicTanh(6, channels_last=False)
    with torch.no_grad():
        cf.weight.normal_(), cf.bias.normal_(), cf.alpha.zero_()
    assert norm_kind(cf) == "dyt"


def test_alpha_owners_that_are_not_tanh_bounded_are_not_dyt():
    class TanhThenScale(nn.Module):  # tanh in forward's source, but alpha scales the output, not the input
        def __init__(self):
            super().__init__()
            self.alpha = nn.Parameter(torch.full((1,), 2.0))

        def forward(self, x):
            return self.alpha * torch.tanh(x)

    class DyTNamedBlock(nn.Module):  # owns alpha and holds a parametrised submodule: a block, not a DyT
        def __init__(self):
            super().__init__()
            self.alpha, self.inner = nn.Parameter(torch.ones(1)), nn.Linear(4, 4)

        def forward(self, x):
            return torch.tanh(self.alpha * self.inner(x))

    assert [norm_kind(m) for m in (ScaledThing(), TanhThenScale(), DyTNamedBlock())] == [None, None, None]


def test_modules_by_name_strips_every_wrapper():
    inner = nn.Sequential(nn.Linear(2, 2))
    fsdp = nn.Module()
    fsdp._fsdp_wrapped_module = nn.Module()
    fsdp._fsdp_wrapped_module._checkpoint_wrapped_module = inner
    ddp = nn.Module()
    ddp.module = fsdp  # DistributedDataParallel's attribute
    names = modules_by_name(ddp)
    assert names[""] is inner and names["0"] is inner[0] and set(names) == {"", "0"}
    assert strip_wrappers("module._orig_mod._forward_module.blocks.0") == "blocks.0"
    assert strip_wrappers("blocks.module.x") == "blocks.module.x"  # only DDP's leading "module." is a wrapper


def test_include_exclude_by_regex_and_predicate():
    model = nn.Sequential(DyT(4), DyT(4), ScaledThing())
    assert [l.name for l in find_dyt_layers(model, exclude=r"^1$")] == ["0"]
    # include= cannot make a module that owns alpha but computes alpha * x (no tanh) a DyT: left out, with a warning
    with pytest.warns(UserWarning, match=r"include= selects '2' \(ScaledThing\)"):
        assert [l.name for l in find_dyt_layers(model, include=lambda n, m: isinstance(m, ScaledThing))] == ["0", "1"]
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


def test_channels_first_dyt_with_every_parameter_shaped_c11_is_found():
    # a ConvNeXt-style DyT: alpha, weight and bias all (C, 1, 1), applied to (B, C, H, W)
    class ConvDyT(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.alpha = nn.Parameter(torch.full((c, 1, 1), 0.5))
            self.weight = nn.Parameter(torch.ones(c, 1, 1))
            self.bias = nn.Parameter(torch.zeros(c, 1, 1))

        def forward(self, x):
            return self.weight * torch.tanh(self.alpha * x) + self.bias

    model = nn.Sequential(nn.Conv2d(3, 6, 1), ConvDyT(6))
    assert [(l.name, l.kind) for l in find_norm_layers(model)] == [("1", "dyt")]


def test_the_finders_0_3_path_in_discovery_warns_and_gives_the_maps_finders():
    from satmon._compat import SatmonDeprecationWarning
    from satmon.model import discovery
    from satmon.model import map as model_map_module

    for name in ("find_norm_layers", "find_dyt_layers", "find_blocks"):
        with pytest.warns(
            SatmonDeprecationWarning,
            match=rf"discovery\.{name} is deprecated since satmon 0\.4: use "
            rf"satmon\.model\.map\.{name} .*until satmon 0\.6",
        ):
            assert getattr(discovery, name) is getattr(model_map_module, name)
    with pytest.raises(AttributeError, match="has no attribute 'find_everything'"):
        discovery.find_everything  # noqa: B018
