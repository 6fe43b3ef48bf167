"""The point-wise family through the hooks: hand-written Derf (``weight * erf(alpha * x + s) + bias``) and
HardTanh (``weight * hardtanh(alpha * x) + bias``) layers, counted with satmon's one rule (``|u| > c``, ``c``
where the local gain falls to tanh's at the study's level) against independent float64 counts.

The layers are given to the hooks as the model map names them (``NormLayer.function``, ``NormLayer.shift``);
finding them by behaviour is the model map's business (satmon.model).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from reference import exact_count, module_count
from satmon import DyT
from satmon.model.discovery import NormLayer
from satmon.observe.counters import SaturationCounter
from satmon.observe.offset import OffsetCounter, OffsetHooks
from satmon.observe.saturation import SaturationHooks

ERF_CUTOFF = math.sqrt(-math.log(1 - math.tanh(2.0) ** 2))  # 1.62788...: the reference's own formula


class Derf(nn.Module):
    def __init__(self, c: int, alpha: float = 0.8, shift: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.s = nn.Parameter(torch.full((1,), 0.3)) if shift else None
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x):
        u = self.alpha * x + self.s if self.s is not None else self.alpha * x
        return self.weight * torch.erf(u) + self.bias


class HardTanhNorm(nn.Module):
    def __init__(self, c: int, alpha: float = 1.3) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x):
        return self.weight * nn.functional.hardtanh(self.alpha * x) + self.bias


class Mixed(nn.Module):
    """A DyT, a Derf with a shift, a Derf without, and a HardTanh layer in a row."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.dyt, self.derf, self.derf0, self.hard = (
            DyT(c, alpha_init=1.1),
            Derf(c),
            Derf(c, 1.4, shift=False),
            HardTanhNorm(c),
        )
        self.mix = nn.Linear(c, c)

    def forward(self, x):
        h = self.derf(self.mix(self.dyt(x)) * 3)
        return self.hard(self.mix(self.derf0(self.mix(h) * 3)) * 3)

    def derf0_input(self, x):
        return self.mix(self.derf(self.mix(self.dyt(x)) * 3)) * 3

    def layers(self) -> list[NormLayer]:
        return [
            NormLayer("dyt", self.dyt, "dyt"),
            NormLayer("derf", self.derf, "dyt", function="erf", shift="s"),
            NormLayer("derf0", self.derf0, "dyt", function="erf"),
            NormLayer("hard", self.hard, "dyt", function="hardtanh"),
        ]


CUTOFF = {"dyt": 2.0, "derf": ERF_CUTOFF, "derf0": ERF_CUTOFF, "hard": 1.0}


def _recorded(model: Mixed) -> dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]]:
    seen: dict[str, list] = {n: [] for n in CUTOFF}
    for name in CUTOFF:
        mod = getattr(model, name)
        mod.register_forward_hook(
            lambda m, a, o, n=name: seen[n].append(
                (
                    a[0].detach().clone(),
                    m.alpha.detach().clone(),
                    None if getattr(m, "s", None) is None else m.s.detach().clone(),
                )
            )
        )
    return seen


def _float64_counts(seen, module_rounding: bool) -> dict[str, tuple[int, int]]:
    """``|u| > c`` per layer: ``u`` in float64 from float64 operands, or
    (``module_rounding``) as the layer computes it."""
    out = {}
    for name, calls in seen.items():
        sat = total = 0
        for x, a, s in calls:
            sat += (module_count if module_rounding else exact_count)(x, a, CUTOFF[name], shift=s)
            total += x.numel()
        out[name] = (sat, total)
    return out


@pytest.mark.parametrize("keep_inputs", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_function_counts_at_its_cutoff_against_float64(dtype, keep_inputs):
    torch.manual_seed(0)
    model = Mixed().to(dtype)
    layers = model.layers()
    hooks = SaturationHooks(layers, SaturationCounter(len(layers)), keep_inputs=keep_inputs).attach()
    assert hooks.cutoffs == [CUTOFF[n] for n in ("dyt", "derf", "derf0", "hard")]
    seen = _recorded(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(3):
            model((torch.randn(4, 16, 32, generator=g) * 2.5).to(dtype))
            hooks.count_kept()
    r = hooks.read(sync=False)
    want = _float64_counts(seen, module_rounding=True)  # the default product rule: the layer's own arithmetic
    assert [(s, t) for s, t in zip(r.saturated, r.total)] == [want[n] for n in ("dyt", "derf", "derf0", "hard")]
    if dtype == torch.float32:  # float32 data away from the cut-offs: the real product counts the same
        assert _float64_counts(seen, module_rounding=False) == want
    assert all(0 < s < t for s, t in want.values())  # every layer has saturated and unsaturated elements


def test_exact_product_counts_the_float64_preactivation():
    torch.manual_seed(0)
    model = Mixed().to(torch.bfloat16)
    layers = model.layers()
    hooks = SaturationHooks(layers, SaturationCounter(len(layers), product="exact")).attach()
    seen = _recorded(model)
    with torch.no_grad():
        model((torch.randn(8, 16, 32, generator=torch.Generator().manual_seed(4)) * 2.5).to(torch.bfloat16))
    want = _float64_counts(seen, module_rounding=False)
    assert hooks.read(sync=False).saturated == [want[n][0] for n in ("dyt", "derf", "derf0", "hard")]


def test_derf_at_the_cutoff_counts_the_first_value_above_it():
    """Inputs placed on either side of the erf cut-off (no shift): strict '>' at 1.62788, not at 1.6276."""
    layer = Derf(4, alpha=1.0, shift=False)
    hooks = SaturationHooks([NormLayer("derf", layer, "dyt", function="erf")], SaturationCounter(1)).attach()
    x = torch.tensor([[1.6276, 1.6278, 1.6279, -1.629]])
    with torch.no_grad():
        layer(x)
    assert hooks.read(sync=False).saturated == [int((x.double().abs() > ERF_CUTOFF).sum())] == [2]


def test_hardtanh_counts_where_its_gain_is_zero():
    layer = HardTanhNorm(5, alpha=2.0)
    hooks = SaturationHooks([NormLayer("hard", layer, "dyt", function="hardtanh")], SaturationCounter(1)).attach()
    with torch.no_grad():
        layer(torch.tensor([[0.49, 0.5, 0.51, -0.6, 3.0]]))  # u = 0.98, 1.0 (gain undefined: not counted), 1.02, ...
    assert hooks.read(sync=False).saturated == [3]


def test_a_compiled_model_counts_the_family_as_eager():
    dynamo = pytest.importorskip("torch._dynamo")
    from torch._dynamo.utils import counters

    def run(compiled: bool):
        torch.manual_seed(0)
        model = Mixed()
        layers = model.layers()
        hooks = SaturationHooks(layers, SaturationCounter(len(layers))).attach()
        f = torch.compile(model, backend="aot_eager") if compiled else model
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for _ in range(2):
                f(torch.randn(4, 16, 32, generator=g) * 2.5)
        return hooks.read(sync=False)

    eager = run(False)
    dynamo.reset()
    counters.clear()
    try:
        compiled = run(True)
        assert dict(counters["graph_break"]) == {}
    finally:
        dynamo.reset()
    assert compiled == eager


def test_offset_statistics_use_each_cutoff_and_leave_shifted_layers_out():
    model = Mixed()
    layers = model.layers()
    hooks = OffsetHooks(layers, OffsetCounter(len(layers)), 2.0).attach()
    hooks.enabled = True
    assert hooks.cutoffs == [2.0, ERF_CUTOFF, ERF_CUTOFF, 1.0]
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(5)) * 2.5
    with torch.no_grad():
        model(x)
        hooks.enabled = False
        d0_in = model.derf0_input(x)
    r = hooks.read([l.name for l in layers], sync=False)
    assert sorted(r) == ["derf0", "dyt", "hard"]  # the shifted Derf has none
    a = model.derf0.alpha.double()
    want = float(((a * d0_in.double()).abs() > ERF_CUTOFF).double().mean())
    assert 0 < want < 1 and r["derf0"]["saturated"] == want


def test_layers_without_a_function_or_with_a_missing_shift_are_refused():
    ln = nn.LayerNorm(4)
    with pytest.raises(ValueError, match="Expected point-wise layers"):
        SaturationHooks([NormLayer("ln", ln, "layernorm")], SaturationCounter(1))
    with pytest.raises(ValueError, match="shift as a tensor attribute 'shift'"):
        SaturationHooks([NormLayer("d", Derf(4), "dyt", function="erf", shift="shift")], SaturationCounter(1))
