"""satmon.probe against independent float64 references, on satmon's models and on third-party layouts.

The Hugging Face-style and nanoGPT-style models below are written inline with those projects'
module names, with norm classes from tests/third_party.py, so discovery cannot lean on satmon's
class names.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from reference import InputRecorder, pooled
from satmon import find_dyt_layers
from satmon.demos.gpt import GPT, GPTConfig
from satmon.demos.llama import LlamaLM
from satmon.io.json_records import to_json
from satmon.io.tags import TAG
from satmon.io.tensorboard import probe_scalars
from satmon.model.dataflow import tracing
from satmon.probing.passes import EMBEDDING, feed_first, probe
from satmon.results.verdict import Source
from third_party import GemmaStyleRMSNorm, LlamaRMSNorm, SkewedLayerNorm

VOCAB = 256


def _tokens(seed: int, n_batches: int = 4, batch: int = 16, seq: int = 64, vocab: int = VOCAB) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(n_batches)]


def _gpt(norm: str, seed: int = 0, **cfg) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(norm=norm, **cfg))


# ------------------------------------------------------------------ third-party layouts (inline)
class LlamaAttention(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, hidden_states: Tensor) -> Tensor:
        B, T, C = hidden_states.shape
        q, k, v = (
            p(hidden_states).view(B, T, self.n_heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class LlamaMLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(d, n_heads)
        self.mlp = LlamaMLP(d, 3 * d)
        self.input_layernorm = LlamaRMSNorm(d)
        self.post_attention_layernorm = LlamaRMSNorm(d)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor]:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return (hidden_states,)  # HF decoder layers return tuples


class LlamaModel(nn.Module):
    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaDecoderLayer(d, n_heads) for _ in range(n_layers))
        self.norm = LlamaRMSNorm(d)

    def forward(self, input_ids: Tensor) -> Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states=hidden_states, attention_mask=None)[0]  # keyword call, as HF does
        return self.norm(hidden_states)


class LlamaForCausalLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, d: int = 64, n_layers: int = 2, n_heads: int = 4) -> None:
        super().__init__()
        self.model = LlamaModel(vocab, d, n_layers, n_heads)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.lm_head(self.model(input_ids))


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(d, bias=False)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(d, 3 * d), "c_proj": nn.Linear(d, d)})
        self.ln_2 = LayerNorm(d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 4, C // 4).transpose(1, 2) for t in self.attn["c_attn"](self.ln_1(x)).split(C, dim=2))
        x = x + self.attn["c_proj"](
            F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        )
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int = VOCAB, d: int = 64, n_layers: int = 2, block_size: int = 64) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, d),
                wpe=nn.Embedding(block_size, d),
                drop=nn.Dropout(0.1),
                h=nn.ModuleList([NanoBlock(d) for _ in range(n_layers)]),
                ln_f=LayerNorm(d, bias=False),
            )
        )
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1])))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def _random_gamma(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))


# ---------------------------------------------------------------------------------- readings
def test_random_init_layernorm_gpt_has_aligned_kernel():
    model = _gpt("layernorm")
    report = probe(model, _tokens(0))
    lns = {n: l for n, l in report.layers.items() if l.kind == "layernorm"}
    assert list(lns) == ["blocks.0.ln_1", "blocks.0.ln_2", "blocks.1.ln_1", "blocks.1.ln_2", "ln_f"]
    for name, l in lns.items():
        assert l.alignment >= 0.9999 and l.null_projection >= 0.9999, name
        assert l.null_dim == 1 and l.norm_type == "layernorm-like" and l.depth_diag < 1e-9, name
        assert l.tokens == 4 * 16 * 64
    assert report.norm_type == "layernorm-like"
    assert report.saturation is None and report.verdict is None
    assert report.tokens == 4096 and report.batches == 4
    assert report.sigma_min.blocks == (EMBEDDING, "blocks.0", "blocks.1") and report.sigma_min.valid


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hf_style_rmsnorm_has_no_null_space(seed):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(d=64)
    _random_gamma(model, seed)
    batches = [{"input_ids": t} for t in _tokens(seed, n_batches=2, batch=8, seq=128)]  # 2048 tokens, dict batches
    report = probe(model, batches)
    names = [
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm",
        "model.layers.1.post_attention_layernorm",
        "model.norm",
    ]
    assert list(report.layers) == names
    for name, l in report.layers.items():
        assert l.kind == "rmsnorm" and l.null_dim == 0 and l.null_projection == 0.0, name
        assert l.norm_type == "rmsnorm-like", (name, l.depth_diag)
    assert report.norm_type == "rmsnorm-like"
    assert report.sigma_min.blocks == (EMBEDDING, "model.layers.0", "model.layers.1") and report.sigma_min.valid
    assert report.tokens == 2048


def test_nanogpt_style_layernorm_and_tuple_batches():
    torch.manual_seed(0)
    model = NanoGPT()
    _random_gamma(model, 0)
    x = _tokens(1, n_batches=2)
    report = probe(model, [(t, t) for t in x])  # nanoGPT's forward(idx, targets): the default rule feeds both
    assert list(report.layers) == [
        "transformer.h.0.ln_1",
        "transformer.h.0.ln_2",
        "transformer.h.1.ln_1",
        "transformer.h.1.ln_2",
        "transformer.ln_f",
    ]
    for name, l in report.layers.items():
        assert l.kind == "layernorm" and l.alignment >= 0.9999 and l.null_dim == 1, name
    assert report.sigma_min.blocks == (EMBEDDING, "transformer.h.0", "transformer.h.1")
    assert report.norm_type == "layernorm-like"


@pytest.mark.parametrize("dead", [0.0, 1e-30])
def test_zero_gamma_layernorm_gives_null_space_of_dead_channels(dead):
    model = _gpt("layernorm")
    with torch.no_grad():
        model.blocks[0].ln_1.weight[[3, 17, 40]] = dead
        model.ln_f.weight[[5, 6]] = dead
    report = probe(model, _tokens(0, n_batches=2))
    for name, k in (("blocks.0.ln_1", 3), ("ln_f", 2)):
        l = report.layers[name]
        assert l.null_dim == k and l.n_degenerate == k, name
        assert l.null_projection == pytest.approx(1.0, abs=1e-9), name
        assert l.kernel_alignment() == pytest.approx(1.0, abs=1e-9)
        assert 0.0 <= l.alignment <= 1.0 and l.norm_type == "undetermined"
    assert report.layers["blocks.1.ln_1"].null_dim == 1
    assert report.norm_type == "layernorm-like"  # 3 of 5 layers, none rmsnorm-like
    json.dumps(to_json(report.to_dict()), allow_nan=False)
    assert all(math.isfinite(v) for v in probe_scalars(report).values())


# ---------------------------------------------------------------------- state left unchanged
def test_probe_restores_mixed_modes_parameters_buffers_and_rng():
    model = _gpt("dyt", dropout=0.1, alpha_init=50.0)
    model.train()
    model.blocks[0].eval()
    model.blocks[1].attn.eval()
    model.ln_f.eval()
    modes = {n: m.training for n, m in model.named_modules()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    seen_training = []
    model.blocks[1].mlp.register_forward_hook(lambda m, a, o: None if tracing() else seen_training.append(m.training))
    probe(model, _tokens(0, n_batches=2))
    assert seen_training == [False, False], "the probe runs in eval mode"
    assert {n: m.training for n, m in model.named_modules()} == modes
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(
        not m._forward_hooks and not m._forward_pre_hooks
        for m in model.blocks.modules()
        if m is not model.blocks[1].mlp
    )


def test_train_mode_restores_batchnorm_buffers_and_no_blocks_is_reported():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.LayerNorm(8)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []
    model[1].register_forward_hook(lambda m, a, o: seen.append(m.training))
    report = probe(model, torch.randn(64, 8), train_mode=True)
    assert seen == [True] and not model.training and not model[1].training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert report.layers["2"].null_dim == 1
    assert not report.sigma_min.valid and "no residual blocks" in report.sigma_min.reason


def test_hooks_removed_after_a_failing_forward():
    model = _gpt("layernorm")
    with pytest.raises(IndexError):
        probe(model, torch.full((2, 8), 10_000))  # token id out of range
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert model.training  # mode restored (a fresh GPT is in train mode)


# ------------------------------------------------------------------ independent float64 recomputations
def test_dyt_saturation_equals_float64_recount():
    model = _gpt("dyt", alpha_init=50.0)
    layers = find_dyt_layers(model)
    # satmon's gating trace (one eval forward of the first batch) left out
    rec = InputRecorder(model, [l.name for l in layers], when=lambda m: not tracing())
    report = probe(model, _tokens(0))
    counts = rec.counts()
    for n, (sat, tot) in counts.items():
        assert report.layers[n].saturation == sat / tot
        assert report.layers[n].alpha == pytest.approx(50.0)
    assert report.saturation == pooled(counts)
    assert 0.05 < report.saturation < 0.95
    assert report.verdict.saturation == report.saturation and report.verdict.elements == sum(
        t for _, t in counts.values()
    )
    assert report.norm_type == "dyt"
    assert probe_scalars(report)[TAG.saturation] == report.saturation


def test_sigma_min_equals_svdvals_of_captured_streams():
    model = _gpt("layernorm")
    captured: dict[str, list[Tensor]] = {EMBEDDING: [], "blocks.0": [], "blocks.1": []}
    model.blocks[0].register_forward_pre_hook(lambda m, a: captured[EMBEDDING].append(a[0].detach().double()))
    for i, b in enumerate(model.blocks):
        b.register_forward_hook(lambda m, a, o, n=f"blocks.{i}": captured[n].append(o.detach().double()))
    report = probe(model, _tokens(2))
    ref = [float(torch.linalg.svdvals(torch.cat(captured[n]).reshape(-1, 64)).min()) for n in captured]
    s = report.sigma_min
    assert s.values == pytest.approx(ref, rel=1e-7)
    assert s.ratios == pytest.approx([r / ref[0] for r in ref], rel=1e-7)
    assert s.min_ratio == min(s.ratios[1:]) and s.argmin == s.blocks[1 + s.ratios[1:].index(s.min_ratio)]


class AntiBlock(nn.Module):
    """A residual block whose update is f(x) = -0.9 x: it anti-aligns with the stream."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x: Tensor) -> Tensor:
        self.ln(x)  # a norm inside, as in every transformer block
        return x - 0.9 * x


class Identityish(AntiBlock):
    def forward(self, x: Tensor) -> Tensor:
        return x + 0.1 * self.ln(x)


def test_anti_aligned_block_drives_ratio_below_one():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Sequential(AntiBlock(16), AntiBlock(16)))
    report = probe(model, _tokens(0, n_batches=1))
    s = report.sigma_min
    assert s.blocks == (EMBEDDING, "1.0", "1.1")
    assert s.ratios == pytest.approx([1.0, 0.1, 0.01], rel=1e-6)
    assert s.min_ratio == pytest.approx(0.01, rel=1e-6) and s.argmin == "1.1"
    assert probe_scalars(report)[TAG.sigma_min_ratio("1.0")] == pytest.approx(0.1, rel=1e-6)


# ------------------------------------------------------------------------------ gated models
def test_gated_dyt_model_gets_gated_verdict_with_gate_stats():
    torch.manual_seed(0)
    model = LlamaLM(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, seq_len=32, alpha_init=20.0)
    gates: dict[str, list[Tensor]] = {"blocks.0.mlp": [], "blocks.1.mlp": []}
    for i, b in enumerate(model.blocks):
        b.mlp.gate_proj.register_forward_hook(lambda m, a, o, n=f"blocks.{i}.mlp": gates[n].append(o.detach().double()))
    report = probe(model, _tokens(0, n_batches=2, batch=4, seq=32))
    v = report.verdict
    assert v.gated is True and v.gated_layers == ("blocks.0.mlp_norm", "blocks.1.mlp_norm")
    assert report.gating.gated and set(report.verdict.risk) == {"blocks.0.mlp", "blocks.1.mlp"}
    for mlp, g in gates.items():
        risk = report.verdict.risk[mlp]
        flat = float((torch.cat(g) < -4.0826).double().mean())
        assert risk["flat_fraction"] == pytest.approx(flat, abs=1e-12)
        assert risk["dyt_saturation"] == report.layers[mlp.replace("mlp", "mlp_norm")].saturation
    assert v.collapse_risk == (report.saturation >= 0.5)
    json.dumps(to_json(report.to_dict()), allow_nan=False)


# ------------------------------------------------------------------------------ the report
def test_report_keys_round_trip_through_json_and_tags_match_the_live_callback():
    model = _gpt("layernorm")
    report = probe(model, _tokens(0, n_batches=2))
    d = to_json(report.to_dict())
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert set(d) >= {"layers", "sigma_min", "norm_type"}
    assert d["layers"]["ln_f"]["kind"] == "layernorm" and d["layers"]["ln_f"]["null_dim"] == 1
    assert {"alignment", "null_projection", "null_dim"} <= set(d["layers"]["ln_f"])
    assert set(d["sigma_min"]) >= {"blocks", "values", "ratios"}
    lns = list(report.layers)
    expected = {f"satmon_deadir/{n}/{k}" for n in lns for k in ("alignment", "null_dim", "null_projection")}
    expected |= {"satmon_sigma_min/ratio/blocks.0", "satmon_sigma_min/ratio/blocks.1", "satmon_sigma_min/min_ratio"}
    assert set(probe_scalars(report)) == expected
    assert "norm type layernorm-like" in report.summary()


@pytest.mark.parametrize("alpha, decision", [(100.0, "go"), (50.0, "no-go")])
def test_probe_decision_equals_the_rule_on_an_independent_float64_recount(alpha, decision):
    model = _gpt("dyt", alpha_init=alpha)
    layers = find_dyt_layers(model)
    rec = InputRecorder(model, [l.name for l in layers], when=lambda m: not tracing())
    report = probe(model, _tokens(0, n_batches=2, batch=8))
    want = pooled(rec.counts())
    assert report.saturation == want
    assert report.verdict.decision == ("go" if want >= 0.43 else "no-go") == decision  # the study's rule, by hand
    assert report.verdict.source == "probe" and report.verdict.step == 0 and report.verdict.window == 0


def test_dyt_to_dict_keys_and_invalid_profile_gives_none_ratios():
    model = _gpt("dyt")
    report = probe(model, torch.randint(0, VOCAB, (1, 16)))  # 16 tokens < d = 64: sigma_min is 0 by rank
    d = report.to_dict()
    assert d["layers"]["ln_f"]["kind"] == "dyt" and "saturation" in d["layers"]["ln_f"]
    assert d["norm_type"] == "dyt" and d["verdict"]["saturation"] == report.saturation
    assert not d["sigma_min"]["valid"] and d["sigma_min"]["ratios"] == [None, None, None]
    assert not any(k.startswith("satmon_sigma_min") for k in probe_scalars(report))


def test_step_and_source_reach_the_verdict():
    report = probe(_gpt("dyt", alpha_init=100.0), _tokens(0, n_batches=1), step=1234, source=Source.REPLAY)
    v = report.verdict
    assert v.step == 1234 and v.source == "replay" and v.reason.startswith("replay (no training window)")
    with pytest.raises(ValueError, match="Expected `source` to be a satmon.results.verdict.Source"):
        probe(_gpt("dyt"), _tokens(0, n_batches=1), source="nowhere")
    with pytest.raises(TypeError, match="Expected `step` to be an int"):
        probe(_gpt("dyt"), _tokens(0, n_batches=1), step=1.5)


def test_twin_gives_init_gap_per_layer():
    model, twin = _gpt("layernorm", seed=0), _gpt("layernorm", seed=1)
    with torch.no_grad():
        for p in model.parameters():  # a "trained" model: gamma spread out
            if p.dim() == 1:
                p.mul_(1 + 0.5 * torch.rand_like(p))
    report = probe(model, iter(_tokens(0, n_batches=2)), twin=twin)  # a one-shot iterator: probe keeps the batches
    assert set(report.init_gap) == set(report.layers)
    for name, gap in report.init_gap.items():
        assert report.layers[name].init_gap is gap and math.isfinite(gap.depth_deepening)
        assert probe_scalars(report)[TAG.init_gap(name)] == gap.depth_deepening
    assert report.to_dict()["init_gap"]["ln_f"].keys() == {"depth_deepening", "lambda_min_deepening"}


# ----------------------------------------------------------------------------- arguments
def test_layer_selection_keeps_the_final_norm_and_max_dim_skips():
    model = _gpt("layernorm")
    report = probe(model, _tokens(0, n_batches=1), layers=["blocks.0.ln_1"])
    assert list(report.layers) == ["blocks.0.ln_1", "ln_f"]
    assert list(probe(model, _tokens(0, n_batches=1), layers=r"ln_2").layers) == [
        "blocks.0.ln_2",
        "blocks.1.ln_2",
        "ln_f",
    ]
    with pytest.raises(ValueError, match="Expected `layers` to name discovered norm layers"):
        probe(model, _tokens(0, n_batches=1), layers=["nope"])
    with pytest.warns(UserWarning, match="max_dim=32"):
        small = probe(model, _tokens(0, n_batches=1), max_dim=32)
    assert all(l.alignment is None for l in small.layers.values()) and not small.sigma_min.valid
    assert set(small.skipped) >= {"ln_f", EMBEDDING}


def test_batch_forms_dataloader_forward_fn_max_batches_and_bad_inputs():
    model = _gpt("layernorm")
    x = _tokens(0, n_batches=3)
    loader = DataLoader(TensorDataset(torch.cat(x), torch.cat(x)), batch_size=16)
    a = probe(model, loader, forward_fn=feed_first, max_batches=2)
    b = probe(model, x[:2])
    assert a.batches == 2 and a.tokens == 2 * 16 * 64
    assert a.layers["ln_f"].alignment == b.layers["ln_f"].alignment
    assert probe(model, x[0]).batches == 1
    with pytest.raises(TypeError, match="Expected `batches`"):
        probe(model, "tokens")
    with pytest.raises(ValueError, match="at least one batch"):
        probe(model, [])
    with pytest.raises(ValueError, match="Expected `level` > 0"):
        probe(model, x[0], level=0)
    with pytest.raises(ValueError, match="Expected a model with DyT"):
        probe(nn.Linear(2, 2), torch.zeros(1, 2))


BF16_TOL = 2.0**-9  # half a bf16 step: autocast rounds each matmul output to 8 significant bits


@pytest.mark.parametrize("norm, alpha", [("dyt", 100.0), ("layernorm", None)])
def test_bf16_autocast_probe_equals_float32_probe_within_bf16_rounding(norm, alpha):
    """Under CPU autocast the matmuls run in bf16 and round their outputs to 2^-9 relative; layer_norm
    and the DyT tanh input stay float32. Saturation (a fraction of elements: only those within one
    rounding step of the level can flip) and sigma_min (a smooth function of the activations) move by
    less than that rounding; LayerNorm outputs are float32, so their kernel stays exact."""
    model = _gpt(norm, **({"alpha_init": alpha} if alpha else {}))
    dtypes = []
    model.blocks[0].mlp.register_forward_hook(lambda m, a, o: None if tracing() else dtypes.append(o.dtype))
    x = _tokens(0, n_batches=2, batch=8)
    f32, bf16 = probe(model, x), probe(model, x, autocast_dtype=torch.bfloat16)
    assert dtypes == [torch.float32] * 2 + [torch.bfloat16] * 2  # autocast really ran the second probe in bf16
    assert bf16.sigma_min.values == pytest.approx(f32.sigma_min.values, rel=BF16_TOL)
    assert bf16.sigma_min.ratios == pytest.approx(f32.sigma_min.ratios, rel=BF16_TOL)
    assert bf16.sigma_min.values != f32.sigma_min.values  # not the same forward
    for name, a in f32.layers.items():
        b = bf16.layers[name]
        if norm == "dyt":
            assert b.saturation == pytest.approx(a.saturation, abs=BF16_TOL), name
        else:
            assert b.alignment == pytest.approx(a.alignment, abs=1e-9) and b.null_dim == a.null_dim == 1, name
            assert b.norm_type == a.norm_type == "layernorm-like", name
    if norm == "dyt":
        assert bf16.saturation == pytest.approx(f32.saturation, abs=BF16_TOL)
        assert bf16.verdict.decision == f32.verdict.decision == "go"  # margin 0.077, far beyond the tolerance


# ------------------------------------------------------------------- effective gain (issue 13)
class OnePlusLayerNorm(nn.Module):
    """A LayerNorm parametrised like Gemma's RMSNorm: gain 1 + weight, weight initialised at zero."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (x.shape[-1],), 1.0 + self.weight, None, 1e-5)


def _with_norms(model: nn.Module, make: type) -> nn.Module:
    for _, m in list(model.named_modules()):
        for child, sub in list(m.named_children()):
            if isinstance(sub, LlamaRMSNorm):
                setattr(m, child, make(sub.weight.numel()))
    return model


def test_gemma_style_rmsnorm_reads_rmsnorm_like_through_its_effective_gain():
    torch.manual_seed(0)
    model = _with_norms(LlamaForCausalLM(d=64), GemmaStyleRMSNorm)
    report = probe(model, [{"input_ids": t} for t in _tokens(0, n_batches=2, batch=8, seq=128)])
    assert len(report.layers) == 5 and all(l.kind == "rmsnorm" for l in report.layers.values())
    for name, l in report.layers.items():  # raw weight 0 would make every channel "degenerate": undetermined
        assert l.n_degenerate == 0 and l.null_dim == 0 and l.norm_type == "rmsnorm-like", name
    assert report.norm_type == "rmsnorm-like"


def test_unit_weight_and_one_plus_weight_layernorms_read_layernorm_like():
    torch.manual_seed(0)
    d = 32
    model = nn.Sequential(
        nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(d, d), OnePlusLayerNorm(d)
    )
    report = probe(model, _tokens(0, n_batches=2, batch=8, seq=64))
    assert [(n, l.kind) for n, l in report.layers.items()] == [("2", "layernorm"), ("4", "layernorm")]
    for name, l in report.layers.items():
        assert l.n_degenerate == 0 and l.null_dim == 1 and l.alignment >= 0.9999, name
        assert l.norm_type == "layernorm-like", name
    assert report.norm_type == "layernorm-like"


def test_a_norm_whose_affine_map_cannot_be_read_is_skipped_with_the_reason():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.LayerNorm(16), SkewedLayerNorm(16))
    with pytest.warns(
        UserWarning,
        match=r"no reading for 2 \(SkewedLayerNorm is named like a normaliser but, run on test inputs, computes "
        r"neither",
    ):
        report = probe(model, _tokens(0, n_batches=1))
    assert "2" not in report.layers and "gain * normalize(x) + bias" in report.skipped["2"]
    assert report.layers["1"].norm_type == "layernorm-like"  # the other layers are still read
