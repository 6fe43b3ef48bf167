"""satmon.probing.memory_plan: byte sizes, grouping against a budget, refusals, the plan line."""

from __future__ import annotations

import pytest

from satmon.probing.memory_plan import READOUT_MATRICES, format_bytes, matrix_bytes, parse_bytes, plan_memory

MIB = 2**20


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GiB", 2 * 2**30),
        ("2 gib", 2 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5KiB", 1536),
        ("100", 100),
        (4096, 4096),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "2 GiBs", "-1GiB", "0", 0, -5, True, 1.5, None])
def test_parse_bytes_refuses_with_the_expected_form(bad):
    with pytest.raises(ValueError, match="Expected `memory_budget` as a positive number of bytes"):
        parse_bytes(bad)


def test_matrix_bytes_is_the_float64_state_of_one_accumulator():
    assert matrix_bytes(8192) == 8 * 8192**2 + 8 * 8192 + 16  # X^T X, the row sum, two int64 counts
    assert matrix_bytes(8192) // MIB == 512 and matrix_bytes(None) == 0


def test_groups_fit_the_budget_in_order_and_the_peak_adds_one_readout():
    d = 1024
    m, readout = matrix_bytes(d), READOUT_MATRICES * 8 * d * d
    dims = [(f"l{i}", d) for i in range(7)]
    plan = plan_memory(dims, budget=3 * m + readout)
    assert plan.groups == (("l0", "l1", "l2"), ("l3", "l4", "l5"), ("l6",))
    assert plan.passes == 3 and plan.matrices == 7 and plan.peak_bytes == 3 * m + readout
    assert plan_memory(dims, budget=3 * m + readout - 1).groups[0] == ("l0", "l1")
    whole = plan_memory(dims)
    assert whole.groups == (tuple(n for n, _ in dims),) and whole.passes == 1 and whole.peak_bytes == 7 * m + readout


def test_mixed_widths_reserve_the_widest_readout_of_each_group():
    plan = plan_memory([("wide", 2048), ("narrow", 64)], budget=matrix_bytes(2048) + READOUT_MATRICES * 8 * 2048**2)
    assert plan.groups == (("wide",), ("narrow",))
    assert plan.peak_bytes == matrix_bytes(2048) + READOUT_MATRICES * 8 * 2048**2


def test_a_budget_below_one_matrix_and_its_readout_is_refused_naming_the_layer():
    with pytest.raises(
        ValueError,
        match=r"'ln_f' \(d=8192\) needs 3.50 GiB \(512 MiB for the matrix, 3.00 GiB for its eigendecomposition\)",
    ):
        plan_memory([("a", 64), ("ln_f", 8192)], budget="3GiB")
    with pytest.raises(ValueError, match="got none for \\['s'\\]"):
        plan_memory([("s", None)], budget="1GiB")


def test_no_taps_is_one_pass_and_unknown_widths_are_named_in_the_line():
    assert plan_memory([]).passes == 1 and plan_memory([]).peak_bytes == 0
    line = plan_memory([("a", 64), ("s", None)]).describe()
    assert "2 covariance matrices (d=64: 32.5 KiB each; 1 of unknown width, not counted) in 1 pass(es)" in line
    assert "no budget" in line


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 1536, 20 * MIB, 512 * MIB, 3.5 * 2**30)] == [
        "512 B",
        "1.50 KiB",
        "20.0 MiB",
        "512 MiB",
        "3.50 GiB",
    ]
