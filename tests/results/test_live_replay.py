"""A replayed checkpoint's card beside the live verdict of its run: the section under the title, both readings with
the step each read, whether they agree, and why they can differ; the records round-trip through JSON."""

from __future__ import annotations

from satmon.results.live_replay import WHY, LiveReading, ReplaySource, with_section
from satmon.results.replay_record import ReplayRecord
from satmon.results.verdict import build_verdict


class Report:  # what ReplayRecord reads of a probe report
    def __init__(self, verdict):
        self.verdict = verdict

    def to_dict(self):
        return {"verdict": self.verdict.to_dict()}


LIVE = LiveReading(
    "no-go", 0.2480, 0.43, 500, window=500, trust="ok", found="the SaturationMonitor state saved in `s500.ckpt`"
)


def test_the_card_carries_both_readings_right_under_its_title():
    replayed = build_verdict({"ln_f": (5965, 10000)}, step=500, source="replay")
    record = ReplayRecord(
        "logs/demo/version_0/checkpoints/epoch=0-step=500.ckpt",
        500,
        report=Report(replayed),
        source=ReplaySource("logs/demo/version_0", live=LIVE),
    )
    card = record.card()
    lines = card.splitlines()
    assert lines[0] == replayed.card().splitlines()[0] and lines[1] == ""
    assert lines[2] == (
        "Replay of `logs/demo/version_0`; its live verdict read from the SaturationMonitor state saved in `s500.ckpt`."
    )
    assert "| live window | NO-GO | 0.2480 | the 500 training steps up to step 500, train mode |" in lines
    assert (
        "| replay | GO (unproven) | 0.5965 | checkpoint `epoch=0-step=500.ckpt` at step 500, eval mode, calibration "
        "batches |" in lines
    )
    assert f"They disagree. Why they can differ: {WHY}" in lines
    assert card.endswith(replayed.card().split("\n", 1)[1].lstrip("\n"))  # the rest of the card follows, whole
    back = ReplaySource.from_dict(record.to_dict()["replay_of"])
    assert back == record.source


def test_without_a_live_verdict_the_card_names_the_run_and_why():
    replayed = build_verdict({"ln_f": (1, 10)}, step=3, source="replay")
    source = ReplaySource("ckpts", missing="no SaturationMonitor state with a verdict in the checkpoints")
    card = ReplayRecord("ckpts/a.pt", 3, report=Report(replayed), source=source).card()
    assert "Replay of `ckpts`; its live verdict was not found: no SaturationMonitor state" in card
    assert "| live window" not in card
    assert ReplayRecord("ckpts/a.pt", 3, report=Report(replayed)).card() == replayed.card()
    assert ReplayRecord("ckpts/a.pt", 3, error="unreadable").card() is None


def test_agreeing_readings_say_so_and_a_title_alone_takes_the_section():
    replayed = build_verdict({"ln_f": (1, 10)}, step=500, source="replay")
    card = ReplayRecord("a.ckpt", 500, report=Report(replayed), source=ReplaySource("run", live=LIVE)).card()
    assert "They agree (NO-GO). Why they can differ:" in card
    assert with_section("### title", "body") == "### title\n\nbody"
    assert LiveReading.from_dict(LIVE.to_dict()) == LIVE
    assert (
        LiveReading("go", 0.5, 0.43, 7).steps_read()
        == "the training steps of the window, verdict at step 7, train mode"
    )
