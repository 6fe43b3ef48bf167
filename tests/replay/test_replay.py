"""The replay loop: models built from the one read of each file exactly as Lightning's
``load_from_checkpoint`` builds them, typed records, the verdict of each checkpoint, non-finite weights.
The command line (TensorBoard, JSON, report, exit codes) is tested in tests/cli/test_cli_replay.py."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import tiny_lit
from satmon import probe
from satmon.batches import feed_first
from satmon.demos.corpus import CorpusDataModule
from satmon.demos.lit import LitLM
from satmon.replaying.checkpoints import (
    inspect_checkpoint,
    order_checkpoints,
)
from satmon.replaying.listing import find_checkpoints
from satmon.replaying.loop import (
    ModelLoader,
    ReplayRecord,
    checkpoint_records,
    nonfinite_parameters,
    summary_row,
)

DM_ARGS = dict(seq_len=16, batch_size=4, train_tokens=20_000, val_tokens=2_000, seed=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Checkpoints at steps 2 and 4 of a DyT run, and three calibration batches."""
    root = tmp_path_factory.mktemp("run")
    pl.seed_everything(0, verbose=False)
    ckpt = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        pl.Trainer(
            max_steps=4,
            accelerator="cpu",
            devices=1,
            logger=False,
            callbacks=[ckpt],
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        ).fit(tiny_lit(lr=1e-2), CorpusDataModule(**DM_ARGS))
    dm = CorpusDataModule(**DM_ARGS)
    dm.setup("fit")
    return sorted(root.glob("*.ckpt")), [b for _, b in zip(range(3), dm.train_dataloader())]


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_model_built_from_the_read_equals_load_from_checkpoint(run):
    (path, _), batches = run[0], run[1]
    info = inspect_checkpoint(path)
    model = ModelLoader(LitLM).load(info)
    want = LitLM.load_from_checkpoint(path, map_location="cpu").eval()
    assert _same_weights(model, want) and dict(model.hparams) == dict(want.hparams) and not model.training
    got, ref = (
        probe(model, batches, forward_fn=feed_first, level=0.5),
        probe(want, batches, forward_fn=feed_first, level=0.5),
    )
    assert got.to_dict()["layers"] == ref.to_dict()["layers"]


class Hooked(LitLM):
    def on_load_checkpoint(self, checkpoint):
        self.loaded_step = checkpoint["global_step"]


class ConfigModule(pl.LightningModule):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.save_hyperparameters(config)  # Lightning stores hparams_name="config"
        self.lin = torch.nn.Linear(config["d"], 2)


def test_lightning_hooks_and_hparams_forms_as_lightning_does(run, tmp_path):
    info = inspect_checkpoint(run[0][0])
    assert ModelLoader(Hooked).load(info).loaded_step == 2  # on_load_checkpoint is called, as Lightning calls it
    module = ConfigModule({"d": 3})
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": dict(module.hparams),
            "hparams_name": "config",
            "pytorch-lightning_version": pl.__version__,
            "global_step": 5,
        },
        tmp_path / "cfg.ckpt",
    )
    info = inspect_checkpoint(tmp_path / "cfg.ckpt")
    built = ModelLoader(ConfigModule).load(info)
    assert _same_weights(built, ConfigModule.load_from_checkpoint(tmp_path / "cfg.ckpt"))
    assert ModelLoader(ConfigModule).twin(info).lin.in_features == 3


def test_replay_reads_each_file_once_and_steps_each_verdict(run, monkeypatch):
    paths, batches = run
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **kw: calls.append(str(f)) or real(f, *a, **kw))
    infos = order_checkpoints([inspect_checkpoint(p) for p in find_checkpoints([paths[0].parent])])
    records = list(
        checkpoint_records(infos, ModelLoader(LitLM), batches, probe_kwargs=dict(forward_fn=feed_first, level=0.5))
    )
    assert sorted(calls) == sorted(map(str, paths))  # one torch.load per file, inspection included
    assert all(i.checkpoint is None for i in infos)  # the loop released what it read
    assert [r.global_step for r in records] == [2, 4] and all(isinstance(r, ReplayRecord) for r in records)
    for r in records:
        v = r.verdict
        assert v.step == r.global_step and v.source == "replay" and v.window == 0 and v.reason.startswith("replay (")
        assert r.to_dict()["verdict"] == v.to_dict() and r.error is None and r.weights_only and not r.nonfinite


def test_record_dict_keys_are_the_json_of_satmon_0_1(run):
    paths, batches = run
    good, bad = list(
        checkpoint_records(
            [inspect_checkpoint(paths[0]), inspect_checkpoint(paths[0].parent / "nope.pt")],
            ModelLoader(LitLM),
            batches,
            probe_kwargs=dict(forward_fn=feed_first),
        )
    )
    report_keys = list(good.report.to_dict())
    assert list(good.to_dict()) == [
        "checkpoint",
        "global_step",
        *report_keys,
        "seconds",
        "weights_only",
        "nonfinite_weights",
    ]
    assert list(bad.to_dict()) == ["checkpoint", "global_step", "error"] and bad.report is None
    assert good.to_dict()["global_step"] == 2


def test_nonfinite_weights_are_counted_and_make_the_record_nonfinite(run, tmp_path):
    paths, batches = run
    ckpt = torch.load(paths[1], weights_only=True)
    w = ckpt["state_dict"]["model.blocks.1.mlp.c_fc.weight"].clone()
    w[0, :5] = float("nan")
    w[1, 0] = float("inf")
    ckpt["state_dict"]["model.blocks.1.mlp.c_fc.weight"] = w
    torch.save(ckpt, tmp_path / "nan.ckpt")
    (record,) = checkpoint_records(
        [inspect_checkpoint(tmp_path / "nan.ckpt")],
        ModelLoader(LitLM),
        batches,
        probe_kwargs=dict(forward_fn=feed_first),
    )
    assert record.nonfinite_weights == 6 and record.nonfinite
    assert any("model.blocks.1.mlp.c_fc.weight (6)" in n for n in record.notes)
    assert record.verdict.decision == "non-finite" and record.verdict.nonfinite > 0  # the NaN reaches the next DyT
    assert summary_row(record)["nonfinite"] == f"6 weights, {record.verdict.nonfinite} DyT inputs"


def test_nonfinite_parameters_skips_buffers():
    m = torch.nn.Linear(3, 2)
    m.register_buffer("mask", torch.full((2,), float("-inf")))  # attention masks hold -inf on purpose
    assert nonfinite_parameters(m) == {}
    with torch.no_grad():
        m.weight[0, 1] = float("nan")
    assert nonfinite_parameters(m) == {"weight": 1}


def test_unbuildable_and_failed_files_become_error_records(run, tmp_path):
    paths, batches = run
    torch.save({"w": torch.zeros(1)}, tmp_path / "plain.pt")
    records = list(checkpoint_records([inspect_checkpoint(tmp_path / "plain.pt")], ModelLoader(LitLM), batches))
    assert records[0].error.startswith("a plain state_dict file needs --factory")


# ------------------------------------------------------------------ the model checked on the meta device
class Recording(LitLM):
    """Records every construction and the device of its first parameter (the evidence of what was built)."""

    built: list[str] = []

    def __init__(self, **kw):
        super().__init__(**kw)
        type(self).built.append(next(self.parameters()).device.type)


def test_hyper_parameters_asking_for_a_huge_model_cost_nothing_before_the_mismatch(run, tmp_path):
    ckpt = torch.load(run[0][0], weights_only=True)
    ckpt["hyper_parameters"] = dict(ckpt["hyper_parameters"], d_model=2048, n_layers=24, n_heads=16)  # 1.2 B parameters
    torch.save(ckpt, tmp_path / "big.ckpt")
    Recording.built = []
    loader = ModelLoader(Recording)
    info = inspect_checkpoint(tmp_path / "big.ckpt")
    problem = loader.mismatch(info)
    assert Recording.built == ["meta"]  # built once, on the meta device only: no memory, no init time
    assert "308 of the model's 342 keys missing from the checkpoint" in problem
    assert "model.tok_emb.weight: checkpoint [256, 32], model [256, 2048]" in problem and len(problem) < 600
    (record,) = checkpoint_records([info], loader, run[1], probe_kwargs=dict(forward_fn=feed_first))
    assert record.error == problem and record.report is None and Recording.built == ["meta"]  # never built for real


def test_a_fitting_checkpoint_is_checked_on_meta_then_built_once(run):
    Recording.built = []
    infos = order_checkpoints([inspect_checkpoint(p) for p in run[0]])
    records = list(
        checkpoint_records(infos, ModelLoader(Recording), run[1], probe_kwargs=dict(forward_fn=feed_first), twin=False)
    )
    assert [r.error for r in records] == [None, None]
    assert Recording.built == ["meta", "cpu"]  # one meta check and one real build for both (same hyper-parameters)


def test_plain_weights_that_do_not_fit_the_factory_are_named_in_one_line(tmp_path, run):
    torch.save({"model": torch.nn.Linear(3, 4).state_dict(), "iter_num": 1}, tmp_path / "w.pt")
    info = inspect_checkpoint(tmp_path / "w.pt")
    loader = ModelLoader(factory=lambda: torch.nn.Sequential(torch.nn.Linear(3, 4)))
    problem = loader.mismatch(info)
    assert problem == (
        "the model built by the --factory model does not fit this checkpoint: 2 of the model's 2 keys "
        "missing from the checkpoint (0.weight, 0.bias); 2 of the checkpoint's 2 keys not in the model "
        "(weight, bias). Is --model/--factory building the architecture that saved it?"
    )


def test_records_are_frozen_and_built_once_per_checkpoint(run, monkeypatch):
    import dataclasses

    from satmon.replaying import loop

    made = []

    class Counting(ReplayRecord):
        def __post_init__(self):
            made.append(self.checkpoint)
            super().__post_init__()

    monkeypatch.setattr(loop, "ReplayRecord", Counting)
    infos = order_checkpoints([inspect_checkpoint(p) for p in run[0]])
    records = list(checkpoint_records(infos, ModelLoader(LitLM), run[1], probe_kwargs=dict(forward_fn=feed_first)))
    assert made == [r.checkpoint for r in records] and len(made) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        records[0].error = "x"
    assert isinstance(records[0].notes, tuple)


def test_the_record_lives_in_results_and_its_0_2_path_keeps_working():
    from satmon._compat import SatmonDeprecationWarning
    from satmon.results.replay_record import ReplayRecord as home

    with pytest.warns(SatmonDeprecationWarning) as caught:  # the 0.4 package path, then the name read from it
        from satmon.replay import ReplayRecord as old
    assert any("satmon.replay.ReplayRecord is deprecated" in str(w.message) for w in caught)
    assert old is home is ReplayRecord


def test_the_replay_loop_imports_no_lightning(run, tmp_path):
    """Plain weights with a factory, replayed through the API in a fresh process: Lightning is never loaded."""
    import subprocess
    import sys

    ckpt = torch.load(run[0][1], weights_only=True)
    torch.save(
        {"model": {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}, "iter_num": 4},
        tmp_path / "w.pt",
    )
    torch.save(run[1], tmp_path / "calib.pt")
    script = (
        "import sys, torch\n"
        "from satmon.replaying.checkpoints import inspect_checkpoint\n"
        "from satmon.replaying.loop import ModelLoader, checkpoint_records, is_lightning_module\n"
        "from satmon.replaying.data import load_data_file, input_forward_fn\n"
        "from satmon.demos.gpt import GPT, GPTConfig\n"
        "build = lambda: GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16))\n"
        f"batches = load_data_file({str(tmp_path / 'calib.pt')!r}, 3)\n"
        f"(r,) = checkpoint_records([inspect_checkpoint({str(tmp_path / 'w.pt')!r})], "
        "ModelLoader(factory=build), batches,\n"
        "              probe_kwargs=dict(forward_fn=input_forward_fn(batches)))\n"
        "assert r.error is None and r.verdict is not None, r.error\n"
        "assert not is_lightning_module(GPT)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_a_lightning_module_is_recognised_by_its_bases():
    from satmon.replaying.loop import is_lightning_module

    assert is_lightning_module(LitLM) and is_lightning_module(Recording) and not is_lightning_module(torch.nn.Linear)
    # an instance is no class
    assert not is_lightning_module(LitLM(arch="gpt", d_model=8, n_layers=1, n_heads=1, seq_len=4))
