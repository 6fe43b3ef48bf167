"""The end of the screening window: read every count once, make the verdict, log it; and which stop
reason, if any, that verdict raises under the settings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from satmon.results.stop import StopReason
from satmon.observe.offset import offset_driven
from satmon.functional.loss import loss_trend
from satmon.results.verdict import GatingInfo, Source, Verdict, build_verdict
from satmon.io import tensorboard as tb

__all__ = ["make_window_verdict", "running_scalars", "verdict_stop_reason"]


def _gate_risk(screen: Any, per_layer: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per gated MLP: the saturation of the DyT feeding it and its gate statistics (then the gate hooks stop)."""
    screen.gate_hooks.detach()
    risk = {screen.gating.pairings[norm].mlp: {"dyt_saturation": per_layer.get(norm, math.nan), **stats}
            for norm, stats in screen.gate_hooks.readings().items()}
    screen.gate_hooks.counter.reset()
    return risk


def running_scalars(r: Any, names: Sequence[str]) -> dict[str, float]:
    """The window's readings under their tags: pooled and per-layer saturation, alpha, non-finite inputs."""
    n = sum(r.total)
    return tb.window_scalars(sum(r.saturated) / n if n else 0.0, r.fractions(names), dict(zip(names, r.alphas)),
                             sum(r.nonfinite))


def make_window_verdict(screen: Any, step: int, partial: bool, sync: bool, extra_notes: Sequence[str]) -> Verdict | None:
    """Read the window's counts (summed over ranks with ``sync``), detach its hooks, build and log the verdict."""
    s = screen.settings
    r = screen.hooks.read(sync=sync)
    screen.hooks.detach()
    risk = _gate_risk(screen, r.fractions(screen.layer_names)) if screen.gate_hooks is not None else {}
    offset = {}
    if screen.offset_hooks is not None:
        offset = screen.offset_hooks.read(screen.layer_names, sync=sync)
        screen.offset_hooks.detach()
    refused = [f"layer {n} not counted: {why}" for n, why in screen.hooks.refused.items()]
    verdict = build_verdict(
        r.layer_counts(screen.layer_names), step=step, window=(screen.steps_seen if partial else s.window) - screen.first_step,
        source=Source.WINDOW, planned_window=s.window, threshold=s.threshold, level=s.level,
        gating=GatingInfo.of(screen.gating), collapse_threshold=s.collapse_threshold, risk=risk,
        notes=[*screen.notes, *extra_notes, *refused], caveat=s.caveat,
        loss=loss_trend(screen.window_loss.means(sync=sync)) if screen.window_loss is not None else None,
        offset=offset, offset_flag=bool(offset) and offset_driven(offset))
    if verdict is None:
        screen.status = "window over: no DyT input was counted"
        screen.warn(f"satmon: no DyT input was counted in the window ({screen.steps_seen} steps): no verdict.")
        return None
    tb.log_scalars(screen.loggers, {**running_scalars(r, screen.layer_names), **tb.offset_scalars(offset)}, step)
    tb.log_verdict(screen.loggers, verdict)
    if screen.verbose:
        screen.info("\n" + verdict.card() + "\n")
    screen.status = "verdict made"
    return verdict


def verdict_stop_reason(v: Verdict, settings: Any) -> StopReason | None:
    """The reason a verdict asks the abort policy to stop for (the policy decides whether it does).

    A collapse risk asks at once when ``abort_on="no-go"`` (it is a NO-GO) or when ``patience`` is 1;
    with more patience the watch's later checks must confirm it.

    Example:
        >>> from satmon.settings import Settings
        >>> from satmon.results.verdict import LayerCounts
        >>> v = build_verdict({"a": LayerCounts(1, 10)}, step=500, window=500)
        >>> verdict_stop_reason(v, Settings()).value
        'no-go'
    """
    if v.decision == "non-finite":
        return StopReason.NONFINITE
    if v.collapse_risk:
        return StopReason.COLLAPSE_RISK if settings.abort_on == "no-go" or settings.patience == 1 else None
    return None if v.go else StopReason.NO_GO
