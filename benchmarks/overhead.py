"""Step-time overhead of satmon, measured the way a user would pay it: a Lightning ``Trainer`` loop.

Trains satmon's GPT-2-style DyT model at several widths (``demo``: the ``satmon demo`` model, d=64;
``wide``: d=512 at batch 2; ``d512b8``: d=512, 4 blocks, batch 8 x 128; ``d1024``: d=1024, 2 blocks,
batch 4 x 128) for a fixed number of optimizer steps, many times, in ONE process, alternating the
configurations below (interleaved, the order rotated each repeat) so that a noisy, shared machine
drifts into every configuration alike:

- ``off``        no monitor (the reference);
- ``off-again``  no monitor again: the A/A control, its ratio is the noise floor of this run;
- ``window``     ``SaturationMonitor`` at default settings, every measured step inside the window;
- ``sampled``    the same with ``sample_every=4`` (satmon's cheaper sampling option);
- ``after``      steps after the window, collapse watch off (``watch_every_n_steps=0``): should be 1.00;
- ``watch``      steps after the window, collapse watch at its default cadence (every 50 steps);
- ``trap``       ``after`` with the trap watch on at its default cadence (every 10 steps from step 1): paired
  with ``after`` (the same run but for the trap watch), their ratio is its price per step;
- ``user-item``  what users write without satmon: a forward hook per DyT layer computing the
  saturated fraction and calling ``.item()`` on it at every forward;
- ``paired``     the window with ``sample_every=2``: counted and uncounted steps alternate within
  one run, so each counted step is compared with its two uncounted neighbours (a paired estimate
  of the window's hot-path cost that slow load drifts on a shared machine cannot bias; the same
  even/odd comparison on the ``off`` runs is its control);
- ``paired-eager`` / ``paired-fused``  the same with the count path forced: the four ATen ops, or the
  fused (compiled) count; ``paired`` takes whichever satmon chooses (the crossover in
  ``satmon.observe.saturation.FUSED_MIN_ELEMENTS``). Run side by side they give eager vs fused in one run.

``--until-width W`` keeps adding repeats (beyond ``--repeats``, up to ``--max-repeats``) until every
paired estimate's 90% interval is at most ``W`` percentage points wide.

Reported: the 20th percentile (robust to the other tenants of a shared machine) and the median of
the pooled per-step times, their ratios to ``off``, and the paired estimates (``stats.py``). How a
step is timed: ``harness.py``.

On CUDA (``--device cuda``) every measured step except the watch's check steps also runs under
``torch.cuda.set_sync_debug_mode``: first ``"warn"`` for every configuration (syncs counted), then,
where the no-monitor baseline itself is sync-free, ``"error"`` for the satmon configurations: a
run that finishes proves zero host syncs in satmon's per-step path.

Usage::

    python benchmarks/overhead.py                        # CPU, demo and wide models, markdown table
    python benchmarks/overhead.py --models wide --repeats 12 --steps 40
    python benchmarks/overhead.py --models d512b8 --configs paired-eager,paired-fused --threads 1 --clock cpu \\
        --until-width 1
    python benchmarks/overhead.py --device cuda
    python benchmarks/overhead.py --smoke                # tiny, correctness only (the test suite)
    python benchmarks/profile_hook.py                    # where the hook's time goes (also: --profile-hook)
    python benchmarks/pool.py a.json b.json              # earlier --json runs pooled (also: --pool a.json b.json)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import torch
from harness import (
    CONFIGS,
    FUSED_BACKENDS,
    LABELS,
    MODELS_CPU,
    MODELS_CUDA,
    MODELS_SMOKE,
    MONITORED,
    ModelSpec,
    Plan,
    audit_cells,
    machine,
    quiet_logs,
    run_once,
    sync_audit,
    use_fused_backend,
)
from stats import PAIRED_CONFIGS, paired_estimate, paired_estimates, paired_lines, summarise


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (other tenants' work: figures from a busy machine say so)."""
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def table(results: dict[str, Any], q: float, markdown: bool, cuda: bool) -> str:
    """One row per model and configuration: step times and their ratios to ``off``."""
    qs = f"p{round(q * 100)}"
    head = ["model", "configuration", f"{qs} ms/step", "median ms/step", f"ratio ({qs})", "ratio (median)", "steps"]
    if cuda:
        head.append("host syncs in measured steps")
    rows = []
    for m, r in results.items():
        for c, s in r["summary"].items():
            row = [
                m,
                LABELS[c],
                f"{s['q'] * 1e3:.2f}",
                f"{s['median'] * 1e3:.2f}",
                f"{s['ratio_q']:.4f}",
                f"{s['ratio_median']:.4f}",
                str(s["n"]),
            ]
            if cuda:
                row.append(r.get("audit", {}).get(c, "-"))
            rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def fmt(r: list[str]) -> str:
        return "  ".join(str(x).ljust(w) for x, w in zip(r, widths))

    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def trap_lines(results: dict[str, Any]) -> list[str]:
    """The trap watch's price: ``trap`` (f) over ``after`` (c), the same run but for the trap watch (interleaved in one
    process; every step pooled, the check steps among them, so it is the cost per step averaged over the cadence)."""
    out = []
    for m, r in results.items():
        s = r["summary"]
        if "trap" in s and "after" in s:
            out.append(
                f"\nTrap watch, {m}: step time with the trap watch on over off (f)/(c): "
                f"{s['trap']['ratio_q'] / s['after']['ratio_q']:.4f} (low quantile), "
                f"{s['trap']['ratio_median'] / s['after']['ratio_median']:.4f} (median)"
            )
    return out


def check_run(config: str, out: dict[str, Any], plan: Plan, spec: ModelSpec) -> None:
    """Smoke assertions: the run measured what it should and satmon counted what it should."""
    assert len(out["times"]) == plan.measured, f"{config}: expected {plan.measured} step times, got {len(out['times'])}"
    assert all(math.isfinite(t) and t > 0 for t in out["times"]), f"{config}: non-finite step time"
    if config in MONITORED:
        v = out["verdict"]
        assert v is not None, f"{config}: the monitor produced no verdict"
        per_step = spec.batch_size * spec.seq_len * spec.d_model * (2 * spec.n_layers + 1)  # every DyT input element
        counted = {
            "window": plan.total,
            "after": plan.window_small,
            "watch": plan.window_small,
            "trap": plan.window_small,
        }.get(config)
        assert counted is None or v["elements"] == counted * per_step, f"{config}: {v['elements']} elements counted"
    if config == "watch":
        assert out["watch_checks"] >= 1, "watch: expected at least one collapse-watch check in the measured span"
    if config == "user-item":
        assert out["user_fractions"] > 0, "user-item: the hook never ran"


def measure(
    spec: ModelSpec,
    configs: list[str],
    plan: Plan,
    repeats: int,
    device: str,
    q: float,
    smoke: bool,
    t_start: float,
    clock: str = "wall",
    until_width: float | None = None,
    max_repeats: int = 0,
) -> dict[str, Any]:
    """All configurations of one model, interleaved, ``repeats`` times (more, up to ``max_repeats``, while a
    paired estimate's 90% interval is wider than ``until_width`` points); the summary and paired estimates."""
    times: dict[str, list[float]] = {c: [] for c in configs}
    runs: dict[str, list[list[float]]] = {c: [] for c in configs}
    verdicts: dict[str, list[Any]] = {c: [] for c in configs}
    paths: dict[str, dict[str, int]] = {}
    r = 0
    while True:
        order = configs[r % len(configs) :] + configs[: r % len(configs)]  # rotate: no configuration always first
        for c in order:
            out = run_once(spec, c, plan, device, clock=clock)
            times[c] += out["times"]
            runs[c].append(out["times"])
            if c in MONITORED:
                verdicts[c].append(out["verdict"])
                for k, v in out.get("count_paths", {}).items():
                    paths.setdefault(c, {}).setdefault(k, 0)
                    paths[c][k] += v
            if smoke:
                check_run(c, out, plan, spec)
        r += 1
        widths = {c: pe["width"] for c, pe in paired_estimates(runs, plan.warmup).items()}
        wide = [c for c, w in widths.items() if not 100 * w <= (until_width or math.inf)]
        note = ", ".join(f"{c} interval {100 * w:.2f} points" for c, w in widths.items())
        print(
            f"  {spec.name}: repeat {r} done ({time.perf_counter() - t_start:.0f} s){'; ' + note if note else ''}",
            file=sys.stderr,
        )
        if r >= repeats and (until_width is None or not wide or r >= max_repeats):
            break
    return {
        "spec": spec.describe(),
        "dyt_layers": 2 * spec.n_layers + 1,
        "warmup": plan.warmup,
        "summary": summarise(times, q),
        "paired": paired_estimate(runs, plan.warmup),
        "paths": paired_estimates(runs, plan.warmup),
        "count_paths": paths,
        "repeats": r,
        "verdicts": verdicts,
        "runs": runs,
    }


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(
        prog="benchmarks/overhead.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--models", default="demo,wide", help="comma-separated: demo, wide, d512b8, d1024 (default demo,wide)"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="measured steps per run (default: demo 60, wide 24, d512b8 and d1024 40)",
    )
    p.add_argument("--warmup", type=int, default=12, help="steps before the measured span (default 12)")
    p.add_argument("--repeats", type=int, default=12, help="interleaved repeats of every configuration (default 12)")
    p.add_argument(
        "--until-width",
        type=float,
        default=None,
        metavar="POINTS",
        help="after --repeats, keep repeating until every paired estimate's 90%% interval is at most this many "
        "percentage points wide (or --max-repeats is reached)",
    )
    p.add_argument("--max-repeats", type=int, default=60, help="the most repeats --until-width may run (default 60)")
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {','.join(CONFIGS)} ('off' is always run)",
    )
    p.add_argument(
        "--quantile", type=float, default=0.2, help="the low quantile reported beside the median (default 0.2)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all CPU cores)")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="step time: elapsed wall time (default), or this process's CPU time (CPU only: a shared machine's "
        "other tenants preempting the run do not add to it)",
    )
    p.add_argument(
        "--watch-every", type=int, default=50, help="collapse-watch cadence of the `watch` configuration (default 50)"
    )
    p.add_argument(
        "--fused-backend",
        choices=list(FUSED_BACKENDS),
        default=None,
        help="what compiles the fused count: inductor (satmon's default), or graph (the traced ATen graph run "
        "uncompiled: code paths only; the default of --smoke)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 repeats, few steps: correctness only")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    p.add_argument("--json", default=None, help="also write every per-step time and summary to this JSON file")
    p.add_argument(
        "--profile-hook", action="store_true", help="run benchmarks/profile_hook.py (same --device, --threads, --smoke)"
    )
    p.add_argument(
        "--pool", nargs="+", metavar="JSON", default=None, help="run benchmarks/pool.py on these --json files"
    )
    return p, p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    p, args = parse_args(argv)
    if args.pool:
        import pool

        return pool.main(args.pool)
    if args.profile_hook:
        import profile_hook

        return profile_hook.main(
            [
                "--device",
                args.device,
                *(["--threads", str(args.threads)] if args.threads else []),
                *(["--smoke"] if args.smoke else []),
            ]
        )
    if args.device == "cuda" and args.clock != "wall":
        p.error("--clock cpu times the host's work only: use it with --device cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/overhead.py: --device cuda asked for, but torch.cuda.is_available() is False.", file=sys.stderr
        )
        return 2
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    use_fused_backend(args.fused_backend or ("graph" if args.smoke else "inductor"))
    quiet_logs()
    cuda = args.device == "cuda"
    specs = MODELS_SMOKE if args.smoke else (MODELS_CUDA if cuda else MODELS_CPU)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if bad := [m for m in models if m not in specs]:
        p.error(f"expected --models from {sorted(specs)}, got {bad}")
    configs = ["off"] + [c for c in (c.strip() for c in args.configs.split(",")) if c and c != "off"]
    if bad := [c for c in configs if c not in CONFIGS]:
        p.error(f"expected --configs from {CONFIGS}, got {bad}")
    repeats = 2 if args.smoke else args.repeats
    if args.until_width is not None and not args.until_width > 0:
        p.error(f"expected --until-width > 0 percentage points, got {args.until_width}")
    if args.until_width is not None and not any(c in PAIRED_CONFIGS for c in configs):
        p.error(f"--until-width needs a paired configuration ({', '.join(PAIRED_CONFIGS)}) in --configs")
    watch_every = 4 if args.smoke else args.watch_every

    print(f"# satmon overhead benchmark ({args.device}, {args.clock} clock)\n\nMachine: {machine()}")
    print(f"Load average at the start: {load_average()}")
    print("Command: python benchmarks/overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    results: dict[str, Any] = {}
    t_start = time.perf_counter()
    for m in models:
        steps = 6 if args.smoke else (args.steps or {"demo": 60, "wide": 24}.get(m, 40))
        warmup = 6 if args.smoke else args.warmup
        plan = Plan(warmup=warmup, measured=steps, window_small=max(1, warmup // 2), watch_every=watch_every)
        results[m] = measure(
            specs[m],
            configs,
            plan,
            repeats,
            args.device,
            args.quantile,
            args.smoke,
            t_start,
            args.clock,
            None if args.smoke else args.until_width,
            max(repeats, args.max_repeats),
        )
        if cuda:
            results[m]["audit"] = audit_cells(sync_audit(specs[m], plan, configs))
        if args.smoke:
            for c, s in results[m]["summary"].items():
                assert all(math.isfinite(v) and v > 0 for v in s.values()), f"non-finite timing for {m}/{c}: {s}"
            for c in (c for c in configs if c in PAIRED_CONFIGS):
                assert all(math.isfinite(v) for v in results[m]["paths"][c].values()), (m, c)
    print()
    for m, r in results.items():
        print(
            f"- {m}: {r['spec']}, {r['dyt_layers']} DyT layers; reference "
            f"{r['summary']['off']['median'] * 1e3:.1f} ms/step "
            f"(median); {r['repeats']} repeats"
        )
        for c, counted in r["count_paths"].items():
            if c in PAIRED_CONFIGS:
                print(f"  {c}: inputs counted by " + ", ".join(f"{k} {v:,}" for k, v in counted.items()))
    print()
    print(table(results, args.quantile, args.markdown, cuda))
    for line in paired_lines(results):
        print(line)
    for line in trap_lines(results):
        print(line)
    load = load_average()
    print(f"\nTotal {time.perf_counter() - t_start:.0f} s; load average at the end: {load}.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": machine(), "args": vars(args), "load_average_end": load, "results": results},
                f,
                indent=1,
                default=str,
            )
    if args.smoke:
        print("smoke: OK (every monitored run produced a verdict of the expected element count; all numbers finite)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
