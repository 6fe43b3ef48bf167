"""satmon.screen.stop_policy: the policy returns what it decided (and logs nothing); the screen logs and acts.

The expected decisions are written out from the documented table (docs/science/abort_policy.md): which
reasons each ``abort_on`` acts on, a dry run that reports each reason once and never stops, and
``abort_mode="raise"`` that raises only after the stop was logged.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers import RecordingSink
from satmon import DyT
from satmon.results.stop import SatmonAbort, StopDecision, StopReason, StopRecord
from satmon.results.verdict import GatingInfo, build_verdict
from satmon.screen.screen import Screen
from satmon.screen.stop_policy import StopPolicy, verdict_stop_reason
from satmon.settings import Settings

ACTS_ON = {  # abort_on -> the reasons that stop the run
    "never": set(),
    "no-go": {StopReason.NO_GO, StopReason.COLLAPSE_RISK},
    "collapse": {StopReason.COLLAPSE_RISK},
    "any": set(StopReason),
}


class Ranks:
    """An agreement of ``world_size`` ranks: the others' flags are given; records every collective."""

    def __init__(self, others: bool = False, rank: int = 0, world_size: int = 2) -> None:
        self.others, self.rank, self.world_size = others, rank, world_size
        self.calls: list[bool] = []

    def any(self, flag: bool) -> bool:
        self.calls.append(flag)
        return bool(flag) or self.others

    def max(self, values: torch.Tensor) -> torch.Tensor:
        return values


@pytest.mark.parametrize("abort_on", list(ACTS_ON))
@pytest.mark.parametrize("reason", list(StopReason))
def test_each_policy_acts_on_its_reasons_and_returns_the_decision(abort_on, reason):
    ranks = Ranks()
    policy = StopPolicy(Settings(abort_on=abort_on))
    decision = policy.request(reason, "why", 12, ranks)
    assert ranks.calls == [reason in ACTS_ON[abort_on]]  # every rank takes part in the collective, breach or not
    if reason in ACTS_ON[abort_on]:
        assert decision == StopDecision(StopRecord(reason, "why", 12), "stop")
        assert policy.stop == decision.record and policy.should_stop
    else:
        assert decision is None and policy.stop is None and not policy.should_stop


def test_another_ranks_finding_stops_this_rank_too():
    policy = StopPolicy(Settings(abort_on="any"))
    ranks = Ranks(others=True)  # this rank found nothing it acts on, another rank did
    decision = policy.request(StopReason.LOSS_SPIKE, "rank 1 saw a spike", 30, ranks)
    assert ranks.calls == [True] and decision.action == "stop"
    quiet = StopPolicy(Settings(abort_on="collapse"))
    decision = quiet.request(StopReason.LOSS_SPIKE, "not acted on here", 30, Ranks(others=True))
    assert decision.action == "stop"  # the others' breach decides: every rank stops together


def test_once_stopping_nothing_new_is_decided_and_no_collective_runs():
    ranks = Ranks()
    policy = StopPolicy(Settings(abort_on="any"))
    first = policy.request(StopReason.NONFINITE, "NaN", 5, ranks)
    assert policy.request(StopReason.LOSS_SPIKE, "later", 6, ranks) is None
    assert ranks.calls == [True] and policy.stop == first.record  # the first stop stays the stop


def test_dry_run_reports_each_reason_once_and_never_stops():
    ranks = Ranks()
    policy = StopPolicy(Settings(abort_on="any", dry_run=True))
    first = policy.request(StopReason.LOSS_SPIKE, "spike", 50, ranks)
    assert first == StopDecision(StopRecord(StopReason.LOSS_SPIKE, "spike", 50, dry_run=True), "dry-run")
    assert not first.stops and not policy.should_stop
    assert policy.request(StopReason.LOSS_SPIKE, "spike again", 100, ranks) is None  # reported once
    other = policy.request(StopReason.NONFINITE, "NaN", 150, ranks)
    assert other.action == "dry-run" and other.record.step == 150 and policy.stop == other.record
    assert len(ranks.calls) == 3 and not policy.should_stop


def test_raise_mode_decides_raise_and_leaves_the_raising_to_the_caller():
    policy = StopPolicy(Settings(abort_on="no-go", abort_mode="raise"))
    decision = policy.request(StopReason.NO_GO, "saturation 0.2 < 0.43", 500, Ranks())
    assert decision.action == "raise" and decision.stops and not policy.should_stop
    err = decision.error()
    assert isinstance(err, SatmonAbort) and err.reason is StopReason.NO_GO and err.step == 500
    assert "satmon aborted training at step 500 (no-go): saturation 0.2 < 0.43" in str(err)


def test_a_resumed_stop_is_kept_and_a_dry_run_does_not_repeat_it():
    saved = StopRecord(StopReason.LOSS_SPIKE, "before the resume", 40, dry_run=True)
    policy = StopPolicy(Settings(abort_on="any", dry_run=True), stop=saved)
    assert policy.stop is saved and not policy.should_stop
    assert policy.request(StopReason.LOSS_SPIKE, "again", 60, Ranks()) is None


@pytest.mark.parametrize(
    ("counts", "gated", "abort_on", "patience", "expected"),
    [
        ({"a": (1, 10)}, None, "never", 1, StopReason.NO_GO),  # 0.1 < 0.43
        ({"a": (5, 10)}, None, "never", 1, None),  # GO
        ({"a": (5, 10, 1)}, None, "never", 1, StopReason.NONFINITE),
        ({"a": (6, 10)}, True, "collapse", 1, StopReason.COLLAPSE_RISK),  # gated, 0.6 >= 0.5
        ({"a": (6, 10)}, True, "collapse", 3, None),  # the watch must confirm it
        ({"a": (6, 10)}, True, "no-go", 3, StopReason.COLLAPSE_RISK),  # a collapse risk is a NO-GO
    ],
)
def test_the_reason_a_verdict_asks_for(counts, gated, abort_on, patience, expected):
    gating = GatingInfo(gated, ("a",) if gated else (), "") if gated is not None else None
    v = build_verdict(counts, step=10, window=10, gating=gating)
    assert verdict_stop_reason(v, Settings(abort_on=abort_on, patience=patience)) == expected


def _no_go_screen(sink, **options) -> tuple[Screen, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), DyT(4, alpha_init=0.1))  # |0.1 x| > 2: almost never: NO-GO
    screen = Screen(
        window=2, abort_on="no-go", watch_every_n_steps=0, offset_every=0, verbose=False, sink=sink, **options
    ).attach(model)
    return screen, model


def test_the_screen_logs_what_the_policy_decided_then_raises():
    sink = RecordingSink()
    screen, model = _no_go_screen(sink, abort_mode="raise")
    model(torch.randn(8, 4))
    screen.step()
    model(torch.randn(8, 4))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SatmonAbort) as err:
        warnings.simplefilter("always")
        screen.step()
    stop = screen.stop
    assert err.value.reason is StopReason.NO_GO and err.value.step == 2 == stop.step
    line = f"**satmon stopped training at step 2** (no-go): {screen.verdict.reason}"
    assert stop.text() == line
    assert sink.calls[-2:] == [("text", "satmon/stop", line, 2), ("scalars", {"Satmon/stop": 1.0}, 2)]  # logged first
    assert [str(w.message) for w in caught] == [line.replace("**", "")]


def test_a_dry_run_screen_logs_the_would_be_stop_and_trains_on():
    sink = RecordingSink()
    screen, model = _no_go_screen(sink, dry_run=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            model(torch.randn(8, 4))
            assert screen.step() is False
    stops = [c for c in sink.calls if c[0] == "text" and c[1] == "satmon/stop"]
    assert stops == [("text", "satmon/stop", screen.stop.text(), 2)] and screen.stop.dry_run
    assert "would stop training at step 2** (no-go, dry run)" in screen.stop.text()
    assert [str(w.message) for w in caught] == [screen.stop.text().replace("**", "")]
