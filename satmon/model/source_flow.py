"""What a module's ``forward`` source says about its data flow, for the names fallback (no traced batch).

The source of ``type(module).forward`` is parsed (never run) and its statements followed in order,
each local variable carrying its *origin*: an argument of ``forward``, the output of a child module
(``self.mlp(...)``), a part of one (``chunk``/``split``/a slice), an addition of different origins
(``"mix"``), or unknown. Views, casts, dropout, permutes, activations and parameterless pass-through
children keep an origin. Two readings come out of it:

- :func:`argument_origin`: which child's output (or which ``forward`` argument) a call of a given
  child receives, e.g. ``self.mlp(h)`` with ``h = self.post_attention_layernorm(x)`` -> that norm,
  ``self.mlp(h)`` with ``h = residual + hidden`` -> ``"mix"`` (post-norm: no norm feeds the MLP);
- :func:`multiplies_projections`: whether the forward multiplies two values derived from different
  projections of its input (or two parts of one): a gated product may exist there.

Anything the reader cannot follow gives ``None`` ("cannot tell"), never a "no".
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, field, replace
from functools import lru_cache

from torch import nn

__all__ = [
    "Origin",
    "argument_origin",
    "call_inputs",
    "called_children",
    "multiplied_projections",
    "multiplies_projections",
]

_KEEP_METHODS = {
    "view",
    "reshape",
    "to",
    "float",
    "half",
    "bfloat16",
    "double",
    "type",
    "type_as",
    "contiguous",
    "transpose",
    "permute",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "clone",
    "detach",
    "expand",
    "expand_as",
    "view_as",
    "movedim",
}
_SPLIT_METHODS = {"chunk", "split", "tensor_split", "unbind"}
_ACTIVATIONS = {
    "silu",
    "gelu",
    "relu",
    "sigmoid",
    "tanh",
    "softplus",
    "mish",
    "elu",
    "selu",
    "leaky_relu",
    "hardswish",
    "gelu_new",
    "swish",
    "relu6",
    "hardsigmoid",
}
_PASS_FUNCTIONS = {"dropout", "contiguous", "to", *_ACTIVATIONS}
#: functional projections: ``F.linear(x, self.w)``, ``x @ self.w[e]`` (experts stored as 3-D parameters)
_PROJECT_FUNCTIONS = {"linear", "matmul", "mm", "bmm", "grouped_mm", "_grouped_mm"}
PARAM = "param:"  # the origin name of a functional projection on a parameter of the module
#: words of an attention forward: a helper called on two of its projections there is q and k, not a gate
_ATTENTION_WORDS = ("softmax", "attention", "attn", "matmul", "einsum", "bmm", "rotary", "rope", "baddbmm")


@dataclass(frozen=True)
class Origin:
    """Where a value comes from: ``kind`` is ``"arg"`` (a forward argument, ``name``), ``"child"`` (the
    output of child ``name``, ``part`` its piece when split), ``"mix"`` (an addition of different origins)
    or ``"product"``; ``acted`` when an activation was applied on the way."""

    kind: str
    name: str = ""
    part: str = ""
    acted: bool = False
    sources: frozenset = field(default_factory=frozenset)  # the children a mix or product came from


_UNKNOWN = None
_ANY_PART = "*"  # the part index of a split whose count the source does not say


@dataclass
class _Reading:
    calls: list[tuple[str, Origin | None]] = field(default_factory=list)  # (child path, origin of its first input)
    products: list[tuple[Origin | None, Origin | None]] = field(default_factory=list)
    opaque: list[list[Origin | None]] = field(default_factory=list)  # arguments of functions satmon cannot see into
    attention_like: bool = False


def _path(node: ast.AST, me: str = "self") -> str | None:
    """``self.a.b`` -> ``"a.b"``; ``self.layers[0]`` -> ``"layers.0"``; anything else None
    (``me``: forward's first argument)."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
        ):
            parts.append(str(node.slice.value))
            node = node.value
        elif isinstance(node, ast.Subscript):
            parts.append("*")
            node = node.value
        else:
            break
    if isinstance(node, ast.Name) and node.id == me and parts:
        return ".".join(reversed(parts))
    return None


class _Walker:
    def __init__(self, module: nn.Module, args: list[str], me: str = "self") -> None:
        self.module, self.me = module, me
        self.env: dict[str, Origin | None | tuple] = {a: Origin("arg", a) for a in args}
        self.aliases: dict[str, str] = {}  # local name -> child path (expert = self.experts[i])
        self.out = _Reading()

    # ---------------------------------------------------------------- children
    def child(self, path: str) -> nn.Module | None:
        m: nn.Module | None = self.module
        for part in path.split("."):
            if m is None:
                return None
            if part == "*":
                kids = list(m.children())
                m = kids[0] if kids else None
            else:
                m = m._modules.get(part) if part in m._modules else None
        return m

    def _pass_through(self, m: nn.Module) -> str | None:
        """``"keep"`` for dropout/identity-like children, ``"act"`` for activations, else None."""
        if isinstance(m, (nn.Dropout, nn.Identity)) or type(m).__name__.lower().startswith("dropout"):
            return "keep"
        if next(m.parameters(), None) is None and not list(m.children()):
            name = type(m).__name__.lower()
            if any(a in name for a in _ACTIVATIONS) or "act" in name or "gelu" in name:
                return "act"
        return None

    # ---------------------------------------------------------------- expressions
    def value(self, node: ast.AST) -> Origin | None | tuple:
        if isinstance(node, ast.Name):
            return self.env.get(node.id, _UNKNOWN)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BinOp):
            a, b = self.value(node.left), self.value(node.right)
            if isinstance(node.op, ast.Mult):
                return self._multiply(a, b)
            if isinstance(node.op, (ast.Add, ast.Sub)):
                return _mix(a, b)
            return _single(a) if _single(b) is None else _mix(a, b)
        if isinstance(node, ast.Subscript):
            base = self.value(node.value)
            if isinstance(base, tuple):
                if (
                    isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, int)
                    and node.slice.value < len(base)
                ):
                    return base[node.slice.value]
                return _UNKNOWN
            o = _single(base)
            return (
                None
                if o is None
                else Origin(o.kind, o.name, o.part + "[" + ast.dump(node.slice) + "]", o.acted, o.sources)
            )
        if isinstance(node, ast.Tuple):
            return tuple(_single(self.value(e)) for e in node.elts)
        if isinstance(node, ast.Constant):
            return _UNKNOWN
        if isinstance(node, ast.IfExp):
            a, b = _single(self.value(node.body)), _single(self.value(node.orelse))
            return a if a == b else _UNKNOWN
        return _UNKNOWN

    def call(self, node: ast.Call) -> Origin | None | tuple:
        func = node.func
        first = (
            node.args[0]
            if node.args
            else next((k.value for k in node.keywords if k.arg in ("hidden_states", "x", "input")), None)
        )
        path = (
            _path(func, self.me)
            if not (isinstance(func, ast.Attribute) and func.attr == "forward")
            else _path(func.value, self.me)
        )
        if path is None and isinstance(func, ast.Name) and func.id in self.aliases:
            path = self.aliases[func.id]
        if path is not None:
            m = self.child(path)
            if m is not None:
                arg = _single(self.value(first)) if first is not None else _UNKNOWN
                kind = self._pass_through(m)
                if kind == "keep":
                    return arg
                if kind == "act":
                    return None if arg is None else Origin(arg.kind, arg.name, arg.part, True, arg.sources)
                self.out.calls.append((path, arg))
                return Origin("child", path)
        fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if fname in _PROJECT_FUNCTIONS and len(node.args) >= 2:
            weight = _path(node.args[1].value if isinstance(node.args[1], ast.Subscript) else node.args[1], self.me)
            if weight is not None and weight in self.module._parameters:
                arg = _single(self.value(node.args[0]))
                self.out.calls.append((PARAM + weight, arg))
                return Origin("child", PARAM + weight)
        if isinstance(func, ast.Attribute):
            if func.attr in _SPLIT_METHODS:
                # x.chunk(2, -1), or the function form torch.chunk(x, 2, dim=-1) (its tensor is the first argument)
                functional = isinstance(func.value, ast.Name) and func.value.id not in self.env and bool(node.args)
                base = _single(self.value(node.args[0] if functional else func.value))
                if base is None:
                    return _UNKNOWN
                n = _split_count(node, 1 if functional else 0)
                if n is None:  # a count satmon cannot read (a size from an attribute, unbind): parts still differ
                    return Origin(
                        base.kind, base.name, f"{base.part}<{func.attr}{_ANY_PART}>", base.acted, base.sources
                    )
                return tuple(
                    Origin(base.kind, base.name, f"{base.part}<{func.attr}{i}>", base.acted, base.sources)
                    for i in range(n)
                )
            if func.attr in _KEEP_METHODS:
                return self.value(func.value)
            name = func.attr
            if name in _PASS_FUNCTIONS and first is not None:  # F.silu(x), torch.tanh(x), nn.functional.dropout(x)
                o = _single(self.value(first))
                return None if o is None else Origin(o.kind, o.name, o.part, o.acted or name in _ACTIVATIONS, o.sources)
            if name in ("mul", "multiply") and len(node.args) >= 2:
                return self._multiply(self.value(node.args[0]), self.value(node.args[1]))
        if isinstance(func, ast.Name) and func.id in _PASS_FUNCTIONS and first is not None:
            o = _single(self.value(first))
            return None if o is None else Origin(o.kind, o.name, o.part, o.acted or func.id in _ACTIVATIONS, o.sources)
        # an unknown function: its arguments are still read (calls and products inside), and kept: it may multiply them
        self.out.opaque.append([_single(self.value(a)) for a in node.args])
        return _UNKNOWN

    def _multiply(self, a: Origin | None | tuple, b: Origin | None | tuple) -> Origin | None:
        """A product of two known values is recorded; a value times something of no known origin (a
        scale, noise, a constant) keeps its origin, as the traced forward keeps a branch."""
        a, b = _single(a), _single(b)
        if a is None or b is None:
            return a if b is None else b
        self.out.products.append((a, b))
        return Origin("product", sources=_sources(a) | _sources(b))

    # ---------------------------------------------------------------- statements
    def assign(self, target: ast.AST, value: Origin | None | tuple, node: ast.AST | None = None) -> None:
        if isinstance(target, ast.Name):
            if node is not None and isinstance(node, ast.Subscript) and _path(node, self.me) is not None:
                self.aliases[target.id] = _path(node, self.me)  # expert_layer = self.experts[i]
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = value if isinstance(value, tuple) else None
            for i, t in enumerate(target.elts):
                if items is not None and i < len(items):
                    self.assign(t, items[i])
                elif isinstance(value, Origin) and value.part.endswith(f"{_ANY_PART}>"):
                    self.assign(t, replace(value, part=value.part.replace(_ANY_PART, str(i))))  # g, u = h.unbind(-2)
                elif isinstance(value, Origin) and value.kind == "child" and i == 0:
                    self.assign(t, value)  # out, weights = self.attn(...): the first item is the output
                else:
                    self.assign(t, _UNKNOWN)

    def statements(self, body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.Assign):
                v = self.value(st.value)
                for t in st.targets:
                    self.assign(t, v, st.value)
            elif isinstance(st, ast.AnnAssign) and st.value is not None:
                self.assign(st.target, self.value(st.value), st.value)
            elif isinstance(st, ast.AugAssign):
                v = self.value(st.value)
                if isinstance(st.target, ast.Name):
                    old = self.env.get(st.target.id, _UNKNOWN)
                    if isinstance(st.op, ast.Mult):
                        self.env[st.target.id] = self._multiply(old, v)
                    else:
                        self.env[st.target.id] = _mix(old, v)
            elif isinstance(st, (ast.Expr, ast.Return)) and st.value is not None:
                self.value(st.value)
            elif isinstance(st, ast.For) and isinstance(st.target, ast.Name) and _path(st.iter, self.me) is not None:
                self.aliases[st.target.id] = _path(st.iter, self.me) + ".*"  # for block in self.blocks: x = block(x)
                self.statements(st.body)
            elif isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                for part in ("body", "orelse", "finalbody"):
                    self.statements(getattr(st, part, []) or [])
                for h in getattr(st, "handlers", []) or []:
                    self.statements(h.body)


def _single(v: Origin | None | tuple) -> Origin | None:
    return v if isinstance(v, Origin) else None


def _sources(v: Origin | None | tuple) -> frozenset:
    o = _single(v)
    if o is None:
        return frozenset()
    if o.kind == "child":
        return frozenset({(o.name, o.part)})
    return o.sources


def _mix(a: Origin | None | tuple, b: Origin | None | tuple) -> Origin | None:
    a, b = _single(a), _single(b)
    if a is None and b is None:
        return None
    if a == b:
        return a
    return Origin("mix", sources=_sources(a) | _sources(b))


def _split_count(node: ast.Call, first: int = 0) -> int | None:
    """How many parts a split call makes (``first``: the index of its count argument), None when unreadable."""
    args = node.args[first:]
    chunks = next((k.value for k in node.keywords if k.arg == "chunks"), args[0] if args else None)
    if (
        isinstance(node.func, ast.Attribute)
        and node.func.attr == "chunk"
        and isinstance(chunks, ast.Constant)
        and isinstance(chunks.value, int)
    ):
        return chunks.value
    if args and isinstance(args[0], (ast.List, ast.Tuple)):
        return len(args[0].elts)
    return None


@lru_cache(maxsize=512)
def _parsed(cls: type) -> ast.FunctionDef | None:
    try:
        src = textwrap.dedent(inspect.getsource(cls.forward))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    fn = tree.body[0] if tree.body else None
    return fn if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else None  # type: ignore[return-value]


def _read(module: nn.Module) -> _Reading | None:
    fn = _parsed(type(module))
    if fn is None:
        return None
    if not fn.args.args:
        return None
    args = [a.arg for a in fn.args.args[1:]] + [a.arg for a in fn.args.kwonlyargs]
    w = _Walker(module, args, fn.args.args[0].arg)
    try:
        w.statements(fn.body)
    except RecursionError:
        return None
    w.out.attention_like = any(t in ast.dump(fn).lower() for t in _ATTENTION_WORDS) or any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for n in ast.walk(fn)
    )
    return w.out


def called_children(module: nn.Module) -> list[str] | None:
    """The children ``module.forward`` calls, in source order (``None``: no source to read)."""
    r = _read(module)
    return None if r is None else [p for p, _ in r.calls]


def argument_origin(module: nn.Module, child: str) -> list[Origin | None] | None:
    """The origin of the first input of each call of ``child`` (a dotted path below ``module``) in
    ``module.forward``; ``None`` when the source cannot be read or never calls it."""
    r = _read(module)
    if r is None:
        return None
    found = [o for p, o in r.calls if p == child or _matches(p, child)]
    return found or None


def _matches(pattern: str, path: str) -> bool:
    a, b = pattern.split("."), path.split(".")
    return len(a) == len(b) and all(x == "*" or x == y for x, y in zip(a, b))


def _is_projection(m: nn.Module | None | str) -> bool:
    if isinstance(m, str):
        return m.startswith(PARAM)
    if m is None:
        return False
    w = getattr(m, "weight", None)
    return getattr(w, "dim", lambda: 0)() == 2 and not isinstance(m, nn.Embedding)


def multiplied_projections(module: nn.Module) -> tuple[str, ...] | None:
    """The projection children whose outputs ``module.forward`` multiplies (two different projections of
    its input, or two parts of one), or hands together to a function satmon cannot see into (outside
    attention code): where a gated product may exist. ``()``: none; ``None``: no source to read."""
    r = _read(module)
    if r is None:
        return None
    walker = _Walker(module, [])

    def projections(o: Origin | None) -> set:
        return {s for s in _sources(o) if _is_projection(s[0] if s[0].startswith(PARAM) else walker.child(s[0]))}

    pairs = [(projections(a), projections(b)) for a, b in r.products]
    if not r.attention_like:
        for args in r.opaque:
            found = [p for p in map(projections, args) if p]
            pairs += [(found[0], x) for x in found[1:]]
    for pa, pb in pairs:
        if pa and pb and pa != pb:
            return tuple(dict.fromkeys(name for name, _ in sorted(pa | pb)))
    return ()


def multiplies_projections(module: nn.Module) -> bool | None:
    """Whether a gated product may exist in ``module.forward`` (:func:`multiplied_projections`); ``None``: no source."""
    found = multiplied_projections(module)
    return None if found is None else bool(found)


@lru_cache(maxsize=512)
def _class_calls(cls: type) -> dict[str, tuple[int, ...]] | None:
    """``self.<child>(...)`` calls in every method of ``cls``: child -> how many arguments each call passes
    (a ``*args`` or ``**kwargs`` counts as two: more than one input)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    out: dict[str, list[int]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.args.args:
            continue
        me = fn.args.args[0].arg
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            func = (
                node.func.value if isinstance(node.func, ast.Attribute) and node.func.attr == "forward" else node.func
            )
            path = _path(func, me)
            if path is None:
                continue
            starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
            out.setdefault(path, []).append(2 if starred else len(node.args) + len(node.keywords))
    return {k: tuple(v) for k, v in out.items()}


def call_inputs(module: nn.Module, child: str) -> tuple[int, ...] | None:
    """How many arguments each ``self.<child>(...)`` call in ``module``'s class source passes (any method of the class
    and its bases, not only ``forward``: a ``torch_forward`` helper too); ``None`` when no source can be read, ``()``
    when no call names it."""
    classes = [
        c for c in type(module).__mro__ if c not in (nn.Module, object) and not c.__module__.startswith("torch.nn")
    ]
    found = [f for c in classes if (f := _class_calls(c)) is not None]
    if not found:
        return None
    return tuple(n for f in found for n in f.get(child, ()))
