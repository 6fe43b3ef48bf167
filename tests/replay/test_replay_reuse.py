"""Replay throughput: one model per architecture, the next checkpoint's weights loaded into it; one twin per
architecture; one gating trace per architecture; no garbage collection per checkpoint. Every reading
must equal what a model built afresh for each checkpoint reads."""

from __future__ import annotations

import gc
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
from satmon.replaying.checkpoints import inspect_checkpoint, order_checkpoints
from satmon.replaying.loop import ModelLoader, checkpoint_records

DM_ARGS = {"seq_len": 16, "batch_size": 4, "train_tokens": 20_000, "val_tokens": 2_000, "seed": 0}


def _run(root, **lit):
    pl.seed_everything(0, verbose=False)
    ckpt = ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        pl.Trainer(
            max_steps=3,
            accelerator="cpu",
            devices=1,
            logger=False,
            callbacks=[ckpt],
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        ).fit(tiny_lit(lr=3e-2, **lit), CorpusDataModule(**DM_ARGS))
    return order_checkpoints([inspect_checkpoint(p) for p in sorted(root.glob("*.ckpt"))])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three checkpoints of a DyT GPT, three of a LayerNorm GPT (twin readings), three of a DyT
    LLaMA (gated), and batches."""
    dm = CorpusDataModule(**DM_ARGS)
    dm.setup("fit")
    batches = [b for _, b in zip(range(2), dm.train_dataloader())]
    return {
        "dyt": tmp_path_factory.mktemp("dyt"),
        "layernorm": tmp_path_factory.mktemp("ln"),
        "llama": tmp_path_factory.mktemp("llama"),
    }, batches


def _infos(runs, name):
    roots, _ = runs
    # the LLaMA with DyT before the head too (LlamaLM's default final norm is RMSNorm, which would need a twin)
    kw = {"dyt": {}, "layernorm": {"norm": "layernorm"}, "llama": {"arch": "llama", "final_norm": "dyt"}}[name]
    return (
        _run(roots[name], **kw)
        if not list(roots[name].glob("*.ckpt"))
        else order_checkpoints([inspect_checkpoint(p) for p in sorted(roots[name].glob("*.ckpt"))])
    )


class Counting(LitLM):
    built = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        type(self).built += 1


def _readings(record):
    d = record.report.to_dict()
    d.pop("elapsed_s", None)
    return d


@pytest.mark.parametrize("name", ["dyt", "layernorm", "llama"])
def test_one_model_per_architecture_reads_what_fresh_models_read(runs, name, monkeypatch):
    batches = runs[1]
    infos = _infos(runs, name)
    Counting.built = 0
    collected = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or real_collect(*a))
    got = list(checkpoint_records(infos, ModelLoader(Counting), batches, probe_kwargs={"forward_fn": feed_first}))
    assert [r.error for r in got] == [None] * 3
    twins = 1 if name == "layernorm" else 0
    # the meta check, one real model, and (LayerNorm) one twin, for 3 checkpoints
    assert Counting.built == 1 + 1 + twins
    assert collected == []  # no garbage collection per checkpoint
    infos = _infos(runs, name)
    for info, record in zip(infos, got):  # each checkpoint in a model of its own, as load_from_checkpoint builds it
        fresh = LitLM.load_from_checkpoint(info.path, map_location="cpu").eval()
        twin = None
        if twins:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                twin = LitLM(**fresh.hparams).eval()
        want = probe(fresh, batches, forward_fn=feed_first, twin=twin, step=record.global_step, source="replay")
        d = want.to_dict()
        d.pop("elapsed_s", None)
        assert _readings(record) == d


def test_the_gating_trace_runs_once_per_architecture(runs, monkeypatch):
    from satmon.probing import passes

    calls = []
    real = passes.detect_gating
    monkeypatch.setattr(passes, "detect_gating", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = list(
        checkpoint_records(_infos(runs, "llama"), ModelLoader(LitLM), runs[1], probe_kwargs={"forward_fn": feed_first})
    )
    assert [r.error for r in got] == [None] * 3 and len(calls) == 1
    assert all(r.report.gating == got[0].report.gating for r in got) and got[0].report.gating.gated is True


class Hooked(LitLM):
    built = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        type(self).built += 1

    def on_load_checkpoint(self, checkpoint):  # may change the model per checkpoint: never reused
        self.loaded_step = checkpoint["global_step"]


class Loose(Counting):
    strict_loading = False  # a partial load would keep the previous checkpoint's weights: never reused


# Hooked: the hook may rename keys, so the meta check too runs per checkpoint (3 meta + 3 real)
@pytest.mark.parametrize("cls, builds", [(Hooked, 3 + 3), (Loose, 1 + 3)])
def test_a_module_that_may_change_per_checkpoint_is_built_for_each(runs, cls, builds):
    cls.built = 0
    got = list(
        checkpoint_records(_infos(runs, "dyt"), ModelLoader(cls), runs[1], probe_kwargs={"forward_fn": feed_first})
    )
    assert [r.error for r in got] == [None] * 3 and cls.built == builds


def test_a_checkpoint_that_fails_to_load_is_not_followed_by_a_half_loaded_model(runs, tmp_path):
    infos = _infos(runs, "dyt")
    bad = torch.load(infos[1].path, weights_only=True)
    bad["state_dict"]["model.ln_f.alpha"] = torch.tensor([float("nan")] * 1)  # loads, and reads non-finite
    bad["state_dict"].pop("model.blocks.0.ln_1.weight")  # a missing key: load_state_dict raises midway
    torch.save(bad, tmp_path / "bad.ckpt")
    order = [infos[0], inspect_checkpoint(tmp_path / "bad.ckpt"), infos[2]]
    got = list(checkpoint_records(order, ModelLoader(LitLM), runs[1], probe_kwargs={"forward_fn": feed_first}))
    assert got[0].error is None and got[1].error is not None and got[2].error is None
    fresh = LitLM.load_from_checkpoint(infos[2].path, map_location="cpu").eval()
    want = probe(fresh, runs[1], forward_fn=feed_first, step=got[2].global_step, source="replay").to_dict()
    want.pop("elapsed_s", None)
    assert _readings(got[2]) == want


def test_another_architecture_gets_a_model_of_its_own(runs):
    order = [_infos(runs, "dyt")[0], _infos(runs, "llama")[0], _infos(runs, "dyt")[1]]
    Counting.built = 0
    got = list(checkpoint_records(order, ModelLoader(Counting), runs[1], probe_kwargs={"forward_fn": feed_first}))
    assert [r.error for r in got] == [None] * 3
    assert Counting.built == 2 + 3  # two meta checks; gpt, llama, gpt again built for real
    assert got[1].report.gating.gated is True and got[0].report.gating.gated is False


def _record(r):
    d = r.to_dict()
    d.pop("seconds", None)  # wall times
    d.pop("elapsed_s", None)
    return d


def _alone(infos, loader_of, batches, **kw):
    """Each checkpoint replayed by itself, with a loader of its own (nothing kept from another checkpoint)."""
    return [next(iter(checkpoint_records([info], loader_of(), batches, **kw))) for info in infos]


def test_a_reused_replay_equals_each_checkpoint_replayed_alone_across_a_shape_change(runs, tmp_path):
    """A LitLM run, a wider one (other hyper-parameters, other shapes) in the middle, a LLaMA one, then the first
    run again: the kept model is never fed a checkpoint of another shape, and every record equals the lone replay's."""
    wide_root = tmp_path / "wide"
    wide = _run(wide_root, d_model=48)
    dyt, llama = _infos(runs, "dyt"), _infos(runs, "llama")
    order = [dyt[0], dyt[1], wide[0], llama[0], dyt[2], wide[1]]
    Counting.built = 0
    got = [
        _record(r)
        for r in checkpoint_records(order, ModelLoader(Counting), runs[1], probe_kwargs={"forward_fn": feed_first})
    ]
    reused_builds = Counting.built
    again = [inspect_checkpoint(r["checkpoint"]) for r in got]
    want = [
        _record(r)
        for r in _alone(again, lambda: ModelLoader(Counting), runs[1], probe_kwargs={"forward_fn": feed_first})
    ]
    assert [r.get("error") for r in got] == [None] * 6
    assert got == want
    # the wide checkpoint was read with a d=48 model: its readings are not the d=32 ones
    assert got[2]["layers"].keys() == got[0]["layers"].keys() and got[2] != got[0]
    assert reused_builds == 3 + 5  # three meta models (gpt, wide, llama); real builds at each architecture change


def _net(width: int = 8) -> torch.nn.Module:
    from satmon.dyt import DyT

    return torch.nn.Sequential(torch.nn.Linear(6, width), DyT(width), torch.nn.Linear(width, 6), torch.nn.LayerNorm(6))


def test_plain_weights_reused_equal_alone_and_a_misfit_in_the_middle_is_not_read(tmp_path):
    """Plain state_dict files (--factory): a checkpoint of another width in the middle is refused before any weight
    is read, the kept model (and twin) serve the rest, and every record equals the lone replay's."""
    paths = []
    for i, width in enumerate([8, 8, 12, 8, 8]):
        torch.manual_seed(100 + i)
        net = _net(width)
        with torch.no_grad():
            net[1].alpha.fill_(0.5 + i)  # saturation differs per checkpoint
        paths.append(tmp_path / f"w{i}.pt")
        torch.save({"model": net.state_dict(), "iter_num": i}, paths[-1])
    batches = [torch.randn(16, 6, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    built = []

    def factory():
        built.append(1)
        return _net()

    infos = order_checkpoints([inspect_checkpoint(p) for p in paths])
    got = [_record(r) for r in checkpoint_records(infos, ModelLoader(factory=factory), batches)]
    n_reused = len(built)
    want = [
        _record(r)
        for r in _alone(
            order_checkpoints([inspect_checkpoint(p) for p in paths]), lambda: ModelLoader(factory=factory), batches
        )
    ]
    assert [r.get("error") is None for r in got] == [True, True, False, True, True]
    assert "shape" in got[2]["error"] and got == want
    assert n_reused == 3  # the meta check, one model and one twin for four checkpoints
    assert len({r["verdict"]["saturation"] for r in got if r.get("error") is None}) == 4


def test_a_probe_that_fails_drops_the_kept_model(runs, monkeypatch):
    from satmon.probing import passes

    real, calls = passes.probe, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a forward that fails once")
        return real(*a, **k)

    monkeypatch.setattr(passes, "probe", flaky)
    Counting.built = 0
    got = list(
        checkpoint_records(_infos(runs, "dyt"), ModelLoader(Counting), runs[1], probe_kwargs={"forward_fn": feed_first})
    )
    assert [r.error is None for r in got] == [True, False, True]
    assert Counting.built == 1 + 2  # the meta check; the model after the failure is built afresh
