"""One map of a model's structure, read once and cached per model: what every part of satmon asks.

:func:`model_map` returns the :class:`ModelMap` of a model: every normaliser (found by what it
computes, :mod:`satmon.model.discovery`) with its kind, point-wise function and shift, channel
count, channel axis and block; the residual blocks; the modules by name; and, once a forward was
traced (:mod:`satmon.model.dataflow`), where each normaliser's output goes. The screen, the probe,
``convert_to_dyt``, replay and the live probe all read this map; nothing else walks the model to
read its structure.

When the map is rebuilt. A module-registration hook (``torch.nn.modules.module.
register_module_module_registration_hook``, one for the process) flags the map of every model
whose module gets a new child or a child replaced (``model.blocks[0].ln_1 = DyT(...)``,
``add_module``, ``ModuleList.append``): :meth:`ModelMap.changed` reads that flag, an O(1) check a
training loop can afford every step. Changes torch makes without the hook (``del``, ``ModuleList.insert``
or ``pop``) are caught at the next :func:`model_map` call, which compares the module tree's identity
(one walk over the modules, no evaluation). A rebuild re-reads only modules it has not read before.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from torch import nn

from satmon.model.discovery import (
    NormKind,
    NormLayer,
    Reading,
    Selector,
    check_selector,
    read_module,
    selects,
    strip_wrappers,
)
from satmon.model.weak import WeakModel

if TYPE_CHECKING:
    from satmon.model.dataflow import FlowTrace, LiveTrace

__all__ = ["MapChange", "ModelMap", "find_blocks", "find_dyt_layers", "find_norm_layers", "model_map"]

_maps: weakref.WeakKeyDictionary[nn.Module, ModelMap] = weakref.WeakKeyDictionary()
#: module -> the maps that hold it: the registration hook flags them
_owners: weakref.WeakKeyDictionary[nn.Module, weakref.WeakSet] = weakref.WeakKeyDictionary()
_hook_handle = None
_builds = 0  # maps built in this process (tests count them)


def _on_registration(parent: nn.Module, name: str, submodule: nn.Module | None) -> None:
    owners = _owners.get(parent)
    if owners:
        for m in list(owners):
            m._flag(parent, name, submodule)


def _install_hook() -> None:
    global _hook_handle
    if _hook_handle is None:
        from torch.nn.modules.module import register_module_module_registration_hook

        _hook_handle = register_module_module_registration_hook(_on_registration)


def _tree(model: nn.Module) -> tuple[int, ...]:
    return tuple(id(m) for m in model.modules())


@dataclass(frozen=True)
class MapChange:
    """What changed between two maps of one model: point-wise layers added, removed or replaced (same name,
    another module), by name.

    Example:
        >>> MapChange(added=("blocks.1.ln",)).empty
        False
    """

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.replaced)


class ModelMap:
    """The structure of one model, as satmon reads it (see the module docstring).

    Attributes:
        norms: every normaliser in registration order (:class:`~satmon.model.discovery.NormLayer`:
            kind, function, shift, channels, axis, block; ``feeds`` once traced).
        undetermined: modules that look like normalisers but could not be read, with why.
        blocks: the residual blocks ``[(name, module), ...]`` in depth order.
        modules: every module by its stripped name (:func:`~satmon.model.discovery.modules_by_name`).
        trace: the traced forward (:class:`~satmon.model.dataflow.FlowTrace`), ``None`` until one ran.
        trace_failure: why the last traced forward failed (``""`` when none failed).

    Example:
        >>> import torch
        >>> from satmon.demos.gpt import GPT, GPTConfig
        >>> model = GPT(GPTConfig(n_layers=1))
        >>> m = model_map(model)  # the cache holds the model weakly: keep your own reference
        >>> [(l.name, l.kind, l.channels, l.block) for l in m.norms][:2]
        [('blocks.0.ln_1', 'dyt', 64, 'blocks.0'), ('blocks.0.ln_2', 'dyt', 64, 'blocks.0')]
        >>> m is model_map(model), m.changed()
        (True, False)
    """

    model = WeakModel(required=True)  # weakly: the hooks and the cache live on the model

    def __init__(self, model: nn.Module) -> None:
        global _builds
        _builds += 1
        _install_hook()
        self.model = model
        self._changed: list[str] = []
        self._listeners: list[weakref.WeakMethod] = []
        raw = list(model.named_modules())
        self._tree = tuple(id(m) for _, m in raw)
        # the root is held weakly (the cache must not keep a model alive): its names stand in for it
        self._modules: dict[str, nn.Module | None] = {}
        for n, m in raw:
            self._modules[strip_wrappers(n)] = None if m is model else m
        self._names: dict[int, str] = {}
        self._raw: dict[int, str] = {}
        for n, m in raw:
            self._names.setdefault(id(m), strip_wrappers(n))
            self._raw.setdefault(id(m), n)
        entries: list[tuple[str, nn.Module, Reading]] = []
        undetermined: dict[str, str] = {}
        could_not_run = False
        seen: set[int] = set()
        for n, m in raw:
            if m is model or id(m) in seen:
                continue
            seen.add(id(m))
            r = read_module(m)
            if r is None:
                continue
            could_not_run |= r.basis == "names"
            if r.kind == "unknown":
                undetermined[strip_wrappers(n)] = r.note
                continue
            entries.append((strip_wrappers(n), m, r))
        # a module that could not run is read again at the next lookup (materialised?)
        self._complete = not could_not_run
        norm_ids = {id(m) for _, m, _ in entries}
        self.blocks: tuple[tuple[str, nn.Module], ...] = tuple(_blocks_of(self.modules, norm_ids))
        block_names = [b for b, _ in self.blocks]
        self.norms: tuple[NormLayer, ...] = tuple(self._layer(n, m, r, block_names) for n, m, r in entries)
        self.undetermined: Mapping[str, str] = MappingProxyType(undetermined)
        self.trace: FlowTrace | None = None
        self.trace_failure = ""
        for _, m in raw:
            _owners.setdefault(m, weakref.WeakSet()).add(self)
        del raw

    @staticmethod
    def _layer(name: str, module: nn.Module, r: Reading, blocks: list[str]) -> NormLayer:
        block = next((b for b in blocks if name.startswith(b + ".")), None)
        return NormLayer(
            name,
            module,
            r.kind,
            r.function,
            r.shift,
            r.channels,
            r.axis,
            block,
            None,
            r.basis,  # type: ignore[arg-type]
            r.gain_shape,
        )

    # ------------------------------------------------------------------------------------ state
    @property
    def modules(self) -> dict[str, nn.Module]:
        """Every module by its stripped name (:func:`~satmon.model.discovery.modules_by_name`), root included."""
        model = self.model
        return {n: model if m is None else m for n, m in self._modules.items()}

    def module(self, name: str) -> nn.Module | None:
        """The module called ``name`` (stripped name; ``""`` is the model), ``None`` when there is none (O(1))."""
        if name not in self._modules:
            return None
        m = self._modules[name]
        return self.model if m is None else m

    def _flag(self, parent: nn.Module, name: str, submodule: nn.Module | None = None) -> None:
        where = self._names.get(id(parent), "?")
        path = f"{where}.{name}" if where else name
        self._changed.append(path)
        # a listener whose owner went is dropped
        self._listeners = [ref for ref in self._listeners if ref() is not None]
        for ref in list(self._listeners):
            listener = ref()
            if listener is not None:
                listener(self, path, submodule)

    def listen(self, callback: Callable[[ModelMap, str, nn.Module | None], None]) -> None:
        """Call ``callback(map, name, submodule)`` when a module is registered under the model (a bound method,
        held weakly: the listener's owner goes when nothing else holds it). ``submodule`` is the module being
        registered (``None`` when a child is set to ``None``); it is not in the model yet when the call runs.

        Example:
            >>> from torch import nn
            >>> from satmon import DyT
            >>> class Log:
            ...     def __init__(self):
            ...         self.seen = []
            ...     def __call__(self, m, name, sub):
            ...         self.seen.append((name, type(sub).__name__))
            >>> model, log = nn.Sequential(nn.Linear(4, 4), DyT(4)), Log()
            >>> model_map(model).listen(log.__call__)
            >>> model[1] = DyT(4)
            >>> log.seen
            [('1', 'DyT')]
        """
        self._listeners.append(weakref.WeakMethod(callback))  # type: ignore[arg-type]

    def changed(self) -> bool:
        """Whether a module was registered under one of the model's modules since the map was built (O(1))."""
        return bool(self._changed)

    @property
    def changes(self) -> tuple[str, ...]:
        """Where modules were registered since the map was built (``parent.child`` names)."""
        return tuple(self._changed)

    def current(self) -> bool:
        """Still the model's structure: no registration flagged, and the module tree is the same (one walk)."""
        model = ModelMap.model.held(self)
        return model is not None and not self._changed and self._complete and _tree(model) == self._tree

    # ------------------------------------------------------------------------------------ reading
    def layers(
        self,
        kinds: Iterable[NormKind] = ("dyt", "layernorm", "rmsnorm"),
        include: Selector = None,
        exclude: Selector = None,
    ) -> list[NormLayer]:
        """The normalisers of ``kinds``, in registration order; ``include=``/``exclude=`` as in
        :func:`find_norm_layers`."""
        check_selector(include, "include")
        check_selector(exclude, "exclude")
        kinds = tuple(kinds)
        known = {id(l.module): l for l in self.norms}
        out: list[NormLayer] = []
        seen: set[int] = set()
        for name, module in self.modules.items():
            if name == "" or id(module) in seen or self._names.get(id(module)) != name:
                continue
            seen.add(id(module))
            layer = known.get(id(module))
            if layer is None and selects(include, name, module):
                layer = self._included(name, module)
            if layer is None or layer.kind not in kinds or selects(exclude, name, module):
                continue
            out.append(layer)
        return out

    def _included(self, name: str, module: nn.Module) -> NormLayer | None:
        import warnings

        r = read_module(module, selected=True)
        if r is None or r.kind == "unknown":
            owns_alpha = "alpha" in dict(module.named_parameters(recurse=False))
            what = (
                (
                    "owns `alpha` but, run on a test input, does not compute weight * f(alpha * x + s) + bias with f "
                    "tanh, erf or hardtanh (alpha rescaled, divided, offset, or no bounded "
                    "function): its saturation "
                    "is not |alpha * x| > level, so satmon leaves it out rather than report a "
                    "wrong number. Select the "
                    "module that applies f(alpha * x) itself"
                )
                if owns_alpha
                else (
                    "computes neither a point-wise weight * f(alpha * x + s) + bias nor gain * normalize(x) + bias "
                    "(LayerNorm/RMSNorm) on a test input"
                    + (f" ({r.note})" if r is not None else "")
                    + "; satmon leaves it out"
                )
            )
            warnings.warn(
                f"satmon: include= selects {name!r} ({type(module).__name__}), which {what}.", UserWarning, stacklevel=4
            )
            return None
        return self._layer(name, module, r, [b for b, _ in self.blocks])

    def layer(self, name: str) -> NormLayer:
        """The normaliser called ``name`` (stripped name).

        Raises:
            KeyError: no normaliser has that name; the message lists them.
        """
        for l in self.norms:
            if l.name == name:
                return l
        raise KeyError(
            f"Expected the name of a normaliser of the model, got {name!r}. Normalisers: "
            f"{', '.join(l.name for l in self.norms[:20])}{' ...' if len(self.norms) > 20 else ''}."
        )

    def name_of(self, module: nn.Module) -> str | None:
        """The stripped name of ``module`` in the model, ``None`` when it is not there."""
        return self._names.get(id(module))

    def path_of(self, module: nn.Module) -> str | None:
        """The attribute path of ``module`` from the model (wrapper parts kept: what ``setattr`` needs)."""
        return self._raw.get(id(module))

    # ------------------------------------------------------------------------------------ the traced forward
    def trace_forward(
        self, example_input: Any, forward_fn: Callable[[nn.Module, Any], Any] | None = None
    ) -> FlowTrace | None:
        """Trace one eval, no-grad forward of ``example_input`` (once per map): each normaliser's
        ``feeds`` is then filled. A forward that fails is reported in :attr:`trace_failure`, never raised."""
        if self.trace is not None:
            return self.trace
        from satmon.batches import feed
        from satmon.model.dataflow import trace_flow

        watched = [l.name for l in self.norms]
        try:
            trace = trace_flow(
                self.model, watched, example_input, forward_fn or feed, opaque={*watched, *self.undetermined}
            )
        except Exception as err:  # a monitor must not stop training: report and fall back to names
            self.trace_failure = (
                f"the traced forward failed ({type(err).__name__}: {err}); give it a forward that works "
                "(SaturationMonitor(gating_forward_fn=...), detect_gating(forward_fn=...))"
            )
            return None
        self.adopt(trace)
        return self.trace

    def trace_live(self, done: Callable[[ModelMap], None]) -> LiveTrace:
        """Read the model's next training forward as it runs (:class:`~satmon.model.dataflow.LiveTrace`: no extra
        forward), then call ``done(map)`` with the model's map at that time, its :attr:`trace` filled (or its
        :attr:`trace_failure` saying why not). The returned trace's ``finish()`` ends a trace that saw submodule
        calls only (a ``training_step``); its ``cancel()`` removes the hooks."""
        from satmon.model.dataflow import LiveTrace

        ref = weakref.ref(self.model)  # the hooks live on the model: no strong reference back to it

        def finished(trace: FlowTrace | None, why: str) -> None:
            model = ref()
            if model is None:
                return
            m = model_map(model)
            if trace is not None:
                m.adopt(trace)
            else:
                m.trace_failure = f"the traced training forward failed: {why}"
            done(m)

        watched = [l.name for l in self.norms]
        return LiveTrace(self.model, watched, {*watched, *self.undetermined}, done=finished)

    def adopt(self, trace: FlowTrace) -> None:
        """Keep ``trace`` as this model's traced forward: each normaliser's ``feeds`` is then filled."""
        self.trace, self.trace_failure = trace, ""
        feeds = trace.feeds
        self.norms = tuple(replace(l, feeds=tuple(sorted(feeds.get(l.name, ())))) for l in self.norms)

    # ------------------------------------------------------------------------------------ comparing
    def compare(self, before: ModelMap, kinds: Iterable[NormKind] = ("dyt",)) -> MapChange:
        """The point-wise (or ``kinds``) layers added, removed or replaced since ``before``."""
        kinds = tuple(kinds)
        old = {l.name: l.module for l in before.norms if l.kind in kinds}
        new = {l.name: l.module for l in self.norms if l.kind in kinds}
        return MapChange(
            added=tuple(n for n in new if n not in old),
            removed=tuple(n for n in old if n not in new),
            replaced=tuple(n for n in new if n in old and new[n] is not old[n]),
        )


def model_map(
    model: nn.Module, example_input: Any = None, forward_fn: Callable[[nn.Module, Any], Any] | None = None
) -> ModelMap:
    """The :class:`ModelMap` of ``model``: cached, rebuilt only when its modules changed.

    Args:
        model: any ``nn.Module`` (compiled, DDP- or FSDP-wrapped too: names are stripped of the wrappers).
        example_input: a batch to trace once (fills each normaliser's ``feeds`` and the gating read).
        forward_fn: how ``example_input`` reaches the model (default :func:`satmon.batches.feed`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from satmon import DyT
        >>> model = nn.Sequential(nn.Linear(4, 4), DyT(4))
        >>> before = model_map(model)
        >>> _ = model.append(DyT(4))  # ModuleList/Sequential.append, setattr, add_module: flagged at once
        >>> before.changed(), [l.name for l in model_map(model).norms]
        (True, ['1', '2'])
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected an nn.Module, got {type(model).__name__}.")
    m = _maps.get(model)
    if m is None or not m.current():
        m = ModelMap(model)
        _maps[model] = m
    if example_input is not None:
        m.trace_forward(example_input, forward_fn)
    return m


# ----------------------------------------------------------------------------------- the public finders
def find_norm_layers(
    model: nn.Module,
    kinds: tuple[NormKind, ...] = ("dyt", "layernorm", "rmsnorm"),
    include: Selector = None,
    exclude: Selector = None,
) -> list[NormLayer]:
    """Find normalization layers, in registration order (read from the model map, built once per model).

    Args:
        model: any ``nn.Module`` (compiled, DDP- or FSDP-wrapped models work too).
        kinds: which kinds to return.
        include: a regex on the module name or a predicate ``(name, module) -> bool``. Modules it
            selects are evaluated even when discovery would not try them, and get the kind their
            computation shows; a selected module that computes none of the forms is left out with a
            warning (counting ``|alpha * x| > level`` there would read a saturation it does not have).
        exclude: the same form; modules it selects are dropped.

    Returns:
        The list of :class:`NormLayer`, each module listed once.

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> model = nn.Sequential(nn.Linear(4, 4), DyT(4), nn.LayerNorm(4))
        >>> [(l.name, l.kind) for l in find_norm_layers(model)]
        [('1', 'dyt'), ('2', 'layernorm')]
    """
    return model_map(model).layers(kinds, include=include, exclude=exclude)


def find_dyt_layers(model: nn.Module, include: Selector = None, exclude: Selector = None) -> list[NormLayer]:
    """Find the point-wise layers (DyT, Derf, HardTanh; see :func:`find_norm_layers`).

    Example:
        >>> from torch import nn
        >>> from satmon import DyT
        >>> [l.name for l in find_dyt_layers(nn.Sequential(DyT(4), nn.ReLU(), DyT(4)))]
        ['0', '2']
    """
    return find_norm_layers(model, kinds=("dyt",), include=include, exclude=exclude)


def find_blocks(model: nn.Module, names: list[str] | None = None) -> list[tuple[str, nn.Module]]:
    """Find the transformer blocks whose outputs form the residual stream.

    Rule: the longest ``nn.ModuleList``/``nn.Sequential`` whose children are all of one class and
    each hold a normaliser.

    Args:
        model: the model.
        names: explicit block module names (overrides discovery), for models where the rule fails.

    Returns:
        ``[(name, module), ...]`` in depth order; empty when no block list is found.

    Example:
        >>> from torch import nn
        >>> block = lambda: nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4))
        >>> model = nn.ModuleDict({"emb": nn.Embedding(5, 4), "h": nn.ModuleList([block(), block()])})
        >>> [n for n, _ in find_blocks(model)]
        ['h.0', 'h.1']
    """
    m = model_map(model)
    if names is None:
        return list(m.blocks)
    modules = m.modules
    missing = [n for n in names if n not in modules]
    if missing:
        raise ValueError(
            f"Expected block names that exist in the model, got unknown {missing}. Available: {sorted(modules)[:20]}..."
        )
    return [(n, modules[n]) for n in names]


def _blocks_of(modules: dict[str, nn.Module], norm_ids: set[int]) -> list[tuple[str, nn.Module]]:
    """The block rule of :func:`find_blocks` over ``modules`` (stripped names), given which modules are normalisers."""
    best: list[tuple[str, nn.Module]] = []
    for name, module in modules.items():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 1:
            continue
        children = list(module.named_children())
        if len({type(c) for _, c in children}) != 1:
            continue
        if not all(any(id(m) in norm_ids for m in c.modules()) for _, c in children):
            continue
        if len(children) > len(best):
            best = [(f"{name}.{n}" if name else n, c) for n, c in children]
    return best
