"""``examples/regime_grid.py`` (the faithful grid), a thin caller of ``satmon grid builtin``: the script's smoke
run, its refusals, the cache that lets a stopped grid resume, the JSON's environment and configuration read by
``satmon calibrate``, and the pre-registered analysis against hand-made cells with a known answer. The cell's
readings against independent references and the moved code's bit-identity: tests/grid/test_builtin.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_example

ROOT = Path(__file__).resolve().parents[2]
#: Per-run fields that differ between two runs of the same cell (timings) or of the same grid.
#: how long a cell took and where it ran (``environment``: jobs side by side, the commit): not its result
TIMINGS = {"cpu_seconds", "wall_seconds", "environment"}


@pytest.fixture(scope="module")
def rg():
    return load_example("regime_grid")


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, str]:
    """The smoke grid as a user runs it: the script, two cells at a time (the process pool), piped."""
    cwd = tmp_path_factory.mktemp("grid")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "regime_grid.py"),
            "--smoke",
            "--out",
            "g",
            "--jobs",
            "2",
            "--no-calibrate",
            "--permutations",
            "50",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return cwd / "g", proc.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--budgets", "12x"], "'12x'"),
        (["--sizes", "64"], "'64'"),
        (["--seeds", "a"], "seeds"),
        (["--window", "0"], "--window"),
        (["--warmup", "9000"], "--warmup"),
        (["--jobs", "0"], "--jobs"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(rg, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rg.main(["--smoke", "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_grid_json_records_environment_configuration_and_series(grid, rg, tmp_path):
    out, stderr = grid
    assert "regime_grid: 4 done" in stderr and "\r" not in stderr  # plain lines when piped
    data = json.loads((out / "grid.json").read_text())
    env = data["environment"]
    assert env["torch"] == torch.__version__ and env["threads"] == 1 and env["cpu"]
    assert env["satmon_commit"] and isinstance(env["satmon_commit"], str)
    c = data["config"]
    assert (c["steps"], c["window"], c["warmup"], c["emb_scale"]) == (8, 4, 3, 40.0)
    assert c["budgets"] == ["2000", "20000"] and c["sizes"] == ["d16L1", "d24L1"]
    cells = data["cells"]
    assert (
        len(cells) == 4
        and len(list((out / "cells").glob("*_s0.*.json"))) == 4
        and data["counts"] == {"cells": 4, "done": 4, "missing": 0, "failed": 0, "diverged": 0}
    )
    for cell in cells:
        assert cell["epochs"] == pytest.approx(8 * 4 * 16 / cell["train_tokens"])
        series = cell["window_series"]
        assert [e["step"] for e in series] == [2, 4]
        assert all(set(e) >= {"step", "saturation", "per_layer"} for e in series)
        for r in rg.WINDOW_READINGS + rg.FINAL_READINGS:
            assert 0.0 <= cell[r] <= 1.0, r
    assert data["analysis"]["n"] == 4

    from satmon.calibrate import read_cells

    read = {c.name: c for c in read_cells(out / "grid.json")}
    for cell in cells:
        assert read[cell["name"]].group == cell["group"] and read[cell["name"]].delta == cell["delta"]
        assert {r: read[cell["name"]].readings[r] for r in rg.WINDOW_READINGS} == {
            r: cell[r] for r in rg.WINDOW_READINGS
        }
    # `satmon calibrate --cells` on every window reading, with both classes present
    for cell in cells:
        cell["delta"] = (-1 if cell["name"].endswith("_t2000_s0") else 1) * (abs(cell["delta"]) + 0.01)
        cell["helps"] = cell["delta"] < 0
    path = tmp_path / "cells.json"
    path.write_text(json.dumps(data))
    codes = rg.calibrate_all(path, tmp_path / "cal")
    assert codes == {r: 0 for r in rg.WINDOW_READINGS}, {
        r: (tmp_path / "cal" / r / "stdout.txt").read_text() for r in codes
    }
    a = rg.analyze(cells, permutations=10)
    for r in rg.WINDOW_READINGS:
        cal = json.loads((tmp_path / "cal" / r / "calibration.json").read_text())
        assert cal["metric"] == r and cal["auc"] == pytest.approx(a["readings"][r]["auc"])
        assert cal["threshold"] == pytest.approx(a["readings"][r]["in_sample"]["threshold"])


def test_resume_reuses_cached_cells_and_gives_the_same_bytes(grid, rg, tmp_path, capsys):
    out, _ = grid
    before = json.loads((out / "grid.json").read_text())
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    gone = before["cells"][1]["name"]
    (copy / "cells" / f"{gone}.{before['cells'][1]['key']}.json").unlink()
    assert rg.main(["--smoke", "--out", str(copy), "--jobs", "1", "--no-calibrate", "--permutations", "50"]) == 0
    assert "4 cells (3 complete), 1 to run" in capsys.readouterr().err
    after = json.loads((copy / "grid.json").read_text())
    strip = lambda c: {k: v for k, v in c.items() if k not in TIMINGS}
    assert [strip(c) for c in after["cells"]] == [strip(c) for c in before["cells"]]  # bit-identical on one machine
    # the cached ones were not re-run
    assert [c["cpu_seconds"] for c in after["cells"] if c["name"] != gone] == [
        c["cpu_seconds"] for c in before["cells"] if c["name"] != gone
    ]
    # a changed configuration does not reuse the cache
    assert (
        rg.main(
            ["--smoke", "--out", str(copy), "--jobs", "1", "--no-calibrate", "--lr", "0.001", "--permutations", "50"]
        )
        == 0
    )
    assert "4 cells (0 complete), 4 to run" in capsys.readouterr().err
    torch.set_num_threads(1)


def _cells(scores, helps, sizes, seeds, prior=None):
    """Hand-made cells: every window reading equals ``scores`` (so the family's best is that reading)."""
    out = []
    for i, (s, h, g, sd) in enumerate(zip(scores, helps, sizes, seeds)):
        c = {
            "name": f"c{i}",
            "group": g,
            "seed": sd,
            "delta": -0.1 if h else 0.1,
            "learns_dyt": True,
            "learns_layernorm": True,
            "log_params_per_token": prior[i] if prior else 0.0,
        }
        for r in (
            "window_saturation",
            "window_first_block",
            "window_last_block",
            "window_final_norm",
            "window_centered",
            "window_late",
            "final_saturation",
            "final_first_block",
            "final_last_block",
            "final_final_norm",
            "final_centered",
        ):
            c[r] = s
        out.append(c)
    return out


def test_analysis_against_hand_computed_values(rg):
    # 8 cells, 2 sizes x 2 seeds x 2 budgets; the reading separates the classes perfectly in every fold
    sizes, seeds = ["a", "a", "a", "a", "b", "b", "b", "b"], [0, 0, 1, 1, 0, 0, 1, 1]
    helps = [True, False, True, False, True, False, True, False]
    scores = [0.6, 0.2, 0.65, 0.25, 0.55, 0.15, 0.7, 0.3]
    a = rg.analyze(_cells(scores, helps, sizes, seeds, prior=[1, 0, 0, 1, 1, 0, 0, 1]), permutations=2000)
    w = a["readings"]["window_saturation"]
    assert w["auc"] == 1.0 and w["loso"]["accuracy"] == 1.0 and w["loseedo"]["accuracy"] == 1.0
    # size "a" held out: fit on b's (0.15, 0.3 hurt; 0.55, 0.7 help): (0.3 + 0.55) / 2; "b" held out: a's
    # (0.2, 0.25 hurt; 0.6, 0.65 help): (0.25 + 0.6) / 2
    assert [f["threshold"] for f in w["loso"]["folds"]] == [pytest.approx(0.425), pytest.approx(0.425)]
    assert w["study_043"] == 1.0 and a["baselines"] == {"always_no_go": 0.5, "always_go": 0.5}
    d = a["decision"]
    # exact null: a shuffle reaches 8/8 in both protocols only when it keeps the 4 highest scores as "helps"
    # in every fold; 1 of C(8, 4) = 70 labelings does, so p is about 1/70
    assert d["statistic"] == 1.0 and d["p_value"] < 0.05 and d["predicts"] and d["reading"] == "window_saturation"
    assert a["readings"]["log_params_per_token"]["auc"] == 0.5 and d["adds_to_prior"]
    # the same cells with the outcomes unrelated to the reading: not a predictor
    noise = [True, True, False, False, False, True, True, False]
    a = rg.analyze(_cells(scores, noise, sizes, seeds), permutations=500)
    assert not a["decision"]["predicts"] and a["decision"]["reading"] is None
    # helps: 0.6, 0.2, 0.15, 0.7; hurts: 0.65, 0.25, 0.55, 0.3: 3 + 0 + 0 + 4 of 16 pairs ranked right
    assert a["readings"]["window_saturation"]["auc"] == 7 / 16


def test_report_prints_the_plan_decision_and_plots(rg, grid, tmp_path, capsys):
    out, _ = grid
    assert rg.main(["--report", str(out / "grid.json"), "--plot", str(tmp_path / "p.png"), "--permutations", "20"]) == 0
    text = capsys.readouterr().out
    assert "| window_saturation | window |" in text and "| log_params_per_token | prior |" in text
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_no_matplotlib_is_one_line_not_a_failure(rg, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    cells = _cells([0.1, 0.2, 0.3, 0.4], [False, False, True, True], ["a", "a", "b", "b"], [0, 1, 0, 1])
    assert rg.try_plot(rg.analyze(cells, permutations=5), cells, tmp_path / "p.png") is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install -e ".[report]"' in err and not (tmp_path / "p.png").exists()


def test_docs_quote_the_committed_faithful_grid_and_satmon_states_its_result(rg):
    """docs/science/grids.md's result tables are the committed grid's report, recomputed here from its cells; the
    figures satmon prints (satmon.study) are that grid's, and the shipped phase-diagram cells are its cells."""
    from satmon import study
    from satmon.io.phase_diagram import grid_cells

    committed = json.loads((ROOT / "data" / "faithful_grid.json").read_text())
    cells = committed["cells"]
    assert committed["format"].startswith("satmon-faithful-grid/") and len(cells) == 16
    fresh = rg.analyze(cells, permutations=200)  # every table row; the p-value needs the plan's 10,000 (stored)
    assert fresh["readings"] == committed["analysis"]["readings"]
    doc = (ROOT / "docs" / "science" / "grids.md").read_text()
    stored = rg.report_markdown(committed["analysis"], cells)
    assert rg.report_markdown(fresh, cells).splitlines()[:-1] == stored.splitlines()[:-1]
    for line in stored.splitlines():
        assert line in doc.splitlines(), f"docs/science/grids.md does not quote the grid's report line {line[:80]!r}"
    decision = committed["analysis"]["decision"]
    assert decision["predicts"] is False and decision["candidates"] == 6 and decision["permutations"] == 10_000
    # what the card says: 0.43 on the window's pooled reading (fit on no cell of the grid) against always NO-GO
    helps = [c["delta"] < 0 for c in cells]
    said_go = [c["window_saturation"] >= study.THRESHOLD for c in cells]
    assert study.FAITHFUL_GRID_HELD_OUT_ACCURACY == sum(g == h for g, h in zip(said_go, helps)) / len(cells)
    assert study.FAITHFUL_GRID_NO_SKILL_ACCURACY == max(sum(helps), len(cells) - sum(helps)) / len(cells)
    assert "no 500-step reading beat guessing the commoner outcome held out" in study.CAVEAT
    shipped = {c.name: c for c in grid_cells() if c.source == "satmon 0.4 faithful CPU grid"}
    assert {n: (c.params, c.train_tokens, round(c.delta, 6)) for n, c in shipped.items()} == {
        c["name"]: (float(c["params"]), float(c["train_tokens"]), round(c["delta"], 6)) for c in cells
    }
