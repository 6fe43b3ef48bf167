"""The tree stays as ``ruff format`` writes it and ``ruff check`` finds nothing (pyproject's ``[tool.ruff]``: line
length 120, the rules and the few ignores with their reasons). ruff is pinned in the ``test`` extra: its formatter's
output changes between versions, so the check runs with the version the tree was formatted by."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = 'pip install -e ".[test]"'


def _pinned() -> str:
    found = re.search(r'"ruff==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert found, "pyproject.toml's test extra pins no ruff version (ruff==X.Y.Z): the format check needs one"
    return found.group(1)


def _ruff(*args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("ruff") is None:
        pytest.fail(f"ruff is not installed: {INSTALL} installs the version the tree is formatted with ({_pinned()})")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def _say(done: subprocess.CompletedProcess, fix: str) -> str:
    have, want = importlib.metadata.version("ruff"), _pinned()
    version = "" if have == want else f"\n(ruff {have} is installed, the tree is formatted by {want}: {INSTALL})"
    return f"{done.stdout}{done.stderr}\n{fix}{version}"


def test_ruff_check_finds_nothing():
    done = _ruff("check")
    assert done.returncode == 0, _say(done, "Fix these (`ruff check --fix .` does the safe ones).")


def test_the_tree_is_as_ruff_format_writes_it():
    done = _ruff("format", "--check")
    assert done.returncode == 0, _say(done, "Run `ruff format .` and commit the result.")


def test_the_pinned_ruff_is_the_one_installed():
    try:
        have = importlib.metadata.version("ruff")
    except importlib.metadata.PackageNotFoundError:
        have = "none"
    assert have == _pinned(), f"ruff {have} is installed, the tree is formatted by ruff {_pinned()}: {INSTALL}"
