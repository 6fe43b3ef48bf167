"""The plain-loop core on the inputs a user gets wrong: nothing to screen, a module that only looks like DyT."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import satmon


class ScaledTanh(nn.Module):
    """Owns `alpha` but computes tanh(alpha * x / 2): not a DyT (its saturation is not |alpha * x| > 2)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), 4.0))

    def forward(self, x):
        return torch.tanh(self.alpha * x / 2)


def test_screen_says_so_when_the_model_has_no_dyt():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with pytest.warns(UserWarning, match=r"no DyT layer in Sequential.*no screen and no verdict.*convert_to_dyt"):
        screen = satmon.Screen(window=2, verbose=False).attach(model)
    assert not screen.step(model(torch.randn(2, 4)).sum()) and screen.verdict is None


def test_include_does_not_turn_a_look_alike_into_a_screened_layer():
    model = nn.Sequential(nn.Linear(4, 4), ScaledTanh(4))
    with pytest.warns(UserWarning, match=r"include= selects '1' \(ScaledTanh\).*does not compute weight \* f\(alpha \* x \+ s\) \+ bias with f tanh"):
        layers = satmon.find_dyt_layers(model, include=r"^1$")
    assert layers == []  # 0.2 before this review counted it: a confident verdict on a saturation its tanh does not have


def test_an_unknown_option_is_named_with_the_valid_ones():
    with pytest.raises(TypeError, match=r"Expected Screen options among \[.*'window'.*\].*got \['on_missing'\]"):
        satmon.Screen(window=2, on_missing="raise")
