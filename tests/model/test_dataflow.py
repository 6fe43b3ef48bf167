"""Gated-MLP detection from the data flow (satmon.model.dataflow through detect_gating's example_input):
unusual names, fused and GLU gates, experts inside one module, unclassifiable products, failures."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_gating import D, GPT2Block, H, HFModel, T5Block, X, names_of
from torch import nn

from satmon import DyT
from satmon.batches import feed_first
from satmon.convert import convert_to_dyt
from satmon.model.gating import detect_gating, gate_linear_modules
from satmon.results.verdict import GatingInfo, LayerCounts, build_verdict
from third_party import BilinearBlock, OddGatedBlock, UserLM

IDX = torch.arange(16).reshape(2, 8) % 64


def _dyt_user_lm(block: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return convert_to_dyt(UserLM(block), alpha_init=1.0)


def test_unusual_names_are_found_from_the_data_flow():
    model = _dyt_user_lm(OddGatedBlock)  # norms pre/post, projections proj_g/proj_u/proj_d
    report = detect_gating(model, example_input=IDX)
    assert report.gated is True and set(report.pairings) == {"stack.0.post", "stack.1.post"}
    p = report.pairings["stack.1.post"]
    assert (p.mlp, p.gate, p.up, p.down) == ("stack.1", "stack.1.proj_g", "stack.1.proj_u", "stack.1.proj_d")
    assert (p.fused, p.activation, p.source, p.gate_stats) == (False, "silu", "trace", True)
    # without a batch to trace, the names say nothing: the answer is "unknown", never "no"
    blind = detect_gating(_dyt_user_lm(OddGatedBlock))
    assert blind.gated is None and blind.pairings == {}
    assert (
        "names suggest: stack.0.post: stack.0 may be a gated MLP (its forward multiplies two projections"
        in blind.message
    )
    assert (
        "its input is the output of stack.0.post" in blind.message and "gating_mapping={'stack.0.post'" in blind.message
    )
    # and the study's rule then flags the model (before: GO at 0.85 saturation)
    counts = {"stack.0.post": LayerCounts(85, 100)}
    for r, decision, risk in ((report, "no-go", True), (blind, "go", None)):
        v = build_verdict(counts, step=1, gating=GatingInfo(r.gated, tuple(r.pairings), r.message))
        assert (v.decision, v.collapse_risk) == (decision, risk)
    assert (
        "Gated MLP after DyT: unknown (gated MLP after DyT: unknown (no forward was traced"
        in build_verdict(counts, step=1, gating=GatingInfo(blind.gated, (), blind.message)).card()
    )


def test_a_product_satmon_cannot_classify_is_unknown_and_mapping_resolves_it():
    model = _dyt_user_lm(BilinearBlock)  # proj_g(h) * proj_u(h), no activation
    report = detect_gating(model, example_input=IDX)
    assert (
        report.gated is None and report.pairings == {} and set(report.unclassified) == {"stack.0.post", "stack.1.post"}
    )
    assert report.message == (
        "gated MLP after DyT: unknown: stack.0.post: its output reaches an element-wise product in stack.0 that is not "
        "act(gate) * up (neither factor passed through an activation) (and 1 more layer(s)); pass "
        "gating_mapping={'stack.0.post': '<gated MLP module>'} if it feeds a gated MLP, or "
        "{'stack.0.post': None} if not"
    )
    assert detect_gating(model, mapping={"stack.0.post": None, "stack.1.post": None}, example_input=IDX).gated is False
    mapped = detect_gating(model, mapping={"stack.0.post": "stack.0", "stack.1.post": None}, example_input=IDX)
    assert (
        mapped.gated is True
        and mapped.pairings["stack.0.post"].source == "mapping"
        and "stack.1.post" not in mapped.unclassified
    )


class _Fused(nn.Module):
    def __init__(self, gate_first: bool = True, glu: bool = False):
        super().__init__()
        self.norm, self.fc_in, self.fc_out = DyT(D), nn.Linear(D, 2 * H), nn.Linear(H, D)
        self.gate_first, self.glu = gate_first, glu

    def forward(self, x):
        h = self.fc_in(self.norm(x))
        if self.glu:
            return self.fc_out(F.glu(h, dim=-1))  # first half * sigmoid(second half)
        a, b = h.chunk(2, dim=-1)
        g, u = (a, b) if self.gate_first else (b, a)
        return self.fc_out(F.gelu(g) * u)


@pytest.mark.parametrize(
    ("kw", "gate_first", "activation"),
    [({}, True, "gelu"), ({"gate_first": False}, False, "gelu"), ({"glu": True}, False, "sigmoid")],
)
def test_fused_gate_up_in_either_order_and_glu(kw, gate_first, activation):
    model = _Fused(**kw)
    report = detect_gating(model, ["norm"], example_input=X)
    p = report.pairings["norm"]
    assert (p.gate, p.up, p.down, p.fused, p.gate_first, p.activation) == (
        "fc_in",
        None,
        "fc_out",
        True,
        gate_first,
        activation,
    )
    assert gate_linear_modules(model, report)["norm"].gate_first is gate_first


class _MoE(nn.Module):  # experts as 3-D weights inside one module (recent transformers' MoE layout)
    def __init__(self):
        super().__init__()
        self.norm = DyT(D)
        self.gate_up = nn.Parameter(torch.randn(2, 2 * H, D) / 4)
        self.down = nn.Parameter(torch.randn(2, D, H) / 4)

    def forward(self, x):
        h, out = self.norm(x), 0
        for e in range(2):
            g, u = F.linear(h, self.gate_up[e]).chunk(2, dim=-1)
            out = out + 0.5 * F.linear(F.silu(g) * u, self.down[e])
        return out


def test_experts_inside_one_module_are_gated_but_give_no_gate_statistics():
    report = detect_gating(_MoE(), ["norm"], example_input=X)
    p = report.pairings["norm"]
    assert report.gated is True and p.source == "trace" and p.gate_stats is False
    assert gate_linear_modules(_MoE(), report) == {}


def test_feed_first_batches_and_a_failing_trace_never_crash():
    model = _dyt_user_lm(OddGatedBlock)
    report = detect_gating(model, example_input=(IDX, IDX), forward_fn=feed_first)
    assert report.gated is True and report.pairings["stack.0.post"].source == "trace"
    # model(x, y): TypeError inside the trace
    broken = detect_gating(_dyt_user_lm(OddGatedBlock), example_input=(IDX, IDX))
    assert broken.gated is None and "the traced forward failed (TypeError" in broken.message
    named = HFModel(n=1)
    fallback = detect_gating(named, names_of(named), example_input="not a tensor")  # names only hint, never answer
    assert fallback.gated is None and fallback.pairings == {} and "the traced forward failed" in fallback.message
    assert "names suggest yes (layers.0.post_attention_layernorm)" in fallback.message


def test_trace_leaves_the_model_as_it_was():
    model = _dyt_user_lm(OddGatedBlock).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks_before = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    detect_gating(model, example_input=IDX)
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == hooks_before


def test_written_out_activations_are_not_gates():
    class NewGELU(nn.Module):  # GPT-2's gelu_new, written out: x * (1 + tanh(...)) is one branch times itself
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))

    block = GPT2Block()
    block.mlp.gelu = NewGELU()
    assert detect_gating(block, names_of(block), example_input=X).gated is False
    t5 = T5Block()
    t5.layer[1].DenseReluDense.act = NewGELU()  # T5 v1.1 GeGLU with gelu_new: gated, activation from the module
    p = detect_gating(t5, names_of(t5), example_input=X).pairings["layer.1.layer_norm"]
    assert (p.source, p.gate, p.activation) == ("trace", "layer.1.DenseReluDense.wi_0", "gelu_tanh")


def test_compiled_model_is_traced_eagerly_under_its_stripped_names():
    model = HFModel(n=1)
    compiled = torch.compile(model, backend="eager")
    report = detect_gating(compiled, example_input=X)
    p = report.pairings["layers.0.post_attention_layernorm"]
    assert (p.source, p.gate) == ("trace", "layers.0.mlp.gate_proj")
