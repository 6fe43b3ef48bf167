"""What a checkpoint keeps of a screen (:class:`ScreenState`), and what resuming with other settings does
to it (:func:`restore_plan`).

The counts belong to the window, not to the decision: a resume that changes only ``threshold``
(or ``collapse_threshold``) keeps them, and so does a change of ``product`` (the two rules differ only for
elements within one rounding step of the level), with a warning. A change of what was counted (``level``, or the set
of DyT layers: ``include=``/``exclude=`` or the model) drops the counts and restarts the count at the resume step; when
the window is already over there, nothing is left to count and the card says why there is no verdict. A change of
``window`` or ``sample_every`` keeps the counts made so far. Every change is named in one warning (old and new
values) and in the verdict card's notes.

A verdict made because training ended before the window closed is provisional (``Verdict.partial``):
the state keeps its counts as for an open window, and a resume continues the window from them (the
final verdict equals the uninterrupted run's). A resume whose window is no longer than the steps
already counted closes the window at once, on every step counted.

The saved form is a dict of plain values (``torch.load(weights_only=True)`` reads it back):
``version``, ``settings`` (those above), ``layers``, ``steps_seen``, ``first_step``, ``notes``,
``verdict`` and ``stop`` (their ``to_dict``), the counts ``saturated``, ``total``, ``nonfinite`` (summed
over ranks), and the window's other states ``loss_segments``, ``offset``, ``gate`` (each a dict of lists).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from satmon.results.frozen import FrozenMap, freeze, thaw
from satmon.results.stop import StopRecord
from satmon.results.verdict import Verdict
from satmon.settings import Settings

__all__ = [
    "COUNTS",
    "EXTRA_STATES",
    "STATE_FILE",
    "STATE_KEY",
    "STATE_VERSION",
    "RestorePlan",
    "ScreenState",
    "WindowState",
    "load_window_state",
    "read_window_state",
    "restore_plan",
]

#: The key a Lightning checkpoint keeps the SaturationMonitor's state under (``checkpoint["callbacks"][STATE_KEY]``);
#: satmon 0.1 wrote ``SaturationMonitor{...}``, so readers match the prefix.
STATE_KEY = "SaturationMonitor"

#: The file the Hugging Face callback saves the screen's state to in each ``checkpoint-N`` folder (read back on a
#: resume, and by a replay of the folder for the live verdict it holds).
from satmon.paths import STATE_FILE  # noqa: E402  (named once, with satmon's other files)

STATE_VERSION = 2
#: the saved counts, per layer (summed over ranks)
COUNTS = ("saturated", "total", "nonfinite")
#: the window's other states kept in checkpoints: loss segments, offset sums, gate statistics, the trap's streak and
#: what it named, the collapse watch's first flag said
EXTRA_STATES = ("loss_segments", "offset", "gate", "trap", "collapse")
#: settings that change what is counted (the counts restart) / how it is rounded / how long / only how counts are judged
_COUNTED = ("level",)
_ROUNDING = ("product",)
_SPAN = ("window", "sample_every")
_DECISION = ("threshold", "collapse_threshold")
_SAVED = (*_COUNTED, *_ROUNDING, *_SPAN, *_DECISION)

Counts = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _in_force(settings: Settings, name: str) -> Any:
    """A saved setting's value in force (the threshold is the rule's: ``settings.threshold`` is as given)."""
    return settings.rule.threshold if name == "threshold" else getattr(settings, name)


class WindowState(Protocol):
    """A window state kept in checkpoints (a :class:`~satmon.observe.states.SumStates`: its states sum over ranks)."""

    @property
    def state_names(self) -> tuple[str, ...]: ...

    def synced(self, sync: bool = True) -> dict[str, torch.Tensor]: ...


def read_window_state(metric: WindowState, sync: bool) -> dict[str, list[Any]]:
    """A window state's tensors as lists (summed over ranks with ``sync``: one collective every rank must reach)."""
    return {k: v.cpu().tolist() for k, v in metric.synced(sync).items()}


def load_window_state(metric: WindowState, saved: Mapping[str, Sequence[Any]]) -> None:
    """Copy saved lists back into a window state's tensors (those of the same name and size; others are left)."""
    names = set(metric.state_names)
    for k, v in saved.items():
        t = getattr(metric, k, None) if k in names else None
        if isinstance(t, torch.Tensor) and t.numel() == len(v):
            t.copy_(torch.tensor(thaw(v), dtype=t.dtype))


@dataclass(frozen=True)
class ScreenState:
    """A screen's checkpoint state, as read from (or written to) a checkpoint.

    Attributes:
        settings: the settings the counts were made with (``level``, ``product``, ``window``,
            ``sample_every``, ``threshold``, ``collapse_threshold``; fewer in older checkpoints).
        layers: the screened DyT layers, in order.
        steps_seen, first_step: window steps counted; the step counting (re)started at.
        notes: the card's notes so far.
        verdict, stop: the verdict and the stop, once made (a provisional verdict, :attr:`provisional`, leaves the
            window open for a resume).
        counts: ``(saturated, total, nonfinite)`` per layer, summed over ranks (``None``: none saved).
        extras: the window's other states (:data:`EXTRA_STATES`), each ``{state: values}``.

    Example:
        >>> s = ScreenState(ScreenState.saved_settings(Settings()), ("ln_f",), steps_seen=3, counts=((1,), (4,), (0,)))
        >>> ScreenState.from_dict(s.to_dict()) == s, s.to_dict()["saturated"], s.settings["threshold"]
        (True, [1], 0.43)
    """

    settings: Mapping[str, Any]
    layers: tuple[str, ...]
    steps_seen: int = 0
    first_step: int = 0
    notes: tuple[str, ...] = ()
    verdict: Verdict | None = None
    stop: StopRecord | None = None
    counts: Counts | None = None
    extras: Mapping[str, Mapping[str, Any]] = FrozenMap()
    #: DyT's alpha at step 0, (lowest, highest) over the layers: the forecast's domain, kept across a resume
    alpha_init: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for name in ("settings", "layers", "notes", "counts", "extras"):
            object.__setattr__(self, name, freeze(getattr(self, name)))

    @property
    def provisional(self) -> bool:
        """The saved verdict was made because training ended before the window closed: a resume continues the window."""
        return self.verdict is not None and self.verdict.partial

    @property
    def window_open(self) -> bool:
        """No verdict yet, or a provisional one: the counts still belong to an open window."""
        return self.verdict is None or self.provisional

    @staticmethod
    def saved_settings(settings: Settings) -> dict[str, Any]:
        """The settings a checkpoint keeps beside the counts."""
        return {k: _in_force(settings, k) for k in _SAVED}

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's dict of plain values (see the module docstring)."""
        out: dict[str, Any] = {
            "version": STATE_VERSION,
            "settings": thaw(self.settings),
            "layers": list(self.layers),
            "steps_seen": self.steps_seen,
            "first_step": self.first_step,
            "notes": list(self.notes),
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "stop": self.stop.to_dict() if self.stop else None,
        }
        if self.counts is not None:
            out.update(zip(COUNTS, thaw(self.counts)))
        out.update({k: thaw(v) for k, v in self.extras.items()})
        if self.alpha_init:
            out["alpha_init"] = list(self.alpha_init)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScreenState:
        """Read a saved state (satmon 0.1's and 0.2's; missing keys take their defaults)."""
        return cls(
            settings=d.get("settings") or {},
            layers=tuple(d.get("layers") or ()),
            steps_seen=int(d.get("steps_seen", 0)),
            first_step=int(d.get("first_step", 0)),
            notes=tuple(d.get("notes") or ()),
            verdict=Verdict.from_dict(d["verdict"]) if d.get("verdict") else None,
            stop=StopRecord.from_dict(d["stop"]) if d.get("stop") else None,
            counts=tuple(tuple(d[k]) for k in COUNTS) if COUNTS[0] in d else None,  # type: ignore[arg-type]
            extras={k: d[k] for k in EXTRA_STATES if isinstance(d.get(k), Mapping)},
            alpha_init=tuple(d["alpha_init"]) if d.get("alpha_init") else None,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class RestorePlan:
    """What to do with a saved state: the counts to restore (``None``: none), whether the window restarts
    counting at the resume step, the notes for the card, the warnings to give, and why the saved counts were
    dropped (``None``: they were not)."""

    counts: Counts | None
    restart: bool = False
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    dropped: str | None = None


def _names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _layer_change(saved: Sequence[str], now: Sequence[str]) -> str:
    """How the DyT layers differ from the saved ones, in words (``""`` when they do not)."""
    if list(saved) == list(now):
        return ""
    added, removed = [n for n in now if n not in saved], [n for n in saved if n not in now]
    parts = ([f"added {_names(added)}"] if added else []) + ([f"removed {_names(removed)}"] if removed else [])
    return "another set of DyT layers (" + ("; ".join(parts) or "the same ones in another order") + ")"


def restore_plan(
    saved: ScreenState | Mapping[str, Any], settings: Settings, layers: Sequence[str], steps: int
) -> RestorePlan:
    """Compare the saved settings and layers with the current ones and decide what the saved counts still mean.

    Counts made by another rule (``level``) or on another set of DyT layers (``include=``/``exclude=`` or the
    model changed) are dropped with one warning, and the window restarts counting at the resume step; when the
    window is already over there, nothing is left to count and the warning says the run gets no verdict.

    Args:
        saved: the checkpoint's state (or its saved dict).
        settings: the resumed screen's settings.
        layers: the resumed model's DyT layers.
        steps: window steps counted before the resume.

    Example:
        >>> saved = ScreenState({"threshold": 0.5, "level": 2.0, "window": 500}, ("a",), counts=((3,), (10,), (0,)))
        >>> plan = restore_plan(saved, Settings(threshold=0.43), ["a"], 100)
        >>> plan.counts, plan.restart, plan.notes
        (((3,), (10,), (0,)), False, ('resumed at step 100 with threshold 0.43 (saved: 0.5); the counts were kept',))
        >>> restore_plan(saved, Settings(), ["a", "b"], 100).dropped
        'another set of DyT layers (added b)'
    """
    if not isinstance(saved, ScreenState):
        saved = ScreenState.from_dict(saved)
    notes, found = list(saved.notes), []
    where = f"resumed at step {steps}"
    moved = _layer_change(saved.layers, layers) if saved.layers else ""
    changed = {
        k: (v, _in_force(settings, k)) for k, v in saved.settings.items() if k in _SAVED and v != _in_force(settings, k)
    }
    if saved.counts is None or not saved.window_open:
        if moved and saved.verdict is not None:  # the verdict stands; its counts are not put into the other layers
            notes.append(f"{where} with {moved}: the verdict was made on the saved layers")
        return RestorePlan(None if moved else saved.counts, notes=tuple(notes))
    if not changed and not moved:
        return RestorePlan(saved.counts, notes=tuple(notes))
    text = ", ".join(f"{k} {new!r} (saved: {old!r})" for k, (old, new) in changed.items())
    rule = [text] if any(k in changed for k in _COUNTED) else []
    if rule or moved:
        why = "; ".join([*rule, *([moved] if moved else [])])
        keep = " and ".join((["the saved setting"] if rule else []) + (["the saved layers"] if moved else []))
        made = " and ".join((["by another rule"] if rule else []) + (["on other layers"] if moved else []))
        window = settings.window
        if window > steps:
            found.append(
                f"satmon: {where} with {why}: the saved counts were made {made}, so they were dropped and the "
                f"window restarts counting at step {steps} ({window - steps} of its {window} steps remain). "
                f"Resume with {keep} to keep them."
            )
            notes.append(f"window restarted at step {steps} ({why}): the verdict covers the steps after it only")
        else:
            found.append(
                f"satmon: {where} with {why}: the saved counts were made {made}, so they were dropped, and the "
                f"{window}-step window is over at step {steps}: nothing is left to count, so there is no verdict. "
                f"Resume with {keep} to keep the counts, or with a window longer than {steps} steps."
            )
            notes.append(f"{where} with {why}: the saved counts were dropped and the window was over: no verdict")
        return RestorePlan(None, True, tuple(notes), tuple(found), dropped=why)
    counts = saved.counts
    if any(k in changed for k in _ROUNDING):
        found.append(
            f"satmon: {where} with {text}: the counts of the first {steps} steps were kept; they used the other "
            "product rule, which differs only for elements within one rounding step of the level."
        )
        notes.append(f"{where} with {text}; the counts of the first {steps} steps were kept")
    elif "window" in changed and settings.window <= steps:
        found.append(
            f"satmon: {where} with {text}: {steps} window steps were counted before the resume, as many as the "
            f"window now asks for or more, so the window closes at once, on those {steps} steps. Resume with the "
            "saved window to screen the steps it asked for."
        )
        notes.append(
            f"{where} with {text} after {steps} window steps were counted: the window closed at the resume, "
            f"on those {steps} steps"
        )
    elif any(k in changed for k in _SPAN):
        found.append(
            f"satmon: {where} with {text}: the counts of the first {steps} steps were kept; the window's span "
            "changed, so the verdict rests on a window made of two settings."
        )
        notes.append(f"{where} with {text}; the counts of the first {steps} steps were kept")
    else:
        notes.append(f"{where} with {text}; the counts were kept")
    return RestorePlan(counts, False, tuple(notes), tuple(found))
