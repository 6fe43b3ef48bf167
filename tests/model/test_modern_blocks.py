"""Modern blocks built from scratch (tests/model/modern.py): gating read from a forward, checked against what each
block's forward computes (an independent hook: does the MLP's first projection read the norm's output itself?);
norms of any gain shape found and typed or named; conversion that never breaks a model."""

from __future__ import annotations

import warnings

import pytest
import torch
from modern import (
    HD,
    HEADS,
    LM,
    ChameleonLayerNorm,
    D,
    GatedRMSNorm,
    GatheredExperts,
    GeluMLP,
    GroupedExperts,
    JointNorm,
    L2Norm,
    LoopExperts,
    MixingNorm,
    PerHeadLayerNorm,
    PerHeadRMSNorm,
    PreNorm,
    RawGLU,
    ReorderedPostNorm,
    SSMBlock,
    SwiGLU,
)
from torch import Tensor, nn

import satmon
from reference import InputRecorder, pooled
from satmon import DyT, convert_to_dyt, find_norm_layers, probe
from satmon.convert import check_conversion, pending_conversion
from satmon.model.gating import detect_gating
from satmon.model.map import model_map

IDX = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))


def _dyt(block, seed: int = 0, alpha: float = 1.0) -> nn.Module:
    torch.manual_seed(seed)
    model = convert_to_dyt(LM(block), alpha_init=alpha)
    for m in model.modules():
        if isinstance(m, DyT):
            m.alpha.data.fill_(alpha)
    return model


def reads_directly(model: nn.Module, norm: nn.Module, consumer: nn.Module, batch: Tensor) -> bool:
    """The independent truth: every row ``consumer`` receives is a row of ``norm``'s output (views, casts and row
    gathers allowed; an addition with another stream is not). ``consumer`` reads its input as its first argument."""
    seen: dict[str, list[Tensor]] = {"norm": [], "in": []}
    hooks = [
        norm.register_forward_hook(lambda m, a, o: seen["norm"].append(o.detach().reshape(-1, o.shape[-1]))),
        consumer.register_forward_pre_hook(lambda m, a: seen["in"].append(a[0].detach().reshape(-1, a[0].shape[-1]))),
    ]
    with torch.no_grad():
        model(batch)
    for h in hooks:
        h.remove()
    if not seen["in"] or not seen["norm"]:
        return False
    rows = torch.cat(seen["norm"])
    return all(bool((x[:, None, :] - rows[None]).abs().amax(-1).min(1).values.max() == 0) for x in seen["in"] if len(x))


# ----------------------------------------------------------------------------- gated experts, gathered by the router
EXPERTS = {
    "W[e] + b[e]": lambda: GatheredExperts(bias=True),
    "W[e], no bias": lambda: GatheredExperts(bias=False),
    "index_select": lambda: GatheredExperts(gather="index_select"),
    "embedding of expert ids": lambda: GatheredExperts(gather="embedding"),
    "grouped_mm": GroupedExperts,
    "eager loop": LoopExperts,
}


@pytest.mark.parametrize("experts", EXPERTS)
def test_experts_gathered_by_the_router_are_gated_by_trace(experts):
    model = _dyt(lambda: PreNorm(DyT, EXPERTS[experts](), qk=None))
    block = model.blocks[0]
    first = block.mlp.router if experts != "eager loop" else block.mlp.experts[0]
    assert reads_directly(model, block.n2, first, IDX)  # the truth: the experts read the norm's output
    report = detect_gating(model, example_input=IDX)
    assert report.gated is True and report.gated_layers == ("blocks.0.n2", "blocks.1.n2"), report.message
    assert all(p.source == "trace" for p in report.pairings.values())
    assert {l.name: l.feeds for l in model_map(model).norms if l.block == "blocks.0"} == {
        "blocks.0.n1": ("attention",),
        "blocks.0.n2": ("gated-mlp",),
    }


def test_the_issues_case_reads_collapse_risk_not_go():
    """DyT at saturation 0.82 before gathered experts with a bias: collapse risk, NO-GO (before: GO, not gated)."""
    from satmon.results.verdict import LayerCounts, build_verdict

    model = _dyt(lambda: PreNorm(DyT, GatheredExperts(bias=True), qk=None))
    report = detect_gating(model, example_input=IDX)
    v = build_verdict({n: LayerCounts(82, 100) for n in report.gated_layers}, step=500, gating=report)
    assert (v.decision, v.collapse_risk, v.gated) == ("no-go", True, True)


def test_a_fused_glu_on_raw_parameters_is_gated_and_the_second_half_gates():
    model = _dyt(lambda: PreNorm(DyT, RawGLU(), qk=None))
    report = detect_gating(model, example_input=IDX)
    p = report.pairings["blocks.0.n2"]
    assert report.gated is True and (p.mlp, p.fused, p.gate_first, p.activation) == (
        "blocks.0.mlp",
        True,
        False,
        "gelu",
    )
    blind = detect_gating(_dyt(lambda: PreNorm(DyT, RawGLU(), qk=None)))  # no forward: never "no"
    assert blind.gated is None


@pytest.mark.parametrize("rope", ["buffer", "type_as", "to", "new", "complex"])
@pytest.mark.parametrize("qk", ["whole", "head"])
def test_qk_norm_and_rope_tables_leave_the_mlp_gating_known(rope, qk):
    """Rotary tables multiply by input-independent values (however they are cast): the q/k norms feed attention,
    the MLP norm the gated MLP; nothing is unknown."""
    model = _dyt(lambda: PreNorm(DyT, SwiGLU(), rope=rope, qk=qk))
    report = detect_gating(model, example_input=IDX)
    assert report.gated is True and report.unclassified == {} and report.gated_layers == ("blocks.0.n2", "blocks.1.n2")
    feeds = {l.name: l.feeds for l in model_map(model).norms if l.block == "blocks.0"}
    assert feeds["blocks.0.attn.q_norm"] == feeds["blocks.0.attn.k_norm"] == ("attention",)


@pytest.mark.parametrize("rope", ["buffer", "to", "complex"])
def test_a_reordered_post_norm_block_with_qk_norm_is_not_gated(rope):
    model = _dyt(lambda: ReorderedPostNorm(DyT, rope))
    block = model.blocks[0]
    assert not reads_directly(model, block.post_attn, block.mlp, IDX)  # the truth: the MLP reads x + norm(...)
    report = detect_gating(model, example_input=IDX)
    assert report.gated is False and report.pairings == {} and report.unclassified == {}, report.message
    assert report.unpaired_gated_mlps == ("blocks.0.mlp", "blocks.1.mlp")
    feeds = {l.name.rpartition(".")[2]: l.feeds for l in model_map(model).norms if l.block == "blocks.0"}
    assert feeds == {
        "q_norm": ("attention",),
        "k_norm": ("attention",),
        "post_attn": ("residual",),
        "post_ff": ("residual",),
    }


def test_a_non_gated_mlp_reads_no_with_a_trace_and_unknown_without():
    model = _dyt(lambda: PreNorm(DyT, GeluMLP()))
    assert detect_gating(_dyt(lambda: PreNorm(DyT, GeluMLP()))).gated is None  # names alone: never "no"
    assert detect_gating(model, example_input=IDX).gated is False


# ----------------------------------------------------------------------------- the live screen's first training forward
@pytest.mark.parametrize("experts", ["W[e] + b[e]", "grouped_mm"])
def test_the_screen_reads_gating_from_the_first_training_forward(experts):
    """No example_input and no extra forward: a plain loop's first forward is traced as it runs; the verdict applies
    the collapse rule, and the window's counts equal a float64 recount."""
    model = _dyt(lambda: PreNorm(DyT, EXPERTS[experts](), qk=None), alpha=30.0)
    check_conversion(model, IDX)  # what convert_to_dyt(example_input=...) does: the screen has no conversion to check
    forwards = []
    model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    screen = satmon.Screen(window=3, verbose=False, watch_every_n_steps=0).attach(model)
    assert screen.gating.gated is None and "no forward was traced" in screen.gating.message
    # the float64 reference of every forward but satmon's own traced ones
    rec = InputRecorder(
        model,
        [n for n, m in model.named_modules() if isinstance(m, DyT)],
        when=lambda mod: not satmon.model.dataflow.tracing(),
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(3):
        loss = model(torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(step))).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        screen.step(loss)
    assert len(forwards) == 3  # the three training forwards: none of satmon's own
    v = screen.verdict
    assert v.gated is True and v.gated_layers == ("blocks.0.n2", "blocks.1.n2") and v.saturation >= 0.5
    assert v.decision == "no-go" and v.collapse_risk is True
    counts = rec.counts()
    assert v.saturation == pytest.approx(pooled(counts), abs=1e-12) and set(v.per_layer) == set(counts)
    for name, (sat, total) in counts.items():
        assert v.per_layer[name] == pytest.approx(sat / total, abs=1e-12)


def test_a_training_step_that_calls_submodules_is_traced_to_the_end_of_the_step():
    class Lit(nn.Module):  # a LightningModule-like wrapper whose own forward never runs
        def __init__(self):
            super().__init__()
            self.lm = _dyt(lambda: PreNorm(DyT, SwiGLU(), qk=None))

    lit = Lit()
    screen = satmon.Screen(window=2, verbose=False, watch_every_n_steps=0).attach(lit)
    for _ in range(2):
        x = lit.lm.emb(IDX)  # the step calls the parts itself
        for b in lit.lm.blocks:
            x = b(x)
        screen.step(x.pow(2).mean())
    v = screen.verdict
    assert v.gated is True and v.gated_layers == ("lm.blocks.0.n2", "lm.blocks.1.n2") and v.risk


def test_a_first_forward_that_raises_is_not_read_the_next_one_is():
    model = _dyt(lambda: PreNorm(DyT, SwiGLU(), qk=None))
    screen = satmon.Screen(window=2, verbose=False, watch_every_n_steps=0).attach(model)
    with pytest.raises(IndexError):
        model(torch.full((2, 8), 99))  # out of the vocabulary
    for _ in range(2):
        screen.step(model(IDX).pow(2).mean())
    assert screen.verdict.gated is True


# ----------------------------------------------------------------------------- norms of any gain shape
@pytest.mark.parametrize(
    ("make", "kind", "channels", "shape"),
    [
        (PerHeadLayerNorm, "layernorm", HD, (HEADS, HD)),
        (ChameleonLayerNorm, "layernorm", HD, (HEADS, HD)),
        (PerHeadRMSNorm, "rmsnorm", HD, (HEADS, HD)),
        (JointNorm, "layernorm", None, (HEADS, HD)),
    ],
)
def test_a_norm_with_a_gain_per_head_is_found_and_typed(make, kind, channels, shape):
    model = nn.Sequential(nn.Linear(D, D), nn.Unflatten(-1, (HEADS, HD)), make())
    (layer,) = find_norm_layers(model)
    assert (layer.name, layer.kind, layer.channels, layer.gain_shape) == ("2", kind, channels, shape)


def test_a_module_named_like_a_norm_with_a_matrix_that_mixes_channels_is_named_not_dropped():
    m = model_map(nn.Sequential(nn.Linear(D, D), nn.Unflatten(-1, (HEADS, HD)), MixingNorm()))
    assert m.norms == () and "has a gain of shape (4, 4)" in m.undetermined["2"]


def test_per_head_qk_norms_in_a_model_are_found_probed_as_skipped_and_left_by_the_converter():
    torch.manual_seed(0)
    model = LM(lambda: PreNorm(nn.LayerNorm, SwiGLU(), qk="head"))
    for b in model.blocks:
        b.attn.q_norm, b.attn.k_norm = PerHeadLayerNorm(), ChameleonLayerNorm()
    layers = {l.name: l for l in find_norm_layers(model)}
    assert layers["blocks.0.attn.q_norm"].gain_shape == layers["blocks.0.attn.k_norm"].gain_shape == (HEADS, HD)
    with pytest.warns(UserWarning, match=r"per-head gamma\^-1 kernel\)\. Choose layers with") as said:
        report = probe(model, [torch.randint(0, 50, (8, 8))])
    assert not any("max_dim" in str(w.message) for w in said)  # raising max_dim would not give a reading
    assert "gain of shape (4, 4)" in report.skipped["blocks.0.attn.q_norm"]
    assert report.layers["blocks.0.attn.q_norm"].alignment is None
    with pytest.warns(UserWarning, match=r"left as they are: blocks.0.attn.q_norm \(its gain has shape \(4, 4\)"):
        convert_to_dyt(model, copy_affine=True)
    assert isinstance(model.blocks[0].n1, DyT) and isinstance(model.blocks[0].attn.q_norm, PerHeadLayerNorm)
    assert model(IDX).shape == (2, 8, D)
    assert detect_gating(model, example_input=IDX).gated is True  # the per-head norms are opaque: no unknown


# ----------------------------------------------------------------------------- conversion never breaks a model
def test_gated_and_parameterless_norms_are_left_and_named_in_one_warning_the_rest_converted():
    torch.manual_seed(0)
    model = LM(SSMBlock, norm=nn.RMSNorm)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        convert_to_dyt(model, rmsnorm=True, copy_affine=True)
    (w,) = [str(x.message) for x in got if "left as they are" in str(x.message)]
    assert "blocks.0.mixer.norm (its block's source calls it with 2 inputs (hidden_states, gate): DyT takes one)" in w
    assert "blocks.0.mixer.l2 (no known width (no vector parameter and no normalized_shape" in w
    assert isinstance(model.blocks[0].pre, DyT) and isinstance(model.norm, DyT)
    assert isinstance(model.blocks[0].mixer.norm, GatedRMSNorm) and isinstance(model.blocks[0].mixer.l2, L2Norm)
    assert model(IDX).shape == (2, 8, D)  # it runs (before: TypeError from DyT(y, gate))


def test_a_norm_that_may_take_two_inputs_is_converted_when_a_traced_forward_shows_one():
    class Hidden(nn.Module):  # calls its norm through a name the source reader cannot follow
        def __init__(self):
            super().__init__()
            self.norm, self.proj = GatedRMSNorm(D), nn.Linear(D, D)

        def forward(self, x):
            f = getattr(self, "norm")  # noqa: B009 (a name the source reader cannot follow: the point of the test)
            return self.proj(f(x))

    with pytest.warns(
        UserWarning, match=r"takes more than one input \(hidden_states, gate\) and no call of it could be read"
    ):
        convert_to_dyt(Hidden(), rmsnorm=True)
    traced = convert_to_dyt(Hidden(), rmsnorm=True, example_input=torch.randn(2, D))
    assert isinstance(traced.norm, DyT) and not pending_conversion(traced)  # run once: checked


class ReadsEps(nn.Module):
    """Reads an attribute of its final norm that a DyT does not have: converting that norm breaks the forward."""

    def __init__(self):
        super().__init__()
        self.emb, self.norm, self.out = nn.Embedding(50, D), nn.LayerNorm(D), nn.Linear(D, D)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D))])

    def forward(self, idx):
        x = self.blocks[0](self.emb(idx))
        return self.out(self.norm(x)) * (1 + self.norm.eps)


def test_a_converted_layer_that_fails_on_a_batch_is_put_back_by_the_probe():
    model = convert_to_dyt(ReadsEps())
    assert pending_conversion(model)
    with pytest.warns(UserWarning, match=r"put back, as they were.*norm \(the converted forward raised AttributeError"):
        report = probe(model, [IDX])
    assert (
        type(model.norm) is nn.LayerNorm
        and isinstance(model.blocks[0][0], DyT)
        and report.layers["norm"].kind == "layernorm"
    )
    assert not pending_conversion(model) and check_conversion(model, IDX) == ()


@pytest.mark.parametrize("example", [False, True])
def test_the_screens_first_step_checks_a_fresh_conversion_before_the_forward_runs(example):
    model = convert_to_dyt(ReadsEps())
    heard = []
    screen = satmon.Screen(window=2, verbose=False, watch_every_n_steps=0, warn=heard.append)
    screen.attach(model, example_input=IDX if example else None)
    for _ in range(2):
        screen.step(model(IDX).pow(2).mean())  # before: AttributeError at the first step
    assert type(model.norm) is nn.LayerNorm and any("put back" in h and "norm (" in h for h in heard)
    assert screen.verdict is not None and "blocks.0.0" in screen.verdict.per_layer


@pytest.mark.filterwarnings("ignore:satmon. the Trainer has no logger")
def test_a_lightning_module_without_forward_gets_gating_from_its_first_training_step(tmp_path):
    """The callback's traced batch fails (no ``forward``): gating comes from the first training step as it runs,
    and the saturated gated model reads collapse risk (before: the names said yes or no)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from helpers import trainer

    class NoForward(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lm = _dyt(lambda: PreNorm(DyT, GatheredExperts(), qk=None), alpha=30.0)

        def training_step(self, batch, batch_idx):
            return self.lm(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    lit = NoForward()
    monitor = satmon.SaturationMonitor(window=2, verbose=False, watch_every_n_steps=0)
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(lit, DataLoader([IDX, IDX.flip(0)], batch_size=None))
    v = monitor.verdict
    assert v.gated is True and v.gated_layers == ("lm.blocks.0.n2", "lm.blocks.1.n2") and v.collapse_risk is True
