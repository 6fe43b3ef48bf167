"""Shared fixtures of the grid's tests: one smoke grid run as a user runs it (the CLI, real submitit jobs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def satmon_cli(*args: str, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``satmon ARGS`` in a subprocess (the console script's entry point), piped."""
    return subprocess.run([sys.executable, "-c", "import sys; from satmon.cli.main import main; sys.exit(main())", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=env)


@pytest.fixture(scope="session")
def smoke_grid(tmp_path_factory) -> tuple[Path, str]:
    """``satmon grid builtin --smoke`` into a fresh folder, two cells at a time through submitit's LocalExecutor."""
    cwd = tmp_path_factory.mktemp("smoke_grid")
    proc = satmon_cli("grid", "builtin", "--smoke", "--out", "g", "--jobs", "2", "--permutations", "50", cwd=cwd)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return cwd / "g", proc.stdout + proc.stderr
