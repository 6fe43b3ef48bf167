"""The screen's settings, validated once (constructor time) for the callback, the core and the probe."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from satmon.results.stop import ABORT_MODES, ABORT_ON
from satmon.functional.saturation import check_product

__all__ = ["Settings", "check_rule", "check_selector"]


def _fraction(name: str, value: Any, note: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"Expected `{name}` in (0, 1) ({note}), got {value!r}.")
    return float(value)


def _int(name: str, value: Any, low: int, note: str, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else ("positive" if low == 1 else f">= {low}")
        raise ValueError(f"Expected `{name}` to be {'a positive int' if span == 'positive' else 'an int ' + span} ({note}), got {value!r}.")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"Expected `{name}` to be True or False, got {value!r} ({type(value).__name__}).")
    return value


def check_rule(level: Any, threshold: Any, collapse_threshold: Any) -> tuple[float, float, float]:
    """Validate the saturation rule's three numbers (the callback's and the probe's).

    Example:
        >>> check_rule(2.0, 0.43, 0.5)
        (2.0, 0.43, 0.5)
    """
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not math.isfinite(level) or level <= 0:
        raise ValueError(f"Expected `level` > 0 (the per-element cut-off |alpha * x| > level; the study's is 2.0), got {level!r}.")
    return (float(level), _fraction("threshold", threshold, "the GO level of pooled saturation; the study's is 0.43"),
            _fraction("collapse_threshold", collapse_threshold, "the study's is 0.5"))


def check_selector(name: str, value: Any) -> None:
    """``include`` / ``exclude``: ``None``, a regex string, or a predicate ``(name, module) -> bool``."""
    if value is None or callable(value):
        return
    if not isinstance(value, str):
        raise ValueError(f"Expected `{name}` to be None, a regex on module names or a predicate (name, module) -> bool, "
                         f"got {value!r} ({type(value).__name__}).")
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError(f"Expected `{name}` to be a valid regular expression, got {value!r}: {e}.") from e


@dataclass(frozen=True)
class Settings:
    """Every setting of the screen and the watch, checked when made (see :class:`satmon.SaturationMonitor`).

    Example:
        >>> Settings(window=100).window
        100
        >>> Settings(dry_run="yes")
        Traceback (most recent call last):
        ...
        ValueError: Expected `dry_run` to be True or False, got 'yes' (str).
    """

    window: int = 500
    threshold: float = 0.43
    level: float = 2.0
    include: str | Callable[[str, Any], bool] | None = None
    exclude: str | Callable[[str, Any], bool] | None = None
    sample_every: int = 1
    abort_on: str = "never"
    abort_mode: str = "graceful"
    dry_run: bool = False
    collapse_threshold: float = 0.5
    gating_mapping: Mapping[str, str] | None = field(default=None, hash=False)
    watch_every_n_steps: int = 50
    patience: int = 1
    loss_spike_z: float = 8.0
    loss_baseline: int = 200
    product: str = "module"
    offset_every: int = 10
    caveat: str = ""  # the threshold's provenance when it is not the study's (a calibration file's)

    def __post_init__(self) -> None:
        _int("window", self.window, 1, "optimizer steps")
        level, threshold, collapse = check_rule(self.level, self.threshold, self.collapse_threshold)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(self, "collapse_threshold", collapse)
        check_selector("include", self.include)
        check_selector("exclude", self.exclude)
        _int("sample_every", self.sample_every, 1, "count every k-th step of the window", high=self.window)
        if self.abort_on not in ABORT_ON:
            raise ValueError(f"Expected `abort_on` in {ABORT_ON}, got {self.abort_on!r}.")
        if self.abort_mode not in ABORT_MODES:
            raise ValueError(f"Expected `abort_mode` in {ABORT_MODES}, got {self.abort_mode!r}.")
        _flag("dry_run", self.dry_run)
        if self.gating_mapping is not None and not isinstance(self.gating_mapping, Mapping):
            raise ValueError("Expected `gating_mapping` to be a dict {dyt_layer: gated_mlp}, "
                             f"got {type(self.gating_mapping).__name__}.")
        _int("watch_every_n_steps", self.watch_every_n_steps, 0, "0 turns the watch off")
        _int("patience", self.patience, 1, "consecutive breaching checks")
        z = self.loss_spike_z
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z <= 0:
            raise ValueError(f"Expected `loss_spike_z` > 0 (robust sigmas), got {z!r}.")
        object.__setattr__(self, "loss_spike_z", float(z))
        _int("loss_baseline", self.loss_baseline, 2, "steps")
        _int("offset_every", self.offset_every, 0, "offset statistics on every k-th counted window step; 0 turns them off")
        check_product(self.product)

    @staticmethod
    def check_flag(name: str, value: Any) -> bool:
        """A boolean argument (``verbose=``): ``True``/``False`` only, not ``"no"``."""
        return _flag(name, value)
