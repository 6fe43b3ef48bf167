"""Gated-MLP detection (satmon.model.gating): the traced data flow, mappings, unknowns, and what
names hint without a forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from satmon import DyT
from satmon.demos.llama import LlamaLM
from satmon.functional.gate import gate_stats
from satmon.model.gating import detect_gating, gate_linear_modules

D, H = 16, 24


# ----------------------------------------------------------------------------- tiny models, one naming convention each
class HFMLP(nn.Module):  # LLaMA / Mistral / Qwen in transformers
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(D, H), nn.Linear(D, H), nn.Linear(H, D)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class HFLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attn = DyT(D, bias=False), nn.Linear(D, D)
        self.post_attention_layernorm, self.mlp = DyT(D, bias=False), HFMLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class HFModel(nn.Module):
    def __init__(self, n=2):
        super().__init__()
        self.layers, self.norm = nn.ModuleList(HFLayer() for _ in range(n)), DyT(D, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class MetaFeedForward(nn.Module):  # Meta LLaMA / torchtitan: activation only in forward's source
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = (
            nn.Linear(D, H, bias=False),
            nn.Linear(H, D, bias=False),
            nn.Linear(D, H, bias=False),
        )

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MetaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = DyT(D), nn.Linear(D, D)
        self.ffn_norm, self.feed_forward = DyT(D), MetaFeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class T5GatedFF(nn.Module):  # T5 v1.1 GeGLU
    def __init__(self):
        super().__init__()
        self.wi_0, self.wi_1, self.wo = (
            nn.Linear(D, H, bias=False),
            nn.Linear(D, H, bias=False),
            nn.Linear(H, D, bias=False),
        )
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


class T5LayerFF(nn.Module):
    def __init__(self):
        super().__init__()
        self.DenseReluDense, self.layer_norm = T5GatedFF(), DyT(D)

    def forward(self, x):
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([nn.Sequential(DyT(D), nn.Linear(D, D)), T5LayerFF()])

    def forward(self, x):
        return self.layer[1](x + self.layer[0](x))


class Phi3MLP(nn.Module):  # fused gate-up, gate half first
    def __init__(self):
        super().__init__()
        self.gate_up_proj, self.down_proj, self.activation_fn = nn.Linear(D, 2 * H), nn.Linear(H, D), nn.SiLU()

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.activation_fn(gate) * up)


class Phi3Layer(HFLayer):
    def __init__(self):
        super().__init__()
        self.mlp = Phi3MLP()


class OpaqueMLP(nn.Module):  # gated, but no recognisable names; registered as (up, gate, down)
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(D, H), nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x):
        return self.c(self.a(x) * F.silu(self.b(x)))


class OpaqueBlock(nn.Module):  # two norms with names that say nothing about their role
    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.n_a, self.n_b, self.mix, self.ff = DyT(D), DyT(D), nn.Linear(D, D), mlp

    def forward(self, x):
        x = x + self.mix(self.n_b(x))
        return x + self.ff(self.n_a(x))


class GPT2Block(nn.Module):  # non-gated
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = DyT(D), nn.Linear(D, D), DyT(D)
        self.mlp = nn.Sequential()
        self.mlp.c_fc, self.mlp.gelu, self.mlp.c_proj = nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MoEExperts(nn.Module):  # Mixtral: experts with w1/w2/w3 two levels below the norm
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, 2)  # the router: not a gate projection
        self.experts = nn.ModuleList(MetaFeedForward() for _ in range(2))


class MixtralLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = DyT(D), DyT(D)
        self.block_sparse_moe = MoEExperts()


def names_of(model):
    return [n for n, m in model.named_modules() if isinstance(m, DyT)]


X = torch.randn(2, 5, D)


# ----------------------------------------------------------------------------- detection
def _hint(report, norm):
    """What the names suggest for ``norm`` when no forward was traced (never the answer)."""
    return report.unclassified[norm].split("; ", 1)[1]


def test_hf_gate_up_down_with_post_attention_layernorm():
    model = HFModel()
    blind = detect_gating(model, names_of(model))  # no forward yet: unknown, the names only hint
    assert (
        blind.gated is None
        and blind.pairings == {}
        and blind.message.startswith("gated MLP after DyT: unknown (no forward")
    )
    assert "names suggest yes (layers.0.post_attention_layernorm, layers.1.post_attention_layernorm)" in blind.message
    assert _hint(blind, "layers.1.post_attention_layernorm") == "names suggest it feeds the gated MLP layers.1.mlp"
    assert _hint(blind, "layers.1.input_layernorm") == "names suggest no gated MLP reads it"
    report = detect_gating(model, names_of(model), example_input=X)
    assert report.gated and report.unpaired_gated_mlps == ()
    assert set(report.pairings) == {"layers.0.post_attention_layernorm", "layers.1.post_attention_layernorm"}
    p = report.pairings["layers.1.post_attention_layernorm"]
    assert (p.mlp, p.gate, p.up, p.down) == (
        "layers.1.mlp",
        "layers.1.mlp.gate_proj",
        "layers.1.mlp.up_proj",
        "layers.1.mlp.down_proj",
    )
    assert (p.fused, p.activation, p.source) == (False, "silu", "trace")
    assert report.message.startswith("gated MLP after DyT: yes (layers.0.post_attention_layernorm -> layers.0.mlp")
    assert report.to_dict()["pairings"]["layers.0.post_attention_layernorm"]["gate"] == "layers.0.mlp.gate_proj"
    assert detect_gating(model, names_of(model)) == report  # a forward traced before is read: no more "unknown"


def test_meta_w1_w2_w3_with_ffn_norm():
    model = MetaBlock()
    assert (
        _hint(detect_gating(model, names_of(model)), "ffn_norm") == "names suggest it feeds the gated MLP feed_forward"
    )
    p = detect_gating(model, names_of(model), example_input=X).pairings["ffn_norm"]
    assert (p.gate, p.up, p.down, p.activation) == ("feed_forward.w1", "feed_forward.w3", "feed_forward.w2", "silu")


def test_t5_geglu_wi0_wi1_wo_single_norm_in_ff_layer():
    model = T5Block()
    report = detect_gating(model, names_of(model), example_input=X)
    p = report.pairings["layer.1.layer_norm"]
    assert (p.mlp, p.gate, p.up, p.down) == (
        "layer.1.DenseReluDense",
        "layer.1.DenseReluDense.wi_0",
        "layer.1.DenseReluDense.wi_1",
        "layer.1.DenseReluDense.wo",
    )
    assert p.activation == "gelu_tanh" and "layer.0.0" not in report.pairings


def test_fused_gate_up_proj():
    model = nn.ModuleDict({"layer": Phi3Layer()})
    p = detect_gating(model, names_of(model), example_input=X, forward_fn=lambda m, x: m["layer"](x)).pairings[
        "layer.post_attention_layernorm"
    ]
    assert (p.gate, p.up, p.down, p.fused) == ("layer.mlp.gate_up_proj", None, "layer.mlp.down_proj", True)


class Gemma2Layer(HFLayer):  # four norms: post_attention_layernorm is applied to the attention output, before the add
    def __init__(self):
        super().__init__()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = DyT(D), DyT(D)

    def forward(self, x):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x)))
        h = self.pre_feedforward_layernorm(x)
        return x + self.post_feedforward_layernorm(self.mlp(h))


def test_gemma2_the_norm_whose_output_the_mlp_reads_is_paired_not_the_one_its_name_suggests():
    model = Gemma2Layer()
    blind = detect_gating(model, names_of(model))
    assert blind.gated is None and "names suggest yes (pre_feedforward_layernorm)" in blind.message
    report = detect_gating(model, names_of(model), example_input=X)
    assert list(report.pairings) == ["pre_feedforward_layernorm"], report.message


class ReorderedLayer(HFLayer):  # a config flag picks pre- or post-norm: names and source cannot say which runs
    def __init__(self, post_norm: bool):
        super().__init__()
        self.post_norm = post_norm

    def forward(self, x):
        if self.post_norm:
            x = x + self.input_layernorm(self.self_attn(x))
            return x + self.post_attention_layernorm(self.mlp(x))
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


@pytest.mark.parametrize("post_norm", [True, False])
def test_a_flag_that_reorders_the_norms_is_read_from_the_forward_never_from_the_source(post_norm):
    model = ReorderedLayer(post_norm)
    blind = detect_gating(model, names_of(model))
    assert blind.gated is None and "suggest it feeds" not in _hint(blind, "post_attention_layernorm")
    report = detect_gating(model, names_of(model), example_input=X)
    assert report.gated is (not post_norm) and list(report.pairings) == (
        [] if post_norm else ["post_attention_layernorm"]
    )
    if post_norm:  # the norm's output reaches the MLP only through the residual addition
        assert report.unpaired_gated_mlps == ("mlp",) and "gated MLPs fed otherwise: mlp" in report.message


def test_wrapped_model_uses_discovery_names():
    wrapper = nn.Module()
    wrapper._orig_mod = HFModel(n=1)  # what torch.compile registers
    # discovery's DyT layers, stripped
    report = detect_gating(wrapper, example_input=X, forward_fn=lambda m, x: m._orig_mod(x))
    assert list(report.pairings) == ["layers.0.post_attention_layernorm"]
    assert (
        gate_linear_modules(wrapper, report)["layers.0.post_attention_layernorm"].gate
        is wrapper._orig_mod.layers[0].mlp.gate_proj
    )


def test_the_forward_source_hints_what_norm_names_cannot():
    model = OpaqueBlock(HFMLP())  # norms n_a / n_b: the names say nothing, `x + self.ff(self.n_a(x))` does
    report = detect_gating(model, names_of(model))
    assert report.gated is None and _hint(report, "n_a") == "names suggest it feeds the gated MLP ff"


_NO_SOURCE = {}
exec(
    compile(  # a block whose forward has no source satmon can read (defined from a string)
        "def forward(self, x):\n    x = x + self.mix(self.n_b(x))\n    return x + self.ff(self.n_a(x))\n",
        "<generated>",
        "exec",
    ),
    _NO_SOURCE,
)


class SourcelessBlock(OpaqueBlock):
    forward = _NO_SOURCE["forward"]


def test_unpairable_gated_mlp_is_unknown_not_guessed():
    model = SourcelessBlock(HFMLP())
    report = detect_gating(model, names_of(model))
    assert report.gated is None and report.pairings == {}
    assert _hint(report, "n_a") == (
        "names suggest: ff is a gated MLP that receives an input satmon cannot follow (no forward "
        "source, no telling norm names); watched layers near it: n_a, n_b (names and source only: no traced forward)"
    )
    assert "gating_mapping={'n_a': '<gated MLP module>'}" in report.message
    assert detect_gating(model, names_of(model), example_input=X).pairings["n_a"].source == "trace"


def test_trace_pairs_what_names_cannot():
    model = OpaqueBlock(HFMLP())
    report = detect_gating(model, names_of(model), example_input=X)
    assert list(report.pairings) == ["n_a"] and report.pairings["n_a"].source == "trace"
    assert model.training  # the trace restored the mode


def test_mapping_with_opaque_names_and_gate_up_order():
    model = OpaqueBlock(OpaqueMLP())
    unasked = detect_gating(model, names_of(model))  # opaque names: unknown, never "no"
    assert unasked.gated is None and "ff may be a gated MLP (its forward multiplies two projections" in unasked.message
    assert "its input is the output of n_a" in unasked.unclassified["n_a"]
    report = detect_gating(model, names_of(model), mapping={"n_a": "ff"})
    p = report.pairings["n_a"]
    assert (p.source, p.gate, p.up, p.down) == ("mapping", "ff.a", "ff.b", "ff.c")
    assert report.gated is True and "registration order" in report.message and set(report.unclassified) == {"n_b"}
    verified = detect_gating(model, names_of(model), mapping={"n_a": "ff"}, example_input=X).pairings["n_a"]
    assert (verified.gate, verified.up, verified.activation) == ("ff.b", "ff.a", "silu")


def test_mapping_overrides_names():
    model = HFModel(n=1)
    report = detect_gating(model, names_of(model), mapping={"layers.0.input_layernorm": "layers.0.mlp"})
    assert list(report.pairings) == ["layers.0.input_layernorm"] and report.unpaired_gated_mlps == ()
    everything = {n: None for n in names_of(model)} | {"layers.0.input_layernorm": "layers.0.mlp"}
    assert detect_gating(model, names_of(model), mapping=everything).gated is True  # the user's word, no forward needed


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ({"nope": "ff"}, "Expected mapping keys to name norm modules, got 'nope'. Available norm-like modules: n_a"),
        (
            {"n_a": "nope"},
            r"Expected mapping values to name MLP modules, got 'nope'. Available gated MLPs: ff. \(None: the",
        ),
        ({"n_a": "mix"}, r"Expected mapping value 'mix' to be a gated MLP.*Available gated MLPs: ff\."),
    ],
)
def test_mapping_errors(mapping, match):
    model = OpaqueBlock(HFMLP())
    with pytest.raises(ValueError, match=match):
        detect_gating(model, names_of(model), mapping=mapping)


def test_unknown_norm_name_errors():
    with pytest.raises(
        ValueError,
        match="Expected `norm_names` to name modules of the model, got 'ln_3'. Available norm-like modules: ln_1, ln_2",
    ):
        detect_gating(GPT2Block(), ["ln_3"])


def test_non_gated_gelu_mlp():
    model = GPT2Block()
    plain = detect_gating(model, names_of(model))  # no forward: "no" is never said on names alone
    assert plain.gated is None and "names suggest no gated MLP)" in plain.message
    report = detect_gating(model, names_of(model), example_input=X)
    assert (
        report.gated is False
        and report.pairings == {}
        and report.message == "gated MLP after DyT: no (a traced forward shows no gated MLP)"
    )


def test_moe_experts_pair_with_the_block_norm():
    model = MixtralLayer()  # no forward to run: the names hint only
    report = detect_gating(model, names_of(model))
    assert report.gated is None and _hint(report, "post_attention_layernorm") == (
        "names suggest it feeds the gated MLP block_sparse_moe.experts.0"
    )


def test_mlp_fed_by_an_unmonitored_norm_is_not_paired():
    model = HFModel(n=1)
    report = detect_gating(model, ["layers.0.input_layernorm", "norm"], example_input=X)
    assert report.gated is False and report.pairings == {} and report.unpaired_gated_mlps == ("layers.0.mlp",)
    assert "no DyT feeding a gated MLP directly; gated MLPs fed otherwise: layers.0.mlp" in report.message


def test_a_watched_layer_the_forward_did_not_run_is_unknown():
    class Skips(HFModel):
        def forward(self, x):
            return self.norm(self.layers[0].self_attn(x))  # no layer's norms run

    model = Skips(n=1)
    report = detect_gating(model, names_of(model), example_input=X)
    assert report.gated is None and report.unclassified["layers.0.post_attention_layernorm"] == (
        "it did not run in the traced forward, so its data flow was not seen"
    )


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_llama_lm(mlp):
    model = LlamaLM(vocab_size=32, d_model=D, n_layers=2, n_heads=2, seq_len=8, mlp=mlp)
    idx = torch.randint(0, 32, (2, 8))
    assert detect_gating(model).gated is None
    report = detect_gating(model, example_input=idx)
    if mlp == "gelu":
        assert report.gated is False and report.pairings == {}
        return
    assert set(report.pairings) == {"blocks.0.mlp_norm", "blocks.1.mlp_norm"}
    p = report.pairings["blocks.0.mlp_norm"]
    assert (p.gate, p.up, p.down, p.activation, p.source) == (
        "blocks.0.mlp.gate_proj",
        "blocks.0.mlp.up_proj",
        "blocks.0.mlp.down_proj",
        "silu",
        "trace",
    )


def test_gate_linear_modules_feed_gate_stats():
    torch.manual_seed(0)
    model = LlamaLM(vocab_size=32, d_model=D, n_layers=2, n_heads=2, seq_len=8)
    idx = torch.randint(0, 32, (2, 8))
    mods = gate_linear_modules(model, detect_gating(model, example_input=idx))
    captured = {}
    handles = [
        m.gate.register_forward_hook(lambda _m, _i, o, n=n: captured.setdefault((n, "g"), o)) for n, m in mods.items()
    ]
    handles += [
        m.up.register_forward_hook(lambda _m, _i, o, n=n: captured.setdefault((n, "u"), o)) for n, m in mods.items()
    ]
    with torch.no_grad():
        model(idx)
    for h in handles:
        h.remove()
    h_in = model.blocks[0].mlp_norm(
        model.tok_emb(idx) + model.blocks[0].attn(model.blocks[0].attn_norm(model.tok_emb(idx)))
    )
    torch.testing.assert_close(captured[("blocks.0.mlp_norm", "g")], model.blocks[0].mlp.gate_proj(h_in))
    stats = gate_stats(
        captured[("blocks.0.mlp_norm", "g")], captured[("blocks.0.mlp_norm", "u")], mods["blocks.0.mlp_norm"].activation
    )
    assert 0 <= stats["flat_fraction"] <= 1 and stats["mean_abs_hidden"] > 0
