"""satmon.functional.saturation against independent re-counts: the module's own product in its dtype
(``alpha.to(dt) * x.to(dt)``, ``dt = torch.result_type(alpha, x)``) and the exact float64 product."""

import math

import pytest
import torch

from reference import count, exact_count, module_count
from satmon.functional.saturation import (
    POINTWISE_FUNCTIONS,
    AlphaBroadcastError,
    fused_counts,
    fused_counts_many,
    module_product_dtype,
    pointwise_cutoff,
    pointwise_gain,
    saturation_counts,
    saturation_sums,
    saturation_threshold,
    saturation_threshold_host,
    shifted_saturation_counts,
)

LOW = (torch.bfloat16, torch.float16, torch.float32)
INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
INF_BITS = {torch.float32: 0x7F800000, torch.bfloat16: 0x7F80, torch.float16: 0x7C00}


def bits_to(bits: int, dtype: torch.dtype) -> float:
    return torch.tensor([bits], dtype=INT[dtype]).view(dtype).item()


def bisect_threshold(alpha: torch.Tensor, dtype: torch.dtype, level: float) -> float:
    """Largest non-negative ``dtype`` value whose module product is ``<= level``: bisection over bit patterns."""
    dt = torch.result_type(alpha, torch.ones(2, dtype=dtype))

    def over(bits: int) -> bool:
        c = torch.tensor([bits], dtype=INT[dtype]).view(dtype)
        return bool((alpha.to(dt) * c.to(dt)).abs().to(torch.float64) > level)

    lo, hi = 0, INF_BITS[dtype]  # not over at 0; over at inf (alpha != 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if over(mid) else (mid, hi)
    return bits_to(lo, dtype)


def around(t: torch.Tensor, dtype: torch.dtype, steps: int = 2) -> torch.Tensor:
    """``t`` (``(C,)``, rounded to ``dtype``) and its ``steps`` neighbours either side in ``dtype``, both
    signs: ``(2 * (2 * steps + 1), C)``, column ``c`` around ``t[c]``."""
    b = t.to(dtype).view(INT[dtype]).reshape(1, -1) + torch.arange(-steps, steps + 1, dtype=INT[dtype]).reshape(-1, 1)
    v = b.clamp(0, INF_BITS[dtype] - 1).view(dtype)
    return torch.cat([v, -v])


# ------------------------------------------------------------------ counts vs the two re-counts
@pytest.mark.parametrize("product", ["module", "exact"])
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("alpha_dtype", ["float32", "same"])  # float32: autocast; same: a model cast to dtype
@pytest.mark.parametrize("alpha", [0.37, 2.0, -1.3, 0.8001, 5.5])
@pytest.mark.parametrize("level", [2.0, 0.5, 3.0, 1.7, pointwise_cutoff("erf", 2.0)])  # erf's: not a float32 value
def test_counts_equal_recount(product, dtype, alpha_dtype, alpha, level):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 33, 64, generator=g) * 3).to(dtype)
    a = torch.tensor([alpha], dtype=torch.float32 if alpha_dtype == "float32" else dtype)
    assert saturation_counts(x, a, level, product=product)[0].item() == count(x, a, level, product=product)


@pytest.mark.parametrize("product", ["module", "exact"])
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("alpha_dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_zero_dim_alpha_takes_the_input_dtype(product, dtype, alpha_dtype):
    """A 0-dim alpha does not promote: ``result_type(alpha, x)`` is x's dtype."""
    a = torch.tensor(0.7001, dtype=alpha_dtype)
    assert module_product_dtype(a, dtype) == torch.result_type(a, torch.ones(2, dtype=dtype)) == dtype
    x = torch.cat([around(torch.tensor([2.0 / 0.7001]), dtype, 3).reshape(-1), (torch.randn(3000) * 4).to(dtype)])
    assert saturation_counts(x, a, 2.0, product=product)[0].item() == count(x, a, 2.0, product=product)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("alpha_dtype", ["float32", "same"])
@pytest.mark.parametrize("shape", [(1,), (16,)])  # scalar and per-channel alpha
def test_inputs_at_and_either_side_of_the_boundary(dtype, alpha_dtype, shape):
    """Inputs at the naive boundary ``level / |alpha|`` and at the module threshold, and 1-2 ulps either side."""
    g = torch.Generator().manual_seed(7)
    a = (torch.rand(shape, generator=g) * 3 + 0.05).to(torch.float32 if alpha_dtype == "float32" else dtype)
    naive = 2.0 / a.double().abs()
    t_mod = saturation_threshold(a, 2.0, dtype=dtype).double()
    x = torch.cat([around(naive, dtype), around(t_mod, dtype)])  # (rows, C): column c around channel c's boundaries
    assert x.dtype == dtype and x.shape[1] == shape[0]
    for product in ("module", "exact"):
        assert saturation_counts(x, a, 2.0, product=product)[0].item() == count(x, a, 2.0, product=product)


def test_bf16_products_just_above_two_round_to_two():
    """The study's observation in miniature: in a bf16 model, a product in (2, 2 + half a bf16 step]
    rounds to 2.0, which the layer's tanh receives: the module rule does not count it, the exact one does.
    (Products in the upper half of that step round up to 2 + one step and count under both rules.)"""
    from satmon import DyT

    half = 2.0**-7  # half a bf16 step above 2.0
    rounded_to_two = 0
    for alpha_init in (1.5, 0.75, 1.75, 3.0, 0.3, 1.1, 2.0, 0.55):
        layer = DyT(8, alpha_init=alpha_init).to(torch.bfloat16)
        seen = []
        layer.register_forward_hook(lambda m, args, out, seen=seen: seen.append((m.alpha * args[0]).detach()))
        alpha = layer.alpha.detach()
        grid = around(2.0 / alpha.double(), torch.bfloat16, steps=16).reshape(-1)  # bf16 inputs near 2 / alpha
        exact = (alpha.double() * grid.double()).abs()
        low, high = grid[(exact > 2.0) & (exact <= 2.0 + half)], grid[(exact > 2.0 + half) & (exact < 2.0 + 2 * half)]
        rounded_to_two += low.numel()
        layer(low.reshape(-1, 1).expand(-1, 8))  # (tokens, C)
        assert bool((seen[0].abs() == 2.0).all())  # what the layer's tanh received (nothing when low is empty)
        assert saturation_counts(low, alpha, 2.0)[0].item() == module_count(low, alpha, 2.0) == 0
        assert (
            saturation_counts(low, alpha, 2.0, product="exact")[0].item() == exact_count(low, alpha, 2.0) == low.numel()
        )
        for product in ("module", "exact"):
            got = saturation_counts(high, alpha, 2.0, product=product)[0].item()
            assert got == count(high, alpha, 2.0, product=product) == high.numel()
    assert rounded_to_two >= 8  # the case was exercised


def test_float32_module_and_exact_rules_differ_only_where_the_product_rounds_to_the_level():
    g = torch.Generator().manual_seed(3)
    for alpha in (0.37, 0.7, 1.3, 2.9):
        a = torch.tensor([alpha])
        t = saturation_threshold(a, 2.0, product="exact")
        x = torch.cat([around(t, torch.float32, 3).reshape(-1), torch.randn(20000, generator=g) * 4])
        module = (a * x).abs().double() > 2.0
        exact = (a.double() * x.double()).abs() > 2.0
        differ = module != exact
        assert bool(((a * x).abs()[differ] == 2.0).all())  # only products that round onto the level itself
        assert saturation_counts(x, a, 2.0)[0].item() == int(module.sum())
        assert saturation_counts(x, a, 2.0, product="exact")[0].item() == int(exact.sum())


@pytest.mark.parametrize("product", ["module", "exact"])
def test_randomised_boundary_sweep_float32(product):
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        a = torch.rand(1, generator=g) * 4 + 0.01
        t = saturation_threshold(a, 2.0, product=product)
        x = t + (torch.randint(-3, 4, (1000,), generator=g).float() * torch.finfo(torch.float32).eps * t)
        assert saturation_counts(x, a, 2.0, product=product)[0].item() == count(x, a, 2.0, product=product)


@pytest.mark.parametrize("product", ["module", "exact"])
def test_float64_inputs_compare_the_float64_product(product):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 16, generator=g, dtype=torch.float64) * 3
    for a in (torch.tensor([1.3]), torch.rand(16, generator=g) * 2):
        want = int(((a.double() * x).abs() > 2.0).sum())
        assert saturation_counts(x, a, 2.0, product=product)[0].item() == want == module_count(x, a, 2.0)


# ------------------------------------------------------------------ thresholds
def test_module_threshold_equals_bit_bisection_and_host():
    """Against an independent search over every bit pattern, for both paths, dtypes and alpha dtypes."""
    g = torch.Generator().manual_seed(9)
    values = torch.cat(
        [
            torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0, 0.7, 1e-30, 1e-20, 1e20, 6e-5, 3e4, 65504.0]),
            10 ** (torch.rand(40, generator=g) * 8 - 4),
        ]
    )
    for dtype in LOW:
        for alpha_dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            for v in values.tolist():
                for level in (2.0, 1.7, 0.5):
                    a = torch.tensor([v], dtype=alpha_dtype)
                    pdt = module_product_dtype(a, dtype)
                    if a.to(pdt).item() == 0 or math.isinf(a.to(pdt).item()):
                        continue
                    got = saturation_threshold(a, level, dtype=dtype).item()
                    want = bisect_threshold(a, dtype, level)
                    host = saturation_threshold_host(a.item(), level, dtype=dtype, product_dtype=pdt)
                    assert got == want == host, (dtype, alpha_dtype, v, level)


@pytest.mark.parametrize("product", ["module", "exact"])
def test_host_threshold_equals_tensor_threshold_bit_for_bit(product):
    """The plain-Python threshold (CPU hot path) against the tensor one, edges included."""
    g = torch.Generator().manual_seed(11)
    f32 = torch.finfo(torch.float32)
    edges = torch.tensor([0.0, 1e-45, 1e-40, f32.tiny, 5.9e-39, 1e-30, 0.5, 0.8, 1.0, 2.0, -0.8, 1e30, 3.4e38, f32.max])
    alphas = torch.cat([edges, torch.rand(3000, generator=g) * 10 - 5, 10 ** (torch.rand(3000, generator=g) * 82 - 44)])
    for level in (2.0, 0.5, 3.0, 1.7):
        want = saturation_threshold(alphas, level, product=product).tolist()
        assert [saturation_threshold_host(a, level, product=product) for a in alphas.tolist()] == want
    for dtype in (torch.bfloat16, torch.float16):
        a = alphas[:500].to(dtype)
        want = saturation_threshold(a, 2.0, dtype=dtype, product=product).tolist()
        got = [saturation_threshold_host(v, 2.0, dtype=dtype, product=product, product_dtype=dtype) for v in a.tolist()]
        assert got == want


@pytest.mark.parametrize("alpha", [0.37, 2.0, -1.3, 0.8001])
@pytest.mark.parametrize("product", ["module", "exact"])
def test_host_threshold_counts_equal_recount(alpha, product):
    a = torch.tensor([alpha])
    t = saturation_threshold_host(a.item(), 2.0, product=product)
    noise = torch.randn(5000, generator=torch.Generator().manual_seed(5)) * 3
    x = torch.cat([around(torch.tensor([t]), torch.float32).reshape(-1), noise])
    assert int(saturation_sums(x, t)[1]) == count(x, a, 2.0, product=product)


def test_exact_threshold_is_largest_float32_not_saturating():
    for a in [0.3, 0.7, 1.1, 2.0, 3.3]:
        alpha = torch.tensor([a])
        t = saturation_threshold(alpha, 2.0, product="exact")
        assert float(alpha.double() * t.double()) <= 2.0
        assert float(alpha.double() * torch.nextafter(t, torch.tensor([1e9])).double()) > 2.0
        assert t.dtype == torch.float32 and t.dim() == 1


def test_zero_and_nonfinite_alpha():
    x = torch.tensor([0.0, 1e-3, 5.0, 1e30, float("inf")])
    for product in ("module", "exact"):
        zero = torch.tensor([0.0])
        assert saturation_counts(x, zero, 2.0, product=product)[0].item() == 0 == count(x, zero, 2.0, product=product)
        inf = torch.tensor([float("inf")])
        assert saturation_counts(x, inf, 2.0, product=product)[0].item() == count(x, inf, 2.0, product=product) == 4
        assert saturation_counts(x, torch.tensor([float("nan")]), 2.0, product=product)[0].item() == 0


def test_invalid_arguments_say_what_was_expected():
    a = torch.tensor([1.0])
    with pytest.raises(ValueError, match=r"Expected `product` in \(.module., .exact.\)"):
        saturation_threshold(a, 2.0, product="rounded")
    with pytest.raises(ValueError, match="Expected a finite saturation level"):
        saturation_threshold_host(1.0, -1.0)
    with pytest.raises(ValueError, match="float64 inputs use saturation_counts"):
        saturation_threshold(a, 2.0, dtype=torch.float64)
    with pytest.raises(ValueError, match="smallest normal"):
        saturation_threshold(a.half(), 1e-6, dtype=torch.float16)
    with pytest.raises(ValueError, match="at least as wide as the input dtype"):
        saturation_threshold_host(1.0, 2.0, dtype=torch.float32, product_dtype=torch.bfloat16)
    assert saturation_threshold(a.half(), 1e-6, dtype=torch.float16, product="exact").item() == pytest.approx(1e-6)


# ------------------------------------------------------------------ per-channel alpha, broadcast as alpha * x
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(
    "x_shape, alpha_shape",
    [((4, 9, 16), (16,)), ((2, 16, 5, 7), (16, 1, 1)), ((2, 16, 5, 7), (1, 16, 1, 1)), ((16, 5, 7), (1, 16, 1, 1))],
    ids=["channels-last", "channels-first", "channels-first-4d-alpha", "unbatched-with-4d-alpha"],
)
def test_per_channel_alpha_broadcasts_as_the_product(dtype, x_shape, alpha_shape):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(x_shape, generator=g) * 3).to(dtype)
    alpha = torch.rand(alpha_shape, generator=g) * 2 + 0.1  # float32: promoted, as under autocast
    for a in (alpha, alpha.to(dtype)):
        for product in ("module", "exact"):
            assert saturation_counts(x, a, 2.0, product=product)[0].item() == count(x, a, 2.0, product=product)


def test_square_input_counts_the_dimension_alpha_broadcasts_on():
    """(B, C, H, W) with W == C: alpha (C,) multiplies the last dimension, alpha (C, 1, 1) the channels."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 12, 5, 12, generator=g) * 3
    a = torch.linspace(0.1, 3.0, 12)
    last, first = saturation_counts(x, a, 2.0)[0].item(), saturation_counts(x, a.view(12, 1, 1), 2.0)[0].item()
    assert last == module_count(x, a, 2.0) and first == module_count(x, a.view(12, 1, 1), 2.0)
    assert last != first  # the two readings differ on this input: alpha's shape decides, as in the forward


@pytest.mark.parametrize("x_shape, alpha_shape", [((2, 16, 5, 7), (16,)), ((16,), (16, 1)), ((4, 8), (4, 8, 1))])
def test_alpha_that_does_not_broadcast_to_the_input_is_refused(x_shape, alpha_shape):
    x, a = torch.randn(x_shape), torch.rand(alpha_shape) + 0.5
    with pytest.raises(AlphaBroadcastError, match=r"got alpha of shape .* for an input of shape"):
        saturation_counts(x, a, 2.0)
    with pytest.raises(AlphaBroadcastError, match="store alpha in the shape the forward uses"):
        saturation_sums(x, saturation_threshold(a, 2.0))  # the hot path refuses too (no silent count)


# ------------------------------------------------------------------ non-finite inputs, purity
@pytest.mark.parametrize("product", ["module", "exact"])
def test_nonfinite_counted_separately_never_raises(product):
    x = torch.tensor([1.0, float("inf"), -float("inf"), float("nan"), 0.1])
    sat, bad = saturation_counts(x, torch.tensor([1.0]), 2.0, product=product)
    # a flag per input
    assert sat.item() == count(x, torch.tensor([1.0]), 2.0, product=product) == 2 and bad.item() == 1
    assert saturation_counts(torch.tensor([1.0, 3.0]), torch.tensor([1.0]), 2.0, product=product)[1].item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_input_is_never_modified(dtype):
    x = torch.randn(4, 8).to(dtype)
    before = x.clone()
    saturation_counts(x, torch.tensor([2.0]), 2.0)
    assert torch.equal(x, before)


def test_counts_trace_into_one_graph():
    """The compiled hooks call saturation_counts inside the model's graph: it must trace without a
    break (the host-side boundary is a constant), and count as eager does."""
    dynamo = pytest.importorskip("torch._dynamo")
    try:
        counted = torch.compile(saturation_counts, backend="aot_eager", fullgraph=True, dynamic=False)
        g = torch.Generator().manual_seed(12)
        cases = ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float16, torch.float16))
        for dtype, alpha_dtype in cases:
            x = (torch.randn(4, 16, 8, generator=g) * 3).to(dtype)
            a = torch.tensor([0.7001], dtype=alpha_dtype)
            x[0, 0] = around(2.0 / a.double(), dtype, 2)[:8, 0]  # boundary values in the batch
            assert counted(x, a, 2.0)[0].item() == saturation_counts(x, a, 2.0)[0].item() == module_count(x, a, 2.0)
    finally:
        dynamo.reset()


# ------------------------------------------------------------------ the point-wise family's cut-offs
def _float64_gain_crossing(function: str, level: float) -> float:
    """Where the gain |f'(u)| / f'(0), evaluated in float64 (the functions' own derivatives by autograd),
    first falls to tanh's at ``level``: bisection on [0, 50], independent of pointwise_cutoff's formulas."""
    f = {"tanh": torch.tanh, "erf": torch.erf, "hardtanh": torch.nn.functional.hardtanh}[function]

    def gain(u: float) -> float:
        t = torch.tensor([u, 0.0], dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(f(t).sum(), t)
        return abs(g[0].item()) / abs(g[1].item())

    target = 1 - math.tanh(level) ** 2
    lo, hi = 0.0, 50.0  # gain(lo) > target (level > 0), gain(hi) <= target
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gain(mid) > target else (lo, mid)
    return hi


@pytest.mark.parametrize("function", POINTWISE_FUNCTIONS)
@pytest.mark.parametrize("level", [0.5, 1.0, 2.0, 3.0, 5.0])
def test_cutoff_is_where_the_float64_gain_falls_to_tanhs_at_the_level(function, level):
    c = pointwise_cutoff(function, level)
    assert abs(c - _float64_gain_crossing(function, level)) < 1e-9 * max(1.0, c)
    u = torch.tensor([c * (1 - 1e-6), c * (1 + 1e-6)], dtype=torch.float64)
    gain = pointwise_gain(function, u)
    target = 1 - math.tanh(level) ** 2
    assert gain[0] > target >= gain[1] or (function == "hardtanh" and gain[0] == 1 and gain[1] == 0)


def test_the_named_cutoffs_at_the_studys_level():
    assert pointwise_cutoff("tanh", 2.0) == 2.0  # the study's rule, bit for bit
    assert pointwise_cutoff("erf", 2.0) == pytest.approx(math.sqrt(-math.log(1 - math.tanh(2.0) ** 2)), rel=1e-15)
    assert round(pointwise_cutoff("erf", 2.0), 4) == 1.6279  # (1.6276 when 1 - tanh(2)^2 is rounded to 0.0707 first)
    assert pointwise_cutoff("hardtanh", 2.0) == 1.0 and pointwise_cutoff("hardtanh", 0.0) == 0.0
    assert math.isfinite(pointwise_cutoff("erf", 40.0))  # 1 - tanh(40)^2 is 0 in float64; ln cosh is not
    with pytest.raises(
        ValueError, match=r"Expected a point-wise function in \('tanh', 'erf', 'hardtanh'\).*got 'gelu'"
    ):
        pointwise_cutoff("gelu", 2.0)
    with pytest.raises(ValueError, match="Expected a finite saturation level >= 0, got -1"):
        pointwise_cutoff("erf", -1.0)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("alpha_dtype", ["float32", "same"])
def test_erf_threshold_counts_exactly_at_its_cutoff(dtype, alpha_dtype):
    """A cut-off that is no float value: the threshold still splits the inputs exactly, at and around it."""
    c = pointwise_cutoff("erf", 2.0)
    a = torch.tensor([0.9173], dtype=torch.float32 if alpha_dtype == "float32" else dtype)
    t = saturation_threshold(a, c, dtype=dtype).double()
    x = torch.cat(
        [
            around(c / a.double(), dtype, 3).reshape(-1),
            around(t, dtype, 3).reshape(-1),
            (torch.randn(2000, generator=torch.Generator().manual_seed(3)) * 3).to(dtype),
        ]
    )
    for product in ("module", "exact"):
        assert saturation_counts(x, a, c, product=product)[0].item() == count(x, a, c, product=product)


# ------------------------------------------------------------------ the fused and the shifted counts
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("shape", [(1,), (64,)])
def test_fused_counts_equal_the_four_op_counts(dtype, shape):
    g = torch.Generator().manual_seed(13)
    a = torch.rand(shape, generator=g) * 3 + 0.1
    x = (torch.randn(3, 5, 64, generator=g) * 3).to(dtype)
    x[0, 0, :2] = torch.tensor([float("inf"), float("nan")])
    t = saturation_threshold(a, 2.0, dtype=dtype)
    sat, bad = fused_counts(x, t)
    want_sat, want_bad = saturation_counts(x, a, 2.0)
    assert (sat.dtype, bad.dtype) == (torch.int64, torch.int64)
    assert (sat.item(), bad.item()) == (want_sat.item(), want_bad.item()) == (module_count(x, a, 2.0), 1)


def test_fused_counts_many_equals_each_inputs_four_op_count():
    """Several inputs of different dtypes, shapes and threshold shapes in one call: the counts, then the flags."""
    g = torch.Generator().manual_seed(14)
    xs, ts, want = [], [], []
    for dtype, shape, alpha in [
        (torch.float32, (3, 5, 16), torch.tensor([1.3])),
        (torch.bfloat16, (7, 16), torch.rand(16, generator=g) + 0.2),
        (torch.float16, (2, 4, 3, 3), torch.rand(4, 1, 1, generator=g) * 2 + 0.1),
    ]:
        x = (torch.randn(shape, generator=g) * 3).to(dtype)
        if dtype == torch.bfloat16:
            x[0, 0] = float("-inf")
        xs.append(x)
        ts.append(saturation_threshold(alpha, 2.0, dtype=dtype))
        want.append([v.item() for v in saturation_counts(x, alpha, 2.0)])
    got = fused_counts_many(xs, ts)
    assert [(v.dtype, v.shape) for v in got] == [(torch.int32, ())] * 3 + [(torch.bool, ())] * 3
    assert [[int(got[i]), int(got[3 + i])] for i in range(3)] == want and [w[1] for w in want] == [0, 1, 0]


@pytest.mark.parametrize("numel, acc", [(2**31 - 1, torch.int32), (2**31, torch.int64)])
def test_fused_counts_accumulate_in_int32_only_where_it_is_exact(numel, acc):
    """Traced on the meta device (no data): the saturated count sums in int32 below 2**31
    elements, in int64 from there."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fused_counts)(torch.empty(numel, device="meta"), torch.empty(1, device="meta"))
    sums = [
        n.kwargs.get("dtype")
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target.overloadpacket.__name__ == "sum"
    ]
    assert sums == [acc]


def test_fused_counts_compile_to_one_graph_and_count_as_eager():
    dynamo = pytest.importorskip("torch._dynamo")
    try:
        fused = torch.compile(fused_counts, backend="aot_eager", fullgraph=True, dynamic=True)
        for dtype in LOW:
            x = (torch.randn(7, 64, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
            t = saturation_threshold(torch.tensor([1.1]), 2.0, dtype=dtype)
            assert [v.item() for v in fused(x, t)] == [v.item() for v in fused_counts(x, t)]
    finally:
        dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shift_shape", [(1,), (32,)])
def test_shifted_counts_equal_the_modules_own_preactivation(dtype, shift_shape):
    """u = alpha * x + s as the layer computes it (module), or in float64 (exact), against |u| > c."""
    g = torch.Generator().manual_seed(17)
    c = pointwise_cutoff("erf", 2.0)
    a = torch.tensor([0.83]).to(dtype)
    s = (torch.randn(shift_shape, generator=g) * 0.7).to(dtype)
    x = (torch.randn(6, 9, 32, generator=g) * 2.5).to(dtype)
    assert shifted_saturation_counts(x, a, s, c)[0].item() == module_count(x, a, c, shift=s)
    assert shifted_saturation_counts(x, a, s, c, product="exact")[0].item() == exact_count(x, a, c, shift=s)
    x[1, 2, 3] = float("nan")
    sat, bad = shifted_saturation_counts(x, a, s, c)
    assert bad.item() == 1 and sat.item() == module_count(x, a, c, shift=s)  # NaN is never over the level
    with pytest.raises(AlphaBroadcastError, match="keep the input's shape"):
        shifted_saturation_counts(x, a, torch.zeros(2, 1, 1, 1), c)


@pytest.mark.parametrize("product", ["module", "exact"])
@pytest.mark.parametrize(
    "dtype, product_dtype",
    [
        (torch.float32, torch.float32),
        (torch.float32, torch.float64),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
)
def test_threshold_host_fn_equals_the_tensor_threshold(product, dtype, product_dtype):
    """The pre-checked host threshold (one per layer and step on the CPU) against the tensor version, bit for bit."""
    from satmon.functional.saturation import threshold_host_fn

    g = torch.Generator().manual_seed(21)
    alphas = torch.cat(
        [torch.tensor([0.0, 1e-45, 1e-30, 0.8, 2.0, 3.4e38]), 10 ** (torch.rand(2000, generator=g) * 60 - 30)]
    )
    alphas = alphas.to(product_dtype if product_dtype != torch.float32 or dtype == torch.float32 else torch.float32)
    for level in (2.0, pointwise_cutoff("erf", 2.0), 1.0):
        fn = threshold_host_fn(level, dtype=dtype, product=product, product_dtype=product_dtype)
        want = (
            saturation_threshold(
                alphas.reshape(-1, 1), level, dtype=dtype, product=product, product_dtype=product_dtype
            )
            .reshape(-1)
            .tolist()
        )
        assert [fn(a) for a in alphas.tolist()] == want, level
