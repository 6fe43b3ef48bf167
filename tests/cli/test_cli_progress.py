"""``satmon.cli.progress``: plain lines with an ETA when the output is a pipe or a file, a bar on a terminal.

A clock the test drives stands in for time, so every ETA is checked against its arithmetic (mean time per
item so far times the items left)."""

from __future__ import annotations

import io

import pytest

from satmon.cli.progress import Progress, duration, is_terminal, say


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_piped_progress_is_a_line_every_tenth_with_the_eta_of_the_mean_pace():
    out, clock = io.StringIO(), Clock()
    p = Progress(100, label="satmon demo: steps", unit="step", stream=out, clock=clock)
    for done in range(1, 101):
        clock.now = 2.0 * done  # 2 s an item
        p.update(done, f"loss {done}")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 10
    assert lines[0] == "satmon demo: steps [10/100] loss 10; 20 s elapsed, ETA 3 min 00 s"  # 20 s / 10 x 90 left
    assert lines[4] == "satmon demo: steps [50/100] loss 50; 1 min 40 s elapsed, ETA 1 min 40 s"
    assert lines[-1] == "satmon demo: steps [100/100] loss 100; done in 3 min 20 s"


def test_a_slow_run_still_says_something_every_heartbeat():
    out, clock = io.StringIO(), Clock()
    p = Progress(1000, label="x", stream=out, clock=clock, heartbeat=30.0)
    times = []
    for done in range(1, 1001):
        clock.now = 12.0 * done  # 12 s an item: a tenth (100 items) takes 20 minutes
        before = out.getvalue().count("\n")
        p.update(done)
        if out.getvalue().count("\n") > before:
            times.append(clock.now)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] <= 36.0 and max(gaps) <= 36.0  # a line within one item of every 30 s


def test_every_item_gives_each_update_its_line():
    out, clock = io.StringIO(), Clock()
    p = Progress(3, label="satmon replay:", unit="ckpt", stream=out, every_item=True, clock=clock)
    for done in (1, 2, 3):
        clock.now = 5.0 * done
        p.update(done, f"step {done * 100}")
    assert out.getvalue().splitlines() == [
        "satmon replay: [1/3] step 100; 5 s elapsed, ETA ?",
        "satmon replay: [2/3] step 200; 10 s elapsed, ETA 5 s",
        "satmon replay: [3/3] step 300; done in 15 s",
    ]


def test_on_a_terminal_it_is_a_bar_redrawn_in_place_with_an_eta():
    term = Terminal()
    assert is_terminal(term) and not is_terminal(io.StringIO())
    p = Progress(4, label="satmon replay:", unit="ckpt", stream=term)
    for done in range(1, 5):
        p.update(done, f"step {done}")
    p.close()
    text = term.getvalue()
    assert "\r" in text and "satmon replay:" in text and "4/4" in text and "step 4" in text
    assert "<" in text  # tqdm's [elapsed<remaining]


def test_say_flushes_one_line_and_a_total_must_be_positive():
    out = io.StringIO()
    say("report", "reading", stream=out)
    assert out.getvalue() == "satmon report: reading\n"
    with pytest.raises(ValueError, match="Expected a total of at least 1 item, got 0"):
        Progress(0, label="x")
    assert duration(59.6) == "1 min 00 s" and duration(-1) == "?"


def test_a_terminal_only_status_line_goes_where_a_person_watches(monkeypatch):
    import sys

    out, err = io.StringIO(), Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    from satmon.cli.progress import say_to_terminal

    assert (
        say_to_terminal("report", "reading") and err.getvalue() == "satmon report: reading\n" and out.getvalue() == ""
    )
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not say_to_terminal("report", "reading") and out.getvalue() == ""  # pipes and files: nothing


def test_set_up_before_the_first_step_is_not_counted_as_a_step():
    """issue 44.2: the demo's first ETA read "7 h 25 min", set-up counted as a step."""
    out, clock = io.StringIO(), Clock()
    p = Progress(1000, label="satmon demo: steps", unit="step", stream=out, every_item=True, clock=clock)
    clock.now = 60.0  # a minute of set-up, then 0.1 s a step
    p.update(1)
    clock.now = 60.1
    p.update(2)
    first, second = out.getvalue().splitlines()
    assert first.endswith("1 min 00 s elapsed, ETA ?")
    assert second.endswith("ETA 1 min 40 s")  # 0.1 s x 998 steps left, not 30 s x 998
