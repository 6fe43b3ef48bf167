"""Data, never prose: what satmon writes for people (the verdict card, the console line) is never read back by code.

The run's scale (parameters, unique and planned tokens) travels as data with the verdict (``planned_forecast`` in the
verdict JSON, the hparams ``satmon/params`` / ``satmon/unique_tokens`` / ``satmon/planned_tokens``), and
``satmon report --plot`` places a run from those. A regular expression over the card's words, anywhere in the package,
fails :func:`test_no_module_parses_the_cards_text`; a run whose card carries no scale line at all is still placed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import satmon
from satmon.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
#: The card's fixed words (its line openings and the phrases its lines are built from).
CARD_WORDS = (
    "Phase diagram:",
    "parameters",
    "unique training tokens",
    "Forecast from the planned passes",
    "satmon verdict",
    "Caveat",
    "Checkpoint selection",
    "Trust:",
    "held-out accuracy",
    "tokens per parameter",
)
_REGEX_CALLS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "split", "sub", "subn"}


def _regexes_over_card_words(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _REGEX_CALLS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.args
        ):
            continue
        pattern = node.args[0]
        text = (
            pattern.value
            if isinstance(pattern, ast.Constant) and isinstance(pattern.value, str)
            else ast.unparse(pattern)
        )
        if any(w.lower() in text.lower() or w.replace(" ", r"\s") in text for w in CARD_WORDS) or "NOTE_PREFIX" in text:
            found.append((node.lineno, text[:80]))
    return found


@pytest.mark.parametrize(
    ("code", "caught"),
    [
        ('import re\n_NOTE = re.compile(re.escape(NOTE_PREFIX) + r" ([\\d,]+) parameters")', True),
        ('import re\nm = re.search(r"Forecast from the planned passes \\((\\S+)", card)', True),
        ('import re\nre.compile(r"^phase_.+\\.csv$")', False),
    ],
)
def test_a_regex_over_the_cards_words_is_caught_and_others_are_not(code, caught):
    assert bool(_regexes_over_card_words(code)) is caught


def test_no_module_parses_the_cards_text():
    found = [
        f"{p.relative_to(ROOT)}:{line}: {text}"
        for p in sorted((ROOT / "satmon").rglob("*.py"))
        for line, text in _regexes_over_card_words(p.read_text(encoding="utf-8"))
    ]
    assert not found, "a module reads prose back (write the value as data beside it instead):\n" + "\n".join(found)


def test_report_plot_places_a_run_from_its_data_whatever_its_card_says(tmp_path, capsys):
    """A plain Screen's card has no phase-diagram line at all: the plot places the run from the verdict's data."""
    pytest.importorskip("matplotlib")
    model = torch.nn.Sequential(satmon.DyT(64, alpha_init=2.0), torch.nn.Linear(64, 64))
    screen = satmon.Screen(window=2, unique_tokens=400_000, planned_tokens=512_000, logdir=tmp_path / "run")
    screen.attach(model)
    for _ in range(2):
        screen.step(model(torch.randn(4, 64)).float().mean())
    screen.finish()
    assert "Phase diagram:" not in screen.card()
    assert main(["report", str(tmp_path), "--plot", "--plot-file", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "1 run(s) placed" in out and "not placed" not in out
