"""Bad input to `satmon`, `satmon demo`, `satmon report` and `satmon calibrate`: one row per case.

Every case runs the command in a folder that already holds outputs of an earlier run (a complete
calibration.json and plot, a read-only file, folders where files go...) and asserts

- the exit code (2: usage error or input that cannot be used; 1: `satmon report` found no satmon data),
- the message: one line on stderr (argparse's usage lines may come before a syntax error, never before an
  output path's reason), no traceback, saying what was expected and what was given,
- that nothing in the folder changed, and nothing was created (no file, no empty output folder);
- for `satmon demo`, that nothing was built or trained (``run_demo`` is never called).

:data:`CASES` is also what docs/reference/reliability.md counts (bad inputs tried, clear errors out of total).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from satmon.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

CELLS_HEADER = "name,saturation,delta,group"
GOOD_ROWS = ["a,0.6,-0.1,small", "b,0.2,0.1,small", "c,0.7,-0.2,big", "d,0.3,0.2,big"]
OUTCOMES_HEADER = "run,dyt_val_loss,layernorm_val_loss,group"


def _cells(*rows: str, header: str = CELLS_HEADER) -> str:
    """A cells CSV: the good rows with ``rows`` replacing the first ones."""
    body = list(rows) + GOOD_ROWS[len(rows) :]
    return "\n".join([header, *body]) + "\n"


def _outcomes(*rows: str) -> str:
    return "\n".join([OUTCOMES_HEADER, *rows]) + "\n"


def _noise(seed: int, n: int) -> bytes:
    """``n`` random bytes: a binary file."""
    return random.Random(seed).randbytes(n)


def _replay(saturation, step=500) -> str:
    return json.dumps([{"checkpoint": "last.ckpt", "global_step": step, "verdict": {"saturation": saturation}}])


#: relative path -> content (str, bytes, or None for a folder), made in every case's folder
FILES: dict[str, str | bytes | None] = {
    "prev/calibration.json": '{"previous": "calibration, complete"}\n',
    "prev/calibration.png": b"\x89PNG previous plot",
    "afile": "a file, not a folder\n",
    "ro/calibration.json": "read-only, kept\n",
    "dirjson/calibration.json": None,
    "dirpng/calibration.png": None,
    "plotdir": None,
    "empty_dir": None,
    "demo_root/demo": "a file where the demo's run folder goes\n",
    "demo_next/demo/version_0": None,
    "demo_next/demo/version_1": "a file where the next run folder goes\n",
    "cells.csv": _cells(),
    "cells_nan_delta.csv": _cells("a,0.6,nan,small"),
    "cells_inf_delta.csv": _cells("a,0.6,-inf,small"),
    "cells_word_delta.csv": _cells("a,0.6,lower,small"),
    "cells_helps_word.csv": _cells("a,0.6,maybe,small", header="name,saturation,helps,group"),
    "cells_disagree.csv": "name,saturation,delta,helps,group\na,0.6,-0.1,no,small\nb,0.2,0.1,no,small\n"
    "c,0.7,-0.2,yes,big\nd,0.3,0.2,no,big\n",
    "cells_sat_high.csv": _cells("a,1.7,-0.1,small"),
    "cells_sat_low.csv": _cells("a,-0.3,-0.1,small"),
    "cells_sat_nan.csv": _cells("a,nan,-0.1,small"),
    "cells_sat_inf.csv": _cells("a,inf,-0.1,small"),
    "cells_sat_end_high.csv": "name,saturation,saturation_end,delta,group\na,0.6,1.2,-0.1,small\nb,0.2,0.2,0.1,small\n"
    "c,0.7,0.7,-0.2,big\nd,0.3,0.3,0.2,big\n",
    "cells_no_group.csv": _cells("a,0.6,-0.1,"),
    "cells_no_outcome.csv": _cells("a,0.6,,small"),
    "cells_dup_name.csv": _cells("a,0.6,-0.1,small", "a,0.2,0.1,small"),
    "cells_dup_column.csv": "name,saturation,saturation,delta,group\na,0.6,0.6,-0.1,small\n",
    "cells_ragged.csv": _cells("a,0.6,-0.1"),
    "cells_header_only.csv": CELLS_HEADER + "\n",
    "cells_empty.csv": "",
    "cells_binary.csv": _noise(0, 512),
    "cells_nul.csv": b"name,saturation,delta,group\na,0.6,-0.1,sm\x00all\n",
    "cells_latin1.csv": _cells("caf\xe9,0.6,-0.1,small").encode("latin-1"),
    "cells_few.csv": "\n".join([CELLS_HEADER, *GOOD_ROWS[:3]]) + "\n",
    "cells_one_group.csv": "\n".join([CELLS_HEADER, *(r.replace("big", "small") for r in GOOD_ROWS)]) + "\n",
    "cells_one_class.csv": "\n".join([CELLS_HEADER, *(r.replace(",-0.", ",0.") for r in GOOD_ROWS)]) + "\n",
    "cells_bad.json": '[{"name": "a", "saturation": 0.6, "delta": -0.1, "group": "small"},',
    "cells_deep.json": "[" * 100_000 + "]" * 100_000,
    "cells_number.json": "42\n",
    "cells_nan.json": '[{"name": "a", "saturation": 0.6, "delta": NaN, "group": "small"}]\n',
    "cells_bool_delta.json": '[{"name": "a", "saturation": 0.6, "delta": true, "group": "small"}]\n',
    "cells_list_group.json": '[{"name": "a", "saturation": 0.6, "delta": -0.1, "group": ["small"]}]\n',
    "cells_huge.json": '[{"name": "a", "saturation": 1e400, "delta": -0.1, "group": "small"}]\n',
    "run_a.json": _replay(0.6),
    "run_b.json": _replay(0.2),
    "run_c.json": _replay(0.7),
    "run_d.json": _replay(0.3),
    "sub/run_a.json": _replay(0.5),
    "run_high.json": _replay(1.7),
    "run_nonfinite.json": json.dumps(
        [
            {"global_step": 400, "verdict": {"saturation": 0.6}},
            {"global_step": 500, "verdict": {"saturation": None, "decision": "non-finite"}},
        ]
    ),
    "run_binary.json": _noise(1, 256),
    "run_bad.json": '[{"global_step": 500, "verdict": {"saturation": 0.6}',
    "run_str_step.json": json.dumps(
        [{"global_step": "500", "verdict": {"saturation": 0.6}}, {"global_step": 400, "verdict": {"saturation": 0.6}}]
    ),
    "outcomes.csv": _outcomes("run_a,2.0,2.4,small", "run_b,2.6,2.5,small", "run_c,2.0,2.2,big", "run_d,3.0,2.5,big"),
    "out_zero.csv": _outcomes("run_a,2.0,0,small", "run_b,2.6,2.5,small"),
    "out_negative.csv": _outcomes("run_a,-2.0,2.4,small", "run_b,2.6,2.5,small"),
    "out_nan.csv": _outcomes("run_a,nan,2.4,small", "run_b,2.6,2.5,small"),
    "out_inf.csv": _outcomes("run_a,2.0,inf,small", "run_b,2.6,2.5,small"),
    "out_dup.csv": _outcomes("run_a,2.0,2.4,small", "run_a,2.6,2.5,big"),
    "out_blank.csv": _outcomes("run_a,,2.4,small"),
    "out_no_group.csv": "run,dyt_val_loss,layernorm_val_loss\nrun_a,2.0,2.4\n",
    "out_unknown.csv": _outcomes("run_zz,2.0,2.4,small"),
    "out_binary.csv": _noise(2, 256),
    "out_high.csv": _outcomes("run_high,2.0,2.4,small"),
    "out_nonfinite.csv": _outcomes("run_nonfinite,2.0,2.4,small"),
    "out_str_step.csv": _outcomes("run_str_step,2.0,2.4,small"),
    "out_bad.csv": _outcomes("run_bad,2.0,2.4,small"),
    "out_binary_run.csv": _outcomes("run_binary,2.0,2.4,small"),
    "tb_corrupt/events.out.tfevents.1.host": _noise(3, 3000),
    "notes.txt": "not an event file\n",
}
READ_ONLY = ("ro/calibration.json",)
FIFOS = ("events.out.tfevents.1.fifo",)  #: named like an event file: opening one would block forever


@dataclass(frozen=True)
class Case:
    """``argv`` (run in the case's folder), the exit code, and a regex the last stderr line must match."""

    id: str
    argv: tuple[str, ...]
    code: int
    match: str


def _cal(id: str, *argv: str, match: str, code: int = 2, out: bool = True) -> Case:
    return Case(f"calibrate-{id}", ("calibrate", *argv, *(("--out", "prev") if out else ())), code, match)


def _demo(id: str, *argv: str, match: str) -> Case:
    return Case(f"demo-{id}", ("demo", *argv), 2, match)


CASES: list[Case] = [
    # satmon itself
    Case("bare-satmon", (), 2, r"^satmon: error: the following arguments are required: COMMAND"),
    Case("unknown-command", ("frobnicate",), 2, r"^satmon: error: argument COMMAND: invalid choice: 'frobnicate'"),
    Case("unknown-option", ("--frobnicate",), 2, r"^satmon: error: "),
    # satmon demo: every numeric flag's range, cross-flag checks and the log folder, before anything is built
    _demo("window-0", "--window", "0", match=r"argument --window: expected an integer >= 1, got '0'"),
    _demo("window-negative", "--window", "-5", match=r"argument --window: expected an integer >= 1"),
    _demo("window-word", "--window", "ten", match=r"argument --window: expected an integer >= 1, got 'ten'"),
    _demo("window-float", "--window", "2.5", match=r"argument --window: expected an integer"),
    _demo("steps-0", "--steps", "0", match=r"argument --steps: expected an integer >= 1"),
    _demo("steps-below-window", "--window", "10", "--steps", "5", match=r"expected --steps >= --window \(10\)"),
    _demo("threshold-0", "--threshold", "0", match=r"argument --threshold: expected a number in \(0, 1\), got '0'"),
    _demo("threshold-1", "--threshold", "1", match=r"argument --threshold: expected a number in \(0, 1\)"),
    _demo("threshold-1.5", "--threshold", "1.5", match=r"argument --threshold: expected a number in \(0, 1\)"),
    _demo("threshold-negative", "--threshold=-0.1", match=r"argument --threshold: expected a number in \(0, 1\)"),
    _demo(
        "threshold-nan", "--threshold", "nan", match=r"argument --threshold: expected a number in \(0, 1\), got 'nan'"
    ),
    _demo("threshold-word", "--threshold", "high", match=r"argument --threshold: expected a number in \(0, 1\)"),
    _demo("d-model-0", "--d-model", "0", match=r"argument --d-model: expected an integer >= 4"),
    _demo("d-model-not-heads", "--d-model", "30", match=r"expected --d-model to be a multiple of 4"),
    _demo("layers-0", "--layers", "0", match=r"argument --layers: expected an integer >= 1"),
    _demo("batch-size-0", "--batch-size", "0", match=r"argument --batch-size: expected an integer >= 1"),
    _demo("seq-len-0", "--seq-len", "0", match=r"argument --seq-len: expected an integer in \[1, 39999\]"),
    _demo("seq-len-too-long", "--seq-len", "40000", match=r"argument --seq-len: expected an integer in \[1, 39999\]"),
    _demo("train-tokens-1", "--train-tokens", "1", match=r"argument --train-tokens: expected an integer >= 2"),
    _demo("train-tokens-below-a-batch", "--train-tokens", "100", match=r"expected --train-tokens of at least 1025"),
    _demo("train-tokens-beyond-corpus", "--train-tokens", "1000000000", match=r"expected --train-tokens <= \d+"),
    _demo("seed-negative", "--seed=-1", match=r"argument --seed: expected an integer in \[0, 4294967295\]"),
    _demo("seed-too-big", "--seed", str(2**32), match=r"argument --seed: expected an integer in \[0, 4294967295\]"),
    _demo(
        "checkpoint-every-negative",
        "--checkpoint-every=-1",
        match=r"argument --checkpoint-every: expected an integer >= 0",
    ),
    _demo(
        "threads-0",
        "--threads",
        "0",
        match=rf"argument --threads: expected an integer in \[1, {os.cpu_count()}\], got '0'",
    ),
    _demo("logdir-empty", "--logdir", "", match=r"Expected --logdir to name a folder, got an empty name"),
    _demo("logdir-a-file", "--logdir", "afile", match=r"Expected --logdir to name a folder, got 'afile' \(a file\)"),
    _demo(
        "logdir-under-a-file",
        "--logdir",
        "afile/logs",
        match=r"Expected --logdir 'afile/logs' under a folder, got a file",
    ),
    _demo(
        "run-folder-a-file",
        "--logdir",
        "demo_root",
        match=r"Expected --logdir's run folder to name a folder, got "
        r"'demo_root/demo' \(a file\)",
    ),
    _demo(
        "threads-beyond-the-machine",
        "--threads",
        "100000",
        match=rf"argument --threads: expected an integer in \[1, {os.cpu_count()}\], got '100000'",
    ),
    _demo(
        "logdir-with-a-variable",
        "--logdir",
        "$HOME/logs",
        match=r"expected --logdir without a \$VARIABLE \(the "
        r"TensorBoard logger expands it, so the run would go to '/.*/logs'\), got '\$HOME/logs'",
    ),
    _demo(
        "next-version-a-file",
        "--logdir",
        "demo_next",
        match=r"expected 'demo_next/demo/version_1' to be free for the "
        r"run's TensorBoard folder \(the next version_N\), got a file there",
    ),
    _demo(
        "logdir-name-too-long",
        "--logdir",
        "x" * 300,
        match=r"Expected --logdir to be a path whose names are at most "
        r"255 bytes each \(the file system's limit\), got 300 bytes",
    ),
    _demo("unknown-flag", "--frobnicate", match=r"unrecognized arguments: --frobnicate"),
    _demo("positional", "extra", match=r"unrecognized arguments: extra"),
    # satmon report
    Case("report-no-path", ("report",), 2, r"^satmon report: error: the following arguments are required: LOGDIR"),
    Case("report-missing", ("report", "nowhere"), 2, r"^satmon report: no such file or directory: 'nowhere'"),
    Case(
        "report-empty-path",
        ("report", ""),
        2,
        r"^satmon report: Expected LOGDIR to name a folder or an event file, got an empty path",
    ),
    Case(
        "report-not-an-event-file",
        ("report", "notes.txt"),
        2,
        r"^satmon report: Expected LOGDIR to be a folder or a "
        r"TensorBoard event file \(events\.out\.tfevents\.\*\), got the file 'notes.txt'",
    ),
    Case(
        "report-empty-folder",
        ("report", "empty_dir"),
        1,
        r"^satmon report: no satmon data under 'empty_dir' \(0 TensorBoard",
    ),
    Case(
        "report-corrupt-events",
        ("report", "tb_corrupt"),
        1,
        r"^satmon report: no satmon data under 'tb_corrupt' \(1 TensorBoard",
    ),
    Case("report-unknown-flag", ("report", "empty_dir", "--frobnicate"), 2, r"unrecognized arguments: --frobnicate"),
    Case(
        "report-a-fifo",
        ("report", FIFOS[0]),
        2,
        r"^satmon report: Expected LOGDIR to be a folder or a TensorBoard "
        r"event file, got 'events.out.tfevents.1.fifo', which is a FIFO \(named pipe\)",
    ),
    # satmon calibrate: what to read
    _cal("no-input", match=r"Expected one input: RUNS with --outcomes, --cells FILE, or --study; got 0"),
    _cal("two-inputs", "--study", "--cells", "cells.csv", match=r"Expected one input.*got 2"),
    _cal("runs-without-outcomes", "run_a.json", match=r"together with --outcomes CSV, got runs only"),
    _cal(
        "outcomes-without-runs",
        "--outcomes",
        "outcomes.csv",
        match=r"together with --outcomes CSV, got --outcomes only",
    ),
    _cal(
        "runs-other-metric",
        "run_a.json",
        "--outcomes",
        "outcomes.csv",
        "--metric",
        "first_block",
        match=r"Expected --metric saturation with runs",
    ),
    _cal("rule-unknown", "--study", "--rule", "best", match=r"argument --rule: invalid choice: 'best'"),
    # cells: outcomes
    _cal(
        "nan-delta",
        "--cells",
        "cells_nan_delta.csv",
        match=r"Expected a finite number for 'delta' \(cells_nan_delta.csv row 1\), got 'nan'",
    ),
    _cal("inf-delta", "--cells", "cells_inf_delta.csv", match=r"Expected a finite number for 'delta' .* got '-inf'"),
    _cal("word-delta", "--cells", "cells_word_delta.csv", match=r"Expected a number for 'delta' .* got 'lower'"),
    _cal("helps-word", "--cells", "cells_helps_word.csv", match=r"Expected yes/no in 'helps' .* got 'maybe'"),
    _cal(
        "outcomes-disagree",
        "--cells",
        "cells_disagree.csv",
        match=r"Expected the outcome columns to agree .*delta says "
        r"DyT helped, helps says DyT hurt",
    ),
    _cal("no-outcome", "--cells", "cells_no_outcome.csv", match=r"Expected an outcome for every cell"),
    _cal("no-group", "--cells", "cells_no_group.csv", match=r"Expected a 'group' for every cell"),
    _cal("json-nan-delta", "--cells", "cells_nan.json", match=r"Expected a finite number for 'delta' .* got nan"),
    _cal("json-bool-delta", "--cells", "cells_bool_delta.json", match=r"Expected a number for 'delta' .* got True"),
    _cal("json-list-group", "--cells", "cells_list_group.json", match=r"Expected 'group' to be a name"),
    # cells: readings
    _cal("saturation-1.7", "--cells", "cells_sat_high.csv", match=r"Expected 'saturation' in \[0, 1\] .* got 1.7"),
    _cal("saturation-negative", "--cells", "cells_sat_low.csv", match=r"Expected 'saturation' in \[0, 1\] .* got -0.3"),
    _cal(
        "saturation-end-1.2",
        "--cells",
        "cells_sat_end_high.csv",
        match=r"Expected 'saturation_end' in \[0, 1\] .* got 1.2",
    ),
    _cal(
        "saturation-nan",
        "--cells",
        "cells_sat_nan.csv",
        match=r"Expected a finite 'saturation' reading for every cell, got nan for 'a'",
    ),
    _cal(
        "saturation-inf",
        "--cells",
        "cells_sat_inf.csv",
        match=r"Expected a finite 'saturation' reading .* got inf for 'a'",
    ),
    _cal(
        "json-saturation-overflow",
        "--cells",
        "cells_huge.json",
        match=r"Expected a finite 'saturation' reading .* got inf",
    ),
    _cal(
        "metric-missing",
        "--cells",
        "cells.csv",
        "--metric",
        "first_block",
        match=r"Expected a finite 'first_block' reading for every cell, got none for 'a'.*pick a metric every cell "
        r"has \(saturation\)",
    ),
    # cells: the file
    _cal(
        "duplicate-cell",
        "--cells",
        "cells_dup_name.csv",
        match=r"Expected each cell once in cells_dup_name.csv, got 1 "
        r"name\(s\) listed more than once: 'a'",
    ),
    _cal(
        "duplicate-column",
        "--cells",
        "cells_dup_column.csv",
        match=r"Expected each column once .* 'saturation' more than once",
    ),
    _cal("ragged-row", "--cells", "cells_ragged.csv", match=r"Expected 4 columns .* got 3 on data row 1"),
    _cal(
        "header-only",
        "--cells",
        "cells_header_only.csv",
        match=r"Expected a CSV header and at least one row .* got 0 rows",
    ),
    _cal("empty-file", "--cells", "cells_empty.csv", match=r"Expected a CSV header and at least one row"),
    _cal(
        "binary-file",
        "--cells",
        "cells_binary.csv",
        match=r"Expected a cells file \(CSV or JSON\) as UTF-8 text, got bytes that are not",
    ),
    _cal(
        "nul-bytes",
        "--cells",
        "cells_nul.csv",
        match=r"Expected a cells file \(CSV or JSON\) as text, got the control character '\\x00'",
    ),
    _cal("latin-1", "--cells", "cells_latin1.csv", match=r"as UTF-8 text, got bytes that are not .*save it as UTF-8"),
    _cal(
        "cells-folder",
        "--cells",
        "empty_dir",
        match=r"Expected a cells file \(CSV or JSON\), got a folder at 'empty_dir'",
    ),
    _cal(
        "cells-missing",
        "--cells",
        "nope.csv",
        match=r"Expected a cells file \(CSV or JSON\), got no file at 'nope.csv'",
    ),
    _cal("json-parse-error", "--cells", "cells_bad.json", match=r"Expected JSON in cells_bad.json, got a parse error"),
    _cal(
        "json-deep",
        "--cells",
        "cells_deep.json",
        match=r"Expected JSON in cells_deep.json, got a parse error: nested too deep",
    ),
    _cal("json-number", "--cells", "cells_number.json", match=r"Expected a list of cell objects .* got int"),
    # cells: what can be fitted
    _cal("fewer-than-4", "--cells", "cells_few.csv", match=r"Expected at least 4 cells"),
    _cal("one-group", "--cells", "cells_one_group.csv", match=r"Expected at least 2 groups"),
    _cal("one-class", "--cells", "cells_one_class.csv", match=r"got only hurt"),
    # runs + outcomes
    _cal(
        "zero-loss",
        "run_a.json",
        "run_b.json",
        "--outcomes",
        "out_zero.csv",
        match=r"Expected layernorm_val_loss > 0 .* got 0.0",
    ),
    _cal(
        "negative-loss",
        "run_a.json",
        "run_b.json",
        "--outcomes",
        "out_negative.csv",
        match=r"Expected dyt_val_loss > 0 .* got -2.0",
    ),
    _cal(
        "nan-loss",
        "run_a.json",
        "run_b.json",
        "--outcomes",
        "out_nan.csv",
        match=r"Expected a finite number for dyt_val_loss .* got 'nan'",
    ),
    _cal(
        "inf-loss",
        "run_a.json",
        "run_b.json",
        "--outcomes",
        "out_inf.csv",
        match=r"Expected a finite number for layernorm_val_loss .* got 'inf'",
    ),
    _cal(
        "duplicate-run-row",
        "run_a.json",
        "--outcomes",
        "out_dup.csv",
        match=r"Expected each run once in out_dup.csv, got "
        r"'run_a' on rows 1 and 2",
    ),
    _cal("blank-loss", "run_a.json", "--outcomes", "out_blank.csv", match=r"got a blank"),
    _cal("outcomes-missing-column", "run_a.json", "--outcomes", "out_no_group.csv", match=r"add group"),
    _cal("outcomes-unknown-run", "run_a.json", "--outcomes", "out_unknown.csv", match=r"got no run for 'run_zz'"),
    _cal(
        "outcomes-binary",
        "run_a.json",
        "--outcomes",
        "out_binary.csv",
        match=r"Expected an outcomes CSV .* as UTF-8 text",
    ),
    _cal(
        "outcomes-missing",
        "run_a.json",
        "--outcomes",
        "nope.csv",
        match=r"Expected an outcomes CSV .* got no file at 'nope.csv'",
    ),
    _cal(
        "same-run-twice",
        "run_a.json",
        "run_a.json",
        "--outcomes",
        "outcomes.csv",
        match=r"Expected each run once, got 'run_a.json' twice",
    ),
    _cal(
        "same-stem-twice",
        "run_a.json",
        "sub/run_a.json",
        "--outcomes",
        "outcomes.csv",
        match=r"Expected distinct run names, got 'run_a' for both 'run_a.json' and 'sub/run_a.json'",
    ),
    _cal(
        "run-saturation-1.7",
        "run_high.json",
        "--outcomes",
        "out_high.csv",
        match=r"Expected 'saturation' in \[0, 1\] .* got 1.7",
    ),
    _cal(
        "run-verdict-non-finite",
        "run_nonfinite.json",
        "--outcomes",
        "out_nonfinite.csv",
        match=r"Expected a finite verdict saturation in run 'run_nonfinite', got nan",
    ),
    _cal(
        "run-string-step",
        "run_str_step.json",
        "--outcomes",
        "out_str_step.csv",
        match=r"Expected integer global_step values",
    ),
    _cal(
        "run-parse-error",
        "run_bad.json",
        "--outcomes",
        "out_bad.csv",
        match=r"Expected replay records \(JSON or JSONL\) in "
        r"run_bad.json, got a parse error",
    ),
    _cal(
        "run-binary",
        "run_binary.json",
        "--outcomes",
        "out_binary_run.csv",
        match=r"Expected replay records .* as UTF-8 text",
    ),
    _cal("run-missing", "nowhere", "--outcomes", "outcomes.csv", match=r"got no such path: 'nowhere'"),
    # calibrate: blocked outputs, found before any input is read
    _cal(
        "out-a-file",
        "--study",
        "--out",
        "afile",
        match=r"Expected --out to name a folder, got 'afile' \(a file\)",
        out=False,
    ),
    _cal(
        "out-under-a-file",
        "--study",
        "--out",
        "afile/sub",
        match=r"Expected --out 'afile/sub' under a folder, got a file",
        out=False,
    ),
    _cal("out-empty", "--study", "--out", "", match=r"Expected --out to name a folder, got an empty name", out=False),
    _cal(
        "out-device",
        "--study",
        "--out",
        os.devnull,
        match=r"Expected --out to name a folder, got '/dev/null'",
        out=False,
    ),
    _cal(
        "json-read-only",
        "--study",
        "--out",
        "ro",
        match=r"Expected --out's calibration.json 'ro/calibration.json' to be "
        r"writable, got a read-only file",
        out=False,
    ),
    _cal(
        "json-a-folder",
        "--study",
        "--out",
        "dirjson",
        match=r"calibration.json to name a file ending in .json, got "
        r"'dirjson/calibration.json' \(a folder\)",
        out=False,
    ),
    _cal(
        "plot-default-a-folder",
        "--study",
        "--out",
        "dirpng",
        match=r"Expected --plot to name a file .* got "
        r"'dirpng/calibration.png' \(a folder\)",
        out=False,
    ),
    _cal(
        "plot-a-folder",
        "--study",
        "--plot",
        "plotdir",
        match=r"Expected --plot to name a file ending in .png or .pdf or "
        r"\.svg, got 'plotdir' \(a folder\)",
    ),
    _cal(
        "plot-wrong-suffix",
        "--study",
        "--plot",
        "plot.txt",
        match=r"Expected --plot to end in .png or .pdf or .svg, got 'plot.txt'",
    ),
    _cal(
        "plot-no-suffix",
        "--study",
        "--plot",
        "plot",
        match=r"Expected --plot to end in .png or .pdf or .svg, got 'plot'",
    ),
    _cal("plot-empty", "--study", "--plot", "", match=r"Expected --plot to name a file, got an empty name"),
    _cal(
        "plot-under-a-file", "--study", "--plot", "afile/p.png", match=r"Expected --plot 'afile/p.png' under a folder"
    ),
    _cal(
        "plot-device", "--study", "--plot", os.devnull, match=r"Expected --plot to name a regular file, got '/dev/null'"
    ),
    _cal(
        "plot-and-no-plot",
        "--study",
        "--plot",
        "p.png",
        "--no-plot",
        match=r"argument --no-plot: not allowed with argument --plot",
    ),
    _cal(
        "out-name-too-long",
        "--study",
        "--out",
        "o" * 256,
        match=r"Expected --out to be a path whose names are at most "
        r"255 bytes each",
        out=False,
    ),
    _cal(
        "plot-name-too-long",
        "--study",
        "--plot",
        "p" * 240 + ".png",
        match=r"Expected --plot to name a file of at most "
        r"241 bytes \(the file system's names are at most 255 bytes, and satmon writes it through a 14-byte longer "
        r"temporary '.NAME.XXXXXXXX.tmp' beside it\), got 244 bytes",
    ),
    _cal(
        "blocked-output-before-bad-input",
        "--cells",
        "cells_binary.csv",
        "--out",
        "afile",
        match=r"Expected --out to name a folder, got 'afile'",
        out=False,
    ),
]


def make_folder(root: Path) -> Path:
    for rel, content in FILES.items():
        path = root / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for rel in READ_ONLY:
        os.chmod(root / rel, 0o444)
    for rel in FIFOS:
        os.mkfifo(root / rel)
    return root


def snapshot(root: Path, folder_times: bool = True) -> dict[str, tuple]:
    """Every entry under ``root``: kind, permission bits, modification time and content hash (a folder's
    time changes when anything is created in it, even a temporary removed since: ``folder_times=False``
    leaves it out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        when = st.st_mtime_ns if folder_times or not p.is_dir() else None
        out[p.relative_to(root).as_posix()] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), when, digest)
    return out


#: a refusal about an output path: one line, never after argparse's usage block (the flag's syntax was right)
PATH_REASON = re.compile(r"(?i)expected (--logdir|--out|--plot|'[^']*' to be free|a writable folder)")


def check_message(err: str, match: str) -> str:
    """The refusal's one line (argparse's usage lines may precede it, never a path's reason); no traceback."""
    assert "Traceback" not in err, err
    lines = err.rstrip("\n").split("\n")
    message = lines[-1]
    if PATH_REASON.search(message):
        assert len(lines) == 1 and "usage:" not in err, err
    before = [l for l in lines[:-1] if not l.startswith("satmon report: note: ")]  # what report could not read, and why
    if before:  # only argparse's usage block may come first
        assert before[0].startswith("usage: satmon") and all(l.startswith(" ") for l in before[1:]), err
        assert re.match(r"^satmon( \w+)?: error: ", message), err
    assert message.startswith("satmon"), err
    assert re.search(match, message), f"{match!r} not in {message!r}"
    return message


@pytest.fixture
def folder(tmp_path, monkeypatch):
    work = make_folder(tmp_path / "work")
    monkeypatch.chdir(work)
    yield work
    for rel in READ_ONLY:  # let pytest clean up
        os.chmod(work / rel, 0o644)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_before_any_work_and_nothing_changes(case, folder, capsys, monkeypatch):
    from satmon.cli import demo

    def never(*_):
        raise AssertionError("satmon demo built or trained a model before refusing its flags")

    monkeypatch.setattr(demo, "run_demo", never)
    before = snapshot(folder)
    assert main(list(case.argv)) == case.code
    out, err = capsys.readouterr()
    check_message(err, case.match)
    assert out == ""  # nothing reported as done
    assert snapshot(folder) == before  # nothing changed, nothing created


def test_cli_figures_are_the_cases():
    """docs/reference/reliability.md's CLI figures are counted from :data:`CASES`, so they stay true."""
    text = (ROOT / "docs" / "reference" / "reliability.md").read_text()
    by_command = {cmd: sum(1 for c in CASES if c.argv and c.argv[0] == cmd) for cmd in ("calibrate", "demo", "report")}
    for label, value in {
        "CLI bad inputs tried": len(CASES),
        "CLI clear errors": len(CASES),
        "CLI runs that changed a file": 0,
    }.items():
        found = re.search(rf"\*\*{label}\*\*: (\d+)", text)
        assert found and int(found.group(1)) == value, (label, value, found and found.group(0))
    assert f"{len(CASES)} of the {len(CASES)}" in text
    for cmd, n in by_command.items():
        assert f"{n} for `satmon {cmd}`" in text or f"{n} for `satmon {cmd}`:" in text, (cmd, n)


def test_the_matrix_covers_each_command():
    kinds = {c.id.split("-")[0] for c in CASES}
    assert {"demo", "report", "calibrate"} <= kinds
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["demo", "--window", "0"],
        ["calibrate", "--cells", "cells_binary.csv", "--out", "prev"],
        ["calibrate", "--cells", "cells_deep.json", "--out", "prev"],
        ["report", "notes.txt"],
    ],
    ids=["bare", "demo-window-0", "calibrate-binary", "calibrate-deep-json", "report-text-file"],
)
def test_the_console_command_prints_one_line_and_no_traceback(argv, tmp_path):
    """In a fresh process, as a user runs it: the exit code and the stderr lines (no traceback, no warning)."""
    work = make_folder(tmp_path / "work")
    before = snapshot(work)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "satmon.cli.main", *argv],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    check_message(proc.stderr, r"Expected|error|expected")
    assert proc.stdout == ""
    for rel in READ_ONLY:
        os.chmod(work / rel, 0o444)
    assert snapshot(work) == before


def test_a_good_run_over_the_previous_outputs_says_it_replaced_them(folder, capsys):
    """The counterpart of the matrix: valid input in the same folder replaces both outputs, says so once each,
    and keeps their permission bits."""
    os.chmod(folder / "prev" / "calibration.json", 0o640)
    assert main(["calibrate", "--cells", "cells.csv", "--out", "prev"]) == 0
    out = capsys.readouterr().out
    assert out.count("replaced the file that was there") == 2
    assert "Wrote prev/calibration.json (it replaced the file that was there): threshold" in out
    assert "Plot: prev/calibration.png (it replaced the file that was there)" in out
    assert json.loads((folder / "prev" / "calibration.json").read_text())["format"] == "satmon-calibration"
    assert stat.S_IMODE(os.stat(folder / "prev" / "calibration.json").st_mode) == 0o640
    assert (folder / "prev" / "calibration.png").read_bytes().startswith(b"\x89PNG\r\n")
    # no temporary left
    assert sorted(p.name for p in (folder / "prev").iterdir()) == [
        "calibration.json",
        "calibration.png",
    ]


def test_a_byte_order_mark_and_utf16_are_read(folder, capsys):
    (folder / "bom.csv").write_bytes(b"\xef\xbb\xbf" + _cells().encode())
    (folder / "utf16.csv").write_text(_cells(), encoding="utf-16")
    for name in ("bom.csv", "utf16.csv"):
        assert main(["calibrate", "--cells", name, "--out", f"out_{name}", "--no-plot"]) == 0, capsys.readouterr().err
        cells = json.loads((folder / f"out_{name}" / "calibration.json").read_text())["cells"]
        assert [c["name"] for c in cells] == ["a", "b", "c", "d"] and cells[0]["saturation"] == 0.6
    (folder / "bom_outcomes.csv").write_bytes(b"\xef\xbb\xbf" + FILES["outcomes.csv"].encode())
    runs = ["run_a.json", "run_b.json", "run_c.json", "run_d.json"]
    assert main(["calibrate", *runs, "--outcomes", "bom_outcomes.csv", "--out", "out_runs", "--no-plot"]) == 0
    assert capsys.readouterr().err == ""


def test_ctrl_c_while_writing_keeps_the_previous_calibration_and_exits_130(folder, capsys, monkeypatch):
    from satmon.io import atomic

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "fsync", interrupted)
    before = snapshot(folder, folder_times=False)
    assert main(["calibrate", "--study", "--out", "prev"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("satmon calibrate: interrupted (Ctrl-C)") and "Traceback" not in err
    # the previous calibration.json is whole, no temporary is left
    assert snapshot(folder, folder_times=False) == before


def test_sigkill_while_writing_keeps_the_previous_calibration(folder):
    script = (
        "import os, signal, sys\n"
        "import satmon.io.atomic as atomic\n"
        "def killed(fd):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic.os.fsync = killed\n"
        "from satmon.cli.main import main\n"
        "sys.exit(main(['calibrate', '--study', '--out', 'prev']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == -9, proc.stderr
    assert (folder / "prev" / "calibration.json").read_text() == FILES["prev/calibration.json"]
    left = {p.name for p in (folder / "prev").iterdir()} - {"calibration.json", "calibration.png"}
    # the killed writer's: flocks dropped, files stay
    locks = {
        ".calibration.json.satmon-lock",
        ".calibration.png.satmon-lock",
    }
    assert locks <= left and all(n.startswith(".calibration.json.") and n.endswith(".tmp") for n in left - locks), left
    rerun = subprocess.run(
        [sys.executable, "-m", "satmon.cli.main", "calibrate", "--study", "--out", "prev"],
        check=False,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert rerun.returncode == 0, rerun.stderr
    assert "note: took over a stale lock on prev" in rerun.stderr and "which no longer runs" in rerun.stderr, (
        rerun.stderr
    )
    assert not locks & {p.name for p in (folder / "prev").iterdir()}


def test_a_full_disk_while_writing_is_exit_1_and_the_previous_files_stay(folder, capsys, monkeypatch):
    import errno

    from satmon.io import atomic

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    before = snapshot(folder, folder_times=False)
    assert main(["calibrate", "--study", "--out", "prev"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "satmon calibrate: could not write 'prev/calibration.json': No space left on device; the file that "
        "was there is as it was.\n"
    )
    assert snapshot(folder, folder_times=False) == before
