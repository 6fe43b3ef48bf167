"""The forecast from the planned passes: the rule read from hand-made cell sets whose answer is known, its domain
(hull, steps, schedule) and its statistics checked against references computed here by hand."""

from __future__ import annotations

import re
import dataclasses
import math
from decimal import Decimal
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
import torch

from satmon.io.known_cells import forecast, known_cells
from satmon.results.forecast import Forecast, KnownCell, clopper_pearson, forecast_from, hull_distance, unknown_forecast

STUDY = dict(steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")


def _grid(passes: float, delta: float, source: str = "hand") -> list[KnownCell]:
    """A 3 x 3 square of configurations in (log params, log tokens per parameter): 1e5-1e7 x 1-100, each 2 seeds."""
    cells = []
    for i, (a, b) in enumerate(product((5, 6, 7), (0, 1, 2))):
        for seed in range(2):
            cells.append(KnownCell(f"{source}{passes}_{i}_s{seed}", 10.0**a, passes, delta, f"g{i}", source,
                                   train_tokens=10.0 ** (a + b), best_delta=delta, **STUDY))
    return cells


LOW, HIGH = _grid(2.0, 0.1), _grid(100.0, -0.1)


def _f(cells, passes, params=1e6, tpp=10.0, **kw):
    unique = params * tpp
    return forecast_from(cells, params=params, unique_tokens=unique, planned_tokens=passes * unique, **{**STUDY, **kw})


def test_inside_the_hull_with_the_cells_schedule_is_confident_and_seeds_count_once():
    f = _f(LOW + HIGH, 2.0)
    assert (f.outcome, f.cells, f.configurations, f.agreeing) == ("hurts", 18, 9, 9)
    assert f.p_value == 0.5**9  # by hand: 9 configurations, not 18 cells
    assert _f(LOW + HIGH, 100.0).outcome == "helps"


def test_cells_at_other_budgets_do_not_bear_on_the_run():
    # a budget at 10 passes that helped does not make 2 passes uncertain, nor does 2 passes' hurting reach 100
    f = _f(LOW + _grid(10.0, -0.1) + HIGH, 2.0)
    assert f.outcome == "hurts" and f.configurations == 9
    between = _f(LOW + _grid(10.0, -0.1), 4.0)  # bracketed by 2 (hurt) and 10 (helped): the two disagree
    assert between.outcome == "uncertain" and "9 of the 18 configurations" in between.evidence


def test_partial_agreement_says_the_rate_and_its_exact_interval():
    cells = [dataclasses.replace(c, delta=-0.1) if c.group == "g0" and c.name.endswith("s0") else c for c in LOW]
    f = _f(cells, 2.0)  # g0's seeds disagree: that configuration does not agree
    assert f.outcome == "uncertain" and f.agreeing == 8 and "8 of the 9 configurations" in f.evidence
    lo, hi = clopper_pearson(8, 9)
    # reference by hand: P(X >= 8 | lo) = 0.025 and P(X <= 8 | hi) = 0.025
    tail = lambda k, n, r: sum(math.comb(n, i) * r**i * (1 - r) ** (n - i) for i in range(k, n + 1))  # noqa: E731
    assert tail(8, 9, lo) == pytest.approx(0.025, abs=1e-9) and 1 - tail(9, 9, hi) == pytest.approx(0.025, abs=1e-9)
    assert f"{lo:.0%}-{hi:.0%}" in f.evidence


def test_outside_the_hull_is_uncertain_and_names_the_nearest_cells():
    for params, tpp in ((1e6, 1e4), (1e9, 10.0), (3e7, 300.0)):
        f = _f(LOW, 2.0, params=params, tpp=tpp)
        assert f.outcome == "uncertain" and "nearest measured" in f.evidence, (params, tpp)
    # jointly, not one at a time: a diagonal band where each coordinate alone is in range
    band = [c for c in LOW if round(math.log10(c.params)) + round(math.log10(c.tokens_per_param)) == 7]
    assert _f(band + [dataclasses.replace(c, group=c.group + "x") for c in band], 2.0, params=1e5, tpp=1.0).outcome == (
        "uncertain")


def test_hull_distance_against_a_hand_computed_square():
    sq = [(0.0, 0.0), (2.0, 0.0), (2.0, 2.0), (0.0, 2.0), (1.0, 1.0)]
    assert hull_distance((1.0, 0.5), sq) == 0.0 and hull_distance((3.0, 1.0), sq) == 1.0
    assert hull_distance((3.0, 3.0), sq) == pytest.approx(math.sqrt(2)) and hull_distance((5.0, 5.0), [(1.0, 1.0)]) == math.hypot(4, 4)
    assert hull_distance((1.0, 1.0), [(0.0, 0.0), (2.0, 2.0)]) == 0.0  # on a degenerate (collinear) hull


def test_steps_and_schedule_outside_the_cells_or_unknown_are_uncertain():
    for kw, said in ((dict(steps=500, warmup_steps=200), "500 optimizer steps"),
                     (dict(warmup_steps=100), "warm-up is 2%"),
                     (dict(lr_schedule="linear-warmup-cosine"), "learning rate is linear-warmup-cosine"),
                     (dict(lr_schedule="unknown"), "schedule is unknown"), (dict(steps=None), "steps are not given")):
        f = _f(LOW, 2.0, **kw)
        assert f.outcome == "uncertain" and said in f.evidence, kw
    unrecorded = [dataclasses.replace(c, steps=None, lr_schedule=None) for c in LOW]
    assert "did not record their schedule" in _f(unrecorded, 2.0).evidence


def test_the_issues_examples_are_not_confident_on_the_shipped_cells():
    assert forecast(params=25_000, unique_tokens=1_000, planned_tokens=3_000).outcome == "uncertain"
    assert forecast(params=25_000, unique_tokens=1_000, planned_tokens=3_000, **STUDY).outcome == "uncertain"
    assert forecast(params=4e9, unique_tokens=4e11, planned_tokens=1.2e12, **STUDY).outcome == "uncertain"
    assert forecast(params=115_013, unique_tokens=1_000_000, planned_tokens=1_280_000, steps=500, warmup_steps=0,
                    lr_schedule="constant").outcome == "uncertain"  # a 500-step run: no cell trained 500 steps
    at3 = forecast(params=115_013, unique_tokens=1_551_515, planned_tokens=5_120_000, **STUDY)
    configs = {(c.source, c.group) for c in known_cells() if abs(math.log(c.passes / 3.3)) < math.log(1.1)}
    assert at3.configurations == len(configs) and at3.p_value == 0.5 ** len(configs)


def test_every_real_number_type_is_a_count_and_bad_counts_are_blamed_on_the_count():
    ref = _f(LOW, 2.0)
    unique = 1e7
    for kind in (np.int64, np.float32, lambda x: torch.tensor(x), Decimal, Fraction, int):
        f = forecast_from(LOW, params=kind(1_000_000), unique_tokens=kind(10_000_000), planned_tokens=kind(20_000_000),
                          **STUDY)
        assert f.outcome == ref.outcome and f.passes == 2.0, kind
    with pytest.raises(ValueError, match="too large") as e:
        forecast_from(LOW, params=10**400, unique_tokens=unique, planned_tokens=unique)
    assert "\n" not in str(e.value)
    for bad in (0, True, "1e6", math.nan, -5):
        with pytest.raises(ValueError, match="Expected params as a positive number"):
            forecast_from(LOW, params=bad, unique_tokens=unique, planned_tokens=unique)
    from satmon.io.known_cells import run_forecast
    card = run_forecast(10**400, 1e6, 2e6)
    assert "count is not usable" in card.evidence and "could not be read" not in card.evidence


def test_unknown_run_and_the_frozen_result():
    u = unknown_forecast(1e5, "an IterableDataset has no length")
    assert u.outcome == "uncertain" and u.passes is None and u.code == 0.0 and "planned_tokens=" in u.line()
    f = _f(LOW, 2.0)
    assert isinstance(f, Forecast) and Forecast(**f.to_dict()) == f
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.outcome = "helps"  # type: ignore[misc]


def test_the_nearest_measured_cells_are_of_two_configurations_not_two_seeds_of_one():
    """An uncertain answer outside the domain names the two nearest configurations (their nearest seed each)."""
    cells = [KnownCell(f"c{size}_s{seed}", params=size, passes=2.0, delta=0.1, group=f"g{size}", source="m",
                       train_tokens=size * tpp, steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")
             for size, tpp in ((1e5, 10), (3e5, 3), (1e6, 1), (3e6, 0.3), (1e7, 0.1)) for seed in (0, 1)]
    f = forecast_from(cells, params=1e4, unique_tokens=1e6, planned_tokens=2e6, steps=5000, warmup_steps=2000,
                      lr_schedule="linear-warmup-constant")  # 100 tokens per parameter: far outside
    named = re.findall(r"(c[\d.e+]+_s\d) \(", f.evidence.split("nearest measured:")[1])
    assert f.outcome == "uncertain" and named == ["c100000.0_s0", "c300000.0_s0"]


@pytest.mark.parametrize(("kw", "message"), [
    (dict(params=float("inf")), "params as a positive number, got inf: pass a finite count"),
    (dict(params=Decimal("Infinity")), "params as a positive number, got Decimal('Infinity')"),
    (dict(params=Decimal("sNaN")), "params as a positive number, got Decimal('sNaN')"),
    (dict(params=Decimal("1e400")), "params as a positive number a float can hold"),
    (dict(lr_schedule=5), "lr_schedule as the learning rate's shape, a str"),
    (dict(lr_schedule=" "), "lr_schedule as the learning rate's shape, a str"),
    (dict(warmup_steps=True), "warmup_steps as a positive number, got True"),
])
def test_a_bad_count_or_schedule_is_one_line_naming_it(kw, message):
    run = dict(params=115013, unique_tokens=1551515, planned_tokens=5.12e6, steps=5000, warmup_steps=2000,
               lr_schedule="linear-warmup-constant")
    with pytest.raises(ValueError, match=re.escape(message)):
        forecast(**{**run, **kw})
