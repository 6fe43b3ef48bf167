"""The grid records the trap watch's every check beside the collapse watch's (issue 49 scores both on its cells)."""

from __future__ import annotations

import json

from satmon.grid.builtin_llama import RECIPE as LLAMA
from satmon.grid.cell import make_spec, measure_cell
from satmon.grid.config import Budget, GridSettings

SMOKE = LLAMA.presets["smoke"]


def _cell(final_norm: str) -> dict:
    st = GridSettings(
        **{**SMOKE["settings"], "steps": 40, "window": 20, "warmup": 5, "eval_every": 20, "series_every": 10}
    )
    spec = make_spec(
        LLAMA, st, LLAMA.options_with({**SMOKE["options"], "final_norm": final_norm}), "d16L1", Budget.parse("2000"), 0
    )
    return measure_cell(LLAMA, st, spec, arms=("rmsnorm", "dyt"))


def test_trap_checks_recorded_with_the_first_named_step():
    cell = _cell("dyt")
    trap = cell["arms"]["dyt"]["watch"]["trap"]
    assert (trap["every_n_steps"], trap["patience"], trap["floor"]) == (10, 3, 0.0)  # the shipped defaults
    steps = [c["step"] for c in trap["checks"]]
    assert steps == [1, 11, 21, 31]  # from the first step, one in 10
    assert all(c["final"] == "norm_f" and c["final_kind"] == "dyt" for c in trap["checks"])
    named = [c["step"] for c in trap["checks"] if c["trapped"]]
    assert trap["first_trapped_step"] == (named[0] if named else None)
    for c in trap["checks"]:  # the streak the record carries is the watch's own: consecutive checks with evidence
        assert c["trapped"] == (c["streak"] >= 3)
    json.dumps(cell, allow_nan=False)


def test_an_rmsnorm_final_norm_is_never_evidence_of_the_trap():
    trap = _cell("rmsnorm")["arms"]["dyt"]["watch"]["trap"]
    assert trap["checks"] and all(c["final_kind"] == "rmsnorm" and not c["found"] for c in trap["checks"])
    assert trap["first_trapped_step"] is None
