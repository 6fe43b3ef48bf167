"""DyT's init on every path a model is materialised by, and a check that it happened.

A model built on the meta device holds no values: ``to_empty()`` gives it uninitialised memory, and the
init comes from ``reset_parameters()`` on every module (PyTorch's and FSDP2's idiom, which
:meth:`satmon.DyT.reset_parameters` joins) or from Hugging Face's ``init_weights()``, whose
``_init_weights`` knows its own modules and not DyT. :func:`follow_hf_init` makes a converted Hugging Face
model's ``_init_weights`` reset its DyT layers; :func:`dyt_parameter_problems` names a DyT whose parameters
were never initialised (not finite, or values no init gives), so the screen says so before its window starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from satmon.dyt import DyT

__all__ = ["dyt_parameter_problems", "follow_hf_init"]

_ALPHA_RANGE = (1e-6, 1e4)  # |alpha| outside it: no init or training gives it; uninitialised memory often does


class _InitDyT:
    """A Hugging Face model's ``_init_weights`` that resets a DyT and leaves every other module to the model's own.

    Held on the model instance (it pickles and deep-copies with it): ``init_weights()`` then initialises the
    converted layers as it does the layers the model was built with."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner

    def __call__(self, module: nn.Module) -> None:
        if isinstance(module, DyT):
            module.reset_parameters()
        else:
            type(self.owner)._init_weights(self.owner, module)  # type: ignore[attr-defined]


def follow_hf_init(model: nn.Module) -> int:
    """Make every Hugging Face model in ``model`` (the model and its sub-models) initialise its DyT layers.

    Returns how many models were taught. Duck-typed (``_init_weights`` and ``_initialize_weights``, as
    ``transformers.PreTrainedModel`` has): no ``transformers`` import.

    Example:
        >>> from torch import nn
        >>> follow_hf_init(nn.Sequential(DyT(4)))   # not a Hugging Face model: nothing to teach
        0
    """
    taught = 0
    for sub in model.modules():
        if not (callable(getattr(type(sub), "_init_weights", None)) and hasattr(sub, "_initialize_weights")):
            continue
        if isinstance(sub.__dict__.get("_init_weights"), _InitDyT):
            continue
        if any(isinstance(m, DyT) for m in sub.modules()):
            sub.__dict__["_init_weights"] = _InitDyT(sub)
            taught += 1
    return taught


def _local(p: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), a plain tensor as it is."""
    return p.to_local() if hasattr(p, "to_local") else p  # type: ignore[operator]


@torch.no_grad()
def dyt_parameter_problems(layers: Iterable[tuple[str, nn.Module]]) -> list[str]:
    """What is wrong with each DyT layer's parameters, one line a layer: not finite, or values no init gives.

    One host sync for all layers (the screen calls it once, when it attaches). Meta parameters hold no
    values and are not read.

    Example:
        >>> good, bad = DyT(3), DyT(3)
        >>> _ = bad.alpha.data.fill_(1.2e8)
        >>> [p.split(". ")[0] for p in dyt_parameter_problems([("good", good), ("bad", bad)])]
        ['bad: alpha = 1.2e+08, outside what an init or training gives (|alpha| in [1e-06, 10000])']
    """
    named = [(n, m) for n, m in layers if isinstance(getattr(m, "alpha", None), torch.Tensor)]
    named = [(n, m) for n, m in named if not m.alpha.is_meta]
    if not named:
        return []
    rows = []
    for _, m in named:
        alpha = _local(m.alpha).detach().float().reshape(-1)[:1]
        weight = getattr(m, "weight", None)
        w = _local(weight).detach().float().reshape(-1) if isinstance(weight, torch.Tensor) else alpha.new_ones(1)
        b = getattr(m, "bias", None)
        bf = _local(b).detach().float().reshape(-1) if isinstance(b, torch.Tensor) else alpha.new_zeros(1)
        tiny = torch.finfo(
            weight.dtype if isinstance(weight, torch.Tensor) and weight.is_floating_point() else torch.float32
        ).tiny
        subnormal = ((w != 0) & (w.abs() < tiny)).any() if w.numel() else w.new_zeros((), dtype=torch.bool)
        nonfinite = (~torch.isfinite(w)).sum() + (~torch.isfinite(bf)).sum() if w.numel() else alpha.new_zeros(())
        rows.append(
            torch.stack(
                [alpha.reshape(()) if alpha.numel() else alpha.new_tensor(1.0), nonfinite.float(), subnormal.float()]
            ).to("cpu")
        )
    table = torch.stack(rows).tolist()  # the one host sync
    out = []
    for (name, _), (alpha, nonfinite, subnormal) in zip(named, table):
        lo, hi = _ALPHA_RANGE
        why = []
        if not math.isfinite(alpha):
            why.append(f"alpha = {alpha:g} (not finite)")
        elif not lo <= abs(alpha) <= hi:
            why.append(f"alpha = {alpha:.3g}, outside what an init or training gives (|alpha| in [{lo:g}, {hi:g}])")
        if nonfinite:
            why.append(f"{int(nonfinite)} weight/bias value(s) not finite")
        if subnormal:
            why.append("weight holds subnormal values (uninitialised memory's mark)")
        if why:
            out.append(
                f"{name}: {'; '.join(why)}. Its parameters look uninitialised: a model made on the meta device "
                "and materialised with to_empty() keeps whatever was in memory. Call reset_parameters() on every "
                "module that has one (satmon.DyT does) or the model's init_weights(), or load a checkpoint, "
                "before training."
            )
    return out
