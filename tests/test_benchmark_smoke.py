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
