"""Write a replay to TensorBoard: each checkpoint at its global step, with the live callback's tags.

The tags and the reading -> tag maps are :mod:`satmon.io.tensorboard`'s, and the files are written
by its :class:`~satmon.io.tensorboard.SummaryWriterSink`, so a replayed run opens beside the live
one and the curves line up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from satmon.io.tensorboard import (
    TAG,
    SummaryWriterSink,
    add_layout,
    log_scalars,
    log_text,
    log_verdict,
    probe_scalars,
)

__all__ = ["TensorBoardReplay", "next_version"]


def next_version(root: str | os.PathLike) -> int:
    """The next ``version_N`` under ``root``: one more than the highest there, 0 when there is none
    (the numbering of Lightning's ``TensorBoardLogger``, so replays and live runs share a folder).

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> os.makedirs(os.path.join(root, "version_3")); next_version(root), next_version(os.path.join(root, "none"))
        (4, 0)
    """
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    found = [int(n.split("_")[1]) for n in names
             if n.startswith("version_") and n.split("_")[1].isdigit() and os.path.isdir(os.path.join(root, n))]
    return max(found) + 1 if found else 0


class TensorBoardReplay:
    """A TensorBoard run of replayed checkpoints; pass it as ``satmon.replay.loop.replay(on_record=...)``.

    Args:
        logdir: the TensorBoard root; the run goes to ``logdir/name/version_N`` (:func:`next_version`).
        name: the run name.

    Example:
        >>> import tempfile
        >>> tb = TensorBoardReplay(tempfile.mkdtemp())
        >>> tb.log_dir.endswith("version_0")
        True
        >>> tb.close()
    """

    def __init__(self, logdir: str | Path, name: str = "replay") -> None:
        root = os.path.expanduser(os.path.expandvars(os.path.join(os.fspath(logdir), name)))
        self.sink = SummaryWriterSink(os.path.join(root, f"version_{next_version(root)}"))
        self._layout = False

    @property
    def log_dir(self) -> str:
        return self.sink.log_dir

    def __call__(self, record: Any) -> None:
        """Write one :class:`satmon.replay.loop.ReplayRecord`: its readings and verdict (its card names the source run
        and, when found, shows its live verdict beside this one), or why it was skipped."""
        step = int(record.global_step or 0)
        report = record.report
        if report is None:
            log_text(self.sink, TAG.replay_error, f"`{record.checkpoint}`: {record.error}", step)
            return
        if not self._layout:
            if any(layer.kind == "dyt" for layer in report.layers.values()):
                add_layout(self.sink)
            self._layout = True
        scalars = probe_scalars(report)
        if report.verdict is not None:
            scalars.pop(TAG.saturation, None)  # log_verdict writes the pooled saturation itself: once per step
        log_scalars(self.sink, scalars, step)
        if report.verdict is not None:
            card = getattr(record, "card", None)  # a ReplayRecord's: the source run and its live verdict beside this one
            log_verdict(self.sink, report.verdict, card=card() if callable(card) else None)
        log_text(self.sink, TAG.replay_checkpoint, f"`{record.checkpoint}`", step)

    def close(self) -> None:
        """Flush and close the run's files."""
        self.sink.close()
