"""Swap LayerNorm (and, on request, RMSNorm) layers for DyT, in place.

Which layers are LayerNorm or RMSNorm, along which axis they normalise and how many channels they
have all come from the model map (:func:`satmon.model.map.model_map`: found by what each layer
computes, not by its class or parameter names). A channels-first layer (``(B, C, H, W)``,
normalised over ``C``) becomes a channels-first DyT, with its gain and bias per channel over ``C``.
With ``copy_affine=True`` the DyT takes the norm's *effective* gain and bias, read from what the
layer computes (:func:`satmon.model.affine.effective_affine`), not its ``weight`` attribute: a
Gemma-style RMSNorm computes ``x_hat * (1 + weight)``, so its gain is ``1 + weight``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from satmon.dyt import DyT
from satmon.model.affine import effective_affine
from satmon.model.discovery import NormLayer, Selector, _selected
from satmon.model.map import ModelMap, model_map

__all__ = ["convert_to_dyt", "norm_position"]

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

    Rule: inside each residual block (see :func:`satmon.model.discovery.find_blocks`) the first norm in
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
) -> nn.Module:
    """Replace every LayerNorm (and optionally RMSNorm) layer of ``module`` by a :class:`DyT`, in place.

    Like the official converter, the new DyT starts fresh (``weight`` = 1, ``bias`` = 0) unless
    ``copy_affine=True`` copies the norm's effective gain (gamma) and bias (beta): the values the
    layer actually multiplies and adds (``1 + weight`` for Gemma-style RMSNorms, a gain called ``g``
    or ``scale`` as well), read by :func:`~satmon.model.affine.effective_affine`. A channels-first
    layer becomes ``DyT(C, channels_last=False)``. Nothing converted gives a warning that says what
    the model holds.

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
            :func:`~satmon.model.discovery.find_norm_layers`): ``exclude=`` keeps a layer as it is.

    Returns:
        ``module`` itself (or the new DyT when ``module`` itself was a norm layer).

    Raises:
        ValueError: a LayerNorm normalizes over more than one dimension or has no known width (DyT
            needs one channel axis and its width), or, with ``copy_affine=True``, a layer's affine map
            cannot be determined (the message names the layer; exclude it or convert without ``copy_affine``).

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
        >>> model = convert_to_dyt(model, alpha_init=2.0)
        >>> type(model[1]).__name__, model[1].alpha.item()
        ('DyT', 2.0)
    """
    options = dict(alpha_init_attn=alpha_init_attn, alpha_init_mlp=alpha_init_mlp, alpha_init_final=alpha_init_final,
                   rmsnorm=rmsnorm, copy_affine=copy_affine, bias=bias, position_fn=position_fn, include=include,
                   exclude=exclude)  # fmt: skip
    if not list(module.children()):  # the module is itself a norm layer
        wrapper = nn.Sequential(module)
        convert_to_dyt(wrapper, alpha_init, **options)  # type: ignore[arg-type]
        return wrapper[0]
    kinds = ("layernorm", "rmsnorm") if rmsnorm else ("layernorm",)
    m = model_map(module)
    positions = _positions(m)
    overrides = {"attn": alpha_init_attn, "mlp": alpha_init_mlp, "final": alpha_init_final}
    layers = m.layers(kinds, include=include, exclude=exclude)  # type: ignore[arg-type]
    # read every layer first, so a refusal leaves the model untouched
    plans = [(layer, _channels(layer)) for layer in layers]
    affines = [_affine(layer, c) if copy_affine else None for layer, c in plans]
    replaced: dict[int, DyT] = {}
    for (layer, channels), affine in zip(plans, affines):
        norm = layer.module
        position = position_fn(layer.name, norm) if position_fn else positions.get(layer.name, "final")
        alpha = overrides.get(position)
        has_bias = bias if bias is not None else _has_bias(norm, channels) or (affine is not None and affine.bias is not None)
        if affine is not None and affine.bias is not None and not has_bias:
            warnings.warn(f"convert_to_dyt: {layer.name} adds a non-zero bias that bias=False drops.", UserWarning, stacklevel=2)
        new = DyT(channels, alpha_init=alpha_init if alpha is None else alpha, bias=has_bias, channels_last=layer.axis == -1)
        ref = next(norm.parameters(), None)
        if ref is not None:
            new = new.to(device=ref.device, dtype=ref.dtype)
        if affine is not None:
            with torch.no_grad():
                new.weight.copy_(affine.gain)
                if new.bias is not None:
                    new.bias.copy_(affine.bias if affine.bias is not None else torch.zeros_like(affine.gain))
        replaced[id(norm)] = new
    if replaced:  # every attribute that holds a converted norm: one module shared by several blocks stays shared
        for parent in list(module.modules()):
            for child, held in list(parent._modules.items()):
                if held is not None and id(held) in replaced:
                    setattr(parent, child, replaced[id(held)])
    if not layers:
        _warn_nothing(m, rmsnorm)
    left = {n: why for n, why in m.undetermined.items() if not _selected(n, m.module(n), exclude)}
    if layers and left:
        warnings.warn("convert_to_dyt left as they are: " + "; ".join(f"{n} ({why})" for n, why in left.items())
                      + ". Convert them by hand if they normalise, or exclude them (exclude=...).", UserWarning, stacklevel=2)
    return module


def _has_bias(norm: nn.Module, channels: int) -> bool:
    """The layer has a parameter it could add (``bias``, or a second per-channel vector)."""
    b = getattr(norm, "bias", None)
    if isinstance(b, torch.Tensor):
        return True
    vectors = [p for p in norm.parameters(recurse=False) if p.numel() == channels]
    return len(vectors) >= 2


def _warn_nothing(m: ModelMap, rmsnorm: bool) -> None:
    kinds = [l.kind for l in m.norms]
    found = ", ".join(f"{kinds.count(k)} {label}" for k, label in (("dyt", "DyT-family"), ("layernorm", "LayerNorm"),
                                                                      ("rmsnorm", "RMSNorm")) if kinds.count(k))  # fmt: skip
    advice = " Pass rmsnorm=True to convert the RMSNorm layers." if not rmsnorm and "rmsnorm" in kinds else ""
    if m.undetermined:
        advice += (f" {len(m.undetermined)} layer(s) named like normalisers could not be read "
                   f"({', '.join(list(m.undetermined)[:3])}): convert them by hand.")
    warnings.warn(f"convert_to_dyt converted nothing: the model holds {found or 'no normaliser satmon recognises'} "
                  f"(found by what each layer computes).{advice}", UserWarning, stacklevel=3)


def _channels(layer: NormLayer) -> int:
    if layer.channels is None:
        shape = getattr(layer.module, "normalized_shape", None)
        raise ValueError(
            f"Expected {layer.name} to normalize over one channel dimension of known width, got "
            f"{f'normalized_shape={tuple(shape)}' if shape is not None else 'no vector parameter and no normalized_shape'}. "
            "DyT replaces norms over a single channel axis; exclude this layer (exclude=...) or reshape first.")
    return layer.channels


def _affine(layer: NormLayer, channels: int):
    try:
        return effective_affine(layer.module, dim=channels, axis=layer.axis)
    except ValueError as err:
        raise ValueError(
            f"convert_to_dyt(copy_affine=True) cannot read the gain/bias of {layer.name} "
            f"({type(layer.module).__name__}): {err} Convert without copy_affine, or exclude this layer.") from err
