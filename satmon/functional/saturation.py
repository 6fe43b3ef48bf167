"""Saturation counts of DyT inputs, ``|alpha * x| > level``, on the activations' device, per element.

The regime study (Verma, 2026) calls an element saturated when ``|alpha * x| > 2.0`` (strict),
with ``x`` the DyT input, and pools the fraction over tokens x channels x layers.

Which product. ``product="module"`` (the default) counts the product the layer's own forward
computes and its ``tanh`` receives: ``alpha * x`` in ``torch.result_type(alpha, x)`` (bf16 in a
bf16 model, float16 in an fp16 one, float32 under bf16-mixed autocast where ``alpha`` stays
float32), rounded to that dtype, then compared with ``level`` as a real number. This is what the
study measured (its hook takes ``mod.alpha * inp[0]``): in a bf16 model a product in
``(2, 2 + half a bf16 step]`` rounds to 2.0, which the module's ``tanh`` sees and the rule does not
count. ``product="exact"`` counts the real product instead (what a float64 re-computation gives,
satmon's rule before 0.2). In float32 models the two differ only for products within half a
float32 step of ``level`` (rounded onto ``level`` itself when it is a float32 value). ``alpha`` enters the product as
``alpha.to(dtype)``, as torch applies it; a forward under ``torch.compile`` may keep a fused bf16
product unrounded, and the count still follows eager arithmetic.

Exactness, one comparison per element. Rounding is monotone, so under either rule there is a
threshold ``t`` with ``|x| > t`` exactly when the element is saturated. :func:`saturation_threshold`
computes it on ``alpha``'s device, without a host sync: for ``"exact"``, the largest float32
``t`` with ``|alpha| * t <= level`` (float32, bf16 and fp16 data embed exactly in float32, and the
product of two float32 numbers is exact in float64); for ``"module"``, the largest ``t`` of the
input's dtype whose rounded product is ``<= level``, found among a few neighbours of
``level / |alpha|`` (float64 and integer arithmetic only, so compiled and eager thresholds agree
bit for bit). For a scalar ``alpha`` on the CPU,
:func:`saturation_threshold_host` computes the same value, bit for bit, in plain Python.

Broadcasting. A per-channel ``alpha`` is applied as ``alpha * x`` broadcasts: the threshold has
``alpha``'s shape and is compared with ``|x|`` by broadcasting, so ``(C,)`` acts on the last
dimension and ``(C, 1, 1)`` on dimension -3 (channels-first ``(B, C, H, W)``). An ``alpha`` for
which ``alpha * x`` would not keep ``x``'s shape raises :class:`AlphaBroadcastError`.

No host sync: every tensor function here returns device tensors and never calls ``.item()``.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "AlphaBroadcastError",
    "POINTWISE_FUNCTIONS",
    "Product",
    "alpha_broadcast_problem",
    "check_product",
    "fused_counts",
    "fused_counts_many",
    "module_product_dtype",
    "pointwise_cutoff",
    "pointwise_function",
    "pointwise_gain",
    "saturation_threshold",
    "saturation_threshold_host",
    "threshold_host_fn",
    "saturation_sums",
    "saturation_counts",
    "saturation_fraction",
    "shifted_saturation_counts",
]

#: ``"module"``: the product as the layer's forward rounds it; ``"exact"``: the real product
Product = Literal["module", "exact"]
_PRODUCTS = ("module", "exact")
#: input dtypes that a threshold on ``|x|`` serves (float64 inputs compare the product itself)
_THRESHOLD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PRODUCT_DTYPES = (torch.float64, *_THRESHOLD_DTYPES)
#: bit patterns of +inf, and the integer dtype that views each float dtype
_INF_BITS = {torch.float32: 0x7F800000, torch.bfloat16: 0x7F80, torch.float16: 0x7C00}
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
#: (significand bits, minimum normal exponent, maximum exponent) of the formats rounded by hand
_FORMATS = {torch.bfloat16: (8, -126, 127), torch.float16: (11, -14, 15), torch.float32: (24, -126, 127)}
#: the module threshold is searched among this many grid steps either side of level / |alpha|
#: (it lies within two: the rounding boundary above level is within one product-dtype rounding of it)
_WINDOW = 4


class AlphaBroadcastError(ValueError):
    """A DyT ``alpha`` whose product with the layer's input would not keep the input's shape."""


def module_product_dtype(alpha: Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``alpha * x`` for an input ``x`` (with at least one dimension) of ``dtype``.

    ``torch.result_type(alpha, x)``: a 0-dim ``alpha`` takes the input's dtype, any other is promoted.

    Example:
        >>> module_product_dtype(torch.ones(1), torch.bfloat16)  # bf16-mixed autocast: alpha stays float32
        torch.float32
        >>> module_product_dtype(torch.ones(1, dtype=torch.bfloat16), torch.bfloat16)  # a bf16 model
        torch.bfloat16
    """
    if alpha.dim() == 0 and alpha.is_floating_point():
        return dtype
    return torch.promote_types(alpha.dtype, dtype)


def check_product(product: object) -> str:
    """The ``product`` option, checked once for the counter, the screen and the probe.

    Example:
        >>> check_product("exact")
        'exact'
    """
    if product not in _PRODUCTS:
        raise ValueError(
            f"Expected `product` in {_PRODUCTS} (the product as the layer's forward computes it, or the "
            f"exact one), got {product!r}."
        )
    return product  # type: ignore[return-value]


def _check(level: float, dtype: torch.dtype, product: str, product_dtype: torch.dtype | None = None) -> None:
    if torch.compiler.is_compiling():  # traced once per graph: no cache (Dynamo would trace through it anyway)
        _check_args(level, dtype, product, product_dtype)
    else:
        _check_cached(level, dtype, product, product_dtype)


def _check_args(level: float, dtype: torch.dtype, product: str, product_dtype: torch.dtype | None = None) -> None:
    check_product(product)
    if not (math.isfinite(level) and level >= 0):
        raise ValueError(f"Expected a finite saturation level >= 0, got {level!r}.")
    if dtype not in _THRESHOLD_DTYPES:
        raise ValueError(
            f"Expected the input dtype to be one of {_THRESHOLD_DTYPES}, got {dtype}. "
            "For float64 inputs use saturation_counts, which compares the float64 product itself."
        )
    if product_dtype is None:
        return
    if product_dtype not in _PRODUCT_DTYPES or torch.promote_types(dtype, product_dtype) != product_dtype:
        raise ValueError(
            f"Expected a product dtype in {_PRODUCT_DTYPES} at least as wide as the input dtype {dtype}, "
            f"got {product_dtype}. Pass torch.result_type(alpha, x) (module_product_dtype(alpha, x.dtype))."
        )
    info = torch.finfo(product_dtype)
    if not info.tiny <= level <= info.max:  # where the rounding boundary above level is within one rounding of it
        raise ValueError(
            f"Expected a level between the smallest normal ({info.tiny}) and the largest ({info.max}) {product_dtype} "
            f"value for product='module', got {level!r}. Use product='exact' for such a level."
        )


#: the hot path checks the same few combinations every step (errors are not cached)
_check_cached = functools.lru_cache(maxsize=512)(_check_args)


def saturation_threshold(
    alpha: Tensor,
    level: float,
    *,
    dtype: torch.dtype = torch.float32,
    product: Product = "module",
    product_dtype: torch.dtype | None = None,
) -> Tensor:
    """The threshold ``t`` on ``|x|``: ``|x| > t`` iff ``x`` is saturated (``|alpha * x| > level``).

    Runs on ``alpha``'s device, without a host sync.

    Args:
        alpha: the DyT scale, a scalar (any shape with one element) or per-channel tensor.
        level: the saturation level (study: 2.0): finite, ``>= 0``; for ``"module"``, a normal
            number of the product dtype (so that the search below is exact).
        dtype: the dtype of the inputs ``x`` the threshold serves (float32, bf16 or fp16).
        product: ``"module"`` counts the product rounded as the layer's forward computes it,
            ``"exact"`` the real product (see the module docstring).
        product_dtype: the forward's product dtype, for ``"module"``; default
            ``module_product_dtype(alpha, dtype)`` (pass it when ``alpha`` was reshaped or stacked).

    Returns:
        A float32 tensor of ``alpha``'s shape (``(1,)`` for a scalar ``alpha``), compared with
        ``|x|`` in float32 (where bf16/fp16 data are exact); ``inf`` where ``alpha == 0`` (and,
        for ``"module"``, where ``alpha`` is NaN: ``|nan * x| > level`` never holds).

    Example:
        >>> a = torch.tensor([2.0])
        >>> saturation_threshold(a, 2.0, product="exact").item()  # the largest float32 t with 2t <= 2
        1.0
        >>> a = torch.tensor([1.5], dtype=torch.bfloat16)  # a bf16 model: 1.5 * 1.3359375 rounds to 2.0
        >>> bf16 = saturation_threshold(a, 2.0, dtype=torch.bfloat16)
        >>> bf16.item(), saturation_threshold(a, 2.0, product="exact").item()
        (1.3359375, 1.3333332538604736)
    """
    if product == "exact":
        _check(level, dtype, product)
        return _exact_threshold(alpha, level)
    pdt = product_dtype or module_product_dtype(alpha, dtype)
    _check(level, dtype, product, pdt)
    return _module_threshold(alpha, level, dtype, pdt)


def _exact_threshold(alpha: Tensor, level: float) -> Tensor:
    """Largest float32 ``t`` with ``|alpha| * t <= level`` (the real product, alpha at most float32)."""
    a = alpha.detach().to(torch.float64).abs()
    a = a.reshape(-1) if a.numel() == 1 else a
    t = (level / a).to(torch.float32)  # round to nearest: within one ulp of the answer (inf when alpha == 0)
    too_big = t.to(torch.float64) * a > level
    t = torch.where(too_big, torch.nextafter(t, torch.zeros_like(t)), t)
    up = torch.nextafter(t, torch.full_like(t, float("inf")))
    fits = up.to(torch.float64) * a <= level
    return torch.where(fits & torch.isfinite(up), up, t)


def _module_threshold(alpha: Tensor, level: float, dtype: torch.dtype, pdt: torch.dtype) -> Tensor:
    """Largest non-negative ``t`` of ``dtype`` with ``|fl_pdt(alpha_pdt * t)| <= level``, as float32.

    Only float64 and integer arithmetic, so a compiler cannot skip a bf16/fp16 rounding (Inductor keeps
    a fused bf16 product in float32): the product of two float32-or-narrower values is exact in
    float64, and whether it rounds above ``level`` is one comparison with :func:`_boundary`.
    """
    a = alpha.detach()
    a = a.reshape(-1) if a.numel() == 1 else a
    if torch.promote_types(a.dtype, pdt) != pdt:  # a 0-dim alpha wider than the input: the product rounds it
        a = _round_tensor((a.to(torch.float32) if a.dtype == torch.float64 else a).to(torch.float64).abs(), pdt)
    else:
        a = a.to(torch.float64).abs()  # exact
    start = (level / a).to(dtype)  # within a grid step or two of the answer
    ints = _INT_VIEW[dtype]
    steps = torch.arange(-_WINDOW, _WINDOW + 1, dtype=ints, device=a.device).reshape((-1,) + (1,) * a.dim())
    # consecutive bit patterns of non-negative floats are consecutive values: (2W+1, *alpha) ascending
    cand = (start.view(ints).unsqueeze(0) + steps).clamp_(0, _INF_BITS[dtype]).view(dtype).to(torch.float64)
    mid, ties_up = _boundary(level, pdt)
    prod = a * cand  # exact below float64 (the float64 product itself when pdt is float64)
    over = prod >= mid if ties_up else prod > mid  # the product as the forward rounds it exceeds level
    t = cand.masked_fill(over, 0.0).amax(0)  # monotone in |x|: the largest candidate that does not exceed
    return torch.where(torch.isnan(a), float("inf"), t).to(torch.float32)  # alpha 0 gives inf too (0 * inf is nan)


@torch.compiler.assume_constant_result  # host arithmetic on constants: evaluated once when traced
def _boundary(level: float, pdt: torch.dtype) -> tuple[float, bool]:
    """``(mid, ties_up)``: a real product rounds to a ``pdt`` value above ``level`` iff it is ``> mid``,
    or ``== mid`` when ``ties_up`` (round half to even: ``mid`` lies between the ``pdt`` values around
    ``level``, and the tie goes up when the lower one is odd)."""
    return _boundary_cached(level, pdt)


@functools.lru_cache(maxsize=512)
def _boundary_cached(level: float, pdt: torch.dtype) -> tuple[float, bool]:
    if pdt == torch.float64:
        return level, False  # the float64 product is compared as computed
    r = _round_to(level, pdt)
    lo = r if r <= level else _step(r, -1, pdt)
    down, up = _step(lo, -1, pdt), _step(lo, +1, pdt)
    if math.isinf(up):  # level in the top step: the next binade would start one step above
        up = lo + (lo - down)
    return (lo + up) / 2, bool(_bits(lo, pdt) & 1)


def _round_tensor(v: Tensor, dtype: torch.dtype) -> Tensor:
    """Non-negative float64 ``v`` rounded to ``dtype`` (to nearest, ties to even; ``inf`` past its range),
    as float64: a power-of-two scaling, ``round`` and the scaling back, all exact."""
    if dtype == torch.float64:
        return v
    bits, emin, emax = _FORMATS[dtype]
    e = ((v.view(torch.int64) >> 52) & 0x7FF) - 1023  # binary exponent of v (normal in float64)
    q = e.clamp(min=emin) - (bits - 1)  # exponent of one unit in the last place of dtype at v
    unit = ((q + 1023) << 52).view(torch.float64)  # 2**q, built from its bits
    r = torch.round(v * ((1023 - q) << 52).view(torch.float64)) * unit  # torch.round: half to even
    return torch.where(r > math.ldexp(2 - 2.0 ** (1 - bits), emax), float("inf"), r)


def saturation_threshold_host(
    alpha: float,
    level: float,
    *,
    dtype: torch.dtype = torch.float32,
    product: Product = "module",
    product_dtype: torch.dtype | None = None,
) -> float:
    """:func:`saturation_threshold` for a scalar ``alpha`` already on the host, in plain Python.

    The same value, bit for bit, as the tensor version (the tests check both against each other and
    against independent re-counts): for CPU training, where reading ``alpha`` is free (no device to
    wait for), a few microseconds instead of a dozen tensor ops per optimizer step.

    Args:
        alpha: the DyT scale's value (e.g. ``param.item()``; its dtype's values are exact floats).
        level: the saturation level.
        dtype: the inputs' dtype (float32, bf16 or fp16).
        product: ``"module"`` or ``"exact"``, as in :func:`saturation_threshold`.
        product_dtype: the forward's product dtype (``module_product_dtype(alpha_tensor, dtype)``);
            default float32 (a float32 ``alpha`` with a dimension, for any of the accepted input dtypes).

    Returns:
        The threshold as a float (``inf`` when ``alpha == 0``, as in :func:`saturation_threshold`).

    Example:
        >>> saturation_threshold_host(2.0, 2.0)
        1.0
        >>> a = torch.tensor([0.8])  # float32
        >>> saturation_threshold_host(a.item(), 2.0) == saturation_threshold(a, 2.0).item()
        True
    """
    if product == "exact":
        _check(level, dtype, product)
        return _exact_threshold_host(alpha, level)
    pdt = product_dtype or torch.float32  # a float32 alpha with a dimension: float32 for every accepted dtype
    _check(level, dtype, product, pdt)
    return _module_threshold_host(alpha, level, dtype, pdt)


def threshold_host_fn(
    level: float,
    *,
    dtype: torch.dtype = torch.float32,
    product: Product = "module",
    product_dtype: torch.dtype | None = None,
) -> Callable[[float], float]:
    """:func:`saturation_threshold_host` with everything but ``alpha`` fixed: the arguments are checked
    once and a function of ``alpha`` alone is returned (the CPU hot path calls it once per layer and step).

    Example:
        >>> t = threshold_host_fn(2.0)
        >>> t(2.0), t(0.8) == saturation_threshold_host(0.8, 2.0)
        (1.0, True)
    """
    if product == "exact":
        _check(level, dtype, product)
        return functools.partial(_exact_threshold_host, level=level)
    pdt = product_dtype or torch.float32
    _check(level, dtype, product, pdt)
    if dtype != torch.float32:
        return functools.partial(_module_threshold_host, level=level, dtype=dtype, pdt=pdt)
    mid, ties_up = _boundary_cached(level, pdt)
    narrow = pdt != torch.float64  # a float32 alpha rounds to itself; a wider one to float32 first

    def threshold(alpha: float) -> float:
        a = abs(float(alpha))
        if narrow:
            a = _f32(a)
        if a == 0.0 or a != a:
            return math.inf
        return _float32_search(a, level, mid, ties_up)

    return threshold


def _exact_threshold_host(alpha: float, level: float) -> float:
    a = abs(float(alpha))
    if a == 0.0:
        return math.inf
    t = _f32(level / a)  # round to nearest, inf past the float32 range: as ``.to(torch.float32)``
    if t * a > level:  # a product of two float32 values is exact in float64
        t = _f32_step(t, -1)
    up = _f32_step(t, +1)
    if math.isfinite(up) and up * a <= level:
        t = up
    return t


def _module_threshold_host(alpha: float, level: float, dtype: torch.dtype, pdt: torch.dtype) -> float:
    a = _round_to(abs(float(alpha)), pdt)
    if a == 0.0 or math.isnan(a):
        return math.inf  # nothing exceeds level (0 * inf and nan products are nan)
    mid, ties_up = _boundary_cached(level, pdt)
    if dtype == torch.float32:
        return _float32_search(a, level, mid, ties_up)

    def over(v: float) -> bool:  # a * v: exact for float32-or-narrower operands, the float64 product otherwise
        return a * v >= mid if ties_up else a * v > mid

    t = _round_to(level / a, dtype)
    while t > 0.0 and over(t):  # (over(inf) holds: a > 0)
        t = _step(t, -1, dtype)
    while True:
        up = _step(t, +1, dtype)
        if up == t or over(up):
            return t
        t = up


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F16 = struct.Struct("<e")
_U16 = struct.Struct("<H")
_F32_INF_BITS = 0x7F800000


def _float32_search(a: float, level: float, mid: float, ties_up: bool) -> float:
    """:func:`_module_threshold_host`'s search for float32 inputs, on the bit patterns directly (the CPU hot
    path: one threshold per layer and optimizer step). The same steps as the general loop: down from
    ``fl32(level / a)`` while the product rounds above ``level``, then up while the next value's does not."""
    pack_f, unpack_f, pack_u, unpack_u = _F32.pack, _F32.unpack, _U32.pack, _U32.unpack
    t = _f32(level / a)  # to nearest, inf past the float32 range: as the general loop starts
    bits = unpack_u(pack_f(t))[0]
    if ties_up:
        while bits > 0 and a * t >= mid:
            bits -= 1
            t = unpack_f(pack_u(bits))[0]
        while bits < _F32_INF_BITS:
            up = unpack_f(pack_u(bits + 1))[0]
            if a * up >= mid:
                break
            bits, t = bits + 1, up
        return t
    while bits > 0 and a * t > mid:
        bits -= 1
        t = unpack_f(pack_u(bits))[0]
    while bits < _F32_INF_BITS:
        up = unpack_f(pack_u(bits + 1))[0]
        if a * up > mid:
            break
        bits, t = bits + 1, up
    return t


def _f32(v: float) -> float:
    """``v`` rounded to the nearest float32 (``inf`` when it overflows)."""
    try:
        return _F32.unpack(_F32.pack(v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _round_to(v: float, dtype: torch.dtype) -> float:
    """``v`` converted to ``dtype`` as torch converts a float64 value: to float32 first, then to bf16/fp16."""
    if dtype == torch.float64:
        return v
    v = _f32(v)
    if dtype == torch.float32 or v == 0.0 or not math.isfinite(v):
        return v
    bits, emin, emax = _FORMATS[dtype]
    m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= |m| < 1
    q = max(e - 1, emin) - (bits - 1)  # the exponent of one unit in the last place
    r = math.ldexp(round(math.ldexp(m, e - q)), q)  # round() on a float: to nearest, ties to even
    return r if abs(r) <= math.ldexp(2 - 2.0 ** (1 - bits), emax) else math.copysign(math.inf, v)


def _bits(t: float, dtype: torch.dtype) -> int:
    """The bit pattern of a non-negative ``dtype`` value ``t`` (float32, bf16 or fp16)."""
    if dtype == torch.float16:
        return _U16.unpack(_F16.pack(t))[0]
    bits = _U32.unpack(_F32.pack(t))[0]
    return bits >> 16 if dtype == torch.bfloat16 else bits  # bf16: the top half of a float32


def _step(t: float, direction: int, dtype: torch.dtype) -> float:
    """The ``dtype`` neighbour of a non-negative ``dtype`` value ``t``, clamped to ``[0, inf]``."""
    if dtype == torch.float32:
        return _f32_step(t, direction)
    bits = min(max(_bits(t, dtype) + direction, 0), _INF_BITS[dtype])
    if dtype == torch.float16:
        return _F16.unpack(_U16.pack(bits))[0]
    return _f32_from_bits(bits << 16)


def _f32_step(t: float, direction: int) -> float:
    """The float32 neighbour of a non-negative float32 ``t``: ``+1`` up (``inf`` past the
    top), ``-1`` down (not below 0)."""
    if math.isinf(t):
        return t if direction > 0 else _f32_from_bits(0x7F7FFFFF)
    bits = _U32.unpack(_F32.pack(t))[0]
    if direction < 0 and bits == 0:
        return 0.0
    return _f32_from_bits(bits + direction)


def _f32_from_bits(bits: int) -> float:
    return _F32.unpack(_U32.pack(bits))[0]


def alpha_broadcast_problem(alpha_shape: torch.Size, x_shape: torch.Size) -> str | None:
    """Why ``alpha * x`` would not keep ``x``'s elements for these shapes, or ``None`` when it does (the
    rule every count applies: ``alpha`` broadcasts as the module's own product broadcasts it).

    Example:
        >>> alpha_broadcast_problem(torch.Size([8, 1, 1]), torch.Size([2, 8, 4, 4])) is None
        True
        >>> alpha_broadcast_problem(torch.Size([8]), torch.Size([2, 8, 4, 4]))
        'alpha of shape (8,) does not broadcast against its input of shape (2, 8, 4, 4)'
    """
    try:
        if torch.broadcast_shapes(alpha_shape, x_shape).numel() == x_shape.numel():
            return None
    except RuntimeError:
        pass
    return f"alpha of shape {tuple(alpha_shape)} does not broadcast against its input of shape {tuple(x_shape)}"


def _fit_threshold(threshold: Tensor, shape: torch.Size) -> Tensor:
    """``threshold`` (``alpha``'s shape) for an in-place comparison with ``|x|`` of ``shape``,
    as ``alpha * x`` broadcasts."""
    if threshold.numel() == 1 or threshold.shape == shape[len(shape) - threshold.dim() :]:
        # a scalar, or alpha's shape trailing x's (a per-channel alpha, every forward): broadcasts as it is
        return threshold
    if alpha_broadcast_problem(threshold.shape, shape) is not None:
        raise AlphaBroadcastError(
            f"Expected a DyT alpha that broadcasts against its input as `alpha * x` does, keeping the input's shape; "
            f"got alpha of shape {tuple(threshold.shape)} for an input of shape "
            f"{tuple(shape)}. A forward that reshapes "
            "alpha (e.g. alpha.view(-1, 1, 1) for channels-first input) is invisible to satmon: "
            "store alpha in the shape "
            "the forward uses (e.g. (C, 1, 1)), or leave the layer out of the screen (exclude=...)."
        )
    if threshold.dim() <= len(shape):  # broadcasts to x's shape already
        return threshold
    return threshold.reshape(threshold.shape[threshold.dim() - len(shape) :])  # drop alpha's extra leading 1-dims


def saturation_counts(x: Tensor, alpha: Tensor, level: float, *, product: Product = "module") -> tuple[Tensor, Tensor]:
    """Count the saturated elements of one DyT input, and flag non-finite ones.

    Cost: :func:`saturation_sums` (one ``abs``, one sum, one in-place comparison and one more sum
    over ``x``) plus the threshold and three tiny ops on the two sums. The hooks skip those per call:
    they cache the threshold per ``alpha`` and convert all calls' sums at once.

    Args:
        x: the DyT input, any shape (``(B, T, C)`` or channels-first ``(B, C, H, W)``).
        alpha: the layer's ``alpha`` (read at call time, so FSDP-gathered parameters are whole),
            applied as ``alpha * x`` broadcasts.
        level: saturation level; an element is saturated when ``|alpha * x| > level`` (strict).
        product: ``"module"`` (the product rounded to ``torch.result_type(alpha, x)``, as the forward
            computes it) or ``"exact"`` (the real product). Float64 inputs compare the float64
            product under both.

    Returns:
        ``(saturated, nonfinite)``: int64 0-dim device tensors. ``saturated`` counts ``inf`` inputs
        (``|alpha * inf| > level``) and never ``nan``; ``nonfinite`` is 1 when ``x`` holds any
        ``inf``/``nan``, else 0 (so summed over calls it counts the inputs that had one).

    Raises:
        AlphaBroadcastError: when ``alpha * x`` would not keep ``x``'s shape.

    Example:
        >>> x = torch.tensor([[0.5, -1.5, 1.0, float("nan")]])
        >>> sat, bad = saturation_counts(x, torch.tensor([2.0]), level=2.0)
        >>> int(sat), int(bad)
        (1, 1)
    """
    with torch.no_grad():
        x = x.detach()
        if x.dtype == torch.float64:  # float64 activations: compare the (float64) product itself
            _check(level, torch.float32, product)
            ax = x.abs()
            a = alpha.detach().to(torch.float64).abs()
            a = _fit_threshold(a.reshape(-1) if a.numel() == 1 else a, x.shape)
            return (ax * a > level).sum(), (~torch.isfinite(ax.sum())).to(torch.int64)
        t = _fit_threshold(saturation_threshold(alpha, level, dtype=x.dtype, product=product), x.shape)
        abs_sum, saturated = saturation_sums(x, t)
        return saturated.to(torch.int64), (~torch.isfinite(abs_sum)).to(torch.int64)


def saturation_sums(x: Tensor, threshold: Tensor | float, scratch: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The hot path of :func:`saturation_counts`: four tensor ops, nothing else.

    ``abs(x)``, its sum, an in-place ``> threshold`` and the sum of the resulting 0/1 values. The
    results stay floating-point device tensors; :func:`saturation_counts` (or a caller that batches
    many calls, like :class:`satmon.SaturationHooks`) turns them into integer counts and a flag.

    Args:
        x: a float32/bf16/fp16 DyT input, any shape (float64 needs the product; use
            :func:`saturation_counts`).
        threshold: ``saturation_threshold(alpha, level, dtype=x.dtype)``, or the Python float of
            :func:`saturation_threshold_host` (exact too: a float32 value compared with float32 data).
            A per-channel threshold broadcasts against ``x`` as ``alpha * x`` does.
        scratch: optional float32 work buffer of ``x``'s shape and device (content overwritten).

    Returns:
        ``(abs_sum, saturated)``: 0-dim float tensors. ``abs_sum`` is non-finite exactly when ``x``
        holds an ``inf``/``nan`` (or, for finite data, when the sum of ``|x|`` overflows float32,
        i.e. values near 1e38, which are not meaningful activations either). ``saturated`` is the
        exact count ``#{|x| > threshold}`` (float32 below ``2**24`` elements, float64 above).

    Raises:
        AlphaBroadcastError: when the threshold (``alpha``'s shape) does not broadcast against ``x``
            the way ``alpha * x`` would while keeping ``x``'s shape.

    Example:
        >>> s, n = saturation_sums(torch.tensor([0.5, -1.5, 1.0]), saturation_threshold(torch.tensor([2.0]), 2.0))
        >>> float(s), float(n)
        (3.0, 1.0)
    """
    x = x.detach()
    # (another device: torch raises)
    if scratch is not None and scratch.shape == x.shape and scratch.dtype == torch.float32:
        ax = torch.abs(x, out=scratch) if x.dtype == torch.float32 else scratch.copy_(x).abs_()
    else:
        ax = x.abs() if x.dtype == torch.float32 else x.to(torch.float32).abs_()  # a fresh float32 buffer
    abs_sum = ax.sum()  # non-finite exactly when some element is
    try:
        ax.gt_(threshold)  # 1.0 where |x| > t, in place
    except RuntimeError:  # the shape check fails before any element is written: no cost on the usual path
        if not isinstance(threshold, Tensor):
            raise
        ax.gt_(_fit_threshold(threshold, x.shape))  # extra leading 1-dims, or AlphaBroadcastError
    # a float32 sum of 0/1 is exact below 2**24 elements; beyond, accumulate in float64
    return abs_sum, (ax.sum() if ax.numel() < 2**24 else ax.sum(dtype=torch.float64))


def fused_counts(x: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor]:
    """``#{|x| > threshold}`` and whether ``x`` holds a non-finite value, written as one reduction pass.

    The tensor-op form of :func:`saturation_sums` that a compiler fuses into a single kernel (both
    reductions read ``x`` once): satmon runs it under ``torch.compile`` (traced into a compiled model),
    and compiles :func:`fused_counts_many`, its several-input form, for eager forwards. Run eagerly it
    is slower than the four ATen ops of :func:`saturation_sums` (docs/reference/performance.md).

    Args:
        x: a float32/bf16/fp16 DyT input, any shape.
        threshold: ``saturation_threshold(alpha, level, dtype=x.dtype)`` (float32, ``alpha``'s shape,
            broadcast against ``x`` as ``alpha * x``), compared with ``|x|`` in float32 (exact for
            bf16/fp16 data).

    Returns:
        ``(saturated, nonfinite)``: int64 0-dim tensors, as :func:`saturation_counts` returns them.

    Example:
        >>> sat, bad = fused_counts(torch.tensor([0.5, -1.5, float("inf")]), torch.tensor([1.0]))
        >>> int(sat), int(bad)
        (2, 1)
    """
    saturated, nonfinite = _one_pass(x, threshold)
    return saturated.to(torch.int64), nonfinite.to(torch.int64)


def _one_pass(x: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor]:
    """The two reductions of :func:`fused_counts` as they leave one kernel: the count in int32 below ``2**31``
    elements (exact; Inductor's CPU kernels vectorise an int32 sum of a mask, where an int64 one widens every
    lane) and in int64 above, the flag as a bool."""
    x = x.detach()
    above = x.abs().to(torch.float32) > threshold
    return above.sum(dtype=torch.int32 if x.numel() < 2**31 else torch.int64), (~torch.isfinite(x)).any()


def fused_counts_many(xs: Sequence[Tensor], thresholds: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """:func:`fused_counts` of several inputs at once: what one compiled call counts.

    Written for a compiler: each input becomes one kernel that reads it once and writes its two
    results (nothing after it: the results are widened and stacked when the counts are folded, once
    per many steps), and the whole list one call, so a compiled function's fixed cost per call is paid
    once for all the layers of a forward instead of once per layer.

    Args:
        xs: float32/bf16/fp16 DyT inputs, any shapes.
        thresholds: one per input, as :func:`fused_counts` takes it.

    Returns:
        ``2 n`` 0-dim tensors: the ``n`` saturated counts (int32, int64 from ``2**31`` elements), then
        the ``n`` non-finite flags (bool).

    Example:
        >>> xs = [torch.tensor([0.5, -1.5, 3.0]), torch.tensor([[float("nan"), 2.5]])]
        >>> [int(v) for v in fused_counts_many(xs, [torch.tensor([1.0]), torch.tensor([2.0, 1.0])])]
        [2, 1, 0, 1]
    """
    results = [_one_pass(x, t) for x, t in zip(xs, thresholds)]
    return tuple(r[0] for r in results) + tuple(r[1] for r in results)


def shifted_saturation_counts(
    x: Tensor, alpha: Tensor, shift: Tensor, cutoff: float, *, product: Product = "module"
) -> tuple[Tensor, Tensor]:
    """Saturated and non-finite counts of a point-wise layer whose pre-activation carries a shift:
    ``|u| > cutoff`` with ``u = alpha * x + shift`` (Derf's ``erf(alpha * x + s)``).

    With a shift no single threshold on ``|x|`` exists, so ``u`` itself is computed: as the layer's
    forward computes it for ``product="module"`` (``alpha * x + shift`` with torch's own rounding and
    broadcasting, the same bits as the module's eager forward), in float64 for ``"exact"``; then
    compared with ``cutoff`` in float64 (exact for any ``u`` of float64 or narrower).

    Args:
        x: the layer's input.
        alpha: the layer's scale, as its forward applies it.
        shift: the layer's shift ``s``, as its forward adds it.
        cutoff: the cut-off on ``|u|`` (:func:`pointwise_cutoff`).
        product: ``"module"`` or ``"exact"``.

    Returns:
        ``(saturated, nonfinite)``: int64 0-dim tensors (``nonfinite`` is 1 when ``x`` holds an ``inf``/``nan``).

    Example:
        >>> x = torch.tensor([0.1, 0.9, -1.2])
        >>> sat, bad = shifted_saturation_counts(x, torch.tensor([2.0]), torch.tensor([0.5]), 1.6)
        >>> int(sat), int(bad)  # u = 0.7, 2.3, -1.9
        (2, 0)
    """
    check_product(product)
    with torch.no_grad():
        x, a, s = x.detach(), alpha.detach(), shift.detach()
        if product == "exact" or x.dtype == torch.float64:
            u = a.to(torch.float64) * x.to(torch.float64) + s.to(torch.float64)
        else:
            u = (a * x + s).to(torch.float64)
        if u.shape != x.shape:
            raise AlphaBroadcastError(
                f"Expected alpha * x + shift to keep the input's shape {tuple(x.shape)}, got "
                f"{tuple(u.shape)} (alpha {tuple(a.shape)}, shift {tuple(s.shape)})."
            )
        return (u.abs() > cutoff).sum(), (~torch.isfinite(x)).any().to(torch.int64)


#: the point-wise functions satmon counts (``NormLayer.function``): DyT's tanh, Derf's erf, the study's HardTanh control
POINTWISE_FUNCTIONS = ("tanh", "erf", "hardtanh")


def pointwise_function(function: str, u: Tensor) -> Tensor:
    """The bounded function ``f(u)`` a point-wise layer applies to its pre-activation ``u = alpha * x (+ shift)``.

    ``tanh`` (DyT), ``erf`` (Derf), ``hardtanh`` (``u`` clamped to ``[-1, 1]``: the study's control).

    Example:
        >>> pointwise_function("hardtanh", torch.tensor([-2.0, 0.5, 3.0])).tolist()
        [-1.0, 0.5, 1.0]
    """
    if function == "tanh":
        return torch.tanh(u)
    if function == "erf":
        return torch.erf(u)
    if function == "hardtanh":
        return u.clamp(-1.0, 1.0)
    raise ValueError(f"Expected a point-wise function in {POINTWISE_FUNCTIONS}, got {function!r}.")


def pointwise_gain(function: str, u: Tensor) -> Tensor:
    """The local gain ``|f'(u)| / f'(0)`` of a point-wise function (1 at ``u = 0``), in ``u``'s dtype.

    ``tanh``: ``1 - tanh(u)^2``; ``erf``: ``exp(-u^2)``; ``hardtanh``: 1 on ``|u| < 1``, 0 outside
    (its derivative at ``|u| = 1`` is undefined; 0 here).

    Example:
        >>> pointwise_gain("erf", torch.tensor([0.0, 1.0], dtype=torch.float64)).tolist()
        [1.0, 0.36787944117144233]
    """
    if function == "tanh":
        return 1 - torch.tanh(u) ** 2
    if function == "erf":
        return torch.exp(-u * u)
    if function == "hardtanh":
        return (u.abs() < 1).to(u.dtype)
    raise ValueError(f"Expected a point-wise function in {POINTWISE_FUNCTIONS}, got {function!r}.")


@functools.lru_cache(maxsize=64)
def pointwise_cutoff(function: str, level: float) -> float:
    """The cut-off ``c`` on ``|u|`` at which a point-wise function saturates at the study's ``level``.

    satmon's rule for the DyT family (docs/science/science.md; the rule is satmon's, the level the study's):
    an element is saturated when the local gain of the function at its pre-activation ``u`` is below
    tanh's at ``level``, ``|f'(u)| <= f'(0) * (1 - tanh(level)^2)``; with the study's strict ``>``,
    saturated iff ``|u| > c``:

    - ``tanh``: ``c = level`` (the study's rule, returned as given: the same bits as before);
    - ``erf``: ``exp(-c^2) = 1 - tanh(level)^2``, so ``c = sqrt(-ln(1 - tanh(level)^2)) = sqrt(2 ln cosh(level))``
      (1.62788... at level 2; computed through ``ln cosh`` so that large levels stay accurate);
    - ``hardtanh``: its gain is 1 inside ``|u| < 1`` and 0 outside, so ``c = 1`` (0 at level 0, where every
      gain qualifies).

    Args:
        function: one of :data:`POINTWISE_FUNCTIONS` (``NormLayer.function``).
        level: the study's level (2.0), finite and ``>= 0``.

    Returns:
        ``c`` as a Python float.

    Example:
        >>> pointwise_cutoff("tanh", 2.0), round(pointwise_cutoff("erf", 2.0), 5), pointwise_cutoff("hardtanh", 2.0)
        (2.0, 1.62788, 1.0)
    """
    if not (isinstance(level, (int, float)) and math.isfinite(level) and level >= 0):
        raise ValueError(f"Expected a finite saturation level >= 0, got {level!r}.")
    level = float(level)
    if function == "tanh":
        return level
    if function == "erf":
        log_cosh = level + math.log1p(math.exp(-2 * level)) - math.log(2)  # ln cosh(level), stable for large levels
        return math.sqrt(max(2 * log_cosh, 0.0))
    if function == "hardtanh":
        return 1.0 if level > 0 else 0.0
    raise ValueError(
        f"Expected a point-wise function in {POINTWISE_FUNCTIONS} (NormLayer.function), got {function!r}. "
        "satmon counts tanh (DyT), erf (Derf) and hardtanh; leave other layers out with exclude=."
    )


def saturation_fraction(saturated: Tensor, total: Tensor) -> Tensor:
    """Fraction ``saturated / total`` in float64, 0 where nothing was counted.

    Example:
        >>> saturation_fraction(torch.tensor([3, 0]), torch.tensor([4, 0])).tolist()
        [0.75, 0.0]
    """
    total64 = total.to(torch.float64)
    return torch.where(total64 > 0, saturated.to(torch.float64) / total64.clamp_min(1), torch.zeros_like(total64))
