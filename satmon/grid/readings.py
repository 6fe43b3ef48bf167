"""A cell's readings: the window's (from the screen's verdict and running counts) and the final checkpoint's
(the study's protocol: ``satmon.probe`` in eval mode under bf16 autocast on training-split sequences).

Moved from ``examples/regime_grid.py``. The positional readings (first block, last block, final norm) group
the DyT layers by the first number in their name (``blocks.0.ln_1``, ``model.layers.0.input_layernorm``:
block 0); a DyT layer with no number in its name (``ln_f``, ``model.norm``) is a final norm. A model whose
names carry no block number gives ``NaN`` for the block readings, which the analysis lists as missing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from satmon.grid.config import GridSettings
from satmon.grid.train import WindowSeries, alphas, late_start

__all__ = ["block_of", "final_offset", "final_readings", "positional", "window_readings"]


def block_of(name: str) -> int | None:
    """The block a layer's dotted name places it in: its first purely numeric part (``None``: outside the blocks).

    Example:
        >>> block_of("blocks.1.ln_2"), block_of("model.layers.0.input_layernorm"), block_of("ln_f")
        (1, 0, None)
    """
    for part in name.split("."):
        if re.fullmatch(r"\d+", part):
            return int(part)
    return None


def _mean(vals: list[float]) -> float:
    return sum(vals) / len(vals) if vals else math.nan


def positional(prefix: str, per_layer: dict[str, float]) -> dict[str, float]:
    """The per-layer readings the plan compares across sizes: first block, last block, final norm (each the mean
    of its layers, in the model's order).

    Example:
        >>> positional("w", {"blocks.0.a": 0.2, "blocks.0.b": 0.4, "blocks.1.a": 0.1, "ln_f": 0.5})
        {'w_first_block': 0.30000000000000004, 'w_last_block': 0.1, 'w_final_norm': 0.5}
    """
    blocks = [b for b in (block_of(k) for k in per_layer) if b is not None]
    first, last = (min(blocks), max(blocks)) if blocks else (None, None)
    return {
        f"{prefix}_first_block": _mean([v for k, v in per_layer.items() if blocks and block_of(k) == first]),
        f"{prefix}_last_block": _mean([v for k, v in per_layer.items() if blocks and block_of(k) == last]),
        f"{prefix}_final_norm": _mean([v for k, v in per_layer.items() if block_of(k) is None]),
    }


def window_readings(settings: GridSettings, verdict: Any, series: WindowSeries) -> dict[str, Any]:
    """The window's readings from satmon's verdict and the screen's running counts. ``window_centered`` is the mean
    over layers of each layer's centered fraction (the pooled one where every layer sees equally many elements,
    as in a transformer's blocks)."""
    centered = {k: v["centered"] for k, v in verdict.offset.items()}
    s0, t0 = series.at(late_start(settings))
    s1, t1 = series.at(settings.window)
    late = (sum(s1) - sum(s0)) / (sum(t1) - sum(t0))
    return {
        "window_saturation": verdict.saturation,
        **positional("window", dict(verdict.per_layer)),
        "window_centered": sum(centered.values()) / len(centered) if centered else math.nan,
        "window_late": late,
        "window_decision": verdict.decision,
        "window_margin": verdict.margin,
        "window_flags": list(verdict.flags),
        "window_trust": verdict.trust,
        "window_loss_trend": dict(verdict.loss),
        "window_per_layer": dict(verdict.per_layer),
        "window_centered_per_layer": centered,
        "window_offset_ratio_per_layer": {k: v["offset_ratio"] for k, v in verdict.offset.items()},
        "window_series": series.series(settings.series_every),
    }


def final_offset(model: Any, batches: Sequence[Any], level: float = 2.0, device: str = "cpu") -> dict[str, Any]:
    """Saturation and centered saturation of every DyT input over ``batches``, in the probe's conditions
    (eval mode, no grad, bf16 autocast), from ``satmon.functional.offset``'s float64 sums: the
    final checkpoint's offset-corrected reading, and an independent count beside the probe's."""
    import torch

    from satmon.functional.offset import offset_summary, offset_sums
    from satmon.model.map import find_dyt_layers

    layers = find_dyt_layers(model)
    sums: dict[str, Any] = {}

    def hook(name: str):
        def fn(module: Any, args: tuple, out: Any) -> None:
            s = offset_sums(args[0], module.alpha, level)
            sums[name] = s if name not in sums else sums[name] + s

        return fn

    handles = [l.module.register_forward_hook(hook(l.name)) for l in layers]
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            for x in batches:
                model(x.to(device))
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    per = {n: offset_summary(s) for n, s in sums.items()}
    total = sum(int(s.total) for s in sums.values())
    return {
        "final_centered": sum(int(s.centered_saturated) for s in sums.values()) / total,
        "final_saturation_hook": sum(int(s.saturated) for s in sums.values()) / total,
        "final_centered_per_layer": {n: float(r.centered_fraction) for n, r in per.items()},
        "final_offset_ratio_per_layer": {n: float(r.offset_ratio_median) for n, r in per.items()},
    }


def final_readings(settings: GridSettings, model: Any, seen: Sequence[Any], heldout: Sequence[Any]) -> dict[str, Any]:
    """The study's protocol on the final weights: ``satmon.probe`` in eval mode under bf16 autocast on
    training-split sequences ``seen`` (its ``activation_analysis.py`` reads the training split); the same on
    held-out sequences beside it; the centered saturation of the training-split forwards."""
    import torch

    from satmon.probing.passes import probe

    seen = [x.to(settings.device) for x in seen]
    v = probe(model, seen, autocast_dtype=torch.bfloat16, step=settings.steps).verdict
    held = probe(
        model, [x.to(settings.device) for x in heldout], autocast_dtype=torch.bfloat16, step=settings.steps
    ).verdict
    return {
        "final_saturation": v.saturation,
        **positional("final", dict(v.per_layer)),
        "final_decision": v.decision,
        "final_per_layer": dict(v.per_layer),
        **final_offset(model, seen, device=settings.device),
        "final_alpha": alphas(model),
        "probe_tokens": sum(b.numel() for b in seen),
        "final_saturation_heldout": held.saturation,
        "final_per_layer_heldout": dict(held.per_layer),
    }
