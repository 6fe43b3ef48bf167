"""What one :func:`satmon.probe` call reads: the norm layers chosen, the residual streams, their widths.

Widths are read before the forward from the model map (a norm layer's channels; a stream's from
the first norm layer inside its block), so a ``memory_budget`` can be planned before anything
runs; under a budget a tap never grows past its planned width. A channels-first norm layer is read
over its channel axis (every spatial position a token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import nn

from satmon.model.discovery import NormLayer, Selector, norm_channels
from satmon.model.map import find_blocks, model_map
from satmon.observe.covariance import TapTarget
from satmon.results.probe_report import EMBEDDING

__all__ = ["ProbeTargets", "find_probe_targets", "layer_dim"]


@dataclass
class ProbeTargets:
    """The chosen norm layers, the covariance taps in read order, the blocks, and what was skipped.

    Attributes:
        chosen: every norm layer read (DyT included), in registration order.
        dyt: the DyT layers among them.
        norms: LayerNorm/RMSNorm layer name -> layer, for those with a tap.
        block_names: the residual blocks (``X_0`` is the first one's input).
        taps: tap name -> :class:`~satmon.observe.covariance.TapTarget`: norm layers first, then
            ``"embedding"`` and each block.
        skipped: layer or stream -> why it has no reading (filled before and during the run).
    """

    chosen: list[NormLayer]
    dyt: list[NormLayer]
    norms: dict[str, NormLayer]
    block_names: list[str]
    taps: dict[str, TapTarget]
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def streams(self) -> list[str]:
        """``["embedding", *blocks]``, or ``[]`` without blocks."""
        return [EMBEDDING, *self.block_names] if self.block_names else []


def find_probe_targets(
    model: nn.Module,
    layers: list[str] | Selector = None,
    include: Selector = None,
    exclude: Selector = None,
    blocks: list[str] | None = None,
    max_dim: int = 8192,
    budgeted: bool = False,
) -> ProbeTargets:
    """The layers and streams :func:`satmon.probe` reads (its arguments of the same names).

    Args:
        budgeted: a ``memory_budget`` is set: every tap's width must be known before the forward,
            and a tap is capped at its planned width.

    Raises:
        ValueError: no norm layer and no block, an unknown layer name, or (``budgeted``) a width
            that cannot be read before the forward.

    Example:
        >>> from satmon.demos.gpt import GPT, GPTConfig
        >>> t = find_probe_targets(GPT(GPTConfig(norm="layernorm", n_layers=1)))
        >>> list(t.taps), t.taps["embedding"].site
        (['blocks.0.ln_1', 'blocks.0.ln_2', 'ln_f', 'embedding', 'blocks.0'], 'input')
    """
    block_list = find_blocks(model, names=blocks)
    block_names = [n for n, _ in block_list]
    chosen = _select_layers(model, layers, include, exclude, block_names)
    if not chosen and not block_list:
        undetermined = model_map(model).undetermined
        unread = (
            f" ({len(undetermined)} module(s) look like normalisers but could not be read: "
            + "; ".join(f"{n}: {why}" for n, why in list(undetermined.items())[:3])
            + ")"
            if undetermined
            else ""
        )
        raise ValueError(
            "Expected a model with DyT, LayerNorm or RMSNorm layers or residual blocks, found none "
            f"in {type(model).__name__}"
            f"{unread}. Point satmon at them with `include='regex on module names'` and `blocks=[...]`."
        )
    widths = {l.name: l.channels for l in model_map(model).norms if l.channels is not None}
    t = ProbeTargets(chosen, [l for l in chosen if l.kind == "dyt"], {}, block_names, {})
    t.skipped.update(model_map(model).undetermined)  # named like normalisers, but they could not be run: no reading
    for l in chosen:
        if l.kind == "dyt":
            continue
        if l.gain_shape is not None:  # the gamma^-1 kernel is per head: one covariance over the channels would mix them
            t.skipped[l.name] = (
                f"gain of shape {l.gain_shape} ({l.kind}, not one gain per channel): the probe reads "
                "one gain per channel, so it has no reading of a per-head gamma^-1 kernel"
            )
            continue
        d = l.channels
        if d is not None and d > max_dim:
            t.skipped[l.name] = f"d={d} > max_dim={max_dim}"
            continue
        t.norms[l.name] = l
        t.taps[l.name] = _tap(l.name, l.module, "output", d, d or _widest(widths), max_dim, budgeted, l.axis)
    if block_list:
        sites = [(EMBEDDING, block_list[0][1], "input", block_names[0]), *((n, m, "output", n) for n, m in block_list)]
        for name, module, site, block in sites:
            t.taps[name] = _tap(name, module, site, None, _block_width(block, widths), max_dim, budgeted)
    return t


def layer_dim(module: nn.Module) -> int | None:
    """A norm layer's channel count (:func:`satmon.model.discovery.norm_channels`, the one rule);
    ``None`` when it does not say.

    Example:
        >>> layer_dim(nn.LayerNorm(8, elementwise_affine=False)), layer_dim(nn.Identity())
        (8, None)
    """
    return norm_channels(module)


def _tap(
    name: str,
    module: nn.Module,
    site: str,
    dim: int | None,
    planned: int | None,
    max_dim: int,
    budgeted: bool,
    axis: int = -1,
) -> TapTarget:
    """A tap; under a budget it never grows past its planned width, so the plan bounds what it holds."""
    width = None if planned is None else min(planned, max_dim)
    if budgeted and width is None:
        raise ValueError(
            f"Expected to know the width of {name!r} before the forward to plan `memory_budget`, got no norm layer"
            " with a weight to read it from. Pass memory_budget=None, or choose blocks with `blocks=`."
        )
    if not budgeted or width == max_dim:
        return TapTarget(name, module, site, dim, max_dim, width=width, axis=axis)  # type: ignore[arg-type]
    return TapTarget(name, module, site, dim, width, limit_note="the memory plan's d", width=width, axis=axis)  # type: ignore[arg-type]


def _block_width(block: str, widths: dict[str, int]) -> int | None:
    """A stream's width, read before the forward: the block's first norm layer, else the widest norm."""
    inside = [d for n, d in widths.items() if n.startswith(block + ".")]
    return inside[0] if inside else _widest(widths)


def _widest(widths: dict[str, int]) -> int | None:
    return max(widths.values(), default=None)


def _select_layers(
    model: nn.Module, layers: list[str] | Selector, include: Selector, exclude: Selector, block_names: list[str]
) -> list[NormLayer]:
    found = model_map(model).layers(include=include, exclude=exclude)
    if layers is None:
        return found
    by_name = {l.name: l for l in found}
    if isinstance(layers, (list, tuple)):
        unknown = [n for n in layers if n not in by_name]
        if unknown:
            raise ValueError(
                f"Expected `layers` to name discovered norm layers, got unknown {unknown}. Available: {list(by_name)}."
            )
        chosen = set(layers)
    elif isinstance(layers, str):
        chosen = {n for n in by_name if re.search(layers, n)}
    elif callable(layers):
        chosen = {l.name for l in found if layers(l.name, l.module)}
    else:
        raise TypeError(
            "Expected `layers` to be a list of names, a regex or a predicate (name, module) -> bool, "
            f"got {type(layers).__name__}."
        )
    # the final norm (the last one outside every block) is always read
    outside = [l for l in found if not any(l.name == b or l.name.startswith(b + ".") for b in block_names)]
    if outside:
        chosen.add(outside[-1].name)
    return [l for l in found if l.name in chosen]
