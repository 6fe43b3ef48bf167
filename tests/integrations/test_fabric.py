"""examples/fabric_loop.py: ``satmon.Screen`` inside a Lightning Fabric loop.

One process: the verdict equals the Lightning callback's on the same model, data and seed. Two CPU
processes (gloo, ``strategy="ddp"``; Fabric starts the second rank by re-running the script, so the
run is a subprocess with a timeout): both ranks report the same verdict and stop at the same step,
and the verdict's counts equal a float64 re-count of the DyT inputs both ranks saw, summed.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers import clean_env, run_ranks
from integration_recipe import ROOT, STEPS, WINDOW, comparable, lightning_run, load_example

TESTS = Path(__file__).resolve().parents[1]


def test_one_process_verdict_equals_the_lightning_callbacks(tmp_path):
    monitor = lightning_run(tmp_path / "lightning")
    load_example("fabric_loop").main(
        ["--window", str(WINDOW), "--steps", str(STEPS), "--json", str(tmp_path / "fabric")]
    )
    record = json.loads((tmp_path / "fabric" / "rank0.json").read_text())
    assert record["steps"] == STEPS and record["stop"] is None
    fabric = dict(record["verdict"])
    assert fabric.pop("planned_forecast")["outcome"] == "uncertain"  # a plain Screen: no trainer to count passes from
    assert fabric == comparable(monitor.verdict, strip="model.")


RECORDING = textwrap.dedent(
    """
    # examples/fabric_loop.py, with a float64 recorder of every training DyT input on each rank
    import importlib.util, json, sys
    sys.path.insert(0, {tests!r})
    from reference import InputRecorder
    from satmon import find_dyt_layers

    spec = importlib.util.spec_from_file_location("fabric_loop", {example!r})
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    recorders = []

    def recorded_model():
        model = build()
        recorders.append(InputRecorder(model, [l.name for l in find_dyt_layers(model)]))
        return model

    build, example.build_model = example.build_model, recorded_model
    example.main(sys.argv[1:])
    import torch.distributed as dist
    out = sys.argv[sys.argv.index("--json") + 1]
    with open(f"{{out}}/counts{{dist.get_rank()}}.json", "w") as f:
        json.dump(recorders[0].counts(first={window}), f)
    example.shutdown()
    """
)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_two_processes_agree_on_the_verdict_and_the_stop(tmp_path):
    script = tmp_path / "recorded_fabric_loop.py"
    script.write_text(
        RECORDING.format(tests=str(TESTS), example=str(ROOT / "examples" / "fabric_loop.py"), window=WINDOW)
    )
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(script),
        "--devices",
        "2",
        "--window",
        str(WINDOW),
        "--steps",
        str(STEPS),
        "--abort-on",
        "no-go",
        "--threshold",
        "0.9",
        "--json",
        str(out),
    ]
    run_ranks(cmd, cwd=tmp_path, env=clean_env(), timeout=240)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)

    # the stop: NO-GO at the window's end (saturation ~0.2 < 0.9), on both ranks, at the same step
    assert ranks[0]["stop"] == ranks[1]["stop"] and ranks[0]["stop"]["reason"] == "no-go"
    assert ranks[0]["steps"] == ranks[1]["steps"] == ranks[0]["stop"]["step"] == WINDOW

    # the verdict: the same on both ranks, made from the counts of both
    assert ranks[0]["verdict"] == ranks[1]["verdict"]
    verdict = ranks[0]["verdict"]
    recounts = [json.loads((out / f"counts{r}.json").read_text()) for r in (0, 1)]
    summed = {n: [sum(c[n][i] for c in recounts) for i in (0, 1)] for n in recounts[0]}
    assert verdict["per_layer"] == {n: s / t for n, (s, t) in summed.items()}
    assert verdict["elements"] == sum(t for _, t in summed.values())
    assert all(c[n][1] == summed[n][1] // 2 for c in recounts for n in c)  # each rank counted half
