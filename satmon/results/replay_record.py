"""One replayed checkpoint, as a frozen value: the probe's report, or why the file was skipped.

Built once per checkpoint by :func:`satmon.replaying.loop.checkpoint_records` (its only constructor in satmon)
and changed only with :func:`dataclasses.replace`. :meth:`ReplayRecord.to_dict` is the record that
``satmon replay --json`` writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from satmon.results.live_replay import ReplaySource, comparison_markdown, with_section

if TYPE_CHECKING:
    from satmon.results.probe_report import ProbeReport
    from satmon.results.verdict import Verdict

__all__ = ["ReplayRecord"]


@dataclass(frozen=True)
class ReplayRecord:
    """One checkpoint's replay: the probe's report, or why the file was skipped.

    Attributes:
        checkpoint: the file (or the Hugging Face ``checkpoint-N`` folder).
        global_step: the step stored with the checkpoint (its position when it holds none; ``None``
            when unreadable).
        report: what :func:`satmon.probe` read (``None`` when skipped); its verdict is stepped at
            ``global_step`` and has ``source="replay"``.
        seconds: load + twin + probe wall time.
        weights_only: the file was read with ``torch.load(weights_only=True)``.
        nonfinite_weights: parameter elements that are NaN or inf in the built model.
        notes: what the reader should know (no step in the file, which parameters are non-finite...).
        error: why the checkpoint was skipped; ``None`` when it was replayed.
        source: the run the checkpoint comes from and its live verdict, when satmon found one
            (:class:`~satmon.results.live_replay.ReplaySource`); the card shows both readings.

    Example:
        >>> r = ReplayRecord("ckpts/a.ckpt", None, error="not a PyTorch checkpoint: an empty file")
        >>> r.to_dict()
        {'checkpoint': 'ckpts/a.ckpt', 'global_step': None, 'error': 'not a PyTorch checkpoint: an empty file'}
        >>> r.error = None
        Traceback (most recent call last):
        ...
        dataclasses.FrozenInstanceError: cannot assign to field 'error'
    """

    checkpoint: str
    global_step: int | None
    report: ProbeReport | None = None
    seconds: float | None = None
    weights_only: bool = True
    nonfinite_weights: int = 0
    notes: tuple[str, ...] = ()
    error: str | None = None
    source: ReplaySource | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.notes, tuple):
            object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def verdict(self) -> Verdict | None:
        """The report's :class:`~satmon.results.verdict.Verdict` (``None`` when skipped or without DyT)."""
        return None if self.report is None else self.report.verdict

    @property
    def nonfinite(self) -> bool:
        """NaN/inf in the weights or in a DyT layer's input: the model diverged (``satmon replay`` exit code 3)."""
        return self.nonfinite_weights > 0 or bool(self.verdict is not None and self.verdict.nonfinite)

    def card(self) -> str | None:
        """The verdict's card (markdown) with, under its title, the run this checkpoint comes from and that run's
        live verdict beside this reading (:func:`~satmon.results.live_replay.comparison_markdown`); ``None``
        without a verdict."""
        verdict = self.verdict
        if verdict is None:
            return None
        if self.source is None:
            return verdict.card()
        name = self.checkpoint.replace("\\", "/").rsplit("/", 1)[-1]
        return with_section(verdict.card(), comparison_markdown(self.source, verdict, name, self.global_step))

    def to_dict(self) -> dict[str, Any]:
        """The record ``satmon replay --json`` writes (after :func:`satmon.io.json_records.to_json`, which
        turns NaN/inf into ``null``): the probe report's keys between the file's and the replay's."""
        out: dict[str, Any] = {"checkpoint": self.checkpoint, "global_step": self.global_step}
        if self.error is not None or self.report is None:
            out["error"] = self.error
            if self.nonfinite_weights:
                out["nonfinite_weights"] = self.nonfinite_weights
        else:
            out.update(self.report.to_dict())
            out.update(seconds=self.seconds, weights_only=self.weights_only, nonfinite_weights=self.nonfinite_weights)
        if self.notes:
            out["notes"] = list(self.notes)
        if self.source is not None:
            out["replay_of"] = self.source.to_dict()
        return out
