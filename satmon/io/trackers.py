"""Sinks over experiment trackers without Lightning: a W&B run, an MLflow run, and card files in a folder.

What the Hugging Face callback reports through when ``report_to`` names ``wandb`` or ``mlflow`` (the
runs Hugging Face's own integrations opened), and what any other tracker gets (:class:`MarkdownFileSink`:
the card as ``satmon_verdict.md`` in a folder). Each writes the same things as the TensorBoard sinks:
scalars under satmon's tags, the decision and its trust as parameters, texts where the tracker holds
text. ``wandb`` and ``mlflow`` are imported only by the sink that uses them. A text goes to W&B and to MLflow
through one writer each (:func:`wandb_text`, :func:`mlflow_text`), which the Lightning sink's ``WandbLogger`` and
``MLFlowLogger`` use too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from satmon.io.sink import NullSink

__all__ = [
    "MarkdownFileSink",
    "MlflowSink",
    "WandbSink",
    "mlflow_text",
    "text_file_name",
    "wandb_text",
    "write_text_file",
]


def text_file_name(tag: str) -> str:
    """The file a text goes to in a folder: ``satmon/verdict`` -> ``satmon_verdict.md``.

    Example:
        >>> text_file_name("satmon/verdict"), text_file_name("satmon/stop")
        ('satmon_verdict.md', 'satmon_stop.md')
    """
    return tag.replace("/", "_") + ".md"


def write_text_file(folder: str | os.PathLike, tag: str, markdown: str) -> str:
    """Write ``markdown`` to ``folder/<text_file_name(tag)>``, replacing any earlier one only by a complete file.

    Example:
        >>> import tempfile
        >>> path = write_text_file(tempfile.mkdtemp(), "satmon/verdict", "### card")
        >>> os.path.basename(path), open(path).read()
        ('satmon_verdict.md', '### card\\n')
    """
    from satmon.io.atomic import atomic_write

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(os.fspath(folder), text_file_name(tag))
    atomic_write(path, markdown + "\n")
    return path


def wandb_text(log: Callable[[dict[str, Any], int], None], run_id: str, tag: str, markdown: str, step: int) -> str:
    """Write a text to a W&B run as a one-cell table under ``tag``: the one W&B text writer; returns where it went.

    Args:
        log: how the run logs ``(values, step)``: :class:`WandbSink`'s ``run.log`` with its step key, or a
            Lightning ``WandbLogger``'s ``log_metrics`` (its prefix and ``trainer/global_step``).
        run_id: the run's id, for the place named.
    """
    import wandb

    log({tag: wandb.Table(columns=["markdown"], data=[[markdown]])}, step)
    return f"W&B run {run_id} (table {tag})"


def mlflow_text(client: Any, run_id: str, tag: str, markdown: str) -> str:
    """Write a text to an MLflow run as the artifact ``<tag as a file name>.md`` through the MLflow client: the one
    MLflow text writer (:class:`MlflowSink` and a Lightning ``MLFlowLogger``, whose ``experiment`` is the client)."""
    client.log_text(run_id, markdown, text_file_name(tag))
    return f"MLflow run {run_id} (artifact {text_file_name(tag)})"


class MarkdownFileSink(NullSink):
    """Texts as files in ``folder`` (``satmon_verdict.md``, ``satmon_stop.md``); scalars and hparams are not kept.

    Args:
        folder: where the files go (made at the first text).

    Example:
        >>> import tempfile
        >>> sink = MarkdownFileSink(tempfile.mkdtemp())
        >>> [os.path.basename(p) for p in sink.text("satmon/verdict", "### card", 10)]
        ['satmon_verdict.md']
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = os.fspath(folder)

    def text(self, tag: str, markdown: str, step: int) -> list[str]:
        return [write_text_file(self.folder, tag, markdown)]


class WandbSink:
    """A W&B run: scalars and texts through ``run.log`` (a text as a one-cell table), hparams into ``run.config``.

    Args:
        run: a ``wandb`` run (``wandb.run`` once Hugging Face's ``WandbCallback`` or ``wandb.init`` made it).
        step_key: the key the run's charts use as their x axis (Hugging Face's: ``train/global_step``).
    """

    def __init__(self, run: Any, step_key: str = "train/global_step") -> None:
        self.run, self.step_key = run, step_key

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self._log(dict(values), step)

    def text(self, tag: str, markdown: str, step: int) -> list[str]:
        return [wandb_text(self._log, self.run.id, tag, markdown, step)]

    def _log(self, values: dict[str, Any], step: int) -> None:
        self.run.log({**values, self.step_key: step})

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def close(self) -> None:
        pass


class MlflowSink:
    """An MLflow run, through the MLflow client: scalars as metrics, hparams as params, a text as an artifact
    ``<tag as a file name>.md``. Works on a run that has ended (Hugging Face's ``MLflowCallback`` ends its run at
    train end, before a callback listed after it writes a provisional verdict).

    Args:
        run_id: the run (``mlflow.active_run().info.run_id``).
        tracking_uri: the tracking URI (default: MLflow's current one).
    """

    def __init__(self, run_id: str, tracking_uri: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.run_id, self.client = run_id, MlflowClient(tracking_uri)
        self._logged: dict[str, str] = {}

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, int(step)) for k, v in values.items()])

    def text(self, tag: str, markdown: str, step: int) -> list[str]:
        return [mlflow_text(self.client, self.run_id, tag, markdown)]

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Param

        # MLflow refuses to change a param: a second verdict in the same run keeps the first's (its card says all)
        new = {k: str(v)[:250] for k, v in params.items() if k not in self._logged}
        if new:
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in new.items()])
            self._logged.update(new)

    def close(self) -> None:
        pass
