"""``satmon calibrate``: the study's figures, runs + outcomes, the error cases (exit 2), the JSON and the plot."""

from __future__ import annotations

import builtins
import json
import re
from pathlib import Path

import pytest

from satmon.calibrate.fit import load_calibration
from satmon.cli import calibrate as cli
from satmon.cli.main import main as satmon_main


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_study_prints_and_writes_the_studys_figures(tmp_path, capsys):
    assert satmon_main(["calibrate", "--study", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "12 cells in 4 groups" in out and "DyT helped in 4, hurt in 8" in out
    row = next(l for l in out.splitlines() if l.startswith("| midpoint"))
    assert "0.43985" in row and "9/12 = 0.750" in row and "6/12 = 0.500" in row
    assert "AUC of saturation: 0.750" in out
    assert f"SaturationMonitor(calibration={str(tmp_path / 'o' / 'calibration.json')!r})" in out
    cal = load_calibration(tmp_path / "o" / "calibration.json")
    assert (round(cal.threshold, 5), cal.accuracy, cal.loso_accuracy, cal.auc) == (0.43985, 0.75, 0.5, 0.75)
    assert cal.source.startswith("study")
    assert (tmp_path / "o" / "calibration.png").stat().st_size > 10_000


def test_balanced_rule_goes_into_the_json_when_asked(tmp_path, capsys):
    assert cli.main(["--study", "--rule", "balanced", "--no-plot", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "calibration.png").exists()
    cal = load_calibration(tmp_path / "calibration.json")
    assert cal.rule == "balanced" and round(cal.threshold, 5) == 0.26505 and cal.accuracy == pytest.approx(8 / 12)


def replay(tmp_path: Path, name: str, sat: float) -> Path:
    return write(
        tmp_path,
        f"{name}.json",
        json.dumps([{"checkpoint": "last.ckpt", "global_step": 500, "verdict": {"saturation": sat}}]),
    )


def test_replay_runs_with_outcomes(tmp_path, capsys):
    runs = [replay(tmp_path, n, s) for n, s in (("a", 0.6), ("b", 0.5), ("c", 0.3), ("d", 0.2))]
    outcomes = write(
        tmp_path,
        "o.csv",
        "run,dyt_val_loss,layernorm_val_loss,group\na,2.0,2.4,small\nb,2.0,2.1,big\nc,3.0,2.5,small\nd,2.6,2.5,big\n",
    )
    assert cli.main([*map(str, runs), "--outcomes", str(outcomes), "--no-plot", "--out", str(tmp_path / "o")]) == 0
    cal = load_calibration(tmp_path / "o" / "calibration.json")
    assert cal.threshold == pytest.approx(0.4) and cal.accuracy == 1.0 and cal.loso_accuracy == 1.0 and cal.auc == 1.0
    cells = json.loads((tmp_path / "o" / "calibration.json").read_text())["cells"]
    assert [(c["name"], c["helps"]) for c in cells] == [("a", True), ("b", True), ("c", False), ("d", False)]
    assert cells[0]["delta"] == pytest.approx(-0.4 / 2.4)


def test_cells_file_with_another_metric(tmp_path, capsys):
    cells = write(
        tmp_path,
        "c.csv",
        "saturation,first_block,delta,group\n0.8,0.4,-0.1,a\n0.8,0.1,0.1,a\n0.7,0.5,-0.2,b\n0.9,0.2,0.3,b\n",
    )
    assert cli.main(["--cells", str(cells), "--metric", "first_block", "--no-plot", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "metric 'first_block'" in out and "AUC of first_block: 1.000" in out
    assert "SaturationMonitor(" not in out  # a first-block threshold is not the verdict's pooled saturation
    assert load_calibration(tmp_path / "calibration.json").metric == "first_block"


@pytest.mark.parametrize(
    "args, files, match",
    [
        ([], {}, "Expected one input: RUNS with --outcomes, --cells FILE, or --study; got 0"),
        (["--study", "--cells", "{c}"], {"c": "saturation,delta,group\n0.1,0.1,a\n"}, "Expected one input.*got 2"),
        (
            ["--cells", "{c}"],
            {"c": "saturation,delta,group\n0.5,-0.1,a\n0.2,0.1,b\n0.4,-0.1,b\n"},
            "Expected at least 4 cells",
        ),
        (
            ["--cells", "{c}"],
            {"c": "saturation,delta,group\n0.5,0.1,a\n0.2,0.1,b\n0.4,0.1,b\n0.3,0.2,a\n"},
            "got only hurt .* add runs from the other regime",
        ),
        (
            ["--cells", "{c}"],
            {"c": "saturation,delta,group\n0.5,0.1,a\n0.2,0.1,a\n0.4,-0.1,a\n0.3,0.2,a\n"},
            "at least 2 groups",
        ),
        (["--cells", "{c}"], {"c": "saturation,delta,group\n0.5,0.1\n"}, "Expected 3 columns"),
        (["--cells", "{c}"], {"c": "saturation,delta,group\n0.5,,a\n"}, "Expected an outcome for every cell"),
        (
            ["{r}", "--outcomes", "{o}"],
            {"r.json": "[]", "o": "run,dyt_val_loss,layernorm_val_loss,group\nzz,1,2,a\n"},
            "got no run for 'zz'",
        ),
        (
            ["{r}", "--outcomes", "{o}"],
            {"r.json": "[]", "o": "run,dyt_val_loss,layernorm_val_loss,group\nr,,2,a\n"},
            "Expected run, both validation losses and a group on every row, got a blank",
        ),
        (
            ["{r}"],
            {"r.json": "[]"},
            "Expected run folders or replay JSON files together with --outcomes CSV, got runs only",
        ),
        (["--cells", "{missing}"], {}, "Expected a cells file .* got no file"),
    ],
)
def test_errors_exit_2_with_what_to_do(tmp_path, capsys, args, files, match):
    paths = {}
    for key, text in files.items():
        paths[key.split(".")[0]] = write(tmp_path, key if "." in key else f"{key}.csv", text)
    paths["missing"] = tmp_path / "nope.csv"
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in args] + ["--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("satmon calibrate: Expected")
    assert re.search(match, err), err
    assert not (tmp_path / "out" / "calibration.json").exists()


def test_missing_matplotlib_is_a_message_not_a_crash(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert cli.main(["--study", "--out", str(tmp_path)]) == 0
    assert "the plot needs matplotlib: pip install matplotlib" in capsys.readouterr().err
    assert (tmp_path / "calibration.json").exists() and not (tmp_path / "calibration.png").exists()


def test_docs_quote_what_the_command_computes_on_the_committed_grid():
    """data/calibration_grid.json is real data (examples/regime_flip.py --grid); docs/science/grids_superseded.md's
    accuracy table is what `satmon calibrate` computes on it, reading by reading."""
    from satmon.calibrate.fit import calibrate, read_cells

    root = Path(__file__).resolve().parents[2]
    grid = root / "data" / "calibration_grid.json"
    data = json.loads(grid.read_text())
    assert len(data["cells"]) >= 12 and len({c["group"] for c in data["cells"]}) >= 2
    page = (root / "docs" / "science" / "grids_superseded.md").read_text()
    for metric in data["metrics"]:
        r = calibrate(read_cells(grid), metric)
        m, b, n = r.fits["midpoint"], r.fits["balanced"], len(r.cells)
        row = next(l for l in page.splitlines() if l.startswith(f"| {metric} ") and "/" in l)
        expected = [
            f"{m.threshold:.4f}",
            f"{m.correct}/{n} = {m.accuracy:.2f}",
            f"{r.cv['midpoint'].correct}/{n} = {r.cv['midpoint'].accuracy:.2f}",
            f"{b.threshold:.4f}",
            f"{b.balanced_accuracy:.2f}",
            f"{r.cv['balanced'].correct}/{n} = {r.cv['balanced'].accuracy:.2f}",
            f"{r.auc:.2f}",
        ]
        assert [c.strip() for c in row.strip("|").split("|")][1:] == expected, metric
