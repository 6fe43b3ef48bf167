"""What satmon writes to TensorBoard: every reading -> tag map, and the ``SummaryWriter`` sink.

Every tag satmon writes is named in :mod:`satmon.io.tags` (:class:`~satmon.io.tags.TAG`), and every reading -> tag
map is a function here
(:func:`window_scalars`, :func:`watch_scalars`, :func:`probe_scalars`, :func:`verdict_scalars`), so
the live callback, the live probe and ``satmon replay`` produce runs that open side by side and line
up. The ``log_*`` functions write to a :class:`~satmon.io.sink.Sink`: :class:`SummaryWriterSink`
(event files through torch's ``SummaryWriter``; ``Screen(logdir=...)``, ``satmon replay``) or
:class:`satmon.io.lightning.LightningSink` (a Trainer's loggers). Both write the same layout, all of
it in the run itself (one run per run: satmon 0.3's ``satmon_hparams`` sub-run is gone): the scalars,
the texts, the custom-scalars layout and the hparams session. Nothing here imports torch or Lightning
until a file is written.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from enum import Enum
from typing import Any

from satmon import _compat
from satmon.io import tags
from satmon.io.sink import LayoutSink, Sink, check_sink, describe, places
from satmon.results.rule import Decision

__all__ = [
    "SHOWN_HPARAMS",
    "SummaryWriterSink",
    "add_layout",
    "custom_scalars_layout",
    "hparams_summaries",
    "log_scalars",
    "log_stop",
    "log_text",
    "log_verdict",
    "offset_scalars",
    "probe_scalars",
    "scalar_summary",
    "text_summary",
    "verdict_description",
    "verdict_hparams",
    "verdict_scalars",
    "watch_scalars",
    "window_scalars",
]


_SOURCES = ("window", "probe", "replay")


# ------------------------------------------------------------------------ readings -> tags
def window_scalars(
    pooled: float, per_layer: Mapping[str, float], alphas: Mapping[str, float], nonfinite: int
) -> dict[str, float]:
    """The screening window's readings under their tags (the running values and the verdict step's).

    Example:
        >>> window_scalars(0.5, {"ln_f": 0.5}, {"ln_f": 2.0}, 0)
        {'Satmon/saturation': 0.5, 'Satmon/nonfinite': 0.0, 'satmon_saturation/ln_f': 0.5, 'satmon_alpha/ln_f': 2.0}
    """
    out = {tags.TAG.saturation: float(pooled), tags.TAG.nonfinite: float(nonfinite)}
    out.update({tags.TAG.layer_saturation(k): float(v) for k, v in per_layer.items()})
    out.update({tags.TAG.alpha(k): float(v) for k, v in alphas.items()})
    return out


def offset_scalars(readings: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per layer: the saturation left once each channel's mean is removed, and the median |mean| / spread.

    Example:
        >>> offset_scalars({"ln_f": {"saturated": 0.74, "centered": 0.006, "offset_ratio": 102.0}})
        {'satmon_offset/centered/ln_f': 0.006, 'satmon_offset/ratio/ln_f': 102.0}
    """
    out: dict[str, float] = {}
    for layer, r in readings.items():
        out[tags.TAG.offset_centered(layer)] = float(r["centered"])
        out[tags.TAG.offset_ratio(layer)] = float(r["offset_ratio"])
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
        ... # doctest: +NORMALIZE_WHITESPACE
        {'satmon_collapse/nonfinite': 0.0, 'satmon_collapse/saturation': 0.61,
         'satmon_collapse/flat_fraction/blocks.0.mlp': 0.3, 'satmon_collapse/breach/collapse-risk': 1.0}
    """
    out = {tags.TAG.collapse_nonfinite: float(nonfinite)}
    if gated_saturation is not None:
        out[tags.TAG.collapse_saturation] = float(gated_saturation)
    for mlp, stats in (gate_stats or {}).items():
        out.update({tags.TAG.collapse_gate(k, mlp): float(v) for k, v in stats.items()})
    if loss_z is not None:
        out[tags.TAG.collapse_loss_z] = float(loss_z)
    out.update({tags.TAG.collapse_breach(k): float(v) for k, v in (breaches or {}).items()})
    return out


def probe_scalars(report: Any, saturation: bool = True) -> dict[str, float]:
    """A probe's readings under the live callback's tags; non-finite and missing readings are left out.

    ``Satmon/saturation``, ``satmon_saturation/<layer>``, ``satmon_alpha/<layer>`` (DyT; left out with
    ``saturation=False``, e.g. when the live window writes them), ``satmon_deadir/<layer>/...``
    (LayerNorm/RMSNorm), ``satmon_sigma_min/ratio/<block>`` and ``.../min_ratio`` (a valid profile),
    ``satmon_init_gap/<layer>``. ``report`` is read by attribute (a :class:`satmon.results.probe_report.ProbeReport`).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> dyt = NS(kind="dyt", saturation=0.5, alpha=2.0, init_gap=None)
        >>> probe_scalars(NS(saturation=0.5, layers={"ln_f": dyt}, sigma_min=NS(valid=False)))
        {'Satmon/saturation': 0.5, 'satmon_saturation/ln_f': 0.5, 'satmon_alpha/ln_f': 2.0}
    """
    out: dict[str, Any] = {}
    if saturation and report.saturation is not None:
        out[tags.TAG.saturation] = report.saturation
    for name, l in report.layers.items():
        if l.kind == "dyt":
            if saturation and l.saturation is not None:
                out[tags.TAG.layer_saturation(name)] = l.saturation
                out[tags.TAG.alpha(name)] = float(l.alpha)
        elif l.alignment is not None:
            out[tags.TAG.deadir_alignment(name)] = l.alignment
            out[tags.TAG.deadir_null_dim(name)] = float(l.null_dim)
            out[tags.TAG.deadir_null_projection(name)] = l.null_projection
        if l.init_gap is not None:
            out[tags.TAG.init_gap(name)] = l.init_gap.depth_deepening
    s = report.sigma_min
    if s.valid:
        out.update({tags.TAG.sigma_min_ratio(b): r for b, r in zip(s.blocks[1:], s.ratios[1:])})
        if s.min_ratio is not None:
            out[tags.TAG.sigma_min_min_ratio] = s.min_ratio
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def verdict_scalars(verdict: Any) -> dict[str, float]:
    """The verdict's scalars (also the hparams view's metrics); ``Satmon/decision`` from
    :data:`~satmon.io.tags.VERDICT_VALUES`.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> verdict_scalars(build_verdict({"ln_f": (1, 4, 2)}, step=5, window=5))
        {'Satmon/decision': -1.0, 'Satmon/margin': -0.18, 'Satmon/saturation': 0.25}
    """
    if verdict.decision not in tags.VERDICT_VALUES:
        raise ValueError(
            f"Expected a verdict decision in {tuple(tags.VERDICT_VALUES)}, got {verdict.decision!r}. "
            "Build verdicts with satmon.build_verdict."
        )
    out = {
        tags.TAG.verdict: tags.VERDICT_VALUES[verdict.decision],
        tags.TAG.margin: float(verdict.margin),
        tags.TAG.saturation: float(verdict.saturation),
    }
    if verdict.collapse_risk is not None:
        out[tags.TAG.collapse_risk] = 1.0 if verdict.collapse_risk else 0.0
    planned = getattr(verdict, "planned_forecast", None)
    if planned:  # the forecast from the planned passes, beside the decision (satmon.results.forecast.CODE)
        from satmon.results.forecast import CODE

        out[tags.TAG.forecast] = CODE.get(planned.get("outcome"), 0.0)
    return out


def verdict_description(verdict: Any) -> dict[str, str]:
    """The description of the decision's chart (TensorBoard shows it with the chart; it keeps the first one a run
    writes): the live window's decision and trust, or, for a replay (a decision per checkpoint), what the values mean.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> print(verdict_description(build_verdict({"ln_f": (1, 4)}, step=500, window=500))[tags.TAG.verdict])
        ... # doctest: +NORMALIZE_WHITESPACE
        NO-GO by the study's rule at step 500, trust: unproven (a measurement, not a forecast; held-out accuracy 50%
        vs 67% for guessing the commoner outcome). 1 = GO, 0 = NO-GO, -1 = non-finite; the card (Text tab,
        satmon/verdict) says why and how far to trust it.
    """
    scale = "1 = GO, 0 = NO-GO, -1 = non-finite; the card (Text tab, satmon/verdict) says why and how far to trust it."
    if verdict.source != "window":
        return {tags.TAG.verdict: f"The {verdict.source}'s decision at each step read. {scale}"}
    if verdict.decision == Decision.NON_FINITE:
        return {tags.TAG.verdict: f"NON-FINITE at step {verdict.step}: the run diverged. {scale}"}
    from satmon.results.card import evidence, whose_rule

    what = "a forecast" if verdict.forecast else "a measurement, not a forecast"
    word = "GO" if verdict.go else "NO-GO"
    return {
        tags.TAG.verdict: f"{word} {whose_rule(verdict)} at step {verdict.step}, trust: {verdict.trust} ({what}; "
        f"{evidence(verdict)}). {scale}"
    }


def verdict_hparams(verdict: Any) -> dict[str, Any]:
    """The verdict's hyper-parameters in the hparams view: the decision, how far to trust it and the source
    as strings, so runs filter by them.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> hp = verdict_hparams(build_verdict({"ln_f": (5, 10)}, step=3, window=3, planned_window=9))
        >>> hp  # doctest: +NORMALIZE_WHITESPACE
        {'satmon/decision': 'go', 'satmon/trust': 'partial', 'satmon/source': 'window', 'satmon/window': 3,
         'satmon/partial': 1, 'satmon/threshold': 0.43, 'satmon/level': 2.0}
    """
    out = {tags.TAG.hp_decision: str(verdict.decision), tags.TAG.hp_trust: verdict.trust}
    out.update(
        {
            tags.TAG.hp_source: verdict.source,
            tags.TAG.hp_window: verdict.window,
            tags.TAG.hp_partial: int(verdict.partial),
            tags.TAG.hp_threshold: verdict.threshold,
            tags.TAG.hp_level: verdict.level,
        }
    )
    planned = getattr(verdict, "planned_forecast", None)
    if planned:
        out[tags.TAG.hp_forecast] = str(planned.get("outcome"))
        for tag, key in (
            (tags.TAG.hp_params, "params"),
            (tags.TAG.hp_unique_tokens, "unique_tokens"),
            (tags.TAG.hp_planned_tokens, "planned_tokens"),
        ):
            if isinstance(planned.get(key), (int, float)):
                out[tag] = float(planned[key])
    return out


#: The hparams keys the HParams tab shows first (besides those whose values differ between runs, TensorBoard shows
#: the first five by name: a run's own hyper-parameters beside satmon's would hide the decision otherwise).
SHOWN_HPARAMS = (tags.TAG.hp_decision, tags.TAG.hp_trust)


def _hparams_domains() -> dict[str, list[str]]:
    """The string hparams' values, for the HParams tab's filter boxes."""
    from satmon.results.forecast import OUTCOMES
    from satmon.results.verdict import TRUST

    return {
        tags.TAG.hp_decision: [str(d) for d in tags.VERDICT_VALUES],
        tags.TAG.hp_source: list(_SOURCES),
        tags.TAG.hp_trust: list(TRUST),
        tags.TAG.hp_forecast: list(OUTCOMES),
    }


def text_summary(tag: str, markdown: str) -> Any:
    """A text summary under ``tag`` itself, with the text plugin's metadata (TensorBoard's ``text_pb``;
    ``SummaryWriter.add_text`` would write it under ``tag + "/text_summary"``).

    Example:
        >>> summary = text_summary(tags.TAG.verdict_text, "### satmon verdict")
        >>> summary.value[0].tag, summary.value[0].metadata.plugin_data.plugin_name
        ('satmon/verdict', 'text')
    """
    from tensorboard.plugins.text.summary_v2 import text_pb

    return text_pb(tag, markdown)


def scalar_summary(tag: str, value: float, description: str = "") -> Any:
    """A scalar summary under ``tag`` with a description (TensorBoard shows it with the chart), in the scalar
    plugin's tensor form: TensorBoard's data server drops the description of an ``add_scalar`` value.
    A described tag is written this way every time (one kind of data per tag).

    Example:
        >>> summary = scalar_summary(tags.TAG.verdict, 1.0, "GO")
        >>> summary.value[0].tag, summary.value[0].metadata.summary_description
        ('Satmon/decision', 'GO')
    """
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb

    return scalar_pb(tag, float(value), description=description or None)


def hparams_summaries(params: Mapping[str, Any], metrics: Mapping[str, float], experiment: bool = True) -> list[Any]:
    """The summaries of one hparams session (the experiment, when ``experiment``; the session's start and end), as
    ``SummaryWriter.add_hparams`` writes them, with satmon's string values as discrete domains and
    :data:`SHOWN_HPARAMS` marked to be shown first (``differs``, the mark TensorBoard sorts columns by).

    The experiment summary is the HParams tab's column list: TensorBoard takes one run's, any one, and without
    any it makes the columns from every session. A replay writes none (``experiment=False``), so its session
    never replaces a live run's columns (the model's own hyper-parameters) with its own.
    ``params`` of other types than str, int, float and bool are left out.

    Example:
        >>> from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
        >>> exp, start, end = hparams_summaries({"lr": 0.1, tags.TAG.hp_decision: "go"}, {tags.TAG.verdict: 1.0})
        >>> data = HParamsPluginData.FromString(exp.value[0].metadata.plugin_data.content)
        >>> [(h.name, h.differs) for h in data.experiment.hparam_infos]
        [('lr', False), ('satmon/decision', True)]
        >>> len(hparams_summaries({"lr": 0.1}, {tags.TAG.verdict: 1.0}, experiment=False))
        2
    """
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    from torch.utils.tensorboard.summary import hparams

    params = {k: v for k, v in params.items() if isinstance(v, (int, float, str, bool))}
    domains = {k: v for k, v in _hparams_domains().items() if params.get(k) in v}
    exp, start, end = hparams(params, dict(metrics), domains)
    if not experiment:
        return [start, end]
    value = exp.value[0]
    data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in SHOWN_HPARAMS
    value.metadata.plugin_data.content = data.SerializeToString()
    return [exp, start, end]


# ---------------------------------------------------------------------------------- writing
def log_scalars(sink: Sink, scalars: Mapping[str, float], step: int) -> None:
    """Write scalars to ``sink`` at ``step``."""
    check_sink(sink).scalars(dict(scalars), step)


def log_text(sink: Sink, tag: str, text: str, step: int) -> list[str]:
    """Write markdown text to ``sink``; returns where it went (:func:`satmon.io.sink.places`)."""
    sink = check_sink(sink)
    return places(sink, sink.text(tag, text, step))


def log_verdict(sink: Sink, verdict: Any, hparams: bool = True, card: str | None = None) -> list[str]:
    """Write the verdict at its step: :func:`verdict_scalars` (the decision's chart described by
    :func:`verdict_description`), the card as text, and (``hparams``) the hparams view. Returns where the card went,
    one place per destination (empty: nowhere), for the console line.

    Args:
        sink: where it goes (:class:`SummaryWriterSink`, :class:`satmon.io.lightning.LightningSink`, ...).
        verdict: a :class:`satmon.results.verdict.Verdict` (GO, NO-GO or non-finite).
        hparams: write the hparams session too (a replay writes one, for its last checkpoint, when it closes).
        card: the card's markdown when it says more than ``verdict.card()`` (a replay's: the live verdict beside it).

    Example:
        >>> import tempfile
        >>> from satmon.results.verdict import build_verdict
        >>> sink = SummaryWriterSink(tempfile.mkdtemp())
        >>> where = log_verdict(sink, build_verdict({"ln_f": (3, 4)}, step=10, window=10))
        >>> where == [f"TensorBoard {sink.log_dir}"]
        True
        >>> [n for n in os.listdir(sink.log_dir) if not n.startswith("events")]
        []
        >>> sink.close()
    """
    sink = check_sink(sink)
    scalars = verdict_scalars(verdict)
    describe(sink, verdict_description(verdict))
    sink.scalars(scalars, verdict.step)
    where = places(sink, sink.text(tags.TAG.verdict_text, verdict.card() if card is None else card, verdict.step))
    if hparams:
        sink.hparams(verdict_hparams(verdict), scalars, verdict.step)
    return where


def log_stop(sink: Sink, record: Any) -> None:
    """Write a stop (a :class:`satmon.results.stop.StopRecord`) at its step: its line as the text ``satmon/stop``
    and the scalar ``Satmon/stop`` = 1."""
    sink = check_sink(sink)
    sink.text(tags.TAG.stop_text, record.text(), record.step)
    sink.scalars({tags.TAG.stop: 1.0}, record.step)


def custom_scalars_layout() -> dict[str, Any]:
    """The custom-scalars layout: the decision, the margin and the pooled saturation each on a chart of their own
    (one scale each: 0/1 and +-0.3 on one axis read as neither), then the per-layer curves and the alphas.

    Tags are regexes, so runs with different layers share one layout. TensorBoard lists the categories in this
    order and colours lines by run, so a per-layer chart holds one run's layers apart only by the legend.

    Example:
        >>> [(cat, list(charts)) for cat, charts in custom_scalars_layout().items()]  # doctest: +NORMALIZE_WHITESPACE
        [('Satmon', ['decision (1 GO, 0 NO-GO, -1 non-finite)', 'margin (saturation - threshold)',
                     'pooled saturation']),
         ('satmon per layer', ['saturation per layer', 'alpha per layer'])]
    """
    sat, layer, alpha, verdict, margin = (
        re.escape(t)
        for t in (
            tags.TAG.saturation,
            tags.TAG.layer_saturation(""),
            tags.TAG.alpha(""),
            tags.TAG.verdict,
            tags.TAG.margin,
        )
    )
    return {
        tags.TAG.summary: {
            "decision (1 GO, 0 NO-GO, -1 non-finite)": ["Multiline", [rf"^{verdict}$"]],
            "margin (saturation - threshold)": ["Multiline", [rf"^{margin}$"]],
            "pooled saturation": ["Multiline", [rf"^{sat}$"]],
        },
        "satmon per layer": {
            "saturation per layer": ["Multiline", [rf"^{layer}.+"]],
            "alpha per layer": ["Multiline", [rf"^{alpha}.+"]],
        },
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


class SummaryWriterSink:
    """A :class:`~satmon.io.sink.Sink` that writes TensorBoard event files with torch's ``SummaryWriter``.

    Everything goes to ``log_dir``, one run: the scalars, the texts, the layout and the hparams session
    (TensorBoard keeps a run's first session; satmon writes one per run). Files are opened at the first
    write (a screen that never writes leaves no empty run), flushed after each write (an interrupted run
    keeps what it wrote), and closed by :meth:`close`; a write after :meth:`close` opens a new event file
    in the same run.

    Args:
        log_dir: the run's folder (made when first written).
        rank_zero_only: write on the process of global rank 0 only (each rank may make one, as
            Lightning's loggers do); ``False``: write on every process.
        hparams_experiment: write the HParams tab's column list with the session (:func:`hparams_summaries`);
            ``False`` (a replay's): the session only, so the columns stay those of the live runs beside it.

    Example:
        >>> import tempfile
        >>> sink = SummaryWriterSink(tempfile.mkdtemp())
        >>> sink.scalars({tags.TAG.saturation: 0.5}, step=10)
        >>> any(f.startswith("events.out.tfevents") for f in os.listdir(sink.log_dir))
        True
        >>> sink.close()
    """

    def __init__(
        self, log_dir: str | os.PathLike, *, rank_zero_only: bool = True, hparams_experiment: bool = True
    ) -> None:
        self.log_dir = os.fspath(log_dir)
        self.rank_zero_only = rank_zero_only
        self.hparams_experiment = hparams_experiment
        self._writer: Any = None
        self._descriptions: dict[str, str] = {}  # tag -> its description, written with the tag's next write
        self._described: set[str] = set()  # tags written in the tensor form (scalar_summary), every time

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

    def describe(self, descriptions: Mapping[str, str]) -> None:
        """Describe tags: each description goes with the tag's next write (TensorBoard keeps a tag's first)."""
        self._descriptions.update(descriptions)
        self._described.update(descriptions)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self._writes():
            for tag, value in values.items():
                if tag in self._described:
                    summary = scalar_summary(tag, value, self._descriptions.pop(tag, ""))
                    self.writer.file_writer.add_summary(summary, step)
                else:
                    self.writer.add_scalar(tag, value, global_step=step)
            self.writer.flush()

    def text(self, tag: str, markdown: str, step: int) -> list[str]:
        """Write ``markdown`` under ``tag`` itself (:func:`text_summary`), as TensorBoard's Text tab names it; returns
        where it went (``["TensorBoard <log_dir>"]``, or nothing on a rank that does not write)."""
        if not self._writes():
            return []
        self.writer.file_writer.add_summary(text_summary(tag, markdown), step)
        self.writer.flush()
        return [f"TensorBoard {self.log_dir}"]

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> None:
        """The hparams session in the run itself, its metrics the run's own scalars (written before it)."""
        if self._writes():
            for summary in hparams_summaries(params, metrics, experiment=self.hparams_experiment):
                self.writer.file_writer.add_summary(summary, step)
            self.writer.flush()

    def layout(self, layout: Mapping[str, Any]) -> None:
        if self._writes():
            self.writer.add_custom_scalars(dict(layout))
            self.writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def __getattr__(name: str) -> Any:
    """satmon 0.4's ``satmon.io.tensorboard.TAG`` and ``VERDICT_VALUES``: in :mod:`satmon.io.tags` now (deprecated)."""
    return _compat.moved_attribute(__name__, name)
