"""satmon's faithful grid as the builtin recipe (``satmon/grid/builtin.py``): the moved code is bit-identical to the
pre-move script (``examples/regime_grid.py`` at the lead's grid2 commit, read from git) on the smoke cells; a cell's
window series, window and final readings against independent references (a float64 re-count of the same run's DyT
inputs, ``satmon.probe`` run separately); the study's schedule; budgets and sizes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from reference import InputRecorder
from satmon.dyt import DyT
from satmon.grid import builtin
from satmon.grid.cell import make_spec, measure_cell
from satmon.grid.config import Budget, GridSettings
from satmon.grid.engine import _resolve
from satmon.grid.train import late_start, optimizer, val_loss

ROOT = Path(__file__).resolve().parents[2]
#: The commit whose examples/regime_grid.py is the pre-move script (the lead's grid2 commit, the version moved).
PREMOVE = "a75b1d3"
#: Fields that differ between two runs of one cell (timings, the code's commit) or that the package adds.
NOT_COMPARED = {"cpu_seconds", "wall_seconds", "code"}


def dyt_names(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, DyT)]


@pytest.fixture(scope="module")
def smoke() -> tuple[GridSettings, dict]:
    _, st, o = _resolve(builtin.RECIPE, "smoke", None, None, None, None, None)
    return st, o


def _premove(tmp_path: Path):
    try:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{PREMOVE}:examples/regime_grid.py"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"the pre-move script needs git and commit {PREMOVE} (a full clone)")
    path = tmp_path / "regime_grid_premove.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("regime_grid_premove", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_moved_code_gives_the_premove_scripts_cells_to_the_last_digit(tmp_path, smoke_grid):
    """Two smoke cells (both sizes, both budgets) by the pre-move script, in this process, against the same cells
    of `satmon grid builtin --smoke` run as submitit jobs: every field equal (timings and the commit apart)."""
    rg = _premove(tmp_path)
    cfg = rg.MODES["smoke"]
    got = {c["name"]: c for c in json.loads((smoke_grid[0] / "grid.json").read_text())["cells"]}
    legacy = tmp_path / "legacy" / "cells"
    legacy.mkdir(parents=True)
    for size, budget in ((cfg.sizes[0], cfg.budgets[0]), (cfg.sizes[1], cfg.budgets[1])):
        old = json.loads(json.dumps(rg.run_cell(cfg, size, budget, 0)))
        new = got[old["name"]]
        differ = [k for k in old if k not in NOT_COMPARED and old[k] != new.get(k)]
        assert not differ, {k: (old[k], new.get(k)) for k in differ[:3]}
        # where the cell ran (torch, CPU, threads, jobs, commit)
        assert set(new) - set(old) == {
            "passes",
            "delta_best",
            "helps_best",
            "best_step_dyt",
            "best_step_layernorm",
            "batches_crc",
            "key",
            "grid_key",
            "recipe",
            "arms",
            "reference_arm",
            "compared_arm",  # 0.6: N arms
            "missing",  # 0.6: readings that could not be computed
            "diverged",  # 0.7: the arms whose loss stopped being finite
            "environment",
        }
        (legacy / f"{old['name']}.json").write_text(json.dumps(old))  # as the script cached it
    torch.set_num_threads(1)
    # the script's cached cells are adopted by `satmon grid` (same configuration), with the fields it adds
    import satmon.grid

    lines: list[str] = []
    r = satmon.grid.run("builtin", preset="smoke", out=legacy.parent, executor="slurm", dry_run=True, say=lines.append)
    assert lines[0].startswith("adopted 2 cells") and lines[1].startswith("4 cells (2 complete), 2 to run")
    for c in r.cells:
        assert {k: c[k] for k in ("delta_best", "helps_best", "best_step_dyt", "key")} == {
            k: got[c["name"]][k] for k in ("delta_best", "helps_best", "best_step_dyt", "key")
        }
        assert c["adopted_from"].endswith(f"{c['name']}.json")
    # another configuration does not adopt them
    lines.clear()
    satmon.grid.run(
        "builtin",
        preset="smoke",
        out=legacy.parent,
        settings={"lr": 1e-3},
        executor="slurm",
        dry_run=True,
        say=lines.append,
    )
    assert lines[0].startswith("4 cells (0 complete)")


@pytest.mark.skipif(
    not os.environ.get("SATMON_QUICK_CELLS"), reason="~15 CPU-minutes per cell: set SATMON_QUICK_CELLS=1"
)
def test_quick_cells_match_the_committed_faithful_grid(tmp_path):
    """`--quick`'s cells against data/faithful_grid.json, every field but timings and the commit. Holds only on the
    machine type and satmon wording that made the file (an AMD EPYC, AVX2); on another CPU the kernels round
    differently from step 1 (docs/guides/grid.md: what was measured on an AVX-512 Xeon)."""
    import satmon.grid

    committed = {c["name"]: c for c in json.loads((ROOT / "data" / "faithful_grid.json").read_text())["cells"]}
    r = satmon.grid.run("builtin", preset="quick", out=tmp_path / "q", jobs=2, permutations=10, say=lambda line: None)
    assert r.complete
    for c in r.cells:
        old = committed[c["name"]]
        assert {k: v for k, v in old.items() if k not in NOT_COMPARED} == {
            k: c[k] for k in old if k not in NOT_COMPARED
        }


def test_smoke_cell_readings_match_independent_references(smoke):
    """One smoke cell, in-process: its window readings and every 2-step segment of its series equal a
    float64 re-count of the DyT run's training-forward inputs; its final readings equal satmon.probe run
    again on the final weights (training-split sequences) and a float64 re-count of those forwards."""
    cfg, opts = smoke
    size, budget, seed = "d16L1", Budget.parse("2000"), 0
    built: dict[str, tuple[torch.nn.Module, InputRecorder]] = {}

    def recording_build(spec, norm):
        model = builtin.model(spec, norm)
        built[norm] = (model, InputRecorder(model, dyt_names(model)))  # training forwards only (mod.training)
        return model

    recipe = replace(builtin.RECIPE, model=recording_build)
    cell = measure_cell(recipe, cfg, make_spec(recipe, cfg, opts, size, budget, seed))
    torch.set_num_threads(1)
    model, rec = built["dyt"]
    rec.remove()
    assert dyt_names(built["layernorm"][0]) == []  # the LayerNorm arm has no DyT layer
    assert all(len(v) == cfg.steps for v in rec.inputs.values())  # validation and the probe ran in eval mode

    def pooled(lo: int, hi: int) -> tuple[int, int]:  # steps lo+1 .. hi
        sat = tot = 0
        for items in rec.inputs.values():
            for x, a in items[lo:hi]:
                sat += int(((a * x).abs() > 2.0).sum())
                tot += x.numel()
        return sat, tot

    s, t = pooled(0, cfg.window)
    assert 0.0 < s / t < 1.0  # the smoke mode saturates (alpha_init 2.0, large embeddings): a real check
    assert cell["window_saturation"] == s / t
    counts = rec.counts(first=cfg.window)
    assert cell["window_per_layer"] == {n: a / b for n, (a, b) in counts.items()}
    assert cell["window_first_block"] == pytest.approx(
        (
            counts["blocks.0.ln_1"][0] / counts["blocks.0.ln_1"][1]
            + counts["blocks.0.ln_2"][0] / counts["blocks.0.ln_2"][1]
        )
        / 2
    )
    assert cell["window_last_block"] == cell["window_first_block"]  # one block: the first is the last
    assert cell["window_final_norm"] == counts["ln_f"][0] / counts["ln_f"][1]
    s_late, t_late = pooled(late_start(cfg), cfg.window)
    assert cell["window_late"] == s_late / t_late
    # the series: one entry per 2-step segment of the window, each the segment's own counts
    series = cell["window_series"]
    assert [e["step"] for e in series] == list(range(cfg.series_every, cfg.window + 1, cfg.series_every))
    for e in series:
        a, b = pooled(e["step"] - cfg.series_every, e["step"])
        assert e["saturation"] == a / b
        assert e["cumulative"] == pytest.approx(pooled(0, e["step"])[0] / pooled(0, e["step"])[1])
        for name, items in rec.inputs.items():
            seg = items[e["step"] - cfg.series_every : e["step"]]
            ref = sum(int(((al * x).abs() > 2.0).sum()) for x, al in seg) / sum(x.numel() for x, _ in seg)
            assert e["per_layer"][name] == ref
        assert set(e["alpha"]) == set(dyt_names(model))
    assert cell["window_decision"] == ("go" if s / t >= 0.43 else "no-go")
    # centered: offset_every=1 in smoke mode, so every window step was sampled; float64 reference
    for name, items in rec.inputs.items():
        sat = tot = 0
        for x, a in items[: cfg.window]:
            flat = x.reshape(-1, x.shape[-1])  # (B*T, C)
            sat += int(((a * (flat - flat.mean(0))).abs() > 2.0).sum())
            tot += flat.numel()
        assert cell["window_centered_per_layer"][name] == pytest.approx(sat / tot, abs=1e-12)

    # final: the study's protocol (training-split sequences), run again here on the same final weights
    import satmon

    train_all, vx, vy = builtin.corpus(opts)
    processed = cfg.steps * opts["batch_size"] * opts["seq_len"]
    nbytes = budget.resolve(processed)
    n = min(opts["probe_sequences"], (nbytes - 1) // opts["seq_len"])
    batches = list(train_all[: n * opts["seq_len"]].view(n, opts["seq_len"]).split(opts["probe_batch"]))
    ref = satmon.probe(model, batches, autocast_dtype=torch.bfloat16)
    assert ref.verdict.saturation == cell["final_saturation"] and ref.verdict.per_layer == cell["final_per_layer"]
    assert sum(b.numel() for b in batches) == cell["probe_tokens"]
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

    # the record: both arms on the same held-out bytes, the unigram level of those bytes, the budget
    assert cell["delta"] == pytest.approx(
        (cell["val_loss_dyt"] - cell["val_loss_layernorm"]) / cell["val_loss_layernorm"]
    )
    assert cell["helps"] == (cell["delta"] < 0) and cell["group"] == size
    assert cell["learns_dyt"] == (cell["val_loss_dyt"] < cell["unigram_loss"])
    p = torch.bincount(train_all[:nbytes], minlength=256).double() + 1
    assert cell["unigram_loss"] == pytest.approx(float(-(p / p.sum()).log()[vy.reshape(-1)].mean()), rel=1e-12)
    assert cell["val_loss_dyt"] == pytest.approx(val_loss(builtin.RECIPE, model, vx, vy), rel=1e-6)
    params = sum(q.numel() for q in model.parameters())
    assert cell["params_total"] == params and cell["params"] == params - model.pos_emb.weight.numel()
    assert cell["epochs"] == processed / nbytes
    assert cell["tokens_per_param"] == nbytes / cell["params"]
    assert [s for s, _ in cell["train_curve_dyt"]] == list(range(cfg.series_every, cfg.steps + 1, cfg.series_every))
    assert [s for s, _ in cell["val_curve_dyt"]] == [4, 8] and [s for s, _ in cell["alpha_curve"]] == [4, 8]


def test_the_study_schedule_and_no_bias():
    """train.py's schedule (lr * (i + 1) / (warmup + 1), then constant: its cosine horizon is 600k steps) and
    nanoGPT's model at bias=False: no bias anywhere, decay on matrices only."""
    cfg = GridSettings()
    lrs = []
    model = torch.nn.Linear(2, 2)
    opt, sched = optimizer(cfg, model)
    for _ in range(cfg.warmup + 5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(cfg.lr / (cfg.warmup + 1))
    assert lrs[499] == pytest.approx(cfg.lr * 500 / 2001)  # the window's last step: a quarter of the peak
    assert lrs[cfg.warmup - 1] == pytest.approx(cfg.lr * cfg.warmup / (cfg.warmup + 1))
    assert lrs[cfg.warmup :] == [pytest.approx(cfg.lr)] * 5
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    gpt = builtin.model(make_spec(builtin.RECIPE, cfg, builtin.OPTIONS, "d64L2", Budget.parse("164ep"), 0), "dyt")
    assert not [n for n, _ in gpt.named_parameters() if n.endswith(".bias")]
    assert gpt.cfg.emb_scale == 1.0 and gpt.cfg.dropout == 0.0 and gpt.cfg.alpha_init == 2.0
    assert float(gpt.tok_emb.weight.detach().std()) == pytest.approx(0.02, rel=0.05)  # GPT-2's init, unscaled


def test_budgets_and_sizes_parse_and_refuse():
    B = Budget.parse
    assert B("164ep").resolve(5000 * 16 * 64) == 31220 and B("1.4ep").resolve(5000 * 16 * 64) == 3657143
    assert B("64k").resolve(1) == 64_000 and B("3.5M").resolve(1) == 3_500_000 and B("31220").resolve(1) == 31220
    for bad in ("0ep", "-3", "1.5", "12x", "ep"):
        with pytest.raises(ValueError, match="Expected"):
            B(bad)
    assert builtin.parse_size("d96L3") == (96, 3, 4) and builtin.parse_size("d64L2H8")[2] == 8
    for bad in ("64L2", "d64", "d66L2H4", "d0L1"):
        with pytest.raises(ValueError, match="Expected"):
            builtin.parse_size(bad)
    # epochs pick bytes from the steps: the study's passes at the study's step count
    plan, st, o = _resolve(builtin.RECIPE, "full", None, None, None, None, None)
    assert tuple(b.resolve(st.steps * builtin.RECIPE.step_tokens(o)) for b in plan.budgets) == (
        31220,
        320000,
        1551515,
        3657143,
    )
    with pytest.raises(ValueError, match="--window < --steps"):
        GridSettings(window=5000).check()
    with pytest.raises(ValueError, match="held-out split"):
        builtin.check(make_spec(builtin.RECIPE, st, o, "d64L2", B("5M"), 0))
