"""The second grid's design and its pre-registered analysis (docs/plans/grid2_plan.md) against hand-made answers: the
chunked data design, the 30 cells, the stratified AUC and its within-size permutation test, the monotone
labelings of the power analysis, and the frozen hypotheses' scoring."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch

from conftest import load_example


@pytest.fixture(scope="module")
def rg():
    return load_example("regime_grid")


@pytest.fixture(scope="module")
def g2(rg):
    import sys

    sys.modules["regime_grid"] = rg
    return load_example("grid2_analysis")


def _grid2_cells():
    """The second grid's cells as ``satmon grid builtin --grid2`` (the ``grid2`` preset) runs them, in its order."""
    from satmon.grid.builtin import RECIPE
    from satmon.grid.engine import _resolve

    plan, settings, options = _resolve(RECIPE, "grid2", None, None, None, None, None)
    processed = settings.steps * RECIPE.step_tokens(options)
    plan.check(processed)
    return plan, processed, options


def test_the_grid_is_the_plans_30_cells():
    plan, processed, options = _grid2_cells()
    keys = plan.cells()
    assert len(keys) == 30 and options["data"] == "chunks"
    by_size = {}
    for size, budget, seed in keys:
        by_size.setdefault(size, set()).add((budget.text, seed))
    assert (
        {b for b, _ in by_size["d48L2"]}
        == {b for b, _ in by_size["d64L2"]}
        == {"3.3ep", "16ep", "32ep", "64ep", "100ep", "164ep"}
    )
    assert {b for b, _ in by_size["d96L3"]} == {"32ep", "64ep", "100ep"}
    assert {s for _, _, s in keys} == {2, 3}
    assert tuple(b.resolve(processed) for b in plan.budgets) == (1_551_515, 320_000, 160_000, 80_000, 51_200, 31_220)


def test_chunks_are_chosen_per_seed_nested_and_never_held_out():
    from satmon.grid.builtin import OPTIONS, cell_tokens

    _, _, o = _grid2_cells()
    train_all = torch.arange(o["val_offset"]) % 251  # position-coded bytes
    pos = torch.arange(o["val_offset"])
    small = cell_tokens(o, pos, 31_220, 2)
    big = cell_tokens(o, pos, 320_000, 2)
    other = cell_tokens(o, pos, 31_220, 3)
    assert small.numel() == 31_220 and big.numel() == 320_000
    assert torch.equal(big[:31_220], small)  # nested within a seed
    assert not torch.equal(small, other)  # seeds draw different text
    starts = small.view(-1)[: 15 * 2048].view(15, 2048)[:, 0]
    assert torch.all(starts % 2048 == 0)  # whole chunks, at chunk boundaries
    assert not torch.all(starts[1:] - starts[:-1] == 2048)  # not a prefix
    assert int(big.max()) < o["val_offset"]
    # the first grid's prefix design is unchanged, and so is its recorded config
    assert torch.equal(cell_tokens(OPTIONS, train_all, 1000, 5), train_all[:1000])
    from satmon.grid.builtin import RECIPE

    assert "data" not in RECIPE.shared_options(OPTIONS) and RECIPE.shared_options(o)["data"] == "chunks"


def _cell(group, seed, reading, helps, passes=10.0, tpp=1.0, best=None):
    return {
        "group": group,
        "seed": seed,
        "name": f"{group}_{seed}_{reading}",
        "delta": -0.1 if helps else 0.1,
        "best_val_loss_dyt": 1.0,
        "best_val_loss_layernorm": 0.9 if best is None else (1.1 if best else 0.9),
        "epochs": passes,
        "tokens_per_param": tpp,
        **{
            r: reading
            for r in (
                "window_saturation",
                "window_first_block",
                "window_last_block",
                "window_final_norm",
                "window_centered",
                "window_late",
            )
        },
    }


def _stratified_auc_by_hand(x, y, g):
    num = den = 0.0
    for i, j in combinations(range(len(x)), 2):
        if g[i] != g[j] or y[i] == y[j]:
            continue
        h, n = (i, j) if y[i] else (j, i)
        num += 1.0 if x[h] > x[n] else 0.5 if x[h] == x[n] else 0.0
        den += 1
    return num / den


def test_stratified_auc_ignores_levels_between_sizes(g2):
    rng = np.random.default_rng(1)
    x = list(rng.random(12))
    y = [bool(v) for v in rng.integers(0, 2, 12)]
    groups_of = ["a"] * 6 + ["b"] * 6
    x = [v + (10 if g == "b" else 0) for v, g in zip(x, groups_of)]  # size b reads 10 higher
    st = g2.Stratified({"r": x}, [list(range(6)), list(range(6, 12))])
    assert st.aucs(np.asarray([y]))[0, 0] == pytest.approx(_stratified_auc_by_hand(x, y, groups_of))


def test_within_size_test_finds_a_perfect_predictor_and_not_a_level(g2):
    # within each size the reading orders the outcome perfectly; sizes differ in level and in helped share
    cells = []
    for g, base in (("a", 0.1), ("b", 0.5)):
        for seed in (0, 1):
            for k in range(6):
                cells.append(_cell(g, seed, base + 0.01 * k + 0.001 * seed, helps=k >= 3))
    out = g2.within_size(cells, permutations=2000, names=("window_saturation",))
    assert out["stratified_auc"]["window_saturation"] == 1.0
    assert out["decision"]["predicts"] and out["decision"]["p_value"] < 0.01
    # the same readings with the outcome set by size alone: no size holds both outcomes
    for c in cells:
        c["delta"] = -0.1 if c["group"] == "b" else 0.1
    assert g2.within_size(cells, permutations=200, names=("window_saturation",))["decision"]["predicts"] is None


def test_monotone_labelings_count_thresholds_per_size_and_ties(g2):
    x = [0.3, 0.1, 0.2, 5.0, 5.0, 6.0]
    labs = g2.monotone_labelings(x, [[0, 1, 2], [3, 4, 5]])
    # size a: 4 options (none, >=0.3, >=0.2, all); size b: 3 (none, 6.0 only, all: the tie moves together)
    assert len(labs) == 4 * 3 - 4  # minus the combinations with no size mixed
    assert all(lab[3] == lab[4] for lab in labs)
    assert not g2.monotone_labelings([1.0] * 6, [[0, 1, 2], [3, 4, 5]])  # constant: orders nothing


def test_hypotheses_are_scored_as_frozen(g2):
    cells = [_cell("a", 0, 0.1, helps=p >= 51, passes=p, tpp=t) for p, t in ((3.3, 10), (16, 2), (64, 0.4), (164, 0.2))]
    cells.append(_cell("a", 1, 0.1, helps=True, passes=3.3, tpp=12, best=True))
    h = g2.hypotheses(cells)
    assert h["final"]["H1"]["correct"] == 4 and h["final"]["H1"]["n"] == 5
    assert h["final"]["H2"]["correct"] == 4  # 64 passes at 0.4 tokens/param: H2 says helps, and it did
    assert h["final"]["H3"] == {"cells": 2, "hurt": 1, "holds": False, "exceptions": [cells[-1]["name"]]}
    assert h["H4"]["holds"] is False and h["H4"]["exceptions"] == [cells[-1]["name"]]
    # the exact one-sided test: 5/5 against a trivial rate of 3/5 is p = 0.6^5
    s = g2.score_rule([True] * 5, [True, True, True, False, False][:0] + [True] * 5)
    assert s["p_vs_trivial"] == pytest.approx(1.0)
    assert g2.binom_tail(5, 5, 0.6) == pytest.approx(0.6**5)
    lo, hi = g2.clopper_pearson(13, 13)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 13), abs=1e-6)


def test_h3_reads_the_plans_budget_in_bytes_and_the_csv_has_the_forecast_columns(g2):
    """3.3 passes is 1,551,515 bytes (5,120,000 / 1,551,515 = 3.3000003 passes): H3 must count that cell; the data
    file written from the cells carries the columns satmon.forecast reads."""
    from satmon.results.forecast import read_known_cells

    c = _cell("d64L2", 2, 0.1, helps=False, passes=5_120_000 / 1_551_515)
    c.update(name="d64L2_t1551515_s2", params=115_013, train_tokens=1_551_515, val_loss_dyt=1.9, val_loss_layernorm=1.8)
    assert g2.hypotheses([c])["final"]["H3"]["cells"] == 1
    text = g2.cells_csv([c], "test grid", "a note")
    cells = read_known_cells("test.csv", text)
    assert len(cells) == 1 and cells[0].passes == pytest.approx(3.3, rel=1e-3)
