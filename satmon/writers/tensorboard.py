"""Write satmon readings to Lightning loggers, TensorBoard first.

Every tag satmon writes is built here, so the live callback and ``satmon replay`` produce runs
that open side by side and line up. Scalars go to every Lightning logger; text, the hparams
view and the custom-scalars layout need TensorBoard and are skipped for other loggers.
Lightning's loggers write on rank zero only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger

__all__ = ["TAG", "log_scalars", "log_text", "log_verdict", "add_layout"]


class TAG:
    """Tag names (a namespace, not an enum, so ``TAG.layer_saturation("ln_f")`` reads well)."""

    saturation = "satmon/saturation"
    verdict = "satmon/verdict"
    margin = "satmon/margin"
    nonfinite = "satmon/nonfinite"
    stop = "satmon/stop"

    @staticmethod
    def layer_saturation(layer: str) -> str:
        return f"satmon/saturation/{layer}"

    @staticmethod
    def alpha(layer: str) -> str:
        return f"satmon/alpha/{layer}"

    # dead directions and the residual stream (satmon.probe, the live probe, replay)
    sigma_min_min_ratio = "satmon/sigma_min/min_ratio"

    @staticmethod
    def deadir_alignment(layer: str) -> str:
        return f"satmon/deadir/{layer}/alignment"

    @staticmethod
    def deadir_null_dim(layer: str) -> str:
        return f"satmon/deadir/{layer}/null_dim"

    @staticmethod
    def deadir_null_projection(layer: str) -> str:
        return f"satmon/deadir/{layer}/null_projection"

    @staticmethod
    def sigma_min_ratio(block: str) -> str:
        return f"satmon/sigma_min/ratio/{block}"

    @staticmethod
    def init_gap(layer: str) -> str:
        return f"satmon/init_gap/{layer}"


def _tensorboards(loggers: Iterable[Logger]) -> list[TensorBoardLogger]:
    return [lg for lg in loggers if isinstance(lg, TensorBoardLogger)]


def log_scalars(loggers: Iterable[Logger], scalars: Mapping[str, float], step: int) -> None:
    """Write scalars to every logger at ``step`` (rank zero only, as Lightning's loggers do)."""
    for lg in loggers:
        lg.log_metrics(dict(scalars), step=step)


def log_text(loggers: Iterable[Logger], tag: str, text: str, step: int) -> None:
    """Write markdown text to every TensorBoard logger."""
    for lg in _tensorboards(loggers):
        lg.experiment.add_text(tag, text, global_step=step)


def log_verdict(loggers: Iterable[Logger], verdict: Any) -> None:
    """Write the verdict: scalars, the card as text, and the hparams/metrics view.

    Args:
        loggers: Lightning loggers (``trainer.loggers``, or a ``TensorBoardLogger`` built by replay).
        verdict: a :class:`satmon.verdict.Verdict`.
    """
    loggers = list(loggers)
    step = verdict.step
    scalars = {TAG.verdict: 1.0 if verdict.go else 0.0, TAG.margin: verdict.margin, TAG.saturation: verdict.saturation}
    if verdict.collapse_risk is not None:
        scalars["satmon/collapse/risk"] = 1.0 if verdict.collapse_risk else 0.0
    log_scalars(loggers, scalars, step)
    log_text(loggers, TAG.verdict, verdict.card(), step)
    params = {
        "satmon/window": verdict.window, "satmon/threshold": verdict.threshold, "satmon/level": verdict.level,
        "satmon/decision": verdict.decision,
    }
    for lg in _tensorboards(loggers):
        _write_hparams(lg, params, scalars, step)


def _write_hparams(logger: TensorBoardLogger, params: dict[str, Any], metrics: dict[str, float], step: int) -> None:
    """The verdict in TensorBoard's HParams view, as a sub-run ``<log_dir>/satmon_hparams``.

    TensorBoard keeps only the first hparams session of a run, and Lightning writes one at train
    start (``hp_metric``), so satmon writes its session, with the metric scalars it refers to,
    into a run of its own, as ``SummaryWriter.add_hparams`` does.
    """
    import os

    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    if getattr(logger, "log_dir", None) is None or not hasattr(logger.experiment, "add_scalar"):
        return  # not rank zero
    merged = {k: v for k, v in {**dict(logger.hparams), **params}.items() if isinstance(v, (int, float, str, bool))}
    path = os.path.abspath(os.path.join(logger.log_dir, "satmon_hparams"))
    writer = _HPARAM_WRITERS.get(path)
    if writer is None or not os.path.isdir(path):  # one event file per run, however many verdicts (replay: one per checkpoint)
        if writer is not None:
            writer.close()
        writer = _HPARAM_WRITERS[path] = SummaryWriter(path)
    for summary in hparams(merged, metrics):
        writer.file_writer.add_summary(summary)
    for k, v in metrics.items():
        writer.add_scalar(k, v, step)
    writer.flush()


_HPARAM_WRITERS: dict[str, Any] = {}


def add_layout(loggers: Iterable[Logger], layer_names: list[str]) -> None:
    """A TensorBoard custom-scalars layout: pooled saturation beside the per-layer curves.

    Tags are regexes, so runs with different layers share one layout.
    """
    layout = {
        "satmon": {
            "saturation (pooled vs per layer)": ["Multiline", [r"^satmon/saturation(/.*)?$"]],
            "alpha per layer": ["Multiline", [r"^satmon/alpha/.*"]],
            "verdict and margin": ["Multiline", [r"^satmon/(verdict|margin)$"]],
        }
    }
    for lg in _tensorboards(loggers):
        lg.experiment.add_custom_scalars(layout)
