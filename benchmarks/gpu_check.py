"""satmon on one CUDA GPU, in one table, in under 8 minutes.

(a) zero host syncs: the window and the collapse watch train under
    ``torch.cuda.set_sync_debug_mode("error")`` with satmon's hooks counting (a sync raises), once
    the no-monitor baseline is shown sync-free in ``"warn"`` mode (the watch's check steps, which
    read the counts by design, are left out);
(b) the overhead of the window and after it, on a d_model=2048 model in bf16: the paired estimate
    (counted vs uncounted steps of one run, ``stats.paired_estimate``) of satmon's own count path and
    of each path forced (the fused count, one compiled call per input; the four ATen ops), side by
    side in one run, and between-run ratios;
(c) ``torch.compile``: counts of a compiled run equal to the eager run's (``aot_eager``: exactly;
    ``inductor``: its fused kernels move activations by rounding, so the verdict and counts within
    1e-4 of the elements);
(d) ``satmon.probe`` on a d_model=4096 RMSNorm model, within a memory budget when the probe has
    one (then also: the same readings as without the budget);
(e) FSDP2: skipped (one GPU shards nothing; the FSDP2 tests run on two processes);
(f) kernels per counted DyT input: a forward with the counting hooks on against one with them off,
    under ``torch.profiler`` (eager: the fused count, one compiled call per input, and the four ops
    forced, for contrast; compiled with Inductor: what the count adds to the model's graph, and its
    graph breaks from Dynamo's own counters).

``--dry-run`` runs the same code on the CPU with tiny sizes (no CUDA call; the sync audit is
reported "n/a on CPU"; the fused count runs its traced graph uncompiled): what the test suite runs.

Usage::

    python benchmarks/gpu_check.py --json gpu_check.json
    python benchmarks/gpu_check.py --dry-run
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from harness import (
    ModelSpec,
    Plan,
    bench_model,
    machine,
    make_trainer,
    quiet_logs,
    run_once,
    sync_audit,
    token_loader,
    use_fused_backend,
)
from stats import paired_estimates, summarise

import satmon
from satmon import SaturationMonitor
from satmon.demos.corpus import corpus_tokens
from satmon.demos.gpt import GPT, GPTConfig

CHECKS = ("audit", "overhead", "compile", "probe", "fsdp", "kernels")


@dataclass(frozen=True)
class Sizes:
    """What one check run trains and probes."""

    device: str
    precision: str | None  # Lightning's, for (a) and (b)
    model: ModelSpec  # (a), (b)
    audit: Plan
    timing: Plan
    repeats: int
    compiled: ModelSpec
    compile_steps: int
    backends: tuple[str, ...]
    probe: ModelSpec  # d_model, n_layers, n_heads, seq_len, batch_size of the probed model
    probe_batches: int
    probe_budget: int  # bytes: see _budget

    def describe(self, spec: ModelSpec) -> str:
        return f"{spec.describe()}, {self.precision or '32-true'}"


def _budget(d: int) -> int:
    """Ten ``d x d`` float64 matrices: three covariances beside one readout (six), so several passes."""
    return 10 * 8 * d * d


CUDA = Sizes(
    "cuda",
    "bf16-mixed",
    ModelSpec("1b-width", 2048, 4, 16, 1024, 8),
    Plan(4, 11, 2, 5),
    Plan(10, 30, 5, 50),
    3,
    ModelSpec("compile", 1024, 2, 16, 256, 8),
    6,
    ("aot_eager", "inductor"),
    ModelSpec("probe", 4096, 2, 32, 512, 4),
    2,
    _budget(4096),
)
DRY = Sizes(
    "cpu",
    "bf16-mixed",
    ModelSpec("tiny", 32, 2, 2, 16, 2),
    Plan(4, 6, 2, 2),
    Plan(4, 6, 2, 50),
    2,
    ModelSpec("tiny", 32, 2, 2, 16, 2),
    4,
    ("aot_eager",),
    ModelSpec("probe", 64, 2, 4, 32, 2),
    2,
    _budget(64),
)


@dataclass
class Row:
    """One line of the table; ``numbers`` are the measured values behind ``result`` (the JSON keeps them)."""

    check: str
    setting: str
    result: str
    status: str  # pass, FAIL, info, skip, n/a
    seconds: float = 0.0
    numbers: dict[str, float] = field(default_factory=dict)


def check_audit(sz: Sizes) -> list[Row]:
    """(a) Zero host syncs in the window and the watch (CUDA); on the CPU the same runs, unaudited."""
    setting = f"{sz.describe(sz.model)}; {sz.audit.measured} steps"
    if sz.device != "cuda":
        w = run_once(sz.model, "window", sz.audit, "cpu", precision=sz.precision)
        k = run_once(sz.model, "watch", sz.audit, "cpu", precision=sz.precision)
        ok = w["verdict"] is not None and k["watch_checks"] >= 1
        return [
            Row(
                "(a) host-sync audit, window + watch",
                setting,
                f"n/a on CPU (no CUDA sync debug mode); unaudited: window verdict over {w['verdict']['elements']:,} "
                f"elements, {k['watch_checks']} watch checks",
                "n/a" if ok else "FAIL",
                numbers={"elements": w["verdict"]["elements"], "watch_checks": k["watch_checks"]},
            )
        ]
    records = sync_audit(sz.model, sz.audit, ["window", "watch"], sz.precision)
    off = records["off"]["warn"]
    rows = []
    for c in ("window", "watch"):
        warn, err = records[c]["warn"], records[c]["error"]
        name = f"(a) host-sync audit, {c}" + (
            f" (check steps, 1 in {sz.audit.watch_every}, left out)" if c == "watch" else ""
        )
        if err is None:  # the baseline itself syncs: error mode would stop in Lightning's code, not satmon's
            extra = warn["syncs"] / max(1, warn["steps"]) - off["syncs"] / max(1, off["steps"])
            rows.append(
                Row(
                    name,
                    setting,
                    f"baseline syncs {off['syncs']} in {off['steps']} steps, so warn mode only: "
                    f"{warn['syncs']} in {warn['steps']} steps ({extra:+.2f}/step vs no monitor)",
                    "info",
                    numbers={"syncs": warn["syncs"], "steps": warn["steps"], "extra_per_step": extra},
                )
            )
        elif err["error"] is None:
            rows.append(
                Row(
                    name,
                    setting,
                    f"0 host syncs in {err['steps']} steps (error mode)",
                    "pass",
                    numbers={"syncs": 0, "steps": err["steps"]},
                )
            )
        else:
            rows.append(Row(name, setting, f"a sync raised: {err['error']}", "FAIL", numbers={"steps": err["steps"]}))
    return rows


def _pct(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.2f}%"


#: the paired configurations of (b), and how each row names its count path
OVERHEAD_PATHS = {"paired": "satmon's choice", "paired-fused": "fused count forced", "paired-eager": "four ops forced"}


def check_overhead(sz: Sizes) -> list[Row]:
    """(b) The window's cost per counted step (paired, one run) for satmon's count path and each path forced,
    and the step-time ratios in and after the window."""
    configs = ["off", "window", *OVERHEAD_PATHS, "after"]
    times: dict[str, list[float]] = {c: [] for c in configs}
    runs: dict[str, list[list[float]]] = {c: [] for c in configs}
    counted: dict[str, dict[str, int]] = {}
    for r in range(sz.repeats):
        for c in configs[r % len(configs) :] + configs[: r % len(configs)]:  # rotated: no configuration always first
            out = run_once(sz.model, c, sz.timing, sz.device, precision=sz.precision)
            times[c] += out["times"]
            runs[c].append(out["times"])
            for k, v in out.get("count_paths", {}).items():
                counted.setdefault(c, {}).setdefault(k, 0)
                counted[c][k] += v
    s, estimates = summarise(times, 0.2), paired_estimates(runs, sz.timing.warmup)
    setting = f"{sz.describe(sz.model)}; {sz.repeats} x {sz.timing.measured} steps per configuration"
    ref = s["off"]["median"] * 1e3
    rows = []
    for c, words in OVERHEAD_PATHS.items():
        pe = estimates[c]
        took = ", ".join(f"{k} {v:,}" for k, v in counted.get(c, {}).items())
        rows.append(
            Row(
                f"(b) overhead in the window, paired, {words}",
                setting,
                f"{_pct(pe['ratio'])} per counted step (90% interval {_pct(pe['ratio_lo'])} to {_pct(pe['ratio_hi'])}; "
                f"control {pe['control_even_vs_odd']:.4f}; inputs counted by {took})",
                "info",
                numbers={k: pe[k] for k in ("ratio", "ratio_lo", "ratio_hi", "control_even_vs_odd")}
                | {f"inputs_{k.replace(' ', '_')}": v for k, v in counted.get(c, {}).items()},
            )
        )
    rows += [
        Row(
            "(b) overhead in the window, between runs",
            setting,
            f"median step {_pct(s['window']['ratio_median'])} vs no monitor ({ref:.2f} ms)",
            "info",
            numbers={"ratio_median": s["window"]["ratio_median"], "off_ms": ref},
        ),
        Row(
            "(b) overhead after the window (watch off)",
            setting,
            f"median step {_pct(s['after']['ratio_median'])} vs no monitor",
            "info",
            numbers={"ratio_median": s["after"]["ratio_median"]},
        ),
    ]
    return rows


class _GraphCounter:
    """A Dynamo back end that counts the graphs it compiles and hands them to ``backend``."""

    def __init__(self, backend: str) -> None:
        self.backend, self.graphs = backend, 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs += 1
        return lookup_backend(self.backend)(gm, example_inputs)


def _eager_only_out(verdict: dict[str, Any]) -> dict[str, Any]:
    """A verdict's dict without what only an eager forward reads: the offset statistics and the final norm's kind."""
    out = {**verdict, "offset": None}
    if isinstance(out.get("planned_forecast"), dict):
        out["planned_forecast"] = {**out["planned_forecast"], "final_norm": None}
    return out


def _counted_run(sz: Sizes, backend: str | None) -> tuple[dict[str, Any], int]:
    """A window over every step of a model with frozen weights (lr 0: eager and compiled runs see the same
    weights whatever the backward's kernels); alpha 50 so that a fresh model saturates some elements, not all."""
    model = bench_model(sz.compiled, lr=0.0, alpha_init=50.0)
    counter = _GraphCounter(backend) if backend else None
    if counter is not None:
        model.model = torch.compile(model.model, backend=counter)  # the inner model: Lightning's hooks stay eager
    monitor = SaturationMonitor(
        window=sz.compile_steps, watch_every_n_steps=0, log_every_n_steps=sz.compile_steps + 1, verbose=False
    )
    make_trainer(sz.compile_steps, sz.device, [monitor]).fit(
        model, token_loader(sz.compiled, sz.compile_steps, sz.device)
    )
    return monitor.verdict.to_dict(), counter.graphs if counter else 0


def check_compile(sz: Sizes) -> list[Row]:
    """(c) satmon counting in a compiled model: the same counts as eager."""
    import torch._dynamo as dynamo

    setting = f"{sz.compiled.describe()}, float32; {sz.compile_steps} steps, all counted"
    eager, _ = _counted_run(sz, None)
    n, rows = eager["elements"], []
    for backend in sz.backends:
        dynamo.reset()
        try:
            got, graphs = _counted_run(sz, backend)
        finally:
            dynamo.reset()
        diff = round(abs(got["saturation"] - eager["saturation"]) * n)
        # offset statistics and the final norm's kind (the forecast's) are read eagerly only
        exact = _eager_only_out(got) == _eager_only_out(eager)
        ok = exact or (backend != "aot_eager" and got["decision"] == eager["decision"] and diff <= 1e-4 * n)
        rows.append(
            Row(
                f"(c) torch.compile, {backend}",
                setting,
                f"counts {'equal to eager' if exact else f'differ from eager by {diff} of {n:,} elements'} "
                f"(saturation {eager['saturation']:.4f}); {graphs} graph(s) compiled",
                "pass" if ok else "FAIL",
                numbers={"elements": n, "saturated_diff": diff, "saturation": eager["saturation"], "graphs": graphs},
            )
        )
    if "inductor" not in sz.backends:
        rows.append(
            Row(
                "(c) torch.compile, inductor",
                setting,
                "skipped in --dry-run (Inductor's CPU code generation takes minutes)",
                "skip",
            )
        )
    return rows


def _readings(report: Any) -> str:
    """The probe's readings (not its timing or plan) as canonical JSON: NaN equals NaN."""
    d = report.to_dict()
    return json.dumps(
        {k: d.get(k) for k in ("layers", "sigma_min", "norm_type", "saturation")}, sort_keys=True, default=str
    )


def check_probe(sz: Sizes) -> list[Row]:
    """(d) ``satmon.probe`` on a wide RMSNorm model: time and peak memory; the budget changes no reading."""
    p = sz.probe
    cuda = sz.device == "cuda"
    torch.manual_seed(0)
    with torch.device(sz.device):  # built where it runs: a d=4096 model initialises in seconds on the GPU
        model = GPT(
            GPTConfig(d_model=p.d_model, n_layers=p.n_layers, n_heads=p.n_heads, seq_len=p.seq_len, norm="rmsnorm")
        )
    model.eval()
    n = sz.probe_batches * p.batch_size
    tokens = corpus_tokens(n * (p.seq_len + 1)).view(n, p.seq_len + 1)[:, :-1].to(sz.device)
    batches = list(tokens.split(p.batch_size))
    kwargs = {"memory_budget": sz.probe_budget} if "memory_budget" in inspect.signature(satmon.probe).parameters else {}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    t0 = time.perf_counter()
    report = satmon.probe(model, batches, **kwargs)
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
    budget = f"memory_budget {sz.probe_budget / 2**20:g} MiB" if kwargs else "no memory_budget parameter yet"
    setting = f"{p.describe()}, RMSNorm, float32; {sz.probe_batches} batches; {budget}"
    numbers = {"seconds": seconds, "layers": len(report.layers)} | (
        {"peak_extra_mib": peak} if peak is not None else {}
    )
    plan = getattr(report, "plan", None)
    if plan is not None:
        numbers |= {"matrices": plan.matrices, "passes": plan.passes, "planned_peak_mib": plan.peak_bytes / 2**20}
        planned = f"plan: {plan.matrices} matrices in {plan.passes} pass(es), peak {plan.peak_bytes / 2**20:.3g} MiB; "
    else:
        planned = ""
    rows = [
        Row(
            f"(d) probe, d={p.d_model}",
            setting,
            f"{len(report.layers)} norm layers read, norm type {report.norm_type}; {planned}measured peak extra "
            + (f"{peak:,.0f} MiB (model activations included)" if peak is not None else "memory n/a on CPU")
            + f"; {seconds:.1f} s",
            "pass",
            seconds,
            numbers,
        )
    ]
    if kwargs:
        same = _readings(report) == _readings(satmon.probe(model, batches))
        rows.append(
            Row(
                f"(d) probe, d={p.d_model}: budget vs none",
                setting,
                "readings identical" if same else "readings differ with and without the budget",
                "pass" if same else "FAIL",
            )
        )
    else:
        rows.append(
            Row(
                f"(d) probe, d={p.d_model}: budget vs none",
                setting,
                "skipped: satmon.probe has no memory_budget parameter",
                "skip",
            )
        )
    return rows


def check_fsdp(sz: Sizes) -> list[Row]:
    """(e) FSDP2 needs two ranks to shard anything: not run here."""
    return [
        Row(
            "(e) FSDP2",
            "-",
            "skipped: on one GPU FSDP2 shards nothing; the FSDP2 tests run it on 2 processes (torchrun, gloo)",
            "skip",
        )
    ]


def _extra_work(
    model: torch.nn.Module, x: torch.Tensor, device: str, compiled: bool, fused: bool | None = None
) -> tuple[float, int, int]:
    """Per counted DyT input: kernels (CUDA) or ATen ops (CPU) that satmon's hooks add to one forward, the
    layers counted, and Dynamo's graph breaks (compiled); ``fused`` forces an eager count path."""
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    from satmon import find_dyt_layers
    from satmon.observe.counters import SaturationCounter
    from satmon.observe.saturation import SaturationHooks

    layers = find_dyt_layers(model)
    hooks = SaturationHooks(layers, SaturationCounter(len(layers)).to(device)).attach()
    hooks.queue.fused = fused
    counters.clear()
    f = torch.compile(model) if compiled else model
    cuda = device == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    seen = {}
    try:
        with torch.no_grad():
            for on in (True, False, True):  # the last pass is the one measured with the hooks on
                hooks.enabled = on
                f(x)
                f(x)  # warm: compiled variants, thresholds, the fused count's own compilation
                if cuda:
                    torch.cuda.synchronize()
                with profile(activities=[activity]) as prof:
                    f(x)
                    if cuda:
                        torch.cuda.synchronize()
                events = prof.events()
                # CUDA: kernels; CPU: top-level ATen ops (an op's own inner calls not counted again)
                seen[on] = sum(
                    1
                    for e in events
                    if (e.device_type.name == "CUDA") == cuda
                    and (
                        cuda
                        or (
                            e.name.startswith("aten::")
                            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
                        )
                    )
                )
    finally:
        hooks.detach()
    breaks = sum(counters["graph_break"].values())
    return (seen[True] - seen[False]) / len(layers), len(layers), breaks


def check_kernels(sz: Sizes) -> list[Row]:
    """(f) What counting costs in launches: kernels per counted DyT input, eager and compiled."""
    import torch._dynamo as dynamo

    spec = sz.compiled
    torch.manual_seed(0)
    with torch.device(sz.device):
        model = GPT(
            GPTConfig(
                d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, seq_len=spec.seq_len, alpha_init=2.0
            )
        )
    x = corpus_tokens(spec.batch_size * spec.seq_len).view(spec.batch_size, spec.seq_len).to(sz.device)
    unit = "kernels" if sz.device == "cuda" else "ATen ops (CPU: the eager CPU path's four ops and a detach, by design)"
    setting = f"{spec.describe()}, float32, one forward"
    rows = []
    for backend, fused in (
        ("eager", None),
        ("eager, four ops forced", False),
        *(("inductor", None) for b in sz.backends if b == "inductor"),
    ):
        dynamo.reset()
        try:
            per, n, breaks = _extra_work(model, x, sz.device, compiled=backend == "inductor", fused=fused)
        finally:
            dynamo.reset()
        # the fused call: a kernel, and the stack of its counts
        ok = sz.device != "cuda" or backend != "eager" or per <= 2.0
        status = ("pass" if ok else "FAIL") if sz.device == "cuda" else "n/a"
        rows.append(
            Row(
                f"(f) work per counted DyT input, {backend}",
                setting,
                f"{per:.2f} {unit} per input ({n} layers)"
                + (f"; {breaks} graph break(s)" if backend == "inductor" else ""),
                status,
                numbers={"per_input": per, "layers": n, "graph_breaks": breaks},
            )
        )
    if "inductor" not in sz.backends:
        rows.append(
            Row(
                "(f) work per counted DyT input, inductor",
                setting,
                "skipped in --dry-run (Inductor's CPU code generation takes minutes)",
                "skip",
            )
        )
    return rows


def run_check(name: str, fn: Callable[[Sizes], list[Row]], sz: Sizes) -> list[Row]:
    """One check, timed; an exception becomes a FAIL row (the table is still printed)."""
    t0 = time.perf_counter()
    try:
        rows = fn(sz)
    except Exception as e:  # noqa: BLE001 -- report and go on with the other checks
        traceback.print_exc()
        rows = [Row(f"{name}: error", "-", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", "FAIL")]
    seconds = time.perf_counter() - t0
    for r in rows:
        r.seconds = r.seconds or seconds / len(rows)
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| check | setting | result | status | s |", "|---|---|---|---|---|"]
    lines += [f"| {r.check} | {r.setting} | {r.result} | {r.status} | {r.seconds:.0f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="the same checks on the CPU with tiny sizes (no CUDA call)")
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    p.add_argument("--json", default=None, help="also write the rows, with their numbers, to this JSON file")
    args = p.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    if bad := [c for c in only if c not in CHECKS]:
        p.error(f"expected --only from {CHECKS}, got {bad}")
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "benchmarks/gpu_check.py: expected a CUDA GPU (torch.cuda.is_available() is False); "
            "run with --dry-run to check the code paths on the CPU.",
            file=sys.stderr,
        )
        return 2
    quiet_logs()
    use_fused_backend("graph" if args.dry_run else "inductor")
    sz = DRY if args.dry_run else CUDA
    print(f"# satmon GPU check ({'CPU dry run' if args.dry_run else 'CUDA'})\n\nMachine: {machine()}\n")
    t0 = time.perf_counter()
    fns = {
        "audit": check_audit,
        "overhead": check_overhead,
        "compile": check_compile,
        "probe": check_probe,
        "fsdp": check_fsdp,
        "kernels": check_kernels,
    }
    rows = [r for name in only for r in run_check(name, fns[name], sz)]
    print(table(rows))
    failed = [r.check for r in rows if r.status == "FAIL"]
    print(f"\nTotal {time.perf_counter() - t0:.0f} s; " + (f"FAILED: {', '.join(failed)}" if failed else "no failure"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "dry_run": args.dry_run, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
