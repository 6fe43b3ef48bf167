"""Grid 3's scoring (examples/grid3_analysis.py), as the amendments of docs/plans/grid3_plan.md state it, on hand-made
cells whose answer is known: configurations (seeds averaged), the binomial test against p0 = 0.5 (H6 against its
trivial rate), the environment gate per part, a DyT arm that did not learn named, and the data file the forecast
reads."""

from __future__ import annotations

import json

import pytest

from conftest import load_example


@pytest.fixture(scope="module")
def g3():
    return load_example("grid3_analysis")


def _cell(
    size: str, passes: float, seed: int, delta: float, best: float, commit: str = "e6ab0de0", alpha="2.0"
) -> dict:
    unique = round(5_120_000 / passes)
    return {
        "val_loss_dyt": 2.0 * (1 + delta),
        "val_loss_layernorm": 2.0,
        "best_val_loss_dyt": 2.0 * (1 + best),
        "best_val_loss_layernorm": 2.0,
        "learns_dyt": True,
        "name": f"{size}_t{unique}_s{seed}",
        "group": size,
        "seed": seed,
        "params": 67829 if size == "d48L2" else 115013,
        "epochs": 5_120_000 / unique,
        "train_tokens": unique,
        "delta": delta,
        "delta_best": best,
        "steps": 5000,
        "warmup": 2000,
        "config": {"alpha_init": alpha if alpha == "paper" else float(alpha)},
        "environment": {"satmon_commit": commit, "torch": "2.13"},
    }


def _write(root, part, cells):
    (root / part).mkdir(parents=True, exist_ok=True)
    for c in cells:
        (root / part / f"{c['name']}.abcdefabcdef.json").write_text(json.dumps(c))


def test_the_plans_tests_are_counted_per_configuration_against_a_coin(g3, tmp_path):
    gap = [
        _cell(s, p, seed, 0.05 if (s, p) != ("d48L2", 12.0) else (0.02 if seed == 4 else -0.03), 0.01)
        for s in ("d48L2", "d64L2")
        for p in (4.5, 6.5, 9.0, 12.0)
        for seed in (4, 5)
    ]
    sub = [_cell(s, p, seed, 0.1, 0.1) for s in ("d48L2", "d64L2") for p in (0.25, 0.5, 1.0) for seed in (4, 5)]
    _write(tmp_path, "gap", gap)
    _write(tmp_path, "subpass", sub)
    _write(tmp_path, "gap", [_cell("d64L2", 4.5, 9, 0.1, 0.1, commit="e6ee690")])  # another commit: never scored
    scored, refused = g3.read_cells(tmp_path, "e6ab0de")
    assert len(refused) == 1 and "not the amendment's" in refused[0] and g3.missing(scored, ("gap", "subpass")) == []
    h5, h8, h7 = g3.score(scored)
    # d48L2 at 12 passes: seeds +0.02 and -0.03, mean -0.005: that configuration helped (seeds averaged, not agreeing)
    assert (h5["k"], h5["n"]) == (7, 8) and h5["p"] == pytest.approx(9 / 256) and h5["passes"]
    assert (h8["k"], h8["n"], h8["p"], h8["passes"]) == (6, 6, 1 / 64, True)
    assert (h7["k"], h7["n"]) == (14, 14) and h7["passes"]
    assert [c["seeds_agree"] for c in h5["configurations"]].count(False) == 1
    # nothing is scored until every planned cell is in
    scored["gap"] = scored["gap"][1:]
    assert len(g3.missing(scored, ("gap", "subpass"))) == 1
    assert [h["hypothesis"][:3] for h in g3.score(scored)] == ["H8 "]  # H5 and H7 wait for the missing cell


def test_the_held_out_forecast_is_never_confident_on_grid_3s_configurations(g3, tmp_path):
    _write(tmp_path, "gap", [_cell("d64L2", p, 4, 0.05, 0.01) for p in (4.5, 12.0)])
    _write(tmp_path, "subpass", [_cell("d64L2", 0.5, 4, 0.05, 0.01)])
    scored, _ = g3.read_cells(tmp_path, "e6ab0de")
    rows = g3.held_out_forecast(scored)
    assert len(rows) == 3 and not any(r["confident_wrong"] for r in rows)
    assert {r["forecast"] for r in rows} == {"uncertain"}  # the shipped cells: nothing confident at 0.5-12 passes


def _llama(passes: float, seed: int, delta: float, best: float, learns: bool = True) -> dict:
    c = _cell("d64L2", passes, seed, delta, best, commit="28967fa0", alpha="paper")
    c.update(learns_dyt=learns, params=121_000)
    c["config"]["final_norm"] = "rmsnorm"
    return c


def _full_grid(tmp_path, llama):
    _write(
        tmp_path,
        "gap",
        [_cell(s, p, e, 0.05, 0.01) for s in ("d48L2", "d64L2") for p in (4.5, 6.5, 9.0, 12.0) for e in (4, 5)],
    )
    _write(
        tmp_path,
        "subpass",
        [_cell(s, p, e, 0.1, 0.1) for s in ("d48L2", "d64L2") for p in (0.25, 0.5, 1.0) for e in (4, 5)],
    )
    _write(tmp_path, "llama", llama)
    return g3_read(tmp_path)


def g3_read(root):
    return load_example("grid3_analysis").read_cells(root)


def test_part_b_is_scored_on_its_own_commit_and_h6_against_its_trivial_rate(g3, tmp_path):
    # (b): hurts at 1.5, 3.3 and 16 passes, helps at 64, hurts at 164 (one against H6); best hurts except at 64
    deltas = {1.5: 0.04, 3.3: 0.03, 16.0: 0.02, 64.0: -0.01, 164.0: 0.01}
    llama = [_llama(p, e, d, d) for p, d in deltas.items() for e in (4, 5)]
    llama.append(dict(_llama(1.5, 9, 0.5, 0.5), environment={"satmon_commit": "e6ab0de0"}))  # (a)'s commit: refused
    scored, refused = _full_grid(tmp_path, llama)
    assert len(refused) == 1 and refused[0].startswith("llama/") and g3.missing(scored) == []
    by = {h["hypothesis"].split(" ")[0]: h for h in g3.score(scored)}
    assert set(by) == {"H5", "H8", "H7", "H3'", "H7,", "H6"}
    # H3': (b)'s 1.5 and 3.3 with (c)'s 6, every one hurts: 8 of 8 against a coin
    assert (by["H3'"]["k"], by["H3'"]["n"], by["H3'"]["p"]) == (8, 8, 0.5**8)
    # H7 second family: 4 of 5 (64 passes helped), p = P(X >= 4 | 5, 0.5) = 6/32: does not pass
    assert (by["H7,"]["k"], by["H7,"]["n"]) == (4, 5) and by["H7,"]["p"] == pytest.approx(6 / 32)
    assert not by["H7,"]["passes"]
    # H6: 4 of 5 as predicted; the trivial rule (always hurts) is right in 4 of 5: p = P(X >= 4 | 5, 0.8)
    h6 = by["H6"]
    assert (h6["k"], h6["n"], h6["null"]) == (4, 5, 0.8)
    assert h6["p"] == pytest.approx(5 * 0.8**4 * 0.2 + 0.8**5) and not h6["passes"]
    assert all(h["unlearned"] == [] for h in by.values())


def test_a_dyt_arm_that_did_not_learn_is_named_and_counted_both_ways(g3, tmp_path):
    llama = [
        _llama(p, e, 0.02, 0.02, learns=not (p == 3.3 and e == 5))
        for p in (1.5, 3.3, 16.0, 64.0, 164.0)
        for e in (4, 5)
    ]
    scored, _ = _full_grid(tmp_path, llama)
    h3 = next(h for h in g3.score(scored) if h["hypothesis"].startswith("H3'"))
    assert h3["unlearned"] == ["d64L2 at 3.3 passes (satmon-llama)"]
    assert (h3["k"], h3["n"]) == (8, 8) and (h3["without_unlearned"]["k"], h3["without_unlearned"]["n"]) == (7, 7)


def test_the_data_file_is_read_by_the_forecast_as_configurations_of_each_family(g3, tmp_path):
    from satmon.results.forecast import configurations, read_known_cells

    llama = [_llama(p, e, 0.02, 0.01) for p in (1.5, 3.3, 16.0, 64.0, 164.0) for e in (4, 5)]
    scored, _ = _full_grid(tmp_path, llama)
    cells = read_known_cells("phase_grid_grid3.csv", g3.cells_csv(scored))
    assert len(cells) == 16 + 12 + 10
    cfgs = configurations(cells)
    assert len(cfgs) == 8 + 6 + 5  # recipe x size x passes, seeds once
    assert {c.family for c in cells} == {"gpt", "llama"}
    by_name = {c.name: c for c in cells}
    lc = by_name[llama[0]["name"]]
    assert lc.recipe == "satmon-llama" and lc.alpha_init == 0.2 and lc.steps == 5000 and lc.warmup_steps == 2000
    assert (lc.alpha_init_max, lc.final_norm) == (0.8, "norm")  # the paper's inits; RMSNorm before the head
    assert {c.final_norm for c in cells if c.family == "gpt"} == {"dyt"}  # the builtin GPT replaces ln_f too
    assert lc.delta == pytest.approx(0.02) and lc.best_delta == pytest.approx(0.01, rel=1e-5)
    sub = [c for c in cells if c.recipe.endswith("corpus=torch")]
    assert len(sub) == 12 and all(c.delta == pytest.approx(0.1) for c in sub)
    assert sorted({round(c.passes, 3) for c in sub}) == [0.25, 0.5, 1.0]


def test_the_reports_numbers_are_the_cells(g3):
    """docs/science/grids.md's grid-3 block is what the script computes from data/grid3 (regenerate it with
    `python examples/grid3_analysis.py --update-docs data/grid3`)."""
    root = g3.Path(g3.__file__).resolve().parents[1]
    scored, refused = g3.read_cells(root / "data" / "grid3")
    text = (root / "docs" / "science" / "grids.md").read_text(encoding="utf-8")
    start, end = text.index(g3.MARKERS[0]) + len(g3.MARKERS[0]), text.index(g3.MARKERS[1])
    assert text[start:end].strip() == g3.markdown(root / "data" / "grid3", scored, refused).strip()
