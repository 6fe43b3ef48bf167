"""Running the examples: as scripts (a subprocess) or in-process with a float64 recorder of every DyT
input (``reference.InputRecorder``), the reference the examples' verdicts are checked against."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from reference import InputRecorder
from satmon import DyT

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_script(script: str, *args: str, cwd: Path) -> str:
    """Run ``examples/<script> args`` in ``cwd``; its stdout (the test fails on a non-zero exit)."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (its ``main`` guard keeps it from running)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (and spawned workers) look the module up by name
    spec.loader.exec_module(module)
    return module


def dyt_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, DyT)]


@pytest.fixture
def recorded_lit(monkeypatch):
    """Patch ``satmon.demos.lit.LitLM`` so that every instance an example builds records its DyT
    inputs of training forwards in float64; yields the list of recorders (one per model built)."""
    import satmon.demos.lit as lit_module

    recorders: list[InputRecorder] = []

    class RecordingLitLM(lit_module.LitLM):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            recorders.append(InputRecorder(self, dyt_names(self)))

    monkeypatch.setattr(lit_module, "LitLM", RecordingLitLM)
    threads, level = torch.get_num_threads(), logging.getLogger("lightning.pytorch").level
    yield recorders
    torch.set_num_threads(threads)
    logging.getLogger("lightning.pytorch").setLevel(level)
