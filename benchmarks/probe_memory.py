"""Peak extra memory and time of ``satmon.probe`` on the CPU, with and without ``memory_budget``.

Each configuration runs in a fresh subprocess. Memory: the kernel's peak resident set (``VmHWM``),
reset with ``/proc/self/clear_refs`` just before the call, minus the resident set then (Linux only;
``tracemalloc`` does not see torch's CPU allocations). The model and its batches exist before the
reset; what the probe's forwards allocate is included, so a plain no-grad forward is measured the
same way for reference. Time: wall and CPU (``time.process_time``: less sensitive to other
tenants of a shared machine), one torch thread. Results: docs/science/performance_measurements.md
("The dead-direction probe's memory, measured").

    OMP_NUM_THREADS=1 python benchmarks/probe_memory.py --d 2048 --blocks 2 --budget none 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

_CHILD = r"""
import json, sys, time, torch
from torch import nn
import satmon
from satmon.probing.memory_plan import READOUT_MATRICES, matrix_bytes

d, blocks, rows, budget_matrices = (int(a) if a != "none" else None for a in sys.argv[1:5])
torch.set_num_threads(1)
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.proj = nn.Linear(d, d)
    def forward(self, x):
        return x + self.proj(self.ln(x))

model = nn.Sequential(nn.Linear(d, d), nn.Sequential(*(Block() for _ in range(blocks))) if blocks else nn.LayerNorm(d))
x = torch.randn(rows, d)

def rss(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))

def measure(fn):
    base = rss("VmRSS:")
    open("/proc/self/clear_refs", "w").write("5")
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, rss("VmHWM:") - base, (time.perf_counter() - t0, time.process_time() - c0)

with torch.no_grad():
    _, fwd, fwd_s = measure(lambda: model(x))
budget = None if budget_matrices is None else budget_matrices * matrix_bytes(d) + READOUT_MATRICES * 8 * d * d
report, peak, seconds = measure(lambda: satmon.probe(model, [x], memory_budget=budget))
print(json.dumps({"d": d, "blocks": blocks, "rows": rows, "budget": budget, "plan": report.plan.describe(),
                  "matrices": report.plan.matrices, "passes": report.plan.passes,
                  "planned_peak": report.plan.peak_bytes, "peak": peak, "seconds": seconds[0],
                  "cpu_seconds": seconds[1], "forward_peak": fwd, "forward_s": fwd_s[0],
                  "norm_type": report.norm_type}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, nargs="+", default=[2048])
    p.add_argument("--blocks", type=int, default=2, help="residual blocks (0: one LayerNorm, no blocks)")
    p.add_argument("--rows", type=int, default=1024, help="tokens in the one calibration batch")
    p.add_argument("--budget", nargs="+", default=["none"], help="'none' or matrices per pass (plus one readout)")
    args = p.parse_args()
    print(
        "| d | blocks | rows | budget (matrices/pass) | matrices | passes | planned peak MiB | measured peak MiB "
        "| forward alone MiB | wall s | CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        for b in args.budget:
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(d), str(args.blocks), str(args.rows), b],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            mib = 2**20
            print(
                f"| {d} | {args.blocks} | {args.rows} | {b} | {r['matrices']} | {r['passes']} | "
                f"{r['planned_peak'] / mib:.0f} "
                f"| {r['peak'] / mib:.0f} | {r['forward_peak'] / mib:.0f} | {r['seconds']:.1f} "
                f"| {r['cpu_seconds']:.1f} |",
                flush=True,
            )
            print(f"<!-- {r['plan']} ({time.perf_counter() - t0:.0f} s with start-up) -->", flush=True)


if __name__ == "__main__":
    main()
