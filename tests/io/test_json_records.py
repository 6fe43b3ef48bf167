"""satmon.io.json_records: the one JSON sanitiser and the records file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from satmon.io.json_records import to_json, write_records
from satmon.results.stop import StopReason, StopRecord
from satmon.results.verdict import GatingInfo, Source, build_verdict


def _plain(obj) -> bool:
    """Only JSON's own Python types, all the way down (no subclass: a str enum or numpy float fails)."""
    if type(obj) in (dict,):
        return all(type(k) is str and _plain(v) for k, v in obj.items())
    if type(obj) is list:
        return all(_plain(v) for v in obj)
    return obj is None or type(obj) in (bool, int, float, str)


def test_non_finite_floats_become_none_at_any_depth():
    nan, inf = float("nan"), float("inf")
    got = to_json({"a": nan, "b": [1.5, -inf, (inf, 2)], "c": {"d": np.float64(nan), "e": np.float32(0.5)}})
    assert got == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": None, "e": 0.5}}
    assert _plain(got)


def test_numpy_and_tensor_values_become_python():
    got = to_json(
        {
            "i": np.int64(3),
            "f": np.float64(0.25),
            "b": np.bool_(True),
            "t": torch.tensor(2.5),
            "v": torch.tensor([1.0, float("nan")]),
            "a": np.array([[1, 2]]),
        }
    )
    assert got == {"i": 3, "f": 0.25, "b": True, "t": 2.5, "v": [1.0, None], "a": [[1, 2]]}
    assert _plain(got) and type(got["f"]) is float and type(got["i"]) is int and type(got["b"]) is bool


def test_enums_dataclasses_and_results():
    assert to_json({"reason": StopReason.LOSS_SPIKE, "source": Source.REPLAY}) == {
        "reason": "loss-spike",
        "source": "replay",
    }
    assert to_json(GatingInfo(True, ("ln_f",), "gated")) == {
        "gated": True,
        "gated_layers": ["ln_f"],
        "message": "gated",
        "pairings": {},
        "unpaired_gated_mlps": [],
        "unclassified": {},
    }
    record = StopRecord(StopReason.NONFINITE, "NaN", 7)
    assert to_json(record) == {**record.to_dict(), "reason": "nonfinite"}  # its own to_dict, then sanitised
    verdict = build_verdict({"ln_f": (1, 2, 1)}, step=3, window=3, notes=("a note",))
    got = to_json(verdict)
    assert got["decision"] == "non-finite" and got["notes"] == ["a note"] and _plain(got)
    assert json.loads(json.dumps(got, allow_nan=False)) == got


def test_other_objects_become_their_str():
    assert to_json({Path("k"): Path("x.ckpt"), 1: object.__new__(type("Odd", (), {"__str__": lambda s: "odd"}))}) == {
        "k": "x.ckpt",
        "1": "odd",
    }


@pytest.mark.parametrize("name", ["records.jsonl", "records.json"])
def test_write_records_round_trip(tmp_path, name):
    records = [
        {"checkpoint": Path("a.ckpt"), "saturation": 0.5, "sigma": math.nan},
        {"checkpoint": Path("b.ckpt"), "saturation": np.float32(0.25), "sigma": 1.0},
    ]
    path = write_records(tmp_path / "out" / name, records)
    text = path.read_text()
    rows = [json.loads(line) for line in text.splitlines()] if name.endswith(".jsonl") else json.loads(text)
    assert rows == [
        {"checkpoint": "a.ckpt", "saturation": 0.5, "sigma": None},
        {"checkpoint": "b.ckpt", "saturation": 0.25, "sigma": 1.0},
    ]
    assert "NaN" not in text and sorted(p.name for p in path.parent.iterdir()) == [name]  # no .tmp left behind
    write_records(path, records[:1])  # rewritten whole, not appended
    assert len(json.loads(path.read_text()) if name.endswith(".json") else path.read_text().splitlines()) == 1
