"""``benchmarks/gpu_check.py --dry-run``: every check's code path on the CPU, with every CUDA entry point
it could reach made to raise, so a CUDA call outside a device check fails the run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# runs the script as __main__ after replacing the CUDA calls a dry run must never make
_NO_CUDA = """
import runpy, sys, torch
import lightning.pytorch  # imports torch._dynamo, whose tables of torch functions must see the real ones
def _no_cuda(name):
    def call(*args, **kwargs):
        raise AssertionError(f"torch.cuda.{name} called in --dry-run")
    return call
for name in ("synchronize", "set_sync_debug_mode", "memory_allocated", "max_memory_allocated",
             "reset_peak_memory_stats", "get_device_name", "current_device", "set_device"):
    setattr(torch.cuda, name, _no_cuda(name))
sys.path.insert(0, sys.argv[1])
sys.argv = [sys.argv[1] + "/gpu_check.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

ROWS = (
    "(a) host-sync audit, window + watch",
    "(b) overhead in the window, paired, satmon's choice",
    "(b) overhead in the window, paired, fused count forced",
    "(b) overhead in the window, paired, four ops forced",
    "(b) overhead in the window, between runs",
    "(b) overhead after the window (watch off)",
    "(c) torch.compile, aot_eager",
    "(c) torch.compile, inductor",
    "(d) probe, d=64",
    "(d) probe, d=64: budget vs none",
    "(e) FSDP2",
    "(f) work per counted DyT input, eager",
    "(f) work per counted DyT input, eager, four ops forced",
    "(f) work per counted DyT input, inductor",
)


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, "-c", _NO_CUDA, str(ROOT / "benchmarks"), "--dry-run", "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "called in --dry-run" not in proc.stderr
    printed = [line.split(" | ")[0].lstrip("| ") for line in proc.stdout.splitlines() if line.startswith("| (")]
    assert printed == list(ROWS)
    rows = {r["check"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == list(ROWS)
    assert not [r for r in rows.values() if r["status"] == "FAIL"]
    for r in rows.values():
        assert all(math.isfinite(v) for v in r["numbers"].values()), r
    audit = rows["(a) host-sync audit, window + watch"]
    assert audit["status"] == "n/a" and audit["result"].startswith("n/a on CPU")
    assert audit["numbers"]["elements"] == 11 * 2 * 16 * 32 * 5  # 11 steps x batch x seq x d x 5 DyT layers
    assert audit["numbers"]["watch_checks"] >= 1
    for words in ("satmon's choice", "fused count forced", "four ops forced"):
        paired = rows[f"(b) overhead in the window, paired, {words}"]["numbers"]
        assert paired["ratio_lo"] <= paired["ratio"] <= paired["ratio_hi"] and paired["ratio"] > 0
    counted = 2 * 6 * 5  # 2 repeats x 6 counted steps (sample_every=2 over 11 steps) x 5 DyT layers
    assert rows["(b) overhead in the window, paired, fused count forced"]["numbers"]["inputs_fused"] == counted
    assert rows["(b) overhead in the window, paired, four ops forced"]["numbers"]["inputs_four_ops"] == counted
    compiled = rows["(c) torch.compile, aot_eager"]
    assert compiled["status"] == "pass" and compiled["numbers"]["saturated_diff"] == 0
    assert compiled["numbers"]["graphs"] >= 1 and 0.05 < compiled["numbers"]["saturation"] < 0.95
    probe = rows["(d) probe, d=64"]
    assert probe["status"] == "pass" and probe["numbers"]["layers"] == 5  # 2 norms per block + the final one
    # 5 norm layers + 3 residual streams; the budget holds 3 matrices beside a readout: 3 passes
    assert probe["numbers"]["matrices"] == 8 and probe["numbers"]["passes"] == 3
    budgeted = rows["(d) probe, d=64: budget vs none"]
    assert budgeted["status"] == "pass" and budgeted["result"] == "readings identical"
    kernels = rows["(f) work per counted DyT input, eager"]
    assert kernels["status"] == "n/a" and kernels["numbers"]["layers"] == 5
    assert 1 <= kernels["numbers"]["per_input"] <= 8  # the CPU path's ops per input (a CUDA run counts kernels)
