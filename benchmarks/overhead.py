"""Step-time overhead of satmon, measured the way a user would pay it: a Lightning ``Trainer`` loop.

Trains satmon's GPT-2-style DyT model at two widths (``demo``: the ``satmon demo`` model, d=64;
``wide``: d=512) for a fixed number of optimizer steps, many times, in ONE process, alternating the
configurations below (interleaved, the order rotated each repeat) so that a noisy, shared machine
drifts into every configuration alike:

- ``off``        no monitor (the reference);
- ``off-again``  no monitor again: the A/A control, its ratio is the noise floor of this run;
- ``window``     ``SaturationMonitor`` at default settings, every measured step inside the window;
- ``sampled``    the same with ``sample_every=4`` (satmon's cheaper sampling option);
- ``after``      steps after the window, collapse watch off (``watch_every_n_steps=0``): should be 1.00;
- ``watch``      steps after the window, collapse watch at its default cadence (every 50 steps);
- ``user-item``  what users write without satmon: a forward hook per DyT layer computing the
  saturated fraction and calling ``.item()`` on it at every forward;
- ``paired``     the window with ``sample_every=2``: counted and uncounted steps alternate within
  one run, so each counted step is compared with its two uncounted neighbours (a paired estimate
  of the window's hot-path cost that slow load drifts on a shared machine cannot bias; the same
  even/odd comparison on the ``off`` runs is its control).

Per-step time is the time between consecutive ``on_train_batch_start`` calls (a whole optimizer
step: data, forward, backward, optimizer, every callback). Reported: the 20th percentile (robust to
the other tenants of a shared machine) and the median of the pooled per-step times, and their
ratios to ``off``. The Trainer runs with ``logger=False``, no checkpointing, no progress bar, and a
``log_every_n_steps`` longer than the run, so satmon's logging steps (one host transfer each
``log_every_n_steps``) are not in the measured span; the watch's check steps are (1 in 50).

On CUDA (``--device cuda``) every measured step except the watch's check steps also runs under
``torch.cuda.set_sync_debug_mode``: first ``"warn"`` for every configuration (syncs counted), then,
where the no-monitor baseline itself is sync-free, ``"error"`` for the satmon configurations: a
run that finishes proves zero host syncs in satmon's per-step path.

Usage::

    python benchmarks/overhead.py                        # CPU, demo and wide models, markdown table
    python benchmarks/overhead.py --models wide --repeats 12 --steps 40
    python benchmarks/overhead.py --device cuda
    python benchmarks/overhead.py --smoke                # tiny, correctness only (the test suite)
    python benchmarks/overhead.py --profile-hook         # where the hook's time goes, per op
    python benchmarks/overhead.py --pool a.json b.json   # paired estimates of earlier --json runs, pooled
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from satmon import SaturationMonitor, find_dyt_layers
from satmon.demos.corpus import corpus_tokens
from satmon.demos.lit import LitLM

CONFIGS = ("off", "off-again", "window", "sampled", "after", "watch", "user-item", "paired")
LABELS = {
    "off": "no monitor (reference)",
    "off-again": "no monitor, again (A/A noise floor)",
    "window": "(a) window, default settings",
    "sampled": "(b) window, sample_every=4",
    "after": "(c) after the window, watch off",
    "watch": "(d) after the window, collapse watch (default cadence, 50)",
    "user-item": "(e) user hook with .item() per layer",
    "paired": "window, sample_every=2 (for the paired estimate)",
}
MONITORED = ("window", "sampled", "after", "watch", "paired")
SAMPLED_EVERY = 4  # the ``sampled`` configuration's ``sample_every``


@dataclass
class ModelSpec:
    name: str
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch_size: int

    def describe(self) -> str:
        return f"d={self.d_model}, {self.n_layers} blocks, seq {self.seq_len}, batch {self.batch_size}"


MODELS_CPU = {
    "demo": ModelSpec("demo", 64, 2, 4, 64, 16),  # satmon demo's model and batch
    "wide": ModelSpec("wide", 512, 4, 8, 128, 2),
}
MODELS_CUDA = {  # large enough that a step is not launch-bound
    "demo": ModelSpec("demo", 64, 2, 4, 64, 16),
    "wide": ModelSpec("wide", 1024, 8, 16, 512, 16),
}
MODELS_SMOKE = {
    "demo": ModelSpec("demo", 32, 1, 2, 16, 4),
    "wide": ModelSpec("wide", 64, 2, 4, 16, 2),
}


class BenchLM(LitLM):
    """``LitLM`` without ``self.log``: Lightning's own logging stays out of the measurement."""

    def training_step(self, batch, batch_idx):
        return self._loss(batch)


class StepTimer(Callback):
    """Timestamps at every ``on_train_batch_start`` (after a device sync on CUDA), keyed by the step."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.stamps: list[tuple[int, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # the timer's sync, outside the audited span
        self.stamps.append((trainer.global_step, time.perf_counter()))

    def step_times(self, first: int, last: int) -> list[float]:
        """Seconds taken by optimizer steps ``first <= g < last`` (``g``: global step at their start)."""
        out = []
        for (g, t0), (_, t1) in zip(self.stamps, self.stamps[1:]):
            if first <= g < last:
                out.append(t1 - t0)
        return out


class SyncAudit:
    """Two callbacks bracketing every other callback: ``set_sync_debug_mode(mode)`` from the start of a
    measured step's ``on_train_batch_start`` to the end of its ``on_train_batch_end``."""

    def __init__(self, mode: str, first: int, last: int, skip: set[int]) -> None:
        self.mode, self.first, self.last, self.skip = mode, first, last, skip
        self.steps = 0
        audit = self

        class On(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                g = trainer.global_step
                if audit.first <= g < audit.last and g not in audit.skip:
                    audit.steps += 1
                    torch.cuda.set_sync_debug_mode(audit.mode)

        class Off(Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                torch.cuda.set_sync_debug_mode(0)

        self.on, self.off = On(), Off()


class UserItemHook(Callback):
    """The baseline users write: per DyT layer, the saturated fraction, ``.item()`` at every forward."""

    def __init__(self, level: float = 2.0) -> None:
        self.level = level
        self.fractions: list[float] = []
        self.handles: list[Any] = []

    def on_train_start(self, trainer, pl_module) -> None:
        for layer in find_dyt_layers(pl_module):
            self.handles.append(layer.module.register_forward_hook(self._hook))

    def _hook(self, mod, args, out) -> None:
        if mod.training:
            with torch.no_grad():
                self.fractions.append(((mod.alpha * args[0]).abs() > self.level).float().mean().item())

    def on_train_end(self, trainer, pl_module) -> None:
        for h in self.handles:
            h.remove()


def _loader(spec: ModelSpec, steps: int, device: str) -> DataLoader:
    """One epoch of exactly ``steps`` batches of corpus windows, already on ``device``."""
    n = steps * spec.batch_size
    tokens = corpus_tokens(n * (spec.seq_len + 1))
    w = tokens.view(n, spec.seq_len + 1).to(device)
    return DataLoader(TensorDataset(w[:, :-1], w[:, 1:]), batch_size=spec.batch_size, shuffle=False)


@dataclass
class Plan:
    warmup: int  # steps before the measured span (the window of `after`/`watch` ends inside it)
    measured: int
    window_small: int
    watch_every: int

    @property
    def total(self) -> int:
        return self.warmup + self.measured + 1  # +1: the last measured step needs a following timestamp


def run_once(spec: ModelSpec, config: str, plan: Plan, device: str, audit_mode: str | None = None) -> dict[str, Any]:
    """Train one configuration; return its measured per-step times, its verdict and its sync audit."""
    pl.seed_everything(0, verbose=False)
    cuda = device == "cuda"
    model = BenchLM(arch="gpt", d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads,
                    seq_len=spec.seq_len, norm="dyt", alpha_init=2.0, lr=1e-3, warmup=10)
    timer = StepTimer(cuda)
    first, last = plan.warmup, plan.warmup + plan.measured
    quiet = plan.total + 1  # satmon's log interval: never inside the run
    monitor: SaturationMonitor | None = None
    if config == "window":
        monitor = SaturationMonitor(window=plan.total, log_every_n_steps=quiet, verbose=False)
    elif config == "paired":
        monitor = SaturationMonitor(window=plan.total, sample_every=2, log_every_n_steps=quiet, verbose=False)
    elif config == "sampled":
        monitor = SaturationMonitor(window=plan.total, sample_every=SAMPLED_EVERY, log_every_n_steps=quiet, verbose=False)
    elif config == "after":
        monitor = SaturationMonitor(window=plan.window_small, watch_every_n_steps=0, log_every_n_steps=quiet, verbose=False)
    elif config == "watch":
        monitor = SaturationMonitor(window=plan.window_small, watch_every_n_steps=plan.watch_every,
                                    log_every_n_steps=quiet, verbose=False)
    callbacks: list[Callback] = [timer]
    user = UserItemHook() if config == "user-item" else None
    extra: list[Callback] = [c for c in (monitor, user) if c is not None]
    audit = None
    if audit_mode:
        # the watch's check steps sync by design (that is when its counts are read)
        skip = {g for g in range(first, last) if config == "watch" and g % plan.watch_every == 0}
        audit = SyncAudit(audit_mode, first, last, skip)
        callbacks += [audit.on, *extra, audit.off]
    else:
        callbacks += extra
    trainer = pl.Trainer(
        max_steps=plan.total, accelerator="cuda" if cuda else "cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=quiet, callbacks=callbacks,
    )
    syncs = 0
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(model, _loader(spec, plan.total, device))
        except RuntimeError as e:  # "error" sync mode: a synchronizing op raised
            if audit_mode != "error":
                raise
            error = str(e).splitlines()[0]
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    out: dict[str, Any] = {"times": timer.step_times(first, last)}
    if monitor is not None:
        v = monitor.verdict
        out["verdict"] = None if v is None else {"decision": v.decision, "saturation": v.saturation, "step": v.step,
                                                  "elements": v.elements}
        out["watch_checks"] = len(monitor.watch_log)
    if user is not None:
        out["user_fractions"] = len(user.fractions)
    if audit is not None:
        out["audit"] = {"mode": audit_mode, "steps": audit.steps, "syncs": syncs, "error": error}
    return out


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), no numpy needed."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def neighbour_ratios(run: list[float], first: int, every: int = 2) -> list[float]:
    """For every step ``g`` of one run with ``g % every == 0``: ``t_g / mean(t_{g-1}, t_{g+1})`` (its two neighbours)."""
    return [run[i] / ((run[i - 1] + run[i + 1]) / 2) for i in range(1, len(run) - 1) if (first + i) % every == 0]


def paired_estimate(runs: dict[str, list[list[float]]], first: int) -> dict[str, float] | None:
    """Median neighbour ratio of the counted steps over that of the same steps of the ``off`` runs (control).

    From the ``paired`` runs (``sample_every=2``): the window's cost per counted step. From the
    ``sampled`` runs (``sample_every=4``) when present: the same, measured again, and divided by 4
    (one step in four is counted; the other three run idle hooks only) as that setting's overhead.
    """
    if "paired" not in runs or not runs["paired"]:
        return None
    ratios = lambda c, k: [r for run in runs[c] for r in neighbour_ratios(run, first, k)]
    counted2, control2 = ratios("paired", 2), ratios("off", 2)
    counted, control = quantile(counted2, 0.5), quantile(control2, 0.5)
    lo, hi = bootstrap_interval(counted2, control2)
    out = {"counted_vs_neighbours": counted, "control_even_vs_odd": control, "ratio": counted / control,
           "ratio_lo": lo, "ratio_hi": hi}
    if runs.get("sampled"):
        counted4, control4 = ratios("sampled", SAMPLED_EVERY), ratios("off", SAMPLED_EVERY)
        c4, k4 = quantile(counted4, 0.5), quantile(control4, 0.5)
        lo4, hi4 = bootstrap_interval(counted4, control4)
        per_step = lambda r: 1 + (r - 1) / SAMPLED_EVERY
        out.update({"sampled_counted_vs_neighbours": c4, "sampled_control": k4,
                    "sampled_step_ratio": per_step(c4 / k4), "sampled_step_lo": per_step(lo4), "sampled_step_hi": per_step(hi4)})
    return out


def bootstrap_interval(counted: list[float], control: list[float], level: float = 0.9, n: int = 2000) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``median(counted) / median(control)``, both resampled (seeded).

    How far the paired estimate could move by the luck of which steps were measured: a target is
    met with confidence only when the interval's upper end is below it.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = np.asarray(counted), np.asarray(control)
    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    ra = np.median(a[rng.integers(0, len(a), (n, len(a)))], axis=1)
    rb = np.median(b[rng.integers(0, len(b), (n, len(b)))], axis=1)
    lo, hi = np.quantile(ra / rb, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def summarise(times: dict[str, list[float]], q: float) -> dict[str, dict[str, float]]:
    ref = times["off"]
    ref_q, ref_m = quantile(ref, q), quantile(ref, 0.5)
    out = {}
    for c, ts in times.items():
        tq, tm = quantile(ts, q), quantile(ts, 0.5)
        out[c] = {"q": tq, "median": tm, "ratio_q": tq / ref_q, "ratio_median": tm / ref_m, "n": len(ts)}
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        cpu = f"{names[0]} x {len(names)}" if names else cpu
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{cpu}{gpu}; torch {torch.__version__}, lightning {pl.__version__}, python {platform.python_version()}, "
            f"torch threads {torch.get_num_threads()}")


def table(results: dict[str, Any], q: float, markdown: bool, cuda: bool) -> str:
    qs = f"p{round(q * 100)}"
    head = ["model", "configuration", f"{qs} ms/step", "median ms/step", f"ratio ({qs})", "ratio (median)", "steps"]
    if cuda:
        head.append("host syncs in measured steps")
    rows = []
    for m, r in results.items():
        for c, s in r["summary"].items():
            row = [m, LABELS[c], f"{s['q'] * 1e3:.2f}", f"{s['median'] * 1e3:.2f}", f"{s['ratio_q']:.4f}",
                   f"{s['ratio_median']:.4f}", str(s["n"])]
            if cuda:
                row.append(r.get("audit", {}).get(c, "-"))
            rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def audit_cuda(spec: ModelSpec, plan: Plan, configs: list[str]) -> dict[str, str]:
    """Count host syncs (warn mode) per configuration; prove zero for satmon with error mode when the
    baseline is sync-free. Returns a human cell per configuration."""
    short = Plan(plan.warmup, min(plan.measured, 2 * plan.watch_every + 1), plan.window_small, plan.watch_every)
    counts = {c: run_once(spec, c, short, "cuda", audit_mode="warn")["audit"] for c in configs}
    cells = {c: f"{a['syncs']} in {a['steps']} steps (warn)" for c, a in counts.items()}
    if counts["off"]["syncs"] == 0:
        for c in (c for c in configs if c in MONITORED):
            a = run_once(spec, c, short, "cuda", audit_mode="error")["audit"]
            cells[c] = (f"0 in {a['steps']} steps (error mode: proved)" if a["error"] is None
                        else f"sync in error mode: {a['error']}")
    else:
        base = counts["off"]["syncs"] / max(1, counts["off"]["steps"])
        for c in configs:
            extra = counts[c]["syncs"] / max(1, counts[c]["steps"]) - base
            cells[c] += f"; {extra:+.2f}/step vs no monitor"
    return cells


def profile_hook(spec: ModelSpec, device: str, reps: int) -> str:
    """Where the hook's time goes, per op: measured inside real training steps of ``spec``'s model,
    and the same ops in a warm loop on one input for contrast.

    Inside a step the activations and the allocator/dispatcher state are cold (the step just walked
    through every weight and optimizer state), and each op costs several times its warm-loop
    figure: that is why satmon's hook runs four tensor ops and nothing else, and why on a CPU the
    callback only keeps each input in the hook and counts them all after the forward
    (``keep_inputs``), where the same four ops per layer run back to back.
    """
    from collections import defaultdict

    from satmon.functional.saturation import saturation_threshold, saturation_threshold_host
    from satmon.demos.gpt import GPT, GPTConfig
    from satmon.core.saturation_hooks import SaturationCounter, SaturationHooks

    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, seq_len=spec.seq_len)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    layers = find_dyt_layers(model)
    hooks = SaturationHooks(layers, SaturationCounter(len(layers)).to(device))
    clock = time.perf_counter

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    spent: dict[str, list[float]] = defaultdict(list)
    buf = torch.empty(spec.batch_size, spec.seq_len, spec.d_model, dtype=torch.float32, device=device)

    def ops(x: Tensor, alpha: Tensor, record: bool) -> None:
        """The hook's hot path, one op at a time (what SaturationHooks runs, timed)."""
        stamps = [clock()]
        t = saturation_threshold_host(alpha.item(), 2.0) if device == "cpu" else saturation_threshold(alpha, 2.0)
        sync(); stamps.append(clock())
        ax = torch.abs(x, out=buf)
        sync(); stamps.append(clock())
        ax.sum()
        sync(); stamps.append(clock())
        ax.gt_(t)
        sync(); stamps.append(clock())
        ax.sum()
        sync(); stamps.append(clock())
        if record:
            names = ("threshold (read alpha, compute)", "abs(x) into the work buffer", "sum (non-finite flag)",
                     "in-place > threshold", "sum (saturated count)")
            for k, a, b in zip(names, stamps, stamps[1:]):
                spent[k].append(b - a)

    mode = {"v": "satmon"}
    start: dict[str, float] = {}

    def probe(mod, args, out) -> None:
        if mode["v"] == "ops":
            with torch.no_grad():
                ops(args[0].detach(), mod.alpha.detach(), record=True)

    count_row = "count_inputs() after the forward, per layer (keep_inputs)"
    hook_rows = {"satmon": "whole satmon hook, counting in the hook (in a step)",
                 "kept": "whole satmon hook, keep_inputs (as the callback runs it)",
                 "idle": "idle satmon hook (uncounted step)"}

    def before(mod, args, out) -> None:
        if mode["v"] in hook_rows:
            sync()
            start["t"] = clock()

    def after(mod, args, out) -> None:
        if mode["v"] in hook_rows:
            sync()
            spent[hook_rows[mode["v"]]].append(clock() - start["t"])

    for l in layers:
        l.module.register_forward_hook(before)
    hooks.attach()
    for l in layers:
        l.module.register_forward_hook(after)
        l.module.register_forward_hook(probe)
    w = corpus_tokens(reps * 4 * spec.batch_size * (spec.seq_len + 1)).view(-1, spec.seq_len + 1).to(device)

    def step(i: int) -> None:
        b = w[i * spec.batch_size : (i + 1) * spec.batch_size]
        logits = model(b[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())
        if mode["v"] == "kept":  # what SaturationMonitor.on_before_backward runs
            sync()
            t0 = clock()
            hooks.counter.count_inputs()
            sync()
            spent[count_row].append((clock() - t0) / len(layers))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    modes = ("satmon", "ops", "idle", "kept")
    for i in range(reps * len(modes)):
        mode["v"] = modes[i % len(modes)]
        hooks.enabled = mode["v"] in ("satmon", "kept")
        hooks.counter.keep_inputs = mode["v"] == "kept"
        step(i)
        hooks.counter.flush()
    warm: dict[str, float] = {}
    x = torch.randn(spec.batch_size, spec.seq_len, spec.d_model, device=device)
    alpha = torch.tensor([2.0], device=device)
    for _ in range(5):
        ops(x, alpha, record=False)
    before_warm = {k: len(v) for k, v in spent.items()}
    for _ in range(reps * 10):
        ops(x, alpha, record=True)
    for k, v in spent.items():
        if k in before_warm:
            warm[k] = quantile(v[before_warm[k]:], 0.5)
            del v[before_warm[k]:]
    hook = hooks._make_hook(0, layers[0].module)  # the hook satmon registers, called directly
    for name, enabled, keep in ((hook_rows["satmon"], True, False), (hook_rows["idle"], False, False),
                                (hook_rows["kept"], True, True)):
        hooks.enabled, hooks.counter.keep_inputs = enabled, keep
        t_warm, t_count = [], []
        for _ in range(reps * 10):
            t0 = clock()
            hook(layers[0].module, (x,), x)
            sync()
            t1 = clock()
            hooks.counter.count_inputs()
            sync()
            t_warm.append(t1 - t0)
            t_count.append(clock() - t1)
        warm[name] = quantile(t_warm, 0.5)
        if keep:
            warm[count_row] = quantile(t_count, 0.5)
    n = len(layers)
    lines = [f"Per-call cost of satmon's hook on the {spec.name} model's DyT inputs {tuple(x.shape)} ({x.numel():,} elements, "
             f"{device}), median over {reps} training steps x {n} DyT layers, against the same op in a warm loop on one input.",
             "| op | us per call, in a training step | x layers = us per step | us per call, warm loop |", "|---|---|---|---|"]
    for k, v in spent.items():
        med = quantile(v, 0.5)
        lines.append(f"| {k} | {med * 1e6:.1f} | {med * 1e6 * n:.0f} | {warm.get(k, float('nan')) * 1e6:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/overhead.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--models", default="demo,wide", help="comma-separated: demo, wide (default both)")
    p.add_argument("--steps", type=int, default=None, help="measured steps per run (default: demo 60, wide 24)")
    p.add_argument("--warmup", type=int, default=12, help="steps before the measured span (default 12)")
    p.add_argument("--repeats", type=int, default=12, help="interleaved repeats of every configuration (default 12)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {','.join(CONFIGS)} ('off' is always run)")
    p.add_argument("--quantile", type=float, default=0.2, help="the low quantile reported beside the median (default 0.2)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all CPU cores)")
    p.add_argument("--watch-every", type=int, default=50, help="collapse-watch cadence of the `watch` configuration (default 50)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 repeats, few steps: correctness only")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    p.add_argument("--json", default=None, help="also write every per-step time and summary to this JSON file")
    p.add_argument("--profile-hook", action="store_true", help="time the hook's ops on the wide model's DyT input, then exit")
    p.add_argument("--pool", nargs="+", metavar="JSON", default=None,
                   help="print the paired estimates of these earlier --json runs pooled together, then exit")
    args = p.parse_args(argv)
    if args.pool:
        return pool(args.pool)

    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/overhead.py: --device cuda asked for, but torch.cuda.is_available() is False.", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("satmon").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", ".*has no logger.*")
    cuda = args.device == "cuda"
    specs = MODELS_SMOKE if args.smoke else (MODELS_CUDA if cuda else MODELS_CPU)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in specs]
    if bad:
        p.error(f"expected --models from {sorted(specs)}, got {bad}")
    configs = ["off"] + [c for c in (c.strip() for c in args.configs.split(",")) if c and c != "off"]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        p.error(f"expected --configs from {CONFIGS}, got {bad}")
    if args.profile_hook:
        print(profile_hook(specs["wide"], args.device, reps=20 if not args.smoke else 2))
        return 0
    repeats = 2 if args.smoke else args.repeats
    watch_every = 4 if args.smoke else args.watch_every

    print(f"# satmon overhead benchmark ({args.device})\n\nMachine: {machine()}")
    print("Command: python benchmarks/overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    results: dict[str, Any] = {}
    t_start = time.perf_counter()
    for m in models:
        spec = specs[m]
        steps = 6 if args.smoke else (args.steps or (60 if m == "demo" else 24))
        warmup = 6 if args.smoke else args.warmup
        plan = Plan(warmup=warmup, measured=steps, window_small=max(1, warmup // 2), watch_every=watch_every)
        times: dict[str, list[float]] = {c: [] for c in configs}
        runs: dict[str, list[list[float]]] = {c: [] for c in configs}
        verdicts: dict[str, list[Any]] = {c: [] for c in configs}
        for r in range(repeats):
            order = configs[r % len(configs):] + configs[: r % len(configs)]  # rotate: no configuration always first
            for c in order:
                out = run_once(spec, c, plan, args.device)
                times[c] += out["times"]
                runs[c].append(out["times"])
                if c in MONITORED:
                    verdicts[c].append(out["verdict"])
                if args.smoke:
                    check_run(c, out, plan)
            print(f"  {m}: repeat {r + 1}/{repeats} done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
        summary = summarise(times, args.quantile)
        results[m] = {"spec": spec.describe(), "dyt_layers": 2 * spec.n_layers + 1, "summary": summary,
                      "paired": paired_estimate(runs, plan.warmup), "verdicts": verdicts, "runs": runs}
        if cuda:
            results[m]["audit"] = audit_cuda(spec, plan, configs)
        if args.smoke:
            for c, s in summary.items():
                assert all(math.isfinite(v) and v > 0 for v in s.values()), f"non-finite timing for {m}/{c}: {s}"
            assert results[m]["paired"] is not None and all(math.isfinite(v) for v in results[m]["paired"].values())
    print()
    for m, r in results.items():
        print(f"- {m}: {r['spec']}, {r['dyt_layers']} DyT layers; reference {r['summary']['off']['median'] * 1e3:.1f} ms/step (median)")
    print()
    print(table(results, args.quantile, args.markdown, cuda))
    print_paired(results)
    print(f"\nTotal {time.perf_counter() - t_start:.0f} s.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "args": vars(args), "results": results}, f, indent=1, default=str)
    if args.smoke:
        print("smoke: OK (every monitored run produced a verdict; all numbers finite)")
    return 0


def pool(paths: list[str]) -> int:
    """Pool the per-step times of earlier runs (their ``--json`` files) and print the paired estimates of the pool.

    Runs of the same code on a noisy machine each give a wide interval; pooled, the interval
    narrows. Only the configurations needed (``off``, ``paired``, ``sampled``) are pooled, per model.
    """
    results: dict[str, Any] = {}
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        warmup = saved["args"]["warmup"]
        for m, r in saved["results"].items():
            into = results.setdefault(m, {"runs": {}, "warmup": warmup, "files": 0})
            if into["warmup"] != warmup:
                raise SystemExit(f"benchmarks/overhead.py --pool: expected one --warmup in every file, got {into['warmup']} and {warmup} ({path}).")
            into["files"] += 1
            for c in ("off", "paired", "sampled"):
                into["runs"].setdefault(c, []).extend(r["runs"].get(c, []))
    print(f"# pooled paired estimates over {len(paths)} file(s): {', '.join(paths)}")
    for m, r in results.items():
        print(f"- {m}: {r['files']} file(s), {len(r['runs']['paired'])} paired runs, {len(r['runs']['off'])} reference runs")
    print_paired({m: {"paired": paired_estimate(r["runs"], r["warmup"])} for m, r in results.items()})
    return 0


def print_paired(results: dict[str, Any]) -> None:
    for m, r in results.items():
        pe = r["paired"]
        if pe:
            print(f"\nPaired estimate, {m}: a counted window step takes {pe['counted_vs_neighbours']:.4f} x its two uncounted "
                  f"neighbours (median; control, no monitor, even vs odd steps: {pe['control_even_vs_odd']:.4f}): "
                  f"window hot-path overhead {100 * (pe['ratio'] - 1):+.2f}% "
                  f"(90% bootstrap interval {100 * (pe['ratio_lo'] - 1):+.2f}% to {100 * (pe['ratio_hi'] - 1):+.2f}%).")
            if "sampled_step_ratio" in pe:
                print(f"Paired estimate, {m}, sample_every={SAMPLED_EVERY}: a counted step takes {pe['sampled_counted_vs_neighbours']:.4f} x "
                      f"its neighbours (control {pe['sampled_control']:.4f}); one step in {SAMPLED_EVERY} counted: overhead "
                      f"{100 * (pe['sampled_step_ratio'] - 1):+.2f}% per step (90% interval {100 * (pe['sampled_step_lo'] - 1):+.2f}% "
                      f"to {100 * (pe['sampled_step_hi'] - 1):+.2f}%).")


def check_run(config: str, out: dict[str, Any], plan: Plan) -> None:
    """Smoke assertions: the run measured what it should and satmon did its job."""
    assert len(out["times"]) == plan.measured, f"{config}: expected {plan.measured} step times, got {len(out['times'])}"
    assert all(math.isfinite(t) and t > 0 for t in out["times"]), f"{config}: non-finite step time"
    if config in MONITORED:
        v = out["verdict"]
        assert v is not None, f"{config}: the monitor produced no verdict"
        assert v["decision"] in ("go", "no-go") and 0.0 <= v["saturation"] <= 1.0 and v["elements"] > 0, f"{config}: {v}"
    if config == "watch":
        assert out["watch_checks"] >= 1, "watch: expected at least one collapse-watch check in the measured span"
    if config == "user-item":
        assert out["user_fractions"] > 0, "user-item: the hook never ran"


if __name__ == "__main__":
    sys.exit(main())
