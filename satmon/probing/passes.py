r"""``satmon.probe(model, batches)``: no-grad passes over calibration batches, every satmon reading at once.

Forward hooks, attached for the call and removed afterwards, feed satmon's float64 math:

- **DyT** layers: the live window's hook sets (:class:`~satmon.observe.reading_hooks.ReadingHooks`):
  saturation ``|alpha * x| > level``, the offset statistics on every batch, and, when a DyT feeds a
  gated MLP (:func:`~satmon.model.gating.detect_gating`), gate statistics in the same forward; read
  into one :class:`~satmon.results.reading.Reading` with the model's non-finite weights, then
  :func:`~satmon.results.reading.verdict_of`: the window's reading -> verdict function, so a probe's
  verdict carries the same offset table and flags as the window's, and NaN/inf weights read NON-FINITE.
- **LayerNorm / RMSNorm** layers: the covariance of the layer output
  (:class:`~satmon.observe.covariance.CovarianceTaps`), then
  :func:`~satmon.functional.dead_directions.alignment` with the layer's effective gain
  (:func:`~satmon.model.affine.effective_affine`: ``1 + weight`` for a Gemma-style RMSNorm).
- **Residual stream**: ``X_0`` (the first block's input) and every block output feed ``X^T X``,
  then :func:`~satmon.functional.dead_directions.sigma_min_profile`.

The live callback (:class:`satmon.drivers.live_probe.LiveProbe`) and ``satmon replay`` call this same function.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import time
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch
from torch import nn

from satmon.batches import ForwardFn, feed, feed_first, peek_batch, take_batches, to_device
from satmon.convert import check_conversion
from satmon.functional.dead_directions import GramSpectrum, alignment, classify_norm_type, gram_spectrum
from satmon.model.affine import effective_affine
from satmon.model.discovery import NormLayer, Selector
from satmon.model.frozen_forward import frozen_forward
from satmon.model.gating import detect_gating
from satmon.observe.covariance import CovarianceTap, CovarianceTaps
from satmon.observe.reading_hooks import ReadingHooks, nonfinite_parameters
from satmon.probing.memory_plan import MemoryPlan, plan_memory
from satmon.probing.targets import ProbeTargets, find_probe_targets
from satmon.results.gating import GatingInfo
from satmon.results.probe_report import (
    EMBEDDING,
    LayerReading,
    ProbeReport,
    SigmaMinReading,
    init_gaps,
    model_norm_type,
)
from satmon.results.reading import Reading, verdict_of
from satmon.results.verdict import Source, Verdict
from satmon.settings import Settings, settings_from

__all__ = [
    "EMBEDDING",
    "OWN_OPTIONS",
    "LayerReading",
    "ProbeReport",
    "SigmaMinReading",
    "check_options",
    "feed_first",
    "probe",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ probe
def probe(
    model: nn.Module,
    batches: Any,
    *,
    settings: Settings | None = None,
    forward_fn: ForwardFn | None = None,
    layers: list[str] | Selector = None,
    blocks: list[str] | None = None,
    device: torch.device | str | None = None,
    autocast_dtype: torch.dtype | None = None,
    max_batches: int | None = None,
    twin: nn.Module | None = None,
    max_dim: int = 8192,
    train_mode: bool = False,
    memory_budget: int | str | None = None,
    verbose: bool = False,
    step: int = 0,
    source: Source | str = Source.PROBE,
    **options: Any,
) -> ProbeReport:
    r"""Run ``model`` over ``batches`` without gradients and read every satmon diagnostic from that pass.

    Batches. ``batches`` is one batch (a tensor or a dict) or an iterable of batches (a list, a
    ``DataLoader``, a generator). Each batch is moved to ``device`` and fed by ``forward_fn(model,
    batch)`` when given, else by :func:`satmon.batches.feed`: a tensor as ``model(batch)``, a
    tuple/list as ``model(*batch)``, a dict as ``model(**batch)``. A dataloader's ``(inputs,
    targets)`` pair would feed the targets as a second input: pass ``forward_fn=feed_first``
    (``model(batch[0])``), as the live probe does. The output is discarded.

    Mode and state. Eval mode (dropout off, as the study measured) unless ``train_mode``; modes,
    buffers, grad mode and RNG are restored after each pass, parameters are never written, hooks are
    removed, also on error (:func:`satmon.model.frozen_forward.frozen_forward`). Other code's hooks
    (e.g. a running :class:`~satmon.SaturationMonitor`) see these forwards.

    Memory. One ``d x d`` float64 matrix per LayerNorm/RMSNorm layer and per stream. With
    ``memory_budget`` they are grouped (:func:`satmon.probing.memory_plan.plan_memory`) and the batches
    run once per group (DyT and gate counts in the first pass only); every pass starts from the same
    state, so the readings equal the one-pass readings bit for bit (on deterministic kernels). The
    plan is logged at INFO on ``satmon.probing.passes`` before the first pass (printed with ``verbose``);
    a budget that cannot hold one matrix and its readout raises ``ValueError`` before any forward.

    Readings (see :class:`~satmon.results.probe_report.ProbeReport`): DyT saturation, the offset statistics
    and a verdict (``NON-FINITE`` when any parameter of ``model`` is NaN/inf; its ``reading`` is the
    :class:`~satmon.results.reading.Reading` it was made from); LayerNorm/RMSNorm
    alignment of ``v* = gain^-1/||gain^-1||`` with the bottom of the output covariance, the null
    space, the norm type; the residual stream's ``sigma_min`` ratios; with ``twin``, the init-gap.
    Statistics are float64 whatever the forward's dtype. bf16 LayerNorm outputs (a bf16 model) lift
    the kernel to ~1e-6, norm type ``"undetermined"``; under autocast LayerNorm runs in float32.

    Settings. The rule (``threshold``, ``level``, ``collapse_threshold``, ``product``, ``caveat`` or
    ``calibration``) and the selection (``include``, ``exclude``, ``gating_mapping``) come from one
    :class:`satmon.Settings`: pass ``settings=`` (the live probe and replay pass the run's), or its
    fields as keyword ``options`` (``probe(model, batches, threshold=0.45)``), not both. The window,
    watch and abort options of a Settings do not apply to a probe.

    Args:
        model: any ``nn.Module`` (a LightningModule too); it is not moved.
        batches: see above.
        settings: the rule and the selection (default: the study's rule, every DyT and norm layer).
        forward_fn: ``forward_fn(model, batch)`` runs one batch.
        layers: which discovered norm layers to read: a list of names, a regex or a predicate
            ``(name, module) -> bool``; default all. The final norm (the last norm outside the
            blocks) is always read. (``include`` / ``exclude`` of the settings widen/narrow discovery
            itself: :func:`satmon.model.map.find_norm_layers`.)
        blocks: names of the residual blocks, when :func:`satmon.model.map.find_blocks` finds none or
            the wrong ones. ``X_0`` is the first block's input.
        device: where batches go; default the device of the model's first parameter.
        autocast_dtype: run the forward under ``torch.autocast(device.type, dtype)``, e.g. ``torch.bfloat16``.
        max_batches: use at most this many batches.
        twin: a random-init instance of the same architecture (same layer names): probed on the same
            batches, then :func:`satmon.functional.dead_directions.init_gap` per LayerNorm/RMSNorm layer.
        max_dim: LayerNorm/RMSNorm layers and streams wider than this are skipped, with a warning.
        train_mode: run the forward in train mode instead of eval mode.
        memory_budget: most bytes the probe's matrices may hold at once (an int, or ``"2GiB"``,
            ``"512MB"``); ``None``: no limit, one pass.
        verbose: print the memory plan before the first pass.
        step: the step the verdict is taken at (replay: the checkpoint's global step).
        source: the verdict's :class:`~satmon.results.verdict.Source` (``Source.REPLAY`` for ``satmon replay``).
        **options: :class:`satmon.Settings` fields, when ``settings`` is not given: ``threshold``,
            ``level``, ``collapse_threshold``, ``product``, ``caveat``, ``calibration``, ``include``,
            ``exclude``, ``gating_mapping`` (see :class:`satmon.SaturationMonitor`).

    Returns:
        A :class:`~satmon.results.probe_report.ProbeReport`.

    Example:
        >>> import torch
        >>> from satmon.demos.gpt import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> model = GPT(GPTConfig(norm="layernorm", n_layers=2))
        >>> report = probe(model, torch.randint(0, 256, (16, 64)))
        >>> report.norm_type, report.layers["ln_f"].null_dim, report.layers["ln_f"].alignment > 0.9999
        ('layernorm-like', 1, True)
        >>> report.sigma_min.blocks, report.sigma_min.valid, report.plan.passes
        (('embedding', 'blocks.0', 'blocks.1'), True, 1)
    """
    t0 = time.perf_counter()
    s = settings_from(settings, options, owner="probe", own=OWN_OPTIONS)
    check_options(
        max_dim=max_dim,
        max_batches=max_batches,
        autocast_dtype=autocast_dtype,
        forward_fn=forward_fn,
        step=step,
        source=source,
    )
    device = torch.device(device) if device is not None else _model_device(model)
    first, batch_list = peek_batch(take_batches(batches, max_batches, keep=twin is not None))
    if first is not None:  # layers convert_to_dyt just made run the first batch; those that cannot are put back
        check_conversion(model, to_device(first, device), forward_fn or feed)
    targets = find_probe_targets(
        model, layers, s.include, s.exclude, blocks, max_dim, budgeted=memory_budget is not None
    )
    plan = plan_memory([(name, t.width) for name, t in targets.taps.items()], memory_budget)
    log.info("%s", plan.describe())
    if verbose:
        print(plan.describe(), flush=True)
    if plan.passes > 1 and not isinstance(batch_list, list):
        batch_list = list(batch_list)  # run once per group of the plan
    example = to_device(first, device) if first is not None and targets.dyt else None
    gating, hooks = _dyt_hooks(model, targets.dyt, s, example, forward_fn or feed)
    run = _Run(model, batch_list, device, forward_fn or feed, train_mode, autocast_dtype)
    results = _read_all(run, targets, plan, hooks)
    dyt = _read_dyt(model, targets.dyt, hooks, s, step=step, source=Source(source).value)
    _warn_skipped(targets.skipped)
    twin_report = None
    if twin is not None:
        twin_report = probe(
            # only the LayerNorm/RMSNorm readings are compared: the twin needs no DyT hooks or gating trace
            twin,
            batch_list,
            settings=s,
            forward_fn=forward_fn,
            layers=list(targets.norms),
            blocks=targets.block_names or None,
            autocast_dtype=autocast_dtype,
            max_dim=max_dim,
            train_mode=train_mode,
            memory_budget=memory_budget,
        )
    return _assemble(targets, results, dyt, gating, run.batches, plan, twin_report, t0)


# -------------------------------------------------------------------------------------- the passes
@dataclass
class _Run:
    """The forward passes: model, calibration batches and how they are fed."""

    model: nn.Module
    batch_iter: Iterable[Any]
    device: torch.device
    feed: ForwardFn
    train_mode: bool
    autocast_dtype: torch.dtype | None
    batches: int = 0

    def one_pass(self, hooksets: list[Any]) -> None:
        """Every batch once, with ``hooksets`` attached; the model state is restored afterwards."""
        n = 0
        try:
            for h in hooksets:
                h.attach()
            with frozen_forward(
                self.model, self.device, train_mode=self.train_mode, autocast_dtype=self.autocast_dtype
            ):
                for batch in self.batch_iter:
                    self.feed(self.model, to_device(batch, self.device))
                    n += 1
        finally:
            for h in hooksets:
                h.detach()
        if n == 0:
            raise ValueError(
                "Expected at least one batch, got none. Pass a tensor, a dict, or a non-empty iterable of batches."
            )
        self.batches = n  # the same every pass: several passes run over a list


@dataclass
class _Results:
    """What the passes read, collected while they run: the LayerNorm/RMSNorm readings and the streams' spectra."""

    readings: dict[str, LayerReading] = field(default_factory=dict)
    spectra: dict[str, GramSpectrum] = field(default_factory=dict)


def _read_all(run: _Run, targets: ProbeTargets, plan: MemoryPlan, hooks: ReadingHooks | None) -> _Results:
    """One pass per group of the plan (the first also counts the DyT layers); each group read, then freed."""
    results = _Results()
    dyt = hooks.hooksets if hooks is not None else []
    for i, group in enumerate(plan.groups or ((),)):
        taps = CovarianceTaps([targets.taps[name] for name in group])
        run.one_pass([taps, *dyt] if i == 0 else [taps])
        for name in group:
            _read_tap(name, taps.taps[name], targets, results)
    return results


def _read_tap(name: str, tap: CovarianceTap, targets: ProbeTargets, results: _Results) -> None:
    """The reading of one covariance tap; its matrix is freed before the next one is read."""
    acc = tap.ready()
    if acc is None:
        targets.skipped[name] = tap.skipped
        return
    if name not in targets.norms:
        results.spectra[name] = gram_spectrum(acc)
        tap.release()
        return
    layer = targets.norms[name]
    try:
        # the gain the layer applies after normalising, read from what it computes (1 + weight for Gemma)
        gain = effective_affine(layer.module, acc.dim, axis=layer.axis).gain.to(acc.total.device)
    except ValueError as err:
        targets.skipped[name] = str(err)
        tap.release()
        return
    cov, count, nonfinite, dim = acc.covariance(), acc.count, acc.nonfinite_rows, acc.dim
    del acc  # with the tap's reference: the d x d sums are freed before eigh needs its workspace
    tap.release()
    if count <= dim:  # the centred covariance has rank <= count - 1 < dim: some direction is a kernel whatever the norm
        note = (
            f"{count} token(s) for {dim} channels: the output covariance has rank at most "
            f"{count - 1} < {dim}, so a kernel "
            f"is there whatever the norm and no alignment is a reading; it needs more than {dim} tokens (at least "
            f"{dim + 1 - count} more; positions x batch for a channels-first layer)"
        )
        results.readings[name] = LayerReading(
            name, layer.kind, dim, tokens=count, norm_type="undetermined", nonfinite=nonfinite, note=note
        )
        return
    r = alignment(cov, gain)
    norm_type, note = classify_norm_type(r), ""
    results.readings[name] = LayerReading(
        name,
        layer.kind,
        dim,
        tokens=count,
        alignment=r.cosine,
        null_projection=r.null_projection,
        null_dim=r.null_dim,
        depth=r.depth,
        depth_diag=r.depth_diag,
        lambda_min_rel=r.lambda_min_rel,
        n_degenerate=r.n_degenerate,
        norm_type=norm_type,
        nonfinite=nonfinite,
        note=note,
    )


# ------------------------------------------------------------------------------------ DyT and gates
#: the last gating report per model (replay probes one model per architecture with each checkpoint's weights in
#: it, the live probe the training model): traced again only when the modules or the question change
_GATING: weakref.WeakKeyDictionary[nn.Module, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def _batch_signature(batch: Any) -> Any:
    """What a traced forward's path can depend on, short of the values: types, shapes and dtypes."""
    if isinstance(batch, torch.Tensor):
        return ("tensor", tuple(batch.shape), batch.dtype, batch.device.type)
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, tuple(_batch_signature(b) for b in batch))
    if isinstance(batch, dict):
        return ("dict", tuple((k, _batch_signature(v)) for k, v in batch.items()))
    return (type(batch).__name__,)


def _gating(
    model: nn.Module, names: list[str], mapping: dict[str, str] | None, example: Any, forward_fn: ForwardFn | None
) -> Any:
    """:func:`satmon.model.gating.detect_gating`, once per model and question: the same module tree (names and
    types), norm names, mapping, forward function and batch shapes give the same report (the trace reads
    which module's output feeds which, not values)."""
    try:
        key = (
            tuple((n, type(m)) for n, m in model.named_modules()),
            tuple(names),
            tuple(sorted((mapping or {}).items())),
            forward_fn,
            _batch_signature(example),
        )
        hash(key)
    except TypeError:  # an unhashable mapping value or batch part: no cache
        key = None
    cached = _GATING.get(model) if key is not None else None
    if cached is not None and cached[0] == key:
        return cached[1]
    found = detect_gating(model, norm_names=names, mapping=mapping, example_input=example, forward_fn=forward_fn)
    if key is not None:
        _GATING[model] = (key, found)
    return found


def _dyt_hooks(
    model: nn.Module, dyt: list[NormLayer], s: Settings, example: Any, forward_fn: ForwardFn
) -> tuple[GatingInfo | None, ReadingHooks | None]:
    """The gating of the DyT layers and the window's hook sets on them (offset statistics on every batch)."""
    if not dyt:
        return None, None
    found = _gating(model, [l.name for l in dyt], s.gating_mapping, example, forward_fn)
    # a probe on one rank never waits for the others: nothing it reads syncs
    hooks = ReadingHooks(model, dyt, found, level=s.level, product=s.product, offset=True, distributed=False)
    hooks.offset_enabled = True
    return GatingInfo.of(found), hooks


def _read_dyt(
    model: nn.Module, dyt: list[NormLayer], hooks: ReadingHooks | None, s: Settings, *, step: int, source: str
) -> _DytReadings:
    """The DyT layers' readings, the reading and the verdict (this process only: no collective)."""
    if hooks is None:
        return _DytReadings({}, None, None, None)
    reading = hooks.read(step=step, source=source, sync=False, nonfinite_weights=nonfinite_parameters(model))
    layers = {}
    for layer in dyt:
        c, a = reading.counts[layer.name], reading.alphas[layer.name]
        dim = layer.channels or 0
        # inputs only
        layers[layer.name] = LayerReading(
            layer.name,
            layer.kind,
            dim,
            tokens=c.total // dim if dim else 0,
            saturation=c.saturated / c.total if c.total else None,
            alpha=a,
            nonfinite=c.nonfinite - (not math.isfinite(a)),
        )
    return _DytReadings(layers, reading.pooled, verdict_of(reading, s.rule), reading)


class _DytReadings(NamedTuple):
    """The DyT layers' readings, their pooled saturation, the verdict (``None``: no element counted), the reading."""

    readings: dict[str, LayerReading]
    pooled: float | None
    verdict: Verdict | None
    reading: Reading | None


# ------------------------------------------------------------------------------------------ report
def _warn_skipped(skipped: dict[str, str]) -> None:
    if skipped:
        warnings.warn(
            "satmon probe: no reading for "
            + "; ".join(f"{n} ({why})" for n, why in skipped.items())
            + (". Raise `max_dim` or choose" if any("max_dim" in why for why in skipped.values()) else ". Choose")
            + " layers with `layers=` / blocks with `blocks=`.",
            stacklevel=3,
        )


def _assemble(
    targets: ProbeTargets,
    results: _Results,
    dyt: _DytReadings,
    gating: GatingInfo | None,
    n_batches: int,
    plan: MemoryPlan,
    twin: ProbeReport | None,
    t0: float,
) -> ProbeReport:
    """The report, built once: every chosen layer's reading in registration order (a layer the passes did not
    read keeps an empty one), its init-gap against the ``twin``'s readings, the wall time since ``t0``."""
    readings = {}
    for l in targets.chosen:
        reading = results.readings.get(l.name) or dyt.readings.get(l.name)
        readings[l.name] = reading if reading is not None else LayerReading(l.name, l.kind, l.channels or 0)
    gaps = init_gaps(readings, twin.layers) if twin is not None else None
    if gaps:
        readings = {n: replace(r, init_gap=gaps[n]) if n in gaps else r for n, r in readings.items()}
    sigma = SigmaMinReading.from_spectra(targets.streams, results.spectra)
    norm_type, note = model_norm_type(readings)
    if EMBEDDING in results.spectra:
        tokens = results.spectra[EMBEDDING].tokens
    else:
        tokens = max((l.tokens for l in readings.values()), default=0)
    return ProbeReport(
        layers=readings,
        sigma_min=sigma,
        norm_type=norm_type,
        norm_type_note=note,
        saturation=dyt.pooled,
        verdict=dyt.verdict,
        gating=gating,
        init_gap=gaps,
        tokens=tokens,
        batches=n_batches,
        skipped=targets.skipped,
        plan=plan,
        elapsed_s=time.perf_counter() - t0,
        reading=dyt.reading,
    )


# ------------------------------------------------------------------------------------------ inputs
def check_options(**options: Any) -> None:
    """Check :func:`probe`'s own options (the rule and the selection are checked by :class:`satmon.Settings`).

    The live probe calls it when it is made, so a wrong option fails before training, not at the first probe.

    Example:
        >>> check_options(max_dim=0)
        Traceback (most recent call last):
        ...
        ValueError: Expected `max_dim` to be a positive int (widest layer to read), got 0.
    """
    max_dim, max_batches = options.get("max_dim", 1), options.get("max_batches")
    autocast_dtype, forward_fn = options.get("autocast_dtype"), options.get("forward_fn")
    step, source = options.get("step", 0), options.get("source", Source.PROBE)
    if isinstance(max_dim, bool) or not isinstance(max_dim, int) or max_dim < 1:
        raise ValueError(f"Expected `max_dim` to be a positive int (widest layer to read), got {max_dim!r}.")
    if max_batches is not None and (
        isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1
    ):
        raise ValueError(f"Expected `max_batches` to be a positive int or None, got {max_batches!r}.")
    if autocast_dtype is not None and not isinstance(autocast_dtype, torch.dtype):
        raise TypeError(
            f"Expected `autocast_dtype` to be a torch.dtype (e.g. torch.bfloat16) or None, got {autocast_dtype!r}."
        )
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError(
            f"Expected `forward_fn` to be a callable (model, batch) -> Any, got {type(forward_fn).__name__}: "
            "e.g. forward_fn=lambda model, batch: model(batch[0])."
        )
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"Expected `step` to be an int (the step the verdict is taken at), got {step!r}.")
    if source not in {s.value for s in Source}:  # a Source is a str: its value compares equal
        raise ValueError(
            "Expected `source` to be a satmon.results.verdict.Source "
            f"({', '.join(s.value for s in Source)}), got {source!r}."
        )


#: :func:`probe`'s own keyword arguments (everything else it takes is a :class:`satmon.Settings` field).
OWN_OPTIONS: tuple[str, ...] = tuple(
    n for n, p in inspect.signature(probe).parameters.items() if p.kind is p.KEYWORD_ONLY and n != "settings"
)


def _model_device(model: nn.Module) -> torch.device:
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device
    return torch.device("cpu")
