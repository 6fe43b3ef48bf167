"""A tiny recipe whose cells are held in place: the grid's interrupt and edit tests act on a job that is waiting,
never on one the machine may already have finished.

Copied into a test's folder as ``held.py`` and named ``held.py:RECIPE``. With ``SATMON_TEST_HOLD=FOLDER`` set (the
jobs inherit it), each cell's ``data(spec)`` writes ``FOLDER/started.<pid>`` and then waits until ``FOLDER/release``
exists; without it a cell runs straight through. ``MARK`` is recorded in every cell (``describe``): a test edits it
to see which code trained a cell. The option ``nan_at`` (default 0: never) makes the DyT arm's training loss NaN from
that step on: a diverged arm on demand.
"""

import os
import time
from pathlib import Path

import torch

import satmon
from satmon.grid import CellData, Recipe
from satmon.grid.recipe import lm_loss

MARK = "first"
V, T = 11, 6


def data(spec):
    hold = os.environ.get("SATMON_TEST_HOLD")
    if hold:
        (Path(hold) / f"started.{os.getpid()}").write_text(spec.size)
        deadline = time.monotonic() + 600  # a test that died leaves no job waiting forever
        while not (Path(hold) / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    toks = torch.arange(spec.unique_tokens) % V

    def train():
        g = torch.Generator().manual_seed(spec.seed)
        while True:
            s = torch.randint(0, toks.numel() - T - 1, (2,), generator=g)
            c = toks[s[:, None] + torch.arange(T + 1)]
            yield c[:, :-1], c[:, 1:]

    x = toks[: 4 * T].view(4, T)
    return CellData(
        train=train,
        val_inputs=x,
        val_targets=(x + 1) % V,
        probe=[x],
        example_input=x[:2],
        unique_tokens=spec.unique_tokens,
    )


def model(spec, norm):
    torch.manual_seed(spec.seed)
    m = torch.nn.Sequential(torch.nn.Embedding(V, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, V))
    m.nan_at = spec.options["nan_at"]
    m.steps_seen = 0
    return satmon.convert_to_dyt(m) if norm == "dyt" else m


def loss(m, x, y):
    out = lm_loss(m, x, y)
    if m.training:
        m.steps_seen += 1
        if m.nan_at and m.steps_seen >= m.nan_at and satmon.find_dyt_layers(m):
            return out * float("nan")
    return out


RECIPE = Recipe(
    "held",
    data=data,
    model=model,
    tokens_per_step=2 * T,
    loss=loss,
    options={"nan_at": 0},
    describe=lambda spec: {"mark": MARK},
    presets={
        "smoke": {
            "sizes": ("a",),
            "budgets": ("100",),
            "seeds": (0,),
            "settings": {"steps": 6, "window": 3, "warmup": 1, "eval_every": 3, "series_every": 1, "offset_every": 1},
        }
    },
)
