"""Forward hooks on DyT layers that count saturation into a :class:`~satmon.observe.counters.SaturationCounter`,
and the scheduling of those counts (:class:`CountQueue`): when each input is counted, and when the
queued sums are folded into the counter's states. No host sync on the hooks' path.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from satmon.observe.counters import SaturationCounter
from satmon.observe.hookset import HookSet, recomputing
from satmon.model.discovery import NormLayer
from satmon.results.verdict import LayerCounts
from satmon.functional.saturation import (
    alpha_broadcast_problem,
    module_product_dtype,
    saturation_counts,
    saturation_sums,
    saturation_threshold,
    saturation_threshold_host,
)

__all__ = ["CountQueue", "HookReadings", "SaturationCounter", "SaturationHooks"]

#: a loop that never reads its counts still holds little: the queue folds itself past this many calls
_MAX_PENDING = 16384


class HookReadings(NamedTuple):
    """Per-layer readings of :class:`SaturationHooks`, on the host."""

    saturated: list[int]
    total: list[int]
    nonfinite: list[int]
    alphas: list[float]

    def layer_counts(self, names: Sequence[str]) -> dict[str, LayerCounts]:
        """Counts by layer name for :func:`satmon.results.verdict.build_verdict`; a non-finite ``alpha`` counts as
        a non-finite input of its layer (its threshold is NaN: nothing would read as saturated)."""
        return {n: LayerCounts(s, t, b + (not math.isfinite(a)))
                for n, s, t, b, a in zip(names, self.saturated, self.total, self.nonfinite, self.alphas)}

    def fractions(self, names: Sequence[str]) -> dict[str, float]:
        """Saturation by layer name (layers that counted nothing left out)."""
        return {n: s / t for n, s, t in zip(names, self.saturated, self.total) if t}


class CountQueue:
    """When inputs are counted: at once in the hook, or kept and counted together after the forward.

    Each counted input runs the four tensor ops of
    :func:`~satmon.functional.saturation.saturation_sums` and queues their two 0-dim sums;
    :meth:`flush` folds every queued call into the counter with one ``update`` (a handful of tensor
    ops, no host sync). With ``keep_inputs`` a hook only keeps ``x`` and ``alpha`` by reference (with
    their version counters) and :meth:`count_kept` counts them after the forward: inside a CPU
    training step each op costs several times its warm cost, and autograd holds the input anyway.
    A kept input or ``alpha`` changed in place before its count is skipped with a warning, and
    from then on inputs are counted at once.

    Args:
        counter: where the counts go.
        level: the saturation level (``|alpha * x| > level``).
        keep_inputs: keep inputs until :meth:`count_kept` (a loop must call it after each forward,
            before the optimizer step).
    """

    def __init__(self, counter: SaturationCounter, level: float, keep_inputs: bool = False, product: str = "module") -> None:
        self.counter, self.level, self.keep_inputs, self.product = counter, float(level), keep_inputs, product
        self._pending: list[tuple[int, Tensor, Tensor, int]] = []
        self._kept: list[tuple[int, Tensor, int, Tensor, int]] = []  # (layer, x, x's version, alpha, alpha's version)
        self._kept_layers: set[int] = set()
        self._buffers: dict[torch.Size, Tensor] = {}
        self._thresholds: dict[int, tuple[tuple, Tensor | float]] = {}

    def add_input(self, index: int, x: Tensor, alpha: Tensor) -> None:
        """Count the eager forward input ``x`` of layer ``index`` now, or keep it for :meth:`count_kept`."""
        version = None
        if self.keep_inputs:
            try:
                version = x._version
            except RuntimeError:  # an inference tensor: nothing to check a kept reference against
                pass
        if version is None:
            self._count_now(index, x, alpha)
            return
        if index in self._kept_layers:  # a second forward before the count: hold one forward's inputs at most
            self.count_kept()
        self._kept.append((index, x, version, alpha, alpha._version))
        self._kept_layers.add(index)

    def _count_now(self, index: int, x: Tensor, alpha: Tensor) -> None:
        abs_sum, sat = saturation_sums(x, self.threshold(index, alpha, x.dtype), self._scratch(x))
        self._pending.append((index, abs_sum, sat, x.numel()))
        if len(self._pending) >= _MAX_PENDING:
            self.flush()

    def count_kept(self) -> None:
        """Count the kept inputs (no host sync), skipping any changed in place since its forward."""
        kept, self._kept = self._kept, []
        self._kept_layers.clear()
        stale = 0
        for index, x, version, alpha, alpha_version in reversed(kept):  # the latest first: still in cache
            if x._version != version or alpha._version != alpha_version:
                stale += 1
                continue
            self._count_now(index, x, alpha)
        if stale:
            self.keep_inputs = False
            warnings.warn(
                f"satmon: {stale} kept DyT input(s) or their alpha changed in place between the forward and the count "
                "(count_kept() must run before the optimizer step); they were skipped, and from now on every input is "
                "counted in its hook.", RuntimeWarning, stacklevel=2)

    def threshold(self, index: int, alpha: Tensor, dtype: torch.dtype = torch.float32) -> Tensor | float:
        """Layer ``index``'s threshold on ``|x|`` of ``dtype``, recomputed only when ``alpha`` or ``dtype`` changed.

        ``alpha`` changes only in place (optimizer steps, loads), which bumps its version counter, so
        a cache keyed on ``(data_ptr, _version)`` needs no device read. A scalar CPU ``alpha`` is read
        with ``.item()`` (nothing to wait for) and its threshold computed in plain Python.
        """
        key = (alpha.data_ptr(), alpha._version, dtype)
        cached = self._thresholds.get(index)
        if cached is None or cached[0] != key:
            if alpha.device.type == "cpu" and alpha.numel() == 1:
                t: Tensor | float = saturation_threshold_host(alpha.item(), self.level, dtype=dtype, product=self.product,
                                                              product_dtype=module_product_dtype(alpha, dtype))
            else:
                t = saturation_threshold(alpha, self.level, dtype=dtype, product=self.product)
            cached = self._thresholds[index] = (key, t)
        return cached[1]

    def refresh_thresholds(self, alphas: Sequence[Tensor]) -> None:
        """The thresholds of all layers with a scalar accelerator ``alpha`` in one batched op (once per step)."""
        # FSDP2-sharded alphas (DTensors here) are left to their hooks, which read them whole
        scalar = [i for i, a in enumerate(alphas) if a.numel() == 1 and a.device.type != "cpu" and not hasattr(a, "full_tensor")]
        if not scalar or len({alphas[i].device for i in scalar}) != 1:
            return
        # the threshold depends on the inputs' dtype: the one each layer's cached threshold was made for
        groups: dict[tuple, list[int]] = {}
        for i in scalar:
            dtype = self._thresholds[i][0][2] if i in self._thresholds else torch.float32
            groups.setdefault((dtype, module_product_dtype(alphas[i], dtype)), []).append(i)
        for (dtype, pdt), group in groups.items():
            with torch.no_grad():
                stacked = torch.stack([alphas[i].detach().reshape(()) for i in group])  # (L,)
                t = saturation_threshold(stacked, self.level, dtype=dtype, product=self.product, product_dtype=pdt)
            for j, i in enumerate(group):
                a = alphas[i]
                self._thresholds[i] = ((a.data_ptr(), a._version, dtype), t[j : j + 1])

    def _scratch(self, x: Tensor) -> Tensor | None:
        """A float32 work buffer per input shape, on CPU only (GPU allocations are cached already)."""
        if not x.is_cpu:
            return None
        buf = self._buffers.get(x.shape)
        if buf is None:
            buf = self._buffers[x.shape] = torch.empty(x.shape, dtype=torch.float32)
        return buf

    def flush(self) -> None:
        """Count what is kept, then fold every queued call into the counter (one ``update``, no host sync)."""
        if self._kept:
            self.count_kept()
        pending, self._pending = self._pending, []
        if not pending:
            return
        index, abs_sums, sats, numels = zip(*pending)
        n = len(pending)
        sums = torch.stack(abs_sums + sats)  # (2n,), float64 if any call summed in float64
        device = self.counter.total.device
        # non_blocking: the rare self-flush in the middle of a step stays free of a sync
        idx = torch.tensor(index, dtype=torch.int64).to(device, non_blocking=True)
        self.counter.update(idx, saturated=sums[n:].to(torch.int64), total=torch.tensor(numels, dtype=torch.int64),
                            nonfinite=(~torch.isfinite(sums[:n])).to(torch.int64))

    def clear(self) -> None:
        """Drop what is queued or kept (with a counter reset)."""
        self._pending, self._kept = [], []
        self._kept_layers.clear()


class SaturationHooks(HookSet):
    """Forward hooks on DyT layers that count ``|alpha * x| > level`` into a :class:`SaturationCounter`.

    Eager hooks hand each input to a :class:`CountQueue` (four tensor ops, or a kept reference on
    CPU training with ``keep_inputs``); compiled hooks and float64 inputs count in place with tensor
    ops only. No ``.item()`` on the way. Read the counts with :meth:`read` (one host transfer).

    A layer whose ``alpha * x`` would not keep its input's shape (a per-channel ``alpha`` that its
    forward reshapes, invisible to the hook) is refused rather than stopping training: one
    ``RuntimeWarning`` names it, :attr:`refused` keeps the reason, and it is counted no further.

    Args:
        layers: DyT layers (from :func:`satmon.model.discovery.find_dyt_layers`).
        counter: where counts go (its layer ``i`` is ``layers[i]``); its ``level`` is used.
        keep_inputs: see :class:`CountQueue`.
        refused: layer name -> reason, shared with another hook set on the same layers (the screen's
            window and watch hooks) so that a refused layer warns once; default a new dict.

    Example:
        >>> from satmon import DyT
        >>> from satmon.model.discovery import find_dyt_layers
        >>> model = torch.nn.Sequential(DyT(4, alpha_init=2.0))
        >>> layers = find_dyt_layers(model)
        >>> hooks = SaturationHooks(layers, SaturationCounter(len(layers))).attach()
        >>> _ = model(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
        >>> hooks.read(sync=False).saturated  # |2 * 1.5|, |2 * -3.0| > 2
        [2]
        >>> hooks.detach()
    """

    def __init__(self, layers: Sequence[NormLayer], counter: SaturationCounter, keep_inputs: bool = False,
                 refused: dict[str, str] | None = None) -> None:
        if len(layers) != counter.num_layers:
            raise ValueError(f"Expected a counter with {len(layers)} layers, got {counter.num_layers}.")
        super().__init__()
        self.layers = list(layers)
        self.counter = counter
        self.queue = CountQueue(counter, counter.level, keep_inputs, product=counter.product)
        self.refused: dict[str, str] = {} if refused is None else refused

    def _make_hook(self, index: int):
        # FSDP2 (alpha a DTensor outside the forward) gathers alpha into fresh storage each forward, keeps its
        # version and frees it after: neither a kept reference nor the (data_ptr, version) threshold cache holds
        sharded = hasattr(self.layers[index].module.alpha, "full_tensor")
        name = self.layers[index].name

        def hook(mod: nn.Module, args: tuple, output: Tensor) -> None:
            if not self.enabled or not args or name in self.refused or recomputing():
                return
            x, alpha = args[0], mod.alpha
            # a per-channel alpha matching x's trailing dims broadcasts; anything else is checked in full
            if alpha.numel() != 1 and alpha.shape != x.shape[-alpha.dim():]:
                reason = alpha_broadcast_problem(alpha.shape, x.shape)
                if reason is not None:
                    self._refuse(name, reason)
                    return
            if x.dtype == torch.float64 or sharded or torch.compiler.is_compiling():
                # compiled: the whole update is in the graph (no Python-side queue); float64: the product path
                with torch.no_grad():
                    sat, bad = saturation_counts(x, alpha, self.counter.level, product=self.counter.product)
                    self.counter.add_counts(index, sat, x.numel(), bad)
                return
            self.queue.add_input(index, x, alpha)  # saturation_sums detaches x: no grad-mode switch

        return hook

    def _register(self) -> list[RemovableHandle]:
        return [l.module.register_forward_hook(self._make_hook(i)) for i, l in enumerate(self.layers)]

    def _refuse(self, name: str, reason: str) -> None:
        """Stop counting layer ``name`` for the rest of the run, with one warning that says how to resolve it."""
        self.refused[name] = reason
        warnings.warn(
            f"satmon: DyT layer {name!r} is not counted for the rest of the run: {reason}, so satmon cannot apply it "
            "as `alpha * x` (a forward that reshapes alpha, e.g. alpha.view(-1, 1, 1) for channels-first input, is "
            f'invisible to satmon). Leave the layer out with exclude=r"^{re.escape(name)}$" (and, if another module '
            "applies an alpha that broadcasts, select that one with include=), or store alpha in the shape the "
            "forward uses (e.g. (C, 1, 1)).", RuntimeWarning, stacklevel=2)

    def refresh_thresholds(self) -> None:
        """Batched thresholds of these layers' scalar accelerator ``alpha`` (once per optimizer step)."""
        self.queue.refresh_thresholds([l.module.alpha for l in self.layers])

    def count_kept(self) -> None:
        """Count the inputs kept since the forward (call after each forward, before the optimizer step)."""
        self.queue.count_kept()

    def flush(self) -> None:
        """Fold everything queued into the counter's states."""
        self.queue.flush()

    def reset(self) -> None:
        """Zero the counts and drop anything queued."""
        self.queue.clear()
        self.counter.reset()

    def read(self, sync: bool = True) -> HookReadings:
        """Per-layer counts and ``|alpha|`` on the host, in one transfer.

        Args:
            sync: sum the counts over DDP ranks first (a collective: every rank must call it at the
                same point); ``False`` reads this process's counts only (the probe).
        """
        self.flush()
        c = self.counter
        with c.sync_context(should_sync=sync, should_unsync=True):
            counts = torch.stack([c.saturated, c.total, c.nonfinite]).to(torch.float64)  # exact below 2**53
        packed = torch.cat([counts, self.alphas().to(counts.device).unsqueeze(0)]).cpu().tolist()
        sat, total, bad = ([int(v) for v in row] for row in packed[:3])
        return HookReadings(sat, total, bad, packed[3])

    def alphas(self) -> Tensor:
        """Current ``|alpha|`` of each layer as one float64 device tensor (mean for per-channel alpha).

        An FSDP2-sharded ``alpha`` (a ``DTensor`` outside the forward) is gathered whole first: a
        collective, so every rank must call this at the same point (as :meth:`read` with ``sync``).
        """
        return torch.stack([whole(l.module.alpha).detach().to(torch.float64).abs().mean() for l in self.layers])

    def local_alphas(self) -> Tensor:
        """Per layer, ``sum |alpha|`` over this process's elements (its shard under FSDP2; 0 for an empty
        one): finite exactly when they all are. No collective: the per-step non-finite check."""
        alphas = (l.module.alpha for l in self.layers)
        return torch.stack([(a.to_local() if hasattr(a, "to_local") else a).detach().to(torch.float64).abs().sum()
                            for a in alphas])


def whole(t: Tensor) -> Tensor:
    """``t`` itself, or the whole tensor of a sharded ``DTensor`` (FSDP2 parameters outside the forward; a collective)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t

