"""SaturationCounter (satmon.observe.counters): int64 sums per layer, fractions against a float64 re-count,
and the DDP rule (ranks add raw counts, never fractions)."""

from __future__ import annotations

import pytest
import torch

from reference import reference
from satmon.functional.saturation import saturation_counts
from satmon.observe.counters import SaturationCounter


def test_counts_are_int64_per_layer_and_other_layers_stay_zero():
    c = SaturationCounter(2)
    c.update(1, saturated=5, total=12)
    assert all(getattr(c, k).dtype == torch.int64 for k in ("saturated", "total", "nonfinite"))
    assert c.saturated.tolist() == [0, 5] and c.total.tolist() == [0, 12] and c.nonfinite.tolist() == [0, 0]


def test_index_tensor_adds_repeated_layers_and_scalar_counts():
    """The queue folds many calls at once: one index per call, repeated layers add up."""
    c = SaturationCounter(3)
    c.update(
        torch.tensor([0, 2, 0]),
        saturated=torch.tensor([1.0, 2.0, 3.0]),
        total=torch.tensor([4, 5, 6]),
        nonfinite=torch.tensor([0, 1, 1]),
    )
    c.update(torch.tensor([1, 1]), saturated=torch.tensor([2, 0]), total=7)  # an int count applies to every index
    assert c.saturated.tolist() == [4, 2, 2]
    assert c.total.tolist() == [10, 14, 5]
    assert c.nonfinite.tolist() == [1, 0, 1]


@pytest.mark.parametrize("alpha", [0.7, 1.3, 3.1])
def test_batched_updates_equal_one_shot_and_the_float64_reference(alpha):
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(5, 7, 8, generator=g) * 2 for _ in range(4)]
    xs[2][0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    a = torch.tensor([alpha])
    batched, one = SaturationCounter(1), SaturationCounter(1)
    for x in xs:
        sat, bad = saturation_counts(x, a, 2.0)
        batched.update(0, sat, x.numel(), bad)
    whole = torch.cat(xs)
    sat, bad = saturation_counts(whole, a, 2.0)
    one.update(0, sat, whole.numel(), bad)
    for k in ("saturated", "total"):
        assert torch.equal(getattr(batched, k), getattr(one, k))
    assert batched.nonfinite.tolist() == [1] and one.nonfinite.tolist() == [1]  # inputs that held one, not elements
    finite = whole[torch.isfinite(whole)]
    want = reference(finite, a) + 2  # |alpha * inf| > level: both infinities count, nan never
    assert batched.saturated.tolist() == [want]
    assert batched.compute()["pooled"].item() == want / whole.numel()


def test_compute_gives_float64_fractions_zero_for_empty_layers_and_copies():
    c = SaturationCounter(3)
    c.update(torch.tensor([0, 2]), saturated=torch.tensor([1, 3]), total=torch.tensor([4, 8]))
    out = c.compute()
    assert out["per_layer"].dtype == torch.float64 and out["pooled"].dtype == torch.float64
    assert out["per_layer"].tolist() == [0.25, 0.0, 0.375]  # the layer that saw nothing: 0, not NaN
    assert out["pooled"].item() == 4 / 12
    out["saturated"].add_(100)  # the raw counts returned are copies: the states do not move
    assert c.saturated.tolist() == [1, 0, 3]


def test_compute_reads_the_states_as_they_are_now():
    """Compiled hooks add into the states directly (add_counts): compute() has no cache to go stale."""
    c = SaturationCounter(1)
    c.update(0, 1, 4)
    assert c.compute()["pooled"].item() == 0.25
    c.add_counts(0, 3, 4)
    assert c.compute()["pooled"].item() == 0.5
    c.add_counts(torch.tensor([0]), torch.tensor([2]), torch.tensor([2]), torch.tensor([1]))
    assert c.total.tolist() == [10] and c.saturated.tolist() == [6] and c.nonfinite.tolist() == [1]


def test_reset_zeroes_states_in_place():
    c = SaturationCounter(2)
    held = c.saturated  # hooks and compiled graphs hold the state tensors: reset keeps them
    c.update(torch.tensor([0, 1]), saturated=torch.tensor([1, 2]), total=torch.tensor([3, 4]), nonfinite=1)
    c.reset()
    assert c.total.tolist() == [0, 0] and c.saturated.tolist() == [0, 0] and c.nonfinite.tolist() == [0, 0]
    assert c.saturated is held


def test_ranks_add_raw_counts_not_fractions(monkeypatch):
    """Counts are summed over ranks, then divided: the fractions over ranks are those of
    all their data in one process."""
    import satmon.observe.states as states

    g = torch.Generator().manual_seed(7)
    a = torch.tensor([1.1])
    rows = [[2, 9], [7, 1]]  # (rank, layer): uneven, so a mean of per-rank fractions would differ
    ranks, alone = [SaturationCounter(2), SaturationCounter(2)], SaturationCounter(2)
    for counter, per_layer in zip(ranks, rows):
        for layer, n in enumerate(per_layer):
            x = torch.randn(n, 16, generator=g) * (1.0 + 2.0 * layer)
            counter.update(layer, reference(x, a), x.numel())
            alone.update(layer, reference(x, a), x.numel())
    calls = []

    def all_reduce(packed):  # rank 0's view of a 2-rank SUM: its packed vector plus rank 1's, packed the same way
        calls.append(packed.clone())
        packed.add_(states._pack([getattr(ranks[1], k) for k in ("saturated", "total", "nonfinite")]))

    monkeypatch.setattr(states, "_distributed", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    synced, want = ranks[0].compute(sync=True), alone.compute()
    assert len(calls) == 1  # one packed collective for the three states
    for k in ("saturated", "total", "nonfinite", "per_layer", "pooled"):
        assert torch.equal(synced[k], want[k]), k
    mean_of_fractions = (ranks[0].compute()["pooled"].item() + ranks[1].compute()["pooled"].item()) / 2
    assert abs(synced["pooled"].item() - mean_of_fractions) > 1e-3
    assert ranks[0].total.tolist() == [32, 144]  # the local states are not changed by a synced read (2x16, 9x16)


def test_arguments_are_checked_with_what_to_do():
    with pytest.raises(TypeError, match="moved to SaturationHooks"):
        SaturationCounter(1, keep_inputs=True)
    with pytest.raises(ValueError, match="Expected num_layers to be an int >= 1, got 0"):
        SaturationCounter(0)
    with pytest.raises(ValueError, match=r"Expected `product` in \('module', 'exact'\).*got 'float64'"):
        SaturationCounter(1, product="float64")
