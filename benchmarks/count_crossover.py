"""Where the fused (compiled) count starts to beat the four ATen ops on this CPU: the crossover behind
``satmon.observe.saturation.FUSED_MIN_ELEMENTS``.

Times satmon's own counting call, ``CountQueue.count_kept()`` over ``n`` kept DyT inputs of ``e``
elements each (what the callback runs after each CPU forward), once with the four ops forced
(``fused=False``) and once with the fused count forced (``fused=True``: one compiled call for the
``n`` inputs), interleaved, on one torch thread, with this process's CPU time. Between two timed
calls a buffer larger than the last-level cache is written (``--cold``, the default), as a training
step streams its weights and optimizer state between two counts; ``--warm`` leaves the caches be.
The compilation happens before any timing (one warm-up call per shape).

For each ``(n, e)`` it prints both times (median over ``--rounds``), their ratio, and whether the
fused call was faster; then the crossover: the smallest total ``n * e`` from which the fused call is
faster at every larger total measured. The counts of the two paths are checked equal on every shape.

Usage::

    python benchmarks/count_crossover.py                      # float32, cold caches
    python benchmarks/count_crossover.py --dtype bfloat16 --warm
    python benchmarks/count_crossover.py --smoke              # tiny, correctness only (the test suite)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
from harness import FUSED_BACKENDS

from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import FUSED_MIN_ELEMENTS, CountQueue

#: (inputs per call, elements per input): the demo model's forward is (5, 65,536), d512b8's (9, 524,288)
GRID = [(n, e) for n in (1, 5, 9) for e in (16_384, 65_536, 131_072, 262_144, 1_048_576)]
SMOKE_GRID = [(1, 64), (3, 4_096)]


def _queue(n: int, fused: bool, backend: str) -> CountQueue:
    q = CountQueue(SaturationCounter(n), 2.0, keep_inputs=True)
    q.fused, q.fused_backend = fused, FUSED_BACKENDS[backend]
    return q


def _count(q: CountQueue, xs: list[torch.Tensor], alphas: list[torch.Tensor]) -> None:
    for i, (x, a) in enumerate(zip(xs, alphas)):
        q.add_input(i, x, a)
    q.count_kept()


def measure(
    n: int, e: int, dtype: torch.dtype, rounds: int, cold: bool, backend: str, evict: torch.Tensor
) -> dict[str, Any]:
    """Median CPU microseconds of one ``count_kept()`` over ``n`` inputs of ``e`` elements, per path."""
    g = torch.Generator().manual_seed(n * 1_000_003 + e)
    xs = [(torch.randn(e // 64, 64, generator=g) * 1.5).to(dtype) for _ in range(n)]
    alphas = [torch.nn.Parameter(torch.tensor(1.0 + 0.1 * i)) for i in range(n)]
    queues = {"four ops": _queue(n, False, backend), "fused": _queue(n, True, backend)}
    for q in queues.values():  # warm-up: compilation, thresholds, buffers; then the counts must agree
        _count(q, xs, alphas)
        q.flush()
    counts = {k: (q.counter.saturated.tolist(), q.counter.total.tolist()) for k, q in queues.items()}
    if counts["four ops"] != counts["fused"] or queues["fused"].inputs_counted["fused"] != n:
        raise AssertionError(f"n={n}, e={e}: the paths disagree or the fused one was not taken: {counts}")
    times: dict[str, list[float]] = {k: [] for k in queues}
    for r in range(rounds):
        for k in list(queues) if r % 2 == 0 else list(queues)[::-1]:
            if cold:
                evict.add_(1.0)
            t0 = time.process_time()
            _count(queues[k], xs, alphas)
            times[k].append(time.process_time() - t0)
            if r % 16 == 15:
                queues[k].flush()
    med = {k: sorted(v)[len(v) // 2] * 1e6 for k, v in times.items()}
    return {
        "n": n,
        "e": e,
        "total": n * e,
        "four_ops_us": med["four ops"],
        "fused_us": med["fused"],
        "ratio": med["fused"] / med["four ops"],
    }


def crossover(rows: list[dict[str, Any]]) -> int | None:
    """The smallest total from which the fused call is faster at every larger total measured (``None``: never)."""
    best = None
    for row in sorted(rows, key=lambda r: r["total"], reverse=True):
        if row["ratio"] >= 1.0:
            break
        best = row["total"]
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/count_crossover.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--rounds", type=int, default=41, help="timed calls per path and shape (default 41)")
    p.add_argument("--warm", action="store_true", help="do not evict the caches between timed calls")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument(
        "--backend",
        choices=list(FUSED_BACKENDS),
        default=None,
        help="what compiles the fused count: inductor (default), or graph (uncompiled: the default of --smoke)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny shapes, few rounds: correctness only")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    grid, rounds = (SMOKE_GRID, 3) if args.smoke else (GRID, args.rounds)
    backend = args.backend or ("graph" if args.smoke else "inductor")
    evict = torch.zeros((2 if args.smoke else 64) * 2**20 // 4)  # 64 MiB: twice this machine's L3
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# fused ({backend}) vs four-op count, {args.dtype}, {'warm' if args.warm else 'cold'} caches, {args.threads} "
        f"thread(s), torch {torch.__version__}, load average {load:.2f} at start\n"
    )
    print("| inputs | elements each | elements in all | four ops (us) | fused (us) | fused / four ops |")
    print("|---|---|---|---|---|---|")
    rows = []
    for n, e in grid:
        row = measure(n, e, dtype, rounds, not args.warm, backend, evict)
        rows.append(row)
        print(
            f"| {n} | {e:,} | {n * e:,} | {row['four_ops_us']:.0f} | {row['fused_us']:.0f} | {row['ratio']:.2f} |",
            flush=True,
        )
    x = crossover(rows)
    end_load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"\nCrossover: {'none measured (the fused call never won)' if x is None else f'{x:,} elements in all'}; "
        f"satmon's FUSED_MIN_ELEMENTS is {FUSED_MIN_ELEMENTS:,}. Load average {end_load:.2f} at the end."
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "crossover": x, "load": [load, end_load]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
