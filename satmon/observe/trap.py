"""What the trap reading measures on the device: every DyT layer's saturation and its offset-driven share
(:mod:`satmon.functional.offset`, the same statistics as the window's), the order in which the model runs
its modules (which parameters lie below its final norm), and the gradient that reaches them
(:mod:`satmon.functional.trap`). Nothing here reads a value on the host except :meth:`TrapCounter.read`,
:meth:`GradReach.read` and :func:`read_trap`, called at check steps only.

"Below the head" is read from what the model computes, not from names: the final norm is the last
normaliser (DyT, LayerNorm or RMSNorm, :func:`satmon.model.map.model_map`) to start in a forward; the
parameters of modules that finished before it started are below it; those of the final norm and of modules
that started after it ended are the head's side (a parameter used on both sides, a tied embedding, counts
with the head: its gradient reaches it through the head). A module whose forward encloses the final norm
(a root module's own parameters) is unknown and left out of both.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from satmon.batches import ForwardFn, feed
from satmon.functional.offset import offset_summary, offset_sums
from satmon.functional.trap import grad_square
from satmon.model.discovery import NormLayer
from satmon.model.map import model_map
from satmon.model.weak import WeakModel
from satmon.observe.hookset import HookSet, recomputing
from satmon.observe.offset import OffsetCounter, OffsetHooks
from satmon.results.trap import TrapReading, reading_of

__all__ = ["ForwardOrder", "GradReach", "Layout", "TrapCounter", "TrapHooks", "read_trap"]

_NORM_KINDS = ("dyt", "layernorm", "rmsnorm")


class TrapCounter(OffsetCounter):
    """:class:`~satmon.observe.offset.OffsetCounter` plus, per layer, the median over channels of each channel's
    ``|mean|`` (the offset) and of its spread over tokens, for the reading's words ("offset 94 against a token
    spread 1.0").

    Example:
        >>> c = TrapCounter(1)
        >>> c.update(0, torch.tensor([[10.0, 0.5], [10.5, -0.5], [9.5, 0.0]]), torch.tensor([1.0]), 2.0, -1)
        >>> r = c.compute()
        >>> r["saturated"].tolist(), r["offset"].tolist(), [round(v, 4) for v in r["spread"].tolist()]
        ([0.5], [5.0], [0.4082])
    """

    offset_median: Tensor
    spread_median: Tensor

    def __init__(self, num_layers: int) -> None:
        super().__init__(num_layers)
        self.add_state("offset_median", torch.zeros(num_layers, dtype=torch.float64))
        self.add_state("spread_median", torch.zeros(num_layers, dtype=torch.float64))

    def update(self, index: int, x: Tensor, alpha: Tensor, level: float, channel_dim: int) -> None:
        s = offset_sums(x, alpha, level, channel_dim)
        ratio = offset_summary(s).offset_ratio_median
        for name, v in zip(self._COUNTS, (s.total, s.saturated, s.centered_saturated, s.offset_channel_saturated, 1)):
            getattr(self, name).select(0, index).add_(v)
        self.ratio_median.select(0, index).add_(ratio.clamp_max(1e12))
        medians = torch.stack([s.abs_mean, s.spread]).quantile(0.5, dim=1)  # the mean of the two middles, as numpy
        self.offset_median.select(0, index).add_(medians[0])
        self.spread_median.select(0, index).add_(medians[1])

    def compute(self, sync: bool = False) -> dict[str, Tensor]:
        """:meth:`OffsetCounter.compute`'s readings plus the mean per-batch ``offset`` and ``spread`` medians
        (``sync``: one all-reduce for all of them)."""
        s = self.synced(sync)
        n = s["total"].to(torch.float64).clamp_min(1)
        b = s["batches"].clamp_min(1).to(torch.float64)
        return {
            "saturated": s["saturated"] / n,
            "centered": s["centered"] / n,
            "offset_ratio": s["ratio_median"] / b,
            "batches": s["batches"],
            "offset": s["offset_median"] / b,
            "spread": s["spread_median"] / b,
        }

    def read(self, names: Sequence[str], sync: bool = True) -> dict[str, dict[str, float]]:
        """Per layer that saw a batch: ``saturated``, ``centered``, ``offset_ratio``, ``offset``, ``spread`` (one
        transfer; ``sync`` sums over ranks first: every rank at the same point)."""
        r = self.compute(sync)
        keys = ("saturated", "centered", "offset_ratio", "offset", "spread")
        rows = torch.stack([*(r[k] for k in keys), r["batches"].to(torch.float64)]).cpu().tolist()
        return {n: dict(zip(keys, vals[:-1])) for n, *vals in zip(names, *rows) if vals[-1]}


class TrapHooks(OffsetHooks):
    """The offset hooks of :mod:`satmon.observe.offset` on every DyT layer, feeding a :class:`TrapCounter`
    (enabled on check steps only). A layer whose ``alpha`` cannot broadcast as ``alpha * x`` against its input
    is left out of the reading (named in ``refused``), as the saturation hooks leave it out of the counts."""

    counter: TrapCounter

    def _make_hook(self, index: int):
        inner, name = super()._make_hook(index), self.layers[index].name

        def hook(mod: nn.Module, args: tuple, output: Tensor) -> None:
            if not self.enabled or name in self.refused:
                return
            try:
                inner(mod, args, output)
            except ValueError as err:  # raised before anything is added: the layer's reading stays empty
                self.refused[name] = str(err)

        return hook


@dataclass
class Layout:
    """Which parameters lie below the final norm, read from one forward's module order.

    Attributes:
        final: the final norm's name (``None``: no normaliser ran).
        final_kind: its kind (``"dyt"``, ``"layernorm"``, ``"rmsnorm"``), ``None`` when unknown.
        groups: group names, the head's side first (``"head"``), then each group below in forward order
            (the embedding, each block).
        params: ``(parameter, group index)`` for every trainable parameter on either side.
        unknown: modules whose parameters are on neither side (their forward encloses the final norm).
        note: why ``final`` is unknown, when it is (a compiled model, no normaliser ran).
    """

    final: str | None
    final_kind: str | None
    groups: list[str] = field(default_factory=list)
    params: list[tuple[nn.Parameter, int]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    note: str = ""


def _group(module_name: str) -> str:
    """A parameter group: the module name cut after its first numbered part (``blocks.0.attn.q`` -> ``blocks.0``),
    or the module's name (``tok_emb``)."""
    m = re.match(r"^(.*?\.\d+)(\.|$)", module_name)
    return m.group(1) if m else module_name or "(root)"


def _strip(name: str) -> str:
    for prefix in ("_orig_mod.", "module.", "_fsdp_wrapped_module."):
        name = name.replace(prefix, "")
    return name


class ForwardOrder(HookSet):
    """Records, for one forward, when each module starts and ends (a counter, host-side only: no tensor is read).
    Recording stops when the model's forward returns or, where a training step calls submodules rather than the
    model (a ``LightningModule``), when the first module that ran starts again (the next micro-batch).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2), torch.nn.Linear(2, 3))
        >>> order = ForwardOrder(model).attach()
        >>> _ = model(torch.randn(1, 2)); order.detach()
        >>> lay = order.layout()
        >>> lay.final, lay.final_kind, lay.groups
        ('1', 'layernorm', ['head', '0'])
    """

    model = WeakModel(required=True)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        # every module weakly (the hooks live on them): a kept screen's order does not keep the model alive
        self.model = model
        self.start: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
        self.end: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
        self._tick = 0
        # the first module that ran: when it starts again, a new forward has begun
        self._first: weakref.ref[nn.Module] | None = None
        self.done = False

    @property
    def alive(self) -> bool:
        """Whether the model is still alive (a screen kept after its model was freed reads nothing more)."""
        return ForwardOrder.model.held(self) is not None

    def _pre(self, module: nn.Module, _args: Any) -> None:
        if torch.compiler.is_compiling():  # eager only, as the offset statistics: nothing is recorded in a graph
            return
        if self.enabled and not self.done and not recomputing():
            if not self.start:
                self._first = weakref.ref(module)
            elif (
                self._first is not None and module is self._first() and module in self.end
            ):  # the first module again: a second forward (accumulation)
                self.done = True
                return
            self.start.setdefault(module, self._tick)
            self._tick += 1

    def _post(self, module: nn.Module, _args: Any, _out: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if self.enabled and not self.done and not recomputing():
            self.end[module] = self._tick
            self._tick += 1
            if module is self.model:
                self.done = True

    def _register(self) -> list[Any]:
        handles = []
        for m in self.model.modules():
            handles += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post)]
        return handles

    @property
    def seen(self) -> bool:
        return self.done or bool(self.end)

    def final(self) -> NormLayer | None:
        """The final norm the recorded forward shows: the last normaliser (DyT, LayerNorm or RMSNorm) to start in it;
        ``None`` when none ran (or nothing was recorded: a compiled model)."""
        norms = [l for l in model_map(self.model).layers(_NORM_KINDS) if l.module in self.start]
        return max(norms, key=lambda l: self.start[l.module]) if norms else None

    def final_kind(self) -> str | None:
        """The final norm's kind (``"dyt"``, ``"layernorm"``, ``"rmsnorm"``); ``None`` when no normaliser ran, or
        when a module that looks like a normaliser but could not be read (:attr:`ModelMap.undetermined
        <satmon.model.map.ModelMap.undetermined>`) started after the last one read: that one may be the final norm.

        Example:
            >>> from satmon.dyt import DyT
            >>> model = torch.nn.Sequential(torch.nn.LayerNorm(4), DyT(4), torch.nn.Linear(4, 3))
            >>> order = ForwardOrder(model).attach()
            >>> _ = model(torch.randn(1, 4)); order.detach()
            >>> order.final_kind()
            'dyt'
        """
        final = self.final()
        if final is None:
            return None
        m, start = model_map(self.model), self.start[final.module]
        unread = (m.module(name) for name in m.undetermined)
        return None if any(u is not None and self.start.get(u, -1) > start for u in unread) else final.kind

    def layout(self) -> Layout:
        """The layout the recorded forward shows (parameters with ``requires_grad`` only)."""
        final = self.final()
        if final is None:
            compiled = any(type(m).__name__ == "OptimizedModule" for m in self.model.modules())
            return Layout(
                None,
                None,
                note="the model runs compiled (torch.compile): the trap watch reads eager forwards only"
                if compiled
                else "no normaliser ran in the checked forward",
            )
        f0, f1 = self.start[final.module], self.end.get(final.module, self.start[final.module])
        head_ids: set[int] = set()
        below: dict[int, tuple[nn.Parameter, str]] = {}
        unknown: list[str] = []
        for name, m in self.model.named_modules():
            params = [p for p in m.parameters(recurse=False) if p.requires_grad]
            if not params or m not in self.start:
                continue
            s, e = self.start[m], self.end.get(m, self.start[m])
            if m is final.module or s > f1:
                head_ids.update(id(p) for p in params)
            elif e < f0:
                for p in params:
                    below.setdefault(id(p), (p, _group(_strip(name))))
            else:
                unknown.append(_strip(name) or "(root)")
        groups = ["head"]
        params: list[tuple[nn.Parameter, int]] = []
        head_params = {id(p): p for m in self.model.modules() for p in m.parameters(recurse=False) if id(p) in head_ids}
        params += [(p, 0) for p in head_params.values()]
        for pid, (p, g) in below.items():
            if pid in head_ids:  # used below and at the head (a tied embedding): the head's gradient reaches it
                continue
            if g not in groups:
                groups.append(g)
            params.append((p, groups.index(g)))
        return Layout(final.name, final.kind, groups, params, unknown)


class GradReach(HookSet):
    """The squared gradient norm of each parameter of a :class:`Layout`, written on the device by a
    post-accumulate-grad hook (the last backward of a step, gradient accumulation included, leaves the step's
    gradient), on enabled steps only; read per group at a check.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2), torch.nn.Linear(2, 3))
        >>> order = ForwardOrder(model).attach(); _ = model(torch.randn(1, 2)); order.detach()
        >>> reach = GradReach(order.layout()).attach()
        >>> model(torch.randn(4, 2)).square().sum().backward()
        >>> sq, seen = reach.read(); reach.detach()
        >>> [v > 0 for v in sq], seen  # the head side (LayerNorm + Linear: 4 tensors), the group below (2)
        ([True, True], [4.0, 2.0])
    """

    def __init__(self, layout: Layout) -> None:
        super().__init__()  # ``enabled``, the handles; attach / detach / attached: :class:`HookSet`'s
        self.layout = layout
        device = layout.params[0][0].device if layout.params else torch.device("cpu")
        n = len(layout.params)
        self.square = torch.zeros(n, dtype=torch.float64, device=device)
        self.seen = torch.zeros(n, dtype=torch.float64, device=device)
        self.index = torch.tensor([g for _, g in layout.params], dtype=torch.int64, device=device)

    def _hook(self, i: int) -> Callable[[Tensor], None]:
        def hook(p: Tensor) -> None:
            if self.enabled and p.grad is not None:
                self.square.select(0, i).copy_(grad_square(p.grad).to(self.square.device))
                self.seen.select(0, i).fill_(1.0)

        return hook

    def _register(self) -> list[Any]:
        return [p.register_post_accumulate_grad_hook(self._hook(i)) for i, (p, _) in enumerate(self.layout.params)]

    def device_read(self) -> tuple[Tensor, Tensor]:
        """Per group (float64 ``(G,)``, on the device): the squared gradient norm, and the parameters that got a
        gradient."""
        g = len(self.layout.groups)
        sq = torch.zeros(g, dtype=torch.float64, device=self.square.device).index_add_(0, self.index, self.square)
        seen = torch.zeros(g, dtype=torch.float64, device=self.square.device).index_add_(0, self.index, self.seen)
        return sq, seen

    def read(self, reduce_max: Callable[[Tensor], Tensor] | None = None) -> tuple[list[float], list[float]]:
        """Per group: squared gradient norms and counts of parameters with a gradient, on the host (one transfer;
        ``reduce_max`` takes their maximum over ranks first: every rank at the same point), then zeroed."""
        sq, seen = self.device_read()
        packed = torch.cat([sq, seen])
        if reduce_max is not None:
            packed = reduce_max(packed)
        values = packed.cpu().tolist()
        self.square.zero_()
        self.seen.zero_()
        g = len(self.layout.groups)
        return values[:g], values[g:]


def read_trap(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[Any, Any], Tensor] | None = None,
    forward_fn: ForwardFn | None = None,
    level: float = 2.0,
) -> TrapReading:
    """The trap reading of one forward and backward pass of ``model`` on ``batch`` (a checkpoint's replay):
    every DyT layer's saturation and offset, and the gradient reach below the final norm.

    The model's gradients are left as they were (saved and put back); its mode is left as it was (the pass runs
    in train mode, as training does).

    Args:
        model: the model (a checkpoint's weights loaded).
        batch: one training batch, fed by ``forward_fn`` (default :func:`satmon.batches.feed`).
        loss_fn: ``loss_fn(output, batch) -> scalar``; default: ``output.loss`` (Hugging Face), or the output when
            it is a scalar tensor.
        level: the saturation level (the study's 2.0).

    Returns:
        A :class:`satmon.results.trap.TrapReading` (``trapped`` is never set from one pass: it says ``found``).

    Example:
        >>> from satmon import DyT
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), DyT(4, alpha_init=0.2), torch.nn.Linear(4, 3))
        >>> r = read_trap(model, torch.randn(8, 4), loss_fn=lambda out, b: out.square().mean())
        >>> r.final, r.final_kind, r.found, r.reach > 0
        ('1', 'dyt', False, True)
    """
    forward_fn = forward_fn or feed
    layers = model_map(model).layers(("dyt",))
    hooks = TrapHooks(layers, TrapCounter(len(layers)), level) if layers else None
    order = ForwardOrder(model)
    saved = [(p, p.grad) for p in model.parameters()]
    training = model.training
    model.train()
    try:
        for p, _ in saved:
            p.grad = None
        order.attach()
        if hooks is not None:
            hooks.enabled = True
            hooks.attach()
        with torch.enable_grad():
            out = forward_fn(model, batch)  # one forward: its module order, its DyT inputs
            order.detach()
            if hooks is not None:
                hooks.detach()
            reach = GradReach(order.layout()).attach()  # before the backward: the hooks see its gradients
            _loss(out, batch, loss_fn).backward()
        reach.detach()
        sq, seen = reach.read()
        offsets = hooks.counter.read([l.name for l in layers], sync=False) if hooks is not None else {}
    finally:
        order.detach()
        if hooks is not None:
            hooks.detach()
        for p, g in saved:
            p.grad = g
        model.train(training)
    return reading_of(0, reach.layout, offsets, sq, seen)


def _loss(out: Any, batch: Any, loss_fn: Callable[[Any, Any], Tensor] | None) -> Tensor:
    if loss_fn is not None:
        return loss_fn(out, batch)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None and isinstance(out, Tensor) and out.numel() == 1:
        loss = out
    if not isinstance(loss, Tensor):
        raise TypeError(
            f"Expected the model's output to carry a loss (`output.loss`, or a scalar tensor), got "
            f"{type(out).__name__}: pass loss_fn=lambda output, batch: ... to read the trap."
        )
    return loss
