"""Stateful saturation counting: a torchmetrics ``Metric`` whose states sum across DDP ranks,
and the forward hooks that feed it. The live callback and :func:`satmon.probe` both use these.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from torchmetrics import Metric

from satmon.discovery import NormLayer
from satmon.functional.saturation import (
    saturation_counts,
    saturation_fraction,
    saturation_sums,
    saturation_threshold,
    saturation_threshold_host,
)
from satmon.core.hookset import HookSet

__all__ = ["SaturationCounter", "SaturationHooks"]


class SaturationCounter(Metric):
    """Per-layer counts of saturated, non-finite and total DyT input elements.

    States are int64 tensors of shape ``(L,)`` declared with ``dist_reduce_fx="sum"``: DDP ranks
    add up raw counts, never averaged fractions, so the pooled fraction over ranks equals the one
    a single process would get over the same global data.

    Deferred counts. :class:`SaturationHooks` hand each forward input to :meth:`defer_input`,
    which runs the four tensor ops of :func:`~satmon.functional.saturation.saturation_sums` and
    queues the two 0-dim sums; the counter folds all queued sums into its states in one batch
    (:meth:`flush`) when the counts are read: every reading method (``compute``, ``pooled``,
    ``per_layer``, ``sync``, so also ``sync_context``) flushes first; code that reads the state
    tensors directly calls :meth:`flush` before. With ``keep_inputs`` the ops themselves wait too:
    :meth:`defer_input` only keeps the input, and :meth:`count_inputs` counts all kept inputs
    after the forward (the callback calls it around the backward; :meth:`flush` calls it too).

    Args:
        num_layers: number of monitored layers ``L``.
        level: saturation level; an element is saturated when ``|alpha * x| > level``.
        keep_inputs: keep each input until :meth:`count_inputs` instead of counting it at once
            (see :meth:`defer_input`). Only for a loop that calls ``count_inputs`` after each
            forward, before the optimizer step; an input counted after its ``alpha`` changed is
            skipped with a warning. :class:`~satmon.SaturationMonitor` sets it when training on the CPU.

    Example:
        >>> import torch
        >>> c = SaturationCounter(num_layers=1)
        >>> c.update(0, torch.tensor([0.5, 1.5, -3.0]), torch.tensor([2.0]))
        >>> c.pooled().item(), c.per_layer().tolist()
        (0.6666666666666666, [0.6666666666666666])
    """

    full_state_update = False
    higher_is_better = None
    is_differentiable = False

    saturated: Tensor
    total: Tensor
    nonfinite: Tensor

    def __init__(self, num_layers: int, level: float = 2.0, keep_inputs: bool = False, **kwargs) -> None:
        # the hooks update the states outside ``update()``, so torchmetrics' result cache would go stale
        kwargs.setdefault("compute_with_cache", False)
        super().__init__(**kwargs)
        if num_layers < 1:
            raise ValueError(f"Expected num_layers >= 1, got {num_layers}.")
        self.level = float(level)
        for name in ("saturated", "total", "nonfinite"):
            self.add_state(name, default=torch.zeros(num_layers, dtype=torch.int64), dist_reduce_fx="sum")
        self._pending: list[tuple[int, Tensor, Tensor, int]] = []
        self._inputs: list[tuple[int, Tensor, int, Tensor, int]] = []  # (layer, x, x's version, alpha, alpha's version)
        self._input_layers: set[int] = set()
        self.keep_inputs = keep_inputs  # turned off for good when a kept input or alpha changed before its count
        self._buffers: dict[torch.Size, Tensor] = {}
        self._thresholds: dict[int, tuple[tuple, Tensor | float]] = {}

    @property
    def update_count(self) -> int:
        """Inputs handed over so far: ``update``/``accumulate`` calls plus :meth:`defer_input` calls.

        The inputs still queued or kept are counted from the queues' lengths, and added to
        torchmetrics' counter when :meth:`flush` folds them, so the hooks' path sets no attribute
        per call (on a ``Metric`` every attribute write goes through two Python ``__setattr__``
        layers: about 1.6 us warm, several times that inside a training step).
        """
        return self._update_count + len(self._pending) + len(self._inputs)

    @property
    def update_called(self) -> bool:
        """Whether any input was handed over (torchmetrics' ``compute`` warns when not)."""
        return self.update_count > 0

    def update(self, index: int, x: Tensor, alpha: Tensor) -> None:  # type: ignore[override]
        """Count one forward input ``x`` of layer ``index`` (no host sync)."""
        self.accumulate(index, x, alpha)

    def accumulate(self, index: int, x: Tensor, alpha: Tensor) -> None:
        """:meth:`update` without torchmetrics' wrapper: the hooks' path under ``torch.compile``.

        The wrapper bumps a Python counter on every call, which ``torch.compile`` guards on, so a
        hooked compiled model would recompile at every step; this path touches tensors only.
        """
        sat, bad = saturation_counts(x, alpha, self.level)
        if not torch.compiler.is_compiling():
            self._update_count += 1  # what ``update()`` records (compute() warns without it)
        self.saturated.select(0, index).add_(sat)
        self.nonfinite.select(0, index).add_(bad)
        self.total.select(0, index).add_(x.numel())

    def _count_now(self, index: int, x: Tensor, alpha: Tensor) -> None:
        """The four ops of :func:`~satmon.functional.saturation.saturation_sums`, their sums queued for :meth:`flush`."""
        abs_sum, sat = saturation_sums(x, self.threshold(index, alpha), self._scratch(x))
        self._pending.append((index, abs_sum, sat, x.numel()))
        if len(self._pending) >= 16384:  # a loop that never reads its counts still holds little
            self.flush()

    def defer_input(self, index: int, x: Tensor, alpha: Tensor) -> None:
        """Count the eager forward input ``x`` of layer ``index``: the hooks' path (no host sync).

        Runs the four tensor ops at once and queues their two 0-dim sums: the integer conversion,
        the non-finite flag and the state updates of all queued calls happen together in
        :meth:`flush`. With ``keep_inputs`` not even the ops run here: inside a CPU training step
        every op, even reading ``alpha``, costs several times its warm-loop cost (the layer's own
        forward left the caches cold), and counting all the layers' inputs in one loop after the
        forward costs markedly less (``benchmarks/overhead.py --profile-hook``). Then this call only
        keeps ``x`` and ``alpha`` by reference with their version counters, for :meth:`count_inputs`.
        During training autograd saves the DyT input for the backward anyway, so keeping it until
        the end of the forward holds no extra memory. Keeping a second input of a layer that already
        has one counts the kept ones first, so at most one forward's inputs are held. An inference
        tensor (no version counter) is counted at once.

        Args:
            index: the layer.
            x: its forward input (floating point; float64 takes :meth:`accumulate`).
            alpha: the layer's ``alpha`` (a kept input's threshold is computed when counted, from
                ``alpha``'s value then, which must still be the forward's: :meth:`count_inputs` checks).
        """
        version = None
        if self.keep_inputs:
            try:
                version = x._version
            except RuntimeError:  # an inference tensor: nothing to check a kept reference against
                pass
        if version is None:
            self._count_now(index, x, alpha)
            return
        if index in self._input_layers:
            self.count_inputs()
        self._inputs.append((index, x, version, alpha, alpha._version))
        self._input_layers.add(index)

    def count_inputs(self) -> None:
        """Count the inputs kept by :meth:`defer_input`, then drop the references (no host sync).

        A kept input or ``alpha`` changed in place since its forward (a version counter moved: the
        model edited the input, or an optimizer step ran before the count) no longer shows what the
        layer saw: that input is skipped (neither its elements nor its saturated ones are counted),
        a warning says so, and from then on every input is counted at once, in its hook.
        """
        inputs, self._inputs = self._inputs, []
        self._input_layers.clear()
        stale = 0
        for index, x, version, alpha, alpha_version in reversed(inputs):  # the latest first: still in cache
            if x._version != version or alpha._version != alpha_version:
                stale += 1
                continue
            self._count_now(index, x, alpha)
        if stale:
            self._update_count += stale  # handed over all the same (see update_count)
            self.keep_inputs = False
            warnings.warn(
                f"satmon: {stale} kept DyT input(s) or their alpha changed in place between the forward and the count "
                "(count_inputs() must run before the optimizer step); they were skipped, and from now on every input is "
                "counted in its hook.",
                RuntimeWarning,
                stacklevel=2,
            )

    def threshold(self, index: int, alpha: Tensor) -> Tensor | float:
        """Layer ``index``'s saturation threshold for ``alpha``, recomputed only when ``alpha`` changed.

        ``alpha`` changes only in place (optimizer steps, loads), which bumps its version counter:
        a cache keyed on ``(data_ptr, _version)`` needs no device read. A scalar ``alpha`` on the CPU
        is read with ``.item()`` (nothing to wait for) and its threshold computed in plain Python
        (:func:`saturation_threshold_host`): microseconds, where a dozen tensor ops cost far more
        in the middle of a training step. Eager only: compiled hooks take :meth:`accumulate`.
        """
        key = (alpha.data_ptr(), alpha._version)
        cached = self._thresholds.get(index)
        if cached is None or cached[0] != key:
            if alpha.device.type == "cpu" and alpha.numel() == 1:
                t: Tensor | float = saturation_threshold_host(alpha.item(), self.level)
            else:
                t = saturation_threshold(alpha, self.level)
            cached = self._thresholds[index] = (key, t)
        return cached[1]

    def refresh_thresholds(self, alphas: Sequence[Tensor]) -> None:
        """Compute the thresholds of all layers with a scalar accelerator ``alpha`` in one batched op.

        Call once per optimizer step, outside the forward (``alphas[i]`` is layer ``i``'s). Layers
        whose ``alpha`` is not a whole scalar here (per-channel, or an FSDP shard outside the
        forward) keep computing theirs when counted, and so do CPU layers, whose threshold is a few
        microseconds of plain Python (see :meth:`threshold`).
        """
        scalar = [i for i, a in enumerate(alphas) if a.numel() == 1 and a.device.type != "cpu"]
        if not scalar or len({alphas[i].device for i in scalar}) != 1:
            return
        with torch.no_grad():
            t = saturation_threshold(torch.stack([alphas[i].detach().reshape(()) for i in scalar]), self.level)  # (L,)
        for j, i in enumerate(scalar):
            a = alphas[i]
            self._thresholds[i] = ((a.data_ptr(), a._version), t[j : j + 1])

    def _scratch(self, x: Tensor) -> Tensor | None:
        """A float32 work buffer per input shape, shared by the layers, on CPU only (GPU allocations are cached already)."""
        if not x.is_cpu:
            return None
        buf = self._buffers.get(x.shape)
        if buf is None:
            buf = self._buffers[x.shape] = torch.empty(x.shape, dtype=torch.float32)
        return buf

    def flush(self) -> None:
        """Fold the deferred calls into the states: a handful of tensor ops for all of them, no host sync."""
        if self._inputs:
            self.count_inputs()
        pending, self._pending = self._pending, []
        if not pending:
            return
        self._update_count += len(pending)  # one per input: see update_count
        index, abs_sums, sats, numels = zip(*pending)
        n = len(pending)
        sums = torch.stack(abs_sums + sats)  # (2n,), float64 if any call summed in float64
        device = self.total.device
        # flush runs where counts are read (a host transfer follows anyway); non_blocking keeps
        # the rare self-flush of defer() free of a sync
        idx = torch.tensor(index, dtype=torch.int64).to(device, non_blocking=True)
        self.saturated.index_add_(0, idx, sums[n:].to(torch.int64))
        self.nonfinite.index_add_(0, idx, (~torch.isfinite(sums[:n])).to(torch.int64))
        self.total.index_add_(0, idx, torch.tensor(numels, dtype=torch.int64).to(device, non_blocking=True))

    def sync(self, *args, **kwargs) -> None:  # type: ignore[override]
        self.flush()
        super().sync(*args, **kwargs)

    def reset(self) -> None:
        self._pending = []
        self._inputs = []
        self._input_layers.clear()
        super().reset()

    def compute(self) -> dict[str, Tensor]:
        """Fractions (float64): ``pooled`` (0-dim) and ``per_layer`` (``(L,)``), plus raw counts."""
        self.flush()
        return {
            "pooled": saturation_fraction(self.saturated.sum(), self.total.sum()),
            "per_layer": saturation_fraction(self.saturated, self.total),
            "saturated": self.saturated.clone(),
            "total": self.total.clone(),
            "nonfinite": self.nonfinite.clone(),
        }

    def pooled(self) -> Tensor:
        """Pooled fraction over all layers, this process only (no sync)."""
        self.flush()
        return saturation_fraction(self.saturated.sum(), self.total.sum())

    def per_layer(self) -> Tensor:
        """Per-layer fractions, this process only (no sync)."""
        self.flush()
        return saturation_fraction(self.saturated, self.total)


class SaturationHooks(HookSet):
    """Forward hooks on DyT layers that feed a :class:`SaturationCounter`.

    Each eager call hands its input to :meth:`SaturationCounter.defer_input`: one ``abs``, one
    in-place comparison and two sums on the activations' device, or, when the counter keeps inputs
    (``SaturationCounter(keep_inputs=True)``, what :class:`~satmon.SaturationMonitor` uses on the
    CPU), only a reference until :meth:`SaturationCounter.count_inputs` after the forward. The
    integer conversions and state updates of all calls run together in
    :meth:`SaturationCounter.flush` when the counts are read. No ``.item()``. Compiled hooks
    (and float64 inputs) count in place with :meth:`SaturationCounter.accumulate`. ``enabled`` is a
    plain Python flag: under ``torch.compile`` it is a guard, so flipping it once (window over)
    costs one recompile, not one per step.

    Args:
        layers: DyT layers (from :func:`satmon.discovery.find_dyt_layers`).
        counter: where counts go (its layer ``i`` is ``layers[i]``).

    Example:
        >>> import torch
        >>> from satmon import DyT
        >>> from satmon.discovery import find_dyt_layers
        >>> model = torch.nn.Sequential(DyT(4, alpha_init=2.0))
        >>> layers = find_dyt_layers(model)
        >>> hooks = SaturationHooks(layers, SaturationCounter(len(layers))).attach()
        >>> _ = model(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
        >>> hooks.counter.per_layer().tolist()  # 2 of the 4 elements: |2 * 1.5|, |2 * -3.0| > 2
        [0.5]
        >>> hooks.detach()
    """

    def __init__(self, layers: Sequence[NormLayer], counter: SaturationCounter) -> None:
        if len(layers) != counter.saturated.numel():
            raise ValueError(f"Expected a counter with {len(layers)} layers, got {counter.saturated.numel()}.")
        super().__init__()
        self.layers = list(layers)
        self.counter = counter

    def _make_hook(self, index: int, module: nn.Module):
        def hook(mod: nn.Module, args: tuple, output: Tensor) -> None:
            if not self.enabled or not args:
                return
            x = args[0]
            if x.dtype == torch.float64 or torch.compiler.is_compiling():
                # compiled: the whole update is in the graph (no Python-side queue); float64: the product path
                with torch.no_grad():
                    self.counter.accumulate(index, x, mod.alpha)
                return
            # Eager: as little Python as possible (inside a training step every call and op is
            # several times its warm-loop cost); saturation_sums detaches x, so no grad-mode switch.
            self.counter.defer_input(index, x, mod.alpha)

        return hook

    def refresh_thresholds(self) -> None:
        """:meth:`SaturationCounter.refresh_thresholds` for these layers' ``alpha`` (once per optimizer step)."""
        self.counter.refresh_thresholds([l.module.alpha for l in self.layers])

    def _register(self) -> list[RemovableHandle]:
        return [l.module.register_forward_hook(self._make_hook(i, l.module)) for i, l in enumerate(self.layers)]

    def host_counts(self, sync: bool = True) -> tuple[list[int], list[int], list[int], list[float]]:
        """``(saturated, total, nonfinite, alpha)`` per layer on the host, in one transfer.

        Args:
            sync: sum the counts over DDP ranks first (a collective: every rank must call it);
                ``False`` reads this process's counts only (the probe).
        """
        c = self.counter
        c.flush()
        with c.sync_context(should_sync=sync, should_unsync=True):
            counts = torch.stack([c.saturated, c.total, c.nonfinite]).to(torch.float64)  # exact below 2**53
        packed = torch.cat([counts, self.alphas().to(counts.device).unsqueeze(0)]).cpu().tolist()
        sat, total, bad = ([int(v) for v in row] for row in packed[:3])
        return sat, total, bad, packed[3]

    def alphas(self) -> Tensor:
        """Current ``|alpha|`` of each layer as one float64 device tensor (mean for per-channel alpha)."""
        return torch.stack([l.module.alpha.detach().to(torch.float64).abs().mean() for l in self.layers])
