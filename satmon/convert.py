"""Swap LayerNorm (and, on request, RMSNorm) layers for DyT, in place.

Which layers are LayerNorm or RMSNorm, along which axis they normalise and how many channels they
have all come from the model map (:func:`satmon.model.map.model_map`: found by what each layer
computes, not by its class or parameter names). A channels-first layer (``(B, C, H, W)``,
normalised over ``C``) becomes a channels-first DyT, with its gain and bias per channel over ``C``.
With ``copy_affine=True`` the DyT takes the norm's *effective* gain and bias, read from what the
layer computes (:func:`satmon.model.affine.effective_affine`), not its ``weight`` attribute: a
Gemma-style RMSNorm computes ``x_hat * (1 + weight)``, so its gain is ``1 + weight``.

Conversion never breaks a model. A layer DyT cannot stand in for is left as it is and named in one
warning, the rest converted: a norm called with more than one input (Mamba2's gated ``norm(y, gate)``,
a fused ``norm(x, residual)``: read from a traced forward, else from the block's source, and left when
neither shows a one-input call), a norm without a known width (parameterless, like Llama4's QK-norm, or
over several dimensions) and a norm whose gain is not one value per channel (a per-head ``(heads,
head_dim)`` gain). Each converted layer remembers the norm it replaced until the converted forward has
run once on a real batch (:func:`check_conversion`: ``convert_to_dyt(example_input=...)``, and
:func:`satmon.probe`, ``satmon replay`` and the screen's first step on theirs): a layer that cannot run
there is put back, with a warning.
"""

from __future__ import annotations

import inspect
import itertools
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from satmon.batches import ForwardFn, feed
from satmon.dyt import DyT
from satmon.model.affine import effective_affine
from satmon.model.dataflow import own_forward
from satmon.model.discovery import NormLayer, Selector, selects
from satmon.model.dyt_init import follow_hf_init
from satmon.model.frozen_forward import frozen_forward
from satmon.model.map import ModelMap, model_map
from satmon.model.source_flow import call_inputs

__all__ = ["check_conversion", "convert_to_dyt", "norm_position", "pending_conversion"]

Position = Literal["attn", "mlp", "final"]


def _positions(m: ModelMap) -> dict[str, Position]:
    positions: dict[str, Position] = {}
    seen: dict[str, int] = {}
    for layer in m.norms:
        if layer.block is None:
            positions[layer.name] = "final"
            continue
        i = seen.get(layer.block, 0)
        seen[layer.block] = i + 1
        positions[layer.name] = "attn" if i == 0 else "mlp"
    return positions


def norm_position(model: nn.Module) -> dict[str, Position]:
    """Guess each norm layer's position: pre-attention, pre-MLP, or final (outside the blocks).

    Rule: inside each residual block (see :func:`satmon.model.map.find_blocks`) the first norm in
    registration order is pre-attention, the second pre-MLP (a third and later: pre-MLP too);
    norm layers outside the blocks are "final".

    Example:
        >>> from satmon.demos.gpt import GPT, GPTConfig
        >>> pos = norm_position(GPT(GPTConfig(n_layers=1)))
        >>> pos["blocks.0.ln_1"], pos["blocks.0.ln_2"], pos["ln_f"]
        ('attn', 'mlp', 'final')
    """
    return _positions(model_map(model))


def convert_to_dyt(
    module: nn.Module,
    alpha_init: float = 0.5,
    *,
    alpha_init_attn: float | None = None,
    alpha_init_mlp: float | None = None,
    alpha_init_final: float | None = None,
    rmsnorm: bool = False,
    copy_affine: bool = False,
    bias: bool | None = None,
    position_fn: Callable[[str, nn.Module], Position] | None = None,
    include: Selector = None,
    exclude: Selector = None,
    example_input: Any = None,
    forward_fn: ForwardFn | None = None,
) -> nn.Module:
    """Replace every LayerNorm (and optionally RMSNorm) layer of ``module`` by a :class:`DyT`, in place.

    Like the official converter, the new DyT starts fresh (``weight`` = 1, ``bias`` = 0) unless
    ``copy_affine=True`` copies the norm's effective gain (gamma) and bias (beta): the values the
    layer actually multiplies and adds (``1 + weight`` for Gemma-style RMSNorms, a gain called ``g``
    or ``scale`` as well), read by :func:`~satmon.model.affine.effective_affine`. A channels-first
    layer becomes ``DyT(C, channels_last=False)``. Nothing converted gives a warning that says what
    the model holds.

    A layer DyT cannot stand in for is left as it is, and every such layer is named in one warning:
    a norm called with more than one input (a gated ``norm(y, gate)``; read from a traced forward when
    ``example_input`` is given, else from the block's source), one without a known width (a
    parameterless QK-norm), one whose gain is not one value per channel (per head). With
    ``example_input`` the converted model then runs it once (:func:`check_conversion`): a layer that
    cannot run as DyT is put back; without it, the next batch satmon sees does that check.

    Args:
        module: the model (changed in place and returned).
        alpha_init: ``alpha`` for every converted layer (DyT paper default 0.5; the regime study used 2.0).
        alpha_init_attn: override for pre-attention norms (LLaMA-style DyT: e.g. 0.8).
        alpha_init_mlp: override for pre-MLP norms (e.g. 0.2).
        alpha_init_final: override for norms outside the blocks (the final norm, e.g. 0.2).
        rmsnorm: also convert RMSNorm-like layers (they get no bias unless ``bias=True``).
        copy_affine: copy the effective gamma/beta into the DyT's ``weight``/``bias``.
        bias: force a bias on or off; default: keep whatever the replaced layer had (with
            ``copy_affine``: a bias when the layer adds a non-zero bias or has a parameter it adds).
        position_fn: ``(name, layer) -> "attn" | "mlp" | "final"`` when :func:`norm_position`'s rule
            does not fit your model.
        include, exclude: widen/narrow which layers are read (as in
            :func:`~satmon.model.map.find_norm_layers`): ``exclude=`` keeps a layer as it is.
        example_input: a batch: traced before converting (how each norm is called) and run through
            the converted model after (layers that fail there are put back).
        forward_fn: ``forward_fn(model, example_input)``; default :func:`satmon.batches.feed`.

    Returns:
        ``module`` itself (or the new DyT when ``module`` itself was a norm layer).

    Raises:
        ValueError: with ``copy_affine=True``, a layer's affine map cannot be determined (the message
            names the layer; exclude it or convert without ``copy_affine``); nothing is converted then.

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
        >>> model = convert_to_dyt(model, alpha_init=2.0)
        >>> type(model[1]).__name__, model[1].alpha.item()
        ('DyT', 2.0)
    """
    options = dict(
        alpha_init_attn=alpha_init_attn,
        alpha_init_mlp=alpha_init_mlp,
        alpha_init_final=alpha_init_final,
        rmsnorm=rmsnorm,
        copy_affine=copy_affine,
        bias=bias,
        position_fn=position_fn,
        include=include,
        exclude=exclude,
        example_input=example_input,
        forward_fn=forward_fn,
    )
    if not list(module.children()):  # the module is itself a norm layer
        wrapper = nn.Sequential(module)
        convert_to_dyt(wrapper, alpha_init, **options)  # type: ignore[arg-type]
        return wrapper[0]
    kinds = ("layernorm", "rmsnorm") if rmsnorm else ("layernorm",)
    m = model_map(module, example_input, forward_fn) if example_input is not None else model_map(module)
    positions = _positions(m)
    overrides = {"attn": alpha_init_attn, "mlp": alpha_init_mlp, "final": alpha_init_final}
    found = m.layers(kinds, include=include, exclude=exclude)  # type: ignore[arg-type]
    places = _places(module, {id(l.module) for l in found})
    kept = {l.name: why for l in found if (why := _why_not(l, m, places.get(id(l.module), [])))}
    layers = [l for l in found if l.name not in kept]
    # read every layer first, so a refusal leaves the model untouched
    affines = [_affine(layer, layer.channels) if copy_affine else None for layer in layers]  # type: ignore[arg-type]
    replaced: dict[int, DyT] = {}
    for layer, affine in zip(layers, affines):
        norm, channels = layer.module, int(layer.channels)  # type: ignore[arg-type]
        position = position_fn(layer.name, norm) if position_fn else positions.get(layer.name, "final")
        alpha = overrides.get(position)
        has_bias = (
            bias if bias is not None else _has_bias(norm, channels) or (affine is not None and affine.bias is not None)
        )
        if affine is not None and affine.bias is not None and not has_bias:
            warnings.warn(
                f"convert_to_dyt: {layer.name} adds a non-zero bias that bias=False drops.", UserWarning, stacklevel=2
            )
        new = DyT(
            channels, alpha_init=alpha_init if alpha is None else alpha, bias=has_bias, channels_last=layer.axis == -1
        )
        ref = next(norm.parameters(), None)
        if ref is not None:
            new = new.to(device=ref.device, dtype=ref.dtype)
        if affine is not None:
            with torch.no_grad():
                new.weight.copy_(affine.gain)
                if new.bias is not None:
                    new.bias.copy_(affine.bias if affine.bias is not None else torch.zeros_like(affine.gain))
        replaced[id(norm)] = new
        _SWAPS[new] = _Swap(layer.name, norm, [(weakref.ref(p), a) for p, a in places.get(id(norm), [])])
    for held, where in places.items():  # every attribute that holds a converted norm: a shared module stays shared
        if held in replaced:
            for parent, child in where:
                setattr(parent, child, replaced[held])
    if replaced:  # Hugging Face's init_weights() (after to_empty) initialises the DyT layers too
        follow_hf_init(module)
    if not found:
        _warn_nothing(m, rmsnorm)
    left = {n: why for n, why in m.undetermined.items() if not selects(exclude, n, m.module(n))}
    left.update(kept)
    if (found or kept) and left:
        warnings.warn(
            "convert_to_dyt left as they are: "
            + "; ".join(f"{n} ({why})" for n, why in left.items())
            + ". Convert them by hand if they normalise, or exclude them (exclude=...).",
            UserWarning,
            stacklevel=2,
        )
    if example_input is not None and replaced:
        check_conversion(module, example_input, forward_fn or feed)
    return module


# ----------------------------------------------------------------------------------------- what DyT cannot stand in for
def _places(model: nn.Module, wanted: set[int]) -> dict[int, list[tuple[nn.Module, str]]]:
    """Where each wanted module is held: ``(parent, attribute)`` pairs."""
    out: dict[int, list[tuple[nn.Module, str]]] = {}
    for parent in model.modules():
        for child, held in parent._modules.items():
            if held is not None and id(held) in wanted:
                out.setdefault(id(held), []).append((parent, child))
    return out


def _why_not(layer: NormLayer, m: ModelMap, places: list[tuple[nn.Module, str]]) -> str:
    """Why a DyT cannot replace ``layer`` (``""``: it can)."""
    if layer.gain_shape is not None:
        return (
            f"its gain has shape {layer.gain_shape}, not one value per channel: DyT holds one gain per channel, "
            "so converting it would drop the per-head gains"
        )
    if layer.channels is None:
        shape = getattr(layer.module, "normalized_shape", None)
        what = (
            f"normalized_shape={tuple(shape)}"
            if isinstance(shape, (tuple, list, torch.Size)) and len(shape) > 1
            else "no vector parameter and no normalized_shape (a parameterless norm)"
        )
        return f"no known width ({what}): DyT needs one channel axis and its width"
    return _more_inputs(layer, m, places)


def _more_inputs(layer: NormLayer, m: ModelMap, places: list[tuple[nn.Module, str]]) -> str:
    """Why ``layer`` may be called with more than one input (DyT takes one), ``""`` when it is not."""
    takes = _forward_inputs(layer.module)
    if takes is not None and len(takes) == 1:
        return ""  # forward(x): called otherwise, the norm itself would fail
    trace = m.trace
    if trace is not None and layer.name in trace.executed:
        n = trace.inputs.get(layer.name, 1)
        return "" if n <= 1 else f"a traced forward called it with {n} inputs (a gated or fused norm): DyT takes one"
    counts = []
    for parent, child in places:
        holder, path = _caller(m, parent, child)
        found = call_inputs(holder, path) if holder is not None else None
        if not found:
            counts = None
            break
        counts.extend(found)
    args = ", ".join(takes) if takes else "more than x"
    if not counts:
        return (
            f"its forward takes more than one input ({args}) and no call of it could be read: pass example_input= "
            "to convert_to_dyt to trace one"
        )
    most = max(counts)
    return "" if most <= 1 else f"its block's source calls it with {most} inputs ({args}): DyT takes one"


def _forward_inputs(module: nn.Module) -> list[str] | None:
    """The inputs ``forward`` takes besides ``self`` (``*args``/``**kwargs`` named with their stars)."""
    try:
        params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in params]


def _caller(m: ModelMap, parent: nn.Module, child: str) -> tuple[nn.Module | None, str]:
    """The module whose source calls ``parent.child``: ``parent`` itself, or the module above a container
    (``self.norms[i](x)`` in the block that holds the ``ModuleList``)."""
    path = child
    while isinstance(parent, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
        name = m.name_of(parent)
        if not name:
            return None, path
        above, _, own = name.rpartition(".")
        grand = m.module(above)
        if grand is None:
            return None, path
        parent, path = grand, f"{own}.{path}"
    return parent, path


# ------------------------------------------------------------------------------------------ the check on a batch
@dataclass
class _Swap:
    """A converted layer: its name, the norm it replaced, and where that norm was held (weakly)."""

    name: str
    original: nn.Module
    places: list[tuple[weakref.ref, str]]


#: DyT -> the norm it replaced, until the converted forward has run on a batch
_SWAPS: weakref.WeakKeyDictionary[nn.Module, _Swap] = weakref.WeakKeyDictionary()


class _Refused(Exception):
    """A converted layer was called in a way DyT cannot take: the check's forward stops there."""


def pending_conversion(model: nn.Module) -> bool:
    """Whether ``model`` holds layers :func:`convert_to_dyt` made that no batch has run through yet.

    Example:
        >>> from torch import nn
        >>> model = convert_to_dyt(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
        >>> pending_conversion(model)
        True
    """
    return any(m in _SWAPS for m in model.modules())


def check_conversion(
    model: nn.Module, batch: Any, forward_fn: ForwardFn = feed, *, warn: Callable[[str], None] | None = None
) -> tuple[str, ...]:
    """Run ``batch`` through a model :func:`convert_to_dyt` just changed, and put back the
    layers that cannot run as DyT.

    One no-grad, eval forward (:func:`satmon.model.frozen_forward.frozen_forward`: modes, RNG and buffers restored). A
    converted layer called with more than one input is put back (its original norm) and the forward runs
    again. A forward that fails otherwise is run with every converted layer put back: if that fails too,
    the model fails on this batch anyway and the conversion is kept; if it runs, the layers that broke
    it are found by halving the candidates (a few forwards) and put back. One warning names what was put
    back and why. Layers that ran are checked: a later
    call does nothing (``()``).

    Args:
        model: the converted model (or anything holding it: a LightningModule, a wrapper).
        batch: one batch, fed by ``forward_fn``.
        forward_fn: ``forward_fn(model, batch)``; default :func:`satmon.batches.feed`.
        warn: where the warning goes (default ``warnings.warn``).

    Returns:
        The names of the layers put back.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Block(nn.Module):  # reads an attribute of its norm that a DyT does not have
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.norm, self.proj = nn.LayerNorm(4), nn.Linear(4, 4)
        ...     def forward(self, x):
        ...         return self.proj(self.norm(x)) * (1.0 + self.norm.eps)
        >>> model = convert_to_dyt(Block())
        >>> type(model.norm).__name__, check_conversion(model, torch.randn(2, 4), warn=lambda text: None)
        ('DyT', ('norm',))
        >>> type(model.norm).__name__, pending_conversion(model)
        ('LayerNorm', False)
    """
    swaps = {m: _SWAPS[m] for m in model.modules() if m in _SWAPS}
    if not swaps:
        return ()
    device = next(itertools.chain(model.parameters(), model.buffers()), torch.empty(0)).device
    live, back = dict(swaps), {}

    def run() -> Exception | None:
        return _run(model, batch, forward_fn, device, live, {})

    while True:  # a converted layer called with more than one input goes back, and the forward runs again
        bad: dict[str, str] = {}
        error = _run(model, batch, forward_fn, device, live, bad)
        if error is None or not bad:
            break
        for dyt in [d for d, sw in live.items() if sw.name in bad]:
            _put(live.pop(dyt), dyt, back=True)
        back.update(bad)
    if error is not None:  # a failure no call explains: does the model run with its norms?
        for dyt, sw in live.items():
            _put(sw, dyt, back=True)
        original = _run(model, batch, forward_fn, device, {}, {})
        for dyt, sw in live.items():
            _put(sw, dyt, back=False)
        if original is not None:
            _say(
                warn,
                f"satmon: the layers convert_to_dyt made could not be checked on this batch: the model fails on it "
                f"with its norms too ({type(original).__name__}: {original}); they are kept as converted.",
            )
            return tuple(back)
    while error is not None:  # the conversion broke it: find the layers that did, halving the candidates
        group = list(live)
        while len(group) > 1:
            half = group[: len(group) // 2]
            for dyt in half:
                _put(live[dyt], dyt, back=True)
            fixed = run() is None
            for dyt in half:
                _put(live[dyt], dyt, back=False)
            group = half if fixed else group[len(group) // 2 :]
        culprit = live.pop(group[0])
        _put(culprit, group[0], back=True)
        back[culprit.name] = f"the converted forward raised {type(error).__name__}: {error}; it runs with this norm"
        error = run() if live else None
    for dyt in swaps:
        _SWAPS.pop(dyt, None)
    if back:
        _say(
            warn,
            "satmon: convert_to_dyt put back, as they were, the layers that cannot run as DyT on a real batch: "
            + "; ".join(f"{n} ({why})" for n, why in back.items())
            + ". The other layers stay converted.",
        )
    return tuple(back)


def _run(
    model: nn.Module,
    batch: Any,
    forward_fn: ForwardFn,
    device: torch.device,
    live: dict[nn.Module, _Swap],
    bad: dict[str, str],
) -> Exception | None:
    """One frozen forward with a guard on each converted layer; the exception it raised, or ``None``."""

    def guard(module: nn.Module, args: tuple, kwargs: dict) -> None:
        n = len(args) + len(kwargs)
        if n != 1:
            bad[live[module].name] = f"called with {n} inputs (a gated or fused norm): DyT takes one"
            raise _Refused(live[module].name)

    handles = [d.register_forward_pre_hook(guard, with_kwargs=True) for d in live]
    try:
        with frozen_forward(model, device), own_forward():
            forward_fn(model, batch)
    except Exception as err:  # the check must not stop anything: it reports
        return err
    finally:
        for h in handles:
            h.remove()
    return None


def _put(swap: _Swap, dyt: nn.Module, back: bool) -> None:
    """The original norm back where the DyT is (``back``), or the DyT back where the norm is."""
    old, new = (dyt, swap.original) if back else (swap.original, dyt)
    for ref, child in swap.places:
        parent = ref()
        if parent is not None and parent._modules.get(child) is old:
            setattr(parent, child, new)


def _say(warn: Callable[[str], None] | None, text: str) -> None:
    if warn is not None:
        warn(text)
    else:
        warnings.warn(text, UserWarning, stacklevel=3)


def _has_bias(norm: nn.Module, channels: int) -> bool:
    """The layer has a parameter it could add (``bias``, or a second per-channel vector)."""
    b = getattr(norm, "bias", None)
    if isinstance(b, torch.Tensor):
        return True
    vectors = [p for p in norm.parameters(recurse=False) if p.numel() == channels]
    return len(vectors) >= 2


def _warn_nothing(m: ModelMap, rmsnorm: bool) -> None:
    kinds = [l.kind for l in m.norms]
    found = ", ".join(
        f"{kinds.count(k)} {label}"
        for k, label in (("dyt", "DyT-family"), ("layernorm", "LayerNorm"), ("rmsnorm", "RMSNorm"))
        if kinds.count(k)
    )
    advice = " Pass rmsnorm=True to convert the RMSNorm layers." if not rmsnorm and "rmsnorm" in kinds else ""
    if m.undetermined:
        advice += (
            f" {len(m.undetermined)} layer(s) named like normalisers could not be read "
            f"({', '.join(list(m.undetermined)[:3])}): convert them by hand."
        )
    warnings.warn(
        f"convert_to_dyt converted nothing: the model holds {found or 'no normaliser satmon recognises'} "
        f"(found by what each layer computes).{advice}",
        UserWarning,
        stacklevel=3,
    )


def _affine(layer: NormLayer, channels: int):
    try:
        return effective_affine(layer.module, dim=channels, axis=layer.axis)
    except ValueError as err:
        raise ValueError(
            f"convert_to_dyt(copy_affine=True) cannot read the gain/bias of {layer.name} "
            f"({type(layer.module).__name__}): {err} Convert without copy_affine, or exclude this layer."
        ) from err
