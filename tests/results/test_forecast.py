"""The forecast from the planned passes: the rule read from hand-made cell sets whose answer is known, its domain
(hull, steps, schedule) and its statistics checked against references computed here by hand."""

from __future__ import annotations

import dataclasses
import math
import re
from decimal import Decimal
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
import torch

from satmon.results.forecast import (
    Forecast,
    KnownCell,
    clopper_pearson,
    forecast,
    forecast_from,
    hull_distance,
    known_cells,
    unknown_forecast,
)

STUDY = dict(steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")
RUN = dict(**STUDY, family="gpt", alpha_init=2.0)
CELL = dict(**STUDY, family="gpt", alpha_init=2.0)


def _grid(passes: float, delta: float, source: str = "hand") -> list[KnownCell]:
    """A 3 x 3 square of configurations in (log params, log tokens per parameter): 1e5-1e7 x 1-100, each 2 seeds."""
    cells = []
    for i, (a, b) in enumerate(product((5, 6, 7), (0, 1, 2))):
        for seed in range(2):
            cells.append(
                KnownCell(
                    f"{source}{passes}_{i}_s{seed}",
                    10.0**a,
                    passes,
                    delta,
                    f"g{i}",
                    source,
                    unique_tokens=10.0 ** (a + b),
                    best_delta=delta,
                    **CELL,
                )
            )
    return cells


LOW, HIGH = _grid(2.0, 0.1), _grid(100.0, -0.1)


def _f(cells, passes, params=1e6, tpp=10.0, **kw):
    unique = params * tpp
    return forecast_from(cells, params=params, unique_tokens=unique, planned_tokens=passes * unique, **{**RUN, **kw})


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
    assert between.outcome == "uncertain" and "sign changes between them" in between.evidence
    assert between.configurations == 18 and "9 of the 9 configurations at 2 passes" in between.evidence


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
        "uncertain"
    )


def test_hull_distance_against_a_hand_computed_square():
    sq = [(0.0, 0.0), (2.0, 0.0), (2.0, 2.0), (0.0, 2.0), (1.0, 1.0)]
    assert hull_distance((1.0, 0.5), sq) == 0.0 and hull_distance((3.0, 1.0), sq) == 1.0
    assert hull_distance((3.0, 3.0), sq) == pytest.approx(math.sqrt(2)) and hull_distance(
        (5.0, 5.0), [(1.0, 1.0)]
    ) == math.hypot(4, 4)
    assert hull_distance((1.0, 1.0), [(0.0, 0.0), (2.0, 2.0)]) == 0.0  # on a degenerate (collinear) hull


def test_steps_and_schedule_outside_the_cells_or_unknown_are_uncertain():
    for kw, said in (
        (dict(steps=500, warmup_steps=200), "500 optimizer steps"),
        (dict(warmup_steps=100), "warm-up is 2%"),
        (dict(lr_schedule="linear-warmup-cosine"), "learning rate is linear-warmup-cosine"),
        (dict(lr_schedule="unknown"), "schedule is unknown"),
        (dict(steps=None), "steps are not given"),
    ):
        f = _f(LOW, 2.0, **kw)
        assert f.outcome == "uncertain" and said in f.evidence, kw
    unrecorded = [dataclasses.replace(c, steps=None, lr_schedule=None) for c in LOW]
    assert "did not record their schedule" in _f(unrecorded, 2.0).evidence


def test_the_issues_examples_are_not_confident_on_the_shipped_cells():
    assert forecast(params=25_000, unique_tokens=1_000, planned_tokens=3_000).outcome == "uncertain"
    assert forecast(params=25_000, unique_tokens=1_000, planned_tokens=3_000, **STUDY).outcome == "uncertain"
    assert forecast(params=4e9, unique_tokens=4e11, planned_tokens=1.2e12, **STUDY).outcome == "uncertain"
    assert (
        forecast(
            params=115_013,
            unique_tokens=1_000_000,
            planned_tokens=1_280_000,
            steps=500,
            warmup_steps=0,
            lr_schedule="constant",
        ).outcome
        == "uncertain"
    )  # a 500-step run: no cell trained 500 steps
    at3 = forecast(params=115_013, unique_tokens=1_551_515, planned_tokens=5_120_000, **STUDY)
    # the configuration: recipe x size x passes (the faithful grid's and grid 2's d64L2 at 3.3 passes are one)
    configs = {(c.recipe, c.group) for c in known_cells() if abs(math.log(c.passes / 3.3)) < math.log(1.1)}
    assert at3.configurations == len(configs) and at3.p_value == 0.5 ** len(configs)


def test_every_real_number_type_is_a_count_and_bad_counts_are_blamed_on_the_count():
    ref = _f(LOW, 2.0)
    unique = 1e7
    for kind in (np.int64, np.float32, lambda x: torch.tensor(x), Decimal, Fraction, int):
        f = forecast_from(
            LOW, params=kind(1_000_000), unique_tokens=kind(10_000_000), planned_tokens=kind(20_000_000), **RUN
        )
        assert f.outcome == ref.outcome and f.passes == 2.0, kind
    with pytest.raises(ValueError, match="too large") as e:
        forecast_from(LOW, params=10**400, unique_tokens=unique, planned_tokens=unique)
    assert "\n" not in str(e.value)
    for bad in (0, True, "1e6", math.nan, -5):
        with pytest.raises(ValueError, match="Expected params as a positive number"):
            forecast_from(LOW, params=bad, unique_tokens=unique, planned_tokens=unique)
    from satmon.results.forecast import run_forecast

    card = run_forecast(10**400, 1e6, 2e6)
    assert "count is not usable" in card.evidence and "could not be read" not in card.evidence


def test_unknown_run_and_the_frozen_result():
    u = unknown_forecast(1e5, "an IterableDataset has no length")
    assert u.outcome == "uncertain" and u.passes is None and u.code == 0.0 and "planned_tokens=" in u.line()
    f = _f(LOW, 2.0)
    assert isinstance(f, Forecast) and Forecast.from_dict(f.to_dict()) == f
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.outcome = "helps"  # type: ignore[misc]


def test_the_nearest_measured_cells_are_of_two_configurations_not_two_seeds_of_one():
    """An uncertain answer outside the domain names the two nearest configurations (their nearest seed each)."""
    cells = [
        KnownCell(
            f"c{size}_s{seed}",
            params=size,
            passes=2.0,
            delta=0.1,
            group=f"g{size}",
            source="m",
            unique_tokens=size * tpp,
            **CELL,
        )
        for size, tpp in ((1e5, 10), (3e5, 3), (1e6, 1), (3e6, 0.3), (1e7, 0.1))
        for seed in (0, 1)
    ]
    f = forecast_from(
        cells, params=1e4, unique_tokens=1e6, planned_tokens=2e6, **RUN
    )  # 100 tokens per parameter: far outside
    named = re.findall(r"(c[\d.e+]+_s\d) \(", f.evidence.split("nearest measured:")[1])
    assert f.outcome == "uncertain" and named == ["c100000.0_s0", "c300000.0_s0"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(params=float("inf")), "params as a positive number, got inf: pass a finite count"),
        (dict(params=Decimal("Infinity")), "params as a positive number, got Decimal('Infinity')"),
        (dict(params=Decimal("sNaN")), "params as a positive number, got Decimal('sNaN')"),
        (dict(params=Decimal("1e400")), "params as a positive number a float can hold"),
        (dict(lr_schedule=5), "lr_schedule as the learning rate's shape, a str"),
        (dict(lr_schedule=" "), "lr_schedule as the learning rate's shape, a str"),
        (dict(warmup_steps=True), "warmup_steps as a positive number, got True"),
    ],
)
def test_a_bad_count_or_schedule_is_one_line_naming_it(kw, message):
    run = dict(
        params=115013,
        unique_tokens=1551515,
        planned_tokens=5.12e6,
        steps=5000,
        warmup_steps=2000,
        lr_schedule="linear-warmup-constant",
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        forecast(**{**run, **kw})


# ------------------------------------------------------------------ surest where it measured (the issue's rules)
def test_a_measured_budget_is_read_alone_and_between_budgets_is_never_surer_than_either_end():
    five = _grid(2.0, 0.1)[:10]  # 5 configurations at 2 passes: p = 1/32
    nine = _grid(8.0, 0.1)  # 9 configurations at 8 passes: p = 1/512
    at2, at8 = _f(five + nine, 2.0, params=1e5, tpp=1.0), _f(five + nine, 8.0, params=1e5, tpp=1.0)
    assert (at2.outcome, at2.configurations, at2.p_value) == ("hurts", 5, 0.5**5)  # 8 passes does not bear at 2
    assert (at8.outcome, at8.configurations, at8.p_value) == ("hurts", 9, 0.5**9)
    mid = _f(five + nine, 4.0, params=1e5, tpp=1.0)
    # between: both ends bear, each on its own; the p is the weaker end's, not the pooled 2**-14
    assert (mid.outcome, mid.configurations, mid.p_value) == ("hurts", 14, 0.5**5)
    assert mid.p_value >= max(at2.p_value, at8.p_value) and "each read on its own" in mid.evidence
    weak = _f(five[:8] + nine, 4.0, params=1e5, tpp=1.0)  # 4 configurations at 2 passes: that end cannot pass
    assert weak.outcome == "uncertain" and "at 2 passes too few configurations (p = 0.062)" in weak.evidence


def test_the_configuration_is_recipe_size_passes_with_seeds_averaged():
    from satmon.results.forecast import configurations

    a = KnownCell("a_s0", 1e5, 3.28, 0.10, "d64L2", "first grid", recipe="builtin")
    b = KnownCell("b_s2", 1e5, 3.30, -0.02, "d64L2", "second grid", recipe="builtin")
    c = KnownCell("c_s0", 1e5, 3.30, 0.05, "d64L2", "the study")  # another recipe (its source): its own configuration
    got = configurations([a, b, c])
    assert [(g.recipe, g.seeds) for g in got] == [("builtin", 2), ("the study", 1)]
    assert got[0].delta == pytest.approx((0.10 - 0.02) / 2) and got[0].outcome == "hurts" and not got[0].seeds_agree


def test_the_family_alpha_init_and_optimizer_are_the_domain():
    llama = [dataclasses.replace(c, family="llama", name="L" + c.name, recipe="llama") for c in LOW]
    assert _f(LOW, 2.0, family="llama").evidence.startswith("no known cell of the llama family")
    assert (
        _f(LOW, 2.0, family=None).outcome == "uncertain" and "family is not given" in _f(LOW, 2.0, family=None).evidence
    )
    both = _f(LOW + [dataclasses.replace(c, delta=-0.1) for c in llama], 2.0, family="llama")
    assert (both.outcome, both.configurations) == ("helps", 9)  # the GPT cells do not bear on a LLaMA-family run
    assert "alpha_init is 0.5, theirs 2 (each within a factor 1.1: 1.82-2.2)" in _f(LOW, 2.0, alpha_init=0.5).evidence
    assert "alpha_init is 0.2-0.8" in _f(LOW, 2.0, alpha_init=(0.8, 0.2)).evidence
    assert _f(LOW, 2.0, alpha_init=None).outcome == "uncertain"
    sgd = [dataclasses.replace(c, optimizer="adamw") for c in LOW]
    assert "its optimizer is sgd, theirs adamw" in _f(sgd, 2.0, optimizer="SGD").evidence
    assert _f(sgd, 2.0, optimizer="AdamW").outcome == "hurts"
    with pytest.raises(ValueError, match="Expected family as one of gpt, llama"):
        _f(LOW, 2.0, family="bert")


def test_an_empty_region_inside_the_hull_is_uncertain():
    """Four corners two decades apart: the centre is inside their hull, one decade and more from every cell."""
    corners = [
        KnownCell(f"k{a}{b}_s{s}", 10.0**a, 2.0, 0.1, f"g{a}{b}", "hand", unique_tokens=10.0 ** (a + b), **CELL)
        for a, b in product((5, 7), (0, 2))
        for s in (0, 1)
    ]
    corners += [
        dataclasses.replace(c, group=c.group + "x", name=c.name + "x") for c in corners[:2]
    ]  # a 5th configuration
    centre = _f(corners, 2.0, params=1e6, tpp=10.0)
    assert centre.outcome == "uncertain" and "where no cell was measured" in centre.evidence
    assert _f(corners, 2.0, params=1.5e5, tpp=1.0).outcome == "hurts"  # 0.18 decades from a measured corner


def test_the_shipped_cells_are_counted_by_the_plans_unit_and_a_llama_run_is_never_confident():
    at3 = forecast(params=115_013, unique_tokens=1_551_515, planned_tokens=5_120_000, **RUN)
    assert at3.outcome == "uncertain" and at3.configurations == 4 and at3.p_value == 0.5**4  # the issue's count
    llama = forecast(params=115_013, unique_tokens=3_657_143, planned_tokens=5_120_000, **{**RUN, "family": "llama"})
    assert llama.outcome == "uncertain" and llama.rests_on == ("d64L2 at 1.5 passes (satmon-llama)",)
    # a scan between the grids' sizes and the study's (400k-60M parameters, where no cell is): never confident
    for params in np.geomspace(4e5, 6e7, 9):
        for passes in (1.4, 3.3, 16, 100):
            f = forecast(
                params=float(params),
                unique_tokens=5.12e6 / passes * params / 115_013,
                planned_tokens=5.12e6 * params / 115_013,
                **RUN,
            )
            assert f.outcome == "uncertain", (params, passes, f.evidence)


# ------------------------------------------------------------------ the final norm and alpha_init ranges in the domain
def _recorded(cells, **kw):
    return [dataclasses.replace(c, **kw) for c in cells]


def test_a_final_norm_the_cells_record_must_be_the_runs():
    dyt = _recorded(LOW, final_norm="dyt")
    before = _f(LOW, 2.0)  # the cells record none: the answer of before, whatever the run's final norm
    assert before.outcome == "hurts" and before.final_norm is None
    for kind in ("dyt", "norm", None):
        f = _f(LOW, 2.0, final_norm=kind)
        assert dataclasses.replace(f, final_norm=None) == before, kind
    same = _f(dyt, 2.0, final_norm="dyt")
    assert (same.outcome, same.p_value, same.final_norm) == ("hurts", before.p_value, "dyt")
    assert same.evidence == before.evidence
    other = _f(dyt, 2.0, final_norm="LayerNorm")  # read as "norm"
    assert other.outcome == "uncertain" and other.final_norm == "norm"
    assert "its final norm is LayerNorm or RMSNorm (final_norm='norm'), theirs DyT in 18 of the 18 cells" in (
        other.evidence
    )
    unknown = _f(dyt, 2.0)
    assert unknown.outcome == "uncertain" and "final norm (the norm before the head) is not known" in unknown.evidence
    assert "final_norm='dyt'" in unknown.evidence
    # some cells record it, the others do not: the recorded ones decide, the silent ones do not bar
    half = dyt[:8] + LOW[8:]
    confident = _f(half, 2.0, final_norm="dyt")
    assert confident.outcome == "hurts" and "its final norm checked against 8 of the 18 cells" in confident.evidence
    assert "theirs DyT in 8 of the 18 cells" in _f(half, 2.0, final_norm="rmsnorm").evidence
    # cells that record both kinds: no run is like all of them
    mixed = dyt[:8] + _recorded(LOW[8:], final_norm="norm")
    for kind in ("dyt", "norm"):
        f = _f(mixed, 2.0, final_norm=kind)
        assert (
            f.outcome == "uncertain" and "theirs DyT in 8 and LayerNorm or RMSNorm in 10 of the 18 cells" in f.evidence
        )
    # only the bearing cells count: a final norm recorded at another budget does not bar
    assert _f(LOW + _recorded(HIGH, final_norm="norm"), 2.0, final_norm="dyt").outcome == "hurts"
    for bad in ("batchnorm", 3, "  x ", ""):
        with pytest.raises(ValueError, match="Expected final_norm as 'dyt' .* or 'norm'"):
            _f(LOW, 2.0, final_norm=bad)


def test_the_final_norm_travels_with_the_forecast_and_old_records_load():
    from satmon.results.forecast import with_model

    f = _f(_recorded(LOW, final_norm="dyt"), 2.0, final_norm="dyt")
    d = f.to_dict()
    assert d["final_norm"] == "dyt" and Forecast.from_dict(d) == f
    old = {k: v for k, v in d.items() if k != "final_norm"}  # a record written before the field
    assert Forecast.from_dict(old).final_norm is None and Forecast.from_dict(old).outcome == "hurts"
    # with_model on the shipped cells: the model's final norm reaches the forecast (layernorm read as norm)
    base = forecast(params=115_013, unique_tokens=3_657_143, planned_tokens=5_120_000, **RUN)
    assert base.final_norm is None and with_model(base, "gpt", 2.0, "layernorm").final_norm == "norm"
    again = with_model(base, "gpt", 2.0, "dyt")
    assert again == forecast(params=115_013, unique_tokens=3_657_143, planned_tokens=5_120_000, **RUN, final_norm="dyt")
    assert with_model(again, "gpt", 2.0) is again  # nothing new


def test_the_shipped_grids_record_dyt_before_the_head():
    """d64L2 at 1.4 passes: the configurations there agree (hurts); the grids' cells record DyT before the head, so a
    run with LayerNorm there, or one that does not say, is uncertain, naming final_norm."""
    run = dict(params=115_013, unique_tokens=3_657_143, planned_tokens=5_120_000, **RUN)
    assert forecast(**run, final_norm="dyt").outcome == "hurts"
    for kind in ("norm", None):
        f = forecast(**run, final_norm=kind)
        assert f.outcome == "uncertain" and "final_norm=" in f.evidence, kind


def test_alpha_init_ranges_in_cells_and_runs():
    llama_like = _recorded(LOW, alpha_init=0.2, alpha_init_max=0.8)  # 0.8 before attention, 0.2 before the MLP
    assert _f(llama_like, 2.0, alpha_init=(0.8, 0.2)).outcome == "hurts"
    assert _f(llama_like, 2.0, alpha_init=0.5).outcome == "hurts"  # one init inside the cells' range
    assert _f(llama_like, 2.0, alpha_init=(0.19, 0.87)).outcome == "hurts"  # within a factor 1.1 either way
    wide = _f(llama_like, 2.0, alpha_init=(0.2, 2.0))
    assert wide.outcome == "uncertain"
    assert "its DyT alpha_init is 0.2-2, theirs 0.2-0.8 (each within a factor 1.1: 0.182-0.88)" in wide.evidence
    assert "theirs 0.2-0.8)" in _f(llama_like, 2.0, alpha_init=None).evidence
    # the union of two cells' inits, not the span between them: nothing was measured at 1.0
    two = _recorded(LOW[:10], alpha_init=0.5) + LOW[10:]
    assert _f(two, 2.0, alpha_init=0.5).outcome == _f(two, 2.0, alpha_init=2.0).outcome == "hurts"
    between = _f(two, 2.0, alpha_init=1.0)
    assert between.outcome == "uncertain" and "theirs 0.5 and 2 (each within a factor 1.1: 0.455-0.55, 1.82-2.2)" in (
        between.evidence
    )
    # overlapping widened ranges join: 0.2-0.8 and 0.9 are one interval (0.88 > 0.9 / 1.1)
    joined = _recorded(LOW[:10], alpha_init=0.2, alpha_init_max=0.8) + _recorded(LOW[10:], alpha_init=0.9)
    assert _f(joined, 2.0, alpha_init=(0.2, 0.9)).outcome == "hurts"
    with pytest.raises(ValueError, match="Expected alpha_init_max .* at least alpha_init 0.8, got 0.2"):
        KnownCell("x", 1e5, 2.0, 0.1, "g", "m", alpha_init=0.8, alpha_init_max=0.2)
