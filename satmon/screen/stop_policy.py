"""The abort policy applied: which finding stops the run, with every rank, and how it is recorded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from satmon.results.stop import SatmonAbort, StopReason, StopRecord, breaches
from satmon.screen.agreement import Agreement
from satmon.io import tensorboard as tb

__all__ = ["StopPolicy"]


class StopPolicy:
    """Turns findings into stops under the settings' ``abort_on``, ``abort_mode`` and ``dry_run``.

    Example:
        >>> from satmon.screen.agreement import TorchDistributed
        >>> from satmon.settings import Settings
        >>> p = StopPolicy(Settings(abort_on="no-go"))
        >>> p.request(StopReason.NO_GO, "saturation 0.2 < 0.43", 500, TorchDistributed(), [], lambda m: None)
        True
        >>> p.stop.reason.value, p.should_stop
        ('no-go', True)
        >>> p.request(StopReason.NONFINITE, "later finding", 501, TorchDistributed(), [], lambda m: None), p.stop.step
        (True, 500)
    """

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.stop: StopRecord | None = None
        self.should_stop = False

    def request(self, reason: StopReason, message: str, step: int, agreement: Agreement, loggers: Sequence[Any],
                warn: Callable[[str], None]) -> bool:
        """Stop when any rank's finding breaches the policy (``agreement.any``: a collective every rank
        reaches at this step); returns True when training must stop now."""
        s = self.settings
        if self.should_stop:  # already stopping (every rank agreed on it): record and log it once
            return True
        if not agreement.any(breaches(s.abort_on, reason)):
            return False
        if self.stop is not None and self.stop.dry_run and self.stop.reason == reason:
            return False  # a dry run reports each reason once
        self.stop = StopRecord(reason=reason, message=message, step=step, dry_run=s.dry_run)
        text = (f"**satmon {'would stop' if s.dry_run else 'stopped'} training at step {step}** "
                f"({reason.value}{', dry run' if s.dry_run else ''}): {message}")
        tb.log_text(loggers, tb.TAG.stop, text, step)
        tb.log_scalars(loggers, {tb.TAG.stop: 1.0}, step)
        warn(text.replace("**", ""))
        if s.dry_run:
            return False
        if s.abort_mode == "raise":
            raise SatmonAbort(reason, message, step)
        self.should_stop = True
        return True
