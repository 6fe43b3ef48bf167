"""SaturationHooks (satmon.observe.saturation) on a layer whose alpha cannot be counted: the layer is
refused with one warning, named on the verdict card, and training and the other layers' counts go on."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

from helpers import hooked, tiny_lit, token_loader, trainer
from reference import InputRecorder, reference
from satmon import DyT, SaturationMonitor, find_dyt_layers
from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import SaturationHooks


class ReshapingDyT(nn.Module):
    """A conv-style DyT whose per-channel alpha is stored as ``(C,)`` and reshaped in its forward: satmon
    sees ``(C,)``, which cannot broadcast against a ``(B, C, H, W)`` input whose ``W`` is not ``C``."""

    def __init__(self, channels: int, alpha_init: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((channels,), alpha_init))
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x):  # (B, C, H, W)
        c = (-1, 1, 1)
        return self.weight.view(c) * torch.tanh(self.alpha.view(c) * x) + self.bias.view(c)


class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_norm, self.norm = ReshapingDyT(4, alpha_init=2.0), DyT(6, alpha_init=1.3)

    def forward(self, x):  # (B, 4, 5, 6)
        return self.norm(self.conv_norm(x))


@pytest.mark.parametrize("keep_inputs", [False, True])
def test_a_layer_whose_alpha_cannot_broadcast_is_refused_once_and_the_others_still_count(keep_inputs):
    model = _Mixed()
    hooks = hooked(model, keep_inputs=keep_inputs)
    assert [l.name for l in hooks.layers] == ["conv_norm", "norm"]
    g = torch.Generator().manual_seed(5)
    want = 0
    with pytest.warns(RuntimeWarning, match="not counted for the rest of the run") as record:
        for _ in range(3):
            x = torch.randn(2, 4, 5, 6, generator=g) * 2
            with torch.no_grad():
                model(x)
                hooks.count_kept()
                want += reference(model.conv_norm(x), model.norm.alpha)  # the second layer's input
    refusals = [w for w in record if "not counted" in str(w.message)]
    assert len(refusals) == 1
    message = str(refusals[0].message)
    for part in ("'conv_norm'", "alpha of shape (4,)", "input of shape (2, 4, 5, 6)", "include="):
        assert part in message
    advice = re.search(r'exclude=r"([^"]+)"', message)  # the advice works: that regex drops this layer only
    assert advice and [l.name for l in find_dyt_layers(model, exclude=advice.group(1))] == ["norm"]
    assert hooks.refused == {
        "conv_norm": "alpha of shape (4,) does not broadcast against its input of shape (2, 4, 5, 6)"
    }
    r = hooks.read(sync=False)
    assert r.total == [0, 3 * 2 * 4 * 5 * 6] and r.saturated == [0, want]


def test_a_refusal_shared_with_another_hook_set_warns_once():
    """The screen's window hooks and watch hooks share one ``refused``: the watch does not warn again."""
    model = _Mixed()
    window = hooked(model)
    x = torch.randn(2, 4, 5, 6, generator=torch.Generator().manual_seed(6))
    with pytest.warns(RuntimeWarning, match="not counted"):
        model(x)
    window.detach()
    layers = find_dyt_layers(model)
    watch = SaturationHooks(layers, SaturationCounter(2), refused=window.refused).attach()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(x)
    r = watch.read(sync=False)
    assert r.total == [0, x.numel()]
    assert r.saturated == [0, reference(model.conv_norm(x).detach(), model.norm.alpha)]


class _WithConvNorm(nn.Module):
    """A language model with a conv-style side branch through a :class:`ReshapingDyT` on ``(B, 4, T, V/4)``."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm, self.conv_norm = lm, ReshapingDyT(4, alpha_init=2.0)

    def forward(self, idx):
        logits = self.lm(idx)  # (B, T, V)
        b, t, v = logits.shape
        side = self.conv_norm(logits.reshape(b, 4, t, v // 4))  # W = V/4 = 64, not C = 4: (4,) cannot broadcast
        return logits + 0.1 * side.reshape(b, t, v)


@pytest.mark.parametrize("offset_every", [0, 10])
def test_training_with_a_refused_layer_completes_and_the_card_names_it(tmp_path, offset_every):
    window = 3
    lit = tiny_lit()
    lit.model = _WithConvNorm(lit.model)
    names = [l.name for l in find_dyt_layers(lit)]
    others = [n for n in names if n != "model.conv_norm"]
    assert "model.conv_norm" in names and len(others) == 5  # two blocks x two norms, and the final norm
    rec = InputRecorder(lit, others)  # float64 copies of each training forward's inputs and alphas
    # the watch hooks see the layer after the window too
    monitor = SaturationMonitor(window=window, verbose=False, watch_every_n_steps=1, offset_every=offset_every)
    with pytest.warns(RuntimeWarning, match="not counted for the rest of the run") as record:
        trainer(tmp_path, max_steps=window + 2, callbacks=[monitor]).fit(lit, token_loader(window + 2))
    assert lit.trainer.global_step == window + 2  # training completed
    refusals = [str(w.message) for w in record if "not counted for the rest of the run" in str(w.message)]
    assert len(refusals) == 1 and "'model.conv_norm'" in refusals[0] and r'exclude=r"^model\.conv_norm$"' in refusals[0]
    reason = "alpha of shape (4,) does not broadcast against its input of shape (4, 4, 16, 64)"
    assert monitor.screen.hooks.refused == {"model.conv_norm": reason}
    assert f"layer model.conv_norm not counted: {reason}" in monitor.verdict.card()
    v = monitor.verdict
    assert "model.conv_norm" not in v.per_layer and sorted(v.per_layer) == sorted(others)
    for name, items in rec.inputs.items():
        items = items[:window]  # one training forward per window step
        sat = sum(reference(x.float(), a.float()) for x, a in items)  # the model is float32: the module product
        assert v.per_layer[name] == sat / sum(x.numel() for x, _ in items), name
