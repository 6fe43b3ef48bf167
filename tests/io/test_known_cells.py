"""The known cells the forecast reads ship as data files; a new file sharpens (or undoes) it with no code change."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

import satmon
from satmon import study
from satmon.results.forecast import STUDY_LABEL, known_cells, read_known_cells

ROOT = Path(__file__).resolve().parents[2]
FAITHFUL = "satmon 0.4 faithful CPU grid"
GRID2 = "satmon 0.5 second CPU grid"
GRID3 = "satmon's third CPU grid"


def _grid2() -> list[dict]:
    """The second grid's cells committed so far (data/grid2.json: interim while its run goes on)."""
    return json.loads((ROOT / "data" / "grid2.json").read_text())["cells"]


def _grid3() -> list[dict]:
    """The third grid's scored cells (data/grid3: a JSON per cell in each part's folder; the interim ones left out)."""
    return [
        json.loads(f.read_text())
        for part in study.CPU_GRID_PARTS
        for f in (ROOT / "data" / "grid3" / part).glob("*.json")
    ]


def test_the_study_and_the_faithful_grid_are_read_and_the_v03_grid_is_not():
    cells = known_cells()
    sources = [c.source for c in cells]
    n2, n3 = len(_grid2()), len(_grid3())
    assert sources.count(STUDY_LABEL) == 12 and sources.count(FAITHFUL) == 16 and sources.count(GRID2) == n2
    assert sources.count(GRID3) == n3 == 38 and len(cells) == 28 + n2 + n3
    assert not any("0.3" in s for s in sources)  # phase_grid_v03.csv: not the study's protocol
    # the study's passes: 5,000 steps x 64 x 512 tokens over each budget's unique tokens (docs/science/science.md)
    by_name = {c.name: c for c in cells}
    assert by_name["64M/1M"].passes == pytest.approx(study.STUDY_TOKENS_PROCESSED / 1e6, rel=1e-5)
    assert by_name["1.3B/118M"].passes == pytest.approx(163.84 / 118, rel=1e-5) and by_name["1.3B/118M"].params == 1.3e9


def test_the_faithful_grid_columns_are_its_json_cells():
    committed = json.loads((ROOT / "data" / "faithful_grid.json").read_text())["cells"]
    shipped = {c.name: c for c in known_cells() if c.source == FAITHFUL}
    assert set(shipped) == {c["name"] for c in committed}
    for c in committed:
        k = shipped[c["name"]]
        assert k.passes == pytest.approx(c["epochs"], rel=1e-5) and k.params == c["params"]
        assert k.delta == pytest.approx(c["delta"], abs=1e-6)
        best = (c["best_val_loss_dyt"] - c["best_val_loss_layernorm"]) / c["best_val_loss_layernorm"]
        assert k.best_delta == pytest.approx(best, abs=1e-5)


def test_the_second_grid_columns_are_its_json_cells():
    shipped = {c.name: c for c in known_cells() if c.source == GRID2}
    committed = _grid2()
    assert set(shipped) == {c["name"] for c in committed}
    for c in committed:
        k = shipped[c["name"]]
        assert k.passes == pytest.approx(c["epochs"], rel=1e-5) and k.delta == pytest.approx(c["delta"], abs=1e-6)
        assert (k.best_delta < 0) == c["helps_best"]


def test_the_third_grid_columns_are_its_json_cells():
    """phase_grid_grid3.csv is its cells, field for field (examples/grid3_analysis.py --csv wrote it)."""
    shipped = {c.name: c for c in known_cells() if c.source == GRID3}
    committed = _grid3()
    assert set(shipped) == {c["name"] for c in committed}
    for c in committed:
        k = shipped[c["name"]]
        assert k.passes == pytest.approx(c["epochs"], rel=1e-4) and k.delta == pytest.approx(c["delta"], abs=1e-6)
        assert k.best_delta == pytest.approx(c["delta_best"], abs=1e-5) and k.params == c["params"]
        llama = c["recipe"]["name"] == "satmon-llama"
        assert k.family == ("llama" if llama else "gpt") and k.final_norm == ("norm" if llama else "dyt")
        assert (k.alpha_init, k.alpha_init_max) == ((0.2, 0.8) if llama else (2.0, 2.0))
        assert (k.steps, k.warmup_steps) == (c["steps"], c["warmup"])


def test_the_counts_of_the_issue_are_recounted_from_the_cells():
    # the issue's counts: the study's and the first grid's
    cells = [c for c in known_cells() if c.source not in (GRID2, GRID3)]
    few = [c for c in cells if c.passes <= 3.4]
    many = [c for c in cells if c.passes >= 16]
    assert (sum(c.delta > 0 for c in few), len(few)) == (13, 13)
    assert (sum(c.delta < 0 for c in many), len(many)) == (8, 15)
    best = [c for c in cells if c.best_delta is not None]
    assert (sum(c.best_delta < 0 for c in best), len(best)) == (0, 16)
    # with the second grid's cells, recounted from its JSON (not from the shipped file)
    g2 = _grid2()
    few2 = [c for c in g2 if c["epochs"] <= 3.4]
    many2 = [c for c in g2 if c["epochs"] >= 16]
    every = [c for c in known_cells() if c.source != GRID3]  # the third grid: its own test above
    assert (sum(c.delta > 0 for c in every if c.passes <= 3.4), sum(c.passes <= 3.4 for c in every)) == (
        13 + sum(c["delta"] > 0 for c in few2),
        13 + len(few2),
    )
    assert sum(c.delta < 0 for c in every if c.passes >= 16) == 8 + sum(c["delta"] < 0 for c in many2)
    # the study's GO / NO-GO sides (satmon.study.GO_HELPED, NO_GO_HELPED), from its saturation column
    text = resources.files("satmon").joinpath("data_files/study_cells.csv").read_text()
    rows = [line.split(",") for line in text.splitlines() if line and not line.startswith(("#", "name"))]
    go = [float(r[4]) < 0 for r in rows if float(r[3]) >= study.THRESHOLD]
    no_go = [float(r[4]) < 0 for r in rows if float(r[3]) < study.THRESHOLD]
    assert (sum(go), len(go)) == study.GO_HELPED and (sum(no_go), len(no_go)) == study.NO_GO_HELPED


def test_a_new_grid_file_with_a_contradicting_cell_turns_hurts_uncertain(tmp_path):
    data = resources.files("satmon").joinpath("data_files")
    for entry in data.iterdir():
        if entry.name.endswith(".csv"):
            (tmp_path / entry.name).write_text(entry.read_text(encoding="utf-8"), encoding="utf-8")
    run = dict(
        params=115_013,
        unique_tokens=3_657_143,
        planned_tokens=5_120_000,
        steps=5000,
        warmup_steps=2000,
        lr_schedule="linear-warmup-constant",
        family="gpt",
        alpha_init=2.0,
        final_norm="dyt",
    )  # d64L2 at 1.4 passes
    assert satmon.forecast(**run, cells=known_cells(tmp_path)).outcome == "hurts"
    columns = (
        "name,params,train_tokens,delta,group,source,passes,final_dyt,final_layernorm,best_dyt,best_layernorm,protocol"
    )
    row = "d48L2_t3.6M_s2,67829,3657143,,d48L2,a second grid,1.4,1.80,1.85,1.79,1.84,study"  # DyT's final loss lower
    (tmp_path / "phase_grid_grid2.csv").write_text(
        f"# a new grid, no schedule columns\n{columns}\n{row}\n", encoding="utf-8"
    )
    new = known_cells(tmp_path)
    assert [(c.steps, c.lr_schedule, c.family) for c in new if c.source == "a second grid"] == [(None, None, None)]
    f = satmon.forecast(**run, cells=new)  # a cell of unknown family may be the run's: it bears
    assert (
        f.outcome == "uncertain" and "worse than LayerNorm's in 6 of the 7 configurations at 1.39 passes" in f.evidence
    )
    # a grid file without the protocol column is drawn on the phase diagram, never forecast from
    shutil.copy(tmp_path / "phase_grid_v03.csv", tmp_path / "phase_grid_other.csv")
    assert len(known_cells(tmp_path)) == 29 + len(_grid3())


def test_a_study_protocol_row_missing_what_the_forecast_needs_is_refused():
    with pytest.raises(ValueError, match="Expected a positive number for passes in g.csv row 1"):
        read_known_cells("g.csv", "name,params,passes,delta,group,source,protocol\na,100,,0.1,g,s,study\n")
    with pytest.raises(ValueError, match="Expected a finite delta"):
        read_known_cells("g.csv", "name,params,passes,delta,group,source,protocol\na,100,2,,g,s,study\n")
    # final losses stand in for delta
    (cell,) = read_known_cells(
        "g.csv", "name,params,passes,final_dyt,final_layernorm,group,source,protocol\na,100,2,2.2,2.0,g,s,study\n"
    )
    assert cell.delta == pytest.approx(0.1) and cell.outcome == "hurts"


def test_the_builtin_grids_record_dyt_before_the_head_and_the_study_does_not():
    """satmon's builtin GPT builds its DyT arm with norm="dyt" everywhere, ln_f included (checked on the model the grid
    builds); the study's cells do not say what its final norm was, so they record none."""
    import torch

    from satmon.grid.builtin import OPTIONS, model
    from satmon.grid.recipe import CellSpec
    from satmon.model.map import find_norm_layers
    from satmon.observe.trap import ForwardOrder

    spec = CellSpec("d48L2", "1000", 1000, 0, 5000, 5000 * 16 * 64, dict(OPTIONS))
    kinds = {}
    for arm in ("dyt", "layernorm"):
        m = model(spec, arm)
        order = ForwardOrder(m).attach()
        m(torch.zeros(1, 8, dtype=torch.long))
        order.detach()
        kinds[arm] = order.final().kind
        assert {layer.kind for layer in find_norm_layers(m)} == {arm}
    assert kinds == {"dyt": "dyt", "layernorm": "layernorm"}
    by_source = {}
    for c in known_cells():
        by_source.setdefault(c.source, set()).add(c.final_norm)
    # the third grid: its GPT parts DyT before the head, its LLaMA part RMSNorm (final_norm=rmsnorm, the recipe's)
    assert by_source == {STUDY_LABEL: {None}, FAITHFUL: {"dyt"}, GRID2: {"dyt"}, GRID3: {"dyt", "norm"}}


def test_final_norm_and_alpha_init_max_columns_are_read_and_bad_values_refused():
    columns = "name,params,passes,delta,group,source,protocol,alpha_init,alpha_init_max,final_norm"
    cells = read_known_cells(
        "g.csv",
        f"{columns}\na,100,2,0.1,g,s,study,0.2,0.8,DyT\nb,100,2,0.1,g,s,study,2.0,,RMSNorm\nc,100,2,0.1,g,s,study,,,\n",
    )
    assert [(c.alpha_range, c.final_norm) for c in cells] == [((0.2, 0.8), "dyt"), ((2.0, 2.0), "norm"), (None, None)]
    with pytest.raises(
        ValueError, match=r"Expected final_norm as dyt or norm .* in g.csv row 1 \(cell 'a'\), got 'batch'"
    ):
        read_known_cells("g.csv", f"{columns}\na,100,2,0.1,g,s,study,2.0,,batch\n")
    for lo, hi in (("0.8", "0.2"), ("", "0.8"), ("0.2", "lots"), ("0.2", "inf")):
        with pytest.raises(
            ValueError, match=r"Expected alpha_init_max as a number at least alpha_init \(.*\) in g.csv row 1"
        ):
            read_known_cells("g.csv", f"{columns}\na,100,2,0.1,g,s,study,{lo},{hi},dyt\n")
