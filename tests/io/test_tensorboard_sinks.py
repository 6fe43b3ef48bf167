"""The sinks: ``SummaryWriterSink`` writes what satmon 0.2 wrote through Lightning's ``TensorBoardLogger``.

The reference is satmon 0.2's writing path, which ``LightningSink`` keeps call for call (``log_metrics``,
``experiment.add_text``, ``add_custom_scalars``, the hparams sub-run), read back with TensorBoard's own
``EventAccumulator`` / ``EventMultiplexer``: every scalar's steps and values, every text, the custom-scalars
layout and every hparams session must be equal, run for run. Then what a sink owns: files opened at the first
write, on rank zero only, closed by ``close()``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from satmon.demos.gpt import GPT, GPTConfig
from satmon.io.lightning import LightningSink
from satmon.io.sink import LayoutSink, MultiSink, NullSink, Sink
from satmon.io.tags import TAG
from satmon.io.tensorboard import (
    SummaryWriterSink,
    add_layout,
    log_scalars,
    log_stop,
    log_text,
    log_verdict,
    watch_scalars,
    window_scalars,
)
from satmon.io.tensorboard_replay import TensorBoardReplay, next_version
from satmon.results.stop import StopReason, StopRecord
from satmon.results.verdict import GatingInfo, build_verdict
from satmon.screen.screen import Screen


def snapshot(root: Path, tb) -> dict[str, dict]:
    """Every run under ``root`` (by path relative to it), as TensorBoard reads it back."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    runs = {}
    for run in sorted({p.parent for p in root.rglob("events.out.tfevents.*")}):
        ea = tb.accumulate(run)
        tags = ea.Tags()
        text_tags = [t for t in tags["tensors"] if ea.SummaryMetadata(t).plugin_data.plugin_name == "text"]
        texts = {t: tb.text(ea, t) for t in text_tags}
        layouts = [
            str(layout_pb2.Layout.FromString(e.tensor_proto.string_val[0]))
            for e in (ea.Tensors("custom_scalars__config__") if "custom_scalars__config__" in tags["tensors"] else [])
        ]
        runs[run.relative_to(root).as_posix()] = {
            "scalars": {t: tb.scalars(ea, t) for t in sorted(tb.scalar_tags(ea))},
            "texts": texts,
            "layout": layouts,
            "other tensors": sorted(t for t in tags["tensors"] if t not in text_tags and t not in tb.scalar_tags(ea)),
        }
    sessions = tb.hparams_sessions(root)
    for s in sessions:
        s["run"] = Path(s["run"]).as_posix()
    return {"runs": runs, "sessions": sorted(sessions, key=lambda s: s["run"])}


def _verdict(step: int, gated: bool = False, source: str = "window"):
    gating = GatingInfo(True, ("ln_f",), "ln_f feeds a SwiGLU MLP") if gated else GatingInfo(False, (), "no gated MLP")
    window = step if source == "window" else 0
    return build_verdict(
        {"blocks.0.ln_1": (1, 8), "ln_f": (6, 8)},
        step=step,
        window=window,
        source=source,
        gating=gating,
        notes=("a note",),
    )


def _write(sink: Sink) -> None:
    """What a screen and a replay write, in their order: layout, running readings, verdicts, a stop, watch checks."""
    add_layout(sink)
    for step, sat in ((2, 0.25), (4, 0.375)):
        log_scalars(
            sink,
            window_scalars(sat, {"blocks.0.ln_1": sat / 2, "ln_f": sat * 2}, {"blocks.0.ln_1": 1.5, "ln_f": 2.5}, 0),
            step,
        )
    log_verdict(sink, _verdict(6, gated=True))
    log_stop(sink, StopRecord(StopReason.COLLAPSE_RISK, "saturation 0.44 >= 0.5", 6, dry_run=True))
    log_scalars(
        sink, watch_scalars(0, 0.625, {"blocks.0.mlp": {"flat_fraction": 0.25}}, 1.5, {StopReason.LOSS_SPIKE: False}), 8
    )
    log_verdict(sink, _verdict(10, source="replay"))  # a second session (replay writes one per checkpoint)
    log_text(sink, TAG.replay_checkpoint, "`epoch=0-step=10.ckpt`", 10)


def test_summary_writer_sink_writes_the_layout_lightnings_logger_wrote(tmp_path, tb):
    ours = SummaryWriterSink(tmp_path / "ours" / "run")
    _write(ours)
    ours.close()
    logger = TensorBoardLogger(str(tmp_path / "lightning"), name="run", version="", default_hp_metric=False)
    theirs = LightningSink([logger])
    _write(theirs)
    theirs.close()
    logger.finalize("success")
    got, expected = snapshot(tmp_path / "ours", tb), snapshot(tmp_path / "lightning", tb)
    assert got == expected
    run = got["runs"]["run"]
    assert run["scalars"]["Satmon/saturation"] == [(2, 0.25), (4, 0.375), (6, 0.4375), (10, 0.4375)]
    assert run["scalars"]["Satmon/stop"] == [(6, 1.0)] and run["scalars"]["satmon_collapse/risk"] == [
        (6, 0.0),
        (10, 0.0),
    ]
    assert [s for s, _ in run["texts"]["satmon/verdict"]] == [6, 10] and run["texts"]["satmon/stop"][0][0] == 6
    assert len(run["layout"]) == 1 and "alpha per layer" in run["layout"][0]
    assert list(got["runs"]) == ["run"]  # one run per run: no hparams sub-run
    assert [s["run"] for s in got["sessions"]] == ["run"]  # one session shown: TensorBoard keeps the first
    assert got["sessions"][0]["hparams"]["satmon/source"] == ("string_value", "window")
    assert run["scalars"]["Satmon/decision"] == [(6, 1.0), (10, 1.0)]  # 7 of 16 >= 0.43


def _screen_run(sink_or_logdir: dict) -> Screen:
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=8.0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    batches = torch.randint(0, 256, (10, 4, 17), generator=torch.Generator().manual_seed(0))
    screen = Screen(
        window=6,
        log_every_n_steps=2,
        watch_every_n_steps=2,
        abort_on="no-go",
        dry_run=True,
        verbose=False,
        **sink_or_logdir,
    ).attach(model, example_input=batches[0, :, :-1])
    for batch in batches:
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        screen.step(loss)
    screen.detach()
    return screen


def test_screen_logdir_equals_satmon_0_2s_tensorboard_logger(tmp_path, tb):
    """``Screen(logdir=...)`` against 0.2's ``TensorBoardLogger(logdir, name="", version="",
    default_hp_metric=False)``."""
    ours = _screen_run({"logdir": tmp_path / "ours"})
    logger = TensorBoardLogger(str(tmp_path / "lightning"), name="", version="", default_hp_metric=False)
    theirs = _screen_run({"sink": LightningSink([logger])})
    logger.finalize("success")
    assert ours.verdict == theirs.verdict and ours.stop == theirs.stop and ours.stop is not None
    got, expected = snapshot(tmp_path / "ours", tb), snapshot(tmp_path / "lightning", tb)
    assert got == expected
    run = got["runs"]["."]
    assert run["scalars"]["Satmon/decision"] == [(6, 1.0 if ours.verdict.go else 0.0)]
    assert [s for s, _ in run["scalars"]["Satmon/saturation"]] == [2, 4, 6, 6]  # running, running, verdict (twice)
    assert [s for s, _ in run["scalars"]["satmon_collapse/nonfinite"]] == [r["step"] for r in ours.watch.log]
    assert run["texts"]["satmon/verdict"] == [(6, ours.verdict.card())] and run["texts"]["satmon/stop"] == [
        (6, ours.stop.text())
    ]


def test_files_open_at_the_first_write_and_close(tmp_path, tb):
    sink = SummaryWriterSink(tmp_path / "run")
    assert isinstance(sink, LayoutSink) and not (tmp_path / "run").exists() and not sink.is_open
    log_scalars(sink, {TAG.saturation: 0.5}, 1)
    assert sink.is_open and len(list((tmp_path / "run").glob("events.*"))) == 1  # flushed: readable before close
    assert tb.scalars(tb.accumulate(tmp_path / "run"), TAG.saturation) == [(1, 0.5)]
    sink.close()
    assert not sink.is_open
    log_scalars(sink, {TAG.saturation: 0.25}, 2)  # after close: a new event file in the same run
    sink.close()
    assert len(list((tmp_path / "run").glob("events.*"))) == 2
    # both writes are read back; across the two files TensorBoard orders by file name, whose last part is a per-process
    # writer counter (…9 sorts after …10), so the order between the files depends on the tests run before this one
    assert sorted(tb.scalars(tb.accumulate(tmp_path / "run"), TAG.saturation)) == [(1, 0.5), (2, 0.25)]


def test_only_rank_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    sink = SummaryWriterSink(tmp_path / "run")
    _write(sink)
    sink.close()
    assert not (tmp_path / "run").exists()
    every = SummaryWriterSink(tmp_path / "every", rank_zero_only=False)
    log_scalars(every, {TAG.saturation: 0.5}, 1)
    every.close()
    assert list((tmp_path / "every").glob("events.*"))


def test_a_replay_session_leaves_the_columns_to_the_live_runs(tmp_path, tb):
    """TensorBoard takes one run's column list (any run's experiment summary): a replay writes its session without
    one, so the HParams columns stay the live run's (its model's hyper-parameters beside satmon's)."""
    live = SummaryWriterSink(tmp_path / "live")
    live.scalars({TAG.saturation: 0.5}, 6)
    live.hparams(
        {"lr": 0.01, "arch": "gpt", **{TAG.hp_decision: "go", TAG.hp_trust: "unproven"}}, {TAG.verdict: 1.0}, 6
    )
    live.close()
    replay = SummaryWriterSink(tmp_path / "replay of live", hparams_experiment=False)
    log_verdict(replay, _verdict(10, source="replay"))
    replay.close()
    view = tb.hparams_view(tmp_path)
    assert {"lr", "arch", TAG.hp_decision, TAG.hp_trust} <= set(view["hparams"]) and view["shown"][:2] == [
        TAG.hp_decision,
        TAG.hp_trust,
    ]
    sessions = {s["run"]: s for s in tb.hparams_sessions(tmp_path)}
    assert sorted(sessions) == ["live", "replay of live"] and [r for r, s in sessions.items() if s["experiment"]] == [
        "live"
    ]
    assert sessions["replay of live"]["hparams"][TAG.hp_source] == ("string_value", "replay")


def test_lightning_sink_sends_scalars_to_every_logger_and_the_rest_to_tensorboard(tmp_path):
    csv = CSVLogger(str(tmp_path), name="csv", version=0)
    sink = LightningSink([csv])
    _write(sink)
    sink.close()
    csv.finalize("success")
    text = Path(csv.log_dir, "metrics.csv").read_text()
    assert "Satmon/saturation" in text and "Satmon/decision" in text
    assert not list(tmp_path.rglob(TAG.hparams_run))  # no TensorBoard logger: no hparams sub-run
    # a logger without a text view gets the latest card and stop beside its files
    assert Path(csv.log_dir, "satmon_verdict.md").read_text() == _verdict(10, source="replay").card() + "\n"
    assert Path(csv.log_dir, "satmon_stop.md").is_file()


def test_multi_and_null_sinks():
    class Count:
        def __init__(self):
            self.n = {"scalars": 0, "text": 0, "hparams": 0, "close": 0}

        def scalars(self, values, step):
            self.n["scalars"] += 1

        def text(self, tag, markdown, step):
            self.n["text"] += 1

        def hparams(self, params, metrics, step):
            self.n["hparams"] += 1

        def close(self):
            self.n["close"] += 1

    a, b = Count(), Count()
    both = MultiSink(a, NullSink(), b)
    _write(both)  # layout goes to those that have one: none here, and no error
    both.close()
    assert a.n == b.n == {"scalars": 6, "text": 4, "hparams": 2, "close": 1}
    with pytest.raises(TypeError, match="Expected a satmon.io.sink.Sink"):
        MultiSink(a, object())


def test_replay_runs_are_numbered_and_written_by_the_sink(tmp_path, tb):
    report = NS(
        layers={"ln_f": NS(kind="dyt", saturation=0.75, alpha=2.0, init_gap=None)},
        saturation=0.75,
        sigma_min=NS(valid=False),
        verdict=build_verdict({"ln_f": (3, 4)}, step=10, source="replay"),
    )
    first = TensorBoardReplay(tmp_path, name="replay")
    first(NS(global_step=10, report=report, checkpoint="a.ckpt", error=None))
    first(NS(global_step=20, report=None, checkpoint="b.ckpt", error="not a checkpoint"))
    first.close()
    assert first.log_dir == str(tmp_path / "replay" / "version_0") and next_version(tmp_path / "replay") == 1
    second = TensorBoardReplay(tmp_path, name="replay")
    assert second.log_dir.endswith("version_1")
    second.close()
    ea = tb.accumulate(first.log_dir)
    assert tb.scalars(ea, TAG.saturation) == [(10, 0.75)]  # once: the verdict writes it, the probe's copy is dropped
    assert tb.text(ea, TAG.replay_error) == [(20, "`b.ckpt`: not a checkpoint")]
    assert tb.text(ea, TAG.replay_checkpoint) == [(10, "`a.ckpt`")]
    assert "custom_scalars__config__" in ea.Tags()["tensors"]
