"""Where a norm layer's output goes: one traced no-grad forward, followed tensor by tensor.

A ``TorchFunctionMode`` sees every torch call of the forward; each tensor that derives from a
watched norm's output carries a small record (which norm, how many projections away, which
projection started its branch, which activation it passed). An element-wise product of two
branches of one norm, each one projection away, of which exactly one passed through an activation,
is a gated MLP ``down(act(gate(h)) * up(h))`` (split or fused gate/up). Any other product of two
such branches (no activation, both activated, one the norm output itself) is reported as an
interaction satmon cannot classify. Names play no part; module names are only read to say where
each projection happened. Norm layers are opaque: their output starts a new record (or none).

A branch is the norm's output *read directly*: views, casts, dropout, a permute, rows or time steps
picked, a scale of one value per token keep it; an addition with another stream ends it
(``h = x + norm(attn(x))`` is the residual stream, not the norm's output: a post-norm layer never feeds
the next MLP). "Another stream" is a tensor operand of the result's full size that carries no branch of
that norm and is *data*: what derives from the model's input. Each tensor's origin is followed too:
parameters, buffers, constants and what is computed from them alone are input-independent (a bias, a
rotary table, however it is cast: the tensor arguments of ``type_as``, ``.to``, ``new_*`` and ``*_like``
give only a dtype or a shape), and so are weights and biases gathered by an index computed from the data
(``W[e]``, ``b[e]``, ``index_select``, ``F.embedding`` of expert ids: a router's choice); a table gathered
by token ids or positions is an embedding, data. A tensor the forward did not show being made (a
kernel's output) counts as data: the safe reading. A projection is a matrix product with a weight
(``Linear``, ``x @ W``, ``bmm`` over gathered experts, ``grouped_mm`` and kernels named like one).
Where each norm's output goes is recorded in :attr:`FlowTrace.feeds`: ``"gated-mlp"``, ``"attention"``
(a product of two of its projections, ``q @ k^T``, or ``scaled_dot_product_attention``), ``"mlp"``
(projection, activation, projection), ``"residual"`` (its output itself added to another stream) and
``"projection"`` (a projection that is none of those, e.g. a head).

:func:`trace_flow` runs one eval, no-grad forward of a batch; :class:`LiveTrace` reads the model's own first
training forward as it runs (the live screen: no extra forward).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from satmon.batches import feed
from satmon.model.discovery import read_module, strip_wrappers
from satmon.model.frozen_forward import reshard_fsdp
from satmon.model.weak import WeakModel

__all__ = ["FlowTrace", "GatedProduct", "Interaction", "LiveTrace", "own_forward", "trace_flow", "tracing"]

_PROJECTIONS = {
    "linear",
    "matmul",
    "__matmul__",
    "__rmatmul__",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "addbmm",
    "einsum",
    "mv",
    "addmv",
    "tensordot",
    "bilinear",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "scaled_dot_product_attention",
    "_grouped_mm",
    "grouped_mm",
}
#: kernels named for a matrix product (transformers' ``grouped_mm_fallback``, ``_scaled_mm``, a custom ``gemm``)
_PROJECTION_NAME = re.compile(r"(^|_)(grouped_mm|scaled_mm|bmm|mm|gemm|matmul|linear)(_|$)")
_ACTIVATIONS = {
    "silu",
    "gelu",
    "sigmoid",
    "relu",
    "relu6",
    "tanh",
    "softplus",
    "mish",
    "elu",
    "selu",
    "celu",
    "leaky_relu",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "logsigmoid",
    "softsign",
    "tanhshrink",
}
_PRODUCTS = {"mul", "__mul__", "__rmul__", "mul_", "__imul__", "multiply"}
_SPLITS = {"chunk", "split", "tensor_split", "unbind", "split_with_sizes"}
_ADDS = {"add", "__add__", "__radd__", "add_", "__iadd__", "sub", "__sub__", "__rsub__", "sub_", "__isub__", "subtract"}
_ATTENTION = {"scaled_dot_product_attention", "flash_attention", "_scaled_dot_product_flash_attention"}
_PAIRWISE = {"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "baddbmm"}  # q @ k^T when both come from the norm
#: calls whose output takes only the shape, dtype or device of these tensor arguments (by
#: position; -1: all), not their values
_METADATA = {
    "type_as": (1,),
    "to": (1,),
    "expand_as": (1,),
    "view_as": (1,),
    "reshape_as": (1,),
    "new_zeros": (0,),
    "new_ones": (0,),
    "new_empty": (0,),
    "new_full": (0,),
    "new_tensor": (0,),
    "new_empty_strided": (0,),
    "zeros_like": (0,),
    "ones_like": (0,),
    "empty_like": (0,),
    "full_like": (0,),
    "rand_like": (0,),
    "randn_like": (0,),
    "randint_like": (0,),
    "size": (-1,),
    "dim": (-1,),
}
#: gathers: (position of the table, position of the index); F.embedding takes (index, table)
_GATHERS = {
    "__getitem__": (0, 1),
    "index_select": (0, 2),
    "gather": (0, 2),
    "take": (0, 1),
    "take_along_dim": (0, 1),
    "embedding": (1, 0),
    "embedding_bag": (1, 0),
}
_MAX_HOPS = 2  # a branch is followed through two projections (the MLP's down projection), then dropped
#: what a tensor's values derive from, besides parameters, buffers and constants (the default: input-independent)
_STATIC, _DATA, _ROUTED = "static", "data", "routed"  # see _Mode.kind
_UNSEEN_FILL = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}


@dataclass(frozen=True)
class GatedProduct:
    """``act(gate(h)) * up(h)`` with ``h`` a watched norm's output; module names as in :func:`modules_by_name`.

    ``up == gate`` when ``fused`` (one gate-up projection split in two; ``gate_first`` says which
    half is the gate). ``down`` is the projection that consumes the product (``None``: none did).
    ``hookable``: the gate module's output is the gate pre-activation (or the fused gate-up) and
    the down module's input is the product, so module hooks read the gate statistics.
    """

    norm: str
    gate: str
    up: str
    down: str | None
    fused: bool
    gate_first: bool
    activation: str
    hookable: bool


@dataclass(frozen=True)
class Interaction:
    """An element-wise product of two branches of a watched norm's output that is not ``act(gate) * up``."""

    norm: str
    module: str
    detail: str


@dataclass
class FlowTrace:
    """What one traced forward showed: gated products, unclassified products, the modules that ran,
    and where each watched norm's output went (``feeds``: norm -> destinations, see the module docstring)."""

    products: list[GatedProduct]
    unclassified: list[Interaction]
    executed: set[str]
    feeds: dict[str, set[str]] = field(default_factory=dict)
    #: norm -> the modules whose projections read its output directly (the first projection of each branch)
    reached: dict[str, set[str]] = field(default_factory=dict)
    #: module -> the most arguments (positional and keyword) one of its calls passed (a
    #: gated norm's ``norm(y, gate)``: 2)
    inputs: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Flow:
    hops: int  # projections since the norm
    source: tuple  # the branch: which projection (and which split of it) it comes from
    proj: str | None = None  # module in which the branch's projection ran
    act: str | None = None  # activation applied since that projection
    split: tuple[int, int] | None = None  # (index, parts) of a split fused projection
    product: int | None = None  # index into the pending gated products, on the product and its views


@dataclass
class _Pending:
    norm: str
    gate: tuple  # (module, source) of the gate branch
    up: tuple
    fused: bool
    gate_first: bool
    activation: str
    down: str | None = None


class _Mode(TorchFunctionMode):
    def __init__(self, names: dict[int, str], watched: set[str], norms: set[str], buffers: set[int]) -> None:
        super().__init__()
        self.names, self.watched, self.norms, self.buffers = names, watched, norms, buffers
        self.records: dict[int, tuple[weakref.ref, dict[str, _Flow]]] = {}
        #: tensor -> "static" or _ROUTED; a tensor without a record is a parameter or buffer (static), or data
        self.kinds: dict[int, tuple[weakref.ref, str]] = {}
        self.stack: list[str] = []
        self.inside_norm = 0
        self.events = itertools.count()
        self.pending: list[_Pending] = []
        self.unclassified: list[Interaction] = []
        self.hookable_sources: dict[str, set[tuple]] = {}  # module -> branch sources its output is
        self.product_inputs: dict[int, set[str]] = {}  # pending product -> modules whose first input it is
        self.executed: set[str] = set()
        self.inputs: dict[str, int] = {}  # module -> the most arguments one of its calls passed
        self.feeds: dict[str, set[str]] = {}
        self.reached: dict[str, set[str]] = {}

    def went(self, norm: str, where: str) -> None:
        self.feeds.setdefault(norm, set()).add(where)

    # ---------------------------------------------------------------- records
    def get(self, t: Any) -> dict[str, _Flow] | None:
        if not isinstance(t, Tensor):
            return None
        rec = self.records.get(id(t))
        return rec[1] if rec is not None and rec[0]() is t else None

    def put(self, t: Tensor, flows: dict[str, _Flow] | None) -> None:
        key = id(t)
        if not flows or not (t.is_floating_point() or t.is_complex()):  # indices and masks carry no branch
            self.records.pop(key, None)
            return
        self.records[key] = (weakref.ref(t, lambda _r, k=key, rs=self.records: rs.pop(k, None)), flows)

    def kind(self, t: Tensor) -> str:
        """``"static"`` (parameters, buffers, constants and what is computed from them alone), ``_ROUTED`` (an
        index computed from the data) or ``_DATA`` (the model's input and what derives from it; also any tensor
        whose making the forward did not show, e.g. a kernel's output: "another stream" is the safe reading)."""
        rec = self.kinds.get(id(t))
        if rec is not None and rec[0]() is t:
            return rec[1]
        return _STATIC if isinstance(t, nn.Parameter) or id(t) in self.buffers else _DATA

    def mark(self, t: Tensor, kind: str) -> None:
        key = id(t)
        if kind == _DATA:
            self.kinds.pop(key, None)
        else:
            self.kinds[key] = (weakref.ref(t, lambda _r, k=key, ks=self.kinds: ks.pop(k, None)), kind)

    def _kind_of(self, name: str, args: tuple, values: list[Tensor], out: Tensor) -> str:
        """What ``out`` derives from (see :meth:`kind`)."""
        gather = _GATHERS.get(name)
        if (
            gather is not None
            and len(args) > max(gather)
            and isinstance(args[gather[0]], Tensor)
            and self.kind(args[gather[0]]) == _STATIC
        ):
            index = [self.kind(t) for t in _tensors((args[gather[1]],), {})]
            if _ROUTED in index:
                return _STATIC  # weights or biases picked by a router (W[e]): parameters still, as in any Linear
            return _DATA if index else _STATIC  # an embedding of the input ids, a position table: a stream
        if name in _UNSEEN_FILL:
            return _DATA  # filled by a kernel the forward may not show
        kinds = [(t, self.kind(t)) for t in values]
        if all(k == _STATIC for _, k in kinds):
            return _STATIC  # constants, parameters, buffers, factories: input-independent
        if out.is_floating_point() or out.is_complex():
            return _DATA
        routed = any(k == _ROUTED or (k == _DATA and (t.is_floating_point() or t.is_complex())) for t, k in kinds)
        return _ROUTED if routed else _DATA  # a top-k of router logits routes; reshaped input ids stay data

    # ---------------------------------------------------------------- module hooks
    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict | None = None) -> None:
        name = self.names.get(id(module), "?")
        self.stack.append(name)
        self.executed.add(name)
        self.inputs[name] = max(self.inputs.get(name, 0), len(args) + len(kwargs or {}))
        if name in self.norms:
            self.inside_norm += 1
        elif args and (flows := self.get(args[0])):
            for f in flows.values():
                if f.product is not None:
                    self.product_inputs.setdefault(f.product, set()).add(name)

    def post_hook(self, module: nn.Module, args: tuple, out: Any) -> None:
        name = self.stack.pop() if self.stack else "?"
        if name in self.norms:
            self.inside_norm -= 1
            if isinstance(out, Tensor) and not self.inside_norm:
                self.put(out, {name: _Flow(0, ("norm", name))} if name in self.watched else None)
                inputs = list(_tensors(args, {}))  # a norm of constants (learned latents) is constant too
                self.mark(out, _STATIC if inputs and all(self.kind(t) == _STATIC for t in inputs) else _DATA)
            return
        flows = self.get(out)
        for f in (flows or {}).values():
            if f.hops >= 1 and f.act is None and f.split is None and f.proj == name:
                self.hookable_sources.setdefault(name, set()).add(f.source)

    # ---------------------------------------------------------------- torch calls
    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if self.inside_norm or name == "__get__":
            return out
        outs = list(_tensors((out,), {}))
        if name == "__setitem__" and args and isinstance(args[0], Tensor):
            outs = [args[0]]
        if not outs:
            return out
        values = _values(name, args, kwargs)
        for t in outs:
            self.mark(t, self._kind_of(name, args, values, t))
        inputs = [f for a in values if (f := self.get(a))]
        if not inputs:
            return out
        if name in _ADDS:
            flows = self._add(values, inputs, outs)
        elif name in _PROJECTIONS or _PROJECTION_NAME.search(name):
            self._attention(name, values)
            flows = self._project(inputs)
        elif name in _ACTIVATIONS:
            act = (
                "gelu_tanh"
                if name == "gelu" and kwargs.get("approximate", args[1] if len(args) > 1 else "none") == "tanh"
                else name
            )
            flows = {n: replace(f, act=f.act or act) for n, f in _merge(inputs, self.events).items()}
        elif name == "glu":
            flows = self._glu(inputs)
        elif name in _PRODUCTS and len(inputs) == 2:
            flows = self._product(*[(t, f) for t in values if (f := self.get(t))][:2])
        else:
            flows = _merge(inputs, self.events)
        if name in _SPLITS or name == "__getitem__":
            channels = name in _SPLITS or _touches_last(args[1:], args[0].dim() if isinstance(args[0], Tensor) else 0)
            for i, t in enumerate(outs):
                key = (
                    (name, i, len(outs))
                    if name in _SPLITS
                    else (name, repr(args[1:]), _starts_at_zero(args[1:]), channels)
                )
                split = (i, len(outs)) if name in _SPLITS else (0 if key[2] else 1, 2)
                # rows or time steps picked (x[:, t], x[token_idx]): the same branch, no half of a fused projection
                self.put(
                    t,
                    {
                        n: replace(f, source=f.source + (key,), split=split if channels else f.split)
                        for n, f in flows.items()
                    },
                )
            return out
        for t in outs:
            self.put(t, flows)
        return out

    def _add(self, values: list[Tensor], inputs: list[dict[str, _Flow]], outs: list[Tensor]) -> dict[str, _Flow]:
        """An addition: a norm's branch that meets another stream ends there (the residual stream). A parameter,
        a buffer or anything computed from them alone (a bias, even one gathered by a
        router, a constant) is no stream."""
        size = outs[0].numel()
        operands = [t for t in values if t.numel() == size and (self.get(t) or self.kind(t) != _STATIC)]
        flows = _merge(inputs, self.events)
        for n in list(flows):
            carried = [self.get(t) or {} for t in operands]
            direct = any(f.get(n) is not None and f[n].hops == 0 for f in carried)
            # its output itself, added to another stream or to a branch computed from it (a residual connection);
            # two pieces of its output added together (rotary embeddings) are neither
            if direct and len(operands) > 1 and any(n not in f or f[n].hops >= 1 for f in carried):
                self.went(n, "residual")
            if any(n not in f for f in carried):
                del flows[n]  # mixed with another stream: no longer this norm's output
        return flows

    def _attention(self, name: str, values: list[Tensor]) -> None:
        tensors = [f for t in values if (f := self.get(t))]
        # q, k, v: projections of the norm's output, or a q/k norm's output itself
        if name in _ATTENTION or name in _PAIRWISE and len(tensors) >= 2:
            for flows in tensors:
                for n in flows:
                    self.went(n, "attention")

    def _project(self, inputs: list[dict[str, _Flow]]) -> dict[str, _Flow]:
        module = self.stack[-1] if self.stack else ""
        event = next(self.events)
        flows = {}
        for n, f in _merge(inputs, self.events).items():
            if f.hops == 0:
                self.went(n, "projection")
                self.reached.setdefault(n, set()).add(module)
            elif f.hops == 1 and f.act is not None and f.product is None:
                self.went(n, "mlp")
            if f.product is not None and self.pending[f.product].down is None:
                self.pending[f.product].down = module
            if f.hops + 1 <= _MAX_HOPS:
                flows[n] = _Flow(f.hops + 1, ("proj", event), proj=module)
        return flows

    def _glu(self, inputs: list[dict[str, _Flow]]) -> dict[str, _Flow]:
        flows = _merge(inputs, self.events)
        for n, f in list(flows.items()):
            if f.hops == 1 and f.proj is not None:  # F.glu(a|b) = a * sigmoid(b): the second half gates
                self.pending.append(_Pending(n, (f.proj, f.source), (f.proj, f.source), True, False, "sigmoid"))
                self.went(n, "gated-mlp")
                flows[n] = _Flow(1, ("glu", next(self.events)), product=len(self.pending) - 1)
        return flows

    def _product(self, ta: tuple[Tensor, dict[str, _Flow]], tb: tuple[Tensor, dict[str, _Flow]]) -> dict[str, _Flow]:
        (x, a), (y, b) = ta, tb
        flows = _merge([a, b], self.events)
        for n in set(a) & set(b):
            fa, fb = a[n], b[n]
            per_token = [f for f, t, other in ((fa, x, y), (fb, y, x)) if f.hops == 0 and _per_token(other, t)]
            if per_token:  # the output scaled per token (a router's score before the experts, Llama4): still the output
                flows[n] = per_token[0]
                continue
            # one branch times itself: an activation written out (x * sigmoid(x)), a scan's steps
            if _same_branch(fa, fb):
                acts = {fa.act, fb.act}
                written = "silu" if acts == {None, "sigmoid"} else fa.act or fb.act or "product"  # swish, GPT-OSS's too
                flows[n] = replace(fa, act=written)
                continue
            if max(fa.hops, fb.hops) > 1:
                continue  # e.g. router weights times an expert's output: past the MLP's first projection
            gate, up = (fa, fb) if fa.act and not fb.act else (fb, fa) if fb.act and not fa.act else (None, None)
            if gate is not None and gate.hops == up.hops == 1 and gate.proj is not None and up.proj is not None:
                fused = gate.source[:2] == up.source[:2]
                gate_first = gate.split is None or gate.split[0] == 0
                self.pending.append(
                    _Pending(n, (gate.proj, gate.source[:2]), (up.proj, up.source[:2]), fused, gate_first, gate.act)
                )
                self.went(n, "gated-mlp")
                flows[n] = _Flow(1, ("product", next(self.events)), product=len(self.pending) - 1)
                continue
            self.unclassified.append(Interaction(n, self.stack[-1] if self.stack else "", _describe(fa, fb)))
        return flows

    def trace(self) -> FlowTrace:
        feeds = {n: _summary(w) for n, w in self.feeds.items()}
        return FlowTrace(self.products(), self.unclassified, self.executed, feeds, self.reached, self.inputs)

    def products(self) -> list[GatedProduct]:
        out = []
        for i, p in enumerate(self.pending):
            gate_out = p.gate[1] in self.hookable_sources.get(p.gate[0], set())
            hookable = gate_out and p.down is not None and p.down in self.product_inputs.get(i, set())
            out.append(GatedProduct(p.norm, p.gate[0], p.up[0], p.down, p.fused, p.gate_first, p.activation, hookable))
        return list(dict.fromkeys(out))  # a module called twice in the forward gives one product


def _describe(a: _Flow, b: _Flow) -> str:
    if min(a.hops, b.hops) == 0:
        return "one factor is the norm output itself"
    if a.act and b.act:
        return f"both factors passed through activations ({a.act}, {b.act})"
    if not a.act and not b.act:
        return "neither factor passed through an activation"
    return "the factors are not both one projection away from the norm"


def _merge(inputs: list[dict[str, _Flow]], events: Iterator[int]) -> dict[str, _Flow]:
    """Per norm, the branch of the output: the input's when one branch (or one source) enters, else a new one."""
    by_norm: dict[str, list[_Flow]] = {}
    for flows in inputs:
        for n, f in flows.items():
            by_norm.setdefault(n, []).append(f)
    merged = {}
    for n, fs in by_norm.items():
        if len({f.source for f in fs}) == 1:
            merged[n] = fs[0] if len(fs) == 1 else replace(fs[0], act=next((f.act for f in fs if f.act), None))
        else:
            merged[n] = _Flow(max(f.hops for f in fs), ("mix", next(events)))
    return merged


def _values(name: str, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensor arguments whose values reach the output (not those of which only the shape, dtype or device do)."""
    skip = _METADATA.get(name, ())
    if -1 in skip:
        return []
    return [t for i, a in enumerate(args) if i not in skip for t in _tensors((a,), {})] + list(_tensors((), kwargs))


def _tensors(args: tuple, kwargs: dict) -> Iterator[Tensor]:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (tuple, list)):
            yield from (t for t in a if isinstance(t, Tensor))


def _same_branch(a: _Flow, b: _Flow) -> bool:
    """One branch, whatever rows or time steps each factor picked of it (``deltaA[:, :, t] * state`` in a scan)."""
    if a.source == b.source:
        return True
    if a.source[:2] != b.source[:2]:
        return False
    rows = lambda key: isinstance(key, tuple) and key[:1] == ("__getitem__",) and len(key) == 4 and not key[3]  # noqa: E731
    return [k for k in a.source[2:] if not rows(k)] == [k for k in b.source[2:] if not rows(k)]


def _touches_last(index: tuple, ndim: int) -> bool:
    """Whether an index (``x[...]``'s key) selects along the last dimension (the channels)."""
    items = index[0] if len(index) == 1 else index
    items = items if isinstance(items, tuple) else (items,)
    full = lambda i: isinstance(i, slice) and i == slice(None)  # noqa: E731
    if any(i is Ellipsis for i in items):
        after = items[[j for j, i in enumerate(items) if i is Ellipsis][0] + 1 :]
        return any(i is not None for i in after) and not full([i for i in after if i is not None][-1])
    used = sum(i.dim() if isinstance(i, Tensor) and i.dtype == torch.bool else 1 for i in items if i is not None)
    if used < ndim:
        return False
    last = [i for i in items if i is not None]
    return bool(last) and not full(last[-1])


def _per_token(factor: Tensor, x: Tensor) -> bool:
    """``factor`` holds one value per token of ``x`` (its last dimension 1, broadcast over the channels)."""
    return factor.dim() >= 1 and factor.shape[-1] == 1 and x.dim() >= 1 and x.shape[-1] > 1


def _starts_at_zero(index: tuple) -> bool:
    key = index[0] if len(index) == 1 else index
    last = key[-1] if isinstance(key, tuple) and key else key
    return isinstance(last, slice) and last.start in (None, 0)


def trace_flow(
    model: nn.Module,
    norm_names: list[str],
    example_input: Any,
    forward_fn: Callable[[nn.Module, Any], Any] = feed,
    opaque: set[str] | None = None,
) -> FlowTrace:
    """Follow the outputs of ``norm_names`` through one eval, no-grad forward of ``example_input``.

    Args:
        model: the model (put in eval mode for the forward, then restored; nothing else changes).
        norm_names: the norm layers to follow (stripped names, as :func:`modules_by_name` gives them).
        example_input: one batch, fed by ``forward_fn``.
        forward_fn: ``forward_fn(model, batch)``; default :func:`satmon.batches.feed`.
        opaque: the normalisers whose insides are not followed (default: every module discovery reads as a
            normaliser, as the model map lists them, and ``norm_names``).

    Returns:
        A :class:`FlowTrace`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class SwiGLU(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.pre, self.proj_d = nn.LayerNorm(4), nn.Linear(8, 4)
        ...         self.proj_g, self.proj_u = nn.Linear(4, 8), nn.Linear(4, 8)
        ...     def forward(self, x):
        ...         h = self.pre(x)
        ...         return self.proj_d(nn.functional.silu(self.proj_g(h)) * self.proj_u(h))
        >>> p = trace_flow(SwiGLU(), ["pre"], torch.randn(2, 4)).products[0]
        >>> p.norm, p.gate, p.up, p.down, p.activation
        ('pre', 'proj_g', 'proj_u', 'proj_d', 'silu')
    """
    mode = _mode_for(model, norm_names, opaque)
    handles = _hook(model, mode.pre_hook, mode.post_hook)
    modes = [(m, m.training) for m in model.modules()]  # restored one by one: a model may mix train and eval parts
    try:
        model.eval()
        with torch.no_grad(), _eager(), own_forward(), mode:
            forward_fn(model, example_input)
    finally:
        for m, training in modes:
            m.training = training
        for h in handles:
            h.remove()
        reshard_fsdp(model)  # FSDP2 keeps its root unsharded after a no-grad forward: training must not see that
    return mode.trace()


def _mode_for(model: nn.Module, norm_names: list[str], opaque: set[str] | None) -> _Mode:
    names: dict[int, str] = {}
    for raw, m in model.named_modules():
        names.setdefault(id(m), strip_wrappers(raw))
    if opaque is None:  # every module discovery reads as a normaliser (the model map's norms and undetermined)
        opaque = {
            strip_wrappers(raw) for raw, m in model.named_modules() if m is not model and read_module(m) is not None
        }
    norms = {n for n in names.values() if n in norm_names or n in opaque}
    return _Mode(names, set(norm_names), norms, {id(b) for b in model.buffers()})


def _hook(model: nn.Module, pre: Callable, post: Callable) -> list[Any]:
    """The trace's module hooks: before every other pre-hook (satmon's own counting hooks on a norm then run
    inside it, unseen), and after a forward that raised too."""
    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
        handles.append(m.register_forward_hook(post, always_call=True))
    return handles


def _compiling() -> bool:
    check = getattr(torch.compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


def _eager() -> Any:
    """Compiled code runs eagerly inside (its torch calls are seen); a no-op where torch has no stances."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance else contextlib.nullcontext()


class LiveTrace:
    """Trace the first training forward of ``model`` as it runs: no extra forward, no batch to pass.

    Hooks on every module wait for the first forward of a module in training mode. Each outermost
    call from then on runs under the trace (compiled code eagerly, gradients as usual) until the
    model's own forward returns (a plain loop's ``model(x)``), or until :meth:`finish` (a
    ``training_step`` that calls submodules: the owner calls it at the end of the step); then
    ``done(trace, "")``. A forward that raises is not read: the next one is traced instead, up to
    three times, then ``done(None, why)``. :meth:`cancel` removes the hooks (the owner detaches).
    :func:`tracing` stays ``False`` meanwhile: this is the model's own forward.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model, found = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 8), nn.GLU()), []  # a fused GLU after a norm
        >>> live = LiveTrace(model, ["0"], done=lambda trace, why: found.append(trace))
        >>> model(torch.randn(2, 4)).sum().backward()  # the training forward itself is read
        >>> found[0].products[0].gate, found[0].products[0].fused, live.armed
        ('1', True, False)
    """

    TRIES = 3
    _model = WeakModel()  # the hooks live on the model (satmon.model.weak)

    def __init__(
        self,
        model: nn.Module,
        norm_names: list[str],
        opaque: set[str] | None = None,
        *,
        done: Callable[[FlowTrace | None, str], None],
    ) -> None:
        self._model = model
        self._names, self._opaque, self._done = list(norm_names), opaque, done
        self._mode: _Mode | None = None  # what the traced calls showed so far
        self._owner: nn.Module | None = None  # the outermost module being traced now
        self._stance: Any = None
        self._read = False  # a traced call returned
        self._failures: list[str] = []
        self._handles = _hook(model, self._pre, self._post)

    @property
    def armed(self) -> bool:
        """Still waiting for (or inside) the forward it reads."""
        return bool(self._handles)

    def finish(self) -> None:
        """End the trace when a traced call returned (the end of the first training step); else keep waiting."""
        if self._read and self._owner is None and self._mode is not None:
            mode = self._mode
            self.cancel()
            self._done(mode.trace(), "")

    def cancel(self) -> None:
        """Remove the hooks; a forward being traced is left untraced (its mode is popped)."""
        self._leave()
        self._mode = None
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if _compiling():  # inside a compiled region (Module.compile() on the root): no trace, never a graph of its own
            return
        if self._owner is None:
            model = self._model
            if model is None or not module.training or _TRACING:  # a training forward, never satmon's own eval trace
                return
            if self._mode is None:
                self._mode = _mode_for(model, self._names, self._opaque)
            self._owner, self._stance = module, _eager()
            self._stance.__enter__()
            self._mode.__enter__()
        assert self._mode is not None
        self._mode.pre_hook(module, args, kwargs)

    def _post(self, module: nn.Module, args: tuple, out: Any) -> None:
        mode = self._mode
        if self._owner is None or mode is None or _compiling():
            return
        mode.post_hook(module, args, out)
        if module is not self._owner or mode.stack:
            return
        raised = sys.exc_info()[1]  # an always-called hook runs inside the except clause of a forward that raised
        self._leave()
        if raised is not None:
            self._mode, self._read = None, False  # a forward that raised is not read
            self._failures.append(f"{type(raised).__name__}: {raised}")
            if len(self._failures) >= self.TRIES:
                self.cancel()
                self._done(
                    None, f"the first {self.TRIES} training forwards raised ({self._failures[-1]}); none was read"
                )
            return
        self._read = True
        if module is self._model:
            self.finish()

    def _leave(self) -> None:
        if self._owner is not None and self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._stance.__exit__(None, None, None)
        self._owner = self._stance = None


def _summary(where: set[str]) -> set[str]:
    """``"projection"`` only when the norm's projections went nowhere more telling (attention, an MLP)."""
    return where - {"projection"} if where & {"attention", "mlp", "gated-mlp"} else where


_TRACING = 0


def tracing() -> bool:
    """Whether satmon is running a forward of its own now (the gating trace's eval forward of a batch, or the check of a
    model :func:`satmon.convert_to_dyt` just changed): a user's own forward hooks can tell those from the model's.

    Example:
        >>> tracing()
        False
    """
    return _TRACING > 0


@contextlib.contextmanager
def own_forward() -> Iterator[None]:
    """Mark the forwards inside as satmon's own (:func:`tracing` is ``True``; the live trace does not read them)."""
    global _TRACING
    _TRACING += 1
    try:
        yield
    finally:
        _TRACING -= 1
