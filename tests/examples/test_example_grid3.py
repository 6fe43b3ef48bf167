"""Grid 3's scoring (examples/grid3_analysis.py), as amendment 1 of docs/plans/grid3_plan.md states it, on hand-made
cells whose answer is known: configurations (seeds averaged), the binomial test against p0 = 0.5, the environment gate."""

from __future__ import annotations

import json

import pytest
from conftest import load_example


@pytest.fixture(scope="module")
def g3():
    return load_example("grid3_analysis")


def _cell(size: str, passes: float, seed: int, delta: float, best: float, commit: str = "e6ab0de0") -> dict:
    unique = round(5_120_000 / passes)
    return {
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
        "config": {"alpha_init": 2.0},
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
    assert len(refused) == 1 and "not the amendment's" in refused[0] and g3.missing(scored) == []
    h5, h8, h7 = g3.score(scored)
    # d48L2 at 12 passes: seeds +0.02 and -0.03, mean -0.005: that configuration helped (seeds averaged, not agreeing)
    assert (h5["k"], h5["n"]) == (7, 8) and h5["p"] == pytest.approx(9 / 256) and h5["passes"]
    assert (h8["k"], h8["n"], h8["p"], h8["passes"]) == (6, 6, 1 / 64, True)
    assert (h7["k"], h7["n"]) == (14, 14) and h7["passes"]
    assert [c["seeds_agree"] for c in h5["configurations"]].count(False) == 1
    # nothing is scored until every planned cell is in
    scored["gap"] = scored["gap"][1:]
    assert len(g3.missing(scored)) == 1


def test_the_held_out_forecast_is_never_confident_on_grid_3s_configurations(g3, tmp_path):
    _write(tmp_path, "gap", [_cell("d64L2", p, 4, 0.05, 0.01) for p in (4.5, 12.0)])
    _write(tmp_path, "subpass", [_cell("d64L2", 0.5, 4, 0.05, 0.01)])
    scored, _ = g3.read_cells(tmp_path, "e6ab0de")
    rows = g3.held_out_forecast(scored)
    assert len(rows) == 3 and not any(r["confident_wrong"] for r in rows)
    assert {r["forecast"] for r in rows} == {"uncertain"}  # the shipped cells: nothing confident at 0.5-12 passes
