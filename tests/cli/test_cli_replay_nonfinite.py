"""``satmon replay`` on a diverged checkpoint: NON-FINITE in the verdict, so in every output that shows it.

The issue's case: NaN in the output head, after every DyT layer, so every DyT input stays finite. The
checkpoint's verdict must say ``non-finite`` (not GO): in the JSON record, the console table, the
summary line, the markdown report and the exit code (3). A clean checkpoint beside it reads as before.
"""

from __future__ import annotations

import json

import pytest
import torch

from satmon.cli.main import main

FACTORY_SRC = (
    "from satmon.demos.gpt import GPT, GPTConfig\n"
    "def build():\n    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=8.0))\n"
)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "factory.py").write_text(FACTORY_SRC)
    ns: dict = {}
    exec(FACTORY_SRC, ns)  # noqa: S102 (the factory written above)
    torch.manual_seed(0)
    model = ns["build"]()
    (tmp_path / "w").mkdir()
    torch.save({"model": model.state_dict(), "iter_num": 10}, tmp_path / "w" / "a_clean.pt")
    state = model.state_dict()
    head = [k for k in state if k.endswith("weight") and state[k].dim() == 2][-1]  # the last matrix: after every DyT
    state[head] = state[head].clone()
    state[head][0, 0] = float("nan")
    torch.save({"model": state, "iter_num": 20}, tmp_path / "w" / "b_diverged.pt")
    torch.save(torch.randint(0, 256, (8, 16), generator=torch.Generator().manual_seed(0)), tmp_path / "calib.pt")
    return tmp_path, head


def test_a_nan_weight_after_the_dyt_layers_reads_nonfinite_everywhere(project, capsys):
    root, head = project
    rc = main(
        [
            "replay",
            "w",
            "--factory",
            "./factory.py:build",
            "--data",
            "calib.pt",
            "--json",
            "r.json",
            "--report",
            "r.md",
            "--no-twin",
            "--logdir",
            "tb",
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 3
    records = {r["global_step"]: r for r in json.loads((root / "r.json").read_text())}
    clean, bad = records[10]["verdict"], records[20]["verdict"]
    assert clean["decision"] in ("go", "no-go") and clean["nonfinite_weights"] == 0
    assert bad["decision"] == "non-finite" and bad["nonfinite_weights"] == 1 and bad["nonfinite"] == 0
    assert "weight (1)" in bad["reason"]  # named (the tied embedding when the head is tied to it)
    row = next(line for line in out.splitlines() if "b_diverged.pt" in line)
    assert "NON-FINITE" in row and "GO " not in row.replace("NO-GO", "")
    summary = next(line for line in out.splitlines() if line.startswith("Last checkpoint"))
    assert summary.startswith("Last checkpoint (step 20): NON-FINITE")
    report = (root / "r.md").read_text()
    assert "NON-FINITE" in report and "non-finite" in report.lower()
