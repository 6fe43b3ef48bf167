"""``examples/regime_flip.py --grid --smoke``: a tiny calibration grid runs end to end, and what it writes
reads back through ``satmon calibrate``'s two inputs (the cells file, and the TensorBoard runs + outcomes)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_example
from reference import model_counts
from satmon.calibrate.fit import read_cells
from satmon.calibrate.runs import join_outcomes, read_outcomes, run_readings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("grid")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "regime_flip.py"), "--grid", "--smoke", "--out", "g"],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out / "g", proc.stdout


def test_grid_cells_hold_every_reading(grid):
    out, stdout = grid
    data = json.loads((out / "calibration_grid.json").read_text())
    cells = data["cells"]
    assert [c["name"] for c in cells] == ["d16_t2000_s0", "d16_t20000_s0", "d24_t2000_s0", "d24_t20000_s0"]
    for c in cells:
        assert c["group"] == f"d{c['d_model']}"
        assert c["delta"] == pytest.approx((c["val_loss_dyt"] - c["val_loss_layernorm"]) / c["val_loss_layernorm"])
        assert c["helps"] == (c["delta"] < 0)
        for key in ("saturation", "saturation_end", "first_block", "first_block_end", "centered_end"):
            assert 0.0 <= c[key] <= 1.0, key
        # the example's own hook and satmon's counter count the same end-of-window elements
        assert c["saturation_end_hook"] == pytest.approx(c["saturation_end"], abs=1e-6)
        first = [v for k, v in c["per_layer"].items() if ".blocks.0." in f".{k}"]
        assert len(first) == 2 and c["first_block"] == pytest.approx(sum(first) / 2)
    assert len(read_cells(out / "calibration_grid.json")) == 4
    for metric in data["metrics"]:
        assert f"== {metric}" in stdout  # satmon calibrate ran (or said why it could not) for every reading
    summary = (out / "calibration_grid.md").read_text()
    assert (
        all(f"| {c['name']} " in summary for c in cells) and "| study (12 cells, pooled saturation) | 0.4398" in summary
    )


def test_grid_tensorboard_runs_and_outcomes_join(grid):
    out, _ = grid
    cells = {c["name"]: c for c in json.loads((out / "calibration_grid.json").read_text())["cells"]}
    rows = list(csv.DictReader((out / "outcomes.csv").open()))
    assert [r["run"] for r in rows] == [f"{n}_dyt" for n in cells]
    joined = join_outcomes(run_readings([out / "tb"]), read_outcomes(out / "outcomes.csv"))
    for cell in joined:
        ref = cells[cell.name.removesuffix("_dyt")]
        assert cell.readings["saturation"] == pytest.approx(ref["saturation"], abs=1e-6)  # TensorBoard's float32
        assert cell.helps == ref["helps"] and cell.group == ref["group"]


def test_end_readings_equal_satmons_counts_and_offset_statistics():
    """The grid's own hook against two independent references on a model with real saturation: the
    float64 re-count of the examples' conftest, and satmon.functional.offset's centered saturation."""
    from torch.utils.data import TensorDataset

    from satmon.demos.gpt import GPT, GPTConfig
    from satmon.functional.offset import offset_summary, offset_sums

    grid = load_example("regime_flip_grid")
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, norm="dyt", emb_scale=50.0))
    with torch.no_grad():  # a per-channel offset on top of token variation: centered < plain saturation
        model.tok_emb.weight += torch.linspace(-0.04, 0.04, 32)
    x = torch.randint(0, 256, (12, 16))
    data = TensorDataset(x, x)
    got = grid.end_readings(model, data, batch_size=4, batches=3)
    ref = model_counts(model, list(x.split(4)))
    for name, c in ref.items():
        assert got["per_layer_end"][name] == c.saturated / c.total
    assert 0.0 < got["saturation_end_hook"] < 1.0
    # centered saturation, per layer, from satmon's offset statistics fed the same DyT inputs
    sums: dict[str, object] = {}
    modules = dict(model.named_modules())
    hooks = [
        modules[n].register_forward_hook(
            lambda m, a, o, n=n: sums.__setitem__(
                n, offset_sums(a[0], m.alpha) + sums[n] if n in sums else offset_sums(a[0], m.alpha)
            )
        )
        for n in ref
    ]
    model.eval()
    with torch.no_grad():
        for xb in x.split(4):
            model(xb)
    for h in hooks:
        h.remove()
    for name in ref:
        assert got["centered_per_layer_end"][name] == pytest.approx(
            float(offset_summary(sums[name]).centered_fraction), abs=1e-12
        )
    assert 0.0 < got["centered_end"] < got["saturation_end_hook"]
