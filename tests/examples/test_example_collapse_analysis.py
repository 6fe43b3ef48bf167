"""The collapse grid's scoring (examples/collapse_analysis.py, docs/plans/collapse_plan.md Amendment 1), frozen before
any scored cell: on synthetic cells with a known answer (labels, hits, misses, false stops, lead time), Fisher's
exact p against a brute-force count of the flagged subsets, Clopper-Pearson against closed forms and published
values, the minimal designs and the power of a design."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import pytest

from conftest import load_example

U = 3.0  # the unigram level of the synthetic cells


@pytest.fixture(scope="module")
def ca():
    return load_example("collapse_analysis")


def _curve(values, every=100):
    return [[every * (i + 1), v] for i, v in enumerate(values)]


def _cell(
    size,
    seed,
    vary,
    curve,
    *,
    train=None,
    ref_best=1.6,
    checks=(),
    window_risk=False,
    first_flag=None,
    trap_first=None,
    arm="dyt",
    steps=1000,
    window=500,
):
    checks = list(checks)
    watch = {
        "checks": checks,
        "window_collapse_risk": window_risk,
        "first_flag_step": first_flag,
        "would_stop_at": window if window_risk else first_flag,
        "trap": {"checks": [], "first_trapped_step": trap_first},
    }
    return {
        "group": size,
        "seed": seed,
        "vary": vary,
        "unigram_loss": U,
        "window": window,
        "steps": steps,
        "reference_arm": "rmsnorm",
        "arms": {
            "rmsnorm": {
                "best_val_loss": ref_best,
                "val_curve": _curve([2.5, 2.0, ref_best + 0.1] + [ref_best] * 7),
                "train_curve": [],
            },
            arm: {"val_curve": curve, "train_curve": train if train is not None else curve, "watch": watch},
        },
    }


NEVER = _curve([3.2, 3.05, 3.0, 2.98, 2.97, 2.96, 2.95, 2.95, 2.95, 2.95])  # best 2.95 >= 0.95 x 3 = 2.85
LOST = _curve([2.6, 2.1, 2.0, 2.2, 2.4, 2.5, 2.6, 2.6, 2.65, 2.7])  # best 2.0; 2.7 - 2.0 >= 0.25 x 1.0
HEALTHY = _curve([2.6, 2.1, 1.9, 1.8, 1.75, 1.7, 1.7, 1.72, 1.7, 1.69])
BEHIND = _curve([2.6, 2.4, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3])  # learned (2.3 < 2.7), never lost, 2.3 > 1.1 x 1.6
LATE = _curve([2.6, 2.1, 1.9, 1.8, 1.75, 1.8, 1.9, 2.1, 2.3, 2.4])  # lost only after step 600


def test_outcomes_from_the_held_out_loss(ca):
    assert ca.outcome(NEVER, U, 1.5) == "never learned"
    assert ca.outcome(LOST, U, 1.5) == "learned then lost"
    assert ca.outcome(HEALTHY, U, 1.5) == "healthy"
    assert ca.outcome(HEALTHY, U, 2.75) == "excluded"  # the reference did not learn (2.75 >= 0.9 x 3 = 2.7)
    assert ca.outcome(_curve([3.0, 2.8, 2.75]), U, 1.5) == "marginal"  # best 2.75: between 0.9 and 0.95 x unigram
    assert ca.outcome(_curve([2.5, 2.0, None, None]), U, 1.5) == "learned then lost"  # non-finite after learning
    assert ca.outcome(_curve([None, None]), U, 1.5) == "never learned"
    # a rise of less than a quarter of what was learned is not a loss: best 1.75, last 1.75 + 0.3 < 1.75 + 0.3125
    assert ca.outcome(_curve([2.0, 1.75, 2.05]), U, 1.5) == "healthy"
    assert ca.outcome(_curve([2.0, 1.75, 2.0625]), U, 1.5) == "learned then lost"  # exactly a quarter: lost
    # learned, not lost, but its last loss is more than 1.1 x the reference's: fell behind (1.7 > 1.1 x 1.5 = 1.65)
    assert ca.outcome(HEALTHY, U, 1.5, reference_last=1.5) == "fell behind"
    assert ca.outcome(HEALTHY, U, 1.5, reference_last=1.6) == "healthy"  # 1.69 <= 1.76


def test_labels_at_two_run_lengths(ca):
    assert ca.outcome(LATE, U, 1.5, length=600) == "healthy"
    assert ca.outcome(LATE, U, 1.5) == "learned then lost"  # best 1.75, last 2.4: 0.65 >= 0.3125
    assert ca.evident_step(LATE, U, "learned then lost") == 800  # 2.1 - 1.75 = 0.35 >= 0.3125 first at step 800
    assert ca.evident_step(NEVER, U, "never learned") == 300  # the first evaluation from step 300 on


def test_loss_rule_reads_the_training_loss(ca):
    assert ca.loss_rule_step(NEVER, U) == 300
    assert ca.loss_rule_step(LOST, U) == 500  # best 2.0 at 300; 2.4 - 2.0 = 0.4 >= 0.25 first at 500 (400: 0.2)
    assert ca.loss_rule_step(HEALTHY, U) is None
    assert ca.loss_rule_step(_curve([2.5, 2.0, None]), U) == 300
    assert ca.loss_rule_step(LATE, U, length=600) is None


def _brute_fisher(hits, misses, false_stops, quiet):
    """Every way to flag as many items as the table flags, among its failed and healthy items, counted."""
    items = [1] * (hits + misses) + [0] * (false_stops + quiet)
    flagged = hits + false_stops
    subsets = list(itertools.combinations(range(len(items)), flagged))
    return Fraction(sum(sum(items[i] for i in s) >= hits for s in subsets), len(subsets))


@pytest.mark.parametrize(
    "table",
    [(8, 0, 2, 2), (4, 0, 0, 5), (3, 1, 1, 3), (0, 3, 2, 2), (2, 2, 2, 2), (5, 0, 0, 2), (1, 0, 0, 9), (3, 2, 0, 4)],
)
def test_fisher_exact_against_a_brute_force_count(ca, table):
    assert ca.fisher_one_sided(*table) == _brute_fisher(*table)


def test_fisher_known_values(ca):
    assert ca.fisher_one_sided(4, 0, 0, 5) == Fraction(1, 126)  # the study's 4 collapses, 5 healthy, perfectly split
    assert abs(float(ca.fisher_one_sided(8, 0, 2, 2)) - 0.0909) < 1e-4  # the old plan's pilot rates (issue 49)


def test_clopper_pearson(ca):
    for n in (1, 4, 5, 12):
        assert ca.clopper_pearson(0, n)[1] == pytest.approx(1 - 0.025 ** (1 / n), abs=1e-9)
        assert ca.clopper_pearson(n, n)[0] == pytest.approx(0.025 ** (1 / n), abs=1e-9)
    assert ca.clopper_pearson(3, 10) == pytest.approx((0.0667, 0.6525), abs=1e-4)  # published tables
    assert ca.clopper_pearson(5, 10) == pytest.approx((0.1871, 0.8129), abs=1e-4)
    lo, hi = ca.clopper_pearson(7, 20)  # the defining tails, re-summed in float64
    assert math.fsum(math.comb(20, i) * lo**i * (1 - lo) ** (20 - i) for i in range(7, 21)) == pytest.approx(
        0.025, abs=1e-9
    )
    assert math.fsum(math.comb(20, i) * hi**i * (1 - hi) ** (20 - i) for i in range(8)) == pytest.approx(
        0.025, abs=1e-9
    )
    assert ca.clopper_pearson(0, 0) == (0.0, 1.0)


def test_minimal_designs_and_power(ca):
    designs = ca.minimal_designs()
    assert designs == [(1, 20), (2, 5), (3, 4), (4, 3), (5, 2), (20, 1)]
    for f, h in designs:  # each reaches p < 0.05 when perfectly separated, and one fewer of either does not
        assert ca.fisher_one_sided(f, 0, 0, h) < Fraction(1, 20)
        assert ca.fisher_one_sided(f - 1, 0, 0, h) >= Fraction(1, 20) if f > 1 else True
        assert ca.fisher_one_sided(f, 0, 0, h - 1) >= Fraction(1, 20) if h > 1 else True
    assert ca.power(5, 5, 1.0, 0.0) == 1.0 and ca.power(2, 2, 1.0, 0.0) == 0.0
    # power by hand for 3 failed, 4 healthy, every failure caught, false stops at 1/2: p < 0.05 only with 0 false stops
    assert ca.power(3, 4, 1.0, 0.5) == pytest.approx(0.5**4)


def _grid():
    """Two sizes, 5 configurations each, 2 seeds: per size one never learned, one lost, one healthy, one split, one
    that fell behind (flagged by the watch); the reference arm ends at 1.6 (best), 1.6 (last)."""
    cells = []
    sat = lambda v: [{"step": 550, "gated_saturation": v}, {"step": 600, "gated_saturation": v}]
    for size in ("d64L2", "d64L4"):
        for seed in (21, 22):
            cells += [
                _cell(
                    size,
                    seed,
                    {"lr": 0.01, "alpha_init": "2", "final_norm": "dyt"},
                    NEVER,
                    trap_first=100,
                    checks=sat(0.3),
                ),
                _cell(
                    size,
                    seed,
                    {"lr": 0.01, "alpha_init": "8", "final_norm": "rmsnorm"},
                    LOST,
                    first_flag=550,
                    checks=sat(0.9),
                ),
                _cell(size, seed, {"lr": 0.003, "alpha_init": "8", "final_norm": "rmsnorm"}, HEALTHY, checks=sat(0.1)),
                _cell(
                    size,
                    seed,
                    {"lr": 0.003, "alpha_init": "2", "final_norm": "rmsnorm"},
                    HEALTHY if seed == 21 else LOST,
                    window_risk=seed == 22,
                    first_flag=550 if seed == 22 else None,
                    checks=sat(0.1 if seed == 21 else 0.9),
                ),
                _cell(
                    size,
                    seed,
                    {"lr": 0.03, "alpha_init": "8", "final_norm": "rmsnorm"},
                    BEHIND,
                    first_flag=550,
                    checks=sat(0.8),
                ),
            ]
    return cells


def test_configurations_count_seeds_once(ca):
    arms = ca.arms_of(_grid())
    assert len(arms) == 20
    cf = ca.configurations(arms)
    assert len(cf) == 10 and all(c["seeds"] == 2 for c in cf)
    assert sorted(c["outcome"] for c in cf) == sorted(
        ["never learned", "learned then lost", "healthy", "split", "fell behind"] * 2
    )
    split = [c for c in cf if c["outcome"] == "split"]
    assert all(not c["flagged"] for c in split)  # one of two seeds flagged: not more than half
    lost = [c for c in cf if c["outcome"] == "learned then lost"]
    assert all(c["flagged"] and c["flag_step"] == 550 for c in lost)  # no window risk: the shipped stop is the watch's
    assert all(c["lead"] == 500 - 550 for c in lost)  # negative: the loss said it first


def test_score_hits_misses_false_stops_and_lead(ca):
    arms = ca.arms_of(_grid())
    s = ca.score(ca.configurations(arms, flag="watch"))
    lost, never = s["learned then lost"], s["never learned"]
    assert (lost["configurations"], lost["hits"], lost["misses"], lost["false_stops"], lost["healthy"]) == (
        2,
        2,
        0,
        0,
        2,
    )
    assert (never["hits"], never["misses"]) == (0, 2)  # the watch never fires on the trapped runs (gated sat 0.3)
    assert lost["lead"] == 500 - 550  # the loss rule fires at 500 (0.4 given back), the watch at 550
    assert lost["fisher_p"] == pytest.approx(1 / 6)  # 2 of 2 caught, 0 of 2 healthy: 1 / C(4, 2)
    assert lost["hit_ci"] == pytest.approx((0.025**0.5, 1.0))
    assert lost["saved"] == pytest.approx(2 * (1000 - 550) / 1000)
    assert s["listed"]["split"] and not s["listed"]["marginal"] and len(s["listed"]["fell behind"]) == 2
    behind = s["fell behind"]  # scored in its own rows, never as a false stop
    assert (behind["configurations"], behind["hits"], behind["false_stops"]) == (2, 2, 0)
    assert (s["failed or behind"]["configurations"], s["failed or behind"]["hits"]) == (6, 4)
    # a pooled row takes a configuration whose seeds differ within it: one seed lost, one fallen behind
    mixed = [*_grid(), _cell("d64L2", 21, {"lr": 0.05}, LOST, first_flag=550), _cell("d64L2", 22, {"lr": 0.05}, BEHIND)]
    s2 = ca.score(ca.configurations(ca.arms_of(mixed), flag="watch"))
    assert s2["learned then lost"]["configurations"] == 2 and s2["fell behind"]["configurations"] == 2
    assert s2["failed or behind"]["configurations"] == 7 and s2["failed or behind"]["hits"] == 4  # 1 of 2 seeds: not
    trap = ca.score(ca.configurations(arms, flag="trap"))["never learned"]
    assert (trap["hits"], trap["misses"], trap["false_stops"], trap["lead"]) == (2, 0, 0, 300 - 100)
    w500 = ca.score(ca.configurations(arms, flag="watch500"))  # the recorded checks after step 500, gated sat >= 0.5
    assert (w500["learned then lost"]["hits"], w500["never learned"]["hits"], w500["failed"]["false_stops"]) == (
        2,
        0,
        0,
    )
    never_flag = ca.score(ca.configurations(arms, flag_of=lambda a, lab: None))["failed"]
    assert (never_flag["hits"], never_flag["false_stops"], never_flag["fisher_p"]) == (0, 0, 1.0)


def test_signals_held_out_across_sizes(ca):
    rows = ca.held_out(ca.arms_of(_grid()), "gated_saturation", kinds=("learned then lost",))
    assert [(r["chosen_on"], r["scored_on"]) for r in rows] == [("d64L2", "d64L4"), ("d64L4", "d64L2")]
    for r in rows:  # healthy at 0.1, lost at 0.9: every level from 0.2 to 0.9 separates them; ties take the first
        assert r["level"] == 0.2
        assert (r["score"]["configurations"], r["score"]["hits"], r["score"]["false_stops"], r["score"]["healthy"]) == (
            1,
            1,
            0,
            1,
        )


def test_report_and_files(ca, tmp_path):
    cells = _grid()
    (tmp_path / "cells").mkdir()
    for i, c in enumerate(cells):
        (tmp_path / "cells" / f"c{i}.json").write_text(json.dumps(c))
    (tmp_path / "cells" / "c0.attempt.json").write_text("{}")
    assert len(ca.load_cells(tmp_path)) == len(cells)
    (tmp_path / "grid.json").write_text(json.dumps({"cells": cells}))
    rep = ca.report(ca.load_cells(tmp_path / "grid.json"), lengths=(600, None))
    assert set(rep["lengths"]) == {"600", "full"}
    assert rep["lengths"]["full"]["dyt"]["flags"]["loss rule"]["learned then lost"]["hits"] == 2
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="Expected a satmon grid"):
        ca.load_cells(tmp_path / "bad.json")


def test_pilot_rows_read_the_second_pilots_file(ca):
    ref = {
        "arm": "rmsnorm",
        "size": "d64L4",
        "lr": 0.01,
        "val_curve": _curve([2.5, 2.0, 1.8, 1.7, 1.6, 1.6]),
        "train_curve": [],
    }
    lost = {
        "arm": "dyt",
        "size": "d64L4",
        "lr": 0.01,
        "final_norm": "rmsnorm",
        "alpha_init": "8",
        "val_curve": _curve([2.5, 2.0, 2.1, 2.3, 2.5, 2.6]),
        "train_curve": _curve([2.5, 2.0, 2.1, 2.3, 2.5, 2.6]),
        "watch": {
            "checks": [{"step": 150, "gated_saturation": 0.9}],
            "window_collapse_risk": True,
            "first_flag_step": 150,
            "trap": {"first_trapped_step": None},
        },
    }
    pilot = {
        "unigram_loss": U,
        "arms": {"d64L4|lr0.01|rmsnorm|final_-|alpha_-": ref, "d64L4|lr0.01|dyt|final_rmsnorm|alpha_8": lost},
    }
    (row,) = ca.pilot_rows(pilot, lengths=(300, 600))
    # at 300 the best (2.0) is kept, last 2.1; at 600: 2.6 - 2.0 = 0.6 >= 0.25 x 1.0; the loss rule: 2.3 - 2.0 at 400
    assert row["outcomes"] == {300: "fell behind", 600: "learned then lost"}  # 2.1 > 1.1 x 1.8 at 300
    assert (row["reference_best"], row["best"], row["last"], row["watch"], row["loss_rule"]) == (
        1.6,
        2.0,
        2.6,
        150,
        400,
    )


def test_the_plans_pilot_table_is_the_pilots_data(ca):
    """docs/plans/collapse_plan.md's table of the second pilot is what the frozen scoring reads from its file."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    table = ca.pilot_markdown(ca.pilot_rows(json.loads((root / "data" / "collapse_pilot2.json").read_text())))
    plan = (root / "docs" / "plans" / "collapse_plan.md").read_text()
    assert table in plan
    pilot = json.loads((root / "data" / "collapse_pilot2.json").read_text())["pilot"]
    assert pilot["scored"] is False and pilot["seed"] == 31 and pilot["runs"][0]["commit"]
