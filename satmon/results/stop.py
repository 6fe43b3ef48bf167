"""Why satmon stopped a run: the reason enum, which reasons each ``abort_on`` acts on, the record of a
stop, the decision the abort policy (:class:`satmon.screen.stop_policy.StopPolicy`) returns, and the
exception of ``abort_mode="raise"``. Plain values: the policy decides, the screen logs and acts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

__all__ = [
    "StopReason",
    "StopRecord",
    "StopAction",
    "StopDecision",
    "SatmonAbort",
    "AbortOn",
    "AbortMode",
    "ABORT_ON",
    "ABORT_MODES",
    "breaches",
]

AbortOn = Literal["never", "no-go", "collapse", "any"]
AbortMode = Literal["graceful", "raise"]
ABORT_ON: tuple[str, ...] = ("never", "no-go", "collapse", "any")
ABORT_MODES: tuple[str, ...] = ("graceful", "raise")


class StopReason(str, Enum):
    """Why satmon stopped (or, in dry-run mode, would have stopped) training.

    Example:
        >>> StopReason("nonfinite") is StopReason.NONFINITE
        True
    """

    NO_GO = "no-go"  # the screening verdict said NO-GO
    COLLAPSE_RISK = "collapse-risk"  # gated model, DyT saturation at/above the collapse threshold
    NONFINITE = "nonfinite"  # non-finite DyT inputs or loss
    LOSS_SPIKE = "loss-spike"  # training loss far above its running robust baseline


#: Which reasons each ``abort_on`` setting acts on.
_POLICY: dict[str, frozenset[StopReason]] = {
    "never": frozenset(),
    "no-go": frozenset({StopReason.NO_GO, StopReason.COLLAPSE_RISK}),
    "collapse": frozenset({StopReason.COLLAPSE_RISK}),
    "any": frozenset(StopReason),
}


def breaches(abort_on: str, reason: StopReason) -> bool:
    """Whether ``reason`` triggers a stop under ``abort_on``.

    ``"no-go"`` stops on a NO-GO verdict (a collapse-risk verdict is a NO-GO too); ``"collapse"`` on
    collapse risk at the verdict or during the watch; ``"any"`` on every reason, non-finite values
    and loss spikes included.

    Example:
        >>> breaches("collapse", StopReason.COLLAPSE_RISK), breaches("collapse", StopReason.NO_GO)
        (True, False)
    """
    if abort_on not in _POLICY:
        raise ValueError(f"Expected abort_on in {ABORT_ON}, got {abort_on!r}.")
    return reason in _POLICY[abort_on]


@dataclass(frozen=True)
class StopRecord:
    """A stop (or would-be stop): the reason, a human message, the step, and whether it was a dry run.

    Example:
        >>> r = StopRecord(StopReason.NO_GO, "pooled saturation 0.21 < 0.43", 500)
        >>> r.text()
        '**satmon stopped training at step 500** (no-go): pooled saturation 0.21 < 0.43'
        >>> StopRecord.from_dict(r.to_dict()) == r
        True
    """

    reason: StopReason
    message: str
    step: int
    dry_run: bool = False

    def text(self) -> str:
        """The stop in one markdown line (the ``satmon/stop`` text in TensorBoard; the
        console warning without ``**``)."""
        return (
            f"**satmon {'would stop' if self.dry_run else 'stopped'} training at step {self.step}** "
            f"({self.reason.value}{', dry run' if self.dry_run else ''}): {self.message}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason.value, "message": self.message, "step": self.step, "dry_run": self.dry_run}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StopRecord:
        return cls(
            reason=StopReason(d["reason"]),
            message=d["message"],
            step=int(d["step"]),
            dry_run=bool(d.get("dry_run", False)),
        )


#: What a stop decision asks of the training loop: log it and go on, stop after this step, or raise.
StopAction = Literal["dry-run", "stop", "raise"]


@dataclass(frozen=True)
class StopDecision:
    """What the abort policy decided about a finding that breaches it on some rank (every rank gets the same).

    Attributes:
        record: the stop as it is logged and kept in checkpoints.
        action: ``"dry-run"`` (log it, keep training), ``"stop"`` (log it, stop after this step on every
            rank) or ``"raise"`` (log it, then raise :class:`SatmonAbort`).

    Example:
        >>> d = StopDecision(StopRecord(StopReason.LOSS_SPIKE, "loss 9.1 sigmas up", 70), "raise")
        >>> d.stops, d.error().step
        (True, 70)
    """

    record: StopRecord
    action: StopAction

    @property
    def stops(self) -> bool:
        """Training stops (gracefully or by the exception)."""
        return self.action != "dry-run"

    def error(self) -> SatmonAbort:
        """The exception ``abort_mode="raise"`` raises for this stop."""
        r = self.record
        return SatmonAbort(r.reason, r.message, r.step)


class SatmonAbort(RuntimeError):
    """Raised by :class:`satmon.SaturationMonitor` with ``abort_mode="raise"``.

    Attributes:
        reason: a :class:`StopReason`.
        step: the optimizer step of the decision.

    Example:
        >>> err = SatmonAbort(StopReason.NO_GO, "pooled saturation 0.21 < 0.43", 500)
        >>> err.reason.value, err.step
        ('no-go', 500)
    """

    def __init__(self, reason: StopReason, message: str, step: int) -> None:
        super().__init__(f"satmon aborted training at step {step} ({reason.value}): {message}")
        self.reason, self.step = reason, step
