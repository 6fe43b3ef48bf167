"""examples/replay_finished_run.py: each replayed checkpoint's verdict equals a float64 re-count of the
checkpoint's DyT inputs on the calibration batches ``satmon replay --datamodule`` documents (the first
``--batches`` batches of the datamodule's train_dataloader, built from the checkpoint's hyper-parameters)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_script
from reference import model_counts
from satmon.demos.corpus import CorpusDataModule
from satmon.demos.lit import LitLM
from satmon.results.verdict import build_verdict


def test_replay_finished_run_matches_float64_recount(tmp_path):
    pytest.importorskip("matplotlib")
    out = run_script(
        "replay_finished_run.py",
        "--steps",
        "4",
        "--every",
        "2",
        "--window",
        "2",
        "--batches",
        "1",
        "--workdir",
        "w",
        cwd=tmp_path,
    )
    assert "satmon replay " in out and "Live monitor over the first 2 steps" in out
    assert (tmp_path / "w" / "replay.md").exists()
    records = json.loads((tmp_path / "w" / "replay.json").read_text())
    assert [r["global_step"] for r in records] == [2, 4]
    for r in records:
        path = tmp_path / r["checkpoint"]  # as the example passed it: relative to its working directory
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        model = LitLM.load_from_checkpoint(path, map_location="cpu")
        data = CorpusDataModule(**ckpt["datamodule_hyper_parameters"])
        data.setup("fit")
        inputs = [x for _, (x, _) in zip(range(1), data.train_dataloader())]
        ref = build_verdict(model_counts(model, inputs), step=r["global_step"], source="replay")
        v = r["verdict"]
        assert (v["decision"], v["saturation"], v["per_layer"], v["source"]) == (
            ref.decision,
            ref.saturation,
            ref.per_layer,
            "replay",
        )
