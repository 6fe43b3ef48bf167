"""The hook sets every screening path counts with, read together into one :class:`~satmon.results.reading.Reading`.

:class:`satmon.Screen` (the live window) and :func:`satmon.probe` (calibration batches; ``satmon replay``
and the live probe call it) both make a :class:`ReadingHooks` on the model's DyT layers:

- saturation (:class:`~satmon.observe.saturation.SaturationHooks`), on every counted forward;
- offset statistics (:class:`~satmon.observe.offset.OffsetHooks`), on the forwards their owner enables:
  sampled window steps, every batch of a probe;
- gate statistics (:class:`~satmon.observe.gate.GateHooks`) on the gated MLPs the DyT layers feed.

:meth:`ReadingHooks.read` reads all three at once (one call per set; summed over ranks with ``sync``)
and adds what the owner knows (the step, the window, the loss trend, the model's non-finite weights),
so the live verdict and a checkpoint's verdict come from the same counts by the same rule
(:func:`satmon.results.reading.verdict_of`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from satmon.model.discovery import NormLayer, strip_wrappers
from satmon.observe.counters import SaturationCounter
from satmon.observe.gate import GateCounter, GateHooks
from satmon.observe.hookset import HookSet, paused
from satmon.observe.offset import OffsetCounter, OffsetHooks, offset_driven
from satmon.observe.saturation import HookReadings, SaturationHooks
from satmon.results.gating import GatingInfo
from satmon.results.reading import Reading

__all__ = ["ReadingHooks", "nonfinite_parameters"]


class ReadingHooks:
    """Saturation, offset and gate hooks on a model's DyT layers, read into one
    :class:`~satmon.results.reading.Reading`.

    Args:
        model: the model (the gate hooks find the gated MLPs' modules in it).
        layers: the DyT layers (:func:`satmon.model.map.find_dyt_layers`).
        gating: what gated-MLP detection found (``None``: no gate hooks).
        level: the saturation level (``|alpha * x| > level``).
        product: ``"module"`` or ``"exact"`` (:class:`~satmon.observe.counters.SaturationCounter`).
        offset: also make the offset hooks (off until :attr:`offset_enabled` is set).
        keep_inputs: see :class:`~satmon.observe.saturation.SaturationHooks`.
        distributed: the states may sum over ranks when read with ``sync`` (a probe on one rank passes ``False``:
            its reads then never wait for other ranks).
        root: the model whose forward's end counts kept inputs (see
            :class:`~satmon.observe.saturation.SaturationHooks`).

    Example:
        >>> from satmon import DyT
        >>> from satmon.model.map import find_dyt_layers
        >>> model = torch.nn.Sequential(DyT(4, alpha_init=2.0))
        >>> hooks = ReadingHooks(model, find_dyt_layers(model), None, level=2.0, distributed=False)
        >>> hooks.offset_enabled = True
        >>> _ = hooks.attach()
        >>> _ = model(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
        >>> r = hooks.read(step=0, source="probe", sync=False)
        >>> r.counts["0"], r.offset["0"]["saturated"]
        (LayerCounts(saturated=2, total=4, nonfinite=0), 0.5)
        >>> hooks.detach()
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[NormLayer],
        gating: GatingInfo | None,
        *,
        level: float,
        product: str = "module",
        offset: bool = True,
        keep_inputs: bool = False,
        distributed: bool = True,
        root: nn.Module | None = None,
    ) -> None:
        if not layers:
            raise ValueError("Expected at least one DyT layer to read, got none.")
        self.layers = list(layers)
        self.gating = gating
        device = self.layers[0].module.alpha.device
        n = len(self.layers)
        self.saturation = SaturationHooks(
            self.layers, SaturationCounter(n, level=level, product=product).to(device), keep_inputs, root=root
        )
        # the hook sets share one record of refused layers: each warns once per run
        self.offset = (
            OffsetHooks(self.layers, OffsetCounter(n).to(device), level, self.saturation.refused) if offset else None
        )
        pairings = gating.pairings if gating is not None else {}
        self.gate = GateHooks(model, gating, GateCounter(len(pairings)).to(device)) if pairings else None
        self.level, self.product, self.distributed = float(level), product, bool(distributed)

    @property
    def names(self) -> list[str]:
        return [l.name for l in self.layers]

    @property
    def hooksets(self) -> list[HookSet]:
        return [h for h in (self.saturation, self.offset, self.gate) if h is not None]

    @property
    def offset_enabled(self) -> bool:
        return self.offset is not None and self.offset.enabled

    @offset_enabled.setter
    def offset_enabled(self, on: bool) -> None:
        if self.offset is not None:
            self.offset.enabled = bool(on)

    def attach(self) -> ReadingHooks:
        for h in self.hooksets:
            h.attach()
        return self

    def detach(self) -> None:
        for h in self.hooksets:
            h.detach()

    @property
    def attached(self) -> bool:
        return self.saturation.attached

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No counting inside the block."""
        with paused(*self.hooksets):
            yield

    def read(
        self,
        *,
        step: int,
        source: str,
        sync: bool = True,
        counts: HookReadings | None = None,
        layers: Sequence[NormLayer] | None = None,
        window: int = 0,
        planned_window: int = 0,
        offset_every: int = 0,
        loss: Mapping[str, Any] | None = None,
        nonfinite_weights: Mapping[str, int] | None = None,
        notes: Sequence[str] = (),
    ) -> Reading:
        """Every hook set's counts as one reading (with ``sync``, summed over ranks: every rank must call it).

        Args:
            step, source, window, planned_window, offset_every, loss, nonfinite_weights, notes: what the owner
                knows beside the counts (:class:`~satmon.results.reading.Reading`'s fields).
            sync: sum over ranks first (collectives, in the same order on every rank).
            counts: the saturation counts when the owner has just read them (one read, not two).
            layers: the layers of ``counts``, in its order, when the owner counted more than these hook sets
                (a layer that appeared during the window); the offset and gate readings stay these hook sets'.
        """
        names = self.names
        sync = sync and self.distributed  # a probe's hook sets never wait for other ranks
        r = counts if counts is not None else self.saturation.read(sync=sync)
        offset = self.offset.read(names, sync=sync) if self.offset is not None else {}
        if layers is not None:
            if counts is None or len(layers) != len(counts.total):
                raise ValueError(
                    f"Expected the layers of the counts passed ({0 if counts is None else len(counts.total)}), "
                    f"got {len(layers)} layers."
                )
            names = [l.name for l in layers]
        else:
            layers = self.layers
        gate = self.gate.readings(sync=sync) if self.gate is not None else {}
        return Reading(
            source=source,
            step=int(step),
            counts=r.layer_counts(names),
            level=self.level,
            product=self.product,
            alphas=dict(zip(names, r.alphas)),
            functions={l.name: l.function or "tanh" for l in layers},
            window=int(window),
            planned_window=int(planned_window),
            offset=offset,
            offset_every=int(offset_every),
            offset_driven=bool(offset) and offset_driven(offset),
            gate=gate,
            gating=GatingInfo.of(self.gating),
            loss=loss or {},
            nonfinite_weights=nonfinite_weights or {},
            refused=dict(self.saturation.refused),
            notes=tuple(notes),
        )


def nonfinite_parameters(model: nn.Module, reduce: Any = None) -> dict[str, int]:
    """Parameter name -> NaN/inf element count, for the parameters that hold any (one host transfer).

    Names are as :func:`~satmon.model.discovery.strip_wrappers` gives them (no ``module.``/``_orig_mod.``).
    Each parameter is read where it lives (its local shard under FSDP2: no gather). ``reduce`` (e.g. a
    cross-rank ``max`` of a tensor) makes every rank agree on the counts; buffers (attention masks may hold
    ``-inf`` on purpose) are not read.

    Example:
        >>> lin = torch.nn.Linear(2, 1)
        >>> with torch.no_grad():
        ...     _ = lin.bias.fill_(float("nan"))
        >>> nonfinite_parameters(lin)
        {'bias': 1}
    """
    named = [(n, p) for n, p in model.named_parameters() if p.is_floating_point() or p.is_complex()]
    if not named:
        return {}
    with torch.no_grad():
        local = [(p.to_local() if hasattr(p, "to_local") else p) for _, p in named]
        device = local[0].device
        counts = torch.stack([(~torch.isfinite(p)).sum().to(device) for p in local])  # (P,) int64, on the device
        if reduce is not None:
            counts = reduce(counts)
        values = counts.cpu().tolist()
    return {strip_wrappers(n): int(c) for (n, _), c in zip(named, values) if c}
