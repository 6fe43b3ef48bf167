"""The collapse watch: from ``Settings.watch_start`` (the warm-up's end when given, else the screening window's
end; in the window it runs beside the window's counting), one optimizer step in ``every`` is measured
(saturation of DyT layers that feed gated MLPs, non-finite DyT inputs, the training loss) and
breaches are counted in streaks. Like Lightning's spike detection, the watch only says what it
found; the driver (callback or plain loop) decides, with every rank, whether to stop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from satmon.functional.loss import robust_z
from satmon.observe.saturation import SaturationHooks
from satmon.results.frozen import FrozenMap, freeze
from satmon.results.stop import StopReason

__all__ = ["CollapseWatch", "LossHistory", "WatchReading"]

#: the order in which breaches are reported when several hold at once
_ORDER = (StopReason.NONFINITE, StopReason.COLLAPSE_RISK, StopReason.LOSS_SPIKE)


class LossHistory:
    """Training losses kept in a device ring buffer (no host sync per step), read at checks.

    Args:
        capacity: how many recent losses are kept (baseline + recent).
        device: where the buffer lives (the loss's device).
    """

    def __init__(self, capacity: int, device: torch.device | str = "cpu") -> None:
        self.buffer = torch.full((capacity,), float("nan"), dtype=torch.float32, device=device)
        self.capacity = capacity
        self.written = 0  # host counter of pushes
        self.last_read = 0

    def push(self, loss: Tensor) -> None:
        self.buffer[self.written % self.capacity] = loss.detach().to(torch.float32).reshape(())
        self.written += 1

    def read(self) -> tuple[list[float], list[float]]:
        """``(baseline, recent)``: losses before the last read and since it, oldest first (one host transfer)."""
        n = min(self.written, self.capacity)
        values = self.buffer.cpu().tolist()
        start = self.written - n
        ordered = [values[i % self.capacity] for i in range(start, self.written)]
        k = min(self.written - self.last_read, n)
        self.last_read = self.written
        return ordered[: n - k], ordered[n - k :]


@dataclass(frozen=True)
class WatchReading:
    """One watch check, on the host. ``due`` lists the breaches whose streak reached ``patience``.

    Attributes:
        step: the watched optimizer step.
        gated_saturation: pooled saturation of the DyT layers that feed gated MLPs (``None``: none does).
        nonfinite: DyT inputs and alphas with non-finite values in the watched step (all ranks).
        loss_nonfinite: a non-finite training loss since the last check (on some rank).
        loss_z: the loss's robust z against its baseline (``None``: no loss since the last check).
        found: each reason -> whether this check found it (read-only).
        due: ``(reason, message)`` of each breach whose streak reached ``patience``, in report order.
        gate_stats: gated MLP -> its gate statistics in the watched step (read-only).

    Example:
        >>> r = WatchReading(50, 0.6, 0, False, None, {StopReason.COLLAPSE_RISK: True})
        >>> r.to_dict()
        {'step': 50, 'gated_saturation': 0.6, 'nonfinite': 0, 'loss_z': None, 'collapse-risk': True}
    """

    step: int
    gated_saturation: float | None
    nonfinite: int
    loss_nonfinite: bool
    loss_z: float | None  # None: no loss since the last check
    found: Mapping[StopReason, bool]
    due: tuple[tuple[StopReason, str], ...] = ()
    gate_stats: Mapping[str, Mapping[str, float]] = FrozenMap()

    def __post_init__(self) -> None:
        for name in ("found", "due", "gate_stats"):
            object.__setattr__(self, name, freeze(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "gated_saturation": self.gated_saturation,
            "nonfinite": self.nonfinite,
            "loss_z": self.loss_z,
            **{k.value: v for k, v in self.found.items()},
        }


class CollapseWatch:
    """Measure one step in ``every_n_steps`` (from the screen's ``settings.watch_start``) and keep breach streaks.

    Args:
        hooks: saturation hooks on every DyT layer (attached, disabled between checks).
        gated: indices (into ``hooks.layers``) of the DyT layers that feed gated MLPs.
        gate_hooks: the watch's own gate-statistics hooks, not the window's (``None`` without gated MLPs);
            ``readings()`` -> ``{dyt: {stat: value}}``.
        gate_names: DyT layer name -> gated MLP name, for the readings.
        every_n_steps, collapse_threshold, loss_spike_z, patience: see :class:`satmon.SaturationMonitor`.
        losses: the loss ring buffer the driver pushes into.
    """

    def __init__(
        self,
        hooks: SaturationHooks,
        gated: list[int],
        gate_hooks: Any,
        gate_names: dict[str, str],
        every_n_steps: int,
        collapse_threshold: float,
        loss_spike_z: float,
        patience: int,
        losses: LossHistory,
    ) -> None:
        self.hooks, self.gated, self.gate_hooks, self.gate_names = hooks, gated, gate_hooks, gate_names
        self.every, self.collapse_threshold = every_n_steps, collapse_threshold
        self.loss_spike_z, self.patience, self.losses = loss_spike_z, patience, losses
        self.streak: dict[StopReason, int] = {}
        self.log: list[dict[str, Any]] = []
        self.nonfinite_total = 0  # non-finite DyT inputs seen at checks, summed: the count, not a flag
        self.flag_step: int | None = None  # the step of the first collapse-risk flag said (once a run; kept on resume)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the step of the first collapse-risk flag said (-1: none), so that a resumed run
        does not say it again. The streaks are not kept: a resumed run watches again from its first check."""
        return {"flag_step": [-1 if self.flag_step is None else self.flag_step]}

    def load_state_dict(self, state: Mapping[str, Sequence[Any]]) -> None:
        step = int(state.get("flag_step", [-1])[0])
        self.flag_step = None if step < 0 else step

    def count_breach(self, reason: StopReason) -> None:
        """Count a breach found outside the checks: the verdict's collapse risk starts a streak (as its first breach)
        but never lengthens one that checks in the window began, so ``patience`` counts each check once."""
        self.streak[reason] = max(self.streak.get(reason, 0), 1)

    def hook_sets(self) -> list[Any]:
        return [h for h in (self.hooks, self.gate_hooks) if h is not None]

    def start(self) -> None:
        """Attach the hooks, disabled until the first watched step."""
        for h in self.hook_sets():
            h.attach()
            h.enabled = False

    def detach(self) -> None:
        for h in self.hook_sets():
            h.detach()

    def select(self, step: int) -> bool:
        """Enable the hooks for a watched step (flips once per check: two compiled variants at most)."""
        on = step % self.every == 0
        for h in self.hook_sets():
            if h.attached and h.enabled != on:
                h.enabled = on
        if on and self.hooks.attached:
            self.hooks.refresh_thresholds()  # one batched op for the check, as in the window, not one per layer
        return on

    @property
    def measuring(self) -> bool:
        return self.hooks.attached and self.hooks.enabled

    def check(self, step: int, reduce_max: Callable[[Tensor], Tensor]) -> WatchReading:
        """Read the watched step (counts summed over ranks), update the streaks, reset for the next check.

        ``reduce_max`` takes the maximum of a float64 tensor over ranks (every rank calls ``check``
        at the same step, so the decision is taken from the same numbers everywhere).
        """
        for h in self.hook_sets():
            h.enabled = False
        counts = self.hooks.read(sync=True)
        self.hooks.reset()
        total = sum(counts.total[i] for i in self.gated)
        gated_sat = sum(counts.saturated[i] for i in self.gated) / total if total else None
        gate_stats = {}
        if self.gate_hooks is not None:
            gate_stats = {self.gate_names.get(k, k): v for k, v in self.gate_hooks.readings().items()}
            self.gate_hooks.counter.reset()
        loss_bad, z = self._loss_reading(reduce_max)
        bad = sum(counts.nonfinite) + sum(not math.isfinite(a) for a in counts.alphas)
        self.nonfinite_total += bad
        found = {
            StopReason.COLLAPSE_RISK: gated_sat is not None and gated_sat >= self.collapse_threshold,
            StopReason.NONFINITE: bad > 0 or loss_bad,
            StopReason.LOSS_SPIKE: z is not None and z > self.loss_spike_z,
        }
        for k, v in found.items():
            self.streak[k] = self.streak.get(k, 0) + 1 if v else 0
        due = tuple(
            (r, self._message(r, gated_sat, bad, loss_bad, z)) for r in _ORDER if self.streak.get(r, 0) >= self.patience
        )
        reading = WatchReading(step, gated_sat, bad, loss_bad, z, found, due, gate_stats)
        self.log.append(reading.to_dict())
        return reading

    def _loss_reading(self, reduce_max: Callable[[Tensor], Tensor]) -> tuple[bool, float | None]:
        baseline, recent = self.losses.read()
        loss_bad = any(not math.isfinite(v) for v in recent)
        finite_base = [v for v in baseline if math.isfinite(v)]
        z = robust_z([v for v in recent if math.isfinite(v)], finite_base) if len(finite_base) >= 10 else 0.0
        # counts are already summed over ranks; the loss readings are per rank: their maximum over ranks
        local = torch.tensor([float(loss_bad), z], dtype=torch.float64, device=self.losses.buffer.device)
        flag, z = reduce_max(local).tolist()
        return bool(flag), (float(z) if recent else None)

    def _message(
        self,
        reason: StopReason,
        gated_saturation: float | None,
        nonfinite: int,
        loss_nonfinite: bool,
        loss_z: float | None,
    ) -> str:
        if reason is StopReason.COLLAPSE_RISK:
            text = f"saturation of DyT feeding gated MLPs {gated_saturation or 0:.4f} >= {self.collapse_threshold:g}"
        elif reason is StopReason.NONFINITE:
            text = (
                f"{nonfinite} DyT layer input(s) or alpha(s) with non-finite values"
                + (" and a non-finite training loss" if loss_nonfinite else "")
                + " in the watched step"
            )
        else:
            text = f"training loss {loss_z:.1f} robust sigmas above its running baseline (limit {self.loss_spike_z:g})"
        return text + (f" for {self.patience} consecutive checks" if self.patience > 1 else "")
