"""Does the 500-step screen predict DyT's effect? The regime study's protocol at CPU scale, pre-registered.

The regime study (Verma, 2026) trains every cell for 5,000 steps, whatever its token budget, with a
2,000-step linear warm-up and then an essentially constant learning rate; its 0.43 threshold was fit
on the step-5,000 checkpoints, and its recipe applies it to a 500-step window (inside the warm-up).
This script is that protocol, difference by difference, at a size a CPU trains (docs/calibration.md
puts the two side by side; docs/grid_plan.md is the analysis, committed before the full run).

Each cell (a model size, a unique-token budget, a seed) trains satmon's GPT-2-style demo model twice
from the same initial weights and on the same batches, once with LayerNorm and once with DyT
(``alpha_init`` 2.0, no bias anywhere, dropout 0, GPT-2 init with embeddings unscaled, AdamW with
weight decay 0.1 on matrices, clipping 1.0), and records:

- the window, from ``satmon.Screen`` over the DyT run's first ``window`` steps: the verdict's pooled,
  per-layer, first-block, last-block, final-norm and centered saturation, and the series every 50
  steps (``window_series``: each 50-step segment's pooled and per-layer saturation, the running
  total, each layer's alpha);
- both arms' training loss (mean of each 50 steps) and held-out loss curves, alpha per layer over
  training;
- the final checkpoint by the study's protocol: ``satmon.probe`` in eval mode under bf16 autocast on
  training-split sequences (and on held-out ones), per layer, pooled, first block, centered;
- DyT's effect ``delta = (DyT - LayerNorm) / LayerNorm`` on the final held-out loss (negative: DyT
  helps), whether each arm ended below the unigram level, unique tokens per parameter.

    python examples/regime_grid.py                       # the full grid: 2 sizes x 4 budgets x 2 seeds (~2 CPU-hours)
    python examples/regime_grid.py --quick               # 2 of its cells (same numbers on the same machine), ~15 CPU-minutes
    python examples/regime_grid.py --sizes d64L2,d80L2 --budgets 164ep,1.4ep --seeds 2,3 --out more
    python examples/regime_grid.py --report docs/faithful_grid.json --plot docs/img/faithful_grid.png

``--budgets`` takes epochs (``164ep``: the number of passes over the unique bytes in ``steps``
steps) or bytes (``31220``, ``64k``, ``3.5M``). Every finished cell is cached as
``OUT/cells/<name>.json`` and reused only when it was made with the same configuration and code
version: a stopped run resumes where it stopped. When every cell is done, ``OUT/faithful_grid.json``
holds them with the environment and configuration (``satmon calibrate --cells OUT/faithful_grid.json
--metric READING`` reads it), ``OUT/report.md`` the pre-registered analysis, and ``OUT/calibrate/``
the output of ``satmon calibrate`` for every window reading. The plot needs matplotlib
(``pip install -e ".[report]"``); without it the script says so in one line and writes the rest.

Reproducibility: one thread per cell, seeded data and weights: a cell re-run on the same machine with
the same torch gives the same bytes (tests/examples/test_example_regime_grid.py checks it). Across
machines the floating-point kernels differ; docs/calibration.md gives the tolerance measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

#: The window readings the plan tests (docs/grid_plan.md), in its order; each predicts GO when high.
WINDOW_READINGS = ("window_saturation", "window_first_block", "window_last_block", "window_final_norm",
                   "window_centered", "window_late")
#: The final checkpoint's readings by the study's protocol (does the study's own claim hold here?).
FINAL_READINGS = ("final_saturation", "final_first_block", "final_last_block", "final_final_norm", "final_centered")
#: Known before training: log10(parameters / unique training tokens), high = over-parameterised (GO expected).
PRIOR_READINGS = ("log_params_per_token",)
READINGS = WINDOW_READINGS + FINAL_READINGS + PRIOR_READINGS
#: The study's figures on its 12 cells (docs/science.md).
STUDY_THRESHOLD, STUDY_IN_SAMPLE, STUDY_LOSO = 0.43, 0.75, 0.50
#: The plan's bar (docs/grid_plan.md): family-wise permutation p-value and AUC a window reading must reach.
P_BAR, AUC_BAR = 0.05, 0.75
FORMAT = "satmon-faithful-grid/1"


# ---------------------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Size:
    """One model size, named ``d<width>L<blocks>`` (optionally ``H<heads>``, default 4): a group of the grid."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int = 4

    @classmethod
    def parse(cls, text: str) -> Size:
        m = re.fullmatch(r"d(\d+)L(\d+)(?:H(\d+))?", text.strip())
        if m is None:
            raise ValueError(f"Expected a size like 'd64L2' (width 64, 2 blocks) or 'd96L3H4', got {text!r}.")
        d, n, h = int(m[1]), int(m[2]), int(m[3] or 4)
        if d < 1 or n < 1 or h < 1 or d % h:
            raise ValueError(f"Expected width, blocks and heads >= 1 with the width a multiple of the heads, got {text!r}.")
        return cls(text.strip(), d, n, h)


@dataclass(frozen=True)
class Budget:
    """A unique-token budget: ``epochs`` passes over the unique bytes in ``steps`` steps, or ``bytes`` directly."""

    text: str
    epochs: float | None = None
    nbytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        t = text.strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)ep", t)
        if m:
            if not float(m[1]) > 0:
                raise ValueError(f"Expected a positive number of epochs, got {text!r}.")
            return cls(t, epochs=float(m[1]))
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kM]?)", t)
        if m is None:
            raise ValueError(f"Expected a budget in epochs ('164ep') or bytes ('31220', '64k', '3.5M'), got {text!r}.")
        n = float(m[1]) * {"": 1, "k": 1_000, "M": 1_000_000}[m[2]]
        if n != int(n):
            raise ValueError(f"Expected a whole number of bytes, got {text!r}.")
        return cls(t, nbytes=int(n))

    def resolve(self, processed: int) -> int:
        """Bytes of unique training text, given the bytes the run processes (steps x batch x sequence)."""
        return self.nbytes if self.nbytes is not None else round(processed / self.epochs)


@dataclass(frozen=True)
class GridConfig:
    """The grid's axes and everything every cell shares (docs/calibration.md: the study's value beside each).

    The schedule is the study's ``train.py``: a linear warm-up to ``lr`` over ``warmup`` steps
    (``lr * (i + 1) / (warmup + 1)`` at update ``i``), then constant (its cosine horizon, 600k steps,
    is never reached in 5k). Weight decay applies to matrices only (nanoGPT's ``configure_optimizers``).
    """

    sizes: tuple[Size, ...]
    budgets: tuple[Budget, ...]
    seeds: tuple[int, ...]
    steps: int = 5_000
    window: int = 500
    warmup: int = 2_000
    seq_len: int = 64
    batch_size: int = 16
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    alpha_init: float = 2.0
    emb_scale: float = 1.0  # GPT-2: embeddings unscaled (0.3's grid used sqrt(width))
    bias: bool = False
    dropout: float = 0.0
    val_tokens: int = 65_536
    val_offset: int = 4_400_000  # the held-out split starts here, after every training budget
    probe_sequences: int = 400  # 400 x 64 = 25,600 tokens: the study's 50 sequences of 512
    probe_batch: int = 50
    eval_every: int = 250
    series_every: int = 50
    offset_every: int = 10  # the screen's sampled offset statistics (its default)
    #: How a cell's unique bytes are drawn: "prefix" (0.4's faithful grid: the corpus prefix, shared by every seed)
    #: or "chunks" (the second grid, docs/grid2_plan.md: ``chunk_bytes`` chunks of the training split chosen per
    #: seed; the budgets of one seed are nested, the seeds draw different text).
    data: str = "prefix"
    chunk_bytes: int = 2_048
    #: Budgets per size where a size runs fewer than ``budgets`` (``(("d96L3", (Budget, ...)),)``); others run all.
    size_budgets: tuple[tuple[str, tuple[Budget, ...]], ...] = ()

    @property
    def processed(self) -> int:
        """Bytes one arm processes over the run (steps x batch x sequence)."""
        return self.steps * self.batch_size * self.seq_len

    def budget_bytes(self) -> tuple[int, ...]:
        return tuple(b.resolve(self.processed) for b in self.budgets)

    def budgets_of(self, size: Size) -> tuple[Budget, ...]:
        """The budgets ``size`` runs: its entry in ``size_budgets``, else every budget."""
        return dict(self.size_budgets).get(size.name, self.budgets)

    def check(self) -> None:
        """Refuse a grid that cannot answer the question, naming the option."""
        for name in ("steps", "window", "seq_len", "batch_size", "eval_every", "series_every", "offset_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"Expected --{name.replace('_', '-')} >= 1, got {getattr(self, name)}.")
        if not 0 <= self.warmup <= self.steps:
            raise ValueError(f"Expected 0 <= --warmup <= --steps, got warmup={self.warmup}, steps={self.steps}.")
        if self.window >= self.steps:
            raise ValueError(f"Expected --window < --steps (a final checkpoint after the window), got window="
                             f"{self.window}, steps={self.steps}.")
        if not (self.sizes and self.budgets and self.seeds):
            raise ValueError("Expected at least one size, one budget and one seed.")
        for axis in ("sizes", "budgets", "seeds"):
            keys = [getattr(v, "name", getattr(v, "text", v)) for v in getattr(self, axis)]
            if len(set(keys)) != len(keys):
                raise ValueError(f"Expected distinct --{axis}, got {keys}.")
        if self.data not in ("prefix", "chunks"):
            raise ValueError(f"Expected data 'prefix' or 'chunks', got {self.data!r}.")
        if self.chunk_bytes <= self.seq_len + 1:
            raise ValueError(f"Expected chunk_bytes > seq_len + 1 = {self.seq_len + 1}, got {self.chunk_bytes}.")
        names = {s.name for s in self.sizes}
        for name, budgets in self.size_budgets:
            if name not in names:
                raise ValueError(f"Expected size_budgets to name sizes of the grid {sorted(names)}, got {name!r}.")
            if {b.text for b in budgets} - {b.text for b in self.budgets}:
                raise ValueError(f"Expected the budgets of {name} among the grid's budgets, got {[b.text for b in budgets]}.")
        nbytes = self.budget_bytes()
        if max(nbytes) + self.seq_len >= self.val_offset:
            raise ValueError(f"Expected every budget below the held-out split ({self.val_offset:,} bytes), got "
                             f"{max(nbytes):,} bytes: use fewer bytes or more epochs.")
        if min(nbytes) <= self.seq_len + 1:
            raise ValueError(f"Expected budgets of more than seq_len + 1 = {self.seq_len + 1} bytes, got {min(nbytes)}.")
        if len(set(nbytes)) != len(nbytes):
            raise ValueError(f"Expected distinct budgets, got {nbytes} bytes.")

    def shared(self) -> dict[str, Any]:
        """What a cached cell must have been made with to be reused (everything but the axes)."""
        d = asdict(self)
        for axis in ("sizes", "budgets", "seeds", "size_budgets"):
            d.pop(axis)
        if self.data == "prefix":  # 0.4's cells were made before these fields existed: their cache keys stay the same
            d.pop("data")
            d.pop("chunk_bytes")
        return json.loads(json.dumps(d))


SIZES = (Size("d64L2", 64, 2), Size("d96L3", 96, 3))
#: The study's passes over the unique data at 64M (1M / 10M / 50M / 118M tokens in 5,000 steps of 64 x 512).
STUDY_EPOCHS = ("164ep", "16ep", "3.3ep", "1.4ep")
FULL = GridConfig(sizes=SIZES, budgets=tuple(Budget.parse(b) for b in STUDY_EPOCHS), seeds=(0, 1))
#: The second grid (docs/grid2_plan.md, issue 34): budgets between 3.3 and 164 passes, a third size, new seeds,
#: each cell's budget drawn as chunks chosen per seed.
GRID2_EPOCHS = ("3.3ep", "16ep", "32ep", "64ep", "100ep", "164ep")
GRID2 = GridConfig(sizes=(Size("d48L2", 48, 2), Size("d64L2", 64, 2), Size("d96L3", 96, 3)),
                   budgets=tuple(Budget.parse(b) for b in GRID2_EPOCHS), seeds=(2, 3), data="chunks",
                   size_budgets=(("d96L3", tuple(Budget.parse(b) for b in ("32ep", "64ep", "100ep"))),))
MODES = {
    "full": FULL,
    "grid2": GRID2,
    # two cells of the full grid, same settings (the same numbers on the same machine; its cache serves the full run)
    "quick": replace(FULL, sizes=SIZES[:1], budgets=(FULL.budgets[0], FULL.budgets[-1]), seeds=(0,)),
    "smoke": GridConfig(sizes=(Size("d16L1", 16, 1, 2), Size("d24L1", 24, 1, 2)),
                        budgets=(Budget.parse("2000"), Budget.parse("20000")), seeds=(0,), steps=8, window=4, warmup=3,
                        seq_len=16, batch_size=4, val_tokens=1_024, val_offset=40_000, probe_sequences=8, probe_batch=4,
                        eval_every=4, series_every=2, offset_every=1, alpha_init=2.0, emb_scale=40.0),
}


def cell_keys(cfg: GridConfig) -> list[tuple[Size, Budget, int]]:
    """Every cell of the grid, seed by seed (a stopped grid holds whole replicates), within a seed the largest
    model first (the slow ones start first: the pool stays busy)."""
    keys = [(s, b, seed) for s in cfg.sizes for b in cfg.budgets_of(s) for seed in cfg.seeds]
    return sorted(keys, key=lambda k: (cfg.seeds.index(k[2]), -cost(k[0])))


def cost(size: Size) -> float:
    """Relative cost of one step of a size (matmul work ~ layers x width^2, plus the byte embedding)."""
    return size.n_layers * size.d_model ** 2 * 12 + 256 * size.d_model * 2


def cell_name(cfg: GridConfig, size: Size, budget: Budget, seed: int) -> str:
    return f"{size.name}_t{budget.resolve(cfg.processed)}_s{seed}"


# ------------------------------------------------------------------------------------------------ data
def _quiet() -> None:
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    import logging

    logging.getLogger("satmon").setLevel(logging.ERROR)


def corpus(cfg: GridConfig):
    """``(train_tokens_all, val_inputs, val_targets)``: the corpus prefix the budgets cut from, and the
    held-out split as non-overlapping ``(N, seq_len)`` windows (the same bytes for every cell)."""
    from satmon.demos.corpus import corpus_tokens

    tokens = corpus_tokens(cfg.val_offset + cfg.val_tokens + 1)
    val = tokens[cfg.val_offset:]
    n = (val.numel() - 1) // cfg.seq_len
    x = val[: n * cfg.seq_len].view(n, cfg.seq_len)  # (N, T)
    y = val[1 : n * cfg.seq_len + 1].view(n, cfg.seq_len)  # (N, T)
    return tokens[: cfg.val_offset], x, y


def unigram_loss(train: Any, val_targets: Any) -> float:
    """Held-out loss (nats/byte) of add-one byte frequencies of the training split: the loss of a
    model that ignores the context. A run that ends at or above it has learnt nothing else."""
    import torch

    p = torch.bincount(train, minlength=256).double() + 1.0
    return float(-(p / p.sum()).log()[val_targets.reshape(-1)].mean())


def cell_tokens(cfg: GridConfig, train_all: Any, nbytes: int, seed: int) -> Any:
    """The ``nbytes`` unique training bytes of a cell.

    ``data="prefix"`` (0.4's faithful grid): the corpus prefix, the same text for every seed. ``data="chunks"``
    (the second grid): the training split cut into ``chunk_bytes`` chunks, shuffled by a generator seeded with the
    cell's seed; the budget is the first ``ceil(nbytes / chunk_bytes)`` chunks of that order, concatenated and cut
    to ``nbytes``. So the budgets of one seed are nested (a smaller budget's text is inside a larger one's) and two
    seeds train on different text; the held-out split (from ``val_offset``) is never drawn.
    """
    import torch

    if cfg.data == "prefix":
        return train_all[:nbytes]
    c = cfg.chunk_bytes
    n_chunks = train_all.numel() // c
    need = -(-nbytes // c)
    if need > n_chunks:
        raise ValueError(f"Expected a budget of at most {n_chunks * c:,} bytes ({n_chunks} chunks of {c}), got {nbytes:,}.")
    order = torch.randperm(n_chunks, generator=torch.Generator().manual_seed(1_000_003 + seed))  # (n_chunks,)
    chunks = train_all[: n_chunks * c].view(n_chunks, c)[order[:need]]  # (need, c)
    return chunks.reshape(-1)[:nbytes].clone()


class Batches:
    """Random ``(B, T)`` windows of the training split from a seeded generator (the study's ``get_batch``):
    both arms of a cell draw the same batches in the same order."""

    def __init__(self, tokens: Any, batch_size: int, seq_len: int, seed: int) -> None:
        import torch

        self.tokens, self.B, self.T = tokens, batch_size, seq_len
        self.g = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1)  # (T + 1,)

    def __next__(self):
        import torch

        starts = torch.randint(0, self.tokens.numel() - self.T - 1, (self.B,), generator=self.g)  # (B,)
        chunk = self.tokens[starts[:, None] + self.offsets]  # (B, T + 1)
        return chunk[:, :-1], chunk[:, 1:]


# --------------------------------------------------------------------------------------------- training
def build_model(cfg: GridConfig, size: Size, norm: str, seed: int):
    """The demo GPT with ``norm``; seeded, so both arms of a cell start from the same weights (the norms
    draw no random numbers)."""
    import torch

    from satmon.demos.gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(d_model=size.d_model, n_layers=size.n_layers, n_heads=size.n_heads, seq_len=cfg.seq_len,
                         norm=norm, alpha_init=cfg.alpha_init, emb_scale=cfg.emb_scale, bias=cfg.bias,
                         dropout=cfg.dropout))


def count_params(model: Any) -> tuple[int, int]:
    """``(params, params_total)``: nanoGPT's ``get_num_params`` (all but the position embedding; the tied
    token embedding counted once), as the study sizes its models, and every parameter."""
    total = sum(p.numel() for p in model.parameters())
    return total - model.pos_emb.weight.numel(), total


def lm_loss(model: Any, x: Any, y: Any):
    import torch.nn.functional as F

    logits = model(x)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def val_loss(model: Any, x: Any, y: Any, batch: int = 128) -> float:
    """Mean next-byte loss over every held-out window (eval mode, float32, no grad)."""
    import torch

    was = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            total += float(lm_loss(model, x[i:i + batch], y[i:i + batch])) * x[i:i + batch].shape[0]
    model.train(was)
    return total / x.shape[0]


def lr_factor(cfg: GridConfig, i: int) -> float:
    """The study's schedule at update ``i`` (0-based): linear warm-up, then constant."""
    return (i + 1) / (cfg.warmup + 1) if i < cfg.warmup else 1.0


def optimizer(cfg: GridConfig, model: Any):
    """AdamW, decay on matrices only, the study's warm-up then a constant rate (see :class:`GridConfig`)."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=cfg.betas)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda i: lr_factor(cfg, i))


def alphas(model: Any) -> dict[str, float]:
    from satmon import find_dyt_layers

    return {l.name: float(l.module.alpha.detach().abs().max()) for l in find_dyt_layers(model)}


@dataclass
class WindowSeries:
    """The window's running counts read from the screen every ``series_every`` steps (and at the late
    segment's start), turned into per-segment fractions."""

    names: list[str] = field(default_factory=list)
    marks: list[tuple[int, list[int], list[int], dict[str, float]]] = field(default_factory=list)

    def read(self, step: int, screen: Any, model: Any) -> None:
        r = screen.hooks.read(sync=False)  # cumulative (saturated, total) per layer since step 1; one host read
        self.names = list(screen.layer_names)
        self.marks.append((step, [int(s) for s in r.saturated], [int(t) for t in r.total], alphas(model)))

    def at(self, step: int) -> tuple[list[int], list[int]]:
        for s, sat, tot, _ in self.marks:
            if s == step:
                return sat, tot
        raise KeyError(step)

    def series(self, every: int) -> list[dict[str, Any]]:
        out, prev = [], (0, [0] * len(self.names), [0] * len(self.names))
        for step, sat, tot, alpha in self.marks:
            if step % every:
                continue
            ds = [a - b for a, b in zip(sat, prev[1])]
            dt = [a - b for a, b in zip(tot, prev[2])]
            out.append({"step": step, "saturation": sum(ds) / sum(dt) if sum(dt) else math.nan,
                        "per_layer": {n: s / t if t else math.nan for n, s, t in zip(self.names, ds, dt)},
                        "cumulative": sum(sat) / sum(tot) if sum(tot) else math.nan, "alpha": alpha})
            prev = (step, sat, tot)
        return out


def late_start(cfg: GridConfig) -> int:
    """The late segment is the window's last fifth: steps ``late_start + 1 .. window``."""
    return cfg.window - max(1, cfg.window // 5)


def train_arm(cfg: GridConfig, size: Size, nbytes: int, seed: int, norm: str, data: tuple,
              on_step: Callable[[int, Any], None] | None = None, progress: Callable[[int], None] | None = None
              ) -> dict[str, Any]:
    """Train one arm of a cell; the DyT arm is screened by ``satmon.Screen`` over its first ``cfg.window`` steps.

    Args:
        data: :func:`corpus`'s ``(train_tokens_all, val_inputs, val_targets)``.
        on_step: called as ``on_step(step, model)`` after each optimizer step (tests).
        progress: called with the step every ``eval_every`` steps (the grid's progress file).

    Returns:
        ``model`` (the final weights), ``val_loss`` (final step), ``val_curve`` [(step, loss)], ``train_curve``
        [(step, mean loss of the last ``series_every`` steps)], and for DyT the window's ``verdict``, its
        ``series`` and the ``alpha_curve`` [(step, {layer: alpha})].
    """
    import torch

    import satmon

    train_all, vx, vy = data
    model = build_model(cfg, size, norm, seed)
    opt, sched = optimizer(cfg, model)
    batches = Batches(cell_tokens(cfg, train_all, nbytes, seed), cfg.batch_size, cfg.seq_len, seed)
    screen, series = None, WindowSeries()
    if norm == "dyt":
        # the verdict only: no watch after the window, no abort, no console card
        screen = satmon.Screen(window=cfg.window, verbose=False, watch_every_n_steps=0, offset_every=cfg.offset_every)
        screen.attach(model, example_input=vx[:2])
    marks = {s for s in range(cfg.series_every, cfg.window + 1, cfg.series_every)} | {late_start(cfg), cfg.window}
    curve: list[tuple[int, float]] = []
    train_curve: list[tuple[int, float]] = []
    alpha_curve: list[tuple[int, dict[str, float]]] = []
    running = torch.zeros((), dtype=torch.float64)
    n_running = 0
    model.train()
    for step in range(1, cfg.steps + 1):
        x, y = next(batches)  # (B, T), (B, T)
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        running += loss.detach().double()
        n_running += 1
        if screen is not None:
            if step in marks and screen.verdict is None:
                series.read(step, screen, model)  # before step(): at the window's last step the screen concludes
            screen.step(loss.detach())
        if on_step is not None:
            on_step(step, model)
        if step % cfg.series_every == 0 or step == cfg.steps:
            train_curve.append((step, float(running) / n_running))
            running.zero_()
            n_running = 0
        if step % cfg.eval_every == 0 or step == cfg.steps or step == cfg.window:
            if screen is not None:
                with screen.paused():  # validation forwards are not training forwards
                    curve.append((step, val_loss(model, vx, vy)))
                alpha_curve.append((step, alphas(model)))
            else:
                curve.append((step, val_loss(model, vx, vy)))
            if progress is not None:
                progress(step)
    out: dict[str, Any] = {"model": model, "val_loss": curve[-1][1], "val_curve": curve, "train_curve": train_curve}
    if screen is not None:
        screen.finish()
        screen.detach()
        out.update(verdict=screen.verdict, series=series, alpha_curve=alpha_curve)
    return out


# ------------------------------------------------------------------------------------------- readings
def block_mean(per_layer: dict[str, float], block: int) -> float:
    """Mean of one block's DyT layers (``blocks.<i>.ln_1``, ``ln_2``: equal element counts)."""
    vals = [v for k, v in per_layer.items() if k.startswith(f"blocks.{block}.")]
    return sum(vals) / len(vals) if vals else math.nan


def positional(prefix: str, per_layer: dict[str, float], n_layers: int) -> dict[str, float]:
    """The per-layer readings the plan compares across sizes: first block, last block, final norm."""
    return {f"{prefix}_first_block": block_mean(per_layer, 0), f"{prefix}_last_block": block_mean(per_layer, n_layers - 1),
            f"{prefix}_final_norm": per_layer.get("ln_f", math.nan)}


def window_readings(cfg: GridConfig, size: Size, verdict: Any, series: WindowSeries) -> dict[str, Any]:
    """The window's readings from satmon's verdict and the screen's running counts. Every DyT layer of the
    demo GPT sees (B, T, d) inputs, so the mean over layers of the centered fractions is the pooled one."""
    centered = {k: v["centered"] for k, v in verdict.offset.items()}
    s0, t0 = series.at(late_start(cfg))
    s1, t1 = series.at(cfg.window)
    late = (sum(s1) - sum(s0)) / (sum(t1) - sum(t0))
    return {
        "window_saturation": verdict.saturation, **positional("window", dict(verdict.per_layer), size.n_layers),
        "window_centered": sum(centered.values()) / len(centered) if centered else math.nan, "window_late": late,
        "window_decision": verdict.decision, "window_margin": verdict.margin, "window_flags": list(verdict.flags),
        "window_trust": verdict.trust, "window_loss_trend": dict(verdict.loss), "window_per_layer": dict(verdict.per_layer),
        "window_centered_per_layer": centered,
        "window_offset_ratio_per_layer": {k: v["offset_ratio"] for k, v in verdict.offset.items()},
        "window_series": series.series(cfg.series_every),
    }


def windows_of(cfg: GridConfig, tokens: Any) -> list[Any]:
    """The first ``probe_sequences`` non-overlapping ``seq_len`` windows of ``tokens``, in batches."""
    n = min(cfg.probe_sequences, (tokens.numel() - 1) // cfg.seq_len)
    return list(tokens[: n * cfg.seq_len].view(n, cfg.seq_len).split(cfg.probe_batch))  # (n, T) in batches


def final_offset(model: Any, batches: Sequence[Any], level: float = 2.0) -> dict[str, Any]:
    """Saturation and centered saturation of every DyT input over ``batches``, in the probe's conditions
    (eval mode, no grad, bf16 autocast), from ``satmon.functional.offset``'s float64 sums: the
    final checkpoint's offset-corrected reading, and an independent count beside the probe's."""
    import torch

    from satmon import find_dyt_layers
    from satmon.functional.offset import offset_summary, offset_sums

    layers = find_dyt_layers(model)
    sums: dict[str, Any] = {}

    def hook(name: str):
        def fn(module: Any, args: tuple, out: Any) -> None:
            s = offset_sums(args[0], module.alpha, level)
            sums[name] = s if name not in sums else sums[name] + s
        return fn

    handles = [l.module.register_forward_hook(hook(l.name)) for l in layers]
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for x in batches:
                model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    per = {n: offset_summary(s) for n, s in sums.items()}
    total = sum(int(s.total) for s in sums.values())
    return {
        "final_centered": sum(int(s.centered_saturated) for s in sums.values()) / total,
        "final_saturation_hook": sum(int(s.saturated) for s in sums.values()) / total,
        "final_centered_per_layer": {n: float(r.centered_fraction) for n, r in per.items()},
        "final_offset_ratio_per_layer": {n: float(r.offset_ratio_median) for n, r in per.items()},
    }


def final_readings(cfg: GridConfig, size: Size, model: Any, vx: Any, train: Any) -> dict[str, Any]:
    """The study's protocol on the final weights: ``satmon.probe`` in eval mode under bf16 autocast on
    training-split sequences (its ``activation_analysis.py`` reads the training split); the same on
    held-out sequences beside it; the centered saturation of the training-split forwards."""
    import torch

    import satmon

    seen = windows_of(cfg, train)
    v = satmon.probe(model, seen, autocast_dtype=torch.bfloat16, step=cfg.steps).verdict
    held = satmon.probe(model, windows_of(cfg, vx.reshape(-1)), autocast_dtype=torch.bfloat16, step=cfg.steps).verdict
    return {"final_saturation": v.saturation, **positional("final", dict(v.per_layer), size.n_layers),
            "final_decision": v.decision, "final_per_layer": dict(v.per_layer), **final_offset(model, seen),
            "final_alpha": alphas(model), "probe_tokens": sum(b.numel() for b in seen),
            "final_saturation_heldout": held.saturation, "final_per_layer_heldout": dict(held.per_layer)}


# ------------------------------------------------------------------------------------------------ a cell
def run_cell(cfg: GridConfig, size: Size, budget: Budget, seed: int, threads: int = 1,
             progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Train both arms of one cell (LayerNorm, then DyT) and return its record (plain JSON values).

    ``progress(arm, step)`` is called every ``eval_every`` steps of each arm."""
    import torch

    _quiet()
    torch.set_num_threads(threads)
    t0, c0 = time.perf_counter(), time.process_time()
    data = corpus(cfg)
    train_all, vx, vy = data
    nbytes = budget.resolve(cfg.processed)
    arms = {norm: train_arm(cfg, size, nbytes, seed, norm, data,
                            progress=(lambda s, n=norm: progress(n, s)) if progress else None)
            for norm in ("layernorm", "dyt")}
    ln, dyt = arms["layernorm"], arms["dyt"]
    train = cell_tokens(cfg, train_all, nbytes, seed)
    uni = unigram_loss(train, vy)
    params, params_total = count_params(dyt["model"])
    cell: dict[str, Any] = {
        "name": cell_name(cfg, size, budget, seed), "group": size.name, "seed": seed, "d_model": size.d_model,
        "n_layers": size.n_layers, "n_heads": size.n_heads, "params": params, "params_total": params_total,
        "train_tokens": nbytes, "budget": budget.text, "epochs": cfg.processed / nbytes,
        "tokens_per_param": nbytes / params, "log_params_per_token": math.log10(params / nbytes),
        "processed_tokens_per_param": cfg.processed / params,
        "steps": cfg.steps, "window": cfg.window, "warmup": cfg.warmup, "alpha_init": cfg.alpha_init,
        "emb_scale": cfg.emb_scale, "lr": cfg.lr,
        "val_loss_dyt": dyt["val_loss"], "val_loss_layernorm": ln["val_loss"], "unigram_loss": uni,
        "delta": (dyt["val_loss"] - ln["val_loss"]) / ln["val_loss"],
    }
    cell["helps"] = cell["delta"] < 0
    cell["learns_dyt"], cell["learns_layernorm"] = dyt["val_loss"] < uni, ln["val_loss"] < uni
    cell.update(window_readings(cfg, size, dyt["verdict"], dyt["series"]))
    cell.update(final_readings(cfg, size, dyt["model"], vx, train))
    cell.update({
        "best_val_loss_dyt": min(v for _, v in dyt["val_curve"]), "best_val_loss_layernorm": min(v for _, v in ln["val_curve"]),
        "val_curve_dyt": dyt["val_curve"], "val_curve_layernorm": ln["val_curve"],
        "train_curve_dyt": dyt["train_curve"], "train_curve_layernorm": ln["train_curve"], "alpha_curve": dyt["alpha_curve"],
        "cpu_seconds": time.process_time() - c0, "wall_seconds": time.perf_counter() - t0, "threads": threads,
        "config": cfg.shared(), "code": code_version(),
    })
    if cfg.data != "prefix":
        cell.update({"data": cfg.data, "chunk_bytes": cfg.chunk_bytes, "passes": cell["epochs"],
                     "helps_best": cell["best_val_loss_dyt"] < cell["best_val_loss_layernorm"]})
    return cell


def _worker(cfg: GridConfig, size: Size, budget: Budget, seed: int, progress_dir: str) -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    path = Path(progress_dir) / f".{cell_name(cfg, size, budget, seed)}.progress"

    def progress(arm: str, step: int) -> None:  # the parent reads it for the ETA; never fatal
        try:
            done = step + (cfg.steps if arm == "dyt" else 0)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"{done} {2 * cfg.steps}\n")
            tmp.replace(path)
        except OSError:
            pass

    try:
        return run_cell(cfg, size, budget, seed, threads=1, progress=progress)
    finally:
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ environment
def code_version() -> str:
    """The satmon commit this runs (``+dirty`` with uncommitted changes under satmon/ or examples/)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "satmon", "examples"],
                               capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        from satmon import __version__

        return f"satmon {__version__} (not a git checkout)"
    return head + ("+dirty" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(threads: int, jobs: int) -> dict[str, Any]:
    """What a reader needs to know where the numbers came from."""
    import torch

    return {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count(),
            "threads": threads, "jobs": jobs, "satmon_commit": code_version()}


# ------------------------------------------------------------------------------------ the grid, cached
class Progress:
    """Progress on stderr: a line per finished cell, and every ``every`` seconds a status line with the
    ETA from the work done so far (steps x size cost). Plain lines, so a log file reads as it should."""

    def __init__(self, cfg: GridConfig, keys: list, cached: int, every: float, progress_dir: Path | None = None) -> None:
        self.cfg, self.every, self.t0, self.last = cfg, every, time.perf_counter(), time.perf_counter()
        self.progress_dir = progress_dir
        self.total = len(keys) + cached
        self.done = cached
        self.units = {cell_name(cfg, *k): cost(k[0]) * 2 * cfg.steps for k in keys}  # work per cell to run
        self.finished: set[str] = set()

    def line(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def _eta(self, partial: dict[str, float]) -> str:
        took = time.perf_counter() - self.t0
        done = sum(self.units[n] for n in self.finished) + sum(self.units[n] * f for n, f in partial.items())
        if done <= 0:
            return "ETA after the first progress report"
        left = took / done * (sum(self.units.values()) - done)
        return f"~{left / 60:.0f} min left"

    def _partial(self) -> dict[str, float]:
        """Each running cell's share done, from the progress files its worker writes."""
        partial = {}
        if self.progress_dir is not None:
            for p in self.progress_dir.glob(".*.progress"):
                try:
                    a, b = p.read_text().split()
                    partial[p.name[1:-len(".progress")]] = int(a) / int(b)
                except (OSError, ValueError):
                    continue
        return {k: v for k, v in partial.items() if k in self.units and k not in self.finished}

    def poll(self) -> None:
        if time.perf_counter() - self.last < self.every:
            return
        self.last = time.perf_counter()
        partial = self._partial()
        running = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(partial.items()))
        self.line(f"regime_grid: {self.done}/{self.total} cells, {(time.perf_counter() - self.t0) / 60:.1f} min; "
                  f"running: {running or 'starting'}; {self._eta(partial)}")

    def advance(self, cell: dict[str, Any]) -> None:
        self.done += 1
        self.finished.add(cell["name"])
        self.line(f"regime_grid: {self.done}/{self.total} cells, {(time.perf_counter() - self.t0) / 60:.1f} min, "
                  f"{self._eta(self._partial())} | {cell['name']} ({cell['epochs']:.1f} epochs): LN "
                  f"{cell['val_loss_layernorm']:.3f} DyT {cell['val_loss_dyt']:.3f} ({cell['delta'] * 100:+.1f}%, unigram "
                  f"{cell['unigram_loss']:.3f}) window {cell['window_saturation']:.3f} final {cell['final_saturation']:.3f} "
                  f"[{cell['cpu_seconds']:.0f} s CPU]")


def load_cached(path: Path, cfg: GridConfig) -> dict[str, Any] | None:
    """A cached cell made with the same shared configuration, else ``None`` (it will be re-run)."""
    try:
        cell = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return cell if isinstance(cell, dict) and cell.get("config") == cfg.shared() else None


def run_grid(cfg: GridConfig, out: Path, jobs: int = 2, every: float | None = None) -> list[dict[str, Any]]:
    """Run every cell not cached under ``out/cells``, ``jobs`` at a time; return all cells in grid order."""
    cfg.check()
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    keys = cell_keys(cfg)
    cells: dict[str, dict[str, Any]] = {}
    todo = []
    for key in keys:
        name = cell_name(cfg, *key)
        cached = load_cached(cells_dir / f"{name}.json", cfg)
        if cached is not None:
            cells[name] = cached
        else:
            todo.append(key)
    if every is None:
        every = 30.0 if sys.stderr.isatty() else 300.0
    bar = Progress(cfg, todo, len(cells), every, cells_dir)
    bar.line(f"regime_grid: {len(keys)} cells ({len(cells)} cached), {len(todo)} to run, {jobs} at a time, "
             f"{cfg.steps} steps each (window {cfg.window}, warm-up {cfg.warmup}) -> {out}")

    def keep(cell: dict[str, Any]) -> None:
        cells[cell["name"]] = cell
        tmp = cells_dir / f".{cell['name']}.json.tmp"  # write then rename: a killed run leaves no half cell
        tmp.write_text(json.dumps(cell, indent=1, allow_nan=False) + "\n")
        tmp.replace(cells_dir / f"{cell['name']}.json")
        bar.advance(cell)

    if jobs <= 1:
        for key in todo:
            keep(run_cell(cfg, *key, threads=1))
    elif todo:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            pending = {pool.submit(_worker, cfg, *key, str(cells_dir)) for key in todo}
            while pending:
                done, pending = wait(pending, timeout=min(every, 30.0), return_when=FIRST_COMPLETED)
                for f in done:
                    keep(f.result())
                bar.poll()
    order = [cell_name(cfg, *k) for k in sorted(keys, key=lambda k: (cost(k[0]), k[1].resolve(cfg.processed), k[2]))]
    return [cells[n] for n in order]


def write_grid(cfg: GridConfig, cells: list[dict[str, Any]], path: Path, mode: str, command: str, wall: float,
               env: dict[str, Any], analysis: dict[str, Any]) -> None:
    """The grid's JSON: environment, configuration, the pre-registered analysis and the cells
    (``satmon calibrate --cells`` reads ``group``, ``delta`` and every numeric field as a reading)."""
    cpu = [c["cpu_seconds"] for c in cells]
    config = {**cfg.shared(), "sizes": [asdict(s) for s in cfg.sizes], "budgets": [b.text for b in cfg.budgets],
              "budget_bytes": list(cfg.budget_bytes()), "seeds": list(cfg.seeds)}
    if cfg.size_budgets:
        config["size_budgets"] = {name: [b.text for b in budgets] for name, budgets in cfg.size_budgets}
    payload = {
        "format": FORMAT, "mode": mode, "command": command,
        "plan": "docs/grid2_plan.md" if cfg.data == "chunks" else "docs/grid_plan.md",
        "environment": env, "config": config,
        "outcome": "delta = (DyT - LayerNorm) / LayerNorm final held-out loss at step `steps`; negative = DyT helps",
        "group": "model size (leave-one-size-out); seeds give the second held-out protocol (leave-one-seed-out)",
        "readings": {"window": list(WINDOW_READINGS), "final": list(FINAL_READINGS), "prior": list(PRIOR_READINGS)},
        "window_readings": "satmon.Screen's verdict over the first `window` steps of the DyT run: pooled, per layer, "
                           "first block, last block, final norm (ln_f), centered (the verdict's offset readings, sampled "
                           "every offset_every steps), late (pooled over the window's last fifth); window_series: each "
                           "series_every-step segment's pooled and per-layer saturation, the running pooled total, alphas",
        "final_readings": "satmon.probe on the step-`steps` weights, eval mode, bf16 autocast, probe_sequences training-"
                          "split sequences (the study's protocol); final_saturation_heldout on held-out sequences",
        "timing": {"cells": len(cells), "cpu_seconds_per_cell": {c["name"]: round(c["cpu_seconds"], 1) for c in cells},
                   "cpu_seconds_sum": sum(cpu), "wall_seconds_this_run": wall},
        "analysis": json_safe(analysis),
        "cells": cells,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


def json_safe(o: Any) -> Any:
    """``o`` with NaN/inf floats as ``None`` (an AUC over one class is undefined, not a number)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o


# -------------------------------------------------------------------------------------- the statistics
def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v: Sequence[float]) -> list[float]:
        first: dict[float, int] = {}
        last: dict[float, int] = {}
        for i, x in enumerate(sorted(v)):
            first.setdefault(x, i)
            last[x] = i
        return [(first[x] + last[x]) / 2 for x in v]  # tied values share the mean of their positions

    return pearson(ranks(a), ranks(b))


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else math.nan


def held_out(scores: Sequence[float], helps: Sequence[bool], groups: Sequence[Any], rule: str = "midpoint") -> dict[str, Any]:
    """Leave-one-group-out accuracy of ``score >= t -> GO``, ``t`` refit on the other groups (the study's rule)."""
    from satmon.functional.threshold_fit import leave_one_group_out

    cv = leave_one_group_out(scores, helps, [str(g) for g in groups], rule)
    return {"accuracy": cv.accuracy, "correct": cv.correct, "n": cv.n, "balanced": cv.balanced_accuracy,
            "folds": [{"held_out": f.group, "threshold": f.threshold, "correct": f.correct, "n": f.n} for f in cv.folds]}


def family_statistic(cells: list[dict[str, Any]], helps: Sequence[bool], names: Sequence[str]) -> float:
    """The plan's test statistic: the best, over the window readings, of the worse of its two held-out
    accuracies (leave-one-size-out, leave-one-seed-out)."""
    sizes, seeds = [c["group"] for c in cells], [c["seed"] for c in cells]
    best = -1.0
    for r in names:
        x = [c[r] for c in cells]
        best = max(best, min(held_out(x, helps, sizes)["accuracy"], held_out(x, helps, seeds)["accuracy"]))
    return best


def analyze(cells: list[dict[str, Any]], permutations: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """The analysis docs/grid_plan.md registered, from the cells alone (reproducible from the JSON).

    Per reading: AUC, the study's midpoint fit in-sample, held-out accuracy leave-one-size-out and
    leave-one-seed-out, the study's fixed 0.43 where it applies; for the window family a permutation
    p-value of the best held-out accuracy over all window readings (outcomes shuffled across cells),
    and the plan's decision: does a window reading predict?
    """
    from satmon.functional.threshold_fit import accuracy, auc, fit_threshold

    helps = [bool(c["delta"] < 0) for c in cells]
    sizes, seeds = [c["group"] for c in cells], [c["seed"] for c in cells]
    n, k = len(cells), sum(helps)
    baselines = {"always_no_go": (n - k) / n, "always_go": k / n}
    bar = max(baselines.values())
    out: dict[str, Any] = {
        "n": n, "helps": k, "groups": sorted(set(sizes)), "seeds": sorted(set(seeds)), "baselines": baselines,
        "learns": {"dyt": sum(c["learns_dyt"] for c in cells), "layernorm": sum(c["learns_layernorm"] for c in cells),
                   "both": sum(c["learns_dyt"] and c["learns_layernorm"] for c in cells)},
        "readings": {},
    }
    two_protocols = len(set(sizes)) >= 2 and len(set(seeds)) >= 2
    for r in READINGS:
        x = [c[r] for c in cells]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in x):
            out["readings"][r] = {"missing": True}
            continue
        fit = fit_threshold(x, helps, "midpoint")
        row: dict[str, Any] = {"family": "window" if r in WINDOW_READINGS else "final" if r in FINAL_READINGS else "prior",
                               "min": min(x), "max": max(x), "auc": auc(x, helps),
                               "in_sample": {"threshold": fit.threshold, "accuracy": fit.accuracy, "outside": fit.threshold_outside}}
        if two_protocols:
            row["loso"], row["loseedo"] = held_out(x, helps, sizes), held_out(x, helps, seeds)
            row["held_out_min"] = min(row["loso"]["accuracy"], row["loseedo"]["accuracy"])
        if r in ("window_saturation", "final_saturation"):
            row["study_043"] = accuracy(x, helps, STUDY_THRESHOLD)
        out["readings"][r] = row
    if not two_protocols:
        out["decision"] = {"predicts": None, "why": "fewer than 2 sizes or 2 seeds: no held-out protocol"}
        return out
    observed = family_statistic(cells, helps, WINDOW_READINGS)
    rng = random.Random(seed)
    shuffled, exceed = list(helps), 0
    for _ in range(permutations):
        rng.shuffle(shuffled)
        exceed += family_statistic(cells, shuffled, WINDOW_READINGS) >= observed
    p = (1 + exceed) / (1 + permutations)
    qualifying = [r for r in WINDOW_READINGS
                  if not out["readings"][r].get("missing")
                  and out["readings"][r]["loso"]["accuracy"] > bar and out["readings"][r]["loseedo"]["accuracy"] > bar
                  and out["readings"][r]["auc"] >= AUC_BAR]
    predicts = p < P_BAR and bool(qualifying)
    best = max(qualifying, key=lambda r: (out["readings"][r]["held_out_min"], -WINDOW_READINGS.index(r))) if qualifying else None
    prior = out["readings"][PRIOR_READINGS[0]]
    out["decision"] = {
        "statistic": observed, "permutations": permutations, "candidates": len(WINDOW_READINGS), "p_value": p,
        "baseline_bar": bar, "qualifying": qualifying, "predicts": predicts, "reading": best if predicts else None,
        "adds_to_prior": (predicts and out["readings"][best]["held_out_min"] > prior["held_out_min"]) if best else False,
    }
    return out


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def report_markdown(analysis: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    """The analysis as markdown tables (what docs/calibration.md quotes)."""
    a, n = analysis, analysis["n"]
    lines = [(f"{n} cells ({', '.join(a['groups'])}; seeds {', '.join(map(str, a['seeds']))}); DyT below the unigram "
              f"level in {a['learns']['dyt']}/{n}, LayerNorm in {a['learns']['layernorm']}/{n}; DyT helped in {a['helps']}, "
              f"hurt in {n - a['helps']}; always NO-GO {pct(a['baselines']['always_no_go'])}, always GO "
              f"{pct(a['baselines']['always_go'])}."), "",
             ("| cell | epochs | tokens/param | unigram | val LN | val DyT | DyT vs LN | window sat. | window first block | "
              "window centered | final sat. | final first block |"), "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        mark = lambda ok: "" if ok else " (above unigram)"
        lines.append(f"| {c['name']} | {c['epochs']:.1f} | {c['tokens_per_param']:.2f} | {c['unigram_loss']:.3f} | "
                     f"{c['val_loss_layernorm']:.3f}{mark(c['learns_layernorm'])} | {c['val_loss_dyt']:.3f}{mark(c['learns_dyt'])} | "
                     f"{c['delta'] * 100:+.1f}% | {c['window_saturation']:.3f} | {c['window_first_block']:.3f} | "
                     f"{c['window_centered']:.3f} | {c['final_saturation']:.3f} | {c['final_first_block']:.3f} |")
    lines += ["", ("| reading | family | range | AUC | in-sample (midpoint t) | leave-one-size-out | leave-one-seed-out | "
                   "0.43's accuracy |"), "|---|---|---|---|---|---|---|---|"]
    for r, s in a["readings"].items():
        if s.get("missing"):
            lines.append(f"| {r} | | missing | | | | | |")
            continue
        ho = lambda key: f"{s[key]['correct']}/{s[key]['n']} = {pct(s[key]['accuracy'])}" if key in s else "-"
        study = pct(s["study_043"]) if "study_043" in s else ""
        lines.append(f"| {r} | {s['family']} | {s['min']:.3f}-{s['max']:.3f} | {s['auc']:.2f} | "
                     f"{pct(s['in_sample']['accuracy'])} ({s['in_sample']['threshold']:.4f}) | {ho('loso')} | {ho('loseedo')} | {study} |")
    d = a.get("decision", {})
    if d.get("predicts") is not None:
        lines += ["", (f"Family-wise test (the plan): best over the {d['candidates']} window readings of the worse held-out "
                       f"accuracy = {pct(d['statistic'])}; permutation p = {d['p_value']:.4f} ({d['permutations']:,} "
                       f"shuffles of the outcomes); bar to beat in both protocols: {pct(d['baseline_bar'])} (the better "
                       f"trivial rule); readings over the bar with AUC >= {AUC_BAR}: {', '.join(d['qualifying']) or 'none'}. "
                       + (f"**The window predicts** ({d['reading']})" if d["predicts"] else
                          "**No window reading predicts by the plan's standard**") + ".")]
    return "\n".join(lines)


def plot(analysis: dict[str, Any], cells: list[dict[str, Any]], path: Path) -> None:
    """Four panels: the window's pooled saturation over its 50-step segments per cell; DyT's effect
    against the window's pooled and first-block readings; against unique tokens per parameter."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 8.5), dpi=110, layout="constrained")
    axes = list(fig.subplots(2, 2).flat)
    groups = sorted({c["group"] for c in cells}, key=lambda g: next(c["params"] for c in cells if c["group"] == g))
    markers = dict(zip(groups, "osD^vP"))
    color = lambda c: "tab:green" if c["delta"] < 0 else "tab:red"
    ax = axes[0]
    for c in cells:
        s = c["window_series"]
        ax.plot([e["step"] for e in s], [e["saturation"] for e in s], color=color(c), lw=0.8,
                marker=markers[c["group"]], ms=3, alpha=0.8)
    ax.axhline(STUDY_THRESHOLD, color="gray", lw=0.8, ls="--")
    ax.set(xlabel="step (window)", ylabel="pooled saturation of each 50-step segment",
           title="the window's series (green: DyT helped at the end; red: hurt)")
    for ax, (r, label) in zip(axes[1:3], (("window_saturation", "window pooled saturation"),
                                          ("window_first_block", "window first-block saturation"))):
        for c in cells:
            ax.scatter(c[r], 100 * c["delta"], marker=markers[c["group"]], color=color(c), s=40, edgecolor="black", lw=0.5)
        s = analysis["readings"][r]
        ax.axhline(0, color="gray", lw=0.8)
        if r == "window_saturation":
            ax.axvline(STUDY_THRESHOLD, color="gray", lw=0.8, ls="--", label="study 0.43")
        held = (f"; held out {pct(s['loso']['accuracy'])} by size, {pct(s['loseedo']['accuracy'])} by seed"
                if "loso" in s else "")
        ax.set(xlabel=label, ylabel="DyT vs LayerNorm, final held-out loss (%)", title=f"AUC {s['auc']:.2f}{held}")
    ax = axes[3]
    for c in cells:
        ax.scatter(c["tokens_per_param"], 100 * c["delta"], marker=markers[c["group"]], color=color(c), s=40,
                   edgecolor="black", lw=0.5)
    for g in groups:
        ax.scatter([], [], marker=markers[g], color="white", edgecolor="black", label=g)
    ax.set_xscale("log")
    ax.axhline(0, color="gray", lw=0.8)
    ax.legend(fontsize=7)
    ax.set(xlabel="unique training tokens per parameter (known before training)",
           ylabel="DyT vs LayerNorm, final held-out loss (%)", title="the budget alone")
    fig.suptitle("faithful grid (the study's protocol at CPU scale): does the 500-step window predict DyT's effect?",
                 fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def try_plot(analysis: dict[str, Any], cells: list[dict[str, Any]], path: Path) -> bool:
    """The plot, or one line saying why not (matplotlib is the ``report`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"regime_grid: no plot ({path}): matplotlib is not installed; pip install -e \".[report]\" adds it.",
              file=sys.stderr)
        return False
    plot(analysis, cells, path)
    return True


def calibrate_all(json_path: Path, out: Path) -> dict[str, int]:
    """``satmon calibrate --cells JSON --metric M --out out/M`` for every window reading, through the console
    command's entry point (in this process); its console text goes to ``out/M/stdout.txt``. Returns the exit
    code per reading (2: the cells cannot be fitted, e.g. one class only; the text says why)."""
    import contextlib
    import io

    from satmon.cli.main import main as satmon_main  # the `satmon` console script's entry point

    codes = {}
    for metric in WINDOW_READINGS:
        dest = out / metric
        dest.mkdir(parents=True, exist_ok=True)
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            codes[metric] = satmon_main(["calibrate", "--cells", str(json_path), "--metric", metric, "--out", str(dest)])
        (dest / "stdout.txt").write_text(text.getvalue())
    return codes


def report(json_path: Path, out_md: Path | None, plot_path: Path | None, permutations: int = 10_000) -> str:
    """The pre-registered analysis of a finished grid's JSON as markdown (and the plot)."""
    cells = json.loads(json_path.read_text())["cells"]
    analysis = analyze(cells, permutations)
    text = report_markdown(analysis, cells)
    if out_md is not None:
        out_md.write_text(text + "\n")
    if plot_path is not None:
        try_plot(analysis, cells, plot_path)
    return text


# ------------------------------------------------------------------------------------------------- main
def _list(kind: Callable[[str], Any], name: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(t) for t in text.split(",") if t.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{name}: {e}") from None
    return parse


def _seed(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise ValueError(f"Expected seeds as non-negative integers, got {text!r}.")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="2 cells of the full grid (d64L2, 164 and 1.4 epochs, seed 0)")
    mode.add_argument("--smoke", action="store_true", help="4 tiny cells, 8 steps (window 4): the test suite's check")
    mode.add_argument("--grid2", action="store_true", help="the second grid (docs/grid2_plan.md): 30 cells, 3 sizes, "
                      "3.3-164 passes, seeds 2 and 3, budgets drawn as chunks per seed (~4 CPU-hours)")
    mode.add_argument("--report", metavar="JSON", help="only the analysis of a finished grid's JSON (no training); "
                      "a second-grid JSON gets docs/grid2_plan.md's analysis")
    p.add_argument("--sizes", type=_list(Size.parse, "--sizes"), help="model sizes, e.g. d64L2,d96L3 (default: the mode's)")
    p.add_argument("--budgets", type=_list(Budget.parse, "--budgets"), help="unique-token budgets, epochs or bytes, "
                   "e.g. 164ep,16ep,3.3ep,1.4ep or 31220,3.5M (default: the study's passes)")
    p.add_argument("--seeds", type=_list(_seed, "--seeds"), help="seeds, e.g. 0,1")
    p.add_argument("--steps", type=int, help="optimizer steps per arm (default 5000, the study's)")
    p.add_argument("--window", type=int, help="the screening window (default 500)")
    p.add_argument("--warmup", type=int, help="linear warm-up steps, then a constant rate (default 2000, the study's)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    p.add_argument("--emb-scale", type=float, help="embedding multiplier (default 1.0: GPT-2's, the study's)")
    p.add_argument("--alpha-init", type=float, help="DyT's alpha_init (default 2.0, the study's)")
    p.add_argument("--out", default="regime_grid_out", help="output directory (default ./regime_grid_out)")
    p.add_argument("--jobs", type=int, default=2, help="cells trained at once, one thread each (default 2)")
    p.add_argument("--plot", default=None, help="with --report: write the plot there")
    p.add_argument("--permutations", type=int, default=10_000, help="shuffles for the permutation p-value (default 10000)")
    p.add_argument("--no-calibrate", action="store_true", help="skip `satmon calibrate` on every window reading")
    args = p.parse_args(argv)
    if args.permutations < 1:
        p.error(f"expected --permutations >= 1, got {args.permutations}")
    if args.report:
        try:
            print(report(Path(args.report), None, Path(args.plot) if args.plot else None, args.permutations))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            p.error(f"could not read the grid JSON {args.report}: {e}")
        return 0
    if not 1 <= args.jobs <= max(1, 4 * (os.cpu_count() or 1)):
        p.error(f"expected 1 <= --jobs <= {4 * (os.cpu_count() or 1)}, got {args.jobs}")
    name = "smoke" if args.smoke else "quick" if args.quick else "grid2" if args.grid2 else "full"
    cfg = MODES[name]
    for key in ("sizes", "budgets", "seeds", "steps", "window", "warmup", "lr", "emb_scale", "alpha_init"):
        value = getattr(args, key)
        if value is not None:
            cfg = replace(cfg, **{key: value})
    if any(v is not None for v in (args.sizes, args.budgets, args.seeds, args.steps, args.window, args.warmup, args.lr,
                                    args.emb_scale, args.alpha_init)):
        name = f"{name}+custom"
    try:
        cfg.check()
    except ValueError as e:
        p.error(str(e))
    out = Path(args.out)
    command = "python examples/regime_grid.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    cells = run_grid(cfg, out, args.jobs)
    wall = time.perf_counter() - t0
    analysis = analyze(cells, args.permutations)
    json_path = out / "faithful_grid.json"
    write_grid(cfg, cells, json_path, name, command, wall, environment(1, args.jobs), analysis)
    text = report_markdown(analysis, cells)
    (out / "report.md").write_text(text + "\n")
    plotted = try_plot(analysis, cells, out / "faithful_grid.png")
    print(text)
    cpu = sum(c["cpu_seconds"] for c in cells)
    print(f"\n{len(cells)} cells; this run {wall / 60:.1f} min wall; CPU {cpu / 60:.1f} min summed over cells. Wrote "
          f"{json_path}, {out / 'report.md'}" + (f", {out / 'faithful_grid.png'}" if plotted else ""))
    if not args.no_calibrate:
        codes = calibrate_all(json_path, out / "calibrate")
        bad = {m: c for m, c in codes.items() if c != 0}
        print(f"satmon calibrate on {len(codes)} window readings: {out / 'calibrate'}/<reading>/"
              + (f"; could not fit {sorted(bad)} (see their stdout.txt)" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
