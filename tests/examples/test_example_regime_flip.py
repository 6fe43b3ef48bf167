"""examples/regime_flip.py: its table, JSON and plot (smoke mode), and its saturation figures against a
float64 re-count of the same run's DyT inputs."""

from __future__ import annotations

import json
import math

from torch.utils.data import DataLoader

from conftest import load_example, run_script
from reference import model_counts
from satmon.results.verdict import build_verdict


def test_regime_flip_smoke_writes_table_json_and_plot(tmp_path):
    out = run_script("regime_flip.py", "--smoke", "--out", "rf", cwd=tmp_path)
    assert "| few tokens (over-parameterised) |" in out and "| many tokens (data-rich) |" in out
    assert "Sign flip" in out
    data = json.loads((tmp_path / "rf" / "regime_flip.json").read_text())
    assert len(data["runs"]) == 4 and {(r["regime"], r["norm"]) for r in data["runs"]} == {
        (g, n) for g in ("few", "many") for n in ("layernorm", "dyt")
    }
    for r in data["runs"]:
        assert math.isfinite(r["val_loss"]) and r["val_loss"] > 0
        assert ("decision" in r) == (r["norm"] == "dyt")
        if r["norm"] == "dyt":  # every DyT layer sees the same number of elements: pooled = mean of the layers
            per_layer = list(r["per_layer"].values())
            assert len(per_layer) == 3 and math.isclose(
                r["saturation"], sum(per_layer) / 3, rel_tol=1e-12, abs_tol=1e-15
            )
    # one held-out split for every run: the untrained-ish smoke models all score on the same tokens
    assert {r["train_tokens"] for r in data["runs"]} == {data["setup"]["few_tokens"], data["setup"]["many_tokens"]}
    assert (tmp_path / "rf" / "regime_flip.png").stat().st_size > 10_000
    assert (tmp_path / "rf" / "regime_flip.md").read_text().startswith("Mode `smoke`")


def test_regime_flip_saturation_equals_float64_recount(tmp_path, recorded_lit):
    rf = load_example("regime_flip")
    setup = rf.MODES["smoke"]

    def end_recount(model, train_set):  # the end-of-training batches the example reads: the first end_batches
        loader = DataLoader(train_set, batch_size=setup.batch_size)
        inputs = [x for _, (x, _) in zip(range(setup.end_batches), loader)]
        counts = model_counts(model, inputs)
        return {"recount_end": sum(c.saturated for c in counts.values()) / sum(c.total for c in counts.values())}

    r = rf.train_one(setup, "few", "dyt", 0, str(tmp_path), 1, on_end=end_recount)
    (rec,) = recorded_lit
    window = min(500, setup.steps)
    ref = build_verdict(rec.counts(first=window), step=window, window=window)
    assert (r["decision"], r["saturation"], r["per_layer"], r["window"]) == (
        ref.decision,
        ref.saturation,
        ref.per_layer,
        window,
    )
    assert r["saturation_end"] == r["recount_end"]
