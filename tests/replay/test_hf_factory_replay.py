"""The trial of issue 38.1, end to end: a Hugging Face ``Trainer`` (CPU) trains a tiny Llama whose RMSNorms a
factory converts to DyT, screened by ``SatmonTrainerCallback`` and saved every 2 steps; ``satmon replay OUTPUT_DIR
--factory build.py:build --data calib.pt`` builds the factory's model (on the meta device first) and replays every
model checkpoint, with the saturation the checkpoint's weights give."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import Trainer, TrainingArguments  # noqa: E402

from satmon import probe  # noqa: E402
from satmon.cli.main import main  # noqa: E402
from satmon.drivers.hf import SatmonTrainerCallback  # noqa: E402

FACTORY = """import satmon
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    return satmon.convert_to_dyt(LlamaForCausalLM(config), alpha_init=20.0, rmsnorm=True)
"""


def test_a_factory_that_converts_rmsnorms_replays_the_trainers_checkpoints(tmp_path, capsys, monkeypatch):
    (tmp_path / "build.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    from build import build  # the factory itself, as the user trains with it

    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (16, 16), generator=torch.Generator().manual_seed(0))
    train = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(
        str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=4,
        save_steps=2,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1000,
        learning_rate=1e-2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(build(), args, train_dataset=train, callbacks=[SatmonTrainerCallback(window=3, verbose=False)]).train()
    torch.save(tokens[:4], tmp_path / "calib.pt")
    code = main(
        [
            "replay",
            str(tmp_path / "out"),
            "--factory",
            f"{tmp_path / 'build.py'}:build",
            "--data",
            str(tmp_path / "calib.pt"),
            "--no-twin",
            "--quiet",
            "--logdir",
            str(tmp_path / "tb"),
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    out, err = capsys.readouterr()
    assert "does not build" not in err and "could not be read" not in err, err
    records = json.loads((tmp_path / "r.json").read_text())
    replayed = [r for r in records if r.get("error") is None]
    assert [(r["checkpoint"].rsplit("/", 1)[-1], r["global_step"]) for r in replayed] == [
        ("checkpoint-2", 2),
        ("checkpoint-4", 4),
    ]
    # satmon's own resume files are satmon's, not checkpoints (issue 38.2): nothing skipped, exit 0
    assert not [r for r in records if r.get("error") is not None]
    assert not [line for line in err.splitlines() if line.startswith("satmon replay: skipped ")], err
    assert "satmon_state.pt: not a checkpoint" not in err
    assert code == 0, err
    # the readings are the checkpoint's: the factory's model loaded with its weights, probed on the same batch
    from safetensors.torch import load_file

    for r in replayed:
        model = build()
        model.load_state_dict(load_file(f"{r['checkpoint']}/model.safetensors"), strict=False)  # lm_head tied
        want = probe(model.eval(), [tokens[:4]]).to_dict()["layers"]
        assert {k: v["saturation"] for k, v in r["layers"].items()} == {k: v["saturation"] for k, v in want.items()}
