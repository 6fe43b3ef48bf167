"""Hugging Face ``checkpoint-N`` folders: a real ``transformers.Trainer`` run (a tiny GPT-2 built from a config,
nothing downloaded) replays at its global steps with exit 0; the Trainer's optimizer, scheduler and RNG files
are neither checkpoints nor errors; the readings equal ``probe`` on ``from_pretrained`` of the same folder; sharded
safetensors, ``pytorch_model.bin`` and sharded ``.bin`` folders read the same weights."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from torch.utils.data import Dataset

from satmon import probe
from satmon.cli.main import main

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
safetensors = pytest.importorskip("safetensors.torch")

# after the importorskips: without transformers this module is skipped, not an import error
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

VOCAB, SEQ = 64, 16
CONFIG = dict(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2)
FACTORY = (
    "from transformers import GPT2Config, GPT2LMHeadModel\n"
    f"def build():\n    return GPT2LMHeadModel(GPT2Config(**{CONFIG!r}))\n"
)


class Tokens(Dataset):
    def __init__(self) -> None:
        self.x = torch.randint(0, VOCAB, (16, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """A Trainer run of 4 steps saving every 2 (checkpoint-2, checkpoint-4 with all the Trainer's files)."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    args = TrainingArguments(
        str(root / "out"),
        use_cpu=True,
        report_to="none",
        max_steps=4,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1000,
        disable_tqdm=True,
        dataloader_num_workers=0,
        learning_rate=1e-2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(GPT2LMHeadModel(GPT2Config(**CONFIG)), args, train_dataset=Tokens()).train()
    torch.save(Tokens().x[:8], root / "calib.pt")
    (root / "build.py").write_text(FACTORY)
    return root


def _replay(capsys, *args):
    code = main(["replay", *map(str, args), "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def _reference(folder, batches) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    return probe(model, batches).to_dict()["layers"]


def test_trainer_folders_replay_at_their_global_steps_with_exit_0(hf_run, tmp_path, capsys):
    out = hf_run / "out"
    assert {p.name for p in (out / "checkpoint-2").iterdir()} >= {
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "training_args.bin",
        "trainer_state.json",
    }
    code, stdout, err = _replay(
        capsys,
        out,
        "--factory",
        hf_run / "build.py:build",
        "--data",
        hf_run / "calib.pt",
        "--batch-size",
        4,
        "--no-twin",
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "r.json",
    )
    assert code == 0, err
    assert "optimizer.pt" not in err and "rng_state" not in err and "--trust-checkpoints" not in err
    records = json.loads((tmp_path / "r.json").read_text())
    assert [(r["checkpoint"].rsplit("/", 1)[-1], r["global_step"]) for r in records] == [
        ("checkpoint-2", 2),
        ("checkpoint-4", 4),
    ]
    assert "Replayed 2 of 2" in stdout
    batches = list(torch.load(hf_run / "calib.pt").split(4))
    for r in records:
        want = _reference(r["checkpoint"], batches)  # transformers' own loading of the same folder
        assert r["layers"] == json.loads(json.dumps(want)) and r["weights_only"] is True


def _variant(hf_run, tmp_path, kind: str):
    """checkpoint-4's weights rewritten as transformers writes them in other forms, with a
    written trainer_state.json."""
    src = hf_run / "out" / "checkpoint-4"
    weights = safetensors.load_file(str(src / "model.safetensors"))
    folder = tmp_path / kind / "checkpoint-4"
    folder.mkdir(parents=True)
    shutil.copy(src / "config.json", folder / "config.json")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": []}))
    names = sorted(weights)
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    if kind == "sharded-safetensors":
        files = [f"model-0000{i + 1}-of-00002.safetensors" for i in range(2)]
        for f, part in zip(files, halves):
            safetensors.save_file({k: weights[k] for k in part}, str(folder / f), metadata={"format": "pt"})
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {k: f for f, part in zip(files, halves) for k in part}})
        )
    elif kind == "bin":
        torch.save(weights, folder / "pytorch_model.bin")
    else:
        files = [f"pytorch_model-0000{i + 1}-of-00002.bin" for i in range(2)]
        for f, part in zip(files, halves):
            torch.save({k: weights[k] for k in part}, folder / f)
        (folder / "pytorch_model.bin.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {k: f for f, part in zip(files, halves) for k in part}})
        )
    return folder


@pytest.mark.parametrize("kind", ["sharded-safetensors", "bin", "sharded-bin"])
def test_sharded_and_bin_folders_read_the_same_weights(hf_run, tmp_path, capsys, kind):
    folder = _variant(hf_run, tmp_path, kind)
    code, _, err = _replay(
        capsys,
        folder.parent,
        "--factory",
        hf_run / "build.py:build",
        "--data",
        hf_run / "calib.pt",
        "--batch-size",
        4,
        "--no-twin",
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "r.json",
    )
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    (want,) = [
        r
        for r in json.loads(
            json.dumps([_reference(hf_run / "out" / "checkpoint-4", list(torch.load(hf_run / "calib.pt").split(4)))])
        )
    ]
    assert rec["global_step"] == 4 and rec["layers"] == want


def test_a_missing_shard_is_named_and_the_others_replay(hf_run, tmp_path, capsys):
    folder = _variant(hf_run, tmp_path, "sharded-safetensors")
    (folder / "model-00002-of-00002.safetensors").unlink()
    shutil.copytree(hf_run / "out" / "checkpoint-2", folder.parent / "checkpoint-2")
    code, _, err = _replay(
        capsys,
        folder.parent,
        "--factory",
        hf_run / "build.py:build",
        "--data",
        hf_run / "calib.pt",
        "--batch-size",
        4,
        "--logdir",
        tmp_path / "tb",
    )
    assert code == 1
    assert "incomplete sharded checkpoint: model.safetensors.index.json names 2 shard(s), 1 missing" in err


def test_trainer_side_files_passed_alone_are_nothing_to_replay_not_a_trust_question(hf_run, tmp_path, capsys):
    side = hf_run / "out" / "checkpoint-2"
    code, _, err = _replay(
        capsys,
        side / "rng_state.pth",
        side / "optimizer.pt",
        "--factory",
        hf_run / "build.py:build",
        "--data",
        hf_run / "calib.pt",
        "--logdir",
        tmp_path / "tb",
    )
    assert code == 2 and "Nothing to replay" in err and "not model weights" in err
    assert "--trust-checkpoints" not in err and not (tmp_path / "tb").exists()
