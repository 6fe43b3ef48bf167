"""The phase diagram's cells: the study's 12 (against docs and the calibration data), the shipped 0.3 grid (against
data/regime_grid.json, the file it was made from), the reader's refusals, the plot and ``satmon report --plot``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from satmon.cli.main import main
from satmon.io.phase_diagram import (
    COLUMNS,
    STUDY_SOURCE,
    PhaseCell,
    grid_cells,
    parse_count,
    phase_cells,
    plot_phase,
    read_phase_cells,
    study_cells,
)
from satmon.results.scale import RunScale

ROOT = Path(__file__).resolve().parents[2]
HEADER = ",".join(COLUMNS)


#: the study's published cells (its paper's table): DyT vs LayerNorm final validation loss, in %
PUBLISHED = {
    "64M/1M": -27.3,
    "64M/10M": 5.9,
    "64M/50M": 19.7,
    "64M/118M": 18.8,
    "124M/1M": -9.6,
    "124M/10M": -12.3,
    "124M/118M": 12.8,
    "354M/1M": 4.3,
    "354M/10M": -24.1,
    "354M/118M": 13.4,
    "1.3B/1M": 2.1,
    "1.3B/118M": 10.4,
}


def test_study_cells_are_the_twelve_at_their_nominal_sizes():
    cells = study_cells()
    sizes = {"64M": 64e6, "124M": 124e6, "354M": 354e6, "1.3B": 1.3e9}
    tokens = {"1M": 1e6, "10M": 10e6, "50M": 50e6, "118M": 118e6}
    assert sorted(c.name for c in cells) == sorted(PUBLISHED) and {c.source for c in cells} == {STUDY_SOURCE}
    for cell in cells:
        size, budget = cell.name.split("/")
        assert (cell.params, cell.train_tokens, cell.group) == (sizes[size], tokens[budget], size)
        assert 100 * cell.delta == pytest.approx(PUBLISHED[cell.name])
    assert min(c.tokens_per_param for c in cells) == pytest.approx(1e6 / 1.3e9)


def test_the_shipped_grid_is_the_03_grid_labelled_unfaithful():
    made_from = json.loads((ROOT / "data" / "regime_grid.json").read_text())["cells"]
    cells = [c for c in grid_cells() if c.source == "satmon 0.3 CPU grid (unfaithful)"]
    assert [(c.name, c.params, c.train_tokens, c.group) for c in cells] == [
        (m["name"], float(m["params"]), float(m["train_tokens"]), m["group"]) for m in made_from
    ]
    assert [c.delta for c in cells] == pytest.approx([m["delta"] for m in made_from], abs=1e-6)
    assert len(phase_cells()) == 12 + len(grid_cells())


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (
            "name,params,delta\na,1,0.1",
            r"Expected the columns name,params,train_tokens,delta,group,source in bad.csv, .* add "
            r"train_tokens, group, source",
        ),
        (f"{HEADER}\na,-5,100,0.1,g,s", r"Expected a positive number for params in bad.csv row 1, got '-5'"),
        (f"{HEADER}\na,5,100,nan,g,s", r"Expected a finite number for delta in bad.csv row 1, got 'nan'"),
        (f"{HEADER}\na,5,100,0.1,g,s\na,6,100,0.1,g,s", r"Expected each cell once in bad.csv, got 'a' twice \(row 2\)"),
        (f"{HEADER}\na,5,100,0.1,g,", r"Expected a name and a source on every row of bad.csv"),
    ],
)
def test_a_grid_file_that_cannot_be_read_says_where_and_why(rows, match):
    with pytest.raises(ValueError, match=match):
        read_phase_cells("bad.csv", rows)


def test_a_blank_delta_is_not_measured_and_comments_are_skipped():
    cells = read_phase_cells("g.csv", f"# a grid\n{HEADER}\na,5,100,,g,mine\n")
    assert cells == [PhaseCell("a", 5.0, 100.0, None, "g", "mine")]
    assert parse_count("118M") == 118e6
    with pytest.raises(ValueError, match="Expected a positive count"):
        parse_count("0")


def test_the_plot_places_the_run(tmp_path):
    pytest.importorskip("matplotlib")
    path = plot_phase(
        phase_cells(),
        [("mine", RunScale(120_000, 400_000))],
        tmp_path / "p.png",
        not_placed=[("other", "tokens unknown")],
    )
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_report_plot_without_matplotlib_is_one_line_and_nothing_read(tmp_path, capsys, monkeypatch):
    from satmon.io import markdown

    def missing():
        raise ImportError(markdown.MATPLOTLIB_MISSING)

    monkeypatch.setattr(markdown, "require_matplotlib", missing)
    assert main(["report", str(tmp_path), "--plot"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "satmon report: --plot needs matplotlib: pip install matplotlib (or pip install -e "
        "'.[report]' in satmon's clone); the report without the plot: leave --plot out.\n"
    )
    monkeypatch.undo()
    # checked before the reading too
    assert main(["report", str(tmp_path), "--plot-file", str(tmp_path / "p.txt")]) == 2
    assert "Expected --plot-file to end in .png or .pdf or .svg" in capsys.readouterr().err
