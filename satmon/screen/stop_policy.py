"""The abort policy: which finding stops the run, agreed by every rank, and what it decided.

Like Lightning's early stopping, the policy answers and the caller acts: :meth:`StopPolicy.request`
returns a :class:`~satmon.results.stop.StopDecision` (log it; stop; or raise), and the screen logs
the record and raises or stops. The policy writes to no logger.
"""

from __future__ import annotations

from satmon.results.rule import Decision
from satmon.results.stop import StopDecision, StopReason, StopRecord, breaches
from satmon.results.verdict import Verdict
from satmon.screen.agreement import Agreement
from satmon.settings import Settings

__all__ = ["StopPolicy", "verdict_stop_reason"]


def verdict_stop_reason(verdict: Verdict, settings: Settings) -> StopReason | None:
    """The reason a verdict asks the abort policy to stop for (the policy decides whether it does).

    A collapse risk asks at once when ``abort_on="no-go"`` (it is a NO-GO) or when ``patience`` is 1;
    with more patience the watch's later checks must confirm it.

    Example:
        >>> from satmon.results.verdict import LayerCounts, build_verdict
        >>> v = build_verdict({"a": LayerCounts(1, 10)}, step=500, window=500)
        >>> verdict_stop_reason(v, Settings()).value
        'no-go'
    """
    if verdict.decision == Decision.NON_FINITE:
        return StopReason.NONFINITE
    if verdict.collapse_risk:
        return StopReason.COLLAPSE_RISK if settings.abort_on == "no-go" or settings.patience == 1 else None
    return None if verdict.go else StopReason.NO_GO


class StopPolicy:
    """Turns findings into stop decisions under the settings' ``abort_on``, ``abort_mode`` and ``dry_run``.

    Args:
        settings: the screen's settings.
        stop: the stop a resumed run already made (from a checkpoint), if any.

    Attributes:
        stop: the first stop (the latest one in a dry run, which reports each reason once).
        should_stop: training must stop (a graceful stop was decided; every rank decided it).

    Example:
        >>> from satmon.screen.agreement import TorchDistributed
        >>> p = StopPolicy(Settings(abort_on="no-go"))
        >>> d = p.request(StopReason.NO_GO, "saturation 0.2 < 0.43", 500, TorchDistributed())
        >>> d.action, d.record.step, p.should_stop
        ('stop', 500, True)
        >>> p.request(StopReason.NONFINITE, "later finding", 501, TorchDistributed()) is None, p.stop.step
        (True, 500)
    """

    def __init__(self, settings: Settings, stop: StopRecord | None = None) -> None:
        self.settings = settings
        self.stop = stop
        self.should_stop = False

    def request(self, reason: StopReason, message: str, step: int, agreement: Agreement) -> StopDecision | None:
        """Decide on a finding of this rank at ``step``: it stops the run when any rank's finding breaches
        the policy (``agreement.any``: a collective every rank reaches at this step, unless the run is
        already stopping).

        Returns:
            The decision to log and act on (every rank gets the same), or ``None`` when nothing new was
            decided: the policy does not act on ``reason``, no rank found it, the run is already
            stopping, or a dry run already reported this reason.
        """
        s = self.settings
        if self.should_stop:  # already stopping (every rank agreed on it): nothing new
            return None
        if not agreement.any(breaches(s.abort_on, reason)):
            return None
        if self.stop is not None and self.stop.dry_run and self.stop.reason == reason:
            return None  # a dry run reports each reason once
        self.stop = StopRecord(reason=reason, message=message, step=step, dry_run=s.dry_run)
        if s.dry_run:
            return StopDecision(self.stop, "dry-run")
        if s.abort_mode == "raise":
            return StopDecision(self.stop, "raise")
        self.should_stop = True
        return StopDecision(self.stop, "stop")
