"""Every ```python block of the docs and the README runs; every `satmon ...` command in a ```bash
block parses (its subcommand answers --help)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.DOTALL)


def blocks(kind: str) -> list[tuple[str, int, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            if m.group(1) == kind:
                out.append((page.name, text[: m.start()].count("\n") + 1, m.group(2)))
    return out


def test_docs_have_blocks():
    assert len(blocks("python")) >= 6 and len(blocks("bash")) >= 3


@pytest.mark.parametrize(("page", "line", "code"), blocks("python"), ids=lambda v: str(v)[:40] if isinstance(v, str) else str(v))
def test_python_block_runs(page, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page}_{line}"}
    exec(compile(code, f"{page}:{line}", "exec"), namespace)


def satmon_commands() -> list[tuple[str, int, list[str]]]:
    found = []
    for page, line, code in blocks("bash"):
        for cmd in code.splitlines():
            for part in cmd.split("&&"):
                words = shlex.split(part.split("#")[0].strip()) if part.strip() else []
                if words and words[0] == "satmon":
                    found.append((page, line, words))
    return found


@pytest.mark.parametrize(("page", "line", "words"), satmon_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_satmon_command_parses(page, line, words):
    from satmon.cli.main import SUBCOMMANDS

    assert len(words) > 1 and words[1] in SUBCOMMANDS, f"{page}:{line}: unknown satmon command {words}"
    proc = subprocess.run([sys.executable, "-m", "satmon.cli.main", words[1], "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
