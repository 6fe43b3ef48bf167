"""The `satmon` entry point: help and version start without torch or Lightning, the conventions of
argparse (usage on stderr and exit 2 for a usage error), a help line for every flag, plain-text help."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from satmon.cli import calibrate, demo, grid, report
from satmon.cli.main import SUBCOMMANDS, _parser, main

ROOT = Path(__file__).resolve().parents[2]
#: what a help or version line must never load: the frameworks (seconds each) and the readers' stacks
HEAVY = (
    "torch",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
    "transformers",
    "tensorboard",
    "matplotlib",
    "numpy",
)
PARSERS = {
    "satmon": _parser,
    "demo": demo._parser,
    "report": report._parser,
    "calibrate": calibrate._parser,
    "grid": grid._parser,
}

LOADED = """
import contextlib, io, json, sys
from satmon.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def loaded(*argv: str) -> dict:
    """Run ``satmon ARGV`` in a fresh interpreter; its exit code, stdout and every module it loaded."""
    proc = subprocess.run(
        [sys.executable, "-c", LOADED, *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv", [["--help"], ["-h"], ["--version"], *([c, "--help"] for c in SUBCOMMANDS)], ids=lambda a: " ".join(a)
)
def test_help_and_version_load_no_framework(argv):
    got = loaded(*argv)
    assert got["code"] == 0 and got["out"].strip()
    heavy = sorted(m for m in got["modules"] if m.split(".")[0] in HEAVY)
    assert heavy == [], f"satmon {' '.join(argv)} loaded {heavy[:8]}"


def test_the_module_check_can_fail(tmp_path):
    """The same probe sees the heavy stack when a command does its work (calibrate draws its plot)."""
    got = loaded("calibrate", "--study", "--out", str(tmp_path))
    assert got["code"] == 0 and {"matplotlib", "numpy"} <= {m.split(".")[0] for m in got["modules"]}


def test_bare_satmon_prints_usage_on_stderr_and_exits_2(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: satmon") and "the following arguments are required: COMMAND" in err


def test_help_lists_every_command_and_exits_0(capsys):
    assert main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("usage: satmon")
    for name, (_, line) in SUBCOMMANDS.items():
        assert f"  {name}" in out and line in out
    assert "exit codes:" in out


def test_version(capsys):
    from satmon import __version__

    assert main(["--version"]) == 0 and capsys.readouterr().out == f"satmon {__version__}\n"


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_has_a_help_line(name):
    parser = PARSERS[name]()
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, (
            f"{name}: {action.option_strings or action.dest} has no help"
        )


@pytest.mark.parametrize("name", PARSERS)
def test_help_is_plain_text_and_documents_exit_codes(name):
    text = PARSERS[name]().format_help()
    markup = re.search(r"``|:(func|mod|class|data|meth|attr):`|\*\*\w[^*]*\*\*|^\.\. ", text, re.MULTILINE)
    assert markup is None, f"{name} --help shows reST markup {markup.group()!r}"
    assert re.search(r"exit codes: 0 ", text), f"{name} --help documents no exit codes"


def test_subcommand_help_goes_to_stdout_and_exits_0(capsys):
    for name in ("demo", "report", "calibrate", "grid"):
        assert main([name, "--help"]) == 0
        out, err = capsys.readouterr()
        assert out.startswith(f"usage: satmon {name}") and err == ""


def test_every_usage_error_exits_2(capsys):
    for argv in (
        ["demo", "--window"],
        ["report"],
        ["calibrate", "--rule"],
        ["demo", "--bogus"],
        ["calibrate", "--bogus"],
        ["grid"],
        ["grid", "builtin", "--jobs", "0"],
        ["grid", "builtin", "--time", "soon"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("usage: satmon") and "error:" in err.splitlines()[-1]


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "main", interrupted)
    assert main(["report", "x"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("satmon report: interrupted (Ctrl-C)")


def test_the_demo_refuses_before_it_builds_anything(monkeypatch, capsys, tmp_path):
    """Each check runs on the parsed flags alone: run_demo (the only place that imports torch) is never reached."""

    def never(*_):
        raise AssertionError("built")

    monkeypatch.setattr(demo, "run_demo", never)
    assert main(["demo", "--window", "0"]) == 2
    assert "argument --window: expected an integer >= 1, got '0'" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main(["demo", "--logdir", str(tmp_path / "f")]) == 2
    assert "Expected --logdir to name a folder" in capsys.readouterr().err


def test_no_study_number_is_restated_in_the_cli():
    """The study's numbers come from satmon.study: the demo's default threshold is none, so its rule is the study's."""
    from satmon import Settings, study

    default = demo._parser().parse_args([]).threshold
    assert default is None and Settings(threshold=default).rule == Settings().rule
    assert Settings().rule.threshold == study.THRESHOLD and Settings().rule.threshold_source == "study"
    for path in [
        *(ROOT / "satmon" / "cli" / f"{n}.py" for n in ("main", "demo", "report", "calibrate")),
        *(ROOT / "satmon" / "calibrate").glob("*.py"),
        *(ROOT / "satmon" / "io" / n for n in ("atomic.py", "json_records.py", "markdown.py", "tensorboard_reader.py")),
    ]:
        assert not re.search(r"(?<![\d.])0\.43(?!\d)", path.read_text()), path
