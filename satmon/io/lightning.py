"""A :class:`~satmon.io.sink.Sink` over a Trainer's Lightning loggers: the only writer that imports Lightning.

Every logger gets the decision through Lightning's public logger interface, whatever it is:

- **scalars** through ``log_metrics`` (TensorBoard, CSV, MLflow, W&B, ...);
- **the decision and its trust** through ``log_hyperparams`` (every logger has it: TensorBoard's
  ``hparams.yaml``, the CSV logger's ``hparams.yaml``, MLflow's params, W&B's config); a
  ``TensorBoardLogger`` also gets the HParams tab's session, in its run itself, with the logger's
  own hyper-parameters beside satmon's (:func:`satmon.io.tensorboard.hparams_summaries`);
- **texts** (the verdict card, a stop) where the logger holds text: a ``TensorBoardLogger``'s Text
  tab (under the tag itself), a ``WandbLogger``'s ``log_text`` (a one-cell table under the tag), an
  ``MLFlowLogger``'s run as the artifact ``satmon_verdict.md`` (the MLflow client's ``log_text``);
  any other logger (``CSVLogger``, ...) gets the file ``satmon_verdict.md`` beside its files
  (``log_dir``, else ``save_dir``), replaced only by a complete one.

:meth:`LightningSink.text` returns where each text went, for the console line at the verdict. A logger
that refuses a write (a full disk, an MLflow param that may not change) is named in a warning and the
others still get theirs. Lightning's loggers write on rank zero only, and so does this sink; the
Trainer finalises the loggers.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from satmon.io.tensorboard import hparams_summaries, scalar_summary, text_summary
from satmon.io.trackers import mlflow_text, wandb_text, write_text_file

__all__ = ["HP_METRIC_HIDES", "LightningSink"]

#: Said when a TensorBoardLogger's own hparams session hides satmon's columns in the HParams tab.
HP_METRIC_HIDES = (
    "satmon: TensorBoardLogger(default_hp_metric=True) wrote an hparams session of its own (hp_metric) "
    "in {log_dir}, and TensorBoard's HParams tab takes the run's "
    "first session: satmon/decision and satmon/trust will not show there. Create the logger with "
    "TensorBoardLogger(..., default_hp_metric=False) to compare runs by satmon's verdict; the "
    "Scalars and Text tabs show it either way."
)


class LightningSink:
    """Write satmon's readings to Lightning loggers (``trainer.loggers``, or loggers made without a Trainer).

    Args:
        loggers: the loggers; a model trained without one gets an empty list (nothing is written).
        root: where a text goes for a logger that holds no text and names no folder of its own
            (the Trainer's ``default_root_dir``); ``None``: such a logger gets no text, and the console line says so.

    Example:
        >>> import tempfile
        >>> from lightning.pytorch.loggers import CSVLogger
        >>> from satmon.io.tags import TAG
        >>> logger = CSVLogger(tempfile.mkdtemp(), name="run")
        >>> sink = LightningSink([logger])
        >>> sink.scalars({TAG.saturation: 0.5}, step=10)
        >>> [os.path.relpath(p, logger.root_dir) for p in sink.text(TAG.verdict_text, "### card", step=10)]
        ['version_0/satmon_verdict.md']
        >>> sink.close(); logger.finalize("success")
    """

    def __init__(self, loggers: Iterable[Logger], root: str | os.PathLike | None = None) -> None:
        self.loggers = list(loggers)
        self.root = None if root is None else os.fspath(root)
        self._descriptions: dict[str, str] = {}  # tag -> its description, written with the tag's next write
        self._described: set[str] = set()  # tags a TensorBoardLogger gets in the tensor form, every time
        self._hp_metric_said: set[str] = set()

    def describe(self, descriptions: Mapping[str, str]) -> None:
        """Describe tags: a ``TensorBoardLogger`` gets each with the tag's next write (its charts show it)."""
        self._descriptions.update(descriptions)
        self._described.update(descriptions)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        described = {k: self._descriptions.pop(k, "") for k in values if k in self._described}
        for lg in self.loggers:
            plain = dict(values)
            writer = _file_writer(lg) if described and isinstance(lg, TensorBoardLogger) else None
            if writer is not None:
                for tag, description in described.items():
                    writer.add_summary(scalar_summary(tag, plain.pop(tag), description), step)
            lg.log_metrics(plain, step=step)

    def text(self, tag: str, markdown: str, step: int) -> list[str]:
        """The text in every logger, each as it holds text (the module docstring); returns where it went."""
        if rank_zero_only.rank != 0:
            return []
        where = []
        for lg in self.loggers:
            try:
                place = self._text(lg, tag, markdown, step)
            except Exception as err:  # a third-party logger's failure: the others still get the card
                warnings.warn(
                    f"satmon: {type(lg).__name__} did not take the text {tag} ({type(err).__name__}: {err}); "
                    "the other loggers got it.",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            if place:
                where.append(place)
        return where

    def _text(self, lg: Logger, tag: str, markdown: str, step: int) -> str | None:
        if isinstance(lg, TensorBoardLogger):
            writer = _file_writer(lg)
            if writer is None:
                return None
            writer.add_summary(text_summary(tag, markdown), step)
            lg.experiment.flush()
            return f"TensorBoard {lg.log_dir}"
        if isinstance(lg, WandbLogger):  # through log_metrics: the logger's prefix and step key, as its scalars
            return wandb_text(lg.log_metrics, lg.experiment.id, tag, markdown, step)
        if isinstance(lg, MLFlowLogger):  # its experiment is the MLflow client
            return mlflow_text(lg.experiment, lg.run_id, tag, markdown)
        folder = getattr(lg, "log_dir", None) or lg.save_dir or self.root
        return write_text_file(folder, tag, markdown) if folder is not None else None

    def layout(self, layout: Mapping[str, Any]) -> None:
        for lg in self.loggers:
            if isinstance(lg, TensorBoardLogger):
                lg.experiment.add_custom_scalars(dict(layout))

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        """``params`` to every logger through ``log_hyperparams``; a ``TensorBoardLogger`` also gets the HParams
        session, with its own hyper-parameters beside satmon's, in its run.

        A ``TensorBoardLogger(default_hp_metric=True)`` (Lightning's default) has written a session of its own
        (``hp_metric``) at train start, and TensorBoard keeps a run's first session: satmon's would not show. That
        is said once per logger, with the option that resolves it.
        """
        if rank_zero_only.rank != 0:
            return
        for lg in self.loggers:
            try:
                if isinstance(lg, TensorBoardLogger):
                    self._session(lg, params, metrics, step)
                    lg.log_hyperparams(dict(params), metrics={})  # hparams.yaml; metrics={}: no second session
                else:
                    lg.log_hyperparams(dict(params))
            except Exception as err:  # e.g. MLflow refuses to change a param a resumed run logged before
                warnings.warn(
                    f"satmon: {type(lg).__name__} did not take satmon's hyper-parameters "
                    f"({type(err).__name__}: {err}); the verdict is in its scalars and card.",
                    UserWarning,
                    stacklevel=2,
                )

    def _session(
        self, lg: TensorBoardLogger, params: Mapping[str, Any], metrics: Mapping[str, float], step: int
    ) -> None:
        writer = _file_writer(lg)
        if writer is None:
            return
        path = os.path.abspath(lg.log_dir)
        if getattr(lg, "_default_hp_metric", False) and path not in self._hp_metric_said:
            self._hp_metric_said.add(path)
            warnings.warn(HP_METRIC_HIDES.format(log_dir=lg.log_dir), UserWarning, stacklevel=3)
        for summary in hparams_summaries({**dict(lg.hparams), **params}, metrics):
            writer.add_summary(summary, step)
        lg.experiment.flush()

    def close(self) -> None:
        """Nothing to close: the loggers are the Trainer's to finalise."""


def _file_writer(lg: TensorBoardLogger) -> Any:
    """The logger's event-file writer; ``None`` on the ranks where Lightning gives a dummy experiment."""
    return lg.experiment._get_file_writer()
