"""Helpers of the grid's tests (a module of its own: a second conftest.py basename cannot be imported by name)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def satmon_cli(*args: str, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``satmon ARGS`` in a subprocess (the console script's entry point), piped."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from satmon.cli.main import main; sys.exit(main())", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
