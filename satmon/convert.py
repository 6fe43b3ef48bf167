"""Swap LayerNorm (and, on request, RMSNorm) layers for DyT, in place.

With ``copy_affine=True`` the DyT takes the norm's *effective* gain and bias, read from what the
layer computes (:func:`satmon.model.affine.effective_affine`), not its ``weight`` attribute:
a Gemma-style RMSNorm computes ``x_hat * (1 + weight)``, so its gain is ``1 + weight``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from satmon.model.discovery import find_blocks, find_norm_layers
from satmon.dyt import DyT
from satmon.model.affine import effective_affine

__all__ = ["convert_to_dyt", "norm_position"]

Position = Literal["attn", "mlp", "final"]


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
    positions: dict[str, Position] = {}
    for block_name, block in find_blocks(model):
        for i, layer in enumerate(find_norm_layers(block)):
            positions[f"{block_name}.{layer.name}"] = "attn" if i == 0 else "mlp"
    for layer in find_norm_layers(model):
        positions.setdefault(layer.name, "final")
    return positions


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
) -> nn.Module:
    """Replace every LayerNorm (and optionally RMSNorm) layer of ``module`` by a :class:`DyT`, in place.

    Like the official converter, the new DyT starts fresh (``weight`` = 1, ``bias`` = 0) unless
    ``copy_affine=True`` copies the norm's effective gain (gamma) and bias (beta): the values the
    layer actually multiplies and adds (``1 + weight`` for Gemma-style RMSNorms), read by
    :func:`~satmon.model.affine.effective_affine`.

    Args:
        module: the model (changed in place and returned).
        alpha_init: ``alpha`` for every converted layer (DyT paper default 0.5; the regime study used 2.0).
        alpha_init_attn: override for pre-attention norms (LLaMA-style DyT: e.g. 0.8).
        alpha_init_mlp: override for pre-MLP norms (e.g. 0.2).
        alpha_init_final: override for norms outside the blocks (the final norm, e.g. 0.2).
        rmsnorm: also convert RMSNorm-like layers (they get no bias unless ``bias=True``).
        copy_affine: copy the effective gamma/beta into the DyT's ``weight``/``bias``.
        bias: force a bias on or off; default: keep whatever the replaced layer had (with
            ``copy_affine``: a bias when the layer has a bias parameter or adds a non-zero bias).
        position_fn: ``(name, layer) -> "attn" | "mlp" | "final"`` when :func:`norm_position`'s rule
            does not fit your model.

    Returns:
        ``module`` itself (or the new DyT when ``module`` itself was a norm layer).

    Raises:
        ValueError: a LayerNorm normalizes over more than one dimension (DyT needs one channel axis),
            or, with ``copy_affine=True``, a layer's affine map cannot be determined (the message
            names the layer; exclude it from conversion or convert without ``copy_affine``).

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
        >>> model = convert_to_dyt(model, alpha_init=2.0)
        >>> type(model[1]).__name__, model[1].alpha.item()
        ('DyT', 2.0)
    """
    kinds = ("layernorm", "rmsnorm") if rmsnorm else ("layernorm",)
    positions = norm_position(module)
    overrides = {"attn": alpha_init_attn, "mlp": alpha_init_mlp, "final": alpha_init_final}
    if not list(module.children()):  # the module is itself a norm layer
        wrapper = nn.Sequential(module)
        convert_to_dyt(wrapper, alpha_init, alpha_init_attn=alpha_init_attn, alpha_init_mlp=alpha_init_mlp,
                       alpha_init_final=alpha_init_final, rmsnorm=rmsnorm, copy_affine=copy_affine, bias=bias,
                       position_fn=position_fn)
        return wrapper[0]
    raw_names = {id(m): n for n, m in module.named_modules()}  # setattr needs the unstripped path
    layers = find_norm_layers(module, kinds=kinds)  # type: ignore[arg-type]
    # read every layer first, so a refusal leaves the model untouched
    plans = [(layer, _channels(layer.name, layer.module)) for layer in layers]
    affines = [_affine(layer.name, layer.module, c) if copy_affine else None for layer, c in plans]
    for (layer, channels), affine in zip(plans, affines):
        norm = layer.module
        position = position_fn(layer.name, norm) if position_fn else positions.get(layer.name, "final")
        alpha = overrides.get(position)
        old_bias = getattr(norm, "bias", None)
        has_bias = bias if bias is not None else isinstance(old_bias, torch.Tensor) or (affine is not None and affine.bias is not None)
        if affine is not None and affine.bias is not None and not has_bias:
            warnings.warn(f"convert_to_dyt: {layer.name} adds a non-zero bias that bias=False drops.", UserWarning, stacklevel=2)
        new = DyT(channels, alpha_init=alpha_init if alpha is None else alpha, bias=has_bias)
        weight = getattr(norm, "weight", None)
        ref = weight if isinstance(weight, torch.Tensor) else next(norm.parameters(), None)
        if ref is not None:
            new = new.to(device=ref.device, dtype=ref.dtype)
        if affine is not None:
            with torch.no_grad():
                new.weight.copy_(affine.gain)
                if new.bias is not None:
                    new.bias.copy_(affine.bias if affine.bias is not None else torch.zeros_like(affine.gain))
        parent_name, _, child = raw_names[id(norm)].rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, new)
    return module


def _channels(name: str, norm: nn.Module) -> int:
    shape = getattr(norm, "normalized_shape", None)
    weight = getattr(norm, "weight", None)
    if shape is None:
        shape = (weight.shape[0],) if isinstance(weight, torch.Tensor) else None
    if shape is None or len(tuple(shape) if not isinstance(shape, int) else (shape,)) != 1:
        raise ValueError(
            f"Expected {name} to normalize over one channel dimension, got normalized_shape={shape}. "
            "DyT replaces norms over a single channel axis; exclude this layer or reshape first."
        )
    return shape if isinstance(shape, int) else tuple(shape)[0]


def _affine(name: str, norm: nn.Module, channels: int):
    try:
        return effective_affine(norm, dim=channels)
    except ValueError as err:
        raise ValueError(
            f"convert_to_dyt(copy_affine=True) cannot read the gain/bias of {name} "
            f"({type(norm).__name__}): {err} Convert without copy_affine, or exclude this layer."
        ) from err
