"""Does a DyT (or other norm) layer feed a gated MLP? Architecture detection for the screen.

The regime study found that high saturation means opposite things in the two cases: useful
regularisation in a non-gated model, collapse risk when DyT feeds a SwiGLU gate
(``down(act(gate(h)) * up(h))``). :func:`detect_gating` pairs each norm with the gated MLP its
output feeds, in this order of trust:

1. ``mapping`` given by the user, ``{norm_name: mlp_module_name}`` (``source="mapping"``;
   ``{norm_name: None}`` says "feeds no gated MLP");
2. data flow, when ``example_input`` is given: one traced eval forward
   (:func:`satmon.model.dataflow.trace_flow`) finds the element-wise products ``act(a) * b`` of two
   projections of the norm's output, whatever the modules are called (``source="trace"``); a
   product of the norm's branches that is not of that form makes the answer *unknown*
   (``gated=None``), never "no";
3. names, only for MLPs the trace did not reach (or without ``example_input``): children named
   ``gate_proj``/``up_proj``/``down_proj``, ``w1``/``w3``/``w2``, ``wi_0``/``wi_1``/``wo``, a fused
   ``gate_up_proj``/``w12``, paired with the block's norm whose name says "pre-MLP" (``mlp_norm``,
   ``ffn_norm``, ``post_attention_layernorm``, ``ln_2``, ...) or its only norm (``source="names"``).
   Without ``example_input``, a module that looks gated by its projection shapes alone makes the
   answer unknown.

A gated MLP that none of these pairs is listed in ``unpaired_gated_mlps``: never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from torch import nn

from satmon.batches import feed
from satmon.model.dataflow import FlowTrace, GatedProduct, trace_flow
from satmon.model.gating_names import activation_of, gated_parts, pair_by_names
from satmon.model.discovery import find_dyt_layers, modules_by_name, norm_kind

__all__ = ["GateModules", "GatedPairing", "GatingReport", "detect_gating", "gate_linear_modules"]

_SHOWN = 3  # pairings spelled out in the message
_KNOWN = ("silu", "gelu", "gelu_tanh")


@dataclass
class GatedPairing:
    """One norm feeding one gated MLP ``down(act(gate(h)) * up(h))``; all fields are module names.

    ``up`` is ``None`` when ``fused`` (``gate`` then names the fused gate-up projection; ``gate_first``
    says which half gates). ``activation`` is ``"silu"``, ``"gelu"``, ``"gelu_tanh"`` or what the
    trace or the module called it (``"unknown"`` when nothing said). ``source`` is the rule that
    paired them: ``"mapping"``, ``"trace"`` or ``"names"``. ``also_feeds`` lists further gated MLPs
    fed by the same norm (MoE experts). ``gate_stats`` is False when the gate pre-activations are
    not a module's output (experts computed inside one module): no gate statistics then.
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
    gate_first: bool = True
    gate_stats: bool = True


@dataclass
class GatingReport:
    """What :func:`detect_gating` found.

    ``gated``: ``True`` when the model has a gated MLP, ``False`` when none was found, ``None``
    (unknown) when a monitored norm's output reaches an element-wise product satmon cannot classify
    (``unclassified`` names each such norm and where), or when only projection shapes suggest a
    gated MLP. ``message`` says it in words, with the option that resolves an unknown.
    """

    gated: bool | None
    pairings: dict[str, GatedPairing]
    unpaired_gated_mlps: list[str]
    message: str
    unclassified: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gated": self.gated,
            "pairings": {k: asdict(v) for k, v in self.pairings.items()},
            "unpaired_gated_mlps": list(self.unpaired_gated_mlps),
            "message": self.message,
            "unclassified": dict(self.unclassified),
        }


class GateModules(NamedTuple):
    """The modules to hook for gate statistics: ``gate`` output is ``g`` (or ``[g, u]`` when fused)."""

    gate: nn.Module
    up: nn.Module | None
    fused: bool
    activation: str
    gate_first: bool = True


def _available(names: list[str], what: str) -> str:
    return f"Available {what}: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}."


def _listing(names: list[str]) -> str:
    more = f", ... +{len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _common_parent(*names: str | None) -> str:
    """The deepest module holding all named modules (the MLP of a traced product)."""
    split = [n.split(".") for n in names if n]
    common: list[str] = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    if len(common) == min(len(p) for p in split) and len({tuple(p) for p in split}) > 1:
        common = common[:-1]  # one name is the parent of another: take the enclosing module
    return ".".join(common)


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent and child else parent or child


def _hint(norm: str) -> str:
    return f"pass gating_mapping={{'{norm}': '<gated MLP module>'}} if it feeds a gated MLP, or {{'{norm}': None}} if not"


def _message(pairs: dict[str, GatedPairing], unpaired: list[str], gated: bool | None, label: str,
             unknown: dict[str, str], basis: str) -> str:  # fmt: skip
    hint = "pass mapping={'<norm name>': '<mlp name>'} (gating_mapping= in the callback and the probe) or example_input=... to pair them"
    if gated is None:
        first = next(iter(unknown))
        more = f" (and {len(unknown) - 1} more layer(s))" if len(unknown) > 1 else ""
        return f"gated MLP after {label}: unknown: {first}: {unknown[first]}{more}; {_hint(first)}"
    if not gated:
        return f"gated MLP after {label}: no ({basis})"
    if not pairs:
        msg = f"gated MLP found but not paired with any {label}: {_listing(unpaired)}; {hint}"
    else:
        msg = f"gated MLP after {label}: yes ({_listing([f'{p.norm} -> {p.mlp}' for p in pairs.values()])})"
        odd = sorted({p.activation for p in pairs.values()} - set(_KNOWN))
        msg += f"; activation not recognised: {', '.join(odd)}" if odd else ""
        msg += f"; {len(unpaired)} gated MLP(s) not paired ({_listing(unpaired)}): {hint}" if unpaired else ""
    if unknown:
        msg += "; unknown for " + "; ".join(f"{n}: {d}" for n, d in list(unknown.items())[:_SHOWN])
    return msg


def _traced_activation(p: GatedProduct) -> str | None:
    """The traced activation, unless it is a piece of a written-out one (GPT-2's gelu_new: tanh, x * ...):
    then ``None``, and the module's own words (config, children, source) name it."""
    return None if p.activation in ("tanh", "product") else p.activation


def _traced_parts(mlp: str, parts: dict[str, Any], trace: FlowTrace | None) -> dict[str, Any]:
    """A mapped MLP's gate/up order and activation as the traced forward showed them."""
    if trace is None:
        return parts
    inside = [p for p in trace.products if p.gate.startswith(f"{mlp}.") or p.gate == mlp]
    if not inside:
        return {**parts, "note": parts["note"] + " (example_input showed no gated product in this MLP)"}
    p = inside[0]
    rel = (lambda n: n[len(mlp) + 1 :] if mlp else n)
    return {**parts, "gate": rel(p.gate), "up": None if p.fused else rel(p.up), "fused": p.fused,
            "activation": _traced_activation(p), "note": ""}  # fmt: skip


def _trace(model: nn.Module, norms: list[str], example_input: Any, forward_fn: Callable | None) -> tuple[FlowTrace | None, str]:
    try:
        return trace_flow(model, norms, example_input, forward_fn or feed), ""
    except Exception as err:  # a monitor must not stop training: report and fall back to names
        return None, (f"the traced forward failed ({type(err).__name__}: {err}); give it a forward that works "
                      "(SaturationMonitor(gating_forward_fn=...), detect_gating(forward_fn=...))")


class _Pairs:
    """The pairings being built: one per norm; further MLPs of the same norm go to ``also_feeds``."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        self.modules = modules
        self.pairs: dict[str, GatedPairing] = {}
        self.paired: set[str] = set()

    def add(self, norm: str, mlp: str, parts: dict[str, Any], source: str, product: GatedProduct | None = None) -> None:
        self.paired.add(mlp)
        if norm in self.pairs:
            self.pairs[norm].also_feeds.append(mlp)
            return
        act = parts.get("activation") or activation_of(self.modules[mlp])
        act = product.activation if act == "unknown" and product is not None else act
        self.pairs[norm] = GatedPairing(
            norm=norm, mlp=mlp, gate=_join(mlp, parts["gate"]), up=_join(mlp, parts["up"]) if parts["up"] else None,
            down=_join(mlp, parts["down"]) if parts["down"] is not None else "", fused=parts["fused"], activation=act,
            source=source, gate_first=parts.get("gate_first", True), gate_stats=product.hookable if product else True,
        )


def _pair_mapping(pairs: _Pairs, mapping: dict[str, str | None], found: dict[str, dict[str, Any]], trace: FlowTrace | None,
                  all_norms: list[str]) -> None:  # fmt: skip
    """The user's ``{norm: mlp}`` entries, validated; opaque MLPs read by shape, then checked against the trace."""
    modules = pairs.modules
    for norm, mlp in mapping.items():
        if norm not in modules:
            raise ValueError(f"Expected mapping keys to name norm modules, got {norm!r}. {_available(all_norms, 'norm-like modules')}")
        if mlp is None:
            continue
        if mlp not in modules:
            names = [n for n, m in modules.items() if n and norm_kind(m) is None and len(m._modules) > 1]
            raise ValueError(f"Expected mapping values to name MLP modules, got {mlp!r}. {_available(names, 'container modules')}")
        parts = found.get(mlp) or gated_parts(modules[mlp], structural=True)
        if parts is None:
            raise ValueError(
                f"Expected mapping value {mlp!r} to be a gated MLP down(act(gate(h)) * up(h)), got a"
                f" {type(modules[mlp]).__name__} with children {list(dict(modules[mlp].named_children()))}."
                " Map the norm to the module that owns the gate, up and down projections, or to None."
            )
        found[mlp] = _traced_parts(mlp, parts, trace) if parts["note"] else parts
        pairs.add(norm, mlp, found[mlp], "mapping")


def _pair_trace(pairs: _Pairs, trace: FlowTrace, monitored: set[str], found: dict[str, dict[str, Any]]) -> tuple[set[str], dict[str, str]]:
    """Pairings from the traced products; returns the MLPs the trace reached and the unclassified norms."""
    settled: set[str] = set()  # names do not override what the trace showed
    for p in trace.products:
        mlp = _common_parent(p.gate, p.up, p.down) if p.down else p.gate.rpartition(".")[0]
        settled.add(mlp)
        if p.norm in monitored:
            rel = (lambda n, mlp=mlp: n[len(mlp) + 1 :] if mlp and n else n)
            parts = {"gate": rel(p.gate), "up": None if p.fused else rel(p.up), "down": rel(p.down), "fused": p.fused,
                     "activation": _traced_activation(p), "gate_first": p.gate_first}  # fmt: skip
            pairs.add(p.norm, mlp, parts, "trace", p)
    settled.update(m for m, parts in found.items() if _join(m, parts["gate"]) in trace.executed)
    unknown: dict[str, str] = {}
    for i in trace.unclassified:
        if i.norm in monitored and i.norm not in pairs.pairs:
            unknown.setdefault(i.norm, f"its output reaches an element-wise product in {i.module or 'the model'} "
                                       f"that is not act(gate) * up ({i.detail})")  # fmt: skip
    return settled, unknown


def detect_gating(
    model: nn.Module,
    norm_names: list[str] | None = None,
    mapping: dict[str, str | None] | None = None,
    example_input: Any = None,
    forward_fn: Callable[[nn.Module, Any], Any] | None = None,
) -> GatingReport:
    """Find gated MLPs (SwiGLU/GeGLU) and the norm layers that feed them.

    Args:
        model: any ``nn.Module``.
        norm_names: the norm layers to pair (module names, wrapper prefixes of compile/DDP/FSDP
            optional). ``None``: every DyT layer :func:`satmon.model.discovery.find_dyt_layers` finds.
        mapping: ``{norm_name: mlp_module_name}`` overrides the other rules for those norms; the MLP
            may use opaque child names. ``{norm_name: None}``: the norm feeds no gated MLP.
        example_input: one batch (e.g. the first training batch) for one eval, no-grad traced
            forward: gating is then read from the data flow, not from names.
        forward_fn: ``forward_fn(model, example_input)``; default :func:`satmon.batches.feed`
            (``model(t)``, ``model(*t)``, ``model(**t)``). Pass :func:`satmon.batches.feed_first`
            for ``(inputs, targets)`` batches.

    Returns:
        A :class:`GatingReport`.

    Example:
        >>> from satmon.model.gating import detect_gating
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
        >>> detect_gating(model).message
        'gated MLP after DyT: yes (blocks.0.mlp_norm -> blocks.0.mlp)'
        >>> import torch
        >>> detect_gating(model, example_input=torch.zeros(1, 8, dtype=torch.long)).pairings["blocks.0.mlp_norm"].source
        'trace'
    """
    modules = modules_by_name(model)
    if norm_names is None:
        norm_names = [layer.name for layer in find_dyt_layers(model)]
    all_norms = [n for n, m in modules.items() if n and norm_kind(m) is not None]
    for name in norm_names:
        if name not in modules:
            raise ValueError(f"Expected `norm_names` to name modules of the model, got {name!r}. {_available(all_norms, 'norm-like modules')}")
    label = "DyT" if norm_names and all(norm_kind(modules[n]) == "dyt" for n in norm_names) else "norm"
    mapping = dict(mapping or {})
    found = {n: parts for n, m in modules.items() if (parts := gated_parts(m)) is not None}
    traced = list(dict.fromkeys([*norm_names, *mapping, *all_norms]))  # every norm: gated MLPs anywhere count
    trace, failure = _trace(model, traced, example_input, forward_fn) if example_input is not None else (None, "")
    built = _Pairs(modules)
    _pair_mapping(built, mapping, found, trace, all_norms)
    monitored = set(norm_names) - set(mapping)
    settled, unknown = _pair_trace(built, trace, monitored, found) if trace is not None else (set(), {})
    if failure and not found:
        unknown = {(norm_names or ["the model"])[0]: failure}
    for mlp in [m for m in found if m not in built.paired and m not in settled]:
        norm = pair_by_names(mlp, modules, monitored)
        if norm is not None:
            built.add(norm, mlp, found[mlp], "names")
    if trace is None and not found and not failure:
        unknown = _looks_gated(modules, monitored)
    pairs = built.pairs
    unpaired = list(dict.fromkeys([m for m in [*found, *settled] if m not in built.paired]))
    gated = True if found or settled or pairs else None if unknown else False
    basis = "a traced forward shows no gated MLP" if trace is not None else "no gated MLP found by module names; no example_input traced"
    message = _message(pairs, unpaired, gated, label, unknown, basis)
    notes = [f"{p.mlp}: {found[p.mlp]['note']}" for p in pairs.values() if found.get(p.mlp, {}).get("note")]
    if failure and gated is not None:
        notes.append(failure)
    if notes:
        message += "; " + "; ".join(notes)
    return GatingReport(gated=gated, pairings=pairs, unpaired_gated_mlps=unpaired, message=message, unclassified=unknown)


def _looks_gated(modules: dict[str, nn.Module], monitored: set[str]) -> dict[str, str]:
    """Without a trace: MLPs gated by their projection shapes (opaque names) next to a monitored norm."""
    out = {}
    for name, m in modules.items():
        parts = gated_parts(m, structural=True) if norm_kind(m) is None else None
        if parts is not None and not parts["fused"]:  # shape alone would call any 2x-wide projection "fused"
            near = [n for n in sorted(monitored) if n.rpartition(".")[0] in (name, name.rpartition(".")[0])]
            if near:
                out.setdefault(near[0], f"{name} looks like a gated MLP by its projection shapes, but its names do not say "
                                        "(pass example_input= to trace it)")  # fmt: skip
    return out


def gate_linear_modules(model: nn.Module, report: GatingReport) -> dict[str, GateModules]:
    """Per paired norm, the gate (or fused gate-up) and up projection modules to hook.

    Pairings whose gate statistics cannot be read from module outputs (``gate_stats=False``) are left out.

    Example:
        >>> from satmon.model.gating import detect_gating, gate_linear_modules
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
        >>> mods = gate_linear_modules(model, detect_gating(model))
        >>> mods["blocks.0.mlp_norm"].gate is model.blocks[0].mlp.gate_proj, mods["blocks.0.mlp_norm"].activation
        (True, 'silu')
    """
    modules = modules_by_name(model)
    return {
        norm: GateModules(gate=modules[p.gate], up=modules[p.up] if p.up else None, fused=p.fused,
                          activation=p.activation, gate_first=p.gate_first)  # fmt: skip
        for norm, p in report.pairings.items()
        if p.gate_stats
    }
