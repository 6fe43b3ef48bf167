"""``benchmarks/overhead.py --smoke`` runs: correctness only (a verdict from every monitored run,
finite numbers, the table printed); no timing assertion, the machine may be busy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_overhead_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--smoke", "--markdown", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "smoke: OK" in proc.stdout and "Paired estimate, wide" in proc.stdout
    assert "| demo | (a) window, default settings |" in proc.stdout
    assert "| wide | (e) user hook with .item() per layer |" in proc.stdout
    data = json.loads(out.read_text())
    for model in ("demo", "wide"):
        r = data["results"][model]
        assert set(r["summary"]) == {"off", "off-again", "window", "sampled", "after", "watch", "user-item", "paired"}
        assert r["paired"]["control_even_vs_odd"] > 0 and r["paired"]["ratio"] > 0
        assert r["summary"]["off"]["ratio_q"] == 1.0
        for config in ("window", "sampled", "after", "watch", "paired"):
            verdicts = r["verdicts"][config]
            assert len(verdicts) == 2 and all(v["decision"] in ("go", "no-go") for v in verdicts)
        # every monitored run saw the same data and model: the same verdict each repeat
        assert r["verdicts"]["window"][0] == r["verdicts"]["window"][1]
        assert r["paired"]["ratio_lo"] <= r["paired"]["ratio"] <= r["paired"]["ratio_hi"]
    # pooling a run with itself doubles every sample: the medians, so the point estimates, stay the same
    pooled = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--pool", str(out), str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert pooled.returncode == 0, pooled.stdout[-3000:] + pooled.stderr[-3000:]
    assert "- wide: 2 file(s), 4 paired runs, 4 reference runs" in pooled.stdout
    for model in ("demo", "wide"):
        want = f"window hot-path overhead {100 * (data['results'][model]['paired']['ratio'] - 1):+.2f}%"
        assert want in pooled.stdout.split(f"Paired estimate, {model}:")[1]


def test_profile_hook_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--smoke", "--profile-hook"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    names = [r.split(" | ")[0].lstrip("| ") for r in rows]
    assert names[0] == "whole satmon hook, counting in the hook (in a step)" and "in-place > threshold" in names
    assert "idle satmon hook (uncounted step)" in names
    assert "whole satmon hook, keep_inputs (as the callback runs it)" in names
    assert "count_inputs() after the forward, per layer (keep_inputs)" in names
    for r in rows:  # every cell a finite, positive time
        cells = [float(c) for c in r.strip(" |").split(" | ")[1:]]
        assert len(cells) == 3 and all(0 < c < 1e7 for c in cells)
