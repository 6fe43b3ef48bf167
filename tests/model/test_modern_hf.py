"""Tiny Hugging Face models built from their configs (2 blocks, width 32, random weights, no download): GPT-OSS
(experts through each of transformers' expert paths), OLMo2 (reordered post-norm, QK-norm), Qwen3 (per-head
QK-norm) and Mamba2 (a gated norm). Gating is read by trace against each block's real data flow (an independent
hook: does the MLP's first projection receive the norm's output itself?), conversion leaves what DyT cannot
replace and the model runs, and the screen's counts (gating from its first training forward) equal a float64
recount."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_modern_blocks import reads_directly
from torch import nn

import satmon
from reference import InputRecorder, pooled
from satmon import DyT, convert_to_dyt, find_norm_layers
from satmon.model.gating import detect_gating

transformers = pytest.importorskip("transformers")

VOCAB, D = 64, 32
HF = dict(
    hidden_size=D,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    num_key_value_heads=2,
)
IDX = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))


def _build(name: str, **extra) -> nn.Module:
    torch.manual_seed(0)
    if name == "gpt-oss":
        config = transformers.GptOssConfig(**HF, num_local_experts=4, num_experts_per_tok=2, head_dim=8, **extra)
        return transformers.GptOssForCausalLM(config)
    if name == "olmo2":
        return transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**HF))
    if name == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**HF, head_dim=8))
    if name.startswith("stablelm"):  # its use_parallel_residual flag reorders which norm the MLP reads
        config = transformers.StableLmConfig(**HF, use_parallel_residual=name.endswith("parallel"))
        return transformers.StableLmForCausalLM(config)
    if name == "mamba2":
        config = transformers.Mamba2Config(
            hidden_size=D,
            num_hidden_layers=2,
            vocab_size=VOCAB,
            num_heads=4,
            head_dim=16,
            state_size=8,
            n_groups=1,
            expand=2,
            chunk_size=8,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        return transformers.Mamba2ForCausalLM(config)
    raise KeyError(name)


def _build_or_skip(name: str, **extra) -> nn.Module:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _build(name, **extra)
    except Exception as err:  # a transformers version without this family or config field
        pytest.skip(
            f"transformers {transformers.__version__} cannot build {name} on the CPU: {type(err).__name__}: {err}"
        )


def _layers(model: nn.Module) -> list:
    return list(model.model.layers) if hasattr(model, "model") else list(model.backbone.layers)


#: per family: the norm (leaf name) of each block that feeds its gated MLP, that MLP's first projection, and the
#: norm whose output the projection is checked against (independently, by a hook)
TRUTH = {
    "gpt-oss": ("post_attention_layernorm", lambda b: b.mlp.router, lambda b: b.post_attention_layernorm),
    "olmo2": (None, lambda b: b.mlp.gate_proj, lambda b: b.post_attention_layernorm),  # the MLP reads x + norm(attn(x))
    "qwen3": ("post_attention_layernorm", lambda b: b.mlp.gate_proj, lambda b: b.post_attention_layernorm),
    "stablelm": ("post_attention_layernorm", lambda b: b.mlp.gate_proj, lambda b: b.post_attention_layernorm),
    "stablelm-parallel": ("input_layernorm", lambda b: b.mlp.gate_proj, lambda b: b.input_layernorm),
    "mamba2": (None, None, None),  # no MLP in a Mamba2 block
}
HF_NAMED = ("gpt-oss", "olmo2", "qwen3", "mamba2")  # the four


@pytest.mark.parametrize("name", TRUTH)
def test_gating_by_trace_matches_each_blocks_data_flow(name):
    model = _build_or_skip(name).eval()
    norm_leaf, first, checked = TRUTH[name]
    blocks = _layers(model)
    if first is not None:  # the truth, read independently: does the MLP's first projection receive that norm's output?
        for block in blocks:
            assert reads_directly(model, checked(block), first(block), IDX) is (norm_leaf is not None)
    norms = [l.name for l in find_norm_layers(model)]
    report = detect_gating(model, norms, example_input=IDX)
    want = tuple(n for n in norms if norm_leaf and n.endswith("." + norm_leaf))
    assert report.gated is bool(want) and report.gated_layers == want and report.unclassified == {}, report.message
    assert all(p.source == "trace" for p in report.pairings.values())
    qk = [n for n in norms if n.endswith(("q_norm", "k_norm"))]
    from satmon.model.map import model_map

    feeds = {l.name: l.feeds for l in model_map(model).norms}
    assert all(feeds[n] == ("attention",) for n in qk)


@pytest.mark.parametrize("impl", ["grouped_mm", "batched_mm", "eager"])
def test_gpt_oss_experts_are_gated_on_every_expert_path(impl):
    model = _build_or_skip("gpt-oss")
    model.config._experts_implementation = impl
    for block in _layers(model):
        if hasattr(block.mlp.experts, "config"):
            block.mlp.experts.config._experts_implementation = impl
    report = detect_gating(model, [l.name for l in find_norm_layers(model)], example_input=IDX)
    p = report.pairings["model.layers.0.post_attention_layernorm"]
    assert report.gated is True and (p.mlp, p.gate_stats, p.activation) == ("model.layers.0.mlp.experts", False, "silu")


@pytest.mark.parametrize("name", HF_NAMED)
def test_converted_models_run_and_the_screen_counts_equal_a_float64_recount(name):
    model = _build_or_skip(name)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        convert_to_dyt(model, alpha_init=8.0, rmsnorm=True, copy_affine=True)
    left = [str(w.message) for w in got if "left as they are" in str(w.message)]
    if name.startswith("stablelm"):  # its use_parallel_residual flag reorders which norm the MLP reads
        config = transformers.StableLmConfig(**HF, use_parallel_residual=name.endswith("parallel"))
        return transformers.StableLmForCausalLM(config)
    if name == "mamba2":  # norm(y, gate): two inputs, left as it is and named
        assert len(left) == 1 and "backbone.layers.0.mixer.norm (" in left[0] and "2 inputs" in left[0]
        assert not isinstance(model.backbone.layers[0].mixer.norm, DyT)
    else:
        assert left == []
    model.train()
    screen = satmon.Screen(window=2, verbose=False, watch_every_n_steps=0, warn=lambda m: None).attach(model)
    # the float64 reference of every forward but satmon's own traced ones
    rec = InputRecorder(
        model,
        [n for n, m in model.named_modules() if isinstance(m, satmon.DyT)],
        when=lambda mod: not satmon.model.dataflow.tracing(),
    )
    for step in range(2):
        batch = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(step))
        out = model(batch).logits
        assert torch.isfinite(out).all()
        screen.step(out.float().pow(2).mean())
    rec.remove()
    counts = rec.counts()
    v = screen.verdict
    norm_leaf = TRUTH[name][0]
    assert v.gated is (norm_leaf is not None) and all(n.endswith("." + str(norm_leaf)) for n in v.gated_layers)
    assert set(v.per_layer) == set(counts)
    for layer, (sat, total) in counts.items():
        assert v.per_layer[layer] == sat / total, layer
    assert v.saturation == pytest.approx(pooled(counts), abs=1e-12)
