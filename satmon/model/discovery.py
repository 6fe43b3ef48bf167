"""Find the layers satmon watches: DyT, LayerNorm, RMSNorm, and the residual blocks.

Discovery never relies on satmon's own class names, so third-party models (Hugging Face,
nanoGPT, timm, torchtitan) work as they are:

- **DyT**: the study's rule: a module that owns (directly) a parameter named ``alpha`` and computes
  ``weight * tanh(alpha * x) + bias``. Checked by behaviour, not by how tanh is spelled: a float64
  copy of the module is evaluated on a known input and its output must fit that form per channel
  (``torch.tanh`` in forward, an ``nn.Tanh()`` child, a fused op: all the same). Only when the module
  cannot run on a float64 CPU copy does its class name (DyT/DynamicTanh) or the source of its
  ``forward`` (calls ``tanh``) decide.
- **LayerNorm**: ``nn.LayerNorm``, or a class whose name contains ``LayerNorm`` (not ``RMS``) with a
  ``weight`` of one dimension.
- **RMSNorm**: ``nn.RMSNorm`` or a class whose name contains ``RMSNorm``/``RmsNorm``/``RMSNorm``
  (e.g. ``LlamaRMSNorm``, ``T5LayerNorm`` is special-cased: T5's "LayerNorm" has no mean
  subtraction) with a one-dimensional ``weight``.
- **Blocks** (the residual stream): the longest ``nn.ModuleList``/``nn.Sequential`` whose children are
  all of one class and each contain a norm layer.

Users narrow or widen discovery with ``include``/``exclude``: a regex on the module name or a
predicate ``(name, module) -> bool``. :func:`modules_by_name` is the one "module by name" lookup
(wrapper prefixes of ``torch.compile``, DDP, FSDP and activation checkpointing removed).
"""

from __future__ import annotations

import inspect
import re
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import torch
from torch import nn

from satmon.results.probe_report import NormKind  # results/ holds the kinds: model/ and results/ both read them

__all__ = [
    "Selector", "NormLayer", "find_norm_layers", "find_dyt_layers", "find_blocks", "modules_by_name", "norm_kind",
    "strip_wrappers",
]

Selector = Union[str, Callable[[str, nn.Module], bool], None]

_WRAPPER_PARTS = {"_orig_mod", "_forward_module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
_DYT_NAME = re.compile(r"dyt|dynamic_?tanh", re.IGNORECASE)
_RMS_NAME = re.compile(r"rms_?norm", re.IGNORECASE)
_LN_NAME = re.compile(r"layer_?norm", re.IGNORECASE)
_NO_MEAN_LAYERNORMS = ("T5LayerNorm", "MT5LayerNorm", "LongT5LayerNorm", "UMT5LayerNorm", "Pix2StructLayerNorm")
_tanh_cache: dict[type, bool] = {}
#: the behaviour check's answer per module (it does not depend on trained values): one float64 run per module,
#: not one per norm_kind call (gating detection asks several times per module)
_behaviour_cache: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
_DYT_FIT_TOL = 1e-4  # relative residual of the per-channel fit y = w * tanh(alpha * x) + b


@dataclass(frozen=True)
class NormLayer:
    """A discovered normalization layer.

    Attributes:
        name: the module's name in the model, with wrapper prefixes (``_orig_mod.`` of
            ``torch.compile``, ``module.`` of DDP, FSDP's) removed so names are stable.
        module: the module itself.
        kind: ``"dyt"``, ``"layernorm"`` or ``"rmsnorm"``.
        function: for a point-wise normaliser (the DyT family), the bounded function it applies to
            its pre-activation ``u = alpha * x (+ shift)``: ``"tanh"`` (DyT), ``"erf"`` (Derf) or
            ``"hardtanh"``; ``None`` for LayerNorm/RMSNorm.
        shift: the name of the module's parameter ``s`` added to ``alpha * x`` before the function
            (Derf's), or ``None`` when there is none.
    """

    name: str
    module: nn.Module
    kind: NormKind
    function: str | None = None
    shift: str | None = None

    def __post_init__(self) -> None:
        if self.function is None and self.kind == "dyt":
            object.__setattr__(self, "function", "tanh")


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

    The one "module by name" lookup of satmon: names match what :func:`find_norm_layers` reports,
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


def _forward_uses_tanh(cls: type) -> bool:
    if cls not in _tanh_cache:
        try:
            src = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            src = ""
        _tanh_cache[cls] = "tanh" in src
    return _tanh_cache[cls]


def _dyt_channels(module: nn.Module) -> int:
    """The channel count: the length of the module's own vector parameters, whatever they are called."""
    for value in module.parameters(recurse=False):
        if value.numel() > 1:  # (C,), or (C, 1, 1) for channels-first layers
            return max(value.shape)
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int) or (isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1):
        return int(shape if isinstance(shape, int) else shape[0])
    return 4  # scalar affine (or none): any width works


def _fits_tanh(y: torch.Tensor, t: torch.Tensor, dim: int) -> bool:
    """Does ``y = w * t + b`` hold per channel (channels on ``dim``), to a relative residual of 1e-4?"""
    y, t = y.movedim(dim, -1).reshape(-1, y.shape[dim]), t.movedim(dim, -1).reshape(-1, t.shape[dim])  # (N, C)
    dt, dy = t - t.mean(0), y - y.mean(0)
    w = (dt * dy).sum(0) / dt.pow(2).sum(0).clamp_min(1e-300)
    fitted = w * dt + y.mean(0)
    return bool((y - fitted).abs().max() <= _DYT_FIT_TOL * y.abs().max().clamp_min(1e-12))


def _behaves_like_dyt(module: nn.Module) -> bool | None:
    """``weight * tanh(alpha * x) + bias`` on a known input (float64 copy, no hooks); None if it cannot run."""
    from satmon.model.affine import _float64_clone

    c = _dyt_channels(module)
    try:
        clone = _float64_clone(module)
        with torch.no_grad():
            clone.alpha.fill_(0.7)  # the check must not depend on the trained alpha (0 would fit anything constant)
        alpha = clone.alpha.reshape(-1)
    except Exception:
        return None
    ran = False
    for shape, dim in (((3, 5, c), -1), ((2, c, 3, 3), 1)):  # channels last (B, T, C), then first (B, C, H, W)
        # values spread over the tanh's curved range, different in every channel and row
        x = torch.linspace(-3.0, 3.0, int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)
        x = x[..., torch.randperm(shape[-1], generator=torch.Generator().manual_seed(0))] * 1.7
        a = alpha if alpha.numel() == 1 else alpha.reshape([-1 if i == (dim % len(shape)) else 1 for i in range(len(shape))])
        try:
            with torch.no_grad():
                y = clone.forward(x)
                expected = torch.tanh(a * x)  # alpha shaped for the other layout does not broadcast: not this one
        except Exception:
            continue
        ran = True
        if isinstance(y, torch.Tensor) and y.shape == x.shape and _fits_tanh(y.to(torch.float64), expected, dim):
            return True
    return False if ran else None


def _is_dyt(module: nn.Module, own: dict[str, nn.Parameter]) -> bool:
    if "alpha" not in own or any(True for c in module.children() for _ in c.parameters()):
        return False  # a DyT holds no parametrised submodules (an nn.Tanh child is fine)
    cls = type(module)
    behaves = _behaviour_cache.get(module)
    if behaves is None:
        behaves = _behaves_like_dyt(module)
        if behaves is not None:  # None (could not run, e.g. on the meta device) is asked again next time
            _behaviour_cache[module] = behaves
    if behaves is not None:
        return behaves
    return bool(_DYT_NAME.search(cls.__name__)) or _forward_uses_tanh(cls)


def _has_vector_weight(module: nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return isinstance(w, nn.Parameter) and w.dim() == 1 or w is None and hasattr(module, "normalized_shape")


def norm_kind(module: nn.Module) -> NormKind | None:
    """Classify one module as ``"dyt"``, ``"layernorm"``, ``"rmsnorm"`` or ``None``.

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> norm_kind(DyT(8)), norm_kind(nn.LayerNorm(8)), norm_kind(nn.Linear(2, 2))
        ('dyt', 'layernorm', None)
    """
    from satmon.dyt import DyT

    cls = type(module)
    if isinstance(module, DyT):
        return "dyt"
    own = dict(module.named_parameters(recurse=False))
    if _is_dyt(module, own):
        return "dyt"
    if isinstance(module, nn.LayerNorm):
        return "layernorm"
    if hasattr(nn, "RMSNorm") and isinstance(module, nn.RMSNorm):
        return "rmsnorm"
    name = cls.__name__
    if not _has_vector_weight(module) or len(list(module.children())) > 0:
        return None
    if _RMS_NAME.search(name) or name in _NO_MEAN_LAYERNORMS:
        return "rmsnorm"
    if _LN_NAME.search(name):
        return "layernorm"
    return None


def _selected(name: str, module: nn.Module, selector: Selector) -> bool:
    if selector is None:
        return False
    if isinstance(selector, str):
        return re.search(selector, name) is not None
    return bool(selector(name, module))


def find_norm_layers(
    model: nn.Module,
    kinds: tuple[NormKind, ...] = ("dyt", "layernorm", "rmsnorm"),
    include: Selector = None,
    exclude: Selector = None,
) -> list[NormLayer]:
    """Find normalization layers, in registration order.

    Args:
        model: any ``nn.Module`` (compiled, DDP- or FSDP-wrapped models work too).
        kinds: which kinds to return.
        include: a regex on the module name or a predicate ``(name, module) -> bool``. When given,
            modules it selects are included even if the built-in rules do not recognise them; they
            are treated as DyT when they own an ``alpha`` parameter, otherwise by the rules above
            (default ``"layernorm"`` for a selected module with a vector ``weight``). A selected module
            with ``alpha`` that, run on a test input, does not compute ``w * tanh(alpha * x) + b`` is
            left out with a warning: its saturation is not ``|alpha * x| > level``.
        exclude: the same form; modules it selects are dropped.

    Returns:
        The list of :class:`NormLayer`, each module listed once.

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> model = nn.Sequential(nn.Linear(4, 4), DyT(4), nn.LayerNorm(4))
        >>> [(l.name, l.kind) for l in find_norm_layers(model)]
        [('1', 'dyt'), ('2', 'layernorm')]
    """
    if include is not None and not (isinstance(include, str) or callable(include)):
        raise TypeError(f"Expected `include` to be a regex string or a predicate (name, module) -> bool, got {type(include).__name__}.")
    if exclude is not None and not (isinstance(exclude, str) or callable(exclude)):
        raise TypeError(f"Expected `exclude` to be a regex string or a predicate (name, module) -> bool, got {type(exclude).__name__}.")
    seen: set[int] = set()
    found: list[NormLayer] = []
    for raw_name, module in model.named_modules():
        if id(module) in seen or raw_name == "":
            continue
        name = strip_wrappers(raw_name)
        kind = norm_kind(module)
        if kind is None and _selected(name, module, include):
            kind = "dyt" if "alpha" in dict(module.named_parameters(recurse=False)) else "layernorm"
            if kind == "dyt" and _behaves_like_dyt(module) is False:
                _refuse_included(name, module)
                continue
        if kind is None or kind not in kinds or _selected(name, module, exclude):
            continue
        seen.add(id(module))
        found.append(NormLayer(name, module, kind))
    return found


def _refuse_included(name: str, module: nn.Module) -> None:
    """``include=`` selected a module that owns ``alpha`` but is shown not to compute a DyT: counting
    ``|alpha * x| > level`` there would read a saturation its tanh does not have."""
    warnings.warn(
        f"satmon: include= selects {name!r} ({type(module).__name__}), which owns `alpha` but, run on a test input, does "
        "not compute weight * tanh(alpha * x) + bias (alpha rescaled, divided, offset, or no tanh): its saturation is "
        "not |alpha * x| > level, so satmon leaves it out rather than report a wrong number. Select the module that "
        "applies tanh(alpha * x) itself.", UserWarning, stacklevel=3)


def find_dyt_layers(model: nn.Module, include: Selector = None, exclude: Selector = None) -> list[NormLayer]:
    """Find DyT layers (see :func:`find_norm_layers`).

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> [l.name for l in find_dyt_layers(nn.Sequential(DyT(4), nn.ReLU(), DyT(4)))]
        ['0', '2']
    """
    return find_norm_layers(model, kinds=("dyt",), include=include, exclude=exclude)


def find_blocks(model: nn.Module, names: list[str] | None = None) -> list[tuple[str, nn.Module]]:
    """Find the transformer blocks whose outputs form the residual stream.

    Args:
        model: the model.
        names: explicit block module names (overrides discovery), for models where the rule fails.

    Returns:
        ``[(name, module), ...]`` in depth order; empty when no block list is found.

    Example:
        >>> from torch import nn
        >>> block = lambda: nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4))
        >>> model = nn.ModuleDict({"emb": nn.Embedding(5, 4), "h": nn.ModuleList([block(), block()])})
        >>> [n for n, _ in find_blocks(model)]
        ['h.0', 'h.1']
    """
    modules = modules_by_name(model)
    if names is not None:
        missing = [n for n in names if n not in modules]
        if missing:
            raise ValueError(f"Expected block names that exist in the model, got unknown {missing}. Available: {sorted(modules)[:20]}...")
        return [(n, modules[n]) for n in names]
    best: list[tuple[str, nn.Module]] = []
    for name, module in modules.items():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 1:
            continue
        children = list(module.named_children())
        if len({type(c) for _, c in children}) != 1:
            continue
        if not all(any(norm_kind(m) for m in c.modules()) for _, c in children):
            continue
        if len(children) > len(best):
            best = [(f"{name}.{n}" if name else n, c) for n, c in children]
    return best
