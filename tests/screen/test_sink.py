"""What a Screen sends to its sink, call by call: a fake sink records every call of a plain loop.

The running readings are checked against a float64 re-count of the DyT inputs (``helpers.InputRecorder``),
the verdict's calls against the verdict's own maps (``verdict_scalars``, ``verdict_hparams``, its card),
and ownership: the screen closes the sink it made (``logdir=``), never one it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import RecordingSink
from reference import InputRecorder
from satmon import find_dyt_layers
from satmon.demos.gpt import GPT, GPTConfig
from satmon.io.sink import LayoutSink, MultiSink, Sink
from satmon.io.tags import TAG
from satmon.io.tensorboard import custom_scalars_layout, verdict_hparams, verdict_scalars
from satmon.screen.screen import Screen

WINDOW, STEPS, EVERY = 4, 9, 2


def _loop(screen: Screen) -> InputRecorder:
    """A plain loop of STEPS steps; returns the float64 record of every DyT input it trained on."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=8.0))
    rec = InputRecorder(model, [l.name for l in find_dyt_layers(model)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    batches = torch.randint(0, 256, (STEPS, 4, 17), generator=torch.Generator().manual_seed(0))
    screen.attach(model, example_input=batches[0, :, :-1])
    for batch in batches:
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        screen.step(loss)
    screen.finish()
    screen.detach()
    return rec


@pytest.fixture(scope="module")
def run() -> tuple[Screen, RecordingSink, InputRecorder]:
    sink = RecordingSink()
    assert isinstance(sink, LayoutSink)
    screen = Screen(
        window=WINDOW, log_every_n_steps=EVERY, watch_every_n_steps=EVERY, offset_every=2, verbose=False, sink=sink
    )
    return screen, sink, _loop(screen)


def test_the_layout_goes_once_at_attach(run):
    _, sink, _ = run
    assert sink.calls[0] == ("layout", custom_scalars_layout())
    assert [c for c in sink.calls if c[0] == "layout"] == [sink.calls[0]]


def test_running_readings_equal_a_float64_recount(run):
    screen, sink, rec = run
    names = screen.layer_names
    steps = {c[2]: c[1] for c in sink.calls if c[0] == "scalars" and TAG.nonfinite in c[1]}
    assert sorted(steps) == [2, WINDOW]  # every EVERY steps in the window, then at the verdict
    for step, got in steps.items():
        counts = rec.counts(first=step)
        pooled = sum(s for s, _ in counts.values()) / sum(t for _, t in counts.values())
        assert got[TAG.saturation] == pytest.approx(pooled, rel=1e-12)
        for n in names:
            assert got[TAG.layer_saturation(n)] == pytest.approx(counts[n][0] / counts[n][1], rel=1e-12)
            alpha = float(rec.inputs[n][step][1].abs().mean())  # the alpha the next forward used
            assert got[TAG.alpha(n)] == pytest.approx(alpha, rel=1e-6)
        assert got[TAG.nonfinite] == 0.0


def test_the_verdict_goes_as_scalars_card_and_one_hparams_session(run):
    screen, sink, _ = run
    v = screen.verdict
    at_verdict = [c for c in sink.calls if c[-1] == WINDOW]
    kinds = [c[0] if c[0] != "text" else f"text:{c[1]}" for c in at_verdict]
    assert kinds == ["scalars", "scalars", "text:satmon/verdict", "hparams"]
    readings, scalars, card, hparams = at_verdict
    # the offset readings ride with the last running ones
    assert any(k.startswith("satmon_offset/") for k in readings[1])
    assert scalars[1] == verdict_scalars(v) and card[2] == v.card()
    # the trap watch's state rides with the verdict's hparams (the session TensorBoard keeps)
    assert hparams[1:] == ({**verdict_hparams(v), TAG.hp_trap: screen.trap.state}, verdict_scalars(v), WINDOW)


def test_watch_checks_go_at_their_steps(run):
    screen, sink, _ = run
    watched = [c for c in sink.calls if c[0] == "scalars" and TAG.collapse_nonfinite in c[1]]
    assert [c[2] for c in watched] == [r["step"] for r in screen.watch.log] and watched
    for (_, values, _), logged in zip(watched, screen.watch.log):
        assert values[TAG.collapse_nonfinite] == float(logged["nonfinite"])
        assert values[TAG.collapse_breach("loss-spike")] == float(logged["loss-spike"])


def test_a_given_sink_is_the_callers_to_close(run):
    _, sink, _ = run
    assert ("close",) not in sink.calls and not any(c[0] == "text" and c[1] == TAG.stop for c in sink.calls)


def test_the_screen_closes_the_files_it_opened_and_writes_to_both(tmp_path):
    sink = RecordingSink()
    screen = Screen(window=WINDOW, verbose=False, sink=sink, logdir=tmp_path / "run", offset_every=0)
    assert isinstance(screen.sink, MultiSink) and isinstance(screen.sink, Sink)
    _loop(screen)
    own = screen.sink.sinks[1]
    assert own.log_dir == str(tmp_path / "run") and not own.is_open  # closed at detach
    assert list((tmp_path / "run").glob("events.out.tfevents.*"))
    assert not [p for p in (tmp_path / "run").iterdir() if p.is_dir()]  # one run per run: no hparams sub-run
    assert ("close",) not in sink.calls  # the given sink stays open


def test_a_screen_without_dyt_leaves_no_files(tmp_path):
    screen = Screen(window=2, verbose=False, logdir=tmp_path / "run")
    with pytest.warns(UserWarning, match="no DyT layer"):
        screen.attach(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)))
    screen.detach()
    assert not (tmp_path / "run").exists()


def test_a_bad_sink_is_refused_with_what_to_pass():
    with pytest.raises(TypeError, match=r"Expected a satmon.io.sink.Sink .*got list.*LightningSink"):
        Screen(sink=[], verbose=False)


FRESH = textwrap.dedent(
    """
    import json, sys, tempfile
    import torch
    import satmon
    satmon.Screen, satmon.probe, satmon.Verdict, satmon.Settings
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), satmon.DyT(4, alpha_init=2.0))
    screen = satmon.Screen(window=2, verbose=False, logdir=tempfile.mkdtemp()).attach(model)
    for _ in range(3):
        screen.step(model(torch.randn(8, 4)).square().mean())
    screen.detach()
    assert screen.verdict is not None
    report = satmon.probe(model, torch.randn(2, 4))
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    """
)


@pytest.fixture(scope="module")
def fresh_modules(tmp_path_factory) -> set[str]:
    """The top-level packages a fresh process loads for the public core names, a screen that writes TensorBoard
    files, and a probe."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path_factory.mktemp("fresh"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_core_loads_no_lightning(fresh_modules):
    assert "torch" in fresh_modules and "tensorboard" in fresh_modules  # it did write event files
    assert not fresh_modules & {"lightning", "pytorch_lightning"}


def test_the_core_loads_no_transformers(fresh_modules):
    # satmon 0.2's device states were torchmetrics Metrics, and `import torchmetrics` imports transformers when
    # it is installed; 0.3's are satmon.observe.states.SumStates
    assert not fresh_modules & {"transformers", "torchmetrics"}
