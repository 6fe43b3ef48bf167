"""The training harness of satmon's benchmarks: one Lightning ``Trainer`` run of a benchmark
configuration (with or without ``SaturationMonitor``), its per-step times, its verdict, and, on
CUDA, its host-sync audit. Used by ``overhead.py`` and ``gpu_check.py``.

Per-step time is the time between consecutive ``on_train_batch_start`` calls (a whole optimizer
step: data, forward, backward, optimizer, every callback). The Trainer runs with ``logger=False``,
no checkpointing, no progress bar, and satmon's ``log_every_n_steps`` longer than the run, so
satmon's logging steps (one host transfer each) are not in the measured span.
"""

from __future__ import annotations

import logging
import platform
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from satmon import SaturationMonitor, find_dyt_layers
from satmon.demos.corpus import corpus_tokens
from satmon.demos.lit import LitLM
from satmon.observe.saturation import CountQueue
from satmon.settings import Settings

CONFIGS = (
    "off",
    "off-again",
    "window",
    "sampled",
    "after",
    "watch",
    "trap",
    "user-item",
    "paired",
    "paired-eager",
    "paired-fused",
)
LABELS = {
    "off": "no monitor (reference)",
    "off-again": "no monitor, again (A/A noise floor)",
    "window": "(a) window, default settings",
    "sampled": "(b) window, sample_every=4",
    "after": "(c) after the window, collapse and trap watches off",
    "watch": "(d) after the window, collapse watch (default cadence, 50)",
    "trap": "(f) after the window, trap watch on (default cadence, 10; pair with (c))",
    "user-item": "(e) user hook with .item() per layer",
    "paired": "window, sample_every=2 (for the paired estimate)",
    "paired-eager": "window, sample_every=2, four-op count forced (paired estimate)",
    "paired-fused": "window, sample_every=2, fused count forced (paired estimate)",
}
MONITORED = ("window", "sampled", "after", "watch", "trap", "paired", "paired-eager", "paired-fused")
#: the paired configurations and the count path each forces (``CountQueue.default_fused``; ``None``: satmon's choice)
PAIRED = {"paired": None, "paired-eager": False, "paired-fused": True}
#: the trap watch's default cadence (``trap_every_n_steps``), the ``trap`` configuration's
TRAP_EVERY = Settings().trap_every_n_steps


def _traced_graph(gm: Any, example: list) -> Any:
    return gm


#: what compiles the fused count (``CountQueue.default_backend``): Inductor, as satmon does; or the traced graph run
#: as it is (the same ATen ops uncompiled: the smoke runs and dry runs, which check code paths, not speed)
FUSED_BACKENDS = {"inductor": "inductor", "graph": _traced_graph}


def use_fused_backend(name: str) -> None:
    """Every count queue made from now on in this process compiles its fused count with ``FUSED_BACKENDS[name]``."""
    CountQueue.default_backend = FUSED_BACKENDS[name]


SAMPLED_EVERY = 4  # the ``sampled`` configuration's ``sample_every`` (stats.SAMPLED_EVERY)


@dataclass
class ModelSpec:
    """A benchmark model: satmon's GPT-2-style demo model (DyT) at some size, and its batch."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch_size: int

    def describe(self) -> str:
        return f"d={self.d_model}, {self.n_layers} blocks, seq {self.seq_len}, batch {self.batch_size}"


MODELS_CPU = {
    "demo": ModelSpec("demo", 64, 2, 4, 64, 16),  # satmon demo's model and batch: 5 DyT inputs of 65,536 elements
    "wide": ModelSpec("wide", 512, 4, 8, 128, 2),
    "d512b8": ModelSpec("d512b8", 512, 4, 8, 128, 8),  # issue 31's realistic width: 9 DyT inputs of 524,288 elements
    "d1024": ModelSpec("d1024", 1024, 2, 16, 128, 4),  # twice the width, as many tokens: 5 inputs of 524,288 elements
}
MODELS_CUDA = {  # large enough that a step is not launch-bound
    "demo": ModelSpec("demo", 64, 2, 4, 64, 16),
    "wide": ModelSpec("wide", 1024, 8, 16, 512, 16),
}
MODELS_SMOKE = {
    "demo": ModelSpec("demo", 32, 1, 2, 16, 4),
    "wide": ModelSpec("wide", 64, 2, 4, 16, 2),
    "d512b8": ModelSpec("d512b8", 64, 2, 4, 16, 4),
    "d1024": ModelSpec("d1024", 128, 1, 4, 16, 2),
}


@dataclass
class Plan:
    """Steps of one run: ``warmup`` unmeasured (the window of ``after``/``watch`` ends
    inside them), then ``measured``."""

    warmup: int
    measured: int
    window_small: int
    watch_every: int

    @property
    def total(self) -> int:
        return self.warmup + self.measured + 1  # +1: the last measured step needs a following timestamp


class BenchLM(LitLM):
    """``LitLM`` without ``self.log``: Lightning's own logging stays out of the measurement."""

    def training_step(self, batch, batch_idx):
        return self._loss(batch)


def bench_model(spec: ModelSpec, lr: float = 1e-3, alpha_init: float = 2.0) -> BenchLM:
    """The seeded DyT model of ``spec`` (seed 0: every configuration trains the same weights on the same data)."""
    pl.seed_everything(0, verbose=False)
    return BenchLM(
        arch="gpt",
        d_model=spec.d_model,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        seq_len=spec.seq_len,
        norm="dyt",
        alpha_init=alpha_init,
        lr=lr,
        warmup=10,
    )


#: what a step's time is: elapsed wall time, or the CPU time of this process (its threads' work only: the
#: other tenants of a shared machine do not add to it while they preempt the run; CPU device only)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


class StepTimer(Callback):
    """Timestamps at every ``on_train_batch_start`` (after a device sync on CUDA), keyed by the step."""

    def __init__(self, cuda: bool, clock: str = "wall") -> None:
        if cuda and clock != "wall":
            raise ValueError(
                f"Expected clock='wall' on CUDA (the CPU time of the host does not time the device), got {clock!r}."
            )
        self.cuda, self.clock = cuda, CLOCKS[clock]
        self.stamps: list[tuple[int, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # the timer's sync, outside the audited span
        self.stamps.append((trainer.global_step, self.clock()))

    def step_times(self, first: int, last: int) -> list[float]:
        """Seconds taken by optimizer steps ``first <= g < last`` (``g``: global step at their start)."""
        out = []
        for (g, t0), (_, t1) in zip(self.stamps, self.stamps[1:]):
            if first <= g < last:
                out.append(t1 - t0)
        return out


class SyncAudit:
    """Two callbacks bracketing every other callback: ``torch.cuda.set_sync_debug_mode(mode)`` from the
    start of a measured step's ``on_train_batch_start`` to the end of its ``on_train_batch_end``. CUDA only."""

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


def count_paths(monitor: SaturationMonitor) -> dict[str, Any]:
    """How the window's queue counted: the inputs counted by each path, so that a table can say which path a
    configuration measured (``{}`` when no window hooks were made)."""
    hooks = monitor.screen.hooks
    return dict(hooks.queue.inputs_counted) if hooks is not None else {}


def token_loader(spec: ModelSpec, steps: int, device: str) -> DataLoader:
    """One epoch of exactly ``steps`` batches of corpus windows, already on ``device``."""
    n = steps * spec.batch_size
    tokens = corpus_tokens(n * (spec.seq_len + 1))
    w = tokens.view(n, spec.seq_len + 1).to(device)
    return DataLoader(TensorDataset(w[:, :-1], w[:, 1:]), batch_size=spec.batch_size, shuffle=False)


def make_trainer(
    max_steps: int, device: str, callbacks: Sequence[Callback], precision: str | None = None
) -> pl.Trainer:
    """A bare ``Trainer``: no logger, checkpoints, progress bar, summary or validation."""
    return pl.Trainer(
        max_steps=max_steps,
        accelerator="cuda" if device == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=max_steps + 1,
        callbacks=list(callbacks),
        precision=precision,
    )


def make_monitor(config: str, plan: Plan) -> SaturationMonitor | None:
    """The ``SaturationMonitor`` of a configuration (``None``: no monitor); its log interval is never reached."""
    quiet = dict(log_every_n_steps=plan.total + 1, verbose=False)
    if config == "window":
        return SaturationMonitor(window=plan.total, **quiet)
    if config in PAIRED:
        return SaturationMonitor(window=plan.total, sample_every=2, **quiet)
    if config == "sampled":
        return SaturationMonitor(window=plan.total, sample_every=SAMPLED_EVERY, **quiet)
    if config == "after":
        return SaturationMonitor(window=plan.window_small, watch_every_n_steps=0, trap_every_n_steps=0, **quiet)
    if config == "watch":
        return SaturationMonitor(
            window=plan.window_small, watch_every_n_steps=plan.watch_every, trap_every_n_steps=0, **quiet
        )
    if config == "trap":  # (c) with the trap watch on: the pair that prices it
        return SaturationMonitor(window=plan.window_small, watch_every_n_steps=0, **quiet)
    return None


def run_once(
    spec: ModelSpec,
    config: str,
    plan: Plan,
    device: str,
    audit_mode: str | None = None,
    precision: str | None = None,
    extra_callbacks: Sequence[Callback] = (),
    clock: str = "wall",
) -> dict[str, Any]:
    """Train one configuration; return its measured per-step times, its verdict and (CUDA) its sync audit.

    ``extra_callbacks`` run beside the monitor (a reference recorder in the tests); ``audit_mode``
    (``"warn"`` or ``"error"``) needs ``device="cuda"``; ``clock`` is a key of :data:`CLOCKS`.
    """
    cuda = device == "cuda"
    if audit_mode and not cuda:
        raise ValueError(f"Expected device 'cuda' for a sync audit (audit_mode={audit_mode!r}), got {device!r}.")
    model = bench_model(spec)
    timer = StepTimer(cuda, clock)
    first, last = plan.warmup, plan.warmup + plan.measured
    monitor = make_monitor(config, plan)
    user = UserItemHook() if config == "user-item" else None
    extra: list[Callback] = [c for c in (monitor, user) if c is not None] + list(extra_callbacks)
    audit = None
    if audit_mode:
        # the watch's check steps sync by design (that is when its counts are read)
        # (and the trap watch's: its check steps read the gradient norms and offset counts)
        skip = {
            g
            for g in range(first, last)
            if (config == "watch" and g % plan.watch_every == 0) or (config == "trap" and g % TRAP_EVERY == 0)
        }
        audit = SyncAudit(audit_mode, first, last, skip)
        callbacks: list[Callback] = [timer, audit.on, *extra, audit.off]
    else:
        callbacks = [timer, *extra]
    trainer = make_trainer(plan.total, device, callbacks, precision)
    error = None
    default_fused = CountQueue.default_fused
    CountQueue.default_fused = PAIRED.get(config, default_fused)  # the count path the configuration forces, if any
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(model, token_loader(spec, plan.total, device))
        except RuntimeError as e:  # "error" sync mode: a synchronizing op raised
            if audit_mode != "error":
                raise
            error = str(e).splitlines()[0]
        finally:
            CountQueue.default_fused = default_fused
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    out: dict[str, Any] = {"times": timer.step_times(first, last)}
    fallbacks = [str(w.message) for w in caught if "compiling the fused saturation count failed" in str(w.message)]
    if fallbacks and PAIRED.get(config):
        raise RuntimeError(
            f"{config}: the fused count fell back to the four ops, so this run would not measure it: {fallbacks[0]}"
        )
    if monitor is not None:
        out["count_paths"] = count_paths(monitor)
        v = monitor.verdict
        out["verdict"] = (
            None
            if v is None
            else {
                "decision": v.decision,
                "saturation": v.saturation,
                "step": v.step,
                "elements": v.elements,
                "per_layer": dict(v.per_layer),
            }
        )
        out["watch_checks"] = len(monitor.watch_log)
    if user is not None:
        out["user_fractions"] = len(user.fractions)
    if audit is not None:
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        out["audit"] = {"mode": audit_mode, "steps": audit.steps, "syncs": syncs, "error": error}
    return out


def sync_audit(
    spec: ModelSpec, plan: Plan, configs: Sequence[str], precision: str | None = None
) -> dict[str, dict[str, Any]]:
    """Host syncs per configuration on CUDA: counted in ``"warn"`` mode for each; then, when the
    no-monitor baseline is sync-free, each satmon configuration again in ``"error"`` mode, where a
    finished run proves zero host syncs in satmon's per-step path.

    Returns config -> ``{"warn": audit, "error": audit or None}`` (``run_once``'s ``"audit"`` records).
    """
    short = Plan(plan.warmup, min(plan.measured, 2 * plan.watch_every + 1), plan.window_small, plan.watch_every)
    records = {
        c: {"warn": run_once(spec, c, short, "cuda", "warn", precision)["audit"], "error": None}
        for c in dict.fromkeys(["off", *configs])
    }
    if records["off"]["warn"]["syncs"] == 0:
        for c in (c for c in records if c in MONITORED):
            records[c]["error"] = run_once(spec, c, short, "cuda", "error", precision)["audit"]
    return records


def audit_cells(records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """:func:`sync_audit`'s records as one human cell per configuration."""
    off = records["off"]["warn"]
    base = off["syncs"] / max(1, off["steps"])
    cells = {}
    for c, r in records.items():
        warn, err = r["warn"], r["error"]
        cells[c] = f"{warn['syncs']} in {warn['steps']} steps (warn)"
        if err is not None:
            cells[c] = (
                f"0 in {err['steps']} steps (error mode: proved)"
                if err["error"] is None
                else f"sync in error mode: {err['error']}"
            )
        elif base:
            cells[c] += f"; {warn['syncs'] / max(1, warn['steps']) - base:+.2f}/step vs no monitor"
    return cells


def quiet_logs() -> None:
    """Silence Lightning's and satmon's chatter and the warnings a bare benchmark Trainer triggers."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("satmon").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", ".*has no logger.*")
    warnings.filterwarnings("ignore", ".*`validation_step` but have no `val_dataloader`.*")


def machine() -> str:
    """CPU (and GPU when present), library versions and torch threads, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        cpu = f"{names[0]} x {len(names)}" if names else cpu
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (
        f"{cpu}{gpu}; torch {torch.__version__}, lightning {pl.__version__}, python {platform.python_version()}, "
        f"torch threads {torch.get_num_threads()}"
    )
