"""README's first screen and the release record hold what they promise.

- README's block between ``<!-- satmon.study:worth ...-->`` and ``<!-- /satmon.study -->`` is exactly what
  ``.ci/readme_study.py`` renders from ``satmon.study`` (``python .ci/readme_study.py`` rewrites it), and it sits on the
  first screen.
- README's test command is the one ``.ci/run`` runs (CI adds its reports after it, nothing before).
- CHANGELOG.md is in Keep a Changelog form: at most one ``[Unreleased]`` section, each release dated, the newest
  dated release is ``satmon.__version__``, lines a person reads (no issue numbers, no development rounds).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_SCREEN = 50  # lines


@pytest.fixture(scope="module")
def readme_study():
    spec = importlib.util.spec_from_file_location("readme_study", ROOT / ".ci" / "readme_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_block_is_what_satmon_study_renders(readme_study):
    text = README.read_text(encoding="utf-8")
    assert readme_study.block(text) == readme_study.render(), (
        "README.md's satmon.study block differs from satmon.study: run python .ci/readme_study.py"
    )


def test_the_block_is_on_the_first_screen_and_names_each_decision(readme_study):
    lines = README.read_text(encoding="utf-8").splitlines()
    end = lines.index(readme_study.END) + 1
    assert end <= FIRST_SCREEN, f"the worth block ends on line {end}, past the first screen ({FIRST_SCREEN} lines)"
    block = "\n".join(lines[:end])
    for word in ("**GO**", "**NO-GO**", "worth", "collapse"):
        assert word in block


def test_the_block_follows_satmon_study(readme_study, monkeypatch):
    """The render reads satmon.study at call time: a changed WORTH changes the block (so a stale README fails)."""
    from satmon import study

    before = readme_study.render()
    monkeypatch.setattr(study, "WORTH", "a sentence only this test writes")
    after = readme_study.render()
    assert after != before and "A sentence only this test writes." in after


def test_check_fails_on_a_stale_block_and_the_rewrite_fixes_it(readme_study, tmp_path, monkeypatch):
    stale = README.read_text(encoding="utf-8").replace("**NO-GO**: ", "**NO-GO**: stale ", 1)
    copy = tmp_path / "README.md"
    copy.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(readme_study, "README", copy)
    assert readme_study.main(["--check"]) == 1
    assert readme_study.main([]) == 0 and readme_study.main(["--check"]) == 0
    assert copy.read_text(encoding="utf-8") == README.read_text(encoding="utf-8")


def test_a_missing_marker_is_one_clear_error(readme_study):
    with pytest.raises(ValueError, match="Expected README.md to hold"):
        readme_study.block("no markers here")


def _readme_test_command() -> list[str]:
    """The words of README's pytest command (the part after ``&&`` of its line that runs pytest, comment dropped)."""
    for line in README.read_text(encoding="utf-8").splitlines():
        if "-m pytest" in line and "&&" in line:
            return shlex.split(line.split("&&", 1)[1], comments=True)
    raise AssertionError("README.md has no `pip install ... && ... python -m pytest ...` line")


def test_ci_runs_the_readme_test_command():
    want = _readme_test_command()
    assert want[:3] == ["OMP_NUM_THREADS=1", "python", "-m"] and "-n" in want and "--dist" in want, want
    runs = [
        shlex.split(line, comments=True)
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if "-m pytest" in line and not line.lstrip().startswith("#")
    ]
    assert len(runs) == 1 and runs[0][: len(want)] == want, f".ci/run runs {runs}, README says {want}"


def test_the_test_extra_has_what_the_command_needs():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(r.startswith("pytest-xdist") for r in extra) and any(r.startswith("pytest") for r in extra)


# ------------------------------------------------------------------------------------------------ CHANGELOG
_RELEASE = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")


def _releases() -> list[tuple[str, str | None]]:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    out = []
    for head in heads:
        m = _RELEASE.match(head)
        assert m, f"CHANGELOG.md: {head!r} is not '## [X.Y.Z] - YYYY-MM-DD' or '## [Unreleased]'"
        out.append((m["version"], m["date"]))
    return out


def test_changelog_names_releases():
    from satmon import __version__

    releases = _releases()
    unreleased = [i for i, (v, _) in enumerate(releases) if v == "Unreleased"]
    assert unreleased in ([], [0]), "at most one [Unreleased] section, and it comes first"
    dated = [(v, d) for v, d in releases if v != "Unreleased"]
    assert all(d for v, d in dated if v != "0.1.0"), f"every release but 0.1.0 is dated: {dated}"
    assert dated[0][0] == __version__, f"the newest dated release is {dated[0][0]}, satmon says {__version__}"
    versions = [tuple(int(x) for x in v.split(".")) for v, _ in dated]
    assert versions == sorted(versions, reverse=True), "releases newest first"


def test_changelog_lines_are_lines_a_person_reads():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert not re.search(r"\bissues?\s+\d+|\bround\s+\d+", text, re.IGNORECASE | re.MULTILINE), (
        "CHANGELOG.md names an issue or a development round"
    )
    entries = [" ".join(e.split()) for e in re.findall(r"^- .*(?:\n  .*)*", text, re.MULTILINE)]
    long = [e[:60] for e in entries if len(e) > 400]
    assert entries and not long, f"CHANGELOG entries over 400 characters (split them): {long}"
    assert max(len(line) for line in text.splitlines()) <= 120, "CHANGELOG lines wrap at 120 characters"
    sections = set(re.findall(r"^### (.+)$", text, re.MULTILINE))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, sections
