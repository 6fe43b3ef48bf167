"""Does a DyT (or other norm) layer feed a gated MLP? Architecture detection for the screen.

The regime study found that high saturation means opposite things in the two cases: useful
regularisation in a non-gated model, collapse risk when DyT feeds a SwiGLU gate
(``down(act(gate(h)) * up(h))``). :func:`detect_gating` finds the gated MLPs and pairs each with
the norm whose output is its input, in this order of trust:

1. ``mapping`` given by the user, ``{norm_name: mlp_module_name}`` (``source="mapping"``);
2. a trace, when ``example_input`` is given: one eval forward with hooks, pairing a norm with the
   MLP whose gate projection receives the norm's output tensor itself (``source="trace"``);
3. names: the nearest enclosing module that holds norms must hold a norm whose name says
   "pre-MLP" (``mlp_norm``, ``ffn_norm``, ``post_attention_layernorm``, ``ln_2``, ...) or exactly
   one norm in all (parallel blocks, T5's ``T5LayerFF``) (``source="names"``).

A gated MLP that none of these pairs is listed in ``unpaired_gated_mlps``: never a guess.
Gated MLPs are found by their children's names: ``gate_proj``/``up_proj``/``down_proj`` (HF
LLaMA, Mistral, Qwen, Gemma), ``w1``/``w3``/``w2`` (Meta LLaMA, torchtitan, Mixtral experts),
``wi_0``/``wi_1``/``wo`` (T5 v1.1 GeGLU), and fused gate-up projections (``gate_up_proj``
Phi-3, ``w12`` xformers, or any linear child with ``out_features == 2 * down.in_features``
next to a ``down_proj``/``w2``/``fc2``-like child).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from satmon.discovery import find_dyt_layers, norm_kind, strip_wrappers
from satmon.functional.gate import ACTIVATIONS

__all__ = ["GateModules", "GatedPairing", "GatingReport", "detect_gating", "gate_linear_modules"]

# (gate, up, down) child names of split gated MLPs
_SPLIT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"), ("wi_0", "wi_1", "wo"))
_DOWN_NAMES = ("down_proj", "w2", "fc2", "wo", "dense_4h_to_h")
_NOT_FUSED = re.compile(r"kv|qk|attn")  # fused key-value projections also double their width
# norm names that say "pre-MLP" (a "post_" prefix marks Gemma-2-style norms applied after the MLP),
# then names of a block's second norm, trusted only when no name of the first kind is present
_PRE_MLP_NAME = re.compile(r"(^|_)(mlp|ffn|ff|feed_?forward)(_|$)")  # mlp_norm, ffn_norm, pre_feedforward_layernorm
_SECOND_NORM_NAME = re.compile(r"^(post_attention_layernorm|ln_?2|norm_?2|layer_?norm_?2)$")
_SHOWN = 3  # pairings spelled out in the message


@dataclass
class GatedPairing:
    """One norm feeding one gated MLP ``down(act(gate(h)) * up(h))``; all fields are module names.

    ``up`` is ``None`` when ``fused`` (``gate`` then names the fused gate-up projection, gate half
    first). ``activation`` is ``"silu"``, ``"gelu"``, ``"gelu_tanh"`` or what the module called it
    (``"unknown"`` when nothing said). ``source`` is the rule that paired them: ``"mapping"``,
    ``"trace"`` or ``"names"``. ``also_feeds`` lists further gated MLPs fed by the same norm (MoE
    experts).
    """

    norm: str
    mlp: str
    gate: str
    up: str | None
    down: str
    fused: bool
    activation: str
    source: str
    also_feeds: list[str] = field(default_factory=list)


@dataclass
class GatingReport:
    """What :func:`detect_gating` found. ``gated`` is True when the model has any gated MLP."""

    gated: bool
    pairings: dict[str, GatedPairing]
    unpaired_gated_mlps: list[str]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "gated": self.gated,
            "pairings": {k: asdict(v) for k, v in self.pairings.items()},
            "unpaired_gated_mlps": list(self.unpaired_gated_mlps),
            "message": self.message,
        }


class GateModules(NamedTuple):
    """The modules to hook for gate statistics: ``gate`` output is ``g`` (or ``[g, u]`` when fused)."""

    gate: nn.Module
    up: nn.Module | None
    fused: bool
    activation: str


def _features(m: nn.Module) -> tuple[int, int] | None:
    i, o = getattr(m, "in_features", None), getattr(m, "out_features", None)
    return (i, o) if isinstance(i, int) and isinstance(o, int) else None


def _is_norm(m: nn.Module) -> bool:
    return norm_kind(m) is not None


def _module_index(model: nn.Module) -> dict[str, nn.Module]:
    """Modules by name without compile/DDP/FSDP wrapper parts, as :mod:`satmon.discovery` names them."""
    return {strip_wrappers(n): m for n, m in model.named_modules()}  # later (inner) module wins a clash


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


def _activation_of(mlp: nn.Module) -> str:
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


def _gated_parts(mlp: nn.Module, structural: bool = False) -> dict[str, Any] | None:
    """``{gate, up, down, fused, note}`` (child names) when ``mlp`` is a gated MLP, else None.

    ``structural`` (only for user-mapped modules) also accepts opaque child names by shape.
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
        if conventional and len(downs) == 1:
            return {"gate": name, "up": None, "down": downs[0], "fused": True, "note": ""}
        if len(named_downs) == 1 or (structural and len(downs) == 1):
            return {"gate": name, "up": None, "down": (named_downs or downs)[0], "fused": True, "note": ""}
    if structural:  # two same-shape projections into a third: gate/up told apart by registration order
        items = list(shapes.items())
        for k, (a, fa) in enumerate(items):
            for b, fb in items[k + 1 :]:
                downs = [n for n, (di, do) in items if n not in (a, b) and (di, do) == (fa[1], fa[0])]
                if fa == fb and len(downs) == 1:
                    note = f"{a!r}/{b!r} taken as gate/up by registration order; pass example_input to verify"
                    return {"gate": a, "up": b, "down": downs[0], "fused": False, "note": note}
    return None


def _available(names: list[str], what: str) -> str:
    return f"Available {what}: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}."


def _record(model: nn.Module, example_input: Any, outputs: dict[str, nn.Module], inputs: dict[str, nn.Module]):
    """One eval, no-grad forward recording ``outputs``' outputs and ``inputs``' first positional input."""
    seen_out: dict[str, list[Any]] = {n: [] for n in outputs}  # holding references keeps ids unique
    seen_in: dict[str, list[Any]] = {n: [] for n in inputs}
    handles = [m.register_forward_hook(lambda _m, _a, out, n=n: seen_out[n].append(out)) for n, m in outputs.items()]
    handles += [m.register_forward_pre_hook(lambda _m, a, n=n: seen_in[n].append(a[0] if a else None)) for n, m in inputs.items()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            if isinstance(example_input, dict):
                model(**example_input)
            elif isinstance(example_input, (tuple, list)):
                model(*example_input)
            else:
                model(example_input)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return seen_out, seen_in


def _same_tensor(a: Any, b: Any) -> bool:
    """The object itself, or a view with the same memory, shape and strides."""
    if a is b:
        return True
    return (
        isinstance(a, Tensor) and isinstance(b, Tensor) and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    )  # fmt: skip


def _trace_feeders(model: nn.Module, norms: dict[str, nn.Module], gates: dict[str, nn.Module], example_input: Any):
    """For each gate module (keyed by its MLP), the norms whose output tensor is the gate's input."""
    outs, ins = _record(model, example_input, norms, gates)
    return {g: [n for n, o in outs.items() if any(_same_tensor(a, b) for a in o for b in x)] for g, x in ins.items()}


def _verify_gate_up(model: nn.Module, mlp: str, parts: dict[str, Any], example_input: Any) -> dict[str, Any]:
    """Tell gate from up numerically: which of ``act(a) * b`` / ``act(b) * a`` is ``down``'s input."""
    modules = _module_index(model)
    a, b, down = (modules[f"{mlp}.{parts[k]}"] for k in ("gate", "up", "down"))
    outs, ins = _record(model, example_input, {"a": a, "b": b}, {"down": down})
    if not (outs["a"] and outs["b"] and ins["down"]):
        return {**parts, "note": parts["note"] + " (example_input did not reach this MLP)"}
    xa, xb, h = (t[0].detach().double() for t in (outs["a"], outs["b"], ins["down"]))
    scale = h.abs().max().clamp_min(1e-12)
    fits = [
        (float((act(g) * u - h).abs().max() / scale), name, swap)
        for name, act in ACTIVATIONS.items()
        for swap, (g, u) in ((False, (xa, xb)), (True, (xb, xa)))
    ]
    err, name, swap = min(fits)
    if err > 1e-2:
        return {**parts, "note": parts["note"] + f" (no gate/up order fits the traced hidden: error {err:.2g})"}
    gate, up = (parts["up"], parts["gate"]) if swap else (parts["gate"], parts["up"])
    return {**parts, "gate": gate, "up": up, "activation": name, "note": ""}


def _listing(names: list[str]) -> str:
    more = f", ... +{len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _message(report_pairs: dict[str, GatedPairing], unpaired: list[str], gated: bool, label: str) -> str:
    if not gated:
        return f"gated MLP after {label}: no (no gated MLP found)"
    hint = "pass mapping={'<norm name>': '<mlp name>'} or example_input=... to pair them"
    if not report_pairs:
        return f"gated MLP found but not paired with any {label}: {_listing(unpaired)}; {hint}"
    msg = f"gated MLP after {label}: yes ({_listing([f'{p.norm} -> {p.mlp}' for p in report_pairs.values()])})"
    notes = sorted({p.activation for p in report_pairs.values()} - {"silu", "gelu", "gelu_tanh"})
    if notes:
        msg += f"; activation not recognised: {', '.join(notes)}"
    if unpaired:
        msg += f"; {len(unpaired)} gated MLP(s) not paired ({_listing(unpaired)}): {hint}"
    return msg


def detect_gating(
    model: nn.Module,
    norm_names: list[str] | None = None,
    mapping: dict[str, str] | None = None,
    example_input: Any = None,
) -> GatingReport:
    """Find gated MLPs (SwiGLU/GeGLU) and the norm layers that feed them.

    Args:
        model: any ``nn.Module``.
        norm_names: the norm layers to pair (module names, wrapper prefixes of compile/DDP/FSDP
            optional). ``None``: every DyT layer :func:`satmon.discovery.find_dyt_layers` finds.
        mapping: ``{norm_name: mlp_module_name}``; overrides the other rules for those entries.
            The MLP may use opaque child names: it is then recognised by its projections' shapes.
        example_input: a tensor, tuple of positional args or dict of kwargs for one eval forward
            (no grad); enables the trace pairing, the most reliable rule.

    Returns:
        A :class:`GatingReport`.

    Example:
        >>> from satmon.core.gated_mlp import detect_gating
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
        >>> detect_gating(model).message
        'gated MLP after DyT: yes (blocks.0.mlp_norm -> blocks.0.mlp)'
    """
    modules = _module_index(model)
    if norm_names is None:
        norm_names = [layer.name for layer in find_dyt_layers(model)]
    all_norms = [n for n, m in modules.items() if n and _is_norm(m)]
    for name in norm_names:
        if name not in modules:
            raise ValueError(
                f"Expected `norm_names` to name modules of the model, got {name!r}. {_available(all_norms, 'norm-like modules')}"
            )
    label = "DyT" if norm_names and all(norm_kind(modules[n]) == "dyt" for n in norm_names) else "norm"

    found = {n: parts for n, m in modules.items() if (parts := _gated_parts(m)) is not None}
    pairs: dict[str, GatedPairing] = {}
    paired_mlps: set[str] = set()

    def pair(norm: str, mlp: str, parts: dict[str, Any], source: str) -> None:
        paired_mlps.add(mlp)
        if norm in pairs:
            pairs[norm].also_feeds.append(mlp)
            return
        prefix = f"{mlp}." if mlp else ""
        pairs[norm] = GatedPairing(
            norm=norm,
            mlp=mlp,
            gate=prefix + parts["gate"],
            up=prefix + parts["up"] if parts["up"] else None,
            down=prefix + parts["down"],
            fused=parts["fused"],
            activation=parts.get("activation") or _activation_of(modules[mlp]),
            source=source,
        )

    for norm, mlp in (mapping or {}).items():
        if norm not in modules:
            raise ValueError(f"Expected mapping keys to name norm modules, got {norm!r}. {_available(all_norms, 'norm-like modules')}")
        if mlp not in modules:
            names = [n for n, m in modules.items() if n and not _is_norm(m) and len(m._modules) > 1]
            raise ValueError(f"Expected mapping values to name MLP modules, got {mlp!r}. {_available(names, 'container modules')}")
        parts = found.get(mlp) or _gated_parts(modules[mlp], structural=True)
        if parts is not None and parts["note"] and example_input is not None:
            parts = _verify_gate_up(model, mlp, parts, example_input)
        if parts is None:
            raise ValueError(
                f"Expected mapping value {mlp!r} to be a gated MLP down(act(gate(h)) * up(h)), got a"
                f" {type(modules[mlp]).__name__} with children {list(dict(modules[mlp].named_children()))}."
                " Map the norm to the module that owns the gate, up and down projections."
            )
        found[mlp] = parts
        pair(norm, mlp, parts, "mapping")

    locked = set(mapping or {})  # a mapped norm gets no automatic pairing
    todo = [m for m in found if m not in paired_mlps]
    settled: set[str] = set()  # MLPs whose feeding norm the trace saw, monitored or not
    if example_input is not None and todo:
        gates = {m: modules[f"{m}.{found[m]['gate']}" if m else found[m]["gate"]] for m in todo}
        traced = {n: modules[n] for n in dict.fromkeys([*norm_names, *all_norms])}
        for mlp, feeders in _trace_feeders(model, traced, gates, example_input).items():
            monitored = [n for n in feeders if n in norm_names and n not in locked]
            settled.update([mlp] if feeders else [])
            if len(monitored) == 1:
                pair(monitored[0], mlp, found[mlp], "trace")

    for mlp in [m for m in found if m not in paired_mlps and m not in settled]:
        norm = _pair_by_names(mlp, modules, set(norm_names) - locked)
        if norm is not None:
            pair(norm, mlp, found[mlp], "names")

    unpaired = [m for m in found if m not in paired_mlps]
    notes = [p.mlp for p in pairs.values() if found[p.mlp]["note"]]
    message = _message(pairs, unpaired, bool(found), label)
    if notes:
        message += "; " + "; ".join(f"{m}: {found[m]['note']}" for m in notes)
    return GatingReport(gated=bool(found), pairings=pairs, unpaired_gated_mlps=unpaired, message=message)


def _pair_by_names(mlp: str, modules: dict[str, nn.Module], norm_names: set[str]) -> str | None:
    """The feeding norm by names, in the nearest enclosing module that holds any norm; None if unsure."""
    parts = mlp.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        parent = ".".join(parts[:depth])
        prefix = f"{parent}." if parent else ""
        siblings = [n for n, m in modules.items() if n.startswith(prefix) and "." not in n[len(prefix) :] and n != parent
                    and (_is_norm(m) or n in norm_names)]  # fmt: skip
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


def gate_linear_modules(model: nn.Module, report: GatingReport) -> dict[str, GateModules]:
    """Per paired norm, the gate (or fused gate-up) and up projection modules to hook.

    Example:
        >>> from satmon.core.gated_mlp import detect_gating, gate_linear_modules
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
        >>> mods = gate_linear_modules(model, detect_gating(model))
        >>> mods["blocks.0.mlp_norm"].gate is model.blocks[0].mlp.gate_proj, mods["blocks.0.mlp_norm"].activation
        (True, 'silu')
    """
    modules = _module_index(model)
    return {
        norm: GateModules(
            gate=modules[p.gate],
            up=modules[p.up] if p.up else None,
            fused=p.fused,
            activation=p.activation,
        )
        for norm, p in report.pairings.items()
    }
