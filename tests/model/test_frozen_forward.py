"""satmon.model.frozen_forward.frozen_forward: the model, grad mode and RNG come back as they were, also on error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from satmon.model.frozen_forward import frozen_forward


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    m.train()
    m[1].eval()  # mixed modes
    return m


@pytest.mark.parametrize("train_mode", [False, True])
def test_modes_buffers_rng_and_grad_mode_restored_also_on_error(train_mode):
    m = _model()
    modes = [x.training for x in m.modules()]
    buffers = [b.clone() for b in m.buffers()]
    rng = torch.get_rng_state()
    seen = []
    with pytest.raises(RuntimeError, match="boom"):
        with frozen_forward(m, torch.device("cpu"), train_mode=train_mode):
            seen.append((m.training, m[1].training, torch.is_grad_enabled()))
            m(torch.randn(8, 4))
            raise RuntimeError("boom")
    assert seen == [(train_mode, train_mode, False)]
    assert [x.training for x in m.modules()] == modes and torch.is_grad_enabled()
    assert all(torch.equal(a, b) for a, b in zip(buffers, m.buffers()))  # BatchNorm statistics put back
    assert torch.equal(torch.get_rng_state(), rng)


def test_two_passes_see_the_same_dropout_masks_and_autocast_applies():
    m = _model()
    x = torch.randn(8, 4)
    outs = []
    for _ in range(2):
        with frozen_forward(m, torch.device("cpu"), train_mode=True, autocast_dtype=torch.bfloat16):
            outs.append(m(x))
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    assert (outs[0] == 0).any()  # dropout did draw
