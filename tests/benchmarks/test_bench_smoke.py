"""The benchmark programs on tiny sizes: they run, count what they should, and report finite numbers.

No timing assertion: the machine may be busy. What is asserted is what the programs count and
compute: the element count of every monitored run, its verdict against a float64 re-count of the
same training run, and pooling's arithmetic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from reference import InputRecorder
from satmon import find_dyt_layers
from satmon.results.verdict import build_verdict

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

from harness import MODELS_SMOKE, Plan, run_once  # noqa: E402

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
# --smoke: 6 warm-up + 6 measured steps + 1 closing step, the small window half the warm-up
TOTAL, WINDOW_SMALL = 13, 3


def _run(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _dyt_elements(spec) -> int:
    """DyT input elements per training step: every token's d_model channels, 2 DyT per block + the final one."""
    return spec.batch_size * spec.seq_len * spec.d_model * (2 * spec.n_layers + 1)


def test_overhead_smoke_counts_and_pools(tmp_path):
    out = tmp_path / "bench.json"
    proc = _run(str(BENCH / "overhead.py"), "--smoke", "--markdown", "--threads", "1", "--json", str(out), cwd=tmp_path)
    assert "smoke: OK" in proc.stdout and "Paired estimate, wide" in proc.stdout
    assert "| demo | (a) window, default settings |" in proc.stdout
    assert "| wide | (e) user hook with .item() per layer |" in proc.stdout
    assert "Trap watch, demo: step time with the trap watch on over off (f)/(c): " in proc.stdout
    data = json.loads(out.read_text())
    # optimizer steps each configuration counts: all (window), the first few (after, watch), every 2nd / 4th from 0
    counted_steps = {
        "window": TOTAL,
        "after": WINDOW_SMALL,
        "watch": WINDOW_SMALL,
        "trap": WINDOW_SMALL,
        "paired": (TOTAL + 1) // 2,
        "paired-eager": (TOTAL + 1) // 2,
        "paired-fused": (TOTAL + 1) // 2,
        "sampled": (TOTAL + 3) // 4,
    }
    for model in ("demo", "wide"):
        r = data["results"][model]
        assert set(r["summary"]) == set(CONFIGS) and r["warmup"] == 6
        assert r["summary"]["off"]["ratio_q"] == 1.0
        assert r["paired"]["ratio_lo"] <= r["paired"]["ratio"] <= r["paired"]["ratio_hi"]
        per_step = _dyt_elements(MODELS_SMOKE[model])
        for config, steps in counted_steps.items():
            first, second = r["verdicts"][config]
            assert first == second, f"{model}/{config}: the same seed and data gave two verdicts"
            assert first["elements"] == steps * per_step, f"{model}/{config}: {first['elements']} elements"
        # each forced path counted every input its way (2 runs x counted steps x DyT layers), with the same verdict
        inputs = 2 * counted_steps["paired"] * (2 * MODELS_SMOKE[model].n_layers + 1)
        assert r["count_paths"]["paired-fused"] == {"fused": inputs, "four ops": 0}
        assert r["count_paths"]["paired-eager"] == {"fused": 0, "four ops": inputs}
        assert r["verdicts"]["paired-fused"] == r["verdicts"]["paired-eager"] == r["verdicts"]["paired"]
        assert set(r["paths"]) == {"paired", "paired-eager", "paired-fused"}
    assert "Load average at the start: " in proc.stdout and "load average at the end: " in proc.stdout
    pooled = _run(str(BENCH / "overhead.py"), "--pool", str(out), str(out), cwd=tmp_path)
    assert (
        "- wide: 2 file(s), 4 paired runs, 4 paired-eager runs, 4 paired-fused runs, 4 reference runs" in pooled.stdout
    )
    for model in ("demo", "wide"):  # a run pooled with itself: every ratio twice, the medians unchanged
        pe = data["results"][model]["paired"]
        part = pooled.stdout.split(f"Paired estimate, {model}")
        assert f"window hot-path overhead {100 * (pe['ratio'] - 1):+.2f}%" in part[1]
        assert f"overhead {100 * (pe['sampled_step_ratio'] - 1):+.2f}% per step" in part[2]


class _Recorder(Callback):
    """Float64 copies of every DyT input of the run (tests/helpers.py), attached when training starts.

    It also sets every ``alpha`` to 50 first: at the benchmark's ``alpha_init=2`` a freshly built
    model saturates nothing, and a recount of zeros would not tell a right count from no count.
    """

    def on_train_start(self, trainer, pl_module) -> None:
        layers = find_dyt_layers(pl_module)
        with torch.no_grad():
            for layer in layers:
                layer.module.alpha.fill_(50.0)
        self.rec = InputRecorder(pl_module, [l.name for l in layers])


def test_window_verdict_equals_a_float64_recount():
    spec, plan = MODELS_SMOKE["demo"], Plan(warmup=2, measured=3, window_small=1, watch_every=4)
    recorder = _Recorder()
    out = run_once(spec, "window", plan, "cpu", extra_callbacks=[recorder])
    counts = recorder.rec.counts()
    assert sum(t for _, t in counts.values()) == plan.total * _dyt_elements(spec)  # every step's inputs recorded
    ref = build_verdict(counts, step=plan.total, window=plan.total)
    got = out["verdict"]
    assert got["decision"] == ref.decision
    assert got["saturation"] == ref.saturation and got["elements"] == ref.elements
    assert got["per_layer"] == ref.per_layer
    assert 0.05 < ref.saturation < 0.95  # both saturated and unsaturated elements: a count that can be wrong


def test_the_realistic_widths_run_and_count_every_input(tmp_path):
    """The d512b8 and d1024 models (tiny in --smoke): the paired configurations, each forced path, exact counts."""
    out = tmp_path / "wide.json"
    _run(
        str(BENCH / "overhead.py"),
        "--smoke",
        "--models",
        "d512b8,d1024",
        "--configs",
        "paired-eager,paired-fused",
        "--threads",
        "1",
        "--json",
        str(out),
        cwd=tmp_path,
    )
    data = json.loads(out.read_text())
    for model in ("d512b8", "d1024"):
        r = data["results"][model]
        assert set(r["paths"]) == {"paired-eager", "paired-fused"}
        eager, fused = r["verdicts"]["paired-eager"], r["verdicts"]["paired-fused"]
        assert eager == fused and eager[0]["elements"] == (TOTAL + 1) // 2 * _dyt_elements(MODELS_SMOKE[model])


def test_until_width_repeats_until_every_paired_interval_is_narrow(monkeypatch, capsys):
    """``measure`` with ``until_width``: repeats past ``repeats`` while an interval is wider,
    and stops at ``max_repeats``."""
    import overhead

    calls = {"n": 0}

    def fake_run_once(spec, config, plan, device, clock="wall"):
        calls["n"] += 1
        noisy = config == "paired-eager" and calls["n"] <= 12  # noisy for the first repeats, then steady
        times = [
            1.0 + (0.3 * ((i * 7) % 5) if noisy else 0.0) + (0.05 if i % 2 == 0 and config != "off" else 0.0)
            for i in range(plan.measured)
        ]
        return {"times": times, "verdict": None, "count_paths": {"fused": 1, "four ops": 0}}

    monkeypatch.setattr(overhead, "run_once", fake_run_once)
    spec, plan = MODELS_SMOKE["demo"], Plan(warmup=0, measured=20, window_small=1, watch_every=4)
    configs = ["off", "paired-eager", "paired-fused"]
    r = overhead.measure(spec, configs, plan, 2, "cpu", 0.2, False, 0.0, until_width=1.0, max_repeats=50)
    assert 2 < r["repeats"] < 50 and all(pe["width"] <= 0.01 for pe in r["paths"].values())
    assert r["count_paths"]["paired-fused"] == {"fused": r["repeats"], "four ops": 0}
    calls["n"] = 0  # noisy again for four repeats: wider than asked all along
    capped = overhead.measure(spec, configs, plan, 1, "cpu", 0.2, False, 0.0, until_width=1.0, max_repeats=3)
    assert capped["repeats"] == 3 and capped["paths"]["paired-eager"]["width"] > 0.01  # stops at the cap
    assert "paired-eager interval" in capsys.readouterr().err


def test_count_crossover_smoke_and_its_arithmetic(tmp_path):
    import count_crossover

    out = tmp_path / "x.json"
    proc = _run(str(BENCH / "count_crossover.py"), "--smoke", "--json", str(out), cwd=tmp_path)
    assert "Crossover:" in proc.stdout and "| 3 | 4,096 | 12,288 |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["n"], r["e"]) for r in rows] == [(1, 64), (3, 4096)] and all(r["fused_us"] > 0 for r in rows)
    table = [{"total": t, "ratio": q} for t, q in [(10, 1.3), (20, 0.9), (40, 1.01), (80, 0.8), (160, 0.7)]]
    assert count_crossover.crossover(table) == 80  # faster from 80 on; 40 was not
    assert count_crossover.crossover([{"total": 5, "ratio": 1.2}]) is None


def test_profile_hook_smoke(tmp_path):
    proc = _run(str(BENCH / "overhead.py"), "--smoke", "--profile-hook", "--threads", "1", cwd=tmp_path)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    names = [r.split(" | ")[0].lstrip("| ") for r in rows]
    assert names[0] == "whole satmon hook, counting in the hook (in a step)" and "in-place > threshold" in names
    assert set(names) >= {
        "idle satmon hook (uncounted step)",
        "whole satmon hook, keep_inputs (as the callback runs it)",
        "count_kept() after the forward, per layer (keep_inputs)",
        "abs(x) into the work buffer",
    }
    for r in rows:  # every cell a finite, positive time
        cells = [float(c) for c in r.strip(" |").split(" | ")[1:]]
        assert len(cells) == 3 and all(0 < c < 1e7 for c in cells)


def test_profile_hook_count_paths_smoke(tmp_path):
    proc = _run(
        str(BENCH / "profile_hook.py"), "--smoke", "--count-paths", "--model", "d512b8", "--threads", "1", cwd=tmp_path
    )
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == ["four ops", "fused"]
    for r in rows:
        cells = [float(c) for c in r.strip(" |").split(" | ")[1:]]
        assert len(cells) == 3 and all(0 < c < 1e7 for c in cells)
