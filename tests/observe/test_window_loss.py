"""WindowLoss (satmon.observe.window_loss): the window's training loss per segment, against plain means."""

from __future__ import annotations

import math

import pytest
import torch

from satmon.observe.window_loss import WindowLoss


@pytest.mark.parametrize("window, segments", [(10, 10), (10, 3), (7, 2), (3, 10), (1, 1)])
def test_segment_means_equal_plain_means_of_their_steps(window, segments):
    g = torch.Generator().manual_seed(window * 31 + segments)
    losses = (torch.rand(window, generator=g, dtype=torch.float64) * 5).tolist()
    w = WindowLoss(window, segments)
    for step, loss in enumerate(losses):
        w.push(torch.tensor(loss, dtype=torch.float32), step)
    n = w.segments
    assert n == min(segments, window)
    want = []
    for i in range(n):
        part = [
            torch.tensor(v, dtype=torch.float32).double().item() for s, v in enumerate(losses) if s * n // window == i
        ]
        want.append(sum(part) / len(part))
    assert w.means(sync=False) == pytest.approx(want, rel=1e-12)
    assert w.compute().tolist() == pytest.approx(want, rel=1e-12)


def test_nonfinite_losses_and_steps_outside_the_window_are_left_out():
    w = WindowLoss(window=4, segments=2)
    for step, loss in enumerate([2.0, float("nan"), float("inf"), 4.0, 100.0]):  # the 5th push is past the window
        w.push(torch.tensor(loss), step)
    w.push(torch.tensor(7.0), -1)
    assert w.means(sync=False) == [2.0, 4.0]
    assert w.counts.tolist() == [1, 1]


def test_a_segment_without_a_loss_reads_nan_and_reset_empties_it():
    w = WindowLoss(window=4, segments=2)
    w.push(torch.tensor([3.0]), 0)  # a 1-element loss of any shape
    means = w.means(sync=False)
    assert means[0] == 3.0 and math.isnan(means[1])
    w.reset()
    assert all(math.isnan(m) for m in w.means(sync=False))


def test_pushes_keep_the_loss_on_its_device_and_do_not_touch_its_graph():
    p = torch.tensor(2.0, requires_grad=True)
    loss = p * 3
    w = WindowLoss(window=2, segments=1)
    w.push(loss, 0)
    assert loss.grad_fn is not None and not w.sums.requires_grad
    assert w.sums.dtype == torch.float64 and w.counts.dtype == torch.int64


def test_state_dict_round_trip_and_invalid_window():
    w, v = WindowLoss(6, 3), WindowLoss(6, 3)
    for step in range(6):
        w.push(torch.tensor(float(step)), step)
    v.load_state_dict(w.state_dict())
    assert v.means(sync=False) == w.means(sync=False) == [0.5, 2.5, 4.5]
    with pytest.raises(ValueError, match="Expected a window of at least one step"):
        WindowLoss(0)
