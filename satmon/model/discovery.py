"""Find the layers satmon watches by what they compute: the point-wise family (DyT, Derf, HardTanh),
LayerNorm and RMSNorm, on any axis, whatever their classes and parameters are called.

A candidate module (no parametrised submodule; its own parameters scalars or vectors) is evaluated
on known inputs, as a copy (:mod:`satmon.model._evaluate`: float64 on the CPU, no hooks, nothing
changed), with its parameters drawn at random, so the answer does not depend on trained values:

- **point-wise** (``kind="dyt"``): the module owns a parameter named ``alpha`` (the study's rule for
  which scale is ``alpha``) and its output fits ``w * f(alpha * x + s) + b`` per channel, with ``f``
  one of ``tanh`` (DyT), ``erf`` (Derf) or ``hardtanh`` (the study's control) and ``s`` an optional
  shift parameter, found by setting each other parameter in turn to a known value;
- **LayerNorm / RMSNorm**: the output fits ``g * normalize(x) + b`` per channel, with
  ``normalize`` the LayerNorm (mean removed) or the RMSNorm one (:mod:`satmon.model.affine`);
- **the axis**: each is tried on a channels-last ``(B, T, C)`` input, then channels-first
  ``(B, C, H, W)`` and ``(B, C, T)``, whose other sizes all differ from ``C``: the layout that fits
  gives the axis the layer normalises (``-1``, or ``1`` for a ConvNeXt-style channels-first layer).

``nn.LayerNorm`` and ``nn.RMSNorm`` themselves (not subclasses) and satmon's :class:`~satmon.dyt.DyT`
are known by type. A parameterless module is evaluated only when it carries a normaliser's attributes
(``eps``, ``variance_epsilon``, ``normalized_shape``) or its class is named like one: running arbitrary
forwards could have side effects. A module on the meta device (a model built under
``torch.device("meta")``, as ``satmon replay`` builds a ``--factory`` model) is read the same way, on a
CPU twin of itself: the reading draws or sets every parameter it uses, so it needs their shapes only
and reads what the same module on the CPU reads. Names never exclude a module; when a module cannot be
run at all (a buffer whose value meta does not hold, kernels for another device), its class name may
make it a normaliser of unknown kind
(:attr:`satmon.model.map.ModelMap.undetermined`) or, for an ``alpha`` owner named like a DyT or
whose source calls tanh, a DyT (``basis="names"``).

Users narrow or widen discovery with ``include``/``exclude``: a regex on the module name or a
predicate ``(name, module) -> bool``. :func:`modules_by_name` is the one "module by name" lookup
(wrapper prefixes of ``torch.compile``, DDP, FSDP and activation checkpointing removed).
"""

from __future__ import annotations

import inspect
import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from satmon.functional.saturation import POINTWISE_FUNCTIONS, pointwise_function
from satmon.model import _evaluate as ev
from satmon.model.fits import fit_grouped, fit_normalisation
from satmon.results.probe_report import NormKind  # results/ holds the kinds: model/ and results/ both read them

__all__ = [
    "NormLayer",
    "Reading",
    "Selector",
    "modules_by_name",
    "norm_channels",
    "norm_kind",
    "read_module",
    "selects",
    "strip_wrappers",
]

Selector = str | Callable[[str, nn.Module], bool] | None
Basis = Literal["type", "behaviour", "names"]

_WRAPPER_PARTS = {"_orig_mod", "_forward_module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
_DYT_NAME = re.compile(r"dyt|dynamic_?tanh|derf", re.IGNORECASE)
_NORM_NAME = re.compile(r"norm", re.IGNORECASE)
_NORM_ATTRS = ("normalized_shape", "eps", "variance_epsilon", "epsilon")
_ALPHA, _SHIFT = 0.7, 0.3  # the values set while reading a point-wise layer (0 would fit anything constant)


@dataclass(frozen=True)
class NormLayer:
    """A normaliser of the model, as the model map reads it.

    Attributes:
        name: the module's name in the model, with wrapper prefixes (``_orig_mod.`` of
            ``torch.compile``, ``module.`` of DDP, FSDP's) removed so names are stable.
        module: the module itself.
        kind: ``"dyt"`` (the point-wise family), ``"layernorm"`` or ``"rmsnorm"``, from what it computes.
        function: for a point-wise normaliser, the bounded function it applies to its pre-activation
            ``u = alpha * x (+ shift)``: ``"tanh"`` (DyT), ``"erf"`` (Derf) or ``"hardtanh"``;
            ``None`` for LayerNorm/RMSNorm.
        shift: the name of the module's parameter ``s`` added to ``alpha * x`` before the function
            (Derf's), or ``None`` when there is none.
        channels: the channel count ``C`` (``None``: the layer takes any width, or normalises
            over several dimensions).
        axis: the input dimension holding the channels: ``-1`` (channels last), ``1`` (channels first,
            ``(B, C, H, W)``).
        block: the residual block holding the layer (:func:`satmon.model.map.find_blocks`), ``None`` outside the blocks.
        feeds: where the layer's output goes in a traced forward, among ``"gated-mlp"`` (a gated MLP's
            gate and value projections read it directly), ``"mlp"``, ``"attention"``, ``"residual"``
            (it is added to another stream) and ``"projection"`` (any other projection, e.g. a head);
            ``None`` until a forward was traced.
        basis: how the kind was read: ``"behaviour"`` (evaluated), ``"type"`` (``nn.LayerNorm``,
            ``nn.RMSNorm``, satmon's ``DyT``) or ``"names"`` (the module could not be run).
        gain_shape: the shape of the layer's gain when it is not one value per channel, e.g.
            ``(heads, head_dim)`` for a per-head QK-norm (Cohere, Chameleon) that normalises each head's
            ``head_dim`` with a gain of its own; ``None`` for one gain per channel.
    """

    name: str
    module: nn.Module
    kind: NormKind
    function: str | None = None
    shift: str | None = None
    channels: int | None = None
    axis: int = -1
    block: str | None = None
    feeds: tuple[str, ...] | None = None
    basis: Basis = "behaviour"
    gain_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.function is None and self.kind == "dyt":
            object.__setattr__(self, "function", "tanh")


@dataclass(frozen=True)
class Reading:
    """What one module computes (:func:`read_module`): the fields of :class:`NormLayer` that do not
    depend on the model around it. ``kind`` is ``"unknown"`` for a module named like a normaliser
    that could not be run; ``note`` says why, or what the reading rests on."""

    kind: NormKind | Literal["unknown"]
    function: str | None = None
    shift: str | None = None
    channels: int | None = None
    axis: int = -1
    basis: Basis = "behaviour"
    note: str = ""
    gain_shape: tuple[int, ...] | None = None


def strip_wrappers(name: str) -> str:
    """Remove the name prefixes that ``torch.compile``, DDP and FSDP add.

    Example:
        >>> strip_wrappers("_orig_mod.blocks.0._fsdp_wrapped_module.ln_1")
        'blocks.0.ln_1'
    """
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    if parts and parts[0] == "module":  # DistributedDataParallel's prefix
        parts = parts[1:]
    return ".".join(parts)


def modules_by_name(model: nn.Module) -> dict[str, nn.Module]:
    """Every module of ``model`` by its name with wrapper prefixes removed (see :func:`strip_wrappers`).

    The one "module by name" lookup of satmon: names match what :func:`satmon.model.map.find_norm_layers` reports,
    whether the model is plain, compiled, DDP- or FSDP-wrapped. When a wrapper and the module it
    wraps get the same stripped name, the inner module (registered later) wins.

    Example:
        >>> from torch import nn
        >>> wrapper = nn.Module()
        >>> wrapper._orig_mod = nn.Sequential(nn.Linear(2, 2))  # what torch.compile registers
        >>> sorted(modules_by_name(wrapper))
        ['', '0']
        >>> modules_by_name(wrapper)[""] is wrapper._orig_mod
        True
    """
    return {strip_wrappers(n): m for n, m in model.named_modules()}


# ----------------------------------------------------------------------------------- channels
def norm_channels(module: nn.Module) -> int | None:
    """A normaliser's channel count: the length of its own vector parameters, whatever they are called
    (``(C,)``, or ``(C, 1, 1)`` for channels-first layers), else its ``normalized_shape``; ``None`` when
    neither says (a parameterless layer takes any width) or it normalises over several dimensions.

    The one rule satmon counts channels by (discovery, the affine map, the converter, the probe).

    Example:
        >>> from torch import nn
        >>> norm_channels(nn.LayerNorm(8)), norm_channels(nn.LayerNorm(8, elementwise_affine=False))
        (8, 8)
        >>> norm_channels(nn.LayerNorm([4, 4])), norm_channels(nn.Identity())
        (None, None)
    """
    sizes = []
    for p in module.parameters(recurse=False):
        big = [s for s in p.shape if s > 1]
        if len(big) == 1:
            sizes.append(big[0])
    if sizes:
        return max(set(sizes), key=sizes.count)
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int) and not isinstance(shape, bool):
        return shape
    if isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1:
        return int(shape[0])
    return None


def _vector_like(p: torch.Tensor) -> bool:
    return sum(s > 1 for s in p.shape) <= 1


def _is_candidate(module: nn.Module) -> bool:
    """Worth evaluating: no parametrised submodule, own parameters scalars or vectors, and either
    parameters or a normaliser's attributes (a parameterless forward is run only when it looks like one);
    a module whose own parameters have several dimensions (a per-head gain) when it looks like one."""
    if any(True for c in module.children() for _ in c.parameters()):
        return False
    own = list(module.parameters(recurse=False))
    named = any(hasattr(module, a) for a in _NORM_ATTRS) or bool(_NORM_NAME.search(type(module).__name__))
    # a gain of several dimensions (per head) only on a module that says it normalises: others are run by include=
    if own:
        return all(_vector_like(p) for p in own) or named
    return named


# ----------------------------------------------------------------------------------- reading one module
_CANNOT_RUN = "cannot run"
_cache: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, Reading | None]] = weakref.WeakKeyDictionary()


def _signature(module: nn.Module) -> tuple:
    return (type(module), tuple((n, tuple(p.shape)) for n, p in module.named_parameters(recurse=False)))


def read_module(module: nn.Module, selected: bool = False) -> Reading | None:
    """What ``module`` computes, or ``None`` when it is no normaliser satmon reads.

    Args:
        module: any module.
        selected: evaluate it even when it is no candidate (``include=`` selected it).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Scaled(nn.Module):  # an RMSNorm whose gain is called `g`
        ...     def __init__(self, d):
        ...         super().__init__()
        ...         self.g = nn.Parameter(torch.ones(d))
        ...     def forward(self, x):
        ...         return self.g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        >>> r = read_module(Scaled(8))
        >>> r.kind, r.channels, r.axis, r.basis
        ('rmsnorm', 8, -1, 'behaviour')
    """
    key = (_signature(module), selected)
    cached = _cache.get(module)
    if cached is not None and (cached[0] == key or cached[0] == (key[0], False) and cached[1] is not None):
        return cached[1]  # a module read as a normaliser is one whether include= selected it or not
    with ev.on_host():  # the test inputs hold values, also when the model is built under torch.device("meta")
        reading = _read(module, selected)
    if reading is None or reading.basis != "names":  # a module that could not run is asked again next time
        _cache[module] = (key, reading)
    return reading


def _read(module: nn.Module, selected: bool) -> Reading | None:
    from satmon.dyt import DyT

    c = norm_channels(module)
    if isinstance(module, DyT):
        return Reading("dyt", "tanh", None, c, -1 if module.channels_last else 1, "type")
    cls = type(module)
    if cls in (nn.LayerNorm, getattr(nn, "RMSNorm", None)):
        kind: NormKind = "layernorm" if cls is nn.LayerNorm else "rmsnorm"
        dims = len(module.normalized_shape)
        return Reading(kind, channels=c, basis="type", note="" if dims == 1 else f"normalises over {dims} dimensions")
    if cls.__module__.startswith("torch.nn.modules") or not (selected or _is_candidate(module)):
        # torch's own other layers (BatchNorm, GroupNorm, activations, ...) are not normalisers satmon reads
        return None
    own = dict(module.named_parameters(recurse=False))
    shape = _gain_shape(own)
    if shape is not None:  # a gain over several dimensions: (heads, head_dim), or a norm over all of them
        found = _grouped(module, shape)
        if isinstance(found, Reading):
            return found
        if found == _CANNOT_RUN:
            return _by_names(module, own, c)
        return (
            Reading(
                "unknown",
                channels=c,
                note=(
                    f"{cls.__name__} has a gain of shape {shape} and, run on (batch, tokens, "
                    f"{', '.join(map(str, shape))}) test "
                    "inputs, computes gain * normalize(x) + bias over neither the last dimension nor all of them"
                ),
            )
            if _NORM_NAME.search(cls.__name__) or any(hasattr(module, a) for a in _NORM_ATTRS)
            else None
        )
    failures = []
    if "alpha" in own:
        found = _pointwise(module, c or 8, own)
        if isinstance(found, Reading):
            return found
        if found == _CANNOT_RUN:
            failures.append("point-wise")
    found = _normaliser(module, c)
    if isinstance(found, Reading):
        return found
    if found == _CANNOT_RUN:
        failures.append("normaliser")
    if not failures or (len(failures) == 1 and "alpha" in own and failures[0] == "normaliser"):
        if _NORM_NAME.search(cls.__name__):  # names may say "unknown", never "no"
            return Reading(
                "unknown",
                channels=c,
                note=(
                    f"{cls.__name__} is named like a normaliser but, run on test inputs, computes neither "
                    "weight * f(alpha * x + s) "
                    "+ bias nor gain * normalize(x) + bias along any axis"
                ),
            )
        return None  # it ran and computes something else
    return _by_names(module, own, c)


def _by_names(module: nn.Module, own: dict, c: int | None) -> Reading | None:
    """The module could not run on a copy: its names may say what it is, never what it is not."""
    cls = type(module)
    note = f"{cls.__name__} could not be run on a copy of itself (float64 CPU, nor its own device and dtype)"
    lacking = _meta_lack(module)
    if lacking:
        note = (
            f"{cls.__name__} is on the meta device and reading it needs a value meta does not hold ({lacking}): "
            "build the model on the CPU to read it"
        )
    if "alpha" in own:
        source = _forward_source(cls)
        function = next((f for f in ("erf", "hardtanh", "tanh") if f in source), None)
        if function or _DYT_NAME.search(cls.__name__):
            return Reading("dyt", function or "tanh", None, c, -1, "names", note + ": taken as DyT by its names")
    if _NORM_NAME.search(cls.__name__) or any(hasattr(module, a) for a in _NORM_ATTRS):
        return Reading("unknown", channels=c, basis="names", note=note + ": named like a normaliser, kind unknown")
    return None


def _meta_lack(module: nn.Module) -> str:
    """What a copy of a module on the meta device would need that meta does not hold
    (``""``: nothing, or not on meta)."""
    if not any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        return ""
    floats = tuple(n for n, p in module.named_parameters(recurse=False) if p.is_floating_point())
    try:
        ev.clone(module, randomize=floats)
    except ev.OnMeta as err:
        return str(err)
    return ""


def _forward_source(cls: type) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


def _devices(module: nn.Module) -> list[tuple[torch.device, torch.dtype]]:
    """Float64 on the CPU first; then the module's own device and dtype (kernels written for it)."""
    out = [(torch.device("cpu"), torch.float64)]
    p = next(iter(module.parameters(recurse=False)), None)
    if p is None:
        p = next(iter(module.buffers(recurse=False)), None)
    if (
        p is not None
        and p.device.type != "meta"
        and (p.device.type != "cpu" or p.dtype != torch.float64)
        and p.is_floating_point()
    ):
        out.append((p.device, p.dtype if p.dtype != torch.float64 else torch.float32))
    return out


def _pointwise(module: nn.Module, c: int, own: dict[str, torch.Tensor]) -> Reading | str | None:
    """``w * f(alpha * x + s) + b`` for f in tanh / erf / hardtanh; the shift found by setting it."""
    others = tuple(n for n, p in own.items() if n != "alpha" and p.is_floating_point())
    shifts = [n for n in others if own[n].numel() in (1, c)]
    ran = False
    for device, dtype in _devices(module):
        tol = ev.tolerance(dtype)
        for layout in ev.layouts(c):
            axis = layout[1]
            x = ev.spread(layout, dtype, device)
            for shift in [*shifts, None]:
                fill = {"alpha": _ALPHA, **({shift: _SHIFT} if shift else {})}
                try:
                    y = ev.run(
                        ev.clone(module, device, dtype, fill=fill, randomize=tuple(o for o in others if o != shift)), x
                    )
                except Exception:
                    break  # this layout does not suit the layer
                ran = True
                u = _ALPHA * x.to(torch.float64) + (_SHIFT if shift else 0.0)
                rows = ev.to_rows(y, axis)
                for name in POINTWISE_FUNCTIONS:
                    if ev.fit_per_channel(ev.to_rows(pointwise_function(name, u), axis), rows)[2] <= tol:
                        return Reading("dyt", name, shift, norm_channels(module), axis, "behaviour")
        if ran:
            return None
    return _CANNOT_RUN


def _first_fit(
    module: nn.Module, attempts: Callable[[torch.device, torch.dtype], Iterator[Callable[[], Reading | None]]]
) -> Reading | str | None:
    """The first reading the attempts find on a copy (float64 CPU, then the module's own device and dtype);
    ``None`` when some attempt ran on a device and none fitted, :data:`_CANNOT_RUN` when none could run."""
    for device, dtype in _devices(module):
        ran = False
        for attempt in attempts(device, dtype):
            try:
                found = attempt()
            except Exception:
                continue  # this layout does not suit the layer
            ran = True
            if found is not None:
                return found
        if ran:
            return None
    return _CANNOT_RUN


def _normaliser(module: nn.Module, c: int | None) -> Reading | str | None:
    """``g * normalize(x) + b`` (LayerNorm or RMSNorm normalisation) along some axis."""
    own = tuple(n for n, p in module.named_parameters(recurse=False) if p.is_floating_point())

    def attempts(device: torch.device, dtype: torch.dtype) -> Iterator[Callable[[], Reading | None]]:
        for layout in ev.layouts(c or 16):

            def attempt(layout: ev.Layout = layout) -> Reading | None:
                fit = fit_normalisation(ev.clone(module, device, dtype, randomize=own), layout, dtype, device)
                return None if fit is None else Reading(fit.kind, channels=c, axis=layout[1], basis="behaviour")

            yield attempt

    return _first_fit(module, attempts)


def _gain_shape(own: dict[str, torch.Tensor]) -> tuple[int, ...] | None:
    """The shape the own parameters broadcast to, leading ones dropped, when it has several dimensions above 1
    (a per-head gain); ``None`` when every parameter is a scalar or a vector (one value per channel)."""
    shapes = [tuple(p.shape) for p in own.values() if p.is_floating_point() and p.dim() > 0]
    if not shapes or all(_vector_like(p) for p in own.values()):
        return None
    try:
        shape = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape if sum(s > 1 for s in shape) > 1 else None


def _grouped(module: nn.Module, shape: tuple[int, ...]) -> Reading | str | None:
    """``g * normalize(x) + b`` with ``g`` and ``b`` of ``shape`` (per head and channel), the statistics taken over
    the last dimension (a per-head QK-norm) or over all of ``shape``'s dimensions, on ``(2, T, *shape)`` inputs."""
    params = tuple(n for n, p in module.named_parameters(recurse=False) if p.is_floating_point())

    def attempts(device: torch.device, dtype: torch.dtype) -> Iterator[Callable[[], Reading | None]]:
        def attempt() -> Reading | None:
            found = fit_grouped(ev.clone(module, device, dtype, randomize=params), shape, dtype, device)
            if found is None:
                return None
            kind, dims = found
            note = (
                f"gain of shape {shape}: per {'head' if len(shape) == 2 else 'group'}, "
                "statistics over the last dimension"
                if dims == 1
                else f"normalises over {dims} dimensions {shape}"
            )
            return Reading(
                kind, channels=shape[-1] if dims == 1 else None, axis=-1, basis="behaviour", note=note, gain_shape=shape
            )

        yield attempt

    return _first_fit(module, attempts)


def norm_kind(module: nn.Module) -> NormKind | None:
    """Classify one module as ``"dyt"``, ``"layernorm"``, ``"rmsnorm"`` or ``None``, by what it computes.

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> norm_kind(DyT(8)), norm_kind(nn.LayerNorm(8)), norm_kind(nn.Linear(2, 2))
        ('dyt', 'layernorm', None)
    """
    r = read_module(module)
    return None if r is None or r.kind == "unknown" else r.kind


def selects(selector: Selector, name: str, module: nn.Module) -> bool:
    """Whether ``include=``/``exclude=`` (a regex on the stripped name, or a predicate ``(name, module) -> bool``)
    selects a module; ``None`` selects nothing.

    Example:
        >>> from torch import nn
        >>> selects(r"ln_f$", "ln_f", nn.LayerNorm(4)), selects(None, "ln_f", nn.LayerNorm(4))
        (True, False)
    """
    if selector is None:
        return False
    if isinstance(selector, str):
        return re.search(selector, name) is not None
    return bool(selector(name, module))


def check_selector(value: Selector, what: str) -> None:
    """``include=``/``exclude=`` must be a regex or a predicate."""
    if value is not None and not (isinstance(value, str) or callable(value)):
        raise TypeError(
            f"Expected `{what}` to be a regex string or a predicate (name, module) -> bool, got {type(value).__name__}."
        )


def __getattr__(name: str):
    """The finders lived here until satmon 0.4 (``satmon.find_norm_layers`` is their public path): they read the
    model map, so they moved to :mod:`satmon.model.map`; the old path reads them there, with a warning."""
    from satmon import _compat

    return _compat.moved_attribute(__name__, name)
