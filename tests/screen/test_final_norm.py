"""The run's final norm for the forecast, read from the forward's module order (never from names): the last
normaliser to start, unknown where a module that looks like a normaliser but cannot be read starts after it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from satmon.dyt import DyT
from satmon.observe.hookset import paused
from satmon.screen.final_norm import FinalNorm


class MixingNorm(nn.Module):
    """Named like a norm, but it mixes the channels after normalising: satmon cannot read it (undetermined)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.eye(d) + 0.1), 1e-5

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:]) @ self.weight


class Reordered(nn.Module):
    """Modules registered in one order, run in another: only the forward says which norm is last."""

    def __init__(self, first: nn.Module, last: nn.Module) -> None:
        super().__init__()
        self.head_norm, self.proj, self.block_norm, self.out = last, nn.Linear(4, 4), first, nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.head_norm(self.proj(self.block_norm(x))))


def _kind(model: nn.Module) -> str | None:
    final = FinalNorm(model).attach()
    model(torch.randn(2, 3, 4))
    final.settle()
    return final.kind


@pytest.mark.parametrize(
    ("block", "head", "kind"),
    [
        (nn.LayerNorm(4), DyT(4), "dyt"),
        (DyT(4), nn.LayerNorm(4), "layernorm"),
        (DyT(4), nn.RMSNorm(4), "rmsnorm"),
        (DyT(4), nn.Identity(), "dyt"),  # no norm before the head: the last one that ran is the block's
        (DyT(4), MixingNorm(4), None),  # an unreadable norm after the last one read may be the final norm
        (nn.Identity(), nn.Identity(), None),  # no normaliser ran
    ],
)
def test_the_final_norm_is_the_last_normaliser_to_run(block, head, kind):
    assert _kind(Reordered(block, head)) == kind


def test_it_reads_one_forward_outside_paused_blocks_then_detaches():
    model = Reordered(DyT(4), nn.LayerNorm(4))
    hooks = lambda: sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())  # noqa: E731
    before = hooks()
    final = FinalNorm(model).attach()
    assert hooks() > before
    with paused(*final.paused_sets()):  # validation or a probe: not the training forward
        model(torch.randn(1, 4))
    final.settle()
    assert final.order is not None and final.kind is None  # nothing recorded yet
    model(torch.randn(1, 4))
    final.settle()
    assert final.order is None and final.kind == "layernorm" and hooks() == before
    final.detach()  # already off: a no-op
