"""Shared fixtures of the grid's tests: one smoke grid run as a user runs it (the CLI, real submitit jobs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from grid_helpers import satmon_cli


@pytest.fixture(scope="session")
def smoke_grid(tmp_path_factory) -> tuple[Path, str]:
    """``satmon grid builtin --smoke`` into a fresh folder, two cells at a time through submitit's LocalExecutor."""
    cwd = tmp_path_factory.mktemp("smoke_grid")
    proc = satmon_cli("grid", "builtin", "--smoke", "--out", "g", "--jobs", "2", "--permutations", "50", cwd=cwd)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return cwd / "g", proc.stdout + proc.stderr
