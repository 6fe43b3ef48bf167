"""satmon.io.tensorboard_reader: a run written with the writer reads back value for value.

The reference is TensorBoard's own ``EventAccumulator`` (conftest ``tb``) on the same files, and
the hand-written values that went in: every satmon tag, every step, every text.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from satmon.io.tags import TAG
from satmon.io.tensorboard import SummaryWriterSink, log_scalars, log_text, log_verdict, window_scalars
from satmon.io.tensorboard_reader import Run, load_runs, read_run, run_dirs, trajectory
from satmon.results.verdict import build_verdict

NOTE = "window restarted at step 3 after a resume"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, Path, object]:
    """A run with running readings at 2 and 4, a non-finite verdict, a stop and probe readings at 6."""
    root = tmp_path_factory.mktemp("runs")
    sink = SummaryWriterSink(root / "live" / "version_0")
    log_scalars(sink, window_scalars(0.25, {"h.0.dyt": 0.5, "ln_f": 0.0}, {"h.0.dyt": 2.0, "ln_f": 1.5}, 0), 2)
    log_scalars(sink, window_scalars(0.375, {"h.0.dyt": 0.75, "ln_f": 0.0}, {"h.0.dyt": 2.5, "ln_f": 1.25}, 1), 4)
    verdict = build_verdict({"h.0.dyt": (3, 4), "ln_f": (0, 4, 1)}, step=6, window=6, notes=(NOTE,))
    log_verdict(sink, verdict)
    log_text(sink, TAG.stop_text, "**satmon stopped training at step 6** (nonfinite): NaN in the watched step", 6)
    log_scalars(
        sink,
        {
            TAG.stop: 1.0,
            TAG.deadir_alignment("h.1.ln"): 0.5,
            TAG.deadir_null_dim("h.1.ln"): 2.0,
            TAG.sigma_min_ratio("h.1"): 0.5,
            TAG.sigma_min_ratio("h.2"): 0.25,
        },
        6,
    )
    sink.writer.add_scalar("loss", 3.0, 6)  # not satmon's: left out
    sink.close()
    return root, Path(sink.log_dir), verdict


def test_reader_equals_tensorboards_event_accumulator(written, tb):
    root, log_dir, _ = written
    runs, looked = load_runs(root)
    assert looked == 1 and [r.path for r in runs] == [log_dir]  # one run per run
    run = runs[0]
    ea = tb.accumulate(log_dir)
    satmon_tags = [t for t in tb.scalar_tags(ea) if TAG.is_satmon(t)]
    assert sorted(run.scalars) == sorted(satmon_tags) and "loss" not in run.scalars
    for tag in satmon_tags:
        assert run.scalars[tag] == [(s, float(v)) for s, v in tb.scalars(ea, tag)], tag
    assert run.texts == {"satmon/verdict": tb.text(ea, "satmon/verdict"), "satmon/stop": tb.text(ea, "satmon/stop")}


def test_reader_values_steps_and_views(written):
    _, log_dir, verdict = written
    run = read_run(log_dir)
    # the verdict writes the pooled value too
    assert run.scalars["Satmon/saturation"] == [
        (2, 0.25),
        (4, 0.375),
        (6, 0.375),
    ]
    assert run.scalars["satmon_alpha/ln_f"] == [(2, 1.5), (4, 1.25)]
    assert run.scalars["Satmon/nonfinite"] == [(2, 0.0), (4, 1.0)]
    assert run.scalars["Satmon/decision"] == [(6, -1.0)] and run.decision() == "non-finite"
    assert run.verdict_saturation() == 0.375 == verdict.saturation  # 3 of 8 elements, written at the verdict step
    assert run.last_text(TAG.verdict_text) == verdict.card() and f"Note: {NOTE}" in verdict.card()
    assert run.last_text(TAG.replay_checkpoint) is None
    assert run.steps() == [2, 4, 6]
    assert run.layers() == {
        "h.0.dyt": {"saturation": 0.75, "alpha": 2.5},
        "ln_f": {"saturation": 0.0, "alpha": 1.25},
        "h.1.ln": {"alignment": 0.5, "null_dim": 2.0},
    }
    assert run.sigma_min_min_ratio() == [(6, 0.25)]  # no summary tag written: the minimum over the blocks


def test_decision_of_each_verdict_value():
    assert [Run(Path("."), scalars={TAG.verdict: [(1, v)]}).decision() for v in (1.0, 0.0, -1.0, 0.5)] == [
        "go",
        "no-go",
        "non-finite",
        None,
    ]
    assert Run(Path(".")).decision() is None and Run(Path(".")).verdict_saturation() is None


def test_trajectory_drops_a_late_step0_copy_and_keeps_the_last_write(tmp_path):
    """A v0.1 run: Lightning's log_hyperparams(metrics=...) copied satmon/verdict at step 0 after step 7."""
    with SummaryWriter(str(tmp_path)) as w:
        for step, value in ((0, 0.5), (7, 1.0), (7, 0.0), (0, 0.0)):
            w.add_scalar(TAG.verdict, value, step)
        w.add_scalar(TAG.legacy_verdict_saturation, 0.5, 0)
    run = read_run(tmp_path)
    assert run.scalars == {TAG.verdict: [(0, 0.5), (7, 0.0)]}  # the real step-0 point stays; the legacy tag goes
    assert trajectory([(4, 1.0), (2, 2.0)]) == [(2, 2.0), (4, 1.0)]


def test_run_dirs(written, tmp_path):
    root, log_dir, _ = written
    event = next(log_dir.glob("events.out.tfevents.*"))
    assert run_dirs(event) == [log_dir]
    with SummaryWriter(str(log_dir / TAG.hparams_run)) as w:  # satmon 0.3's hparams sub-run: no run of its own
        w.add_scalar("Satmon/verdict", 1.0, 6)
    assert run_dirs(log_dir) == [log_dir]
    assert run_dirs(log_dir / TAG.hparams_run) == [log_dir / TAG.hparams_run]  # only a sub-run: read it
    assert load_runs(tmp_path) == ([], 0)


def test_a_0_3_run_reads_with_todays_names(tmp_path):
    """satmon 0.3 wrote the decision as Satmon/verdict, the collapse risk in the summary group and a replay's texts
    under satmon/replay/: read back, they have the names 0.4 writes."""
    from satmon.io.tensorboard import text_summary

    with SummaryWriter(str(tmp_path / "old")) as w:
        w.add_scalar("Satmon/verdict", 0.0, 8)
        w.add_scalar("Satmon/collapse_risk", 1.0, 8)
        w.add_scalar("Satmon/saturation", 0.625, 8)  # exact in float32
        w.file_writer.add_summary(text_summary("satmon/replay/checkpoint", "`a.ckpt`"), 8)
        w.file_writer.add_summary(text_summary("satmon/replay/error", "`b.ckpt`: bad"), 9)
    run = read_run(tmp_path / "old")
    assert run.scalars == {TAG.verdict: [(8, 0.0)], TAG.collapse_risk: [(8, 1.0)], TAG.saturation: [(8, 0.625)]}
    assert run.decision() == "no-go" and run.verdict_saturation() == 0.625
    assert run.texts == {TAG.replay_checkpoint: [(8, "`a.ckpt`")], TAG.replay_error: [(9, "`b.ckpt`: bad")]}


def test_a_run_without_satmon_tags_is_looked_at_not_returned(tmp_path):
    with SummaryWriter(str(tmp_path / "other")) as w:
        w.add_scalar("loss", 1.0, 0)
    assert load_runs(tmp_path) == ([], 1)
