"""Why satmon stopped a run: the reason enum, the exception of ``abort_mode="raise"``, and the
policy that maps findings to a stop. No Lightning here: the callback asks, the policy answers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Literal

__all__ = ["StopReason", "StopRecord", "SatmonAbort", "AbortOn", "AbortMode", "ABORT_ON", "ABORT_MODES", "breaches"]

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


@dataclass
class StopRecord:
    """A stop (or would-be stop): the reason, a human message, the step, and whether it was a dry run."""

    reason: StopReason
    message: str
    step: int
    dry_run: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["reason"] = self.reason.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StopRecord":
        return cls(reason=StopReason(d["reason"]), message=d["message"], step=int(d["step"]), dry_run=bool(d.get("dry_run", False)))


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
