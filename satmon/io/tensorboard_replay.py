"""Write a replay to TensorBoard: each checkpoint at its global step, with the live callback's tags.

The tags and the reading -> tag maps are :mod:`satmon.io.tensorboard`'s, so a replayed run
opens beside the live one and the curves line up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from satmon.io.tensorboard import TAG, add_layout, log_scalars, log_text, log_verdict, probe_scalars

__all__ = ["TensorBoardReplay"]


class TensorBoardReplay:
    """A TensorBoard run of replayed checkpoints; pass it as ``satmon.replay.loop.replay(on_record=...)``.

    Args:
        logdir: the TensorBoard root; the run goes to ``logdir/name/version_N`` (Lightning's ``TensorBoardLogger``).
        name: the run name.

    Example:
        >>> import tempfile
        >>> tb = TensorBoardReplay(tempfile.mkdtemp())
        >>> tb.log_dir.endswith("version_0")
        True
        >>> tb.close()
    """

    def __init__(self, logdir: str | Path, name: str = "replay") -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        self.logger = TensorBoardLogger(str(logdir), name=name, default_hp_metric=False)
        self._layout = False

    @property
    def log_dir(self) -> str:
        return self.logger.log_dir

    def __call__(self, record: Any) -> None:
        """Write one :class:`satmon.replay.loop.ReplayRecord`: its readings and verdict, or why it was skipped."""
        loggers = [self.logger]
        step = int(record.global_step or 0)
        report = record.report
        if report is None:
            log_text(loggers, TAG.replay_error, f"`{record.checkpoint}`: {record.error}", step)
            return
        if not self._layout:
            dyt = [name for name, layer in report.layers.items() if layer.kind == "dyt"]
            if dyt:
                add_layout(loggers, dyt)
            self._layout = True
        scalars = probe_scalars(report)
        if report.verdict is not None:
            scalars.pop(TAG.saturation, None)  # log_verdict writes the pooled saturation itself: once per step
        log_scalars(loggers, scalars, step)
        if report.verdict is not None:
            log_verdict(loggers, report.verdict)
        log_text(loggers, TAG.replay_checkpoint, f"`{record.checkpoint}`", step)

    def close(self) -> None:
        self.logger.finalize("success")
