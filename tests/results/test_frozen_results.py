"""Results are frozen down to their fields: no field can be set, no mapping or sequence changed in place;
variants come from ``dataclasses.replace`` (and are frozen too); each still round-trips through
``to_dict``/``from_dict``, JSON and pickle (checkpoints), and ``to_dict`` gives plain dicts and lists."""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import pickle

import pytest
import torch

from satmon.results.frozen import FrozenMap, freeze, thaw
from satmon.results.gating import GatedPairing
from satmon.results.plan import MemoryPlan
from satmon.results.probe_report import LayerReading, ProbeReport, SigmaMinReading
from satmon.results.stop import StopReason, StopRecord
from satmon.results.verdict import GatingInfo, Verdict, build_verdict


def _plain(value) -> bool:
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


def _pairing(**kw) -> GatedPairing:
    return GatedPairing(
        **{
            "norm": "ln_2",
            "mlp": "mlp",
            "gate": "mlp.w1",
            "up": "mlp.w3",
            "down": "mlp.w2",
            "fused": False,
            "activation": "silu",
            "source": "trace",
            **kw,
        }
    )


def _verdict() -> Verdict:
    gating = GatingInfo(
        True,
        ("ln_2",),
        "ln_2 feeds a SwiGLU MLP",
        pairings={"ln_2": _pairing(also_feeds=("mlp2",))},
        unpaired_gated_mlps=("mlp3",),
    )
    return build_verdict(
        {"ln_1": (1, 10), "ln_2": (6, 10)},
        step=8,
        window=8,
        gating=gating,
        risk={"mlp": {"dyt_saturation": 0.6, "flat_fraction": math.nan}},
        notes=["a note"],
        loss={"first": 3.0, "last": 2.0, "change": -1 / 3, "late_change": -0.1, "stalled": False},
        offset={"ln_2": {"saturated": 0.6, "centered": 0.1, "offset_ratio": 5.0}},
    )


def test_frozen_map_reads_like_a_dict_and_cannot_change():
    m = FrozenMap({"a": 1, "b": 2})
    assert m == {"a": 1, "b": 2} and {"a": 1, "b": 2} == m and list(m) == ["a", "b"] and m.get("c") is None
    assert m != {"a": 1} and hash(m) == hash(FrozenMap({"a": 1, "b": 2}))
    with pytest.raises(TypeError):
        m["a"] = 3  # type: ignore[index]
    for change in (
        lambda: m.update({"c": 3}),
        lambda: m.pop("a"),
        lambda: m.setdefault("c", 3),
        m.clear,
        m.popitem,
        lambda: operator.delitem(m, "a"),
        lambda: operator.ior(m, {"c": 3}),
    ):
        with pytest.raises(TypeError, match="satmon results are frozen: use dataclasses.replace"):
            change()
    with pytest.raises(AttributeError):
        m.extra = 1  # type: ignore[attr-defined]
    assert m == {"a": 1, "b": 2} and isinstance(m, dict) and json.loads(json.dumps(m)) == m  # still reads as the dict
    assert pickle.loads(pickle.dumps(m)) == m and type(pickle.loads(pickle.dumps(m))) is FrozenMap
    nested = freeze({"x": [1, {"y": [2]}]})
    assert nested == {"x": (1, {"y": (2,)})} and thaw(nested) == {"x": [1, {"y": [2]}]}


def test_a_verdict_holds_tuples_and_read_only_mappings():
    v = _verdict()
    assert (
        isinstance(v.per_layer, FrozenMap)
        and isinstance(v.risk["mlp"], FrozenMap)
        and isinstance(v.gated_layers, tuple)
    )
    for mapping, key in (
        (v.per_layer, "ln_1"),
        (v.risk["mlp"], "x"),
        (v.loss, "stalled"),
        (v.offset["ln_2"], "centered"),
    ):
        with pytest.raises(TypeError):
            operator.setitem(mapping, key, 1.0)
    with pytest.raises(AttributeError):
        v.gated_layers.append("ln_1")  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.decision = "go"  # type: ignore[misc]
    hash(v)  # a frozen value: usable as a key


def test_a_replaced_verdict_is_frozen_too():
    v = dataclasses.replace(_verdict(), per_layer={"ln_1": 0.5}, notes=["x"], gated_layers=["ln_1"])
    assert isinstance(v.per_layer, FrozenMap) and v.notes == ("x",) and v.gated_layers == ("ln_1",)


def test_verdict_round_trips_through_dict_json_pickle_and_a_weights_only_checkpoint(tmp_path):
    v = _verdict()
    d = v.to_dict()
    assert _plain(d) and d["gated_layers"] == ["ln_2"] and d["notes"] == ["a note"] and type(d["risk"]["mlp"]) is dict
    assert Verdict.from_dict(d).to_dict() == d
    same = Verdict.from_dict(json.loads(json.dumps(d)))  # NaN survives Python's JSON
    assert (
        same.per_layer == v.per_layer
        and same.gated_layers == v.gated_layers
        and math.isnan(same.risk["mlp"]["flat_fraction"])
    )
    back = pickle.loads(pickle.dumps(v))
    assert back.per_layer == v.per_layer and back.to_dict().keys() == d.keys()
    torch.save({"verdict": d}, tmp_path / "ckpt.pt")
    assert Verdict.from_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True)["verdict"]).per_layer == v.per_layer


def test_gating_info_is_one_frozen_value():
    g = _verdict()
    info = GatingInfo(True, ["ln_2"], "m", pairings={"ln_2": _pairing(also_feeds=("a",))})
    assert info.gated_layers == ("ln_2",) and info.pairings["ln_2"].also_feeds == ("a",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.pairings["ln_2"].mlp = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        info.pairings["ln_2"] = _pairing()  # type: ignore[index]
    assert info.to_dict() == {
        "gated": True,
        "gated_layers": ["ln_2"],
        "message": "m",
        "pairings": {"ln_2": {**dataclasses.asdict(_pairing()), "also_feeds": ["a"]}},
        "unpaired_gated_mlps": [],
        "unclassified": {},
    }
    assert GatingInfo.from_dict(info.to_dict()) == info and hash(info) == hash(GatingInfo.from_dict(info.to_dict()))
    assert g.gated and g.gated_layers == ("ln_2",)


def test_probe_report_and_its_readings_are_frozen():
    reading = LayerReading("ln_f", "dyt", 8, tokens=4, saturation=0.5, alpha=2.0)
    plan = MemoryPlan((("a",),), {"a": 8}, None, 0)
    report = ProbeReport(
        {"ln_f": reading},
        SigmaMinReading(["embedding"], [1.0], [None]),
        "dyt",
        saturation=0.5,
        skipped={"b": "too wide"},
        plan=plan,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.saturation = 0.1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.elapsed_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        report.layers["other"] = reading  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.dims["a"] = 16  # type: ignore[index]
    assert report.sigma_min.blocks == ("embedding",) and report.skipped == {"b": "too wide"}
    assert report.to_dict()["sigma_min"]["blocks"] == ["embedding"] and report.to_dict()["gating"] == {}
    later = dataclasses.replace(report, elapsed_s=2.5)
    assert later.elapsed_s == 2.5 and report.elapsed_s == 0.0 and isinstance(later.layers, FrozenMap)
    assert pickle.loads(pickle.dumps(report)).to_dict() == report.to_dict()
    with pytest.raises(
        TypeError, match="Expected `gating` to be a satmon.results.verdict.GatingInfo or None, got a dict"
    ):
        ProbeReport({}, SigmaMinReading(), "dyt", gating={"gated": False})


def test_a_stop_record_is_frozen_and_round_trips():
    r = StopRecord(StopReason.LOSS_SPIKE, "spike", 70, dry_run=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.step = 71  # type: ignore[misc]
    assert StopRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r and pickle.loads(pickle.dumps(r)) == r
    assert r.to_dict() == {"reason": "loss-spike", "message": "spike", "step": 70, "dry_run": True}
