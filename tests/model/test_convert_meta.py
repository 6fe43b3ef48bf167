"""convert_to_dyt gives the same model on the meta device as on the CPU (issue 38.1).

``satmon replay --factory`` builds the model under ``torch.device("meta")`` before any weight is read; a
factory that converts there (``convert_to_dyt(LlamaForCausalLM(cfg), rmsnorm=True)``) must give the model
the checkpoint was saved from. For every model family the suite builds (the model matrix's Hugging Face
families, the modern ones, the demos, the hand-written norms), built and converted on the CPU and on meta:
the same normalisers read (name, kind, function, channels, axis), the same layers converted (with the same
DyT layout), the same ``state_dict`` keys, shapes and dtypes, and the same warnings.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from lookalikes import (
    ConvNet,
    GammaBetaLN,
    MeanOverChannels,
    PermuteLayerNorm,
    PreNormBlock,
    RMSNormG,
    ScaleNorm,
    Stack,
)
from modern import LM, GatedRMSNorm, PerHeadRMSNorm, PreNorm, SSMBlock, SwiGLU
from torch import nn

from satmon import DyT, convert_to_dyt, find_norm_layers
from satmon.demos.gpt import GPT, GPTConfig
from satmon.demos.llama import LlamaConfig as DemoLlamaConfig
from satmon.demos.llama import LlamaLM
from satmon.model.affine import effective_affine
from third_party import GemmaStyleRMSNorm, LlamaRMSNorm, OddGatedBlock, SkewedLayerNorm, UserLM

transformers = pytest.importorskip("transformers")

from test_model_matrix import FAMILIES  # noqa: E402  (the model matrix's families: built from configs)
from test_modern_hf import _build as _build_modern  # noqa: E402

BUILDS: dict[str, Callable[[], nn.Module]] = {
    **{f"hf-{name}": family.build for name, family in FAMILIES.items()},
    **{f"hf-{name}": (lambda name=name: _build_modern(name)) for name in ("gpt-oss", "mamba2", "stablelm-parallel")},
    "demo-gpt-layernorm": lambda: GPT(GPTConfig(norm="layernorm", n_layers=2)),
    "demo-gpt-rmsnorm": lambda: GPT(GPTConfig(norm="rmsnorm", n_layers=2)),
    "demo-gpt-dyt": lambda: GPT(GPTConfig(n_layers=2)),
    "demo-llama-rmsnorm": lambda: LlamaLM(DemoLlamaConfig(norm="rmsnorm", n_layers=2)),
    "demo-llama-dyt": lambda: LlamaLM(DemoLlamaConfig(n_layers=2)),
    "gemma-style-1-plus-weight": lambda: UserLM(OddGatedBlock, norm=GemmaStyleRMSNorm),
    "llama-rmsnorm-hand-written": lambda: UserLM(OddGatedBlock, norm=LlamaRMSNorm),
    "skewed-layernorm": lambda: UserLM(OddGatedBlock, norm=SkewedLayerNorm),
    "channels-first-permute": lambda: ConvNet(norm=PermuteLayerNorm),
    "channels-first-mean-over-c": lambda: ConvNet(norm=MeanOverChannels),
    "gains-named-g-scale-gamma": lambda: Stack(lambda: PreNormBlock(RMSNormG), norm=GammaBetaLN),
    "scale-norm": lambda: Stack(lambda: PreNormBlock(ScaleNorm), norm=ScaleNorm),
    "per-head-qk-norm": lambda: LM(lambda: PreNorm(PerHeadRMSNorm, SwiGLU(), qk="head")),
    "gated-norm": lambda: LM(SSMBlock, norm=nn.RMSNorm),
    "gated-rmsnorm-module": lambda: LM(lambda: PreNorm(nn.RMSNorm, SwiGLU()), norm=GatedRMSNorm),
}


def _build(name: str, device: str) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings(), torch.device(device):
        warnings.simplefilter("ignore")
        try:
            return BUILDS[name]()
        except Exception as err:  # a transformers version without this family or config field
            if name.startswith("hf-"):
                pytest.skip(f"transformers {transformers.__version__} cannot build {name}: {type(err).__name__}: {err}")
            raise


def _read(model: nn.Module) -> list[tuple]:
    return [(l.name, l.kind, l.function, l.channels, l.axis, l.gain_shape) for l in find_norm_layers(model)]


def _converted(name: str, device: str, copy_affine: bool) -> tuple[list[tuple], dict, dict, list[str]]:
    """Built and converted inside ``torch.device(device)``, as a factory is run by the replay."""
    model = _build(name, device)
    read = _read(model)
    before = {id(m) for m in model.modules() if isinstance(m, DyT)}
    with warnings.catch_warnings(record=True) as caught, torch.device(device):
        warnings.simplefilter("always")
        convert_to_dyt(model, alpha_init=1.5, rmsnorm=True, copy_affine=copy_affine)
    converted = {
        n: (m.normalized_shape, m.channels_last, m.bias is not None, m.weight.dtype)
        for n, m in model.named_modules()
        if isinstance(m, DyT) and id(m) not in before
    }
    state = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    assert {v.device.type for v in model.state_dict().values()} <= {device}
    return read, converted, state, sorted(str(w.message) for w in caught)


@pytest.mark.parametrize("name", BUILDS)
def test_conversion_on_meta_equals_conversion_on_cpu(name):
    read, converted, state, said = _converted(name, "cpu", copy_affine=False)
    on_meta = _converted(name, "meta", copy_affine=False)
    assert on_meta[0] == read  # the same normalisers, read the same way
    assert on_meta[1] == converted  # the same layers converted, as the same DyT
    assert on_meta[2] == state  # the checkpoint's keys fit the meta model
    assert on_meta[3] == said  # and the same warnings (what was left as it is, and why)
    if any(kind in ("layernorm", "rmsnorm") for _, kind, *_ in read) and "left" not in " ".join(said):
        assert converted, name  # a family with norms DyT can stand in for converts some


COPY_AFFINE = [
    n
    for n in BUILDS
    if n.startswith(
        (
            "hf-llama",
            "hf-gemma",
            "hf-gpt2",
            "hf-qwen3",
            "hf-olmo2",
            "demo-",
            "gemma-style",
            "skewed",
            "channels-first",
            "gains-named",
        )
    )
]


@pytest.mark.parametrize("name", COPY_AFFINE)
def test_conversion_with_copy_affine_on_meta_equals_conversion_on_cpu(name):
    cpu, meta = _converted(name, "cpu", copy_affine=True), _converted(name, "meta", copy_affine=True)
    assert meta[1:3] == cpu[1:3]


def test_hf_llama_from_the_issue_converts_five_norms_on_meta():
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    with torch.device("meta"):
        model = convert_to_dyt(transformers.LlamaForCausalLM(config), rmsnorm=True)
    dyts = [n for n, m in model.named_modules() if isinstance(m, DyT)]
    assert len(dyts) == 5 and "model.layers.0.input_layernorm.alpha" in model.state_dict()
    assert all(p.is_meta for p in model.parameters())


def test_the_affine_form_of_a_meta_layer_is_read_on_a_twin_and_its_values_stay_meta():
    with torch.device("meta"):
        gemma, ln = GemmaStyleRMSNorm(8), nn.LayerNorm(8)
    a = effective_affine(gemma)
    assert (a.kind, a.gain.device.type, a.bias) == ("rmsnorm", "meta", None)
    assert a.note.startswith("gain = 1 + weight") and "meta" in a.note
    b = effective_affine(ln)
    assert b.kind == "layernorm" and b.bias is not None and b.bias.is_meta  # its `bias` parameter adds one


class _BufferedNorm(nn.Module):
    """An RMSNorm whose gain is ``weight * scale``, ``scale`` a buffer: its value is needed to read the layer, and
    meta does not hold it."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.register_buffer("scale", torch.ones(d))
        self.eps = 1e-6

    def forward(self, x):
        return self.weight * self.scale * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_a_norm_whose_reading_needs_a_value_meta_lacks_is_unknown_and_says_build_on_cpu():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), _BufferedNorm())
    with pytest.warns(UserWarning, match="converted nothing") as caught:
        convert_to_dyt(model, rmsnorm=True)
    text = " ".join(str(w.message) for w in caught)
    assert "1 layer(s) named like normalisers could not be read (1)" in text
    from satmon.model.map import model_map

    note = model_map(model).undetermined["1"]
    assert "meta device" in note and "scale" in note and "build the model on the CPU" in note
    assert find_norm_layers(nn.Sequential(nn.Linear(8, 8), _BufferedNorm()))[0].kind == "rmsnorm"  # on the CPU: read
