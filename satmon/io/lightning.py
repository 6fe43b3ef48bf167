"""A :class:`~satmon.io.sink.Sink` over a Trainer's Lightning loggers: the only writer that imports Lightning.

Scalars go to every Lightning logger (TensorBoard, CSV, W&B, ...); texts, the custom-scalars layout
and the hparams session need TensorBoard and go to the ``TensorBoardLogger`` s only, in the layout
:class:`satmon.io.tensorboard.SummaryWriterSink` writes (the hparams session in the sub-run
``<log_dir>/satmon_hparams``, with the logger's own hyper-parameters). Lightning's loggers write on
rank zero only, and the Trainer finalises them; this sink closes only the hparams writers it opened.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger

from satmon.io.tensorboard import HparamsRun, text_summary

__all__ = ["HP_METRIC_HIDES", "LightningSink"]

#: Said when a TensorBoardLogger's own hparams session hides satmon's columns in the HParams tab.
HP_METRIC_HIDES = ("satmon: TensorBoardLogger(default_hp_metric=True) wrote an hparams session of its own (hp_metric) in "
                   "{log_dir}, and TensorBoard's HParams tab takes its columns from it: satmon/decision and satmon/trust "
                   "will not show there. Create the logger with TensorBoardLogger(..., default_hp_metric=False) to compare "
                   "runs by satmon's verdict; the Scalars and Text tabs show it either way.")


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
        """The text under ``tag`` itself (:func:`satmon.io.tensorboard.text_summary`), in each TensorBoard logger's run."""
        for lg in self._tensorboards():
            file_writer = lg.experiment._get_file_writer()  # None on the other ranks (Lightning's dummy experiment)
            if file_writer is not None:
                file_writer.add_summary(text_summary(tag, markdown), step)

    def layout(self, layout: Mapping[str, Any]) -> None:
        for lg in self._tensorboards():
            lg.experiment.add_custom_scalars(dict(layout))

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        """The session, with each TensorBoard logger's own hyper-parameters beside satmon's, in its run's sub-run.

        A ``TensorBoardLogger(default_hp_metric=True)`` (Lightning's default) has written a session of its own
        (``hp_metric``) in the run itself, and TensorBoard's HParams tab takes its columns from that one: satmon's
        would not show. That is said once per logger, with the option that resolves it.
        """
        for lg in self._tensorboards():
            if getattr(lg, "log_dir", None) is None or not hasattr(lg.experiment, "add_scalar"):
                continue  # not rank zero
            path = os.path.abspath(lg.log_dir)
            if getattr(lg, "_default_hp_metric", False) and path not in self._hparams:
                warnings.warn(HP_METRIC_HIDES.format(log_dir=lg.log_dir), UserWarning, stacklevel=2)
            run = self._hparams.setdefault(path, HparamsRun(lg.log_dir))
            run.write({**dict(lg.hparams), **params}, metrics, step)

    def close(self) -> None:
        """Close the hparams writers this sink opened (the loggers themselves are the Trainer's to finalise)."""
        for run in self._hparams.values():
            run.close()
        self._hparams.clear()
