"""The tests' float64 reference (``tests/reference.py``) against answers worked out by hand: the one place every
recount comes from is itself checked, so a wrong reference cannot make a wrong count pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from reference import (
    InputRecorder,
    count,
    counts_of,
    exact_count,
    gate_stats,
    model_counts,
    module_count,
    pooled,
    reference,
)
from satmon import DyT


def test_exact_count_is_the_real_product_over_the_level():
    x = torch.tensor([1.0, 2.0, 3.0, -4.0, 2.0000002])  # |1 * x| > 2: 3, -4 and the float32 just above 2
    assert exact_count(x, torch.tensor([1.0])) == 3
    assert exact_count(x, torch.tensor([0.5])) == 0  # -4 * 0.5 = -2 is at the level, not over it
    assert exact_count(x, torch.tensor([0.5]), level=1.0) == 3  # 1.5, 2.0, 1.0000001 over 1
    assert exact_count(torch.tensor([1.5, -1.5]), torch.tensor([1.0]), shift=torch.tensor([1.0])) == 1  # 2.5, -0.5


def test_module_count_rounds_the_product_to_the_layers_dtype():
    """bf16: 1.5 * 1.3359375 = 2.00390625 exactly, which rounds to 2.0 in bf16 (its step at 2 is 2**-6): the module
    product is not over 2, the real one is."""
    x = torch.tensor([1.3359375, -1.3359375, 2.0], dtype=torch.bfloat16)
    alpha = torch.tensor([1.5], dtype=torch.bfloat16)
    assert (alpha * x)[0].item() == 2.0
    assert module_count(x, alpha) == 1 and exact_count(x, alpha) == 3  # 2 * 1.5 = 3 counts under both
    assert count(x, alpha, product="module") == 1 and count(x, alpha, product="exact") == 3
    assert counts_of([(x.double(), alpha.double())]) == (3, 3)
    with pytest.raises(AssertionError, match="within one rounding"):
        reference(x, alpha)
    assert reference(torch.tensor([3.0, 1.0]), torch.tensor([1.0])) == 1
    with pytest.raises(ValueError, match="Expected product 'exact' or 'module', got 'fused'"):
        count(x, alpha, product="fused")


def test_module_count_compares_with_a_level_that_is_no_float32_value():
    """A level just under the float32 value ``f = 2 + 2**-22`` rounds to ``f`` in float32: compared there, ``f`` would
    not be over it; compared exactly, it is."""
    f = torch.nextafter(torch.tensor([2.0]), torch.tensor([3.0]))
    level = 2.0 + 2.0**-22 - 2.0**-30
    assert torch.tensor([level]).item() == f.item()  # the level, rounded to float32, is f itself
    assert module_count(f, torch.tensor([1.0]), level) == 1 == exact_count(f, torch.tensor([1.0]), level)


def test_the_recorder_keeps_training_forwards_in_float64_and_counts_them():
    layer = DyT(4, alpha_init=1.0)
    model = nn.Sequential(layer)
    rec = InputRecorder(model, ["0"])
    x = torch.tensor([[3.0, -1.0, 0.5, -2.5]])
    model(x)  # training: recorded
    model.eval()
    model(x * 10)  # eval: not recorded by default
    assert len(rec.inputs["0"]) == 1 and rec.inputs["0"][0][0].dtype == torch.float64
    assert rec.counts() == {"0": (2, 4)}
    model.train()
    model(x / 10)
    assert rec.counts() == {"0": (2, 8)} and rec.counts(first=1) == {"0": (2, 4)}
    rec.remove()
    model(x)
    assert rec.counts() == {"0": (2, 8)}  # removed: nothing more recorded
    assert pooled({"a": (2, 8), "b": (6, 8)}) == 0.5


def test_model_counts_reads_every_dyt_in_eval_mode_and_leaves_the_mode_alone():
    model = nn.Sequential(DyT(2, alpha_init=2.0), nn.Linear(2, 2, bias=False), DyT(2, alpha_init=1.0))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 0.5]]))
    model.train()
    got = model_counts(model, [torch.tensor([[1.5, 0.5]]), torch.tensor([[-0.2, 3.0]])])
    # layer 0: 2 * [1.5, 0.5, -0.2, 3.0] -> 3, 1, 0.4, 6: two over 2. Layer 2 gets layer 0's output, tanh'd (|.| < 1):
    # none over 2.
    assert {n: (c.saturated, c.total) for n, c in got.items()} == {"0": (2, 4), "2": (0, 4)}
    assert model.training


def test_gate_stats_by_hand():
    g = torch.tensor([-5.0, 0.0, 1.0, -10.0])
    hidden = torch.tensor([1.0, -3.0, 0.0, 4.0])
    assert gate_stats(g, hidden, -4.0) == (0.5, 2.0)
