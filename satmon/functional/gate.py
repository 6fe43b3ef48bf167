r"""Gate statistics of a gated MLP ``down(act(g) * u)`` with ``g = gate(h)``, ``u = up(h)``.

Pure math, no hooks: a monitor feeds it the gate pre-activations ``g`` and the up-projection
output ``u`` (or one fused ``gate_up`` output, see :func:`split_gate_up`).

Flat region (satmon's definition, not taken from a paper): the saturating negative tail of the
gate activation,

.. math::

    \text{flat}(g) \iff g < t, \qquad
    t = \sup\{\, s : |\mathrm{act}'(x)| < \text{tol} \ \ \forall x < s \,\},
    \qquad \text{tol} = 0.05 .

There the gate is closed (``act(g) ~ 0``) and passes almost no gradient back to ``g``, so the
unit is dead for that token. ``t`` is found numerically once per ``(activation, tol)`` in
float64 and cached: ``t = -4.0826`` for SiLU, ``-2.3486`` for exact GELU, ``-2.3552`` for
tanh-GELU. (SiLU' dips to -0.0998 at ``g = -2.40`` and crosses zero at ``g = -1.28``, so a plain
``|act'(g)| < tol`` test would also flag a thin band around -1.28; the tail definition does not.)

The update returns device tensors (no host sync); sum them over batches and ranks, then call
:func:`gate_stats_finalize`.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ACTIVATIONS",
    "abs_sum",
    "flat_count",
    "flat_threshold",
    "gate_stats",
    "gate_stats_finalize",
    "gate_stats_update",
    "split_gate_up",
]

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(
            f"Expected `activation` in {sorted(ACTIVATIONS)}, got {name!r}."
            " Pass the gate's activation as found by `satmon.model.gating.detect_gating` "
            "(SwiGLU: 'silu', GeGLU: 'gelu')."
        )
    return ACTIVATIONS[name]


@functools.cache
def flat_threshold(activation: str = "silu", tol: float = 0.05) -> float:
    """Left edge ``t`` of the gate activation's flat tail: ``|act'(x)| < tol`` for every ``x < t``.

    Args:
        activation: ``"silu"``, ``"gelu"`` (erf) or ``"gelu_tanh"``.
        tol: derivative magnitude below which the gate counts as flat.

    Returns:
        ``t`` as a float, accurate to ~1e-9 (grid search on [-40, 10] then bisection, in float64).

    Example:
        >>> from satmon.functional.gate import flat_threshold
        >>> round(flat_threshold("silu"), 3), round(flat_threshold("gelu"), 3)
        (-4.083, -2.349)
    """
    if not tol > 0:
        raise ValueError(f"Expected `tol` > 0, got {tol}.")
    act = _activation(activation)

    def slope(x: Tensor) -> Tensor:
        x = x.detach().to(torch.float64).requires_grad_(True)
        (grad,) = torch.autograd.grad(act(x).sum(), x)
        return grad.abs()

    with torch.enable_grad():
        grid = torch.linspace(-40.0, 10.0, 50_001, dtype=torch.float64)
        above = (slope(grid) >= tol).nonzero()
        if above.numel() == 0 or int(above[0]) == 0:
            raise ValueError(f"Expected a `tol` that the derivative of {activation} crosses on [-40, 10], got {tol}.")
        lo, hi = float(grid[int(above[0]) - 1]), float(grid[int(above[0])])
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if float(slope(torch.tensor([mid]))) < tol else (lo, mid)
    return lo


def split_gate_up(gate_up: Tensor, gate_first: bool = True) -> tuple[Tensor, Tensor]:
    """Split a fused ``gate_up`` projection output ``(..., 2H)`` into ``(g, u)``, each ``(..., H)``.

    ``gate_first=True`` follows Phi-3 (``gate, up = gate_up.chunk(2, dim=-1)``).

    Example:
        >>> import torch
        >>> from satmon.functional.gate import split_gate_up
        >>> g, u = split_gate_up(torch.arange(4.0))
        >>> g.tolist(), u.tolist()
        ([0.0, 1.0], [2.0, 3.0])
    """
    if gate_up.shape[-1] % 2:
        raise ValueError(
            f"Expected a fused gate_up output with an even last dim (2 * hidden), got shape {tuple(gate_up.shape)}."
        )
    g, u = gate_up.chunk(2, dim=-1)
    return (g, u) if gate_first else (u, g)


def flat_count(gate: Tensor, threshold: float) -> Tensor:
    """Number of gate pre-activations in the flat region ``g < threshold`` (int64 device tensor, no sync).

    bf16/fp16 gates are compared in float32, so the threshold is not rounded to the gate's dtype.

    Example:
        >>> import torch
        >>> int(flat_count(torch.tensor([-6.0, -4.0, 2.0]), -4.0826))
        1
    """
    g = gate.detach()
    return ((g if g.dtype in (torch.float32, torch.float64) else g.float()) < threshold).sum()


def abs_sum(hidden: Tensor) -> Tensor:
    """``sum |hidden|`` accumulated in float64 (a 0-dim device tensor, no sync): the sum behind ``mean_abs_hidden``.

    Example:
        >>> import torch
        >>> abs_sum(torch.tensor([1.0, -2.5], dtype=torch.bfloat16)).item()
        3.5
    """
    return hidden.detach().abs().sum(dtype=torch.float64)


def gate_stats_update(
    gate: Tensor,
    up: Tensor | None = None,
    activation: str = "silu",
    threshold: float | None = None,
    tol: float = 0.05,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-batch sums for the gate statistics, as device tensors (no host sync).

    Args:
        gate: gate pre-activations ``g = gate(h)``, any shape.
        up: up-projection output ``u``, same shape as ``gate``; ``None`` measures ``|act(g)|`` alone.
        activation: gate activation, one of :data:`ACTIVATIONS`.
        threshold: flat-region edge ``t`` (``g < t`` is flat); default :func:`flat_threshold`.
        tol: derivative tolerance used when ``threshold`` is ``None``.

    Returns:
        ``(n_flat, n_total, sum_abs_hidden)``: int64 count of ``g < t``, int64 element count, and
        the float64 sum of ``|act(g) * u|`` (the MLP hidden activation fed to ``down``; :func:`abs_sum`,
        as the monitor's :class:`~satmon.observe.gate.GateCounter` sums it).

    Example:
        >>> import torch
        >>> from satmon.functional.gate import gate_stats_update
        >>> n_flat, n, s = gate_stats_update(torch.tensor([-6.0, 0.0, 2.0]), torch.tensor([1.0, 1.0, -1.0]))
        >>> int(n_flat), int(n), round(float(s), 4)
        (1, 3, 1.7764)
    """
    if up is not None and up.shape != gate.shape:
        raise ValueError(
            f"Expected `up` with the gate's shape {tuple(gate.shape)}, got {tuple(up.shape)}."
            " For a fused gate_up projection call `split_gate_up` first."
        )
    act = _activation(activation)
    t = flat_threshold(activation, tol) if threshold is None else float(threshold)
    g = gate.detach().float()  # upcast bf16/fp16: the sums below accumulate many elements
    n_flat = flat_count(g, t)  # int64, stays on device
    n_total = torch.full((), g.numel(), dtype=torch.int64, device=g.device)  # a fill, not a host-to-device copy
    hidden = act(g) if up is None else act(g) * up.detach().float()  # (..., H)
    return n_flat, n_total, abs_sum(hidden)


def gate_stats_finalize(n_flat: Tensor, n_total: Tensor, sum_abs_hidden: Tensor) -> dict[str, float]:
    """Turn summed counts into ``flat_fraction`` and ``mean_abs_hidden`` (this syncs with the host).

    Empty totals give NaN rather than raising, so a layer that saw no tokens is visible.

    Example:
        >>> import torch
        >>> from satmon.functional.gate import gate_stats_finalize
        >>> gate_stats_finalize(torch.tensor(1), torch.tensor(4), torch.tensor(2.0))
        {'flat_fraction': 0.25, 'mean_abs_hidden': 0.5}
    """
    total = int(n_total)  # host sync
    if total == 0:
        return {"flat_fraction": math.nan, "mean_abs_hidden": math.nan}
    return {"flat_fraction": int(n_flat) / total, "mean_abs_hidden": float(sum_abs_hidden) / total}


def gate_stats(
    gate: Tensor, up: Tensor | None = None, activation: str = "silu", threshold: float | None = None, tol: float = 0.05
) -> dict[str, float]:
    """One-shot gate statistics: :func:`gate_stats_update` then :func:`gate_stats_finalize`.

    Example:
        >>> import torch
        >>> from satmon.functional.gate import gate_stats
        >>> gate_stats(torch.tensor([-5.0, -5.0, 1.0, 3.0]))["flat_fraction"]
        0.5
    """
    return gate_stats_finalize(*gate_stats_update(gate, up, activation=activation, threshold=threshold, tol=tol))
