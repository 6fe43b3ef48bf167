"""The names rule of gated-MLP detection: the hint given when no traced forward shows the data flow (never the answer:
without a forward every watched layer is "unknown", and these rules only say what the names suggest).

Gated MLPs are recognised by their children's names: ``gate_proj``/``up_proj``/``down_proj`` (HF
LLaMA, Mistral, Qwen, Gemma), ``w1``/``w3``/``w2`` (Meta LLaMA, torchtitan, Mixtral experts),
``wi_0``/``wi_1``/``wo`` (T5 v1.1 GeGLU), and fused gate-up projections (``gate_up_proj`` Phi-3,
``w12`` xformers, or any linear child with ``out_features == 2 * down.in_features`` next to a
``down_proj``/``w2``/``fc2``-like child). ``structural=True`` also accepts opaque child names by shape.
:func:`pair_by_names` (the block's norm whose name says "pre-MLP", or its only norm) is the hint's last resort,
used only where no forward source says which norm's output the MLP reads.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from torch import nn

from satmon.model.discovery import norm_kind

__all__ = ["activation_of", "gated_parts", "pair_by_names"]

# (gate, up, down) child names of split gated MLPs
_SPLIT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"), ("wi_0", "wi_1", "wo"))
_DOWN_NAMES = ("down_proj", "w2", "fc2", "wo", "dense_4h_to_h")
_NOT_FUSED = re.compile(r"kv|qk|attn")  # fused key-value projections also double their width
# norm names that say "pre-MLP" (a "post_" prefix marks Gemma-2-style norms applied after the MLP),
# then names of a block's second norm, trusted only when no name of the first kind is present
_PRE_MLP_NAME = re.compile(r"(^|_)(mlp|ffn|ff|feed_?forward)(_|$)")  # mlp_norm, ffn_norm, pre_feedforward_layernorm
_SECOND_NORM_NAME = re.compile(r"^(post_attention_layernorm|ln_?2|norm_?2|layer_?norm_?2)$")


def _features(m: nn.Module) -> tuple[int, int] | None:
    i, o = getattr(m, "in_features", None), getattr(m, "out_features", None)
    return (i, o) if isinstance(i, int) and isinstance(o, int) else None


def _is_norm(m: nn.Module) -> bool:
    return norm_kind(m) is not None


def _classify_activation(obj: Any) -> str | None:
    if isinstance(obj, nn.GELU):
        return "gelu_tanh" if obj.approximate == "tanh" else "gelu"
    text = obj if isinstance(obj, str) else getattr(obj, "__name__", None) or type(obj).__name__
    text = text.lower()
    if "silu" in text or "swish" in text:
        return "silu"
    if "gelu" in text:
        return "gelu_tanh" if any(k in text for k in ("tanh", "new", "fast", "approx")) else "gelu"
    return None


def activation_of(mlp: nn.Module) -> str:
    """Activation of a gated MLP: from its child modules/attributes, its config, then its forward source."""
    for value in list(mlp._modules.values()) + list(vars(mlp).values()):
        if callable(value) or isinstance(value, str):
            found = _classify_activation(value) if not isinstance(value, nn.Linear) else None
            if found:
                return found
    config = getattr(mlp, "config", None)
    for key in ("hidden_act", "hidden_activation", "dense_act_fn", "activation_function"):
        found = _classify_activation(getattr(config, key, "") or "")
        if found:
            return found
    try:
        found = _classify_activation(inspect.getsource(type(mlp).forward))
    except (OSError, TypeError):
        found = None
    others = [type(c).__name__.lower() for c in mlp.children() if type(c).__module__ == nn.ReLU.__module__]
    return found or (others[0] if others else "unknown")  # e.g. "relu" for ReGLU


def gated_parts(mlp: nn.Module, structural: bool = False) -> dict[str, Any] | None:
    """``{gate, up, down, fused, note}`` (child names) when ``mlp`` is a gated MLP, else None.

    ``structural`` also accepts opaque child names by shape (user-mapped modules, and the
    "looks gated" hint when no forward can be traced).
    """
    children = dict(mlp.named_children())
    for gate, up, down in _SPLIT_NAMES:
        if all(n in children for n in (gate, up, down)):
            return {"gate": gate, "up": up, "down": down, "fused": False, "note": ""}
    shapes = {n: f for n, c in children.items() if (f := _features(c)) is not None}
    for name, (i, o) in shapes.items():  # fused gate-up: out == 2 * down.in and down.out == in
        if _NOT_FUSED.search(name):
            continue
        conventional = "gate_up" in name or name == "w12"
        downs = [n for n, (di, do) in shapes.items() if n != name and 2 * di == o and do == i]
        named_downs = [n for n in downs if n in _DOWN_NAMES]
        if (conventional and len(downs) == 1) or len(named_downs) == 1:
            return {"gate": name, "up": None, "down": (named_downs or downs)[0], "fused": True, "note": ""}
    if not structural:
        return None
    items = list(shapes.items())  # two same-shape projections into a third: gate/up told apart by registration order
    for k, (a, fa) in enumerate(items):
        for b, fb in items[k + 1 :]:
            downs = [n for n, (di, do) in items if n not in (a, b) and (di, do) == (fa[1], fa[0])]
            if fa == fb and len(downs) == 1:
                note = f"{a!r}/{b!r} taken as gate/up by registration order; pass example_input to verify"
                return {"gate": a, "up": b, "down": downs[0], "fused": False, "note": note}
    for name, (i, o) in items:  # one projection twice as wide as the down projection's input: fused gate-up
        downs = [n for n, (di, do) in items if n != name and 2 * di == o and do == i]
        if not _NOT_FUSED.search(name) and len(downs) == 1:
            note = f"{name!r} taken as a fused gate-up projection by its shape; pass example_input to verify"
            return {"gate": name, "up": None, "down": downs[0], "fused": True, "note": note}
    return None


def pair_by_names(mlp: str, modules: dict[str, nn.Module], norm_names: set[str]) -> str | None:
    """The feeding norm by names, in the nearest enclosing module that holds any norm; None if unsure."""
    parts = mlp.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        parent = ".".join(parts[:depth])
        prefix = f"{parent}." if parent else ""
        siblings = [
            n
            for n, m in modules.items()
            if n.startswith(prefix) and "." not in n[len(prefix) :] and n != parent and (_is_norm(m) or n in norm_names)
        ]
        if not siblings:
            continue  # keep climbing: MoE experts sit below the block that holds the norm
        leaves = {s: s.rsplit(".", 1)[-1].lower() for s in siblings}
        hits = (
            [s for s, leaf in leaves.items() if _PRE_MLP_NAME.search(leaf) and not leaf.startswith("post")]
            or [s for s, leaf in leaves.items() if _SECOND_NORM_NAME.search(leaf)]
            or [s for s, leaf in leaves.items() if len(siblings) == 1 and not leaf.startswith("post")]  # T5LayerFF
        )
        return hits[0] if len(hits) == 1 and hits[0] in norm_names else None  # else ambiguous or unmonitored
    return None
