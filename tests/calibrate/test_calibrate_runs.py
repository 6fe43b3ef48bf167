"""satmon.calibrate.runs: verdict saturations read back from replay JSON and real TensorBoard runs, joined
with an outcomes CSV; every way the join can go wrong says so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from satmon.calibrate.fit import CalibrationError
from satmon.calibrate.runs import join_outcomes, read_outcomes, run_readings


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_outcomes_csv(tmp_path):
    p = write(tmp_path, "o.csv", "run,dyt_val_loss,layernorm_val_loss,group\nr1,2.0,2.5,small\nr2,3.0,2.5,big\n")
    assert read_outcomes(p) == {"r1": (2.0, 2.5, "small"), "r2": (3.0, 2.5, "big")}
    with pytest.raises(
        CalibrationError, match="Expected columns run,dyt_val_loss,layernorm_val_loss,group .* add group"
    ):
        read_outcomes(write(tmp_path, "o2.csv", "run,dyt_val_loss,layernorm_val_loss\nr1,2.0,2.5\n"))
    with pytest.raises(CalibrationError, match="got a blank .*run 'r1'"):
        read_outcomes(write(tmp_path, "o3.csv", "run,dyt_val_loss,layernorm_val_loss,group\nr1,,2.5,a\n"))


def replay_file(tmp_path: Path, name: str, saturations: list[float | None]) -> Path:
    records = [
        {
            "checkpoint": f"step={i}.ckpt",
            "global_step": 10 * i,
            **({"verdict": {"saturation": s}} if s is not None else {}),
        }
        for i, s in enumerate(saturations)
    ]
    return write(tmp_path, name, json.dumps(records))


def test_replay_json_runs_take_the_latest_verdict(tmp_path):
    a = replay_file(tmp_path, "a.json", [0.2, 0.6])
    b = replay_file(tmp_path, "b.json", [None])
    jl = write(
        tmp_path,
        "c.jsonl",
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"global_step": 5, "verdict": {"saturation": 0.7}},
                {"global_step": 2, "verdict": {"saturation": 0.1}},
            ]
        ),
    )
    assert run_readings([a, b, jl]) == {"a": 0.6, "b": None, "c": 0.7}


def test_join_outcomes_matches_names_and_says_what_is_wrong():
    readings = {
        "d32_dyt/version_0": 0.5,
        "d64_dyt/version_0": 0.3,
        "ln/version_0": None,
        "x/version_0": 0.1,
        "x/version_1": 0.2,
    }
    cells = join_outcomes(readings, {"d32_dyt": (2.0, 2.5, "a"), "d64_dyt/version_0": (3.0, 2.0, "b")})
    assert [(c.name, c.readings["saturation"], c.helps, c.delta) for c in cells] == [
        ("d32_dyt", 0.5, True, -0.2),
        ("d64_dyt/version_0", 0.3, False, 0.5),
    ]
    with pytest.raises(CalibrationError, match="got no run for 'nope'; runs found: d32_dyt/version_0"):
        join_outcomes(readings, {"nope": (2.0, 2.5, "a")})
    with pytest.raises(CalibrationError, match="Expected run name 'x' to name one run, got 2"):
        join_outcomes(readings, {"x": (2.0, 2.5, "a")})
    with pytest.raises(CalibrationError, match="Expected a verdict in run 'ln/version_0'"):
        join_outcomes(readings, {"ln": (2.0, 2.5, "a")})


def test_tensorboard_runs_read_the_verdicts_saturation(tmp_path):
    from satmon.io.tags import TAG
    from satmon.io.tensorboard import SummaryWriterSink, log_scalars, log_verdict
    from satmon.results.verdict import build_verdict

    expected = {}
    for name, (sat, tot) in {"small_dyt": (3, 8), "big_dyt": (1, 8)}.items():
        sink = SummaryWriterSink(tmp_path / "tb" / name / "version_0")
        log_scalars(sink, {TAG.saturation: 0.99}, 2)  # a running reading before the verdict: not the verdict's
        verdict = build_verdict({"h.0.dyt": (sat, tot)}, step=4, window=4)
        log_verdict(sink, verdict)
        log_scalars(sink, {TAG.saturation: 0.01}, 9)  # a later reading (post-window): not the verdict's either
        sink.close()
        expected[f"{name}/version_0"] = verdict.saturation
    got = run_readings([tmp_path / "tb"])
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-7)  # TensorBoard stores float32
    assert not math.isnan(got["small_dyt/version_0"])


# --- refusals: what would silently count a run twice, divide by zero or take a stale verdict ---------------
def test_outcomes_refuse_duplicates_and_losses_that_are_not_positive_and_finite(tmp_path):
    head = "run,dyt_val_loss,layernorm_val_loss,group\n"
    with pytest.raises(CalibrationError, match=r"got 'r1' on rows 1 and 3"):
        read_outcomes(write(tmp_path, "dup.csv", head + "r1,2.0,2.5,a\nr2,2.0,2.5,a\nr1,3.0,2.5,b\n"))
    for dyt, ln, match in (
        ("2.0", "0", "layernorm_val_loss > 0"),
        ("0", "2.0", "dyt_val_loss > 0"),
        ("-1", "2", "dyt_val_loss > 0"),
        ("nan", "2", "finite"),
        ("2", "inf", "finite"),
        ("2", "1e999", "finite"),
    ):
        with pytest.raises(CalibrationError, match=match):
            read_outcomes(write(tmp_path, "bad.csv", head + f"r1,{dyt},{ln},a\n"))
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + (head + "r1,2.0,2.5,a\n").encode())
    assert read_outcomes(tmp_path / "bom.csv") == {"r1": (2.0, 2.5, "a")}


def test_join_refuses_a_run_named_twice_and_readings_no_verdict_could_give():
    readings = {"d32/version_0": 0.5, "big/version_0": 1.5, "nan/version_0": math.nan}
    with pytest.raises(CalibrationError, match=r"got run 'd32/version_0' named by both 'd32' and 'd32/version_0'"):
        join_outcomes(readings, {"d32": (2.0, 2.5, "a"), "d32/version_0": (2.0, 2.5, "b")})
    with pytest.raises(CalibrationError, match=r"Expected 'saturation' in \[0, 1\]"):
        join_outcomes(readings, {"big": (2.0, 2.5, "a")})
    with pytest.raises(CalibrationError, match=r"Expected a finite verdict saturation in run 'nan/version_0', got nan"):
        join_outcomes(readings, {"nan": (2.0, 2.5, "a")})
    with pytest.raises(CalibrationError, match=r"layernorm_val_loss > 0"):  # a programmatic caller gets the same check
        join_outcomes(readings, {"d32": (2.0, 0.0, "a")})


def test_the_latest_verdict_is_read_even_when_it_is_non_finite(tmp_path):
    """A run that diverged at its last checkpoint is not read as its earlier checkpoint's saturation."""
    p = write(
        tmp_path,
        "r.json",
        json.dumps(
            [
                {"global_step": 500, "verdict": {"saturation": None, "decision": "non-finite"}},
                {"global_step": 250, "verdict": {"saturation": 0.6}},
            ]
        ),
    )
    assert math.isnan(run_readings([p])["r"])


def test_one_run_reached_twice_is_refused(tmp_path):
    a = replay_file(tmp_path, "a.json", [0.5])
    (tmp_path / "sub").mkdir()
    other = replay_file(tmp_path / "sub", "a.json", [0.4])
    with pytest.raises(CalibrationError, match="Expected each run once, got .*a.json' twice"):
        run_readings([a, tmp_path / "." / "a.json"])
    with pytest.raises(CalibrationError, match=r"Expected distinct run names, got 'a' for both"):
        run_readings([a, other])
    with pytest.raises(CalibrationError, match="no such path: ''"):
        run_readings([""])
