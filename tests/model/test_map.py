"""The model map: read once per model, cached, rebuilt when its modules change (a registration flags it in
O(1); a deletion is caught at the next lookup), the one reading every caller uses (probe, replay, convert)."""

from __future__ import annotations

import gc
import weakref

import torch
from lookalikes import D, Derf, PreNormBlock, Stack
from torch import nn

from satmon import DyT, probe
from satmon.model import map as model_map_module
from satmon.model.map import model_map
from satmon.replaying.checkpoints import inspect_checkpoint
from satmon.replaying.loop import ModelLoader, checkpoint_records


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Stack(lambda: PreNormBlock(nn.LayerNorm), norm=nn.LayerNorm)


class _Builds:
    """Counts the maps built, per model object."""

    def __init__(self, monkeypatch) -> None:
        self.per_model: dict[int, int] = {}
        init = model_map_module.ModelMap.__init__

        def counting(map_self, model):
            self.per_model[id(model)] = self.per_model.get(id(model), 0) + 1
            init(map_self, model)

        monkeypatch.setattr(model_map_module.ModelMap, "__init__", counting)


def test_the_map_is_built_once_and_reused(monkeypatch):
    builds = _Builds(monkeypatch)
    model = _model()
    m = model_map(model)
    assert model_map(model) is m and builds.per_model == {id(model): 1}
    assert [l.name for l in m.norms] == [
        "blocks.0.norm_1",
        "blocks.0.norm_2",
        "blocks.1.norm_1",
        "blocks.1.norm_2",
        "norm",
    ]
    assert [b for b, _ in m.blocks] == ["blocks.0", "blocks.1"]
    assert [l.block for l in m.norms] == ["blocks.0", "blocks.0", "blocks.1", "blocks.1", None]
    probe(model, torch.randn(2, 8, D))  # targets, blocks, widths and gating all read the same map
    assert builds.per_model == {id(model): 1}


def test_a_registration_flags_the_map_at_once_and_the_next_lookup_rebuilds_it():
    model = _model()
    m = model_map(model)
    assert not m.changed()
    old = model.blocks[1].norm_2
    model.blocks[1].norm_2 = DyT(D)  # replaced
    model.blocks.append(PreNormBlock(lambda d: Derf(d)))  # added
    assert m.changed() and m.changes == ("blocks.1.norm_2", "blocks.2")
    new = model_map(model)
    assert new is not m and not new.changed()
    change = new.compare(m)
    assert change.added == ("blocks.1.norm_2", "blocks.2.norm_1", "blocks.2.norm_2") and change.removed == ()
    assert [(l.name, l.function) for l in new.layers(("dyt",))] == [
        ("blocks.1.norm_2", "tanh"),
        ("blocks.2.norm_1", "erf"),
        ("blocks.2.norm_2", "erf"),
    ]
    assert old not in [l.module for l in new.norms]


def test_a_deletion_the_hook_cannot_see_is_caught_at_the_next_lookup():
    model = Stack(lambda: PreNormBlock(lambda d: DyT(d)), n=3)
    m = model_map(model)
    del model.blocks[1]  # ModuleList.__delitem__: no registration
    assert not m.changed()  # nothing a training step would pay for
    new = model_map(model)  # the lookup compares the module tree
    assert new is not m and new.compare(m).removed == ("blocks.2.norm_1", "blocks.2.norm_2")
    # renumbered: other modules under those names
    assert new.compare(m).replaced == (
        "blocks.1.norm_1",
        "blocks.1.norm_2",
    )


class _BufferedDerf(Derf):
    """A Derf whose forward reads a buffer: meta holds no value of it, so a copy of it cannot run there."""

    def __init__(self, d: int) -> None:
        super().__init__(d)
        self.register_buffer("unit", torch.ones(()))

    def forward(self, x):
        return super().forward(x) * self.unit


def test_a_module_that_cannot_run_yet_is_read_again_once_it_can():
    (plain,) = model_map(nn.Sequential(nn.Linear(D, D), Derf(D)).to("meta")).norms  # its parameters' values are drawn:
    assert (plain.kind, plain.function, plain.shift, plain.basis) == ("dyt", "erf", "s", "behaviour")  # read on meta
    model = nn.Sequential(nn.Linear(D, D), _BufferedDerf(D)).to("meta")
    m = model_map(model)
    (layer,) = m.norms
    assert (layer.kind, layer.basis, layer.shift) == ("dyt", "names", None)  # alpha + Derf in its name; shift unknown
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    (again,) = model_map(model).norms
    assert (again.kind, again.function, again.shift, again.basis) == ("dyt", "erf", "s", "behaviour")


def test_replay_builds_one_map_per_model(monkeypatch, tmp_path):
    builds = _Builds(monkeypatch)
    paths = []
    for step in (2, 4):
        f = tmp_path / f"w{step}.pt"
        torch.save({"model": _model().state_dict(), "iter_num": step}, f)
        paths.append(f)
    records = list(
        checkpoint_records([inspect_checkpoint(p) for p in paths], ModelLoader(factory=_model), [torch.randn(2, 8, D)])
    )
    assert all(r.error is None and r.report is not None for r in records)
    # one model and one twin for both checkpoints (one architecture: replay loads each checkpoint's weights
    # into the same model), one map each: loading weights changes no structure
    assert sorted(builds.per_model.values()) == [1, 1]


def test_the_cache_never_keeps_a_model_alive():
    model = _model()
    m = model_map(model, example_input=torch.randn(1, 4, D))
    assert m.modules[""] is model and m.module("blocks.0") is model.blocks[0] and m.module("nope") is None
    ref = weakref.ref(model)
    del model, m
    gc.collect()
    assert ref() is None  # a model replay dropped (another architecture) must go
