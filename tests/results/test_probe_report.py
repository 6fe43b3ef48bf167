"""satmon.results.probe_report: plain to_dict (NaN kept, sanitised only by the JSON writer), the deprecated names,
the sigma_min profile from per-stream spectra, the model norm type, the init-gap."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import satmon.results.probe_report as report_module
from satmon.functional.dead_directions import InitGap, gram_spectrum, sigma_min_profile
from satmon.io.json_records import to_json
from satmon.results.gating import GatedPairing
from satmon.results.probe_report import EMBEDDING, LayerReading, ProbeReport, SigmaMinReading, model_norm_type
from satmon.results.verdict import GatingInfo, LayerCounts, Source, build_verdict


def _ln(name: str, depth_diag: float, **kw) -> LayerReading:
    fields = dict(
        alignment=1.0,
        null_projection=1.0,
        null_dim=1,
        depth=depth_diag,
        depth_diag=depth_diag,
        lambda_min_rel=depth_diag,
        n_degenerate=0,
    )
    fields.update(kw)
    norm_type = "layernorm-like" if depth_diag <= 1e-9 else "rmsnorm-like" if depth_diag >= 1e-3 else "undetermined"
    return LayerReading(name, "layernorm", 8, tokens=100, norm_type=norm_type, **fields)


def _report() -> ProbeReport:
    verdict = build_verdict(
        {"dyt": LayerCounts(60, 100)},
        step=7,
        source=Source.PROBE,
        gating=GatingInfo(True, ("dyt",), "gated"),
        risk={"mlp": {"flat_fraction": math.nan}},
    )
    layers = {"ln": _ln("ln", 1e-14), "dyt": LayerReading("dyt", "dyt", 8, tokens=12, saturation=0.6, alpha=2.0)}
    sigma = SigmaMinReading([EMBEDDING, "b0"], [2.0, math.inf], [None, None], False, "X_0 is numerically singular")
    gating = GatingInfo(
        True,
        ("dyt",),
        "gated",
        pairings={"dyt": GatedPairing("dyt", "mlp", "mlp.g", "mlp.u", "mlp.d", False, "silu", "trace")},
    )
    return ProbeReport(
        layers, sigma, "layernorm-like", saturation=0.6, verdict=verdict, gating=gating, tokens=100, batches=1
    )


def test_to_dict_keeps_plain_values_and_the_json_writer_sanitises_them():
    d = _report().to_dict()
    assert math.isnan(d["gating"]["risk"]["mlp"]["flat_fraction"]) and d["sigma_min"]["values"][1] == math.inf
    pairing = {
        "norm": "dyt",
        "mlp": "mlp",
        "gate": "mlp.g",
        "up": "mlp.u",
        "down": "mlp.d",
        "fused": False,
        "activation": "silu",
        "source": "trace",
        "also_feeds": [],
        "gate_first": True,
        "gate_stats": True,
    }
    # the verdict's risk, once
    assert d["gating"] == {
        "gated": True,
        "pairings": {"dyt": pairing},
        "unpaired_gated_mlps": [],
        "message": "gated",
        "unclassified": {},
        "risk": d["verdict"]["risk"],
    }
    assert d["layers"]["dyt"] == {
        "kind": "dyt",
        "dim": 8,
        "tokens": 12,
        "saturation": 0.6,
        "alpha": 2.0,
        "nonfinite": 0,
    }
    assert d["verdict"]["step"] == 7 and d["verdict"]["decision"] == "no-go"  # gated, 0.6 >= 0.5: collapse risk
    with pytest.raises(ValueError):
        json.dumps(d, allow_nan=False)  # the report does not sanitise: the writer does
    clean = json.loads(json.dumps(to_json(d), allow_nan=False))
    assert clean["gating"]["risk"]["mlp"]["flat_fraction"] is None and clean["sigma_min"]["values"] == [2.0, None]
    assert clean["layers"] == d["layers"]


def test_report_module_imports_no_writer():
    tree = ast.parse(Path(report_module.__file__).read_text())
    top = [n.module for n in tree.body if isinstance(n, ast.ImportFrom)] + [
        a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names
    ]
    assert not [m for m in top if m and m.startswith("satmon.io")]


def test_sigma_min_profile_from_spectra_equals_the_profile_from_the_matrices():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(200, 8, generator=g, dtype=torch.float64)
    x1 = x0 + 0.3 * torch.randn(200, 8, generator=g, dtype=torch.float64)
    x2 = x1 - 0.8 * x1
    names = [EMBEDDING, "b0", "b1"]
    s = SigmaMinReading.from_spectra(names, {n: gram_spectrum(x) for n, x in zip(names, (x0, x1, x2))})
    ref = sigma_min_profile([x0, x1, x2])
    assert s.valid and list(s.values) == ref.values and list(s.ratios) == ref.ratios
    assert s.ratios[2] == pytest.approx(0.2 * s.ratios[1], rel=1e-12)
    assert s.min_ratio == min(ref.ratios[1:]) and s.argmin == "b1"
    missing = SigmaMinReading.from_spectra(names, {EMBEDDING: gram_spectrum(x0)})
    assert not missing.valid and "['b0', 'b1']" in missing.reason
    assert "no residual blocks" in SigmaMinReading.from_spectra([], {}).reason


def test_model_norm_type_majority_rule_and_note():
    layers = {n: _ln(n, 1e-14) for n in ("a", "b")} | {"c": _ln("c", 1e-6)}
    assert model_norm_type(layers) == (
        "layernorm-like",
        "3 LayerNorm/RMSNorm layer(s) read: 2 layernorm-like, 1 undetermined",
    )
    layers["d"] = _ln("d", 0.5)
    assert model_norm_type(layers)[0] == "undetermined"  # one rmsnorm-like layer vetoes the majority
    assert model_norm_type({})[0] == "undetermined"


def test_init_gap_is_attached_per_layer_and_a_missing_twin_layer_is_refused():
    report = _report()
    twin = dataclasses.replace(report, layers={**report.layers, "ln": _ln("ln", 1e-3)})
    trained = report.with_init_gap(twin)
    assert report.init_gap is None and report.layers["ln"].init_gap is None  # a new report: the first is unchanged
    gap = trained.init_gap["ln"]
    assert set(trained.init_gap) == {"ln"} and isinstance(gap, InitGap)
    # log10(1e-3 / 1e-12): the floor, not 1e-14
    assert gap.depth_deepening == gap.lambda_min_deepening == pytest.approx(9.0)
    assert trained.layers["ln"].init_gap is gap
    assert trained.to_dict()["init_gap"] == {
        "ln": {"depth_deepening": gap.depth_deepening, "lambda_min_deepening": gap.depth_deepening}
    }
    no_ln = dataclasses.replace(twin, layers={n: r for n, r in twin.layers.items() if n != "ln"})
    with pytest.raises(ValueError, match="Expected the twin to have a reading for 'ln'"):
        report.with_init_gap(no_ln)
