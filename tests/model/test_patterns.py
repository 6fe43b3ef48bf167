"""Every structural pattern of issue 19 through the public API, each against the truth of the hand-written
model: gains under other names, the point-wise family, channels-first norms, post-norm, parallel residual,
fused and chunked gated MLPs, the names fallback and the user's mapping."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from lookalikes import (
    ChunkedGLU,
    ConvNet,
    D,
    Derf,
    GammaBetaLN,
    HardTanhNorm,
    MeanOverChannels,
    ParallelBlock,
    PermuteLayerNorm,
    PostNormBlock,
    PreNormBlock,
    RMSNormG,
    ScaleNorm,
    SharedNormBlock,
    ShiftedTanh,
    SigmoidNorm,
    Squash,
    Stack,
)
from torch import nn

from satmon import DyT, Screen, convert_to_dyt, find_dyt_layers, find_norm_layers, probe
from satmon.model.affine import effective_affine
from satmon.model.gating import detect_gating
from satmon.model.map import model_map
from satmon.results.verdict import LayerCounts, build_verdict

X = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(0))


def _randomise(module: nn.Module, seed: int = 1) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return module


# ----------------------------------------------------------------------------- gains under any name
@pytest.mark.parametrize(
    ("make", "kind", "gain"),
    [(RMSNormG, "rmsnorm", "g"), (ScaleNorm, "rmsnorm", "scale"), (GammaBetaLN, "layernorm", "gamma")],
)
def test_a_gain_under_any_name_is_found_read_and_converted(make, kind, gain):
    model = nn.Sequential(nn.Linear(D, D), _randomise(make()))
    (layer,) = find_norm_layers(model)
    assert (layer.name, layer.kind, layer.channels, layer.axis) == ("1", kind, D, -1)
    a = effective_affine(model[1])
    want = getattr(model[1], gain).detach().double()
    assert a.exact and a.note.startswith(f"gain = {gain}") and torch.equal(a.gain, want)
    x = torch.randn(4, D)
    ref = model(x).detach()
    convert_to_dyt(model, rmsnorm=True, copy_affine=True, alpha_init=1e-3)
    assert isinstance(model[1], DyT) and torch.equal(model[1].weight.detach().double(), want)
    # the converted layer is w * tanh(alpha * x) + b with the norm's own gain and bias
    h = model[0](x)
    b = model[1].bias if model[1].bias is not None else 0.0
    torch.testing.assert_close(model(x), model[1].weight * torch.tanh(1e-3 * h) + b)
    assert ref.shape == model(x).shape


def test_convert_warns_when_it_converts_nothing_and_says_what_the_model_holds():
    model = nn.Sequential(nn.Linear(D, D), RMSNormG(), nn.Linear(D, D), RMSNormG())
    with pytest.warns(UserWarning, match=r"converted nothing: the model holds 2 RMSNorm .* Pass rmsnorm=True"):
        convert_to_dyt(model)
    assert isinstance(model[1], RMSNormG)
    with pytest.warns(UserWarning, match="converted nothing: the model holds no normaliser satmon recognises"):
        convert_to_dyt(nn.Sequential(nn.Linear(D, D), nn.ReLU()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert_to_dyt(model, rmsnorm=True)
    assert all(isinstance(m, DyT) for m in (model[1], model[3]))


def test_include_labels_the_kind_by_what_the_module_computes():
    model = nn.Sequential(nn.Linear(D, D), Squash(), nn.Linear(D, D))
    assert find_norm_layers(model) == []  # parameterless, nothing says "norm": not run without being asked
    (layer,) = find_norm_layers(model, include=r"^1$")
    assert (layer.name, layer.kind) == ("1", "rmsnorm")  # not "layernorm" (0.2 labelled every include= that way)
    with pytest.warns(UserWarning, match=r"include= selects '2' \(Linear\), which computes neither"):
        assert find_norm_layers(model, include=r"^2$") == []


# ----------------------------------------------------------------------------- the point-wise family
@pytest.mark.parametrize(
    ("make", "function", "shift"),
    [
        (lambda: DyT(D), "tanh", None),
        (lambda: Derf(D), "erf", "s"),
        (lambda: Derf(D, per_channel_shift=True), "erf", "s"),
        (lambda: HardTanhNorm(D), "hardtanh", None),
        (lambda: ShiftedTanh(D), "tanh", "bias_in"),
    ],
)
def test_point_wise_layers_are_found_by_their_function_and_shift(make, function, shift):
    for trained in (False, True):
        layer = make()
        if trained:
            _randomise(layer)  # trained values (a shift away from 0, gains not ones) read the same
        (found,) = find_dyt_layers(nn.Sequential(nn.Linear(D, D), layer))
        assert (found.kind, found.function, found.shift, found.channels, found.basis in ("behaviour", "type")) == (
            "dyt",
            function,
            shift,
            D,
            True,
        )
    # its gain and bias are read against f(alpha * x + s) with the layer's own alpha and shift
    a = effective_affine(layer)
    assert a.kind == "dyt" and a.exact and a.residual < 1e-12


def test_bounded_layers_that_are_not_in_the_family_are_not_taken_for_dyt():
    assert find_dyt_layers(nn.Sequential(SigmoidNorm(D))) == []


# ----------------------------------------------------------------------------- channels-first
@pytest.mark.parametrize("norm", [PermuteLayerNorm, MeanOverChannels])
@pytest.mark.parametrize("width", [5, 8])  # W != C, and W == C (where a channels-last DyT silently used W)
def test_channels_first_layernorm_is_converted_per_channel(norm, width):
    torch.manual_seed(0)
    model = _randomise(ConvNet(8, norm))
    layers = find_norm_layers(model)
    assert [(l.name, l.kind, l.channels, l.axis) for l in layers] == [
        ("n1", "layernorm", 8, 1),
        ("n2", "layernorm", 8, 1),
    ]
    gains = {l.name: l.module.weight.detach().clone() for l in layers}
    biases = {l.name: l.module.bias.detach().clone() for l in layers}
    assert torch.equal(effective_affine(model.n1).gain, gains["n1"].double())
    convert_to_dyt(model, copy_affine=True, alpha_init=0.7)
    assert all(isinstance(m, DyT) and not m.channels_last for m in (model.n1, model.n2))
    x = torch.randn(2, 3, 6, width)
    h = model.stem(x)  # (B, C, H, W)
    want = gains["n1"][:, None, None] * torch.tanh(0.7 * h) + biases["n1"][:, None, None]
    torch.testing.assert_close(model.n1(h), want)  # per channel over C, whatever W is
    assert [(l.kind, l.axis) for l in find_norm_layers(model)] == [("dyt", 1), ("dyt", 1)]


def test_the_probe_reads_a_channels_first_layernorm_over_its_channels():
    torch.manual_seed(0)
    model = _randomise(ConvNet(8, PermuteLayerNorm))
    report = probe(model, [torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)])
    for name in ("n1", "n2"):
        r = report.layers[name]
        assert (r.dim, r.tokens, r.norm_type, r.note) == (8, 64, "layernorm-like", "")  # 2 x 2 x 4 x 4 positions
        assert r.alignment >= 0.9999
    few = probe(model, torch.randn(1, 3, 2, 2))  # 4 positions for 8 channels: a covariance of rank 3 < 8
    r = few.layers["n1"]
    assert r.tokens == 4 and r.norm_type == "undetermined" and "4 token(s) for 8 channels" in r.note
    # no alignment is reported as a number there: the layer says how many tokens it needs (JSON, summary, tags)
    assert (r.alignment, r.null_projection, r.null_dim, r.depth_diag, r.kernel_alignment()) == (None,) * 5
    assert "it needs more than 8 tokens (at least 5 more" in r.note and r.to_dict()["alignment"] is None
    assert r.to_dict()["note"] == r.note and "n1" not in few.summary()
    from satmon.io.tensorboard import probe_scalars

    assert not any(tag.startswith("satmon_deadir/n1/") for tag in probe_scalars(few))


# ----------------------------------------------------------------------------- post-norm, parallel, shared
def _dyt(block, **kw):
    torch.manual_seed(0)
    return Stack(lambda: block(lambda d: DyT(d, alpha_init=kw.get("alpha", 0.5))), norm=lambda d: DyT(d))


def test_post_norm_is_not_gated_and_the_override_is_effective():
    model = _dyt(PostNormBlock)
    traced = detect_gating(model, example_input=X)
    assert traced.gated is False and traced.pairings == {}
    assert traced.unpaired_gated_mlps == ("blocks.0.mlp", "blocks.1.mlp")  # gated MLPs, fed by an addition
    assert {l.name: l.feeds for l in model_map(model).norms if l.block} == {
        f"blocks.{i}.{n}": ("residual",) for i in range(2) for n in ("norm_a", "norm_f")
    }
    # without a forward: unknown, never yes, the hint naming the norm that runs just before the MLP and the option
    blind = detect_gating(_dyt(PostNormBlock))
    assert blind.gated is None and blind.message.startswith("gated MLP after DyT: unknown (no forward was traced")
    assert (
        "names suggest: blocks.0.norm_a: blocks.0.mlp is a gated MLP that receives an addition of streams"
        in blind.message
    )
    assert "gating_mapping={'blocks.0.norm_a': '<gated MLP module>'}" in blind.message
    none = {l.name: None for l in find_dyt_layers(model)}
    cleared = detect_gating(model, mapping=none)
    assert (
        cleared.gated is False
        and cleared.message == "gated MLP after DyT: no (gating_mapping maps every layer to None)"
    )
    v = build_verdict({n: LayerCounts(60, 100) for n in none}, step=1, gating=cleared)
    assert v.decision == "go" and v.collapse_risk is False  # 0.6 >= 0.43: GO, no collapse semantics


def test_a_saturated_post_norm_model_screens_go_not_collapse():
    model = _dyt(PostNormBlock, alpha=50.0)
    screen = Screen(window=2, verbose=False, watch_every_n_steps=0, warn=lambda m: None).attach(model, example_input=X)
    for _ in range(2):
        model(torch.randn(2, 6, D) * 3.0).sum()
        screen.step()
    v = screen.verdict
    assert v.saturation >= 0.5 and v.gated is False and v.collapse_risk is False and v.decision == "go"


def test_a_mapping_is_checked_against_the_model_and_the_trace():
    model = _dyt(PostNormBlock)
    with pytest.raises(
        ValueError,
        match=r"Expected mapping values to name MLP modules, got 'blocks.9.mlp'. Available gated MLPs: blocks.0.mlp, "
        r"blocks.1.mlp",
    ):
        detect_gating(model, mapping={"blocks.0.norm_a": "blocks.9.mlp"})
    with pytest.raises(
        ValueError,
        match=r"Expected mapping value 'blocks.0.attn' to be a gated MLP.*Available gated MLPs: blocks.0.mlp",
    ):
        detect_gating(model, mapping={"blocks.0.norm_a": "blocks.0.attn"})
    with pytest.raises(ValueError, match=r"Expected mapping keys to name norm modules, got 'blocks.0.mlp'"):
        detect_gating(model, mapping={"blocks.0.mlp": None})
    # the advice "norm_a feeds the next block's MLP" is refused when a traced forward shows otherwise
    with pytest.raises(ValueError, match=r"no projection of blocks.1.mlp reads blocks.0.norm_a's output directly"):
        detect_gating(model, mapping={"blocks.0.norm_a": "blocks.1.mlp"}, example_input=X)


@pytest.mark.parametrize(
    ("block", "gated", "feeds"),
    [
        (ParallelBlock, ("blocks.0.ln_m", "blocks.1.ln_m"), {"ln_a": ("attention",), "ln_m": ("gated-mlp",)}),
        (SharedNormBlock, ("blocks.0.ln", "blocks.1.ln"), {"ln": ("attention", "gated-mlp")}),
        (
            lambda n: PreNormBlock(n),
            ("blocks.0.norm_2", "blocks.1.norm_2"),
            {"norm_1": ("attention",), "norm_2": ("gated-mlp",)},
        ),
    ],
)
def test_parallel_shared_and_pre_norm_blocks_pair_the_norm_whose_output_the_mlp_reads(block, gated, feeds):
    blind = detect_gating(_dyt(block))  # no forward: the names and sources hint the same pairing, as a hint
    assert blind.gated is None and all(
        blind.unclassified[n].endswith(f"feeds the gated MLP {n.rpartition('.')[0]}.mlp") for n in gated
    ), blind.message
    model = _dyt(block)
    report = detect_gating(model, example_input=X)
    assert report.gated is True and report.gated_layers == gated, report.message
    assert all(p.source == "trace" and p.mlp == n.rpartition(".")[0] + ".mlp" for n, p in report.pairings.items())
    got = {l.name.rpartition(".")[2]: l.feeds for l in model_map(model).norms if l.block == "blocks.0"}
    assert got == feeds


# ----------------------------------------------------------------------------- without a forward: the names hint
def test_a_chunked_gated_mlp_is_never_not_gated_and_the_feeding_norm_is_named():
    model = _dyt(lambda n: PreNormBlock(n, mlp=ChunkedGLU))
    traced = detect_gating(model, example_input=X)
    assert traced.gated is True and traced.gated_layers == ("blocks.0.norm_2", "blocks.1.norm_2")
    p = traced.pairings["blocks.0.norm_2"]
    assert (p.gate, p.fused, p.gate_first, p.activation) == ("blocks.0.mlp.w_in", True, True, "gelu")
    # no batch: the source shows a chunked product
    blind = detect_gating(_dyt(lambda n: PreNormBlock(n, mlp=ChunkedGLU)))
    assert blind.gated is None and "names suggest: blocks.0.norm_2: blocks.0.mlp may be a gated MLP" in blind.message
    assert "its input is the output of blocks.0.norm_2" in blind.unclassified["blocks.0.norm_2"]  # norm_2, not norm_1
    resolved = detect_gating(model, mapping={"blocks.0.norm_2": "blocks.0.mlp", "blocks.1.norm_2": "blocks.1.mlp"})
    assert resolved.gated is True and resolved.pairings["blocks.0.norm_2"].fused


def test_a_sourceless_chunked_mlp_is_unknown_by_its_shapes():
    ns: dict = {}
    # no source to read
    exec("def forward(self, x):\n    a, b = self.w_in(x).chunk(2, dim=-1)\n    return self.w_out(a * b)\n", ns)
    opaque = type("OpaqueGLU", (ChunkedGLU,), {"forward": ns["forward"]})
    model = _dyt(lambda n: PreNormBlock(n, mlp=opaque))
    blind = detect_gating(model)
    assert blind.gated is None
    assert (
        "blocks.0.mlp may be a gated MLP (a projection twice as wide as its down projection; no forward source"
        in blind.message
    )


def test_a_model_that_multiplies_two_projections_anywhere_is_unknown_without_a_trace():
    class Bilinear(nn.Module):  # x * y of two projections, no activation, no down projection
        def __init__(self):
            super().__init__()
            self.p, self.r = nn.Linear(D, D), nn.Linear(D, D)

        def forward(self, x):
            return self.p(x) * self.r(x)

    model = _dyt(lambda n: PreNormBlock(n, mlp=Bilinear))
    blind = detect_gating(model)
    assert (
        blind.gated is None
        and "blocks.0.mlp may be a gated MLP (its forward multiplies two projections" in blind.message
    )
    traced = detect_gating(model, example_input=X)  # the trace: a product of two branches that is not act(gate) * up
    assert traced.gated is None and "neither factor passed through an activation" in traced.message


def test_a_layer_whose_kernel_takes_only_its_own_dtype_is_read_in_that_dtype():
    class Float32Only(RMSNormG):  # a fused kernel written for one dtype (Triton, apex): float64 is refused
        def forward(self, x):
            if x.dtype != torch.float32:
                raise RuntimeError(f"kernel supports float32 only, got {x.dtype}")
            return super().forward(x)

    model = nn.Sequential(nn.Linear(D, D), _randomise(Float32Only()))
    (layer,) = find_norm_layers(model)
    assert (layer.kind, layer.channels, layer.basis) == ("rmsnorm", D, "behaviour")


def test_a_module_named_like_a_norm_that_cannot_run_is_unknown_not_dropped():
    class FusedLayerNorm(nn.Module):  # takes the residual as a second input: nothing satmon can make up
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D))

        def forward(self, x, residual):
            return F.layer_norm(x + residual, (D,), self.weight)

    class Net(nn.Module):
        def __init__(self, with_layernorm: bool):
            super().__init__()
            self.lin, self.fused = nn.Linear(D, D), FusedLayerNorm()
            self.ln = nn.LayerNorm(D) if with_layernorm else nn.Identity()

        def forward(self, x):
            return self.ln(self.fused(self.lin(x), x))

    m = model_map(Net(False))
    assert m.norms == () and "FusedLayerNorm could not be run on a copy of itself" in m.undetermined["fused"]
    with pytest.raises(
        ValueError, match=r"found none in Net \(1 module\(s\) look like normalisers but could not be read: fused"
    ):
        probe(Net(False), torch.randn(4, D))
    with pytest.warns(UserWarning, match=r"no reading for fused \(FusedLayerNorm could not be run"):
        report = probe(Net(True), torch.randn(32, D))
    assert list(report.layers) == ["ln"] and "named like a normaliser, kind unknown" in report.skipped["fused"]
