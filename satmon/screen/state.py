"""What a checkpoint keeps of a screen, and what resuming with other settings does to it.

The counts belong to the window, not to the decision: a resume that changes only ``threshold``
(or ``collapse_threshold``) keeps them, and so does a change of ``product`` (the two rules differ only for
elements within one rounding step of the level), with a warning. A change of what was counted (``level``) restarts the
count at the resume step; a change of ``window`` or ``sample_every`` keeps the counts made so far.
Every change is named in a warning (old and new values) and in the verdict card's notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["STATE_VERSION", "RestorePlan", "dump_state", "restore_plan", "restore_state", "saved_state"]

STATE_VERSION = 2
#: settings that change what is counted (the counts restart) / how long / only how counts are judged
_COUNTED = ("level",)
_ROUNDING = ("product",)
_SPAN = ("window", "sample_every")
_DECISION = ("threshold", "collapse_threshold")


def saved_state(screen: Any, counts: tuple[list[int], list[int], list[int]] | None) -> dict[str, Any]:
    """The screen's state as plain values (counts already summed over ranks)."""
    s = screen.settings
    loaded = screen._loaded or {}
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "settings": {k: getattr(s, k) for k in (*_COUNTED, *_ROUNDING, *_SPAN, *_DECISION)},
        "layers": list(screen.layer_names) or list(loaded.get("layers", [])),
        "steps_seen": screen.steps_seen,
        "first_step": screen.first_step,
        "notes": list(screen.notes),
        "verdict": screen.verdict.to_dict() if screen.verdict else None,
        "stop": screen.stop.to_dict() if screen.stop else None,
    }
    if counts is not None:
        state.update(zip(("saturated", "total", "nonfinite"), counts))
    else:  # not attached (yet): pass a loaded state's counts through
        state.update({k: loaded[k] for k in ("saturated", "total", "nonfinite") if k in loaded})
    return state


@dataclass
class RestorePlan:
    """What to do with a saved state: the counts to restore (``None``: none), notes and warnings."""

    counts: tuple[list[int], list[int], list[int]] | None
    restart: bool = False
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def restore_plan(state: dict[str, Any], settings: Any, layer_names: list[str], steps_seen: int) -> RestorePlan:
    """Compare the saved settings with the current ones and decide what the saved counts still mean.

    Example:
        >>> from satmon.settings import Settings
        >>> saved = {"settings": {"threshold": 0.5, "level": 2.0, "window": 500}, "layers": ["a"],
        ...          "saturated": [3], "total": [10], "nonfinite": [0]}
        >>> plan = restore_plan(saved, Settings(threshold=0.43), ["a"], 100)
        >>> plan.counts, plan.restart, plan.notes
        (([3], [10], [0]), False, ['resumed at step 100 with threshold 0.43 (saved: 0.5); the counts were kept'])
    """
    if state.get("layers") and state["layers"] != layer_names:
        raise RuntimeError(f"Expected the checkpoint's satmon layers {state['layers']} to match the model's "
                           f"{layer_names}. Resume with the same model, or start a new screen (a new SaturationMonitor "
                           "without the checkpoint's callback state).")
    counts = tuple(state[k] for k in ("saturated", "total", "nonfinite")) if "saturated" in state else None
    plan = RestorePlan(counts, notes=list(state.get("notes", [])))
    saved = state.get("settings") or {}
    changed = {k: (saved[k], getattr(settings, k)) for k in saved if k in (*_COUNTED, *_ROUNDING, *_SPAN, *_DECISION)
               and saved[k] != getattr(settings, k)}
    if not changed or counts is None or state.get("verdict"):
        return plan
    where = f"resumed at step {steps_seen}"
    text = ", ".join(f"{k} {new!r} (saved: {old!r})" for k, (old, new) in changed.items())
    if any(k in changed for k in _COUNTED):
        plan.counts, plan.restart = None, True
        plan.warnings.append(f"satmon: {where} with {text}: the saved counts were made by another rule, so they were "
                             f"dropped and the window restarts counting at step {steps_seen}. Resume with the saved "
                             "setting to keep them.")
        plan.notes.append(f"window restarted at step {steps_seen} ({text}): the verdict covers the steps after it only")
    elif any(k in changed for k in _ROUNDING):
        plan.warnings.append(f"satmon: {where} with {text}: the counts of the first {steps_seen} steps were kept; they "
                             "used the other product rule, which differs only for elements within one rounding step of "
                             "the level.")
        plan.notes.append(f"{where} with {text}; the counts of the first {steps_seen} steps were kept")
    elif any(k in changed for k in _SPAN):
        plan.warnings.append(f"satmon: {where} with {text}: the counts of the first {steps_seen} steps were kept; "
                             "the window's span changed, so the verdict rests on a window made of two settings.")
        plan.notes.append(f"{where} with {text}; the counts of the first {steps_seen} steps were kept")
    else:
        plan.notes.append(f"{where} with {text}; the counts were kept")
    return plan


def _metrics(screen: Any) -> tuple[tuple[str, Any], ...]:
    """The screen's extra window states kept in checkpoints: loss segments, offset sums, gate statistics."""
    return (("loss_segments", screen.window_loss), ("offset", screen.offset_hooks and screen.offset_hooks.counter),
            ("gate", screen.gate_hooks and screen.gate_hooks.counter))


def dump_state(screen: Any, sync: bool) -> dict[str, Any]:
    """A screen's state; with ``sync`` the counts are summed over ranks (every rank must call it)."""
    counts = None
    if screen.hooks is not None:
        r = screen.hooks.read(sync=sync)
        counts = (r.saturated, r.total, r.nonfinite)
    state = saved_state(screen, counts)
    for key, metric in _metrics(screen):
        if metric is not None:
            state[key] = {k: v.cpu().tolist() for k, v in metric.synced(sync).items()}
    return state


def restore_state(screen: Any, state: dict[str, Any]) -> None:
    """Put a saved state back into an attached screen, as :func:`restore_plan` decides (rank zero takes the sums)."""
    plan = restore_plan(state, screen.settings, screen.layer_names, screen.steps_seen)
    for message in plan.warnings:
        screen.warn(message)
    screen.notes.extend(plan.notes)
    if plan.restart:
        screen.first_step = screen.steps_seen
    if plan.counts is None or screen.agreement.rank != 0:  # saved counts are sums over ranks
        return
    for k, v in zip(("saturated", "total", "nonfinite"), plan.counts):
        getattr(screen.hooks.counter, k).copy_(torch.tensor(v, dtype=torch.int64))
    for key, metric in _metrics(screen):
        saved = state.get(key)
        if metric is None or not isinstance(saved, dict):
            continue
        for k, v in saved.items():
            t = getattr(metric, k, None)
            if isinstance(t, torch.Tensor) and t.numel() == len(v):
                t.copy_(torch.tensor(v, dtype=t.dtype))
