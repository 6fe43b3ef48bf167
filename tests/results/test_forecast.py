"""The forecast from the planned passes: the rule read from hand-made cell sets whose answer is known."""

from __future__ import annotations

import dataclasses

import pytest

from satmon.results.forecast import CODE, REACH, Forecast, KnownCell, forecast_from, unknown_forecast


def _cells(passes: float, deltas: list[float], source: str = "hand", size: float = 1e5) -> list[KnownCell]:
    """One configuration per cell (a size of its own each), all at ``passes``."""
    return [KnownCell(f"{source}{passes}_{i}", size * (1 + i / 10), passes, d, f"g{i}", source, train_tokens=size * 10)
            for i, d in enumerate(deltas)]


LOW = _cells(2.0, [0.1] * 6)  # 6 configurations, all hurt: p = 1/64
HIGH = _cells(100.0, [-0.1] * 6)  # 6, all helped


def _f(cells, passes, params=1.2e5, unique=1e6):
    return forecast_from(cells, params=params, unique_tokens=unique, planned_tokens=passes * unique)


def test_unanimous_and_significant_cells_give_a_confident_outcome():
    f = _f(LOW + HIGH, 2.0)
    assert (f.outcome, f.agreeing, f.cells, f.configurations) == ("hurts", 6, 6, 6)
    assert f.p_value == pytest.approx(1 / 64) and f.passes == 2.0 and f.tokens_per_param == pytest.approx(1e6 / 1.2e5)
    assert "worse than LayerNorm's in 6/6 known cells at or below 2 passes" in f.evidence
    assert _f(LOW + HIGH, 100.0).outcome == "helps" and _f(LOW + HIGH, 100.0).code == CODE["helps"] == 1.0
    # between the two budgets nothing was measured: the cells around it differ
    mid = _f(LOW + HIGH, 20.0)
    assert mid.outcome == "uncertain" and "between the known budgets 2 and 100" in mid.evidence


def test_one_contradicting_cell_turns_a_confident_outcome_uncertain():
    contra = KnownCell("new", 1.1e5, 2.0, -0.05, "gx", "another grid")
    f = _f(LOW + HIGH + [contra], 2.0)
    assert f.outcome == "uncertain" and "worse in 6/7 known cells at or below 2 passes" in f.evidence
    # a cell at fewer passes that helped also breaks "hurts" at more passes (the cells at or below must all agree)
    lower_help = KnownCell("low", 1.1e5, 1.5, -0.05, "gy", "another grid")
    assert _f(LOW + HIGH + [lower_help], 2.0).outcome == "uncertain"
    # a tie is neither
    assert _f(LOW + [dataclasses.replace(contra, delta=0.0)], 2.0).outcome == "uncertain"


def test_too_few_configurations_are_no_forecast_and_seeds_count_once():
    assert _f(_cells(2.0, [0.1] * 4), 2.0).outcome == "uncertain"  # 1/16 >= 0.05
    assert _f(_cells(2.0, [0.1] * 5), 2.0).outcome == "hurts"  # 1/32
    seeds = [dataclasses.replace(c, name=f"{c.name}_s{s}", group="one") for c in _cells(2.0, [0.1] * 3) for s in range(4)]
    # 12 cells but all of one size at one budget: one configuration, no test passes
    f = _f(seeds, 2.0)
    assert f.outcome == "uncertain" and f.configurations == 1 and "too few configurations" in f.evidence


def test_outside_the_cells_it_refuses_to_be_confident():
    cells = LOW + HIGH
    assert "fewer than any known cell" in _f(cells, 1.0).evidence and _f(cells, 1.0).outcome == "uncertain"
    assert "more than any known cell" in _f(cells, 500.0).evidence and _f(cells, 500.0).outcome == "uncertain"
    # within the budget tolerance (10%) of the measured budget: still that budget
    assert _f(cells, 2.15).outcome == "hurts" and _f(cells, 1.85).outcome == "hurts"
    # a model far outside the cells' sizes (more than REACH beyond): uncertain, naming its size
    big = _f(cells, 2.0, params=1.6e5 * REACH * 1.5)
    assert big.outcome == "uncertain" and "outside that range" in big.evidence
    # tokens per parameter far outside theirs (10): uncertain
    assert _f(cells, 2.0, unique=1e8).outcome == "uncertain"
    assert _f([], 2.0).outcome == "uncertain"


def test_checkpoint_selection_is_counted_from_the_best_losses():
    cells = [dataclasses.replace(c, best_delta=0.02) for c in HIGH] + LOW
    f = _f(cells, 100.0)
    assert "in the 6 known cells that recorded each arm's best held-out loss" in f.checkpoint_selection
    assert "beat LayerNorm's best in 0; where DyT's final loss won (6), LayerNorm's final loss was above its own best" in (
        f.checkpoint_selection)
    one = [dataclasses.replace(HIGH[0], best_delta=-0.01)] + HIGH[1:]
    assert "beat LayerNorm's best in 1." in _f(one, 100.0).checkpoint_selection


def test_bad_counts_are_refused_and_an_unknown_run_says_how_to_give_them():
    with pytest.raises(ValueError, match="Expected planned_tokens as a positive number"):
        forecast_from(LOW, params=1e5, unique_tokens=1e6, planned_tokens=0)
    with pytest.raises(ValueError, match="Expected params"):
        forecast_from(LOW, params=True, unique_tokens=1e6, planned_tokens=1e6)
    u = unknown_forecast(1e5, "an IterableDataset has no length")
    assert u.outcome == "uncertain" and u.passes is None and u.code == 0.0
    assert "planned_tokens=" in u.line() and "train_tokens=" in u.line()
    f = _f(LOW, 2.0)
    assert isinstance(f, Forecast) and Forecast(**f.to_dict()) == f
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.outcome = "helps"  # type: ignore[misc]
