"""``examples/regime_grid.py``: the window and final readings of a cell against independent references
(a float64 re-count of the same run's DyT inputs, ``satmon.probe`` run separately), the cache that
lets a stopped grid resume, and the JSON that ``satmon calibrate --cells`` reads."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import dyt_names, load_example
from helpers import InputRecorder

ROOT = Path(__file__).resolve().parents[2]
#: Per-run fields that differ between two runs of the same cell (timings) or of the same grid.
TIMINGS = {"cpu_seconds", "wall_seconds"}


@pytest.fixture(scope="module")
def rg():
    return load_example("regime_grid")


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, str]:
    """The smoke grid as a user runs it: the script, two cells at a time (the process pool)."""
    cwd = tmp_path_factory.mktemp("grid")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "regime_grid.py"), "--smoke", "--out", "g", "--jobs", "2",
                           "--no-calibrate"], cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return cwd / "g", proc.stderr


def test_smoke_cell_readings_match_independent_references(rg, monkeypatch):
    """One smoke cell, in-process: its window readings equal a float64 re-count of the DyT run's
    training-forward inputs over the first `window` steps; its final readings equal satmon.probe run
    again on the final weights, and a float64 re-count of the probe's forwards."""
    cfg = rg.MODES["smoke"]
    size, budget, seed = cfg.sizes[0], cfg.budgets[0], cfg.seeds[0]
    built: dict[str, tuple[torch.nn.Module, InputRecorder]] = {}
    original = rg.build_model

    def recording_build(cfg_, size_, norm, seed_):
        model = original(cfg_, size_, norm, seed_)
        built[norm] = (model, InputRecorder(model, dyt_names(model)))  # training forwards only (mod.training)
        return model

    monkeypatch.setattr(rg, "build_model", recording_build)
    cell = rg.run_cell(cfg, size, budget, seed)
    torch.set_num_threads(1)
    model, rec = built["dyt"]
    rec.remove()
    assert dyt_names(built["layernorm"][0]) == []  # the LayerNorm arm has no DyT layer

    # window: one training forward per step, so the first `window` recorded inputs of each layer are the window
    counts = rec.counts(first=cfg.window)
    assert all(len(v) == cfg.steps for v in rec.inputs.values())  # validation and the probe ran in eval mode
    pooled = sum(s for s, _ in counts.values()) / sum(t for _, t in counts.values())
    assert 0.0 < pooled < 1.0  # the smoke mode saturates (alpha_init 2.0, large embeddings): a real check
    assert cell["window_saturation"] == pooled
    assert cell["window_per_layer"] == {n: s / t for n, (s, t) in counts.items()}
    first = [s / t for n, (s, t) in counts.items() if n.startswith("blocks.0.")]
    assert len(first) == 2 and cell["window_first_block"] == pytest.approx(sum(first) / 2, abs=1e-15)
    assert cell["window_decision"] == ("go" if pooled >= 0.43 else "no-go")
    # centered: offset_every=1 in smoke mode, so every window step was sampled; float64 reference
    for name, items in rec.inputs.items():
        sat = tot = 0
        for x, a in items[: cfg.window]:
            flat = x.reshape(-1, x.shape[-1])  # (B*T, C)
            sat += int(((a * (flat - flat.mean(0))).abs() > 2.0).sum())
            tot += flat.numel()
        assert cell["window_centered_per_layer"][name] == pytest.approx(sat / tot, abs=1e-12)

    # final: the study's protocol, run again here on the same final weights and held-out sequences
    import satmon

    _, vx, _ = rg.corpus(cfg)
    batches = list(vx[: cfg.probe_sequences].split(cfg.probe_batch))
    ref = satmon.probe(model, batches, autocast_dtype=torch.bfloat16)
    assert ref.verdict.saturation == cell["final_saturation"]
    assert ref.verdict.per_layer == cell["final_per_layer"]
    assert cell["final_first_block"] == pytest.approx(
        sum(v for k, v in ref.verdict.per_layer.items() if k.startswith("blocks.0.")) / 2, abs=1e-15)
    assert sum(b.numel() for b in batches) == cell["probe_tokens"]
    # and a float64 re-count of the same forwards (eval, bf16 autocast), with their centered fraction
    modules = dict(model.named_modules())
    sat = cen = tot = 0

    def hook(mod, args, out):
        nonlocal sat, cen, tot
        x, a = args[0].detach().double(), mod.alpha.detach().double()
        flat = x.reshape(-1, x.shape[-1])
        sat += int(((a * flat).abs() > 2.0).sum())
        cen += int(((a * (flat - flat.mean(0))).abs() > 2.0).sum())
        tot += flat.numel()

    handles = [modules[n].register_forward_hook(hook) for n in dyt_names(model)]
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for b in batches:
            model(b)
    for h in handles:
        h.remove()
    assert cell["final_saturation_hook"] == sat / tot
    assert cell["final_saturation"] == pytest.approx(sat / tot, abs=2 / tot)  # the probe's product vs the exact one
    assert cell["final_centered"] == pytest.approx(cen / tot, abs=1e-12)

    # the record: both arms on the same held-out tokens, the unigram level of those tokens
    assert cell["delta"] == pytest.approx((cell["val_loss_dyt"] - cell["val_loss_layernorm"]) / cell["val_loss_layernorm"])
    assert cell["helps"] == (cell["delta"] < 0) and cell["group"] == size.name
    assert (cell["steps"], cell["window"], cell["alpha_init"]) == (cfg.steps, cfg.window, cfg.alpha_init)
    train_all, _, vy = rg.corpus(cfg)
    p = torch.bincount(train_all[:budget], minlength=256).double() + 1
    assert cell["unigram_loss"] == pytest.approx(float(-(p / p.sum()).log()[vy.reshape(-1)].mean()), rel=1e-12)
    assert cell["val_loss_dyt"] == pytest.approx(rg.val_loss(model, vx, vy), rel=1e-6)


def test_grid_json_has_what_calibrate_reads(grid, rg, tmp_path):
    out, stderr = grid
    assert "[########################] 4/4 cells" in stderr  # the progress bar reached the end
    data = json.loads((out / "regime_grid.json").read_text())
    cfg = rg.MODES["smoke"]
    cells = data["cells"]
    assert len(cells) == len(cfg.sizes) * len(cfg.budgets) * len(cfg.seeds) == 4
    assert data["readings"] == list(rg.READINGS)
    for c in cells:
        for key in ("name", "group", "window", "steps", "val_loss_dyt", "val_loss_layernorm", "unigram_loss", "delta",
                    "helps", "alpha_init", *rg.READINGS):
            assert key in c, key
        for r in rg.READINGS:
            assert 0.0 <= c[r] <= 1.0 and math.isfinite(c[r]), r
        assert c["steps"] >= 3 * c["window"]
    assert len(list((out / "cells").glob("*.json"))) == 4

    from satmon.calibrate import read_cells

    read = {c.name: c for c in read_cells(out / "regime_grid.json")}
    for c in cells:
        assert read[c["name"]].group == c["group"] and read[c["name"]].helps == c["helps"]
        assert read[c["name"]].delta == c["delta"]
        assert {r: read[c["name"]].readings[r] for r in rg.READINGS} == {r: c[r] for r in rg.READINGS}

    # `satmon calibrate --cells` on every reading: two outcomes flipped so that both classes are present
    # (the smoke cells are not trained enough for DyT to help); its AUC, leave-one-group-out accuracy
    # and threshold are the report's
    for c in cells:
        c["delta"] = (-1 if c["name"].endswith("_t2000_s0") else 1) * (abs(c["delta"]) + 0.01)
        c["helps"] = c["delta"] < 0  # the two outcome columns agree (calibrate refuses a cell where they do not)
    path = tmp_path / "cells.json"
    path.write_text(json.dumps(data))
    codes = rg.calibrate_all(path, tmp_path / "cal")
    assert codes == {r: 0 for r in rg.READINGS}, {r: (tmp_path / "cal" / r / "stdout.txt").read_text() for r in codes}
    stats = rg.statistics(cells)
    for r in rg.READINGS:
        cal = json.loads((tmp_path / "cal" / r / "calibration.json").read_text())
        assert cal["metric"] == r and cal["n"] == 4 and cal["groups"] == 2
        assert cal["auc"] == pytest.approx(stats["readings"][r]["auc"])
        assert cal["loso_accuracy"] == pytest.approx(stats["readings"][r]["midpoint"]["logo"])
        assert cal["threshold"] == pytest.approx(stats["readings"][r]["midpoint"]["threshold"])
        assert f"metric '{r}'" in (tmp_path / "cal" / r / "stdout.txt").read_text()
    original = json.loads((out / "regime_grid.json").read_text())["cells"]
    if len({c["helps"] for c in original}) == 1:  # the usual smoke outcome: calibrate refuses, and says why
        codes = rg.calibrate_all(out / "regime_grid.json", tmp_path / "one")
        assert set(codes.values()) == {2}
        text = (tmp_path / "one" / rg.READINGS[0] / "stdout.txt").read_text()
        assert "Expected cells where DyT helped and cells where it hurt" in text


def test_resume_reuses_cached_cells_and_gives_the_same_json(grid, rg, tmp_path, capsys):
    out, _ = grid
    before = json.loads((out / "regime_grid.json").read_text())
    # a stopped run: one cell's cache is gone; the resumed run trains that cell only, and the same numbers come back
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    gone = before["cells"][1]["name"]
    (copy / "cells" / f"{gone}.json").unlink()
    assert rg.main(["--smoke", "--out", str(copy), "--jobs", "1", "--no-calibrate"]) == 0
    assert "4 cells (3 cached), 1 to run" in capsys.readouterr().err
    after = json.loads((copy / "regime_grid.json").read_text())
    strip = lambda c: {k: v for k, v in c.items() if k not in TIMINGS}
    assert [strip(c) for c in after["cells"]] == [strip(c) for c in before["cells"]]  # deterministic on one thread
    assert [c["cpu_seconds"] for c in after["cells"] if c["name"] != gone] == \
           [c["cpu_seconds"] for c in before["cells"] if c["name"] != gone]  # the cached ones were not re-run
    # a changed configuration does not reuse the cache
    assert rg.main(["--smoke", "--out", str(copy), "--jobs", "1", "--no-calibrate", "--lr", "0.001"]) == 0
    assert "4 cells (0 cached), 4 to run" in capsys.readouterr().err
    torch.set_num_threads(1)


def test_report_statistics_against_hand_computed_values(rg, grid, tmp_path, capsys):
    # Spearman without ties: 1 - 6 sum d^2 / (n (n^2 - 1)); ranks of b are 1, 3, 2, 4 -> d^2 = 2
    assert rg.spearman([0.1, 0.2, 0.3, 0.4], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(1 - 6 * 2 / (4 * 15))
    assert rg.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)  # ties get average ranks
    assert rg.slope([0.0, 1.0, 2.0], [1.0, 3.0, 5.0]) == pytest.approx((2.0, 1.0))
    lo, hi = rg.bootstrap([0.1, 0.2, 0.3, 0.4, 0.5], [0.2, 0.4, 0.6, 0.8, 1.0], rg.slope, n=200)
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)  # a line: every resample has slope 2
    out, _ = grid
    assert rg.main(["--report", str(out / "regime_grid.json"), "--plot", str(tmp_path / "p.png")]) == 0
    text = capsys.readouterr().out
    assert "| window_saturation -> final_saturation |" in text and "| always NO-GO |" in text
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_docs_quote_the_committed_grid(rg):
    """docs/regime_grid.json is the full grid's output: every cell learns in both arms, its final
    checkpoint is three windows in, DyT helps in some cells and not all; docs/calibration.md quotes
    the report computed from it (every table row, verbatim)."""
    docs = ROOT / "docs"
    data = json.loads((docs / "regime_grid.json").read_text())
    cells = data["cells"]
    assert data["mode"] == "full" and len(cells) >= 18 and len({c["group"] for c in cells}) >= 3
    for c in cells:
        assert c["val_loss_dyt"] < c["unigram_loss"] and c["val_loss_layernorm"] < c["unigram_loss"], c["name"]
        assert c["window"] == 500 and c["steps"] >= 3 * c["window"], c["name"]
    assert 0 < sum(c["delta"] < 0 for c in cells) < len(cells)
    page = (docs / "calibration.md").read_text()
    rows = [l for l in rg.report_markdown(rg.statistics(cells), cells).splitlines() if l.startswith("| ")]
    missing = [l for l in rows if l not in page]
    assert not missing, missing
