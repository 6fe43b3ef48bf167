"""What satmon writes to TensorBoard: every tag, every reading -> tag map, and the ``SummaryWriter`` sink.

Every tag satmon writes is in :class:`TAG`, and every reading -> tag map is a function here
(:func:`window_scalars`, :func:`watch_scalars`, :func:`probe_scalars`, :func:`verdict_scalars`), so
the live callback, the live probe and ``satmon replay`` produce runs that open side by side and line
up. The ``log_*`` functions write to a :class:`~satmon.io.sink.Sink`: :class:`SummaryWriterSink`
(event files through torch's ``SummaryWriter``; ``Screen(logdir=...)``, ``satmon replay``) or
:class:`satmon.io.lightning.LightningSink` (a Trainer's loggers). Both write the same layout: the
scalars and texts in the run, the custom-scalars layout, and the hparams session in the sub-run
``<run>/satmon_hparams`` (:class:`HparamsRun`). Nothing here imports torch or Lightning until a file is written.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from enum import Enum
from typing import Any

from satmon.io.sink import LayoutSink, Sink, check_sink

__all__ = [
    "TAG", "VERDICT_VALUES", "HparamsRun", "SummaryWriterSink", "add_layout", "custom_scalars_layout", "log_scalars", "log_stop",
    "log_text", "log_verdict", "offset_scalars", "probe_scalars", "verdict_hparams", "verdict_scalars", "watch_scalars",
    "window_scalars",
]


class TAG:
    """Every tag satmon writes (a namespace, not an enum, so ``TAG.layer_saturation("ln_f")`` reads well).

    Example:
        >>> TAG.layer_saturation("ln_f"), TAG.collapse_breach("loss-spike")
        ('satmon/saturation/ln_f', 'satmon/collapse/breach/loss-spike')
    """

    prefix = "satmon/"  #: every satmon tag starts with it
    # the screening window (scalars; verdict and stop are also text tags)
    saturation = "satmon/saturation"
    nonfinite = "satmon/nonfinite"
    verdict = "satmon/verdict"
    margin = "satmon/margin"
    stop = "satmon/stop"
    # the collapse watch after the window
    collapse_nonfinite = "satmon/collapse/nonfinite"
    collapse_saturation = "satmon/collapse/saturation"
    collapse_loss_z = "satmon/collapse/loss_z"
    collapse_risk = "satmon/collapse/risk"
    # the hparams view: hyper-parameter keys, and the sub-run that holds the session
    hp_window = "satmon/window"
    hp_threshold = "satmon/threshold"
    hp_level = "satmon/level"
    hp_decision = "satmon/decision"
    hp_source = "satmon/source"
    hp_partial = "satmon/partial"
    hparams_run = "satmon_hparams"
    #: v0.1 wrote the pooled saturation under this name for the hparams view, in the run itself; read, never written
    legacy_verdict_saturation = "satmon/verdict_saturation"
    # satmon replay (text)
    replay_checkpoint = "satmon/replay/checkpoint"
    replay_error = "satmon/replay/error"
    # dead directions and the residual stream (satmon.probe, the live probe, replay)
    sigma_min_min_ratio = "satmon/sigma_min/min_ratio"

    @staticmethod
    def layer_saturation(layer: str) -> str:
        return f"satmon/saturation/{layer}"

    @staticmethod
    def alpha(layer: str) -> str:
        return f"satmon/alpha/{layer}"

    @staticmethod
    def collapse_gate(stat: str, mlp: str) -> str:
        """A gate statistic of one gated MLP during the watch (``stat`` from :mod:`satmon.functional.gate`)."""
        return f"satmon/collapse/{stat}/{mlp}"

    @staticmethod
    def collapse_breach(reason: str | Enum) -> str:
        """1.0 when the watch check found ``reason`` (a :class:`satmon.results.stop.StopReason` or its value)."""
        return f"satmon/collapse/breach/{reason.value if isinstance(reason, Enum) else reason}"

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
    def offset_centered(layer: str) -> str:
        return f"satmon/offset/centered/{layer}"

    @staticmethod
    def offset_ratio(layer: str) -> str:
        return f"satmon/offset/ratio/{layer}"

    @staticmethod
    def init_gap(layer: str) -> str:
        return f"satmon/init_gap/{layer}"


#: The ``satmon/verdict`` scalar of each decision. A non-finite verdict is -1, not NaN: NaN reads as
#: "no reading" and cannot be sorted or compared across runs; -1 sorts below NO-GO (docs/tensorboard.md).
VERDICT_VALUES: dict[str, float] = {"go": 1.0, "no-go": 0.0, "non-finite": -1.0}
_SOURCES = ("window", "probe", "replay")


# ------------------------------------------------------------------------ readings -> tags
def window_scalars(pooled: float, per_layer: Mapping[str, float], alphas: Mapping[str, float], nonfinite: int) -> dict[str, float]:
    """The screening window's readings under their tags (the running values and the verdict step's).

    Example:
        >>> window_scalars(0.5, {"ln_f": 0.5}, {"ln_f": 2.0}, 0)
        {'satmon/saturation': 0.5, 'satmon/nonfinite': 0.0, 'satmon/saturation/ln_f': 0.5, 'satmon/alpha/ln_f': 2.0}
    """
    out = {TAG.saturation: float(pooled), TAG.nonfinite: float(nonfinite)}
    out.update({TAG.layer_saturation(k): float(v) for k, v in per_layer.items()})
    out.update({TAG.alpha(k): float(v) for k, v in alphas.items()})
    return out


def offset_scalars(readings: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per layer: the saturation left once each channel's mean is removed, and the median |mean| / spread.

    Example:
        >>> offset_scalars({"ln_f": {"saturated": 0.74, "centered": 0.006, "offset_ratio": 102.0}})
        {'satmon/offset/centered/ln_f': 0.006, 'satmon/offset/ratio/ln_f': 102.0}
    """
    out: dict[str, float] = {}
    for layer, r in readings.items():
        out[TAG.offset_centered(layer)] = float(r["centered"])
        out[TAG.offset_ratio(layer)] = float(r["offset_ratio"])
    return out


def watch_scalars(
    nonfinite: int,
    gated_saturation: float | None = None,
    gate_stats: Mapping[str, Mapping[str, float]] | None = None,
    loss_z: float | None = None,
    breaches: Mapping[str | Enum, bool] | None = None,
) -> dict[str, float]:
    """One collapse-watch check under its tags.

    Args:
        nonfinite: DyT layer inputs that held NaN/inf in the watched step.
        gated_saturation: pooled saturation of the DyT layers that feed gated MLPs (``None``: none does).
        gate_stats: gated MLP name -> {gate statistic: value}.
        loss_z: the loss's robust z against its baseline (``None``: no loss reading yet).
        breaches: stop reason (:class:`satmon.results.stop.StopReason` or its value) -> found in this check.

    Example:
        >>> watch_scalars(0, 0.61, {"blocks.0.mlp": {"flat_fraction": 0.3}}, None, {"collapse-risk": True})
        {'satmon/collapse/nonfinite': 0.0, 'satmon/collapse/saturation': 0.61, 'satmon/collapse/flat_fraction/blocks.0.mlp': 0.3, 'satmon/collapse/breach/collapse-risk': 1.0}
    """
    out = {TAG.collapse_nonfinite: float(nonfinite)}
    if gated_saturation is not None:
        out[TAG.collapse_saturation] = float(gated_saturation)
    for mlp, stats in (gate_stats or {}).items():
        out.update({TAG.collapse_gate(k, mlp): float(v) for k, v in stats.items()})
    if loss_z is not None:
        out[TAG.collapse_loss_z] = float(loss_z)
    out.update({TAG.collapse_breach(k): float(v) for k, v in (breaches or {}).items()})
    return out


def probe_scalars(report: Any, saturation: bool = True) -> dict[str, float]:
    """A probe's readings under the live callback's tags; non-finite and missing readings are left out.

    ``satmon/saturation``, ``satmon/saturation/<layer>``, ``satmon/alpha/<layer>`` (DyT; left out with
    ``saturation=False``, e.g. when the live window writes them), ``satmon/deadir/<layer>/...``
    (LayerNorm/RMSNorm), ``satmon/sigma_min/ratio/<block>`` and ``.../min_ratio`` (a valid profile),
    ``satmon/init_gap/<layer>``. ``report`` is read by attribute (a :class:`satmon.results.probe_report.ProbeReport`).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> dyt = NS(kind="dyt", saturation=0.5, alpha=2.0, init_gap=None)
        >>> probe_scalars(NS(saturation=0.5, layers={"ln_f": dyt}, sigma_min=NS(valid=False)))
        {'satmon/saturation': 0.5, 'satmon/saturation/ln_f': 0.5, 'satmon/alpha/ln_f': 2.0}
    """
    out: dict[str, Any] = {}
    if saturation and report.saturation is not None:
        out[TAG.saturation] = report.saturation
    for name, l in report.layers.items():
        if l.kind == "dyt":
            if saturation and l.saturation is not None:
                out[TAG.layer_saturation(name)] = l.saturation
                out[TAG.alpha(name)] = float(l.alpha)
        elif l.alignment is not None:
            out[TAG.deadir_alignment(name)] = l.alignment
            out[TAG.deadir_null_dim(name)] = float(l.null_dim)
            out[TAG.deadir_null_projection(name)] = l.null_projection
        if l.init_gap is not None:
            out[TAG.init_gap(name)] = l.init_gap.depth_deepening
    s = report.sigma_min
    if s.valid:
        out.update({TAG.sigma_min_ratio(b): r for b, r in zip(s.blocks[1:], s.ratios[1:])})
        if s.min_ratio is not None:
            out[TAG.sigma_min_min_ratio] = s.min_ratio
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def verdict_scalars(verdict: Any) -> dict[str, float]:
    """The verdict's scalars (also the hparams view's metrics); ``satmon/verdict`` from :data:`VERDICT_VALUES`.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> verdict_scalars(build_verdict({"ln_f": (1, 4, 2)}, step=5, window=5))
        {'satmon/verdict': -1.0, 'satmon/margin': -0.18, 'satmon/saturation': 0.25}
    """
    if verdict.decision not in VERDICT_VALUES:
        raise ValueError(f"Expected a verdict decision in {tuple(VERDICT_VALUES)}, got {verdict.decision!r}. "
                         "Build verdicts with satmon.build_verdict.")
    out = {TAG.verdict: VERDICT_VALUES[verdict.decision], TAG.margin: float(verdict.margin),
           TAG.saturation: float(verdict.saturation)}
    if verdict.collapse_risk is not None:
        out[TAG.collapse_risk] = 1.0 if verdict.collapse_risk else 0.0
    return out


def verdict_hparams(verdict: Any) -> dict[str, Any]:
    """The verdict's hyper-parameters in the hparams view: the decision and source as strings, so runs filter by them.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> verdict_hparams(build_verdict({"ln_f": (5, 10)}, step=3, window=3, planned_window=9))
        {'satmon/window': 3, 'satmon/threshold': 0.43, 'satmon/level': 2.0, 'satmon/decision': 'go', 'satmon/source': 'window', 'satmon/partial': 1}
    """
    return {TAG.hp_window: verdict.window, TAG.hp_threshold: verdict.threshold, TAG.hp_level: verdict.level,
            TAG.hp_decision: verdict.decision, TAG.hp_source: verdict.source, TAG.hp_partial: int(verdict.partial)}


# ---------------------------------------------------------------------------------- writing
def log_scalars(sink: Sink, scalars: Mapping[str, float], step: int) -> None:
    """Write scalars to ``sink`` at ``step``."""
    check_sink(sink).scalars(dict(scalars), step)


def log_text(sink: Sink, tag: str, text: str, step: int) -> None:
    """Write markdown text to ``sink`` (sinks without a text view skip it)."""
    check_sink(sink).text(tag, text, step)


def log_verdict(sink: Sink, verdict: Any) -> None:
    """Write the verdict at its step: :func:`verdict_scalars`, the card as text, and the hparams view.

    Args:
        sink: where it goes (:class:`SummaryWriterSink`, :class:`satmon.io.lightning.LightningSink`, ...).
        verdict: a :class:`satmon.results.verdict.Verdict` (GO, NO-GO or non-finite).

    Example:
        >>> import tempfile
        >>> from satmon.results.verdict import build_verdict
        >>> sink = SummaryWriterSink(tempfile.mkdtemp())
        >>> log_verdict(sink, build_verdict({"ln_f": (3, 4)}, step=10, window=10))
        >>> sorted(os.listdir(sink.log_dir))[-1]
        'satmon_hparams'
        >>> sink.close()
    """
    sink = check_sink(sink)
    scalars = verdict_scalars(verdict)
    sink.scalars(scalars, verdict.step)
    sink.text(TAG.verdict, verdict.card(), verdict.step)
    sink.hparams(verdict_hparams(verdict), scalars, verdict.step)


def log_stop(sink: Sink, record: Any) -> None:
    """Write a stop (a :class:`satmon.results.stop.StopRecord`) at its step: its line as text and ``satmon/stop`` = 1."""
    sink = check_sink(sink)
    sink.text(TAG.stop, record.text(), record.step)
    sink.scalars({TAG.stop: 1.0}, record.step)


def custom_scalars_layout() -> dict[str, Any]:
    """The custom-scalars layout: pooled saturation beside the per-layer curves, the alphas, verdict and margin.

    Tags are regexes, so runs with different layers share one layout.

    Example:
        >>> sorted(custom_scalars_layout()["satmon"])
        ['alpha per layer', 'saturation (pooled vs per layer)', 'verdict and margin']
    """
    sat, alpha, verdict, margin = (re.escape(t) for t in (TAG.saturation, TAG.alpha(""), TAG.verdict, TAG.margin))
    return {
        "satmon": {
            "saturation (pooled vs per layer)": ["Multiline", [rf"^{sat}(/.*)?$"]],
            "alpha per layer": ["Multiline", [rf"^{alpha}.*"]],
            "verdict and margin": ["Multiline", [rf"^({verdict}|{margin})$"]],
        }
    }


def add_layout(sink: Sink) -> None:
    """Write :func:`custom_scalars_layout` to ``sink`` when it shows one (a :class:`~satmon.io.sink.LayoutSink`)."""
    if isinstance(check_sink(sink), LayoutSink):
        sink.layout(custom_scalars_layout())


# ----------------------------------------------------------------------------------- SummaryWriter
def _global_rank() -> int:
    """This process's rank: ``torch.distributed``'s when it is initialised, else the launcher's environment
    (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``, ``JSM_NAMESPACE_RANK``, Lightning's rule), else 0."""
    torch = sys.modules.get("torch")  # not imported: no process group either
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        value = os.environ.get(key)
        if value is not None:
            return int(value)
    return 0


class HparamsRun:
    """The hparams view's session of one run, in its sub-run ``<log_dir>/satmon_hparams``.

    TensorBoard keeps only the first hparams session of a run, and Lightning writes one at train
    start (``hp_metric``), so satmon writes its session, with the metric scalars it refers to, into a
    run of its own, as ``SummaryWriter.add_hparams`` does. One event file per run, however many
    sessions (replay: one per checkpoint); the writer is opened at the first session, flushed after
    each, and closed by :meth:`close` (a later session opens it again).

    Args:
        log_dir: the run's folder.
    """

    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.path.join(os.fspath(log_dir), TAG.hparams_run))
        self._writer: Any = None

    def write(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        """One session: ``params`` (those of type str, int, float, bool), ``metrics`` and their values at ``step``."""
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        params = {k: v for k, v in params.items() if isinstance(v, (int, float, str, bool))}
        if self._writer is None or not os.path.isdir(self.path):  # the folder was removed: a new file
            self.close()
            self._writer = SummaryWriter(self.path)
        domains = {TAG.hp_decision: list(VERDICT_VALUES), TAG.hp_source: list(_SOURCES)}  # filter boxes in the HParams tab
        for summary in hparams(params, dict(metrics), {k: v for k, v in domains.items() if params.get(k) in v}):
            self._writer.file_writer.add_summary(summary)
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class SummaryWriterSink:
    """A :class:`~satmon.io.sink.Sink` that writes TensorBoard event files with torch's ``SummaryWriter``.

    The run's scalars, texts and layout go to ``log_dir``; the hparams session to ``log_dir/satmon_hparams``
    (:class:`HparamsRun`). Files are opened at the first write (a screen that never writes leaves no
    empty run), flushed after each write (an interrupted run keeps what it wrote), and closed by
    :meth:`close`; a write after :meth:`close` opens a new event file in the same run.

    Args:
        log_dir: the run's folder (made when first written).
        rank_zero_only: write on the process of global rank 0 only (each rank may make one, as
            Lightning's loggers do); ``False``: write on every process.

    Example:
        >>> import tempfile
        >>> sink = SummaryWriterSink(tempfile.mkdtemp())
        >>> sink.scalars({TAG.saturation: 0.5}, step=10)
        >>> any(f.startswith("events.out.tfevents") for f in os.listdir(sink.log_dir))
        True
        >>> sink.close()
    """

    def __init__(self, log_dir: str | os.PathLike, *, rank_zero_only: bool = True) -> None:
        self.log_dir = os.fspath(log_dir)
        self.rank_zero_only = rank_zero_only
        self._writer: Any = None
        self._hparams = HparamsRun(self.log_dir)

    def _writes(self) -> bool:
        return not self.rank_zero_only or _global_rank() == 0

    @property
    def is_open(self) -> bool:
        """Whether the run's event file is open (written to and not closed since)."""
        return self._writer is not None

    @property
    def writer(self) -> Any:
        """The run's ``SummaryWriter`` (opened on first use)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.log_dir)
        return self._writer

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self._writes():
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, global_step=step)
            self.writer.flush()

    def text(self, tag: str, markdown: str, step: int) -> None:
        if self._writes():
            self.writer.add_text(tag, markdown, global_step=step)
            self.writer.flush()

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        if self._writes():
            self._hparams.write(params, metrics, step)

    def layout(self, layout: Mapping[str, Any]) -> None:
        if self._writes():
            self.writer.add_custom_scalars(dict(layout))
            self.writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._hparams.close()
