"""Does a DyT (or other norm) layer feed a gated MLP? Architecture detection for the screen.

The regime study reads high saturation in opposite ways in the two cases (its claim, not satmon's
measurement: :data:`satmon.study.MEANING`): GO in a non-gated model, collapse risk when DyT feeds a SwiGLU gate
(``down(act(gate(h)) * up(h))``). "Feeds" means the MLP's gate and value projections read the
layer's output directly: through views, casts, dropout or a permute, never through an addition
with another stream. So a post-norm layer (``h = x + norm(attn(x))``; ``out = h + norm(mlp(h))``)
feeds no MLP, and a parallel-residual layer feeds the MLP it is applied to.

:func:`detect_gating` pairs each watched layer with the gated MLP it feeds, in this order of trust:

1. ``mapping`` given by the user, ``{norm_name: mlp_module_name}`` (``source="mapping"``;
   ``{norm_name: None}``: that layer feeds no gated MLP). A key that names no normaliser, or a value
   that names no module or a module that is no gated MLP, is refused with the candidates; a pairing
   the traced forward contradicts (the MLP's projections read another layer's output) too;
2. data flow, when ``example_input`` is given: one traced eval forward
   (:func:`satmon.model.dataflow.trace_flow`, cached in the model map) finds the element-wise
   products ``act(a) * b`` of two projections of the layer's output, whatever the modules are
   called (``source="trace"``); a product of the layer's branches that is not of that form makes
   the answer *unknown* (``gated=None``), never "no";
3. without a traced forward (or where it failed), every watched layer is *unknown* (``gated=None``):
   names and forward sources only give a hint in the message, never the answer. A gated MLP is recognised
   by its children's names (``gate_proj``/``up_proj``/``down_proj``, ``w1``/``w3``/``w2``,
   ``wi_0``/``wi_1``/``wo``, a fused ``gate_up_proj``/``w12``) and paired with the layer whose output its
   call receives in the enclosing ``forward``'s source (:mod:`satmon.model.source_flow`; an ``if`` whose
   branches feed it different values says nothing), or by the norm's name; a module that may hold a gated
   product without the names to say so is named too. The live screen traces its first training forward,
   :func:`satmon.probe` and ``satmon replay`` their first calibration batch, so the answer comes from a forward
   wherever satmon runs one. With a trace, a watched layer the forward did not run, and a gated MLP (by its
   names) that did not run while no sibling expert did, are unknown too.

``gated`` is ``True`` only when a watched layer feeds a gated MLP; gated MLPs fed by other layers
(or through an addition) are listed in ``unpaired_gated_mlps``, never guessed onto a layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from torch import nn

from satmon.model.dataflow import FlowTrace, GatedProduct
from satmon.model.discovery import modules_by_name
from satmon.model.gating_names import activation_of, gated_parts, pair_by_names
from satmon.model.map import ModelMap, model_map
from satmon.model.source_flow import (
    argument_origin,
    called_children,
    multiplied_projections,
    multiplies_projections,
)
from satmon.results.gating import GatedPairing, GatingInfo

__all__ = ["GateModules", "GatedPairing", "GatingInfo", "detect_gating", "gate_linear_modules"]

_SHOWN = 3  # pairings spelled out in the message
_KNOWN = ("silu", "gelu", "gelu_tanh")
_ROOT = "(the model's own forward)"  # a product computed in the root module: its MLP has no name of its own


class GateModules(NamedTuple):
    """The modules to hook for gate statistics: ``gate`` output is ``g`` (or ``[g, u]`` when fused)."""

    gate: nn.Module
    up: nn.Module | None
    fused: bool
    activation: str
    gate_first: bool = True


def _available(names: list[str], what: str) -> str:
    if not names:
        return f"The model has no {what}."
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


def _hint(norm: str, mlp: str = "<gated MLP module>") -> str:
    return f"pass gating_mapping={{'{norm}': '{mlp}'}} if it feeds a gated MLP, or {{'{norm}': None}} if not"


def _traced_activation(p: GatedProduct) -> str | None:
    """The traced activation, unless it is a piece of a written-out one (GPT-2's gelu_new: tanh, x * ...):
    then ``None``, and the module's own words (config, children, source) name it."""
    return None if p.activation in ("tanh", "product") else p.activation


def _mlp_of(p: GatedProduct) -> str:
    return _common_parent(p.gate, p.up, p.down) if p.down else p.gate.rpartition(".")[0]


def _inside(mlp: str, name: str) -> bool:
    return name == mlp or name.startswith(f"{mlp}.") or mlp == ""


def _traced_parts(mlp: str, parts: dict[str, Any], trace: FlowTrace | None) -> dict[str, Any]:
    """A mapped MLP's gate/up order and activation as the traced forward showed them."""
    if trace is None:
        return parts
    inside = [p for p in trace.products if _inside(mlp, p.gate)]
    if not inside:
        return {
            **parts,
            "note": parts["note"] + (" (example_input showed no gated product in this MLP)" if parts["note"] else ""),
        }
    p = inside[0]
    rel = lambda n: n[len(mlp) + 1 :] if mlp else n
    return {
        **parts,
        "gate": rel(p.gate),
        "up": None if p.fused else rel(p.up),
        "fused": p.fused,
        "activation": _traced_activation(p),
        "note": "",
        "gate_first": p.gate_first,
    }


class _Pairs:
    """The pairings being built: one per norm; further MLPs of the same norm go to ``also_feeds``."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        self.modules = modules
        self.pairs: dict[str, GatedPairing] = {}
        self.paired: set[str] = set()
        self.notes: list[str] = []

    def add(self, norm: str, mlp: str, parts: dict[str, Any], source: str, product: GatedProduct | None = None) -> None:
        self.paired.add(mlp)
        if parts.get("note"):
            self.notes.append(f"{mlp}: {parts['note']}")
        if norm in self.pairs:
            old = self.pairs[norm]
            if mlp != old.mlp and mlp not in old.also_feeds:
                self.pairs[norm] = replace(old, also_feeds=(*old.also_feeds, mlp))
            return
        act = parts.get("activation") or activation_of(self.modules[mlp])
        act = product.activation if act == "unknown" and product is not None else act
        self.pairs[norm] = GatedPairing(
            norm=norm,
            mlp=mlp,
            gate=_join(mlp, parts["gate"]),
            up=_join(mlp, parts["up"]) if parts["up"] else None,
            down=_join(mlp, parts["down"]) if parts["down"] is not None else "",
            fused=parts["fused"],
            activation=act,
            source=source,
            gate_first=parts.get("gate_first", True),
            gate_stats=product.hookable if product else True,
        )


# -------------------------------------------------------------------------------------- where an MLP's input comes from
def _norm_named(m: ModelMap, name: str) -> bool:
    return any(l.name == name for l in m.norms) or name in m.undetermined


def _feeder(m: ModelMap, mlp: str, entry: str | None = None) -> tuple[str | None, str, str | None]:
    """From the forwards' source: ``(norm, how, runs_before)``. ``norm`` is the normaliser whose output the
    MLP's gate projection (``entry``, a child of ``mlp``) receives directly (``None`` otherwise);
    ``how`` says what it receives when not a norm's output (``""``: the source could not be read);
    ``runs_before`` is the last normaliser called before the MLP, in source order."""
    path = _join(mlp, entry) if entry else mlp
    before: str | None = None
    how = ""
    while path:
        parent, _, _ = path.rpartition(".")
        rel = path[len(parent) + 1 :] if parent else path
        holder = m.module(parent)
        if holder is None:
            return None, how, before
        origins, called = None, None
        parts = rel.split(".")
        for k in range(len(parts), 0, -1):  # the call may name the MLP or an enclosing child of it
            prefix = ".".join(parts[:k])
            origins = argument_origin(holder, prefix)
            if origins is not None:
                called = prefix
                break
        children = called_children(holder)
        if origins is None or children is None:
            path = parent  # this forward does not call it by name (or has no source): look one level up
            continue
        at = children.index(called) if called in children else len(children)
        norms_before = [c for c in children[:at] if _norm_named(m, _join(parent, c))]
        before = before or (_join(parent, norms_before[-1]) if norms_before else None)
        if len(set(origins)) > 1:  # e.g. a config flag that reorders the norms: the source does not say which runs
            return None, "different values on different code paths (an if in the forward)", before
        o = origins[0]
        if o is None:
            return None, "a value satmon cannot follow in the source", before
        if o.kind == "arg":
            path = parent  # the holder's own input: how is the holder called?
            continue
        if o.kind == "child":
            name = _join(parent, o.name)
            if _norm_named(m, name) and not o.part:
                return name, "", before or name
            return None, f"the output of {name}", before
        if o.kind == "mix":
            return None, "an addition of streams (x + ...), not a normaliser's output", before
        return None, "a product", before
    return None, how, before


def _maybe_gated(m: ModelMap, names_found: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Modules that may hold a gated product that the names rule did not recognise: opaque same-shape
    projections or a projection twice as wide as a down projection (by shape), or a forward that
    multiplies two projections of its input (by source)."""
    out = {}
    for name, mod in m.modules.items():
        if name in names_found or any(_inside(n, name) and n != name for n in names_found) or _norm_named(m, name):
            continue
        if not any(getattr(getattr(c, "weight", None), "dim", lambda: 0)() == 2 for c in mod.children()) and not any(
            p.dim() >= 2 for p in mod.parameters(recurse=False)
        ):
            continue  # neither a projection child nor a weight of its own (experts stored as 3-D parameters)
        parts = gated_parts(mod, structural=True)
        source = multiplies_projections(mod)  # the source decides where it can be read; shapes where it cannot
        if source:
            out[name] = (
                f"{name} may be a gated MLP (its forward multiplies two projections of its "
                "input), but its names do not say"
            )
        elif source is None and parts is not None:
            shape = (
                "a projection twice as wide as its down projection"
                if parts["fused"]
                else "two same-shape projections into a third"
            )
            out[name] = f"{name} may be a gated MLP ({shape}; no forward source to read), but its names do not say"
    return out


def _first_projection(mod: nn.Module) -> str | None:
    """A projection whose output ``mod.forward`` multiplies (else the first registered): where its gate path starts."""
    multiplied = multiplied_projections(mod)
    if multiplied:
        return multiplied[0]
    parts = gated_parts(mod, structural=True)
    return parts["gate"] if parts is not None else None


def _candidates(m: ModelMap, mlp: str, monitored: set[str]) -> list[str]:
    """The watched layers nearest to ``mlp`` (same enclosing module, climbing): whom an unknown is about."""
    parts = mlp.split(".")
    for depth in range(len(parts), -1, -1):
        prefix = ".".join(parts[:depth])
        near = [n for n in sorted(monitored) if not prefix or n.startswith(prefix + ".")]
        if near:
            return near
    return []


# ------------------------------------------------------------------------------------------ the rules
def _pair_mapping(
    pairs: _Pairs,
    m: ModelMap,
    mapping: dict[str, str | None],
    found: dict[str, dict[str, Any]],
    trace: FlowTrace | None,
    all_norms: list[str],
) -> None:
    """The user's ``{norm: mlp}`` entries, validated; opaque MLPs read by shape, then checked against the trace."""
    modules = m.modules
    known = sorted({*found, *(_mlp_of(p) for p in trace.products)} if trace is not None else set(found))

    def candidates() -> str:  # without a trace, the modules that may be gated MLPs are candidates too
        maybe = sorted(set(_maybe_gated(m, found)) - set(known)) if trace is None else []
        if not maybe:
            return _available(known, "gated MLPs")
        named = _available(known, "gated MLPs") + " " if known else ""
        return f"{named}Modules that may be gated MLPs (their names do not say; no traced forward): {_listing(maybe)}."

    for norm, mlp in mapping.items():
        if norm not in modules or not _norm_named(m, norm):
            raise ValueError(
                f"Expected mapping keys to name norm modules, got {norm!r}. "
                f"{_available(all_norms, 'norm-like modules')}"
            )
        if mlp is None:
            continue
        if not isinstance(mlp, str) or mlp not in modules:
            raise ValueError(
                f"Expected mapping values to name MLP modules, got {mlp!r}. "
                f"{candidates()} (None: the layer feeds no gated MLP.)"
            )
        traced_here = [p for p in trace.products if _inside(mlp, p.gate)] if trace is not None else []
        parts = found.get(mlp) or gated_parts(modules[mlp], structural=True)
        if parts is None and traced_here:
            p = traced_here[0]
            rel = lambda n, mlp=mlp: n[len(mlp) + 1 :] if mlp else n
            parts = {
                "gate": rel(p.gate),
                "up": None if p.fused else rel(p.up),
                "down": rel(p.down) if p.down else None,
                "fused": p.fused,
                "note": "",
            }
        if parts is None:
            raise ValueError(
                f"Expected mapping value {mlp!r} to be a gated MLP down(act(gate(h)) * up(h)), got a"
                f" {type(modules[mlp]).__name__} with children {list(dict(modules[mlp].named_children()))}."
                f" Map the norm to the module that owns the gate, up and down projections, or to None. {candidates()}"
            )
        if (
            trace is not None
            and _join(mlp, parts["gate"]) in trace.executed
            and not any(_inside(mlp, r) for r in trace.reached.get(norm, ()))
        ):
            others = sorted({p.norm for p in traced_here} - {norm})
            shown = (
                f"the output of {', '.join(others)}"
                if others
                else "no normaliser's output directly (an addition of streams, or another module's output)"
            )
            fix = f"Map {others[0]!r} to {mlp!r}, or {norm!r} to None." if others else f"Map {norm!r} to None."
            raise ValueError(
                f"Expected gating_mapping[{norm!r}] = {mlp!r} to agree with the traced forward, "
                "got a forward in which no "
                f"projection of {mlp} reads {norm}'s output directly: its gate and value "
                f"projections read {shown}. {fix}"
            )
        found[mlp] = _traced_parts(mlp, parts, trace) if parts["note"] or trace is not None else parts
        pairs.add(norm, mlp, found[mlp], "mapping")


def _pair_trace(
    pairs: _Pairs, trace: FlowTrace, monitored: set[str], found: dict[str, dict[str, Any]]
) -> tuple[set[str], dict[str, str]]:
    """Pairings from the traced products; returns the gated MLPs the trace settled and the unclassified norms."""
    settled: set[str] = set()  # names do not override what the trace showed
    for p in sorted(trace.products, key=lambda p: not p.hookable):  # a norm's pairing: one whose gate statistics read
        mlp = _mlp_of(p)
        settled.add(mlp)
        if p.norm in monitored:
            rel = lambda n, mlp=mlp: n[len(mlp) + 1 :] if mlp and n else n
            parts = {
                "gate": rel(p.gate),
                "up": None if p.fused else rel(p.up),
                "down": rel(p.down),
                "fused": p.fused,
                "activation": _traced_activation(p),
                "gate_first": p.gate_first,
            }
            pairs.add(p.norm, mlp, parts, "trace", p)
    # a names-found MLP that ran shows in the trace what feeds it: nothing directly, if no product was seen
    settled.update(name for name, parts in found.items() if _join(name, parts["gate"]) in trace.executed)
    unknown: dict[str, str] = {}
    for i in trace.unclassified:
        if i.norm in monitored and i.norm not in pairs.pairs:
            unknown.setdefault(
                i.norm,
                f"its output reaches an element-wise product in {i.module or 'the model'} "
                f"that is not act(gate) * up ({i.detail})",
            )
    return settled, unknown


def _pair_names(
    pairs: _Pairs, m: ModelMap, mlps: dict[str, dict[str, Any]], monitored: set[str], unknown: dict[str, str]
) -> list[str]:
    """Gated MLPs by names, paired with the layer whose output their call receives (source, else names).
    Returns the MLPs left unpaired; each adds an unknown naming the normaliser that runs before it."""
    left = []
    modules = m.modules
    for mlp, parts in mlps.items():
        norm, how, before = _feeder(m, mlp, parts["gate"])
        by_source = norm is not None
        if norm is None and not how:  # no source to read: the block's norm names say
            norm = pair_by_names(mlp, modules, monitored | {l.name for l in m.norms})
            how = "" if norm is not None else "an input satmon cannot follow (no forward source, no telling norm names)"
        if norm is not None and norm in monitored:
            pairs.add(norm, mlp, parts, "names")
            continue
        left.append(mlp)
        if by_source:
            continue  # the source shows a layer that is not watched feeding it: that is no watched layer's gate
        candidates = _candidates(m, mlp, monitored)
        key = norm or before or (candidates[0] if candidates else mlp)
        if norm is not None:
            why = f"{mlp} is a gated MLP that its block's norm names pair with {norm}, which is not watched"
        elif before is not None:
            why = f"{mlp} is a gated MLP that receives {how}; the normaliser that runs just before it is {before}"
        else:
            why = f"{mlp} is a gated MLP that receives {how}; watched layers near it: {_listing(candidates)}"
        unknown.setdefault(key, why + " (names and source only: no traced forward)")
    return left


def detect_gating(
    model: nn.Module,
    norm_names: list[str] | None = None,
    mapping: dict[str, str | None] | None = None,
    example_input: Any = None,
    forward_fn: Callable[[nn.Module, Any], Any] | None = None,
) -> GatingInfo:
    """Find gated MLPs (SwiGLU/GeGLU) and the norm layers that feed them.

    Args:
        model: any ``nn.Module``.
        norm_names: the norm layers to pair (module names, wrapper prefixes of compile/DDP/FSDP
            optional). ``None``: every point-wise (DyT) layer of the model map.
        mapping: ``{norm_name: mlp_module_name}`` overrides the other rules for those norms; the MLP
            may use opaque child names. ``{norm_name: None}``: the norm feeds no gated MLP.
        example_input: one batch (e.g. the first training batch) for one eval, no-grad traced
            forward: gating is then read from the data flow. Without it, a forward traced before on this
            model (the live screen's first training forward, a probe's batch) is read; with none, every
            watched layer is unknown and the names only give a hint in the message.
        forward_fn: ``forward_fn(model, example_input)``; default :func:`satmon.batches.feed`
            (``model(t)``, ``model(*t)``, ``model(**t)``). Pass :func:`satmon.batches.feed_first`
            for ``(inputs, targets)`` batches.

    Returns:
        A :class:`~satmon.results.gating.GatingInfo`.

    Raises:
        ValueError: a ``norm_names`` entry or a mapping key names no normaliser, a mapping value
            names no module or no gated MLP, or the traced forward contradicts a mapping entry.

    Example:
        >>> from satmon.model.gating import detect_gating
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
        >>> blind = detect_gating(model)  # no forward: unknown, with what the names suggest
        >>> blind.gated, "names suggest yes (blocks.0.mlp_norm)" in blind.message
        (None, True)
        >>> import torch
        >>> found = detect_gating(model, example_input=torch.zeros(1, 8, dtype=torch.long))
        >>> found.message, found.pairings["blocks.0.mlp_norm"].source
        ('gated MLP after DyT: yes (blocks.0.mlp_norm -> blocks.0.mlp)', 'trace')
    """
    m = model_map(model)
    if example_input is not None:
        m.trace_forward(example_input, forward_fn)
    trace = m.trace  # this batch's, or a forward traced before (the live screen's first training forward)
    failure = m.trace_failure if trace is None else ""
    modules = m.modules
    if norm_names is None:
        norm_names = [l.name for l in m.layers(("dyt",))]
    all_norms = [l.name for l in m.norms] + list(m.undetermined)
    for name in norm_names:
        if name not in modules:
            raise ValueError(
                f"Expected `norm_names` to name modules of the model, got {name!r}. "
                f"{_available(all_norms, 'norm-like modules')}"
            )
    kinds = {l.name: l.kind for l in m.norms}
    label = "DyT" if norm_names and all(kinds.get(n) == "dyt" for n in norm_names) else "norm"
    mapping = dict(mapping or {})
    found = {n: parts for n, mod in modules.items() if (parts := gated_parts(mod)) is not None}
    built = _Pairs(modules)
    _pair_mapping(built, m, mapping, found, trace, all_norms)
    monitored = set(norm_names) - set(mapping)
    if trace is None:
        unknown = _untraced(m, found, monitored, norm_names, failure) if monitored else {}
        gated = True if built.pairs else None if unknown else False
        message = _untraced_message(built.pairs, unknown, label, mapping, norm_names, failure)
        notes = list(dict.fromkeys(built.notes))
        message += "; " + "; ".join(notes) if notes else ""
        return GatingInfo(gated, tuple(built.pairs), message, built.pairs, (), unknown)
    settled, unknown = _pair_trace(built, trace, monitored, found)
    for name in norm_names:  # a layer the forward did not run: what it feeds is not known from this forward
        if name in monitored and name not in trace.executed:
            unknown.setdefault(name, "it did not run in the traced forward, so its data flow was not seen")
    _unrun(
        m,
        trace,
        {n: p for n, p in found.items() if n not in built.paired and n not in settled},
        settled,
        monitored,
        unknown,
    )
    unknown = {n: d for n, d in unknown.items() if n not in built.pairs and n not in mapping}
    pairs = built.pairs
    gated_elsewhere = sorted(settled - built.paired)
    gated = True if pairs else None if unknown else False
    message = _message(pairs, gated_elsewhere, gated, label, unknown, True, mapping, norm_names)
    notes = list(dict.fromkeys(built.notes))
    if notes:
        message += "; " + "; ".join(notes)
    return GatingInfo(gated, tuple(pairs), message, pairs, tuple(gated_elsewhere), unknown)


def _unrun(
    m: ModelMap,
    trace: FlowTrace,
    left: dict[str, dict[str, Any]],
    settled: set[str],
    monitored: set[str],
    unknown: dict[str, str],
) -> None:
    """Gated MLPs by their names that the traced forward did not run (an MoE expert no token reached, the other
    side of an ``if``): unknown, naming the layer that would feed them; an expert whose siblings the trace read
    is read as they were."""
    for mlp, parts in left.items():
        parent = mlp.rpartition(".")[0]
        if any(s.rpartition(".")[0] == parent for s in settled):
            continue  # another expert of the same set ran: the trace read what feeds the set
        norm, how, before = _feeder(m, mlp, parts["gate"])
        if norm is not None and norm not in monitored:
            continue
        candidates = _candidates(m, mlp, monitored)
        key = norm or before or (candidates[0] if candidates else mlp)
        if key not in monitored:
            continue
        where = (
            f"its input is the output of {norm}"
            if norm
            else f"the normaliser that runs just before it is {before}"
            if before
            else f"watched layers near it: {_listing(candidates)}"
        )
        unknown.setdefault(key, f"{mlp} is a gated MLP by its names that did not run in the traced forward; {where}")


def _untraced(
    m: ModelMap, found: dict[str, dict[str, Any]], monitored: set[str], norm_names: list[str], failure: str
) -> dict[str, str]:
    """Without a traced forward every watched layer is unknown; the names and the forward sources say what they
    suggest, as a hint that is never taken for the answer."""
    hints = _Pairs(m.modules)
    suggested: dict[str, str] = {}
    left = {n: p for n, p in found.items()}
    _pair_names(hints, m, left, monitored, suggested)
    for name, why in _maybe_gated(m, found).items():
        norm, _, before = _feeder(m, name, _first_projection(m.module(name)))
        if norm is not None and norm not in monitored:
            continue
        candidates = _candidates(m, name, monitored)
        key = norm or before or (candidates[0] if candidates else name)
        where = (
            f"; its input is the output of {norm}"
            if norm
            else f"; the normaliser that runs just before it is {before}"
            if before
            else f"; watched layers near it: {_listing(candidates)}"
        )
        suggested.setdefault(key, why + where)
    why = failure or "no forward was traced"
    out = {}
    for name in norm_names:
        if name not in monitored:
            continue
        if name in hints.pairs:
            hint = f"names suggest it feeds the gated MLP {hints.pairs[name].mlp}"
        elif name in suggested:
            hint = f"names suggest: {suggested[name]}"
        else:
            hint = "names suggest no gated MLP reads it"
        out[name] = f"{why}; {hint}"
    return out


def _untraced_message(
    pairs: dict[str, GatedPairing],
    unknown: dict[str, str],
    label: str,
    mapping: dict[str, str | None],
    norm_names: list[str],
    failure: str,
) -> str:
    if not unknown or pairs:  # the user's mapping says yes (or every layer is mapped): the others stay unknown
        return _message(pairs, [], bool(pairs), label, unknown, False, mapping, norm_names)
    hinted = [n for n, d in unknown.items() if "suggest it feeds" in d]
    maybe = [n for n, d in unknown.items() if "names suggest: " in d]
    if hinted:
        hint = f"names suggest yes ({_listing(hinted)})"
    elif maybe:
        hint = f"names suggest: {maybe[0]}: {unknown[maybe[0]].split('names suggest: ', 1)[1]}"
    else:
        hint = "names suggest no gated MLP"
    why = failure or (
        "no forward was traced: satmon reads gating from the first training forward it observes, a "
        "probe's or a replay's calibration batch, or detect_gating(example_input=...)"
    )
    first = (hinted or maybe or list(unknown))[0]  # the option names the layer the hint is about
    return f"gated MLP after {label}: unknown ({why}; {hint}); {_hint(first)}"


def _message(
    pairs: dict[str, GatedPairing],
    elsewhere: list[str],
    gated: bool | None,
    label: str,
    unknown: dict[str, str],
    traced: bool,
    mapping: dict[str, str | None],
    norm_names: list[str],
) -> str:
    if gated is None:
        first = next(iter(unknown))
        more = f" (and {len(unknown) - 1} more layer(s))" if len(unknown) > 1 else ""
        return f"gated MLP after {label}: unknown: {first}: {unknown[first]}{more}; {_hint(first)}"
    if not gated:
        if norm_names and all(mapping.get(n, "") is None for n in norm_names):
            basis = "gating_mapping maps every layer to None"
        elif traced:
            basis = (
                "a traced forward shows no gated MLP"
                if not elsewhere
                else (
                    f"a traced forward shows no {label} feeding a gated MLP directly; gated MLPs fed "
                    f"otherwise: {_listing(elsewhere)}"
                )
            )
        elif elsewhere:
            basis = (
                f"the forward sources show no {label} feeding a gated MLP directly; gated MLPs fed otherwise: "
                f"{_listing(elsewhere)}; no example_input traced"
            )
        else:
            basis = "no gated MLP found by module names; no example_input traced"
        return f"gated MLP after {label}: no ({basis})"
    msg = f"gated MLP after {label}: yes ({_listing([f'{p.norm} -> {p.mlp or _ROOT}' for p in pairs.values()])})"
    odd = sorted({p.activation for p in pairs.values()} - set(_KNOWN))
    msg += f"; activation not recognised: {', '.join(odd)}" if odd else ""
    msg += (
        f"; {len(elsewhere)} gated MLP(s) fed by no watched {label} directly ({_listing(elsewhere)})"
        if elsewhere
        else ""
    )
    if unknown:
        msg += "; unknown for " + "; ".join(f"{n}: {d}" for n, d in list(unknown.items())[:_SHOWN])
    return msg


def gate_linear_modules(model: nn.Module, report: GatingInfo) -> dict[str, GateModules]:
    """Per paired norm, the gate (or fused gate-up) and up projection modules to hook.

    Pairings whose gate statistics cannot be read from module outputs (``gate_stats=False``) are left out.

    Example:
        >>> import torch
        >>> from satmon.model.gating import detect_gating, gate_linear_modules
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
        >>> mods = gate_linear_modules(model, detect_gating(model, example_input=torch.zeros(1, 8, dtype=torch.long)))
        >>> mods["blocks.0.mlp_norm"].gate is model.blocks[0].mlp.gate_proj, mods["blocks.0.mlp_norm"].activation
        (True, 'silu')
    """
    modules = modules_by_name(model)
    return {
        norm: GateModules(
            gate=modules[p.gate],
            up=modules[p.up] if p.up else None,
            fused=p.fused,
            activation=p.activation,
            gate_first=p.gate_first,
        )
        for norm, p in report.pairings.items()
        if p.gate_stats
    }
