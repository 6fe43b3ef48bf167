"""How satmon's commands say what they are doing: a first line at once, then progress with an ETA.

Every command prints its first line (:func:`say`: what it is about to do) before its first slow step
(importing torch or Lightning, reading files, training), so the user sees it within moments of pressing
Enter; this module imports nothing beyond the standard library until a bar is drawn. Progress over
items (checkpoints replayed, training steps) is a :class:`Progress`: on a terminal a bar with the
elapsed time and an ETA (tqdm), redrawn in place; when the output is a pipe or a file, plain lines,
each complete with its ETA, and never a carriage return. Everything goes to stdout, flushed at once.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["Progress", "duration", "is_terminal", "say", "say_to_terminal"]


def say(command: str, text: str, stream: TextIO | None = None) -> None:
    """One status line, ``satmon COMMAND: text``, flushed at once (a pipe would otherwise hold it back).

    Example:
        >>> say("replay", "reading 3 checkpoint(s)")
        satmon replay: reading 3 checkpoint(s)
    """
    print(f"satmon {command}: {text}", file=stream if stream is not None else sys.stdout, flush=True)


def say_to_terminal(command: str, text: str) -> bool:
    """:func:`say` on the terminal, if there is one (stdout, else stderr); nothing when both are pipes or files.

    For a status line that a log would not want but a person waiting at a terminal does (``satmon report``'s
    "reading ...": its output, piped, is the report itself). Returns whether the line was printed.
    """
    for stream in (sys.stdout, sys.stderr):
        if is_terminal(stream):
            say(command, text, stream)
            return True
    return False


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a bar can be redrawn there); a pipe, a file or a closed stream is not.

    Example:
        >>> import io
        >>> is_terminal(io.StringIO())
        False
    """
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _columns(stream: Any) -> int:
    """The terminal's width (a pseudo-terminal may report 0); a large one when the stream has no file descriptor."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return 1_000


def duration(seconds: float) -> str:
    """A duration as a person reads it: ``"8 s"``, ``"2 min 05 s"``, ``"1 h 03 min"``; ``"?"`` when unknown.

    Example:
        >>> duration(7.6), duration(125), duration(3790), duration(float("nan"))
        ('8 s', '2 min 05 s', '1 h 03 min', '?')
    """
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Progress over ``total`` items: a bar with an ETA on a terminal, plain lines otherwise.

    Plain lines (a pipe, a file) read ``LABEL [done/total] TEXT; 12 s elapsed, ETA 30 s``. With
    ``every_item`` each update is a line (a replay's checkpoints: each is worth a line); otherwise a
    line is printed when another tenth of the way is done or ``heartbeat`` seconds have passed since
    the last one (training steps), and at the end. The ETA is the mean time per item since the first
    item was done times the items left: the time to the first one (set-up: the model built, the data
    read, the first step compiled) is not an item's time, and until a second item is done the ETA is ``?``.

    Args:
        total: the number of items (> 0).
        label: what is counted, in front of every line (``"satmon replay:"``).
        unit: the item's name for the bar (``"ckpt"``, ``"step"``).
        stream: where it goes (default stdout).
        every_item: a plain line at every update.
        heartbeat: at most this many seconds between plain lines while items complete.
        clock: the time source (tests pass their own).

    Example:
        >>> import io
        >>> out, now = io.StringIO(), iter([0.0, 10.0, 20.0])
        >>> p = Progress(4, label="satmon demo:", unit="step", stream=out, every_item=True, clock=lambda: next(now))
        >>> p.update(1, "loss 3.1"); p.update(2, "loss 2.9")
        >>> print(out.getvalue(), end="")
        satmon demo: [1/4] loss 3.1; 10 s elapsed, ETA ?
        satmon demo: [2/4] loss 2.9; 20 s elapsed, ETA 20 s
    """

    def __init__(
        self,
        total: int,
        *,
        label: str,
        unit: str = "it",
        stream: TextIO | None = None,
        every_item: bool = False,
        heartbeat: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total < 1:
            raise ValueError(f"Expected a total of at least 1 item, got {total}.")
        self.total, self.label, self.unit, self.every_item, self.heartbeat = total, label, unit, every_item, heartbeat
        self.stream = stream if stream is not None else sys.stdout
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._last_line = self.start
        self._last_tenth = 0
        self._first: tuple[float, int] | None = None  # (when, done) at the first update that completed an item
        self._bar: Any = None
        self._terminal = is_terminal(self.stream) and _columns(self.stream) >= 40  # a terminal of no width: plain lines

    def _open_bar(self, done: int) -> None:
        """The bar starts at the first item done, so its rate leaves out the set-up before it."""
        from tqdm.auto import tqdm  # Lightning's own dependency

        self._bar = tqdm(
            total=self.total,
            initial=done,
            desc=self.label.rstrip(":"),
            unit=self.unit,
            file=self.stream,
            dynamic_ncols=True,
            mininterval=0.25,
            leave=True,
        )

    def update(self, done: int, text: str = "") -> None:
        """``done`` items are complete (a position, not an increment); ``text`` says what the last one gave."""
        done = max(0, min(int(done), self.total))
        if self._terminal and self._bar is None and done:
            self._open_bar(done)
            self.done = done
            return
        if self._bar is not None:
            if text:
                self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(done - self._bar.n)
            self.done = done
            return
        now = self.clock()
        if self._first is None and done:
            self._first = (now, done)
        tenth = done * 10 // self.total
        due = (
            self.every_item or tenth > self._last_tenth or now - self._last_line >= self.heartbeat or done == self.total
        )
        self.done = done
        if done and due:
            self._last_line, self._last_tenth = now, tenth
            self.stream.write(self.line(text, now) + "\n")
            self.stream.flush()

    def line(self, text: str = "", now: float | None = None) -> str:
        """The plain line for where the progress stands now."""
        now = self.clock() if now is None else now
        elapsed = now - self.start
        t0, d0 = self._first if self._first is not None else (now, self.done)
        left = (now - t0) / (self.done - d0) * (self.total - self.done) if self.done > d0 else math.nan
        when = (
            f"done in {duration(elapsed)}"
            if self.done == self.total
            else f"{duration(elapsed)} elapsed, ETA {duration(left)}"
        )
        return f"{self.label} [{self.done}/{self.total}]" + (f" {text}" if text else "") + f"; {when}"

    def close(self) -> None:
        """End the bar (a terminal keeps its last state on a line of its own)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
