"""Forward hooks on the DyT family's layers that count saturation into a
:class:`~satmon.observe.counters.SaturationCounter`, and the scheduling of those counts
(:class:`CountQueue`): when each input is counted, how, and when the queued results are folded into
the counter's states. No host sync on the hooks' path, and nothing made on the host per step.

How an eager input is counted (``|x| > t``, ``t`` the layer's exact threshold for its ``alpha``, dtype and
cut-off, :mod:`satmon.functional.saturation`): the same counts either way, bit for bit, by one of

- the fused count: :func:`~satmon.functional.saturation.fused_counts_many` compiled by Inductor
  (one kernel per input that reads it once and counts both ``|x| > t`` and the non-finite flag),
  one compiled call for all the inputs counted together (a forward's kept
  inputs, or one hook's input); used on accelerators, and on the CPU where the call counts at least
  :data:`FUSED_MIN_ELEMENTS` elements (the measured crossover: below it the call's fixed cost
  outweighs the three passes it saves);
- the four ATen ops of :func:`~satmon.functional.saturation.saturation_sums` (``abs``, ``sum``, ``> t``,
  ``sum``): small CPU inputs, and wherever compiling fails (a warning says so once).

Inside a compiled model the hooks trace :func:`~satmon.functional.saturation.fused_counts` into the
model's graph (no graph break), adding into the counter's states there. A layer with a shift (Derf's
``alpha * x + s``) counts the pre-activation as the layer computes it
(:func:`~satmon.functional.saturation.shifted_saturation_counts`).

The fused count is compiled once per input layout (the inputs' shapes, strides and dtypes, and the device)
and process, when a counted step first needs it: that step takes the compilation's seconds once
(docs/reference/performance.md); one queue compiles for at most a few layouts, and counts inputs of further new
layouts with the four ops. It is called directly, without ``torch.compile``'s guards (a fraction of
their fixed cost per call: :func:`compile_counts`).

The results wait in the queue as device tensors; :meth:`CountQueue.flush` folds them with one
``update`` whose layer indices and element totals are device tensors made once per call pattern
(the first forward, or a new shape), so a counted step copies nothing from the host.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from satmon.functional.saturation import (
    _THRESHOLD_DTYPES,
    _fit_threshold,
    alpha_broadcast_problem,
    fused_counts,
    fused_counts_many,
    module_product_dtype,
    pointwise_cutoff,
    saturation_counts,
    saturation_sums,
    saturation_threshold,
    shifted_saturation_counts,
    threshold_host_fn,
)
from satmon.model.discovery import NormLayer
from satmon.model.weak import WeakModel
from satmon.observe.counters import SaturationCounter
from satmon.observe.hookset import HookSet, recomputing
from satmon.results.verdict import LayerCounts

__all__ = ["FUSED_MIN_ELEMENTS", "CountQueue", "compile_counts", "HookReadings", "SaturationCounter", "SaturationHooks"]

#: a loop that never reads its counts still holds little: the queue folds itself past this many calls
_MAX_PENDING = 16384
#: call patterns whose device index and totals are kept (a training loop repeats one or two)
_MAX_FOLDS = 32
#: on the CPU, the fused count is used for a call that counts at least this many elements in all (the inputs of
#: one forward counted together): the crossover measured by ``benchmarks/count_crossover.py``
#: (docs/reference/performance.md)
FUSED_MIN_ELEMENTS = 2**17
#: compiled counts kept per process (one per input layout: shapes, strides, dtypes, device)
_MAX_COMPILED = 32
#: distinct input layouts one queue compiles a count for; inputs of further new layouts (shapes that change every
#: step, say) are counted with the four ops, so that no step waits for a compilation again and again
_MAX_LAYOUTS = 4
_COMPILED: dict[tuple, Callable[..., tuple[Tensor, ...]]] = {}
#: device type -> why compiling the fused count failed there (once per process: later queues count with the four ops)
_FAILED: dict[str, str] = {}

#: what compiles a traced count: ``(graph_module, example_inputs) -> callable``
Compiler = Callable[[Any, list], Callable[..., tuple[Tensor, ...]]]


def _flat_counts(*args: Tensor) -> tuple[Tensor, ...]:
    """:func:`~satmon.functional.saturation.fused_counts_many` of interleaved ``(x, threshold)`` arguments: a flat
    signature to trace."""
    return fused_counts_many(args[0::2], args[1::2])


def _inductor(gm: Any, example: list) -> Callable[..., tuple[Tensor, ...]]:
    import torch._inductor

    return torch._inductor.compile(gm, example)


def compile_counts(args: Sequence[Tensor], compiler: Compiler | None = None) -> Callable[..., tuple[Tensor, ...]]:
    """The fused count of inputs laid out as ``args`` (interleaved inputs and thresholds), compiled once.

    The function is traced to ATen ops (``make_fx``) and compiled by Inductor (``compiler``, default
    ``torch._inductor.compile``: a C++ kernel per input on the CPU, a Triton one on a GPU) for exactly
    these shapes, strides, dtypes and device; the result is called directly, without Dynamo's guards
    (the caller keys it by that layout, and Inductor's own wrapper checks every input's size and
    stride). Traced and compiled on copies of ``args`` (distinct storage: two layers that share an
    input must not be compiled as one argument), then checked against the eager count on them: a
    compiled count that differs is refused (on an accelerator that check reads the device once per
    compilation, never per step).

    Example:
        >>> args = [torch.tensor([0.5, -3.0, float("nan")]), torch.tensor([1.0])]
        >>> traced = compile_counts(args, compiler=lambda gm, example: gm)  # the traced graph, uncompiled
        >>> [int(v) for v in traced(*args)]
        [1, 1]
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    example = [torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device).copy_(a) for a in args]
    with torch.no_grad():
        gm = make_fx(_flat_counts)(*example)
        fn = (compiler or _inductor)(gm, example)
        got, want = fn(*example), _flat_counts(*example)
        same = (
            isinstance(got, (tuple, list))
            and len(got) == len(want)
            and all(isinstance(g, Tensor) and g.dtype == w.dtype and g.shape == w.shape for g, w in zip(got, want))
            and torch.equal(
                torch.stack([g.to(torch.int64) for g in got]), torch.stack([w.to(torch.int64) for w in want])
            )
        )
    if not same:
        raise RuntimeError(f"the compiled count returned {got!r} where the eager count gives {want!r}")
    return fn


def _layout(args: Sequence[Tensor]) -> tuple:
    return (args[0].device,) + tuple((a.shape, a.stride(), a.dtype) for a in args)


def _dispatch_mode_active() -> bool:
    """A ``TorchDispatchMode`` is active (tracing under one would record satmon's ops there): four ops then."""
    return torch._C._len_torch_dispatch_stack() > 0


class HookReadings(NamedTuple):
    """Per-layer readings of :class:`SaturationHooks`, on the host."""

    saturated: list[int]
    total: list[int]
    nonfinite: list[int]
    alphas: list[float]

    def layer_counts(self, names: Sequence[str]) -> dict[str, LayerCounts]:
        """Counts by layer name for :func:`satmon.results.verdict.build_verdict`; a non-finite ``alpha`` counts as
        a non-finite input of its layer (its threshold is NaN: nothing would read as saturated)."""
        return {
            n: LayerCounts(s, t, b + (not math.isfinite(a)))
            for n, s, t, b, a in zip(names, self.saturated, self.total, self.nonfinite, self.alphas)
        }

    def fractions(self, names: Sequence[str]) -> dict[str, float]:
        """Saturation by layer name (layers that counted nothing left out)."""
        return {n: s / t for n, s, t in zip(names, self.saturated, self.total) if t}


class CountQueue:
    """When and how inputs are counted: at once in the hook, or kept and counted together after the forward.

    A counted input queues its device results (see the module docstring for how they are made: the
    fused count or the four ops, chosen by :attr:`fused`); :meth:`flush` folds every queued call into
    the counter with one ``update`` (a handful of tensor ops, no host sync, no host-to-device copy once
    the call pattern is known). With ``keep_inputs`` a
    hook only keeps ``x`` and ``alpha`` by reference (with their version counters) and
    :meth:`count_kept` counts them after the forward: inside a CPU training step each op costs several
    times its warm cost, and autograd holds the input anyway. A kept input or ``alpha`` changed in
    place before its count is skipped with a warning, and from then on inputs are counted at once.

    Args:
        counter: where the counts go.
        level: the saturation level (the study's; each layer's cut-off on ``|u|`` follows from it).
        keep_inputs: keep inputs until :meth:`count_kept` (a loop must call it after each forward,
            before the optimizer step).
        product: ``"module"`` or ``"exact"`` (:mod:`satmon.functional.saturation`).
        cutoffs: per layer, the cut-off on ``|u|`` (:func:`~satmon.functional.saturation.pointwise_cutoff`
            of its function at ``level``); default ``level`` for every layer (tanh).
    """

    #: the :attr:`fused` and :attr:`fused_backend` of new queues (``None``: by device and size; ``"inductor"``):
    #: benchmarks and tests set them to compare the two paths, or to skip Inductor's compilation
    default_fused: bool | None = None
    default_backend: str | Compiler = "inductor"

    def __init__(
        self,
        counter: SaturationCounter,
        level: float,
        keep_inputs: bool = False,
        product: str = "module",
        cutoffs: Sequence[float] | None = None,
    ) -> None:
        self.counter, self.level, self.keep_inputs, self.product = counter, float(level), keep_inputs, product
        self.cutoffs = [float(c) for c in cutoffs] if cutoffs is not None else [self.level] * counter.num_layers
        if len(self.cutoffs) != counter.num_layers:
            raise ValueError(f"Expected {counter.num_layers} cut-offs (one per layer), got {len(self.cutoffs)}.")
        #: how an eager input is counted: ``None`` by device and size (fused on accelerators; on the CPU fused
        #: when one call counts at least :attr:`fused_min_elements`, else the four ATen ops), ``True`` always
        #: fused (one compiled kernel per input), ``False`` always the four ops; the counts are the same
        self.fused: bool | None = CountQueue.default_fused
        #: the CPU crossover of ``fused=None``, in elements counted by one call
        self.fused_min_elements = FUSED_MIN_ELEMENTS
        #: what compiles the fused count: ``"inductor"`` (one kernel per input), or a callable
        #: ``(graph_module, example_inputs) -> callable`` (the tests run the traced graph as it is)
        self.fused_backend: str | Compiler = CountQueue.default_backend
        #: a scalar CPU ``alpha`` is read on the host (``.item()`` of a CPU scalar: nothing to wait for) and its
        #: threshold computed in plain Python; ``False`` takes the accelerator's path (tensor thresholds)
        self.host_thresholds = True
        self._sums: list[tuple[int, Tensor, Tensor, int]] = []  # four-op results: (layer, abs sum, saturated, numel)
        self._counts: list[tuple[int, Tensor, Tensor, int]] = []  # int64 results: (layer, saturated, non-finite, numel)
        # (layers, numels, fused_counts_many's)
        self._fused: list[tuple[tuple[int, ...], tuple[int, ...], tuple[Tensor, ...]]] = []
        self._held: dict[int, tuple[float, Tensor]] = {}  # CPU: a layer's host threshold as the fused count's tensor
        self._layouts: set[tuple] = set()  # input layouts this queue counted fused
        #: inputs counted so far by each path (``"fused"``, ``"four ops"``): which one a run took
        self.inputs_counted = {"fused": 0, "four ops": 0}
        self._kept: list[tuple[int, Tensor, int, Tensor, int]] = []  # (layer, x, x's version, alpha, alpha's version)
        self._kept_layers: set[int] = set()
        self._buffers: dict[torch.Size, Tensor] = {}
        self._thresholds: dict[int, tuple[tuple, Tensor | float]] = {}
        self._host_rules: dict[tuple, Callable[[float], float]] = {}
        self._folds: dict[tuple, tuple[Tensor, Tensor]] = {}  # (layers, numels) -> device (index, totals)

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

    def add_counts(self, index: int, saturated: Tensor, nonfinite: Tensor, numel: int) -> None:
        """Queue int64 counts made elsewhere (a shifted layer's) for the next fold."""
        self._counts.append((index, saturated, nonfinite, numel))
        if len(self._counts) >= _MAX_PENDING:
            self.flush()

    def _count_now(self, index: int, x: Tensor, alpha: Tensor) -> None:
        self._count([(index, x, alpha)])

    def _count(self, items: Sequence[tuple[int, Tensor, Tensor]]) -> None:
        """Count ``(layer, input, alpha)`` items: the fusable ones in one compiled call per device where
        :attr:`fused` says so, the others (and all of them where compiling fails) with the four ops."""
        rest = items
        if self.fused is not False:
            groups: dict[torch.device, list[tuple[int, Tensor, Tensor]]] = {}
            rest = []
            for item in items:
                x = item[1]
                if x.dtype in _THRESHOLD_DTYPES and x.numel():
                    groups.setdefault(x.device, []).append(item)
                else:  # float64 and empty inputs never reach here from the hooks; other dtypes raise below
                    rest.append(item)
            for device, group in groups.items():
                if not (self._use_fused(device, group) and self._count_fused(group)):
                    rest.extend(group)
        for index, x, alpha in rest:
            abs_sum, sat = saturation_sums(x, self.threshold(index, alpha, x.dtype), self._scratch(x))
            self._sums.append((index, abs_sum, sat, x.numel()))
        self.inputs_counted["four ops"] += len(rest)
        if len(self._sums) >= _MAX_PENDING:
            self.flush()

    def _use_fused(self, device: torch.device, group: Sequence[tuple[int, Tensor, Tensor]]) -> bool:
        if self.fused is not None:
            return self.fused
        return device.type != "cpu" or sum(x.numel() for _, x, _ in group) >= self.fused_min_elements

    def _count_fused(self, group: Sequence[tuple[int, Tensor, Tensor]]) -> bool:
        """One compiled call for ``group`` (one device); ``False`` where the four ops must count it: compiling
        failed (a warning, once per process and device type), too many layouts, or a ``TorchDispatchMode``."""
        device = group[0][1].device.type
        if device in _FAILED or _dispatch_mode_active():
            return False
        args: list[Tensor] = []
        for index, x, alpha in group:
            args.append(x.detach())
            args.append(_fit_threshold(self._fused_threshold(index, alpha, x), x.shape))
        key = _layout(args) + (self.fused_backend,)
        fn = _COMPILED.get(key)
        if fn is None:
            if key not in self._layouts and len(self._layouts) >= _MAX_LAYOUTS:
                return False
            try:
                fn = compile_counts(args, None if self.fused_backend == "inductor" else self.fused_backend)  # type: ignore[arg-type]
            except Exception as exc:  # no C++ compiler or GPU back end, an unsupported torch or Python, ...
                _FAILED[device] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                warnings.warn(
                    f"satmon: compiling the fused saturation count failed ({_FAILED[device]}); counting with "
                    "four tensor ops per input instead (exact either way).",
                    RuntimeWarning,
                    stacklevel=4,
                )
                return False
            if len(_COMPILED) >= _MAX_COMPILED:
                _COMPILED.pop(next(iter(_COMPILED)))
            _COMPILED[key] = fn
        self._layouts.add(key)
        with torch.no_grad():
            counts = fn(*args)
        self._fused.append(
            (tuple(i for i, _, _ in group), tuple(args[k].numel() for k in range(0, len(args), 2)), counts)
        )
        self.inputs_counted["fused"] += len(group)
        if len(self._fused) >= _MAX_PENDING:
            self.flush()
        return True

    def _fused_threshold(self, index: int, alpha: Tensor, x: Tensor) -> Tensor:
        """The threshold as the compiled count takes it: a tensor. On the CPU the host threshold (a float) is
        written into a one-element tensor kept per layer, refilled only when it changes."""
        t = self.threshold(index, alpha, x.dtype, tensor=not x.is_cpu)
        if isinstance(t, Tensor):
            return t
        held = self._held.get(index)
        if held is None:
            held = self._held[index] = (t, torch.full((1,), t, dtype=torch.float32))
        elif held[0] != t:
            held[1].fill_(t)
            self._held[index] = (t, held[1])
        return held[1]

    def count_kept(self) -> None:
        """Count the kept inputs (no host sync), skipping any changed in place since its forward."""
        kept, self._kept = self._kept, []
        if not kept:
            return
        self._kept_layers.clear()
        stale = 0
        fresh = []
        for index, x, version, alpha, alpha_version in reversed(kept):  # the latest first: still in cache
            if x._version != version or alpha._version != alpha_version:
                stale += 1
            else:
                fresh.append((index, x, alpha))
        with torch.no_grad():  # one grad-mode switch for all the layers
            self._count(fresh)
        if stale:
            self.keep_inputs = False
            warnings.warn(
                f"satmon: {stale} kept DyT input(s) or their alpha changed in place between the forward and the count "
                "(kept inputs are counted when the model's forward returns or at count_kept(), which must run before "
                "the optimizer step; a model run through .forward() skips the first); they were skipped, and from now "
                "on every input is counted in its hook.",
                RuntimeWarning,
                stacklevel=2,
            )

    def threshold(
        self, index: int, alpha: Tensor, dtype: torch.dtype = torch.float32, tensor: bool = False
    ) -> Tensor | float:
        """Layer ``index``'s threshold on ``|x|`` of ``dtype``, recomputed only when ``alpha`` or ``dtype`` changed.

        ``alpha`` changes only in place (optimizer steps, loads), which bumps its version counter, so
        a cache keyed on ``(data_ptr, _version)`` needs no device read. A scalar CPU ``alpha`` is read
        with ``.item()`` (nothing to wait for: the one read of satmon's CPU path, a CPU scalar) and
        its threshold computed in plain Python, unless ``tensor`` asks for a device tensor.
        """
        # whether the threshold is a host float: ``tensor`` matters only where the host path would be taken, so an
        # accelerator's four-op count finds the tensor refresh_thresholds made
        host = not tensor and self.host_thresholds and alpha.device.type == "cpu" and alpha.numel() == 1
        key = (alpha.data_ptr(), alpha._version, dtype, host)
        cached = self._thresholds.get(index)
        if cached is not None and cached[0] == key:
            return cached[1]
        level = self.cutoffs[index]
        if host:
            rule = (index, dtype, alpha.dtype, alpha.dim())  # what the product dtype depends on
            fn = self._host_rules.get(rule)
            if fn is None:  # the arguments checked once, not per step
                fn = self._host_rules[rule] = threshold_host_fn(
                    level, dtype=dtype, product=self.product, product_dtype=module_product_dtype(alpha, dtype)
                )
            t: Tensor | float = fn(alpha.item())
        else:
            t = saturation_threshold(alpha, level, dtype=dtype, product=self.product)
        self._thresholds[index] = (key, t)
        return t

    def refresh_thresholds(self, alphas: Sequence[Tensor]) -> None:
        """The thresholds of all layers with a scalar accelerator ``alpha`` in one batched op per group (once per
        counted step, before its forward; no host read). A scalar CPU ``alpha`` is left to the count, which
        reads it on the host (measured: computing it here costs the same, only in another step)."""
        # FSDP2-sharded alphas (DTensors here) are left to their hooks, which read them whole
        scalar = [
            i
            for i, a in enumerate(alphas)
            if a.numel() == 1 and a.device.type != "cpu" and not hasattr(a, "full_tensor")
        ]
        if not scalar or len({alphas[i].device for i in scalar}) != 1:
            return
        # the threshold depends on the inputs' dtype: the one each layer's cached threshold was made for
        groups: dict[tuple, list[int]] = {}
        for i in scalar:
            dtype = self._thresholds[i][0][2] if i in self._thresholds else torch.float32
            groups.setdefault((dtype, module_product_dtype(alphas[i], dtype), self.cutoffs[i]), []).append(i)
        for (dtype, pdt, level), group in groups.items():
            with torch.no_grad():
                stacked = torch.stack([alphas[i].detach().reshape(()) for i in group])  # (L,)
                t = saturation_threshold(stacked, level, dtype=dtype, product=self.product, product_dtype=pdt)
            for j, i in enumerate(group):
                a = alphas[i]
                # a tensor, not a host float
                self._thresholds[i] = (
                    (a.data_ptr(), a._version, dtype, False),
                    t[j : j + 1],
                )

    def _scratch(self, x: Tensor) -> Tensor | None:
        """A float32 work buffer per input shape, on CPU only (GPU allocations are cached already)."""
        if not x.is_cpu:
            return None
        buf = self._buffers.get(x.shape)
        if buf is None:
            buf = self._buffers[x.shape] = torch.empty(x.shape, dtype=torch.float32)
        return buf

    def _fold_tensors(self, layers: tuple[int, ...], numels: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """The device index and element totals of one call pattern: made (one copy) the first time it is seen."""
        key = (layers, numels)
        hit = self._folds.get(key)
        if hit is None:
            device = self.counter.total.device
            pin = device.type == "cuda"
            host = torch.tensor([layers, numels], dtype=torch.int64)  # (2, n)
            on = (host.pin_memory() if pin else host).to(device, non_blocking=True)
            if len(self._folds) >= _MAX_FOLDS:
                self._folds.pop(next(iter(self._folds)))
            hit = self._folds[key] = (on[0], on[1])
        return hit

    def flush(self) -> None:
        """Count what is kept, then fold every queued call into the counter (one ``update``, no host sync)."""
        if self._kept:
            self.count_kept()
        sums, counts, fused = self._sums, self._counts, self._fused
        self._sums, self._counts, self._fused = [], [], []
        if not sums and not counts and not fused:
            return
        parts_sat, parts_bad = [], []
        layers: tuple[int, ...] = ()
        numels: tuple[int, ...] = ()
        if sums:
            index, abs_sums, sats, n_el = zip(*sums)
            n = len(sums)
            stacked = torch.stack(abs_sums + sats)  # (2n,), float64 if any call summed in float64
            parts_sat.append(stacked[n:].to(torch.int64))
            parts_bad.append((~torch.isfinite(stacked[:n])).to(torch.int64))
            layers, numels = index, n_el
        if counts:
            index, sats, bads, n_el = zip(*counts)
            m = len(counts)
            stacked = torch.stack(sats + bads)  # (2m,) int64
            parts_sat.append(stacked[:m])
            parts_bad.append(stacked[m:])
            layers, numels = layers + index, numels + n_el
        if fused:
            sats_f: list[Tensor] = []
            bads_f: list[Tensor] = []
            for index, n_el, out in fused:
                sats_f += out[: len(index)]
                bads_f += out[len(index) :]
                layers, numels = layers + index, numels + n_el
            parts_sat.append(torch.stack(sats_f).to(torch.int64))  # int32 counts (int64 from 2**31 elements)
            parts_bad.append(torch.stack(bads_f).to(torch.int64))
        idx, totals = self._fold_tensors(layers, numels)
        sat = parts_sat[0] if len(parts_sat) == 1 else torch.cat(parts_sat)
        bad = parts_bad[0] if len(parts_bad) == 1 else torch.cat(parts_bad)
        self.counter.update(idx, saturated=sat, total=totals, nonfinite=bad)

    def clear(self) -> None:
        """Drop what is queued or kept (with a counter reset)."""
        self._sums, self._counts, self._fused, self._kept = [], [], [], []
        self._kept_layers.clear()


class SaturationHooks(HookSet):
    """Forward hooks on the DyT family's layers that count saturated inputs into a :class:`SaturationCounter`.

    An element is saturated when its pre-activation ``u = alpha * x (+ s)`` has ``|u| > c``, ``c``
    the cut-off of the layer's function (``NormLayer.function``) at the counter's level: ``level``
    itself for tanh (DyT, the study's ``|alpha * x| > 2``), 1.6279 for erf (Derf) and 1 for HardTanh
    at level 2 (:func:`~satmon.functional.saturation.pointwise_cutoff`). A layer with a shift
    (``NormLayer.shift``, the name of its ``s``) counts ``u`` as its forward computes it.

    Eager hooks hand each input to a :class:`CountQueue` (a kept reference on CPU training with
    ``keep_inputs``, else counted at once); compiled hooks and float64 inputs count in place with
    tensor ops only. No ``.item()`` on an accelerator's path. Read the counts with :meth:`read` (one
    host transfer).

    A layer whose ``alpha * x`` would not keep its input's shape (a per-channel ``alpha`` that its
    forward reshapes, invisible to the hook) is refused rather than stopping training: one
    ``RuntimeWarning`` names it, :attr:`refused` keeps the reason, and it is counted no further.

    Args:
        layers: point-wise layers (from :func:`satmon.model.map.find_dyt_layers`).
        counter: where counts go (its layer ``i`` is ``layers[i]``); its ``level`` and ``product`` are used.
        keep_inputs: see :class:`CountQueue`.
        refused: layer name -> reason, shared with another hook set on the same layers (the screen's
            window and watch hooks) so that a refused layer warns once; default a new dict.
        root: the model whose forward calls the layers: with ``keep_inputs``, a forward hook on it
            counts the kept inputs as soon as its forward returns (before any backward or optimizer
            step), so a plain loop needs no :meth:`count_kept` call.

    Example:
        >>> from satmon import DyT
        >>> from satmon.model.map import find_dyt_layers
        >>> model = torch.nn.Sequential(DyT(4, alpha_init=2.0))
        >>> layers = find_dyt_layers(model)
        >>> hooks = SaturationHooks(layers, SaturationCounter(len(layers))).attach()
        >>> _ = model(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
        >>> hooks.read(sync=False).saturated  # |2 * 1.5|, |2 * -3.0| > 2
        [2]
        >>> hooks.detach()
    """

    #: the model whose forward calls the layers (``None``: none given, or it was freed); held weakly, as these
    #: hooks live on it (:mod:`satmon.model.weak`)
    root = WeakModel()

    def __init__(
        self,
        layers: Sequence[NormLayer],
        counter: SaturationCounter,
        keep_inputs: bool = False,
        refused: dict[str, str] | None = None,
        root: nn.Module | None = None,
    ) -> None:
        if len(layers) != counter.num_layers:
            raise ValueError(f"Expected a counter with {len(layers)} layers, got {counter.num_layers}.")
        for l in layers:
            if l.function is None:
                raise ValueError(
                    f"Expected point-wise layers (NormLayer.function set), got {l.name!r} of kind {l.kind!r} "
                    "with no function: satmon counts saturation of the DyT family only."
                )
            if l.shift is not None and not isinstance(getattr(l.module, l.shift, None), Tensor):
                raise ValueError(
                    f"Expected layer {l.name!r} to hold its shift as a tensor attribute {l.shift!r} "
                    f"(NormLayer.shift), got {type(getattr(l.module, l.shift, None)).__name__}."
                )
        super().__init__()
        self.layers = list(layers)
        self.counter = counter
        self.cutoffs = [pointwise_cutoff(l.function, counter.level) for l in self.layers]
        self.queue = CountQueue(counter, counter.level, keep_inputs, product=counter.product, cutoffs=self.cutoffs)
        self.refused: dict[str, str] = {} if refused is None else refused
        self.root = root

    def _make_hook(self, index: int):
        layer = self.layers[index]
        # FSDP2 (alpha a DTensor outside the forward) gathers alpha into fresh storage each forward, keeps its
        # version and frees it after: neither a kept reference nor the (data_ptr, version) threshold cache holds
        sharded = hasattr(layer.module.alpha, "full_tensor")
        name, shift, cutoff = layer.name, layer.shift, self.cutoffs[index]
        counter, queue, product = self.counter, self.queue, self.counter.product

        def hook(mod: nn.Module, args: tuple, output: Tensor) -> None:
            if not self.enabled or not args or name in self.refused or recomputing():
                return
            x, alpha = args[0], mod.alpha
            # a per-channel alpha matching x's trailing dims broadcasts; anything else is checked in full
            if alpha.numel() != 1 and alpha.shape != x.shape[-alpha.dim() :]:
                reason = alpha_broadcast_problem(alpha.shape, x.shape)
                if reason is not None:
                    self._refuse(name, reason)
                    return
            compiling = torch.compiler.is_compiling()
            if shift is not None:  # u = alpha * x + s: no single threshold on |x|
                sat, bad = shifted_saturation_counts(x, alpha, getattr(mod, shift), cutoff, product=product)
                if compiling:
                    counter.add_counts(index, sat, x.numel(), bad)
                else:
                    queue.add_counts(index, sat, bad, x.numel())
                return
            if compiling or x.dtype == torch.float64 or sharded:
                # compiled: the count and the update are in the model's graph (one fused reduction per input, no
                # Python-side queue); float64: the product itself; FSDP2: alpha read whole, no cache
                with torch.no_grad():
                    if compiling and x.dtype != torch.float64 and not sharded:
                        t = _fit_threshold(saturation_threshold(alpha, cutoff, dtype=x.dtype, product=product), x.shape)
                        sat, bad = fused_counts(x, t)
                    else:
                        sat, bad = saturation_counts(x, alpha, cutoff, product=product)
                    counter.add_counts(index, sat, x.numel(), bad)
                return
            queue.add_input(index, x, alpha)  # the counts detach x: no grad-mode switch

        return hook

    def _register(self) -> list[RemovableHandle]:
        handles = [l.module.register_forward_hook(self._make_hook(i)) for i, l in enumerate(self.layers)]
        root = self.root
        if root is not None and self.queue.keep_inputs:
            handles.append(root.register_forward_hook(self._after_forward))
        return handles

    def _after_forward(self, mod: nn.Module, args: tuple, output: object) -> None:
        """The model's forward returned: count what its layers kept (eager only; nothing kept under compile)."""
        if not torch.compiler.is_compiling() and self.queue._kept and not recomputing():
            self.queue.count_kept()

    def _refuse(self, name: str, reason: str) -> None:
        """Stop counting layer ``name`` for the rest of the run, with one warning that says how to resolve it."""
        self.refused[name] = reason
        warnings.warn(
            f"satmon: DyT layer {name!r} is not counted for the rest of the run: {reason}, so satmon cannot apply it "
            "as `alpha * x` (a forward that reshapes alpha, e.g. alpha.view(-1, 1, 1) for channels-first input, is "
            f'invisible to satmon). Leave the layer out with exclude=r"^{re.escape(name)}$" (and, if another module '
            "applies an alpha that broadcasts, select that one with include=), or store alpha in the shape the "
            "forward uses (e.g. (C, 1, 1)).",
            RuntimeWarning,
            stacklevel=2,
        )

    def refresh_thresholds(self) -> None:
        """The thresholds of these layers for the coming step, before its forward (once per counted step)."""
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
        """Per-layer counts and ``|alpha|`` on the host, in one transfer (the counts exact: int64 throughout).

        Args:
            sync: sum the counts over DDP ranks first (one collective: every rank must call it at the
                same point); ``False`` reads this process's counts only (the probe).
        """
        self.flush()
        s = self.counter.synced(sync)
        counts = torch.stack([s["saturated"], s["total"], s["nonfinite"]])  # (3, L) int64
        alphas = self.alphas().to(counts.device).view(torch.int64)  # float64 bits, to travel with the counts
        packed = torch.cat([counts.reshape(-1), alphas]).cpu()  # the one device-to-host copy of a read
        n = counts.shape[1]
        sat, total, bad = (packed[i * n : (i + 1) * n].tolist() for i in range(3))
        return HookReadings(sat, total, bad, packed[3 * n :].view(torch.float64).tolist())

    def alphas(self) -> Tensor:
        """Current ``|alpha|`` of each layer as one float64 device tensor (mean for per-channel alpha).

        An FSDP2-sharded ``alpha`` (a ``DTensor`` outside the forward) is gathered whole first: a
        collective, so every rank must call this at the same point (as :meth:`read` with ``sync``).
        """
        return torch.stack([whole(l.module.alpha).detach().to(torch.float64).abs().mean() for l in self.layers])

    def local_alphas(self) -> Tensor:
        """Per layer, ``sum |alpha|`` over this process's elements (its shard under FSDP2; 0 for an empty
        one), in float64: finite exactly when they all are. No collective: the per-step non-finite check
        (one op per layer)."""
        local = (
            (a.to_local() if hasattr(a, "to_local") else a).detach() for a in (l.module.alpha for l in self.layers)
        )
        return torch.stack([torch.linalg.vector_norm(a, 1, dtype=torch.float64) for a in local])


def whole(t: Tensor) -> Tensor:
    """``t`` itself, or the whole tensor of a sharded ``DTensor`` (FSDP2 parameters outside
    the forward; a collective)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t
