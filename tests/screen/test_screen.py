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
    with pytest.warns(
        UserWarning,
        match=r"include= selects '1' \(ScaledTanh\).*does not compute weight \* f\(alpha \* x \+ s\) \+ bias with f "
        r"tanh",
    ):
        layers = satmon.find_dyt_layers(model, include=r"^1$")
    assert layers == []  # 0.2 before this review counted it: a confident verdict on a saturation its tanh does not have


def test_an_unknown_option_is_named_with_the_valid_ones():
    with pytest.raises(TypeError, match=r"Expected Screen options among \[.*'window'.*\].*got \['on_missing'\]"):
        satmon.Screen(window=2, on_missing="raise")


def test_step_before_attach_warns_once_that_nothing_is_counted():
    """A plain loop that forgot attach() must hear it: no counts, no verdict, said once, not per step."""
    heard: list[str] = []
    screen = satmon.Screen(window=2, verbose=False, warn=heard.append)
    for _ in range(3):
        assert screen.step(torch.tensor(1.0)) is False
    assert len(heard) == 1 and "before Screen.attach(model)" in heard[0] and screen.verdict is None


@pytest.mark.parametrize("alpha_init", [float("nan"), float("inf"), -float("inf")])
def test_dyt_refuses_a_non_finite_alpha_init(alpha_init):
    with pytest.raises(ValueError, match=r"Expected a finite `alpha_init`, got"):
        satmon.DyT(4, alpha_init=alpha_init)
    with pytest.raises(ValueError, match=r"Expected a finite `alpha_init`, got"):
        satmon.convert_to_dyt(nn.Sequential(nn.LayerNorm(4)), alpha_init=alpha_init)
