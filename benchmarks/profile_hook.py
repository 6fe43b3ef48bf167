"""Where satmon's hook spends its time, per op: measured inside real training steps of the benchmark's
``wide`` model, and the same ops in a warm loop on one input for contrast.

Inside a step the activations and the allocator/dispatcher state are cold (the step just walked
through every weight and optimizer state), and each op costs several times its warm-loop figure:
that is why satmon's hook runs four tensor ops and nothing else, and why on a CPU the callback only
keeps each input in the hook and counts them all after the forward (``keep_inputs``), where the
same four ops per layer run back to back.

``--count-paths`` measures instead what the callback's count costs per counted step by path:
``count_kept()`` (every DyT input of the forward, kept) timed with this process's CPU time inside
real training steps, the steps alternating between the four-op count and the fused count (compiled
before the first timed step), for one of the overhead benchmark's models.

Usage::

    python benchmarks/profile_hook.py --threads 1
    python benchmarks/overhead.py --profile-hook --threads 1   # the same
    python benchmarks/profile_hook.py --threads 1 --count-paths --model d512b8
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from harness import MODELS_CPU, MODELS_CUDA, MODELS_SMOKE, ModelSpec
from stats import quantile
from torch import Tensor

from satmon import find_dyt_layers
from satmon.demos.corpus import corpus_tokens
from satmon.demos.gpt import GPT, GPTConfig
from satmon.functional.saturation import saturation_threshold, saturation_threshold_host
from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import SaturationHooks

OP_ROWS = (
    "threshold (read alpha, compute)",
    "abs(x) into the work buffer",
    "sum (non-finite flag)",
    "in-place > threshold",
    "sum (saturated count)",
)
HOOK_ROWS = {
    "satmon": "whole satmon hook, counting in the hook (in a step)",
    "kept": "whole satmon hook, keep_inputs (as the callback runs it)",
    "idle": "idle satmon hook (uncounted step)",
}
COUNT_ROW = "count_kept() after the forward, per layer (keep_inputs)"
MODES = ("satmon", "ops", "idle", "kept")  # what the hooks do in a step, in turn


class HookProfile:
    """satmon's hooks on ``spec``'s model between two stopwatch hooks, plus a hook that times the ops one by one."""

    def __init__(self, spec: ModelSpec, device: str) -> None:
        torch.manual_seed(0)
        self.spec, self.device = spec, device
        self.model = GPT(
            GPTConfig(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, seq_len=spec.seq_len)
        ).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.layers = find_dyt_layers(self.model)
        self.hooks = SaturationHooks(self.layers, SaturationCounter(len(self.layers)).to(device))
        self.spent: dict[str, list[float]] = defaultdict(list)
        self.buf = torch.empty(spec.batch_size, spec.seq_len, spec.d_model, dtype=torch.float32, device=device)
        self.mode = "satmon"
        self._start = 0.0
        for l in self.layers:  # stopwatch before satmon's hook, satmon's hook, stopwatch after, the op timer
            l.module.register_forward_hook(self._before)
        self.hooks.attach()
        for l in self.layers:
            l.module.register_forward_hook(self._after)
            l.module.register_forward_hook(self._time_ops)

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def ops(self, x: Tensor, alpha: Tensor, record: bool) -> None:
        """The hook's hot path, one op at a time (what the satmon hook runs), each timed."""
        clock, stamps = time.perf_counter, [time.perf_counter()]
        t = saturation_threshold_host(alpha.item(), 2.0) if self.device == "cpu" else saturation_threshold(alpha, 2.0)
        self.sync()
        stamps.append(clock())
        ax = torch.abs(x, out=self.buf)
        self.sync()
        stamps.append(clock())
        ax.sum()
        self.sync()
        stamps.append(clock())
        ax.gt_(t)
        self.sync()
        stamps.append(clock())
        ax.sum()
        self.sync()
        stamps.append(clock())
        if record:
            for k, a, b in zip(OP_ROWS, stamps, stamps[1:]):
                self.spent[k].append(b - a)

    def _time_ops(self, mod, args, out) -> None:
        if self.mode == "ops":
            with torch.no_grad():
                self.ops(args[0].detach(), mod.alpha.detach(), record=True)

    def _before(self, mod, args, out) -> None:
        if self.mode in HOOK_ROWS:
            self.sync()
            self._start = time.perf_counter()

    def _after(self, mod, args, out) -> None:
        if self.mode in HOOK_ROWS:
            self.sync()
            self.spent[HOOK_ROWS[self.mode]].append(time.perf_counter() - self._start)

    def train(self, reps: int) -> None:
        """``reps`` training steps in each mode, the modes in turn."""
        spec = self.spec
        w = (
            corpus_tokens(reps * len(MODES) * spec.batch_size * (spec.seq_len + 1))
            .view(-1, spec.seq_len + 1)
            .to(self.device)
        )
        for i in range(reps * len(MODES)):
            self.mode = MODES[i % len(MODES)]
            self.hooks.enabled = self.mode in ("satmon", "kept")
            self.hooks.queue.keep_inputs = self.mode == "kept"
            b = w[i * spec.batch_size : (i + 1) * spec.batch_size]
            logits = self.model(b[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())
            if self.mode == "kept":  # what the callback runs before the backward
                self.sync()
                t0 = time.perf_counter()
                self.hooks.count_kept()
                self.sync()
                self.spent[COUNT_ROW].append((time.perf_counter() - t0) / len(self.layers))
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.hooks.flush()

    def warm(self, reps: int) -> dict[str, float]:
        """Median seconds per call of each row in a warm loop on one input (outside any training step)."""
        spec, warm = self.spec, {}
        x = torch.randn(spec.batch_size, spec.seq_len, spec.d_model, device=self.device)
        alpha = torch.tensor([2.0], device=self.device)
        for _ in range(5):
            self.ops(x, alpha, record=False)
        for _ in range(reps * 10):
            self.ops(x, alpha, record=True)
        for k in OP_ROWS:  # the warm calls are the last reps * 10 of each op row
            warm[k] = quantile(self.spent[k][-reps * 10 :], 0.5)
            del self.spent[k][-reps * 10 :]
        hook = self.hooks._make_hook(0)  # the hook satmon registers, called directly
        module = self.layers[0].module
        for mode, enabled, keep in (("satmon", True, False), ("idle", False, False), ("kept", True, True)):
            self.hooks.enabled, self.hooks.queue.keep_inputs = enabled, keep
            t_hook, t_count = _timed_pairs(lambda: hook(module, (x,), x), self.hooks.count_kept, self.sync, reps * 10)
            warm[HOOK_ROWS[mode]] = quantile(t_hook, 0.5)
            if keep:
                warm[COUNT_ROW] = quantile(t_count, 0.5)
        return warm

    def table(self, reps: int, warm: dict[str, float]) -> str:
        n, shape = len(self.layers), (self.spec.batch_size, self.spec.seq_len, self.spec.d_model)
        lines = [
            f"Per-call cost of satmon's hook on the {self.spec.name} model's DyT inputs {shape} "
            f"({self.buf.numel():,} elements, {self.device}), median over {reps} training steps x {n} DyT layers, "
            "against the same op in a warm loop on one input.",
            "| op | us per call, in a training step | x layers = us per step | us per call, warm loop |",
            "|---|---|---|---|",
        ]
        for k, v in self.spent.items():
            med = quantile(v, 0.5)
            lines.append(f"| {k} | {med * 1e6:.1f} | {med * 1e6 * n:.0f} | {warm.get(k, float('nan')) * 1e6:.1f} |")
        return "\n".join(lines)


def _timed_pairs(
    first: Callable[[], None], second: Callable[[], None], sync: Callable[[], None], n: int
) -> tuple[list[float], list[float]]:
    """``n`` times: run ``first`` then ``second``, each followed by ``sync``; their seconds."""
    a, b = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        first()
        sync()
        t1 = time.perf_counter()
        second()
        sync()
        a.append(t1 - t0)
        b.append(time.perf_counter() - t1)
    return a, b


def profile_hook(spec: ModelSpec, device: str, reps: int) -> str:
    """The profile of ``spec``'s model on ``device`` over ``reps`` steps per mode, as a markdown table."""
    prof = HookProfile(spec, device)
    prof.train(reps)
    return prof.table(reps, prof.warm(reps))


def count_paths(spec: ModelSpec, reps: int, backend: str = "inductor") -> str:
    """CPU microseconds of ``count_kept()`` per counted step, by count path, inside ``reps`` training steps per path."""
    from harness import FUSED_BACKENDS

    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, seq_len=spec.seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    layers = find_dyt_layers(model)
    hooks = SaturationHooks(layers, SaturationCounter(len(layers)), keep_inputs=True).attach()
    hooks.queue.fused_backend = FUSED_BACKENDS[backend]
    paths = {"four ops": False, "fused": True}
    spent: dict[str, list[float]] = {k: [] for k in paths}
    warm = 2 * len(paths)  # untimed: the fused count's compilation, the first steps
    steps = warm + reps * len(paths)
    w = corpus_tokens(steps * spec.batch_size * (spec.seq_len + 1)).view(-1, spec.seq_len + 1)
    for i in range(steps):
        path = list(paths)[i % len(paths)]
        hooks.queue.fused = paths[path]
        b = w[i * spec.batch_size : (i + 1) * spec.batch_size]
        loss = torch.nn.functional.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        t0 = time.process_time()
        hooks.count_kept()
        if i >= warm:
            spent[path].append(time.process_time() - t0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        hooks.flush()
    if hooks.queue.inputs_counted["fused"] != steps // len(paths) * len(layers):
        raise RuntimeError(f"the fused count was not taken on every fused step: {hooks.queue.inputs_counted}")
    n = spec.batch_size * spec.seq_len * spec.d_model
    lines = [
        f"count_kept() per counted step on the {spec.name} model ({spec.describe()}; {len(layers)} DyT inputs of {n:,} "
        f"elements), CPU time inside {reps} training steps per path, the paths alternating; load average "
        f"{', '.join(f'{v:.2f}' for v in os.getloadavg())} at the end.",
        "| count path | median us per step | p20 us per step | us per input (median) |",
        "|---|---|---|---|",
    ]
    for k, v in spent.items():
        med = quantile(v, 0.5)
        lines.append(f"| {k} | {med * 1e6:.0f} | {quantile(v, 0.2) * 1e6:.0f} | {med * 1e6 / len(layers):.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/profile_hook.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all CPU cores)")
    p.add_argument("--reps", type=int, default=20, help="training steps per mode (default 20)")
    p.add_argument("--smoke", action="store_true", help="a tiny model and 2 steps per mode: correctness only")
    p.add_argument(
        "--count-paths", action="store_true", help="count_kept() per step by count path (four ops, fused), CPU"
    )
    p.add_argument("--model", default="wide", help="with --count-paths: the overhead benchmark's model (default wide)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/profile_hook.py: --device cuda asked for, but torch.cuda.is_available() is False.",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    if args.count_paths:
        specs = MODELS_SMOKE if args.smoke else MODELS_CPU
        if args.device != "cpu" or args.model not in specs:
            p.error(
                f"--count-paths runs on the CPU with --model from {sorted(specs)}, got {args.device}, {args.model!r}"
            )
        print(
            count_paths(
                specs[args.model], reps=2 if args.smoke else args.reps, backend="graph" if args.smoke else "inductor"
            )
        )
        return 0
    spec = (MODELS_SMOKE if args.smoke else MODELS_CUDA if args.device == "cuda" else MODELS_CPU)["wide"]
    print(profile_hook(spec, args.device, reps=2 if args.smoke else args.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
