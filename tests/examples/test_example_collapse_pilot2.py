"""examples/collapse_pilot2.py (the collapse grid's second pilot): its file says it is a pilot with its seed,
settings, commit and environment, records each arm as it finishes, and a rerun resumes without re-running an arm."""

from __future__ import annotations

import json

from conftest import run_script

ARGS = (
    "--sizes",
    "d16L1",
    "--lrs",
    "1e-2",
    "--alphas",
    "8",
    "--final-norms",
    "rmsnorm",
    "--steps",
    "12",
    "--window",
    "4",
    "--warmup",
    "3",
    "--eval-every",
    "4",
    "--tiny",
)


def test_pilot_file_labelled_and_resumable(tmp_path):
    out = tmp_path / "pilot.json"
    run_script("collapse_pilot2.py", *ARGS, "--out", str(out), cwd=tmp_path)
    first = json.loads(out.read_text())
    p = first["pilot"]
    assert p["scored"] is False and p["seed"] == 31 and p["settings"]["steps"] == 12
    assert len(p["runs"]) == 1 and p["runs"][0]["commit"] and p["runs"][0]["environment"]["torch"]
    keys = [
        "d16L1|lr0.01|rmsnorm|final_-|alpha_-",
        "d16L1|lr0.01|dyt|final_rmsnorm|alpha_8",
        "d16L1|lr0.01|dyt-gelu|final_rmsnorm|alpha_8",
    ]
    assert list(first["arms"]) == keys
    for k in keys:
        a = first["arms"][k]
        assert a["run"] == 0 and [s for s, _ in a["val_curve"]] == [4, 8, 12] and [r[0] for r in a["reach"]] == [10]
    assert "watch" in first["arms"][keys[1]] and "watch" not in first["arms"][keys[0]]
    run_script("collapse_pilot2.py", *ARGS, "--out", str(out), cwd=tmp_path)  # resumes: nothing left to run
    second = json.loads(out.read_text())
    assert second == first  # no arm re-run, the file untouched
