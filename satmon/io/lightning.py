"""A :class:`~satmon.io.sink.Sink` over a Trainer's Lightning loggers: the only writer that imports Lightning.

Scalars go to every Lightning logger (TensorBoard, CSV, W&B, ...); texts, the custom-scalars layout
and the hparams session need TensorBoard and go to the ``TensorBoardLogger`` s only, in the layout
:class:`satmon.io.tensorboard.SummaryWriterSink` writes (the hparams session in the sub-run
``<log_dir>/satmon_hparams``, with the logger's own hyper-parameters). Lightning's loggers write on
rank zero only, and the Trainer finalises them; this sink closes only the hparams writers it opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger

from satmon.io.tensorboard import HparamsRun

__all__ = ["LightningSink"]


class LightningSink:
    """Write satmon's readings to Lightning loggers (``trainer.loggers``, or loggers made without a Trainer).

    Args:
        loggers: the loggers; a model trained without one gets an empty list (nothing is written).

    Example:
        >>> import tempfile
        >>> from lightning.pytorch.loggers import TensorBoardLogger
        >>> from satmon.io.tensorboard import TAG
        >>> logger = TensorBoardLogger(tempfile.mkdtemp(), name="run", default_hp_metric=False)
        >>> sink = LightningSink([logger])
        >>> sink.scalars({TAG.saturation: 0.5}, step=10)
        >>> sink.close(); logger.finalize("success")
    """

    def __init__(self, loggers: Iterable[Logger]) -> None:
        self.loggers = list(loggers)
        self._hparams: dict[str, HparamsRun] = {}

    def _tensorboards(self) -> list[TensorBoardLogger]:
        return [lg for lg in self.loggers if isinstance(lg, TensorBoardLogger)]

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for lg in self.loggers:
            lg.log_metrics(dict(values), step=step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        for lg in self._tensorboards():
            lg.experiment.add_text(tag, markdown, global_step=step)

    def layout(self, layout: Mapping[str, Any]) -> None:
        for lg in self._tensorboards():
            lg.experiment.add_custom_scalars(dict(layout))

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        """The session, with each TensorBoard logger's own hyper-parameters beside satmon's, in its run's sub-run."""
        for lg in self._tensorboards():
            if getattr(lg, "log_dir", None) is None or not hasattr(lg.experiment, "add_scalar"):
                continue  # not rank zero
            run = self._hparams.setdefault(os.path.abspath(lg.log_dir), HparamsRun(lg.log_dir))
            run.write({**dict(lg.hparams), **params}, metrics, step)

    def close(self) -> None:
        """Close the hparams writers this sink opened (the loggers themselves are the Trainer's to finalise)."""
        for run in self._hparams.values():
            run.close()
        self._hparams.clear()
