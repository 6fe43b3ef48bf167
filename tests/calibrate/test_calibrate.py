"""satmon.calibrate.fit: cells in (CSV, JSON, the study's), the fit, calibration.json out and back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from satmon.calibrate.fit import (
    Calibration,
    CalibrationError,
    calibrate,
    load_calibration,
    read_cells,
    study_cells,
    write_calibration,
)

# SCIENCE.md section 2, typed in independently of the shipped CSV: (scale, tokens, saturation, delta %)
STUDY = [
    ("64M", "1M", 0.4931, -27.3),
    ("64M", "10M", 0.4135, 5.9),
    ("64M", "50M", 0.2368, 19.7),
    ("64M", "118M", 0.2343, 18.8),
    ("124M", "1M", 0.4662, -9.6),
    ("124M", "10M", 0.2925, -12.3),
    ("124M", "118M", 0.1931, 12.8),
    ("354M", "1M", 0.4902, 4.3),
    ("354M", "10M", 0.3688, -24.1),
    ("354M", "118M", 0.3271, 13.4),
    ("1.3B", "1M", 0.3934, 2.1),
    ("1.3B", "118M", 0.2376, 10.4),
]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_shipped_study_cells_match_the_study_table():
    cells = study_cells()
    assert [(c.group, c.name.split("/")[1], c.readings["saturation"], c.helps) for c in cells] == [
        (g, t, s, d < 0) for g, t, s, d in STUDY
    ]
    assert [round(c.delta * 100, 1) for c in cells] == [d for *_, d in STUDY]


def test_study_reproduces_the_studys_validation_code():
    r = calibrate(study_cells(), source="study")
    assert r.fits["midpoint"].threshold == pytest.approx(0.43985, abs=1e-12)
    assert (r.fits["midpoint"].correct, r.fits["midpoint"].accuracy) == (9, 0.75)
    assert (r.cv["midpoint"].correct, r.cv["midpoint"].accuracy) == (6, 0.5)
    assert r.auc == 0.75
    assert r.study_accuracy == 0.75  # the paper's rounded 0.43 classifies the same 9 cells


def test_cells_csv_outcome_forms_and_comments(tmp_path):
    p = write(
        tmp_path,
        "c.csv",
        "# a comment\nname,saturation,first_block,outcome,group\n"
        "a,0.5,0.1,-0.2,g1\nb,0.4,0.2,yes,g1\nc,0.3,0.3,no,g2\nd,0.2,0.4,0.05,g2\n",
    )
    cells = read_cells(p)
    assert [(c.name, c.helps, c.delta) for c in cells] == [
        ("a", True, -0.2),
        ("b", True, None),
        ("c", False, None),
        ("d", False, 0.05),
    ]
    assert cells[0].readings == {"saturation": 0.5, "first_block": 0.1}
    helps = write(tmp_path, "h.csv", "saturation,helps,group\n0.5,1,a\n0.1,0,b\n")
    assert [c.helps for c in read_cells(helps)] == [True, False]


def test_cells_json_list_or_object(tmp_path):
    rows = [
        {"name": "x", "group": "a", "delta": -0.1, "saturation": 0.6, "per_layer": {"l": 0.3}},
        {"name": "y", "group": "b", "helps": False, "saturation": 0.2},
    ]
    for payload in (rows, {"format": "satmon-cells", "cells": rows}):
        cells = read_cells(write(tmp_path, "c.json", json.dumps(payload)))
        assert [(c.name, c.helps, c.readings) for c in cells] == [
            ("x", True, {"saturation": 0.6}),
            ("y", False, {"saturation": 0.2}),
        ]


@pytest.mark.parametrize(
    "text, match",
    [
        ("saturation,delta,group\n0.5,-0.1\n", "Expected 3 columns .* got 2 on data row 1"),
        ("saturation,delta,group\n0.5,,a\n", "Expected an outcome for every cell"),
        ("saturation,delta,group\n0.5,-0.1,\n", "Expected a 'group' for every cell"),
        ("saturation,delta,group\n0.5,abc,a\n", "Expected a number for 'delta'"),
        ("saturation,helps,group\n0.5,maybe,a\n", "Expected yes/no in 'helps'"),
        ("saturation,delta,group\n", "Expected a CSV header and at least one row"),
    ],
)
def test_malformed_cells_csv(tmp_path, text, match):
    with pytest.raises(CalibrationError, match=match):
        read_cells(write(tmp_path, "bad.csv", text))


def cells_from(tmp_path: Path, rows: list[tuple[float, float, str]]):
    return read_cells(
        write(tmp_path, "c.csv", "saturation,delta,group\n" + "".join(f"{s},{d},{g}\n" for s, d, g in rows))
    )


@pytest.mark.parametrize(
    "rows, match",
    [
        ([(0.5, -0.1, "a"), (0.2, 0.1, "b"), (0.4, -0.1, "b")], "Expected at least 4 cells .* got 3"),
        (
            [(0.5, -0.1, "a"), (0.2, 0.1, "a"), (0.4, -0.1, "a"), (0.1, 0.1, "a")],
            "Expected at least 2 groups .* got 1 \\('a'\\)",
        ),
        (
            [(0.5, 0.1, "a"), (0.2, 0.1, "b"), (0.4, 0.1, "a"), (0.1, 0.1, "b")],
            "Expected cells where DyT helped and cells where it hurt, got only hurt",
        ),
    ],
)
def test_calibrate_refuses_what_it_cannot_fit(tmp_path, rows, match):
    with pytest.raises(CalibrationError, match=match):
        calibrate(cells_from(tmp_path, rows))


def test_calibrate_names_the_cells_missing_a_metric(tmp_path):
    cells = cells_from(tmp_path, [(0.5, -0.1, "a"), (0.2, 0.1, "b"), (0.4, -0.1, "a"), (0.1, 0.1, "b")])
    with pytest.raises(
        CalibrationError,
        match="Expected a finite 'first_block' reading .* pick a metric every cell has \\(saturation\\)",
    ):
        calibrate(cells, metric="first_block")


def test_json_round_trip(tmp_path):
    r = calibrate(study_cells(), source="study")
    written = write_calibration(
        r, tmp_path / "out" / "calibration.json", rule="midpoint", command="satmon calibrate --study"
    )
    cal = load_calibration(tmp_path / "out" / "calibration.json")
    assert isinstance(cal, Calibration) and cal == written
    assert (cal.threshold, cal.rule, cal.metric, cal.n, cal.groups) == (
        r.fits["midpoint"].threshold,
        "midpoint",
        "saturation",
        12,
        4,
    )
    assert (cal.accuracy, cal.loso_accuracy, cal.auc, cal.source) == (0.75, 0.5, 0.75, "study")
    assert "0.4398" in cal.caveat() and "75% in-sample" in cal.caveat() and "50% leave-one-group-out" in cal.caveat()
    data = json.loads((tmp_path / "out" / "calibration.json").read_text())
    assert data["fits"]["balanced"]["threshold"] == r.fits["balanced"].threshold
    assert [c["saturation"] for c in data["cells"]] == [s for _, _, s, _ in STUDY]
    assert data["provenance"]["command"] == "satmon calibrate --study"
    balanced = write_calibration(r, tmp_path / "b.json", rule="balanced")
    assert balanced.threshold == pytest.approx(0.26505) and balanced.loso_accuracy == pytest.approx(7 / 12)


def test_load_calibration_errors(tmp_path):
    with pytest.raises(CalibrationError, match="got no file at"):
        load_calibration(tmp_path / "none.json")
    with pytest.raises(CalibrationError, match="Expected format 'satmon-calibration'"):
        load_calibration(write(tmp_path, "x.json", json.dumps({"threshold": 0.4})))
    with pytest.raises(CalibrationError, match="Expected a threshold in \\(0, 1\\)"):
        load_calibration(write(tmp_path, "y.json", json.dumps({"format": "satmon-calibration", "threshold": 1.01})))


# --- input that is refused, at the mechanism that reads it --------------------------------------------------
def test_to_float_refuses_what_is_no_finite_number():
    from satmon.calibrate.fit import to_float

    assert to_float(" 1e-3 ", "x", "w") == 1e-3 and to_float(7, "x", "w") == 7.0 and to_float(None, "x", "w") is None
    for bad, match in (
        ("nan", "finite"),
        ("-inf", "finite"),
        (float("nan"), "finite"),
        ("1e999", "finite"),
        (True, "Expected a number"),
        ([1], "Expected a number"),
        ("1,5", "Expected a number"),
        (10**400, "Expected a number"),
    ):
        with pytest.raises(CalibrationError, match=match):
            to_float(bad, "'delta'", "row 1")


@pytest.mark.parametrize(
    ("row", "helps", "delta"),
    [
        ({"delta": "-0.2"}, True, -0.2),
        ({"delta": "0"}, False, 0.0),
        ({"helps": "yes"}, True, None),
        ({"helps": "0"}, False, None),
        ({"outcome": "hurt"}, False, None),
        ({"outcome": "-0.1"}, True, -0.1),
        ({"delta": "-0.2", "helps": "yes", "outcome": "go"}, True, -0.2),
        ({"helps": True}, True, None),
    ],
)
def test_outcome_columns(row, helps, delta):
    from satmon.calibrate.fit import _outcome

    assert _outcome(row, "w") == (helps, delta)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"delta": "-0.2", "helps": "no"}, "delta says DyT helped, helps says DyT hurt"),
        ({"helps": "yes", "outcome": "0.3"}, "helps says DyT helped, outcome says DyT hurt"),
        ({"delta": "nan"}, "finite"),
        ({"outcome": "inf"}, "finite"),
        ({"helps": "2"}, "Expected yes/no"),
        ({"delta": ""}, "Expected an outcome"),
    ],
)
def test_outcome_columns_that_cannot_be_read(row, match):
    from satmon.calibrate.fit import _outcome

    with pytest.raises(CalibrationError, match=match):
        _outcome(row, "w")


@pytest.mark.parametrize("value", [1.7, -0.3, 1.0000001])
def test_saturation_readings_outside_0_1_are_refused_in_any_saturation_column(tmp_path, value):
    for column in ("saturation", "saturation_end"):
        other = "saturation_end" if column == "saturation" else "saturation"
        text = f"{column},{other},delta,group\n{value},0.5,-0.1,a\n0.2,0.5,0.1,b\n"
        with pytest.raises(CalibrationError, match=rf"Expected '{column}' in \[0, 1\]"):
            read_cells(write(tmp_path, "c.csv", text))
    ok = read_cells(write(tmp_path, "ok.csv", "saturation,d_model,delta,group\n1.0,512,-0.1,a\n0.0,64,0.1,b\n"))
    assert [c.readings for c in ok] == [{"saturation": 1.0, "d_model": 512.0}, {"saturation": 0.0, "d_model": 64.0}]


def test_a_non_finite_reading_is_refused_only_where_it_is_fitted(tmp_path):
    text = "saturation,first_block,delta,group\n0.5,nan,-0.1,a\n0.2,0.1,0.1,b\n0.6,0.3,-0.2,b\n0.1,0.4,0.2,a\n"
    cells = read_cells(write(tmp_path, "c.csv", text))
    assert calibrate(cells).fits["midpoint"].accuracy == 1.0  # saturation is fitted; first_block's NaN is not used
    with pytest.raises(
        CalibrationError, match=r"Expected a finite 'first_block' reading for every cell, got nan for 'c.csv row 1'"
    ):
        calibrate(cells, "first_block")


def test_calibrate_checks_cells_built_in_code_too():
    from satmon.calibrate.fit import Cell

    good = [
        Cell(n, g, h, {"saturation": s})
        for n, g, h, s in (("a", "x", True, 0.6), ("b", "x", False, 0.2), ("c", "y", True, 0.7), ("d", "y", False, 0.3))
    ]
    with pytest.raises(CalibrationError, match=r"Expected 'saturation' in \[0, 1\] .* got 1.5 \(cell 'e'\)"):
        calibrate(good + [Cell("e", "y", True, {"saturation": 1.5})])
    with pytest.raises(CalibrationError, match="Expected a finite delta for every cell, got nan for 'e'"):
        calibrate(good + [Cell("e", "y", True, {"saturation": 0.5}, float("nan"))])


def test_duplicated_cells_and_columns_are_named(tmp_path):
    with pytest.raises(CalibrationError, match=r"got 2 name\(s\) listed more than once: 'r1', 'r2'"):
        read_cells(
            write(
                tmp_path,
                "c.csv",
                "name,saturation,delta,group\nr1,0.5,-0.1,a\nr1,0.5,-0.1,b\nr2,0.1,0.1,a\nr2,0.2,0.1,b\n",
            )
        )
    with pytest.raises(CalibrationError, match="'group' more than once"):
        read_cells(write(tmp_path, "d.csv", "saturation,group,delta,group\n0.5,a,-0.1,a\n"))


def test_byte_order_marks_are_read_and_binary_files_refused(tmp_path):
    from satmon.calibrate.fit import read_text

    text = "saturation,delta,group\n0.5,-0.1,a\n0.2,0.1,b\n"
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "utf16.csv").write_text(text, encoding="utf-16")  # with its mark, as Excel's "Unicode text"
    for name in ("bom.csv", "utf16.csv"):
        assert read_text(tmp_path / name, "cells") == text
        assert [c.readings["saturation"] for c in read_cells(tmp_path / name)] == [0.5, 0.2]
    (tmp_path / "bin.csv").write_bytes(bytes(range(128)))  # ASCII, so UTF-8: refused for its control characters
    (tmp_path / "ctl.csv").write_text("saturation,group\x1c\n")
    (tmp_path / "latin.csv").write_bytes("saturation,delta,group\n0.5,-0.1,caf\xe9\n".encode("latin-1"))
    with pytest.raises(CalibrationError, match=r"got the control character '\\x00'"):
        read_text(tmp_path / "bin.csv", "cells")
    with pytest.raises(CalibrationError, match=r"got the control character '\\x1c' at character 16"):
        read_text(tmp_path / "ctl.csv", "cells")
    at = len("saturation,delta,group\n0.5,-0.1,caf")  # where the latin-1 byte sits
    with pytest.raises(CalibrationError, match=rf"as UTF-8 text, got bytes that are not \(byte {at} of"):
        read_cells(tmp_path / "latin.csv")
    with pytest.raises(CalibrationError, match="got a folder at"):
        read_cells(tmp_path)


def test_deeply_nested_json_is_a_parse_error_not_a_recursion_error(tmp_path):
    with pytest.raises(CalibrationError, match="nested too deep"):
        read_cells(write(tmp_path, "deep.json", "[" * 200_000 + "]" * 200_000))


def test_write_calibration_keeps_the_previous_file_when_interrupted(tmp_path, monkeypatch):
    from satmon.io import atomic

    target = write(tmp_path, "calibration.json", '{"previous": true}')
    result = calibrate(study_cells(), source="study")

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_calibration(result, target)
    assert target.read_text() == '{"previous": true}' and [p.name for p in tmp_path.iterdir()] == ["calibration.json"]
    monkeypatch.undo()
    write_calibration(result, target)
    assert load_calibration(target).n == 12


def test_a_grid_cell_whose_arms_all_diverged_is_left_out_and_named(tmp_path):
    """satmon grid records a cell whose arms both diverged with null delta and helps and a ``diverged`` map: calibrate
    leaves it out and names it (it has no outcome); a cell with one diverged arm keeps the outcome the grid gave it."""
    import json

    from satmon.calibrate.fit import read_cells

    rows = [
        {"name": "a", "group": "g1", "delta": -0.2, "helps": True, "saturation": 0.6, "diverged": {}},
        # one arm diverged: DyT hurt, kept
        {
            "name": "b",
            "group": "g2",
            "delta": None,
            "helps": False,
            "saturation": 0.3,
            "diverged": {"dyt": 7},
        },
        {
            "name": "c",
            "group": "g2",
            "delta": None,
            "helps": None,
            "saturation": 0.1,
            "diverged": {"dyt": 3, "layernorm": 5},
        },
    ]
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"cells": rows}))
    notes: list[str] = []
    cells = read_cells(path, on_skip=notes.append)
    assert [(c.name, c.helps) for c in cells] == [("a", True), ("b", False)]
    assert (
        len(notes) == 1
        and "left out c" in notes[0]
        and "dyt at step 3" in notes[0]
        and "layernorm at step 5" in notes[0]
    )
    rows[2]["diverged"] = {}  # the same null outcome without a divergence is still an error, as before
    path.write_text(json.dumps({"cells": rows}))
    with pytest.raises(Exception, match="Expected an outcome for every cell"):
        read_cells(path)
