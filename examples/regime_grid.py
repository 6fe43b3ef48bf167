"""Does the 500-step window predict the final checkpoint? A CPU regime grid where both norms learn.

The regime study (Verma, 2026) fit its 0.43 threshold on final (~5k-step) checkpoints; its recipe
applies it to a 500-step calibration window. This script measures, at CPU scale, whether the
window's reading predicts the final one, and whether either predicts DyT's effect.

Each cell (a model size, a training-token budget, a seed) trains satmon's GPT-2-style demo model
twice from the same initial weights and on the same batches, once with LayerNorm and once with DyT,
for ``steps`` (>= 3 windows) optimizer steps in a plain PyTorch loop, and records:

- the window's readings, from ``satmon.Screen`` over the DyT run's first ``window`` steps: the
  verdict's pooled saturation, its per-layer readings, the first block's and the centered
  saturation (the verdict's offset readings, sampled every ``offset_every`` steps);
- the final checkpoint's readings by the study's protocol: ``satmon.probe`` on the final weights in
  eval mode under bf16 autocast, on held-out sequences (per layer, pooled, first block), and the
  centered saturation of the same forwards (``satmon.functional.offset``);
- both arms' final validation loss on the same held-out tokens, the unigram loss of those tokens
  (the level of a model that ignores context: below it, a model has learnt), DyT's effect
  ``delta = (DyT - LayerNorm) / LayerNorm`` (negative: DyT helps).

    python examples/regime_grid.py                  # the full grid, 18 cells (54 CPU-minutes: ~30 min on 2 idle cores)
    python examples/regime_grid.py --quick          # 4 of its cells (same numbers), a few minutes
    python examples/regime_grid.py --smoke          # seconds, for the test suite
    python examples/regime_grid.py --report docs/regime_grid.json --plot docs/img/regime_grid.png

Every finished cell is cached as ``OUT/cells/<name>.json``: a stopped run resumes where it stopped
(a cached cell is reused only when it was made with the same configuration). When every cell is
done, ``OUT/regime_grid.json`` holds them (``satmon calibrate --cells OUT/regime_grid.json --metric
READING`` reads it), ``OUT/report.md`` the statistics and ``OUT/calibrate/<reading>/`` the output of
``satmon calibrate`` for every reading.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

#: The readings a threshold can be fit on (every cell has each), window first.
READINGS = ("window_saturation", "window_first_block", "window_centered",
            "final_saturation", "final_first_block", "final_centered")
#: Window reading -> the final reading it should predict.
PAIRS = (("window_saturation", "final_saturation"), ("window_first_block", "final_first_block"),
         ("window_centered", "final_centered"))
#: The study's figures on its 12 cells (docs/science.md): in-sample and leave-one-scale-out accuracy.
STUDY_IN_SAMPLE, STUDY_LOSO, STUDY_THRESHOLD = 0.75, 0.50, 0.43


# ---------------------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Size:
    """One model size: a group of the grid (leave-one-group-out is leave-one-size-out)."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int


@dataclass(frozen=True)
class GridConfig:
    """The grid's axes and everything every cell shares.

    The learning-rate schedule is a linear warm-up over ``warmup`` steps, then a cosine decay to
    ``min_lr_ratio * lr`` at ``steps``. Weight decay applies to matrices only (not to biases, norm
    gains or DyT's alpha: decaying alpha would pull DyT towards the identity regardless of the data).
    """

    sizes: tuple[Size, ...]
    budgets: tuple[int, ...]  # training tokens: the first ``budget`` bytes of the corpus
    seeds: tuple[int, ...]
    steps: int = 1_500
    window: int = 500  # satmon's default screening window
    seq_len: int = 64
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    alpha_init: float = 2.0  # the study's "canonical" init (DyT's default is 0.5: docs/calibration.md compares them)
    emb_scale: float | None = None  # embedding multiplier, both arms; None: sqrt(d_model)
    val_tokens: int = 32_768
    val_offset: int = 4_400_000  # the held-out split starts here, after every training budget
    probe_sequences: int = 400  # 400 x 64 = 25,600 tokens: the study's 50 sequences of 512
    probe_batch: int = 50
    evals: int = 6  # validation passes (the curve); the last is at the final step
    offset_every: int = 10  # the screen's sampled offset statistics (its default)

    def check(self) -> None:
        """Refuse a grid that cannot answer the question (no final checkpoint past the window, ...)."""
        if self.steps < 3 * self.window:
            raise ValueError(f"Expected steps >= 3 * window (a final checkpoint well past the window), got steps="
                             f"{self.steps}, window={self.window}.")
        if max(self.budgets) + self.seq_len >= self.val_offset:
            raise ValueError(f"Expected every budget below the held-out split (offset {self.val_offset:,}), got "
                             f"{max(self.budgets):,}.")
        if min(self.budgets) <= self.seq_len + 1:
            raise ValueError(f"Expected budgets of more than seq_len + 1 = {self.seq_len + 1} tokens, got {min(self.budgets)}.")

    def shared(self) -> dict[str, Any]:
        """What a cached cell must have been made with to be reused (everything but the axes)."""
        d = asdict(self)
        for axis in ("sizes", "budgets", "seeds"):
            d.pop(axis)
        return d


SIZES = (Size("d64L2", 64, 2, 4), Size("d96L3", 96, 3, 4), Size("d128L4", 128, 4, 4))
FULL = GridConfig(sizes=SIZES, budgets=(32_768, 65_536, 2_097_152), seeds=(0, 1))
MODES = {
    "full": FULL,
    # four cells of the full grid, same settings (so the same numbers, and its cache serves the full run):
    # the two smaller sizes at the smallest and the largest budget, seed 0
    "quick": replace(FULL, sizes=SIZES[:2], budgets=(32_768, 2_097_152), seeds=(0,)),
    "smoke": GridConfig(sizes=(Size("d16L1", 16, 1, 2), Size("d24L1", 24, 1, 2)), budgets=(2_000, 20_000), seeds=(0,),
                        steps=6, window=2, seq_len=16, batch_size=4, warmup=2, val_tokens=1_024, val_offset=40_000,
                        probe_sequences=8, probe_batch=4, evals=2, offset_every=1, alpha_init=2.0, emb_scale=40.0),
}


def cell_keys(cfg: GridConfig) -> list[tuple[Size, int, int]]:
    """Every cell of the grid, largest model first (the slow ones start first: the pool stays busy)."""
    keys = [(s, b, seed) for s in cfg.sizes for b in cfg.budgets for seed in cfg.seeds]
    return sorted(keys, key=lambda k: -k[0].d_model ** 2 * k[0].n_layers)


def cell_name(size: Size, budget: int, seed: int) -> str:
    return f"{size.name}_t{budget}_s{seed}"


def emb_scale(cfg: GridConfig, size: Size) -> float:
    return math.sqrt(size.d_model) if cfg.emb_scale is None else cfg.emb_scale


# ------------------------------------------------------------------------------------------------ data
def _quiet() -> None:
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    import logging

    logging.getLogger("satmon").setLevel(logging.ERROR)


def corpus(cfg: GridConfig):
    """``(train_tokens_all, val_inputs, val_targets)``: the corpus prefix the budgets cut from, and the
    held-out split as non-overlapping ``(N, seq_len)`` windows (the same tokens for every cell)."""
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


class Batches:
    """Random ``(B, T)`` windows of the training split, from a seeded generator: both arms of a cell
    draw the same batches in the same order. Random offsets, not fixed windows, so that a small
    budget repeats its bytes but not its exact sequences."""

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
    draw no random numbers: LayerNorm and DyT start at weight 1, bias 0)."""
    import torch

    from satmon.demos.gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(d_model=size.d_model, n_layers=size.n_layers, n_heads=size.n_heads, seq_len=cfg.seq_len,
                         norm=norm, alpha_init=cfg.alpha_init, emb_scale=emb_scale(cfg, size)))


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


def optimizer(cfg: GridConfig, model: Any):
    """AdamW with decay on matrices only, warm-up then cosine decay (see :class:`GridConfig`)."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))

    def factor(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train_arm(cfg: GridConfig, size: Size, budget: int, seed: int, norm: str, data: tuple,
              on_step: Callable[[int, Any], None] | None = None) -> dict[str, Any]:
    """Train one arm of a cell; the DyT arm is screened by ``satmon.Screen`` over its first ``cfg.window`` steps.

    Args:
        data: :func:`corpus`'s ``(train_tokens_all, val_inputs, val_targets)``.
        on_step: called as ``on_step(step, model)`` after each optimizer step (tests, tuning).

    Returns:
        ``model`` (the final weights), ``val_loss`` (final step), ``val_curve`` [(step, loss)], and for
        DyT the window's ``verdict`` (a ``satmon.Verdict``).
    """
    import torch

    import satmon

    train_all, vx, vy = data
    model = build_model(cfg, size, norm, seed)
    opt, sched = optimizer(cfg, model)
    batches = Batches(train_all[:budget], cfg.batch_size, cfg.seq_len, seed)
    screen = None
    if norm == "dyt":
        # the verdict only: no watch after the window, no abort, no console card
        screen = satmon.Screen(window=cfg.window, verbose=False, watch_every_n_steps=0, offset_every=cfg.offset_every)
        screen.attach(model, example_input=vx[:2])
    every = max(1, cfg.steps // cfg.evals)
    curve: list[tuple[int, float]] = []
    window_alpha: dict[str, float] = {}
    model.train()
    for step in range(1, cfg.steps + 1):
        x, y = next(batches)  # (B, T), (B, T)
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        if screen is not None:
            screen.step(loss.detach())  # after the optimizer step: the window's counts close at step `window`
            if step == cfg.window:
                window_alpha = {l.name: float(l.module.alpha.detach().abs().max()) for l in satmon.find_dyt_layers(model)}
        if on_step is not None:
            on_step(step, model)
        if step % every == 0 or step == cfg.steps:
            if screen is not None:
                with screen.paused():  # validation forwards are not training forwards
                    curve.append((step, val_loss(model, vx, vy)))
            else:
                curve.append((step, val_loss(model, vx, vy)))
    out: dict[str, Any] = {"model": model, "val_loss": curve[-1][1], "val_curve": curve}
    if screen is not None:
        screen.finish()
        screen.detach()
        out["verdict"] = screen.verdict
        out["window_alpha"] = window_alpha
    return out


# ------------------------------------------------------------------------------------------- readings
def first_block(per_layer: dict[str, float]) -> float:
    """Mean of the first block's DyT layers (``blocks.0.ln_1``, ``blocks.0.ln_2``: equal element counts)."""
    vals = [v for k, v in per_layer.items() if k.startswith("blocks.0.")]
    return sum(vals) / len(vals) if vals else math.nan


def window_readings(verdict: Any) -> dict[str, Any]:
    """The window's readings from satmon's verdict. Every DyT layer of the demo GPT sees (B, T, d)
    inputs, so the mean over layers of the centered fractions is the pooled centered fraction."""
    centered = {k: v["centered"] for k, v in verdict.offset.items()}
    return {
        "window_saturation": verdict.saturation, "window_first_block": first_block(verdict.per_layer),
        "window_centered": sum(centered.values()) / len(centered) if centered else math.nan,
        "window_decision": verdict.decision, "window_margin": verdict.margin, "window_flags": list(verdict.flags),
        "window_loss_trend": dict(verdict.loss), "window_per_layer": dict(verdict.per_layer),
        "window_centered_per_layer": centered,
        "window_offset_ratio_per_layer": {k: v["offset_ratio"] for k, v in verdict.offset.items()},
    }


def probe_batches(cfg: GridConfig, vx: Any) -> list[Any]:
    """The final checkpoint's calibration set: the first ``probe_sequences`` held-out windows."""
    n = min(cfg.probe_sequences, vx.shape[0])
    return list(vx[:n].split(cfg.probe_batch))


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


def final_readings(cfg: GridConfig, model: Any, vx: Any, train: Any) -> dict[str, Any]:
    """The study's protocol on the final weights: ``satmon.probe`` in eval mode under bf16 autocast on
    held-out sequences; plus the centered saturation of the same forwards, each layer's alpha, and
    the pooled reading on as many training-split windows (the study's code read its training split)."""
    import torch

    import satmon

    batches = probe_batches(cfg, vx)
    report = satmon.probe(model, batches, autocast_dtype=torch.bfloat16, step=cfg.steps)
    v = report.verdict
    n = min(cfg.probe_sequences, (train.numel() - 1) // cfg.seq_len)
    seen = train[: n * cfg.seq_len].view(n, cfg.seq_len).split(cfg.probe_batch)  # (n, T) windows of the training split
    on_train = satmon.probe(model, list(seen), autocast_dtype=torch.bfloat16, step=cfg.steps).verdict
    alphas = {l.name: float(l.module.alpha.detach().abs().max()) for l in satmon.find_dyt_layers(model)}
    return {"final_saturation": v.saturation, "final_first_block": first_block(v.per_layer), "final_decision": v.decision,
            "final_per_layer": dict(v.per_layer), **final_offset(model, batches), "final_alpha": alphas,
            "probe_tokens": sum(b.numel() for b in batches), "final_saturation_train": on_train.saturation}


# ------------------------------------------------------------------------------------------------ a cell
def run_cell(cfg: GridConfig, size: Size, budget: int, seed: int, threads: int = 1) -> dict[str, Any]:
    """Train both arms of one cell (LayerNorm, then DyT) and return its record (plain JSON values)."""
    import torch

    _quiet()
    torch.set_num_threads(threads)
    t0, c0 = time.perf_counter(), time.process_time()
    data = corpus(cfg)
    train_all, vx, vy = data
    arms = {norm: train_arm(cfg, size, budget, seed, norm, data) for norm in ("layernorm", "dyt")}
    ln, dyt = arms["layernorm"], arms["dyt"]
    uni = unigram_loss(train_all[:budget], vy)
    params = sum(p.numel() for p in dyt["model"].parameters())
    cell: dict[str, Any] = {
        "name": cell_name(size, budget, seed), "group": size.name, "d_model": size.d_model, "n_layers": size.n_layers,
        "params": params, "train_tokens": budget, "seed": seed,
        "epochs": cfg.steps * cfg.batch_size * cfg.seq_len / budget,
        "steps": cfg.steps, "window": cfg.window, "alpha_init": cfg.alpha_init, "emb_scale": emb_scale(cfg, size),
        "val_loss_dyt": dyt["val_loss"], "val_loss_layernorm": ln["val_loss"], "unigram_loss": uni,
        "delta": (dyt["val_loss"] - ln["val_loss"]) / ln["val_loss"],
    }
    cell["helps"] = cell["delta"] < 0
    cell["learns"] = dyt["val_loss"] < uni and ln["val_loss"] < uni
    cell.update(window_readings(dyt["verdict"]))
    cell["window_alpha"] = dyt["window_alpha"]
    cell.update(final_readings(cfg, dyt["model"], vx, train_all[:budget]))
    cell.update({
        "best_val_loss_dyt": min(v for _, v in dyt["val_curve"]), "best_val_loss_layernorm": min(v for _, v in ln["val_curve"]),
        "val_curve_dyt": dyt["val_curve"], "val_curve_layernorm": ln["val_curve"],
        "cpu_seconds": time.process_time() - c0, "wall_seconds": time.perf_counter() - t0, "threads": threads,
        "config": cfg.shared(),
    })
    return cell


def _worker(cfg: GridConfig, size: Size, budget: int, seed: int) -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return run_cell(cfg, size, budget, seed, threads=1)


# ------------------------------------------------------------------------------------ the grid, cached
class Progress:
    """A plain-text progress bar on stderr: one line per finished cell (no dependency)."""

    def __init__(self, total: int, done: int, width: int = 24) -> None:
        self.total, self.done, self.width, self.t0, self.fresh = total, done, width, time.perf_counter(), 0

    def line(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def advance(self, cell: dict[str, Any]) -> None:
        self.done += 1
        self.fresh += 1
        filled = round(self.width * self.done / self.total)
        took = time.perf_counter() - self.t0
        left = took / self.fresh * (self.total - self.done)
        self.line(f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} cells, {took / 60:.1f} min, "
                  f"~{left / 60:.0f} min left | {cell['name']}: LN {cell['val_loss_layernorm']:.3f} DyT "
                  f"{cell['val_loss_dyt']:.3f} ({cell['delta'] * 100:+.1f}%, unigram {cell['unigram_loss']:.3f}) "
                  f"window {cell['window_saturation']:.3f} final {cell['final_saturation']:.3f} "
                  f"[{cell['cpu_seconds']:.0f} s CPU]")


def load_cached(path: Path, cfg: GridConfig) -> dict[str, Any] | None:
    """A cached cell made with the same shared configuration, else ``None`` (it will be re-run)."""
    try:
        cell = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return cell if cell.get("config") == json.loads(json.dumps(cfg.shared())) else None


def run_grid(cfg: GridConfig, out: Path, jobs: int = 2) -> list[dict[str, Any]]:
    """Run every cell not cached under ``out/cells``, ``jobs`` at a time; return all cells in grid order."""
    cfg.check()
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    keys = cell_keys(cfg)
    cells: dict[str, dict[str, Any]] = {}
    todo = []
    for size, budget, seed in keys:
        name = cell_name(size, budget, seed)
        cached = load_cached(cells_dir / f"{name}.json", cfg)
        if cached is not None:
            cells[name] = cached
        else:
            todo.append((size, budget, seed))
    bar = Progress(len(keys), len(cells))
    bar.line(f"regime_grid: {len(keys)} cells ({len(cells)} cached), {len(todo)} to run, {jobs} at a time, "
             f"{cfg.steps} steps each (window {cfg.window}) -> {out}")

    def keep(cell: dict[str, Any]) -> None:
        cells[cell["name"]] = cell
        tmp = cells_dir / f".{cell['name']}.json.tmp"  # write then rename: a killed run leaves no half cell
        tmp.write_text(json.dumps(cell, indent=1) + "\n")
        tmp.replace(cells_dir / f"{cell['name']}.json")
        bar.advance(cell)

    if jobs <= 1:
        for key in todo:
            keep(run_cell(cfg, *key, threads=1))
    elif todo:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            pending = {pool.submit(_worker, cfg, *key) for key in todo}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    keep(f.result())
    order = [cell_name(*k) for k in sorted(keys, key=lambda k: (k[0].d_model, k[0].n_layers, k[1], k[2]))]
    return [cells[n] for n in order]


def write_grid(cfg: GridConfig, cells: list[dict[str, Any]], path: Path, mode: str, command: str, wall: float) -> None:
    """The grid's JSON: the cells (``satmon calibrate --cells`` reads ``group``, ``delta`` and every
    numeric field as a reading), the configuration and the timings."""
    cpu = [c["cpu_seconds"] for c in cells]
    payload = {
        "format": "satmon-cells", "mode": mode, "readings": list(READINGS), "command": command,
        "outcome": "delta = (DyT - LayerNorm) / LayerNorm final held-out loss; negative = DyT helps",
        "group": "model size: leave-one-group-out is leave-one-size-out",
        "window_readings": "satmon.Screen's verdict over the first `window` steps of the DyT run (pooled, per layer, "
                           "first block = mean of blocks.0.ln_1/ln_2; centered = the verdict's offset readings, "
                           "sampled every offset_every steps, pooled over layers)",
        "final_readings": "satmon.probe on the final weights, eval mode, bf16 autocast, probe_sequences held-out "
                          "sequences; final_centered from satmon.functional.offset on the same forwards",
        "config": {**asdict(cfg)},
        "timing": {"cells": len(cells), "cpu_seconds_per_cell": {c["name"]: round(c["cpu_seconds"], 1) for c in cells},
                   "cpu_seconds_sum": sum(cpu), "wall_seconds_this_run": wall},
        "cells": cells,
    }
    path.write_text(json.dumps(payload, indent=1, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    raise TypeError(f"Expected plain JSON values in a cell, got {type(o).__name__}")


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


def slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = slope * x + intercept``."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    s = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx if sxx > 0 else math.nan
    return s, my - s * mx


def bootstrap(x: Sequence[float], y: Sequence[float], stat: Callable, n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of ``stat(x, y)`` over cells resampled with replacement (undefined draws,
    e.g. all one cell, are skipped)."""
    rng = random.Random(seed)
    m = len(x)
    vals = []
    for _ in range(n):
        idx = [rng.randrange(m) for _ in range(m)]
        v = stat([x[i] for i in idx], [y[i] for i in idx])
        if isinstance(v, tuple):
            v = v[0]
        if math.isfinite(v):
            vals.append(v)
    if not vals:  # e.g. a reading constant over the cells
        return math.nan, math.nan
    vals.sort()
    return vals[int(0.025 * len(vals))], vals[min(len(vals) - 1, int(0.975 * len(vals)))]


def _demeaned(cells: list[dict[str, Any]], key: str) -> list[float]:
    """``cell[key]`` minus the mean of its group (model size)."""
    means = {g: sum(c[key] for c in cells if c["group"] == g) / sum(c["group"] == g for c in cells)
             for g in {c["group"] for c in cells}}
    return [c[key] - means[c["group"]] for c in cells]


def window_delta(cell: dict[str, Any]) -> float | None:
    """DyT's relative effect on the held-out loss at the window's end (both arms evaluated there), or
    ``None`` when the curves have no evaluation at that step."""
    at = {norm: dict(map(tuple, cell[f"val_curve_{norm}"])).get(cell["window"]) for norm in ("dyt", "layernorm")}
    if at["dyt"] is None or at["layernorm"] is None:
        return None
    return (at["dyt"] - at["layernorm"]) / at["layernorm"]


def statistics(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything docs/calibration.md reports, from the cells alone (reproducible from the JSON)."""
    from satmon.functional.threshold_fit import (
        accuracy,
        auc,
        fit_threshold,
        leave_one_group_out,
    )

    helps = [bool(c["delta"] < 0) for c in cells]
    groups = [c["group"] for c in cells]
    out: dict[str, Any] = {"n": len(cells), "helps": sum(helps), "groups": sorted(set(groups)),
                           "always_no_go": helps.count(False) / len(helps),
                           "learns": sum(c["val_loss_dyt"] < c["unigram_loss"] and c["val_loss_layernorm"] < c["unigram_loss"]
                                         for c in cells)}
    # a baseline that needs no saturation: both arms' held-out loss at the window's end, compared
    at_window = [window_delta(c) for c in cells]
    if all(d is not None for d in at_window):
        out["window_loss_sign"] = {"correct": sum((d < 0) == h for d, h in zip(at_window, helps)),
                                   "helps_at_window": sum(d < 0 for d in at_window)}
    out["pairs"] = {}
    by_size = sorted(set(groups), key=lambda g: next(c.get("params", 0) for c in cells if c["group"] == g))
    for w, f in PAIRS:
        x, y = [c[w] for c in cells], [c[f] for c in cells]
        s, b = slope(x, y)
        # the level of a reading shifts with model size; within a size, does the window still rank the final?
        xd, yd = _demeaned(cells, w), _demeaned(cells, f)
        out["pairs"][f"{w} -> {f}"] = {
            "spearman_within": {g: spearman([c[w] for c in cells if c["group"] == g], [c[f] for c in cells if c["group"] == g])
                                for g in by_size},
            "spearman_demeaned": spearman(xd, yd), "spearman_demeaned_ci": bootstrap(xd, yd, spearman),
            "spearman": spearman(x, y), "spearman_ci": bootstrap(x, y, spearman), "pearson": pearson(x, y),
            "slope": s, "intercept": b, "slope_ci": bootstrap(x, y, slope),
            "final_minus_window_mean": sum(b_ - a for a, b_ in zip(x, y)) / len(x),
            "same_side_of_043": sum((a >= STUDY_THRESHOLD) == (b_ >= STUDY_THRESHOLD) for a, b_ in zip(x, y)),
        }
    out["readings"] = {}
    for r in READINGS:
        scores = [c[r] for c in cells]
        mid, bal = fit_threshold(scores, helps, "midpoint"), fit_threshold(scores, helps, "balanced")
        cv_mid = leave_one_group_out(scores, helps, groups, "midpoint")
        cv_bal = leave_one_group_out(scores, helps, groups, "balanced")
        out["readings"][r] = {
            "auc": auc(scores, helps), "min": min(scores), "max": max(scores),
            "midpoint": {"threshold": mid.threshold, "accuracy": mid.accuracy, "outside": mid.threshold_outside,
                         "logo": cv_mid.accuracy, "logo_correct": cv_mid.correct, "logo_balanced": cv_mid.balanced_accuracy,
                         "folds": [(f.group, f.threshold, f.correct, f.n) for f in cv_mid.folds]},
            "balanced": {"threshold": bal.threshold, "balanced_accuracy": bal.balanced_accuracy, "accuracy": bal.accuracy,
                         "logo": cv_bal.accuracy, "logo_correct": cv_bal.correct, "logo_balanced": cv_bal.balanced_accuracy},
            "study_043": accuracy(scores, helps, STUDY_THRESHOLD),
        }
    return out


def report_markdown(stats: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    """The statistics as markdown tables (what docs/calibration.md quotes)."""
    n = stats["n"]
    lines = [(f"{n} cells in {len(stats['groups'])} groups ({', '.join(stats['groups'])}); both arms below the unigram "
              f"loss in {stats['learns']}/{n}; DyT helped in {stats['helps']}, hurt in {n - stats['helps']}; "
              f"always NO-GO: {round(stats['always_no_go'] * n)}/{n} = {stats['always_no_go']:.2f}."), "",
             ("| cell | unigram | val LN | val DyT | DyT vs LN | window sat. | final sat. | window first block | "
              "final first block | window centered | final centered |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c['name']} | {c['unigram_loss']:.3f} | {c['val_loss_layernorm']:.3f} | {c['val_loss_dyt']:.3f} | "
                     f"{c['delta'] * 100:+.1f}% | {c['window_saturation']:.3f} | {c['final_saturation']:.3f} | "
                     f"{c['window_first_block']:.3f} | {c['final_first_block']:.3f} | {c['window_centered']:.3f} | "
                     f"{c['final_centered']:.3f} |")
    lines += ["", ("| window -> final | Spearman rho [95% bootstrap] | Pearson r | slope [95% bootstrap] | intercept | "
                   "mean final - window | same side of 0.43 |"), "|---|---|---|---|---|---|---|"]
    for k, p in stats["pairs"].items():
        lines.append(f"| {k} | {p['spearman']:.2f} [{p['spearman_ci'][0]:.2f}, {p['spearman_ci'][1]:.2f}] | "
                     f"{p['pearson']:.2f} | {p['slope']:.2f} [{p['slope_ci'][0]:.2f}, {p['slope_ci'][1]:.2f}] | "
                     f"{p['intercept']:+.3f} | {p['final_minus_window_mean']:+.3f} | {p['same_side_of_043']}/{n} |")
    lines += ["", "| window -> final, within a model size | " + " | ".join(
        f"Spearman rho, {g}" for g in next(iter(stats["pairs"].values()))["spearman_within"]) +
        " | rho after removing each size's mean [95% bootstrap] |",
        "|---|" + "---|" * (len(next(iter(stats["pairs"].values()))["spearman_within"]) + 1)]
    for k, p in stats["pairs"].items():
        lines.append(f"| {k} | " + " | ".join(f"{v:.2f}" for v in p["spearman_within"].values()) +
                     f" | {p['spearman_demeaned']:.2f} [{p['spearman_demeaned_ci'][0]:.2f}, {p['spearman_demeaned_ci'][1]:.2f}] |")
    lines += ["", ("| reading | range | AUC | midpoint t | in-sample | leave-one-group-out | balanced t | balanced acc. | "
                   "leave-one-group-out (balanced) | 0.43's accuracy |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for r, s in stats["readings"].items():
        m, b = s["midpoint"], s["balanced"]
        lines.append(f"| {r} | {s['min']:.3f}-{s['max']:.3f} | {s['auc']:.2f} | {m['threshold']:.4f}"
                     f"{' (outside)' if m['outside'] else ''} | {m['accuracy']:.2f} | {m['logo_correct']}/{n} = {m['logo']:.2f} | "
                     f"{b['threshold']:.4f} | {b['balanced_accuracy']:.2f} | {b['logo_correct']}/{n} = {b['logo']:.2f} | "
                     f"{s['study_043']:.2f} |")
    lines.append(f"| always NO-GO | | 0.50 | | {stats['always_no_go']:.2f} | {stats['always_no_go']:.2f} | | 0.50 | | |")
    if "window_loss_sign" in stats:
        w = stats["window_loss_sign"]
        lines.append(f"| baseline: sign of DyT vs LN held-out loss at the window's end (no fit) | | | | "
                     f"{w['correct']}/{n} = {w['correct'] / n:.2f} | {w['correct']}/{n} = {w['correct'] / n:.2f} | | | | |")
    lines.append(f"| study (12 cells, final pooled saturation) | 0.193-0.493 | 0.75 | 0.4398 | {STUDY_IN_SAMPLE:.2f} | "
                 f"6/12 = {STUDY_LOSO:.2f} | 0.2651 | 0.75 | 7/12 = 0.58 | 0.75 |")
    return "\n".join(lines)


def plot(stats: dict[str, Any], cells: list[dict[str, Any]], path: Path) -> None:
    """Final vs window reading per cell for each pair (pooled, first block, centered) with the
    least-squares line; last panel: the pooled readings against DyT's effect."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 8.5), dpi=110, layout="constrained")
    axes = list(fig.subplots(2, 2).flat)
    groups = sorted({c["group"] for c in cells}, key=lambda g: next(c["params"] for c in cells if c["group"] == g))
    markers = dict(zip(groups, "osD^v"))
    for ax, (w, f) in zip(axes[:3], PAIRS):
        for c in cells:
            ax.scatter(c[w], c[f], marker=markers[c["group"]], s=38, edgecolor="black", linewidths=0.5,
                       color="tab:green" if c["delta"] < 0 else "tab:red")
        p = stats["pairs"][f"{w} -> {f}"]
        lo = min(min(c[w] for c in cells), min(c[f] for c in cells))
        hi = max(max(c[w] for c in cells), max(c[f] for c in cells))
        ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8, ls=":", label="final = window")
        ax.plot([lo, hi], [p["slope"] * lo + p["intercept"], p["slope"] * hi + p["intercept"]], color="black", lw=1,
                label=f"fit: slope {p['slope']:.2f}")
        if w == "window_saturation":  # the study's threshold is on the pooled reading only
            ax.axvline(STUDY_THRESHOLD, color="gray", lw=0.8, ls="--")
            ax.axhline(STUDY_THRESHOLD, color="gray", lw=0.8, ls="--")
        ax.set(xlabel=f"{w} (first {cells[0]['window']} steps)", ylabel=f"{f} (step {cells[0]['steps']})",
               title=f"{w.removeprefix('window_')}: Spearman rho {p['spearman']:.2f} "
                     f"[{p['spearman_ci'][0]:.2f}, {p['spearman_ci'][1]:.2f}] (95% bootstrap)")
        ax.legend(fontsize=7, loc="lower right")
    ax = axes[3]
    for c in cells:
        ax.scatter(c["window_saturation"], 100 * c["delta"], marker=markers[c["group"]], s=38, edgecolor="black",
                   linewidths=0.5, color="tab:blue", label=None)
        ax.scatter(c["final_saturation"], 100 * c["delta"], marker=markers[c["group"]], s=38, edgecolor="black",
                   linewidths=0.5, color="tab:orange")
    for g in groups:
        ax.scatter([], [], marker=markers[g], color="white", edgecolor="black", label=g)
    ax.scatter([], [], color="tab:blue", label="window pooled")
    ax.scatter([], [], color="tab:orange", label="final pooled")
    ax.axhline(0, color="gray", lw=0.8)
    ax.axvline(STUDY_THRESHOLD, color="gray", lw=0.8, ls="--", label="study 0.43")
    ax.set(xlabel="pooled saturation", ylabel="DyT vs LayerNorm final held-out loss (%)",
           title="DyT's effect (< 0: helps) against the reading")
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("regime_grid: green = DyT helped, red = DyT hurt; markers = model size", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def calibrate_all(json_path: Path, out: Path) -> dict[str, int]:
    """``satmon calibrate --cells JSON --metric M --out out/M`` for every reading, through the console
    command's entry point (in this process: no interpreter start per reading); its console text goes
    to ``out/M/stdout.txt``. Returns the exit code per reading (2: the cells cannot be fitted, e.g. one
    class only; the text says why)."""
    import contextlib
    import io

    # the `satmon` console script's entry point
    from satmon.cli.main import main as satmon_main

    codes = {}
    for metric in READINGS:
        dest = out / metric
        dest.mkdir(parents=True, exist_ok=True)
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            codes[metric] = satmon_main(["calibrate", "--cells", str(json_path), "--metric", metric, "--out", str(dest)])
        (dest / "stdout.txt").write_text(text.getvalue())
    return codes


def report(json_path: Path, out_md: Path | None, plot_path: Path | None) -> str:
    """The statistics of a finished grid's JSON as markdown (and the plot)."""
    cells = json.loads(json_path.read_text())["cells"]
    stats = statistics(cells)
    text = report_markdown(stats, cells)
    if out_md is not None:
        out_md.write_text(text + "\n")
    if plot_path is not None:
        plot(stats, cells, plot_path)
    return text


# ------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="4 cells of the full grid (2 sizes x 2 budgets, seed 0): a few minutes")
    mode.add_argument("--smoke", action="store_true", help="4 tiny cells, 6 steps (window 2): the test suite's check")
    mode.add_argument("--report", metavar="JSON", help="only the statistics of a finished grid's JSON (no training)")
    p.add_argument("--out", default="regime_grid_out", help="output directory (default ./regime_grid_out)")
    p.add_argument("--jobs", type=int, default=2, help="cells trained at once, one thread each (default 2)")
    p.add_argument("--plot", default=None, help="with --report: write the plot there")
    p.add_argument("--alpha-init", type=float, default=None, help="override DyT's alpha_init (default 2.0, the study's)")
    p.add_argument("--emb-scale", type=float, default=None, help="override the embedding multiplier (default sqrt(d_model))")
    p.add_argument("--lr", type=float, default=None, help="override the peak learning rate (default 3e-3)")
    p.add_argument("--steps", type=int, default=None, help="override the steps per arm (>= 3 windows)")
    p.add_argument("--no-calibrate", action="store_true", help="skip running `satmon calibrate` on every reading")
    args = p.parse_args(argv)
    if args.report:
        print(report(Path(args.report), None, Path(args.plot) if args.plot else None))
        return 0
    if args.jobs < 1:
        p.error(f"expected --jobs >= 1, got {args.jobs}")
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    cfg = MODES[name]
    for key, value in (("alpha_init", args.alpha_init), ("emb_scale", args.emb_scale), ("lr", args.lr), ("steps", args.steps)):
        if value is not None:
            cfg = replace(cfg, **{key: value})
    try:
        cfg.check()
    except ValueError as e:
        p.error(str(e))
    out = Path(args.out)
    command = "python examples/regime_grid.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    cells = run_grid(cfg, out, args.jobs)
    wall = time.perf_counter() - t0
    write_grid(cfg, cells, out / "regime_grid.json", name, command, wall)
    text = report(out / "regime_grid.json", out / "report.md", out / "regime_grid.png")
    print(text)
    cpu = sum(c["cpu_seconds"] for c in cells)
    print(f"\n{len(cells)} cells; this run {wall / 60:.1f} min wall; CPU {cpu / 60:.1f} min summed over cells. "
          f"Wrote {out / 'regime_grid.json'}, {out / 'report.md'}, {out / 'regime_grid.png'}")
    if not args.no_calibrate:
        codes = calibrate_all(out / "regime_grid.json", out / "calibrate")
        bad = {m: c for m, c in codes.items() if c != 0}
        print(f"satmon calibrate on {len(codes)} readings: {out / 'calibrate'}/<reading>/"
              + (f"; could not fit {sorted(bad)} (see their stdout.txt)" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
