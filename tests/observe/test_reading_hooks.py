"""satmon.observe.reading_hooks: the hook sets every screening path counts with, and the model's non-finite weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from reference import exact_count
from satmon import DyT, find_dyt_layers
from satmon.model.discovery import NormLayer
from satmon.observe.reading_hooks import ReadingHooks, nonfinite_parameters
from satmon.results.reading import verdict_of


def test_the_offset_hooks_count_only_when_their_owner_enables_them():
    model = nn.Sequential(DyT(4, alpha_init=2.0))
    hooks = ReadingHooks(model, find_dyt_layers(model), None, level=2.0, distributed=False).attach()
    model(torch.randn(8, 4))  # offsets off (a window's unsampled step)
    hooks.offset_enabled = True
    x = torch.randn(8, 4) * 3
    model(x)
    r = hooks.read(step=2, source="probe", sync=False)
    hooks.detach()
    assert r.counts["0"].total == 64  # saturation: both forwards
    want = exact_count(x, torch.tensor(2.0), 2.0) / x.numel()
    assert r.offset["0"]["saturated"] == pytest.approx(want, abs=1e-12)  # offsets: the enabled forward only


def test_without_offset_hooks_a_reading_has_no_offsets_and_no_flag():
    model = nn.Sequential(DyT(4, alpha_init=2.0))
    hooks = ReadingHooks(model, find_dyt_layers(model), None, level=2.0, offset=False, distributed=False).attach()
    hooks.offset_enabled = True  # nothing to enable
    model(torch.randn(8, 4) + 10)
    r = hooks.read(step=1, source="probe", sync=False)
    assert r.offset == {} and not r.offset_driven and hooks.offset is None


def test_the_layers_function_reaches_the_verdict():
    # a point-wise layer that applies erf (Derf), as the model map names it: the study calibrated tanh only
    model = nn.Sequential(DyT(4, alpha_init=2.0))
    layer = find_dyt_layers(model)[0]
    derf = NormLayer(layer.name, layer.module, "dyt", function="erf")
    hooks = ReadingHooks(model, [derf], None, level=2.0, distributed=False).attach()
    model(torch.randn(8, 4) * 3)
    r = hooks.read(step=0, source="probe", sync=False)
    assert dict(r.functions) == {"0": "erf"}
    v = verdict_of(r)
    assert v.functions == ("erf",) and v.trust == "uncalibrated" and "no calibrated threshold for erf" in v.headline()


def test_a_model_without_dyt_layers_is_refused():
    with pytest.raises(ValueError, match="Expected at least one DyT layer"):
        ReadingHooks(nn.Linear(2, 2), [], None, level=2.0)


def test_nonfinite_parameters_counts_nan_and_inf_under_plain_names_and_skips_buffers():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    model.register_buffer("mask", torch.tensor([float("-inf"), 0.0]))  # -inf on purpose: not a weight
    with torch.no_grad():
        model[0].weight[0, :2] = torch.tensor([float("nan"), float("inf")])
        model[1].bias[1] = -float("inf")
    assert nonfinite_parameters(model) == {"0.weight": 2, "1.bias": 1}
    wrapped = nn.Module()
    wrapped._orig_mod = model  # torch.compile's prefix is removed, as satmon names layers
    assert nonfinite_parameters(wrapped) == {"0.weight": 2, "1.bias": 1}
    seen = []
    agreed = nonfinite_parameters(model, reduce=lambda t: (seen.append(t.clone()), t * 2)[1])  # e.g. a cross-rank max
    assert agreed == {"0.weight": 4, "1.bias": 2} and seen[0].tolist() == [2, 0, 0, 1]
    assert nonfinite_parameters(nn.ReLU()) == {}
