"""satmon.screen.nonfinite_guard: one flag per step from the counted inputs, the alphas and the loss,
maximum over ranks, read on the CPU at once (the CUDA path reads the previous step's copy)."""

from __future__ import annotations

import math

import pytest
import torch

from satmon.screen.nonfinite_guard import NonFiniteGuard

NAN, INF = float("nan"), float("inf")


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


@pytest.mark.parametrize(
    ("inputs", "alphas", "loss", "expected"),
    [
        (0, [2.0, 0.5], 1.5, 0),
        (3, [2.0, 0.5], 1.5, 3),  # three DyT inputs held NaN/inf (the hooks' count so far)
        (0, [NAN, INF], 1.5, 2),  # two alphas
        (0, [2.0], NAN, 1),  # the loss
        (2, [INF], -INF, 4),  # all of them add up
    ],
)
def test_each_finding_counts(inputs, alphas, loss, expected):
    g = NonFiniteGuard("cpu")
    g.push(torch.tensor(inputs), torch.tensor(alphas), torch.tensor(loss), _same)
    assert g.poll() == expected == g.seen


def test_missing_parts_and_a_loss_that_is_no_scalar_are_left_out():
    g = NonFiniteGuard("cpu")
    g.push(None, None, torch.tensor([NAN, NAN]), _same)  # not a 1-element loss: not a training loss to check
    g.push(None, None, "not a tensor", _same)
    assert g.poll() == 0


def test_the_maximum_over_ranks_decides_and_the_count_never_goes_down():
    other_rank = {"value": 5.0}
    seen_by_reduce = []

    def reduce_max(t: torch.Tensor) -> torch.Tensor:  # another rank found 5 where this one found t
        seen_by_reduce.append((t.dtype, tuple(t.shape), t.item()))
        return torch.maximum(t, torch.tensor([other_rank["value"]], dtype=t.dtype))

    g = NonFiniteGuard("cpu")
    g.push(torch.tensor(0), torch.tensor([1.0]), torch.tensor(0.5), reduce_max)
    assert g.poll() == 5 and seen_by_reduce == [(torch.float64, (1,), 0.0)]  # one float64 flag per step
    other_rank["value"] = 0.0
    g.push(torch.tensor(1), torch.tensor([1.0]), torch.tensor(0.5), reduce_max)
    assert g.poll() == 5  # a later, smaller count does not lower what was seen


def test_poll_reads_every_step_pushed_on_the_cpu():
    g = NonFiniteGuard("cpu")
    for loss in (0.1, NAN, 0.2):
        g.push(torch.tensor(0), None, torch.tensor(loss), _same)
    assert g.poll() == 1 and g.poll() == 1  # nothing in flight on the CPU: a second poll reads nothing new


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the one-step-late read is the CUDA path")
def test_cuda_reads_the_previous_step_without_waiting_for_the_last():
    g = NonFiniteGuard("cuda")
    g.push(torch.tensor(0, device="cuda"), torch.tensor([1.0], device="cuda"), torch.tensor(NAN, device="cuda"), _same)
    assert g.poll() == 0  # this step's copy stays in flight
    g.push(torch.tensor(0, device="cuda"), torch.tensor([1.0], device="cuda"), torch.tensor(1.0, device="cuda"), _same)
    assert g.poll() == 1  # the NaN step, read one step late
    assert not math.isnan(g.seen)
