"""``examples/regime_grid.py`` (the faithful grid): a cell's window series, window and final readings
against independent references (a float64 re-count of the same run's DyT inputs, ``satmon.probe`` run
separately), the study's schedule, the budgets in epochs or bytes, the cache that lets a stopped grid
resume, the JSON's environment and configuration, and the pre-registered analysis against hand-made
cells with a known answer."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import dyt_names, load_example
from reference import InputRecorder, counts_of, exact_count

ROOT = Path(__file__).resolve().parents[2]
#: Per-run fields that differ between two runs of the same cell (timings) or of the same grid.
TIMINGS = {"cpu_seconds", "wall_seconds"}


@pytest.fixture(scope="module")
def rg():
    return load_example("regime_grid")


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, str]:
    """The smoke grid as a user runs it: the script, two cells at a time (the process pool), piped."""
    cwd = tmp_path_factory.mktemp("grid")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "regime_grid.py"), "--smoke", "--out", "g", "--jobs", "2",
                           "--no-calibrate", "--permutations", "50"], cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return cwd / "g", proc.stderr


def test_smoke_cell_readings_match_independent_references(rg, monkeypatch):
    """One smoke cell, in-process: its window readings and every 2-step segment of its series equal a
    float64 re-count of the DyT run's training-forward inputs; its final readings equal satmon.probe run
    again on the final weights (training-split sequences) and a float64 re-count of those forwards."""
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
    assert all(len(v) == cfg.steps for v in rec.inputs.values())  # validation and the probe ran in eval mode

    def pooled(lo: int, hi: int) -> tuple[int, int]:  # steps lo+1 .. hi
        return counts_of([item for items in rec.inputs.values() for item in items[lo:hi]])

    s, t = pooled(0, cfg.window)
    assert 0.0 < s / t < 1.0  # the smoke mode saturates (alpha_init 2.0, large embeddings): a real check
    assert cell["window_saturation"] == s / t
    counts = rec.counts(first=cfg.window)
    assert cell["window_per_layer"] == {n: a / b for n, (a, b) in counts.items()}
    assert cell["window_first_block"] == pytest.approx((counts["blocks.0.ln_1"][0] / counts["blocks.0.ln_1"][1]
                                                        + counts["blocks.0.ln_2"][0] / counts["blocks.0.ln_2"][1]) / 2)
    assert cell["window_last_block"] == cell["window_first_block"]  # one block: the first is the last
    assert cell["window_final_norm"] == counts["ln_f"][0] / counts["ln_f"][1]
    s_late, t_late = pooled(rg.late_start(cfg), cfg.window)
    assert cell["window_late"] == s_late / t_late
    # the series: one entry per 2-step segment of the window, each the segment's own counts
    series = cell["window_series"]
    assert [e["step"] for e in series] == list(range(cfg.series_every, cfg.window + 1, cfg.series_every))
    for e in series:
        a, b = pooled(e["step"] - cfg.series_every, e["step"])
        assert e["saturation"] == a / b
        assert e["cumulative"] == pytest.approx(pooled(0, e["step"])[0] / pooled(0, e["step"])[1])
        for name, items in rec.inputs.items():
            seg = items[e["step"] - cfg.series_every:e["step"]]
            seg_sat, seg_tot = counts_of(seg)
            assert e["per_layer"][name] == seg_sat / seg_tot
        assert set(e["alpha"]) == set(dyt_names(model))
    assert cell["window_decision"] == ("go" if s / t >= 0.43 else "no-go")
    # centered: offset_every=1 in smoke mode, so every window step was sampled; float64 reference
    for name, items in rec.inputs.items():
        sat = tot = 0
        for x, a in items[: cfg.window]:
            flat = x.reshape(-1, x.shape[-1])  # (B*T, C)
            sat += exact_count(flat - flat.mean(0), a)
            tot += flat.numel()
        assert cell["window_centered_per_layer"][name] == pytest.approx(sat / tot, abs=1e-12)

    # final: the study's protocol (training-split sequences), run again here on the same final weights
    import satmon

    train_all, vx, vy = rg.corpus(cfg)
    nbytes = budget.resolve(cfg.processed)
    n = min(cfg.probe_sequences, (nbytes - 1) // cfg.seq_len)
    batches = list(train_all[: n * cfg.seq_len].view(n, cfg.seq_len).split(cfg.probe_batch))
    ref = satmon.probe(model, batches, autocast_dtype=torch.bfloat16)
    assert ref.verdict.saturation == cell["final_saturation"] and ref.verdict.per_layer == cell["final_per_layer"]
    assert sum(b.numel() for b in batches) == cell["probe_tokens"]
    modules = dict(model.named_modules())
    sat = cen = tot = 0

    def hook(mod, args, out):
        nonlocal sat, cen, tot
        x, a = args[0].detach().double(), mod.alpha.detach().double()
        flat = x.reshape(-1, x.shape[-1])
        sat += exact_count(flat, a)
        cen += exact_count(flat - flat.mean(0), a)
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

    # the record: both arms on the same held-out bytes, the unigram level of those bytes, the budget
    assert cell["delta"] == pytest.approx((cell["val_loss_dyt"] - cell["val_loss_layernorm"]) / cell["val_loss_layernorm"])
    assert cell["helps"] == (cell["delta"] < 0) and cell["group"] == size.name
    assert cell["learns_dyt"] == (cell["val_loss_dyt"] < cell["unigram_loss"])
    p = torch.bincount(train_all[:nbytes], minlength=256).double() + 1
    assert cell["unigram_loss"] == pytest.approx(float(-(p / p.sum()).log()[vy.reshape(-1)].mean()), rel=1e-12)
    assert cell["val_loss_dyt"] == pytest.approx(rg.val_loss(model, vx, vy), rel=1e-6)
    params = sum(q.numel() for q in model.parameters())
    assert cell["params_total"] == params and cell["params"] == params - model.pos_emb.weight.numel()
    assert cell["epochs"] == cfg.steps * cfg.batch_size * cfg.seq_len / nbytes
    assert cell["tokens_per_param"] == nbytes / cell["params"]
    assert [s for s, _ in cell["train_curve_dyt"]] == list(range(cfg.series_every, cfg.steps + 1, cfg.series_every))
    assert [s for s, _ in cell["val_curve_dyt"]] == [4, 8] and [s for s, _ in cell["alpha_curve"]] == [4, 8]


def test_the_study_schedule_and_no_bias(rg):
    """train.py's schedule (lr * (i + 1) / (warmup + 1), then constant: its cosine horizon is 600k steps) and
    nanoGPT's model at bias=False: no bias anywhere, decay on matrices only."""
    cfg = rg.FULL
    lrs = []
    model = torch.nn.Linear(2, 2)
    opt, sched = rg.optimizer(cfg, model)
    for _ in range(cfg.warmup + 5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(cfg.lr / (cfg.warmup + 1))
    assert lrs[499] == pytest.approx(cfg.lr * 500 / 2001)  # the window's last step: a quarter of the peak
    assert lrs[cfg.warmup - 1] == pytest.approx(cfg.lr * cfg.warmup / (cfg.warmup + 1))
    assert lrs[cfg.warmup:] == [pytest.approx(cfg.lr)] * 5
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    gpt = rg.build_model(cfg, rg.SIZES[0], "dyt", 0)
    assert not [n for n, _ in gpt.named_parameters() if n.endswith(".bias")]
    assert gpt.cfg.emb_scale == 1.0 and gpt.cfg.dropout == 0.0 and gpt.cfg.alpha_init == 2.0
    assert float(gpt.tok_emb.weight.detach().std()) == pytest.approx(0.02, rel=0.05)  # GPT-2's init, unscaled


def test_budgets_and_sizes_parse_and_refuse(rg):
    B = rg.Budget.parse
    assert B("164ep").resolve(5000 * 16 * 64) == 31220 and B("1.4ep").resolve(5000 * 16 * 64) == 3657143
    assert B("64k").resolve(1) == 64_000 and B("3.5M").resolve(1) == 3_500_000 and B("31220").resolve(1) == 31220
    for bad in ("0ep", "-3", "1.5", "12x", "ep"):
        with pytest.raises(ValueError, match="Expected"):
            B(bad)
    assert rg.Size.parse("d96L3") == rg.Size("d96L3", 96, 3, 4) and rg.Size.parse("d64L2H8").n_heads == 8
    for bad in ("64L2", "d64", "d66L2H4", "d0L1"):
        with pytest.raises(ValueError, match="Expected"):
            rg.Size.parse(bad)
    # epochs pick bytes from the steps: the study's passes at the study's step count
    assert rg.FULL.budget_bytes() == (31220, 320000, 1551515, 3657143)
    with pytest.raises(ValueError, match="--window < --steps"):
        rg.replace(rg.FULL, window=5000).check()
    with pytest.raises(ValueError, match="held-out split"):
        rg.replace(rg.FULL, budgets=(B("5M"),)).check()


@pytest.mark.parametrize("argv, message", [
    (["--budgets", "12x"], "--budgets"), (["--sizes", "64"], "--sizes"), (["--seeds", "a"], "--seeds"),
    (["--window", "0"], "--window"), (["--warmup", "9000"], "--warmup"), (["--jobs", "0"], "--jobs"),
])
def test_bad_arguments_are_refused_in_one_line(rg, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rg.main(["--smoke", "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_grid_json_records_environment_configuration_and_series(grid, rg, tmp_path):
    out, stderr = grid
    assert "regime_grid: 4/4 cells" in stderr and "\r" not in stderr  # plain lines when piped
    data = json.loads((out / "faithful_grid.json").read_text())
    cfg = rg.MODES["smoke"]
    env = data["environment"]
    assert env["torch"] == torch.__version__ and env["threads"] == 1 and env["cpu"]
    assert env["satmon_commit"] and isinstance(env["satmon_commit"], str)
    c = data["config"]
    assert (c["steps"], c["window"], c["warmup"], c["emb_scale"]) == (cfg.steps, cfg.window, cfg.warmup, cfg.emb_scale)
    assert c["budget_bytes"] == list(cfg.budget_bytes())
    cells = data["cells"]
    assert len(cells) == 4 and len(list((out / "cells").glob("*.json"))) == 4
    for cell in cells:
        assert cell["epochs"] == pytest.approx(cfg.processed / cell["train_tokens"])
        series = cell["window_series"]
        assert [e["step"] for e in series] == [2, 4]
        assert all(set(e) >= {"step", "saturation", "per_layer"} for e in series)
        for r in rg.WINDOW_READINGS + rg.FINAL_READINGS:
            assert 0.0 <= cell[r] <= 1.0, r
    assert data["analysis"]["n"] == 4

    from satmon.calibrate import read_cells

    read = {c.name: c for c in read_cells(out / "faithful_grid.json")}
    for cell in cells:
        assert read[cell["name"]].group == cell["group"] and read[cell["name"]].delta == cell["delta"]
        assert {r: read[cell["name"]].readings[r] for r in rg.WINDOW_READINGS} == {r: cell[r] for r in rg.WINDOW_READINGS}
    # `satmon calibrate --cells` on every window reading, with both classes present
    for cell in cells:
        cell["delta"] = (-1 if cell["name"].endswith("_t2000_s0") else 1) * (abs(cell["delta"]) + 0.01)
        cell["helps"] = cell["delta"] < 0
    path = tmp_path / "cells.json"
    path.write_text(json.dumps(data))
    codes = rg.calibrate_all(path, tmp_path / "cal")
    assert codes == {r: 0 for r in rg.WINDOW_READINGS}, {r: (tmp_path / "cal" / r / "stdout.txt").read_text() for r in codes}
    a = rg.analyze(cells, permutations=10)
    for r in rg.WINDOW_READINGS:
        cal = json.loads((tmp_path / "cal" / r / "calibration.json").read_text())
        assert cal["metric"] == r and cal["auc"] == pytest.approx(a["readings"][r]["auc"])
        assert cal["threshold"] == pytest.approx(a["readings"][r]["in_sample"]["threshold"])


def test_resume_reuses_cached_cells_and_gives_the_same_bytes(grid, rg, tmp_path, capsys):
    out, _ = grid
    before = json.loads((out / "faithful_grid.json").read_text())
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    gone = before["cells"][1]["name"]
    (copy / "cells" / f"{gone}.json").unlink()
    assert rg.main(["--smoke", "--out", str(copy), "--jobs", "1", "--no-calibrate", "--permutations", "50"]) == 0
    assert "4 cells (3 cached), 1 to run" in capsys.readouterr().err
    after = json.loads((copy / "faithful_grid.json").read_text())
    strip = lambda c: {k: v for k, v in c.items() if k not in TIMINGS}
    assert [strip(c) for c in after["cells"]] == [strip(c) for c in before["cells"]]  # bit-identical on one machine
    assert [c["cpu_seconds"] for c in after["cells"] if c["name"] != gone] == \
           [c["cpu_seconds"] for c in before["cells"] if c["name"] != gone]  # the cached ones were not re-run
    # a changed configuration does not reuse the cache
    assert rg.main(["--smoke", "--out", str(copy), "--jobs", "1", "--no-calibrate", "--lr", "0.001",
                    "--permutations", "50"]) == 0
    assert "4 cells (0 cached), 4 to run" in capsys.readouterr().err
    torch.set_num_threads(1)


def _cells(scores, helps, sizes, seeds, prior=None):
    """Hand-made cells: every window reading equals ``scores`` (so the family's best is that reading)."""
    out = []
    for i, (s, h, g, sd) in enumerate(zip(scores, helps, sizes, seeds)):
        c = {"name": f"c{i}", "group": g, "seed": sd, "delta": -0.1 if h else 0.1, "learns_dyt": True,
             "learns_layernorm": True, "log_params_per_token": prior[i] if prior else 0.0}
        for r in ("window_saturation", "window_first_block", "window_last_block", "window_final_norm", "window_centered",
                  "window_late", "final_saturation", "final_first_block", "final_last_block", "final_final_norm",
                  "final_centered"):
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
    assert rg.main(["--report", str(out / "faithful_grid.json"), "--plot", str(tmp_path / "p.png"),
                    "--permutations", "20"]) == 0
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
    """docs/calibration.md's result tables are the committed grid's report, recomputed here from its cells; the
    figures satmon prints (satmon.study) are that grid's, and the shipped phase-diagram cells are its cells."""
    from satmon import study
    from satmon.io.phase_diagram import grid_cells

    committed = json.loads((ROOT / "docs" / "faithful_grid.json").read_text())
    cells = committed["cells"]
    assert committed["format"].startswith("satmon-faithful-grid/") and len(cells) == 16
    fresh = rg.analyze(cells, permutations=200)  # every table row; the p-value needs the plan's 10,000 (stored)
    assert fresh["readings"] == committed["analysis"]["readings"]
    doc = (ROOT / "docs" / "calibration.md").read_text()
    stored = rg.report_markdown(committed["analysis"], cells)
    assert rg.report_markdown(fresh, cells).splitlines()[:-1] == stored.splitlines()[:-1]
    for line in stored.splitlines():
        assert line in doc.splitlines(), f"docs/calibration.md does not quote the grid's report line {line[:80]!r}"
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
        c["name"]: (float(c["params"]), float(c["train_tokens"]), round(c["delta"], 6)) for c in cells}
