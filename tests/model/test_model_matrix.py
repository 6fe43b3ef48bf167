"""The model matrix: satmon on tiny models of real families (built from configs, no download) and on
user models with unusual names. Each family is checked for what a user relies on:

- discovery: every norm found, with the kind its computation shows (``effective_affine``) and the axis
  it normalises (ConvNeXt's channels-first layers: axis 1);
- ``convert_to_dyt(copy_affine=True)``: every norm converted, DyT gain = the norm's effective gain,
  outputs not degenerate (Gemma's ``1 + weight`` norms once gave constant logits);
- gated-MLP detection from one traced forward against the architecture's truth, written from each
  family's modeling code: which norm feeds which gated MLP (post-norm Olmo-2: none; Gemma-2: the
  pre-feedforward norm; parallel Cohere: the one norm of the block; Mixtral: the experts), and the names
  fallback never says "no" for a gated family nor "yes" for a non-gated one;
- ``satmon.probe`` norm type at random init (LayerNorm: |cos| >= 0.9999 on every layer with more tokens than
  channels; fewer: "undetermined" with the reason);
- the callback's saturation over a few steps = a float64 recount from an independent hook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from helpers import trainer
from reference import InputRecorder
from satmon import (
    SaturationMonitor,
    convert_to_dyt,
    find_dyt_layers,
    find_norm_layers,
    probe,
)
from satmon.model.affine import effective_affine
from satmon.model.gating import detect_gating
from satmon.model.map import model_map
from third_party import OddGatedBlock, SquashBlock, SquashNorm, UserLM

transformers = pytest.importorskip("transformers")

VOCAB, D, LAYERS = 64, 32, 2
HF = dict(
    hidden_size=D,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=32,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
DECODER = dict(HF, num_key_value_heads=2)


@dataclass(frozen=True)
class Family:
    build: Callable[[], nn.Module]
    kind: str  # the kind of every norm: "layernorm", "rmsnorm" or "dyt"
    gated_norms: tuple[str, ...]  # the norms that feed a gated MLP (after conversion to DyT); () for non-gated
    images: bool = False
    norms: int = 0  # how many normalisers (0: two per block and one more)
    channels_first: tuple[str, ...] = ()  # the norms that normalise dim 1 of (B, C, H, W)
    gated_mlps: bool | None = None  # the model has gated MLPs (None: as gated_norms says); post-norm: yes, fed by none
    gate_stats: bool = True  # the gate pre-activations are a module's output (experts inside one module: no)


def _tx(config: str, model: str, **kw) -> Callable[[], nn.Module]:
    return lambda: getattr(transformers, model)(getattr(transformers, config)(**kw))


def _per_layer(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.format(i) for i in range(LAYERS))


FAMILIES = {
    "gpt2": Family(
        _tx(
            "GPT2Config",
            "GPT2LMHeadModel",
            n_embd=D,
            n_layer=LAYERS,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=32,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "layernorm",
        (),
    ),
    "bert": Family(_tx("BertConfig", "BertModel", **HF), "layernorm", ()),  # post-norm
    "llama": Family(
        _tx("LlamaConfig", "LlamaForCausalLM", **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.post_attention_layernorm"),
    ),
    "qwen2": Family(
        _tx("Qwen2Config", "Qwen2ForCausalLM", **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.post_attention_layernorm"),
    ),
    "mistral": Family(
        _tx("MistralConfig", "MistralForCausalLM", **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.post_attention_layernorm"),
    ),
    "gemma": Family(
        _tx("GemmaConfig", "GemmaForCausalLM", head_dim=8, **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.post_attention_layernorm"),
    ),
    "phi3": Family(
        _tx("Phi3Config", "Phi3ForCausalLM", **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.post_attention_layernorm"),
    ),
    "vit": Family(
        _tx(
            "ViTConfig",
            "ViTModel",
            hidden_size=D,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
        ),
        "layernorm",
        (),
        images=True,
    ),
    # reordered post-norm: norm(attn(x)) and norm(mlp(h)) are added
    "olmo2": Family(
        _tx("Olmo2Config", "Olmo2ForCausalLM", **DECODER), "rmsnorm", (), norms=4 * LAYERS + 1, gated_mlps=True
    ),
    "gemma2": Family(
        _tx("Gemma2Config", "Gemma2ForCausalLM", head_dim=8, **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.pre_feedforward_layernorm"),
        norms=4 * LAYERS + 1,
    ),
    # q_norm, k_norm per head
    "qwen3": Family(
        _tx("Qwen3Config", "Qwen3ForCausalLM", head_dim=8, **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.post_attention_layernorm"),
        norms=4 * LAYERS + 1,
    ),
    "mixtral": Family(
        _tx("MixtralConfig", "MixtralForCausalLM", num_local_experts=2, num_experts_per_tok=2, **DECODER),
        "rmsnorm",
        _per_layer("model.layers.{}.post_attention_layernorm"),
        gate_stats=False,
    ),
    "t5": Family(
        _tx(
            "T5Config",
            "T5EncoderModel",
            d_model=D,
            d_kv=8,
            d_ff=64,
            num_layers=LAYERS,
            num_heads=4,
            vocab_size=VOCAB,
            feed_forward_proj="gated-gelu",
        ),
        "rmsnorm",
        _per_layer("encoder.block.{}.layer.1.layer_norm"),
    ),
    "gpt-neox": Family(_tx("GPTNeoXConfig", "GPTNeoXForCausalLM", use_parallel_residual=True, **HF), "layernorm", ()),
    "gpt-j": Family(
        _tx(
            "GPTJConfig",
            "GPTJForCausalLM",
            n_embd=D,
            n_layer=LAYERS,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=32,
            rotary_dim=4,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "layernorm",
        (),
        norms=LAYERS + 1,
    ),
    # parallel attention, one norm a block
    "falcon": Family(
        _tx(
            "FalconConfig",
            "FalconForCausalLM",
            hidden_size=D,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            vocab_size=VOCAB,
            parallel_attn=True,
            new_decoder_architecture=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "layernorm",
        (),
        norms=LAYERS + 1,
    ),
    # parallel: one norm feeds both
    "cohere": Family(
        _tx("CohereConfig", "CohereForCausalLM", logit_scale=1.0, **DECODER),
        "layernorm",
        _per_layer("model.layers.{}.input_layernorm"),
        norms=LAYERS + 1,
    ),
    "convnext": Family(
        _tx("ConvNextConfig", "ConvNextModel", num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
        "layernorm",
        (),
        images=True,
        channels_first=("embeddings.layernorm", "encoder.stages.1.downsampling_layer.0"),
    ),
    "user-gated": Family(
        lambda: UserLM(OddGatedBlock, VOCAB, D, n_layers=LAYERS), "layernorm", _per_layer("stack.{}.post")
    ),
    "user-dyt": Family(lambda: UserLM(SquashBlock, VOCAB, D, n_layers=LAYERS, norm=SquashNorm), "dyt", ()),
}
NORMS = 2 * LAYERS + 1  # most families: two norms per block and one more (final, or BERT's embedding norm)


def _norms(name: str) -> int:
    return FAMILIES[name].norms or NORMS


def _build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return FAMILIES[name].build()


def _inputs(name: str, seed: int, n: int = 4) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    if FAMILIES[name].images:
        return torch.randn(4 * n, 3, 16, 16, generator=gen)  # (B, C, H, W): 5 tokens an image
    return torch.randint(3, VOCAB, (n, 16), generator=gen)  # (B, T)


def _output(out) -> Tensor:
    for key in ("logits", "last_hidden_state"):
        if getattr(out, key, None) is not None:
            return getattr(out, key)
    return out


def _converted(name: str, alpha: float = 1.0) -> tuple[nn.Module, dict[str, Tensor]]:
    """The family as DyT (norms converted with their effective gains), and those gains by layer name."""
    model = _build(name)
    gains = {l.name: effective_affine(l.module).gain for l in find_norm_layers(model, kinds=("layernorm", "rmsnorm"))}
    return convert_to_dyt(model, alpha_init=alpha, rmsnorm=True, copy_affine=True), gains


# ----------------------------------------------------------------------------- discovery
@pytest.mark.parametrize("name", FAMILIES)
def test_every_norm_is_found_with_the_kind_it_computes(name):
    layers = find_norm_layers(_build(name))
    assert len(layers) == _norms(name) and {l.kind for l in layers} == {FAMILIES[name].kind}
    assert {l.name for l in layers if l.axis == 1} == set(FAMILIES[name].channels_first)
    for l in layers:
        if l.kind != "dyt":
            assert effective_affine(l.module).kind == l.kind, l.name  # the affine fit agrees with discovery


# ----------------------------------------------------------------------------- conversion
@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.kind != "dyt"])
def test_convert_copies_the_effective_gain_and_the_outputs_are_not_degenerate(name):
    model, gains = _converted(name)
    dyts = {l.name: l.module for l in find_dyt_layers(model)}
    assert set(dyts) == set(gains) and not find_norm_layers(model, kinds=("layernorm", "rmsnorm"))
    for layer, gain in gains.items():
        assert torch.equal(dyts[layer].weight.detach().double(), gain), layer
    model.eval()
    with torch.no_grad():
        a, b = _output(model(_inputs(name, 1))), _output(model(_inputs(name, 2)))
    feats = a.flatten(1) if a.dim() == 4 else a  # (B, C, H, W): channels and positions
    assert torch.isfinite(a).all() and feats.std(dim=-1).min() > 1e-4  # not constant along the features
    assert (a - b).abs().max() > 1e-3  # and it depends on the input


# ----------------------------------------------------------------------------- gated MLP
@pytest.mark.parametrize("name", FAMILIES)
def test_gated_mlp_detection_from_the_data_flow(name):
    model = _converted(name)[0] if FAMILIES[name].kind != "dyt" else _build(name)
    report = detect_gating(model, example_input=_inputs(name, 0, n=1))
    family = FAMILIES[name]
    expected = family.gated_norms
    assert report.gated is bool(expected), report.message
    assert tuple(report.pairings) == expected
    assert all(p.source == "trace" and p.gate_stats is family.gate_stats for p in report.pairings.values())
    has_gated_mlps = bool(expected) if family.gated_mlps is None else family.gated_mlps
    assert bool(report.pairings or report.unpaired_gated_mlps) is has_gated_mlps, report.message
    assert {l.name for l in model_map(model).norms if "gated-mlp" in (l.feeds or ())} == set(expected)
    # without a forward: never "yes" or "no" (the names only hint)
    blind = detect_gating(_converted(name)[0] if FAMILIES[name].kind != "dyt" else _build(name))
    assert blind.gated is None and blind.pairings == {}, blind.message
    if name == "phi3":
        assert all(p.fused and p.up is None and p.gate.endswith("gate_up_proj") for p in report.pairings.values())
    # the original (LayerNorm/RMSNorm) model reads the same from its norms
    if FAMILIES[name].kind != "dyt":
        original = _build(name)
        norms = [l.name for l in find_norm_layers(original)]
        assert tuple(detect_gating(original, norms, example_input=_inputs(name, 0, n=1)).pairings) == expected


# ----------------------------------------------------------------------------- probe
@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.kind != "dyt"])
def test_probe_norm_type_at_random_init(name):
    report = probe(_build(name), [_inputs(name, 3), _inputs(name, 4)])
    want = "layernorm-like" if FAMILIES[name].kind == "layernorm" else "rmsnorm-like"
    assert report.norm_type == want, report.norm_type_note
    readings = [r for r in report.layers.values() if r.kind != "dyt"]
    assert len(readings) == _norms(name)
    few = [r for r in readings if r.tokens <= r.dim]  # rank-deficient: no reading of the type, and it says why
    assert all(r.norm_type == "undetermined" and f"{r.tokens} token(s) for {r.dim} channels" in r.note for r in few)
    read = [r for r in readings if r.tokens > r.dim]
    assert len(read) >= len(readings) - 1 and all(r.norm_type == want for r in read)
    if want == "layernorm-like":
        assert min(abs(r.alignment) for r in read) >= 0.9999


# ----------------------------------------------------------------------------- the callback's counts
class _Lit(pl.LightningModule):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor):
        return self.model(x)

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return _output(self(batch)).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)  # alpha moves between steps


@pytest.mark.filterwarnings("ignore:satmon. the Trainer has no logger")
@pytest.mark.parametrize("name", FAMILIES)
def test_callback_saturation_equals_a_float64_recount(name, tmp_path):
    model = _converted(name, alpha=40.0)[0] if FAMILIES[name].kind != "dyt" else _build(name)
    if FAMILIES[name].kind == "dyt":
        for l in find_dyt_layers(model):
            l.module.alpha.data.fill_(40.0)
    lit = _Lit(model)
    names = [l.name for l in find_dyt_layers(lit)]
    recorder = InputRecorder(lit, names)
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=0)
    batches = DataLoader([_inputs(name, s, n=2) for s in range(3)], batch_size=None)
    trainer(tmp_path, max_steps=3, callbacks=[monitor]).fit(lit, batches)
    recorder.remove()
    counts = recorder.counts(level=2.0)
    v = monitor.verdict
    assert list(v.per_layer) == names
    for layer, (sat, total) in counts.items():
        assert v.per_layer[layer] == sat / total, layer
    pooled = sum(s for s, _ in counts.values()) / sum(t for _, t in counts.values())
    assert v.saturation == pooled and 0.0 < pooled < 1.0


@pytest.mark.filterwarnings("ignore:satmon. the Trainer has no logger")
def test_callback_flags_a_saturated_gated_model_whatever_its_names(tmp_path):
    # the case: SwiGLU as proj_g/proj_u/proj_d after norms pre/post, saturation far above 0.5;
    # the callback traces its first training batch, so the study's collapse rule applies (before: GO, "no")
    model, _ = _converted("user-gated", alpha=40.0)
    monitor = SaturationMonitor(window=2, verbose=False, watch_every_n_steps=0)
    batches = DataLoader([_inputs("user-gated", s, n=2) for s in range(2)], batch_size=None)
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(_Lit(model), batches)
    v = monitor.verdict
    assert v.saturation > 0.5 and v.gated is True and v.gated_layers == ("model.stack.0.post", "model.stack.1.post")
    assert v.decision == "no-go" and v.collapse_risk is True
