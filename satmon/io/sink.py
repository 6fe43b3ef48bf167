"""Where satmon's readings go: the :class:`Sink` interface, and sinks that combine others.

satmon's core (the screen, replay) never talks to a logging framework: it hands readings, already
under their tags (:mod:`satmon.io.tensorboard`), to a sink. A sink has four methods, after
torchtitan's logger interface: ``scalars``, ``text``, ``hparams`` and ``close``. A sink that also
has ``layout`` (:class:`LayoutSink`) shows TensorBoard's custom-scalars layout. The implementations:

- :class:`satmon.io.tensorboard.SummaryWriterSink`: TensorBoard event files through torch's
  ``SummaryWriter`` (what ``Screen(logdir=...)`` and ``satmon replay`` write with);
- :class:`satmon.io.lightning.LightningSink`: a Trainer's Lightning loggers (what ``SaturationMonitor`` writes with);
- :class:`MultiSink`: several at once; :class:`NullSink`: nowhere.

A new back end is one class with these methods. A sink written by someone else is closed by them:
satmon closes only the sinks it makes.

Two optional conventions: ``text`` may return where the text went (a list of places, each a short
string such as ``"TensorBoard runs/x"`` or a file's path; empty: nowhere), which the console line at
the verdict names (:func:`places`); and a sink with ``describe(descriptions)`` attaches each tag's
description to its next write (:func:`describe`; TensorBoard shows it with the chart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["LayoutSink", "MultiSink", "NullSink", "Sink", "check_sink", "describe", "places"]


@runtime_checkable
class Sink(Protocol):
    """Where readings go. Tags are named in :mod:`satmon.io.tags` (:class:`~satmon.io.tags.TAG`); steps are optimizer
    (global) steps."""

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Write each ``tag -> value`` at ``step``."""
        ...

    def text(self, tag: str, markdown: str, step: int) -> Sequence[str] | None:
        """Write a markdown text (a verdict card, a stop) under ``tag`` at ``step``; optionally return where it went."""
        ...

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        """Write one session of the hyper-parameter view: ``params`` (str, int, float or bool) and the
        ``metrics`` it is judged by, their values at ``step``."""
        ...

    def close(self) -> None:
        """Flush and release what the sink opened (its files); a later write may open them again."""
        ...


@runtime_checkable
class LayoutSink(Sink, Protocol):
    """A sink that can also show a custom-scalars layout (TensorBoard's Custom Scalars tab)."""

    def layout(self, layout: Mapping[str, Any]) -> None:
        """Write the layout: ``{category: {chart title: ["Multiline", [tag regexes]]}}``."""
        ...


def places(sink: Sink, returned: Sequence[str] | None) -> list[str]:
    """Where a text went, from what ``sink.text`` returned: its places, or the sink's class name when it did not say.

    Example:
        >>> places(NullSink(), NullSink().text("satmon/verdict", "card", 1)), places(NullSink(), None)
        ([], ['NullSink'])
    """
    return [str(p) for p in returned] if returned is not None else [type(sink).__name__]


def describe(sink: Sink, descriptions: Mapping[str, str]) -> None:
    """Give ``sink`` the descriptions of tags about to be written, when it takes them (``describe``); else nothing."""
    method = getattr(sink, "describe", None)
    if callable(method):
        method(dict(descriptions))


def check_sink(sink: Any) -> Sink:
    """``sink`` when it is a :class:`Sink`; otherwise a TypeError that says what to pass.

    Example:
        >>> check_sink(NullSink()).__class__.__name__
        'NullSink'
        >>> check_sink([])  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        TypeError: Expected a satmon.io.sink.Sink (scalars, text, hparams, close), got list. Write to TensorBoard files
        with satmon.io.tensorboard.SummaryWriterSink(logdir), or wrap Lightning loggers in
        satmon.io.lightning.LightningSink(trainer.loggers).
    """
    if isinstance(sink, Sink):
        return sink
    raise TypeError(
        f"Expected a satmon.io.sink.Sink (scalars, text, hparams, close), got {type(sink).__name__}. Write "
        "to TensorBoard files with satmon.io.tensorboard.SummaryWriterSink(logdir), or wrap Lightning "
        "loggers in satmon.io.lightning.LightningSink(trainer.loggers)."
    )


class NullSink:
    """Writes nothing (a screen without a logger still makes its verdict).

    Example:
        >>> isinstance(NullSink(), Sink)
        True
    """

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        pass

    def text(self, tag: str, markdown: str, step: int) -> list[str]:
        return []

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class MultiSink:
    """Several sinks as one: each call goes to every sink, in order (``layout`` to those that have it).

    Args:
        sinks: the sinks; :meth:`close` closes every one of them.

    Example:
        >>> both = MultiSink(NullSink(), NullSink())
        >>> len(both.sinks), isinstance(both, LayoutSink)
        (2, True)
    """

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = tuple(check_sink(s) for s in sinks)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for s in self.sinks:
            s.scalars(values, step)

    def describe(self, descriptions: Mapping[str, str]) -> None:
        for s in self.sinks:
            describe(s, descriptions)

    def text(self, tag: str, markdown: str, step: int) -> list[str]:
        """Each sink's text; where it went, every sink's places in order."""
        return [p for s in self.sinks for p in places(s, s.text(tag, markdown, step))]

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        for s in self.sinks:
            s.hparams(params, metrics, step)

    def layout(self, layout: Mapping[str, Any]) -> None:
        for s in self.sinks:
            if isinstance(s, LayoutSink):
                s.layout(layout)

    def close(self) -> None:
        for s in self.sinks:
            s.close()
