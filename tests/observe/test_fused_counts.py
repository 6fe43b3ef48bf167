"""The fused count (satmon.observe.saturation: one compiled call per forward's counted inputs) against the
four-op count and independent re-counts: bit for bit, over dtypes, shapes, thresholds and non-finite data;
which path the crossover picks; and what happens where compiling fails or gives a wrong answer.

Most tests run the traced ATen graph uncompiled (``GRAPH``: the same code path, no C++ compilation);
one compiles with Inductor, as satmon does, and is skipped only where Inductor cannot compile at all.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import satmon.observe.saturation as sat
from reference import exact_count, module_count
from satmon.functional.saturation import pointwise_cutoff
from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import FUSED_MIN_ELEMENTS, CountQueue, compile_counts


def GRAPH(gm, example):  # noqa: N802 -- a compiler: the traced graph, run as it is
    return gm


@pytest.fixture(autouse=True)
def _fresh_compiled():
    """Every test starts with no compiled count and no recorded failure (module state), and leaves none."""
    saved = dict(sat._COMPILED), dict(sat._FAILED)
    sat._COMPILED.clear()
    sat._FAILED.clear()
    yield
    sat._COMPILED.clear()
    sat._FAILED.clear()
    sat._COMPILED.update(saved[0])
    sat._FAILED.update(saved[1])


def _queue(
    n: int, fused: bool | None, backend=GRAPH, level: float = 2.0, product: str = "module", cutoffs=None
) -> CountQueue:
    q = CountQueue(SaturationCounter(n, product=product), level, keep_inputs=True, product=product, cutoffs=cutoffs)
    q.fused, q.fused_backend = fused, backend
    return q


def _count(q: CountQueue, items) -> tuple[list[int], list[int], list[int]]:
    """One forward's inputs kept and counted, then folded: per layer (saturated, total, nonfinite)."""
    for i, (x, a) in enumerate(items):
        q.add_input(i, x, a)
    q.count_kept()
    q.flush()
    c = q.counter
    return c.saturated.tolist(), c.total.tolist(), c.nonfinite.tolist()


def _inputs(seed: int = 0):
    """Inputs that exercise the rule: three dtypes, a vector tail (sizes not multiples of 8 or 16), a
    channels-first input with a (C, 1, 1) alpha, per-channel and scalar alphas, a zero alpha, values on and
    just above each threshold, and inf/-inf/nan."""
    g = torch.Generator().manual_seed(seed)

    def p(v):
        return nn.Parameter(torch.as_tensor(v, dtype=torch.float32))

    items = [
        ((torch.randn(4, 33, 16, generator=g) * 2).to(torch.float32), p([0.9])),
        ((torch.randn(3, 17, 16, generator=g) * 2).to(torch.bfloat16), p([1.7])),
        ((torch.randn(5, 16, generator=g) * 2).to(torch.float16), p(torch.rand(16, generator=g) * 3 + 0.05)),
        ((torch.randn(2, 8, 5, 6, generator=g) * 2).to(torch.float32), p(torch.rand(8, 1, 1, generator=g) * 2 + 0.1)),
        ((torch.randn(7, 9, generator=g) * 2).to(torch.bfloat16), p([0.0])),  # alpha 0: nothing saturates
        ((torch.randn(1001, generator=g) * 2).to(torch.float16), p([1.3])),
    ]
    x0 = items[0][0]
    x0[0, 0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0])
    items[2][0][1, 3] = float("nan")
    return items


def _put_boundaries(items, q: CountQueue) -> None:
    """Write each scalar-alpha input's threshold and the next value above it into the input (the boundary)."""
    for i, (x, a) in enumerate(items):
        if a.numel() == 1 and a.item() != 0:
            t = q.threshold(i, a, x.dtype)
            above = torch.nextafter(torch.tensor(t, dtype=x.dtype), torch.tensor(float("inf"), dtype=x.dtype))
            flat = x.view(-1)
            flat[-4:] = torch.stack([torch.tensor(t, dtype=x.dtype), above, -torch.tensor(t, dtype=x.dtype), -above])


@pytest.mark.parametrize("product", ["module", "exact"])
@pytest.mark.parametrize("cutoff", ["tanh", "erf"])
def test_the_fused_count_equals_the_four_ops_and_the_recounts_bit_for_bit(product, cutoff):
    items = _inputs()
    level = pointwise_cutoff(cutoff, 2.0)
    fused, four = (_queue(len(items), f, level=level, product=product) for f in (True, False))
    _put_boundaries(items, four)
    got_fused, got_four = _count(fused, items), _count(four, items)
    assert fused.inputs_counted == {"fused": len(items), "four ops": 0}
    assert four.inputs_counted == {"fused": 0, "four ops": len(items)}
    assert got_fused == got_four
    recount = module_count if product == "module" else exact_count
    assert got_fused[0] == [recount(x, a, level) for x, a in items]
    assert got_fused[1] == [x.numel() for x, _ in items]
    assert got_fused[2] == [1, 0, 1, 0, 0, 0]
    assert 0 < sum(got_fused[0]) < sum(got_fused[1])  # saturated and unsaturated elements both


def _inductor_works() -> str | None:
    try:
        args = [torch.ones(3), torch.ones(1)]
        compile_counts(args)(*args)
    except Exception as exc:  # no C++ compiler, an unsupported Python for Inductor, ...
        return f"Inductor cannot compile here: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def test_the_inductor_compiled_count_equals_the_four_ops_and_the_recounts():
    """satmon's own compiler: one C++ kernel per input, one compilation for the layout, reused with new values."""
    reason = _inductor_works()
    if reason:
        pytest.skip(reason)
    sat._COMPILED.clear()
    for seed in (0, 1):  # the second forward reuses the compilation (same layout), with new data and alphas
        items = _inputs(seed)
        with torch.no_grad():
            for _, a in items:
                a.mul_(1 + seed / 3)
        fused, four = _queue(len(items), True, backend="inductor"), _queue(len(items), False)
        _put_boundaries(items, four)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback to the four ops would warn
            got = _count(fused, items)
        assert fused.inputs_counted["fused"] == len(items)
        assert got == _count(four, items)
        assert got[0] == [module_count(x, a) for x, a in items]
        assert len(sat._COMPILED) == 1


def test_thresholds_follow_alpha_between_forwards():
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(3)) * 2
    alpha = nn.Parameter(torch.tensor([0.5]))
    q = _queue(1, True)
    total = 0
    for value in (0.5, 0.5, 1.9, 0.7):
        with torch.no_grad():
            alpha.fill_(value)  # in place, as an optimizer step
        total += module_count(x, alpha)
        assert _count(q, [(x, alpha)])[0] == [total]
    assert q.inputs_counted == {"fused": 4, "four ops": 0}


def test_the_crossover_picks_the_path_by_the_elements_counted_together():
    assert isinstance(FUSED_MIN_ELEMENTS, int) and FUSED_MIN_ELEMENTS > 0
    g = torch.Generator().manual_seed(5)
    alphas = [nn.Parameter(torch.tensor([1.1])) for _ in range(3)]
    q = _queue(3, None)
    q.fused_min_elements = 3 * 100
    small = [(torch.randn(99, generator=g) * 3, a) for a in alphas]  # 297 elements in all: below
    big = [(torch.randn(100, generator=g) * 3, a) for a in alphas]  # 300: at the crossover
    got = _count(q, small)[0]
    assert q.inputs_counted == {"fused": 0, "four ops": 3}
    got = _count(q, big)[0]
    assert q.inputs_counted == {"fused": 3, "four ops": 3}
    assert got == [module_count(xs, a) + module_count(xb, a) for (xs, a), (xb, _) in zip(small, big)]


def test_the_hook_path_counts_each_input_by_its_own_size():
    """Counted in the hook (keep_inputs off): one call per input, the crossover applied to that input."""
    g = torch.Generator().manual_seed(6)
    a = nn.Parameter(torch.tensor([1.4]))
    q = CountQueue(SaturationCounter(1), 2.0, keep_inputs=False)
    q.fused_backend, q.fused_min_elements = GRAPH, 500
    xs = [torch.randn(499, generator=g) * 2, torch.randn(500, generator=g) * 2]
    for x in xs:
        q.add_input(0, x, a)
    q.flush()
    assert q.inputs_counted == {"fused": 1, "four ops": 1}
    assert q.counter.saturated.tolist() == [sum(module_count(x, a) for x in xs)]


def test_a_compiler_that_fails_warns_once_and_the_four_ops_count():
    def broken(gm, example):
        raise RuntimeError("no C++ compiler here")

    items = _inputs()
    q = _queue(len(items), True, backend=broken)
    with pytest.warns(RuntimeWarning, match="compiling the fused saturation count failed .*no C\\+\\+ compiler here"):
        got = _count(q, items)
    assert got[0] == [module_count(x, a) for x, a in items]
    assert q.inputs_counted == {"fused": 0, "four ops": len(items)}
    again = _queue(len(items), True, backend=broken)  # a later queue does not try (and warn) again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _count(again, items) == got


def test_a_compiled_count_that_disagrees_with_eager_is_refused():
    def off_by_one(gm, example):
        def run(*args):
            out = gm(*args)
            return (out[0] + 1, *out[1:])

        return run

    items = _inputs()
    q = _queue(len(items), True, backend=off_by_one)
    with pytest.warns(RuntimeWarning, match="the compiled count returned"):
        got = _count(q, items)
    assert got[0] == [module_count(x, a) for x, a in items] and q.inputs_counted["fused"] == 0


def test_one_queue_compiles_for_a_few_layouts_then_counts_new_ones_with_the_four_ops():
    seen = []

    def recording(gm, example):
        seen.append(tuple(example[0].shape))
        return gm

    g = torch.Generator().manual_seed(8)
    a = nn.Parameter(torch.tensor([1.2]))
    q = _queue(1, True, backend=recording)
    total = 0
    for n in range(1, sat._MAX_LAYOUTS + 3):  # a new shape every forward
        x = torch.randn(n, 16, generator=g) * 2
        total += module_count(x, a)
        assert _count(q, [(x, a)])[0] == [total]
    _count(q, [(torch.zeros(1, 16), a)])  # a layout compiled before: fused again
    assert len(seen) == sat._MAX_LAYOUTS
    assert q.inputs_counted == {"fused": sat._MAX_LAYOUTS + 1, "four ops": 2}


def test_layers_sharing_one_input_are_counted_each_with_its_own_alpha():
    """Two layers fed the same tensor: compiled on copies, so the compiled call keeps two arguments."""
    g = torch.Generator().manual_seed(9)
    a, b = nn.Parameter(torch.tensor([0.6])), nn.Parameter(torch.tensor([2.5]))
    q = _queue(2, True)
    x = torch.randn(40, 8, generator=g) * 2
    first = _count(q, [(x, a), (x, b)])[0]
    assert first == [module_count(x, a), module_count(x, b)] and first[0] != first[1]
    y, z = torch.randn(40, 8, generator=g) * 2, torch.randn(40, 8, generator=g) * 2
    assert _count(q, [(y, a), (z, b)])[0] == [first[0] + module_count(y, a), first[1] + module_count(z, b)]


def test_under_a_dispatch_mode_the_four_ops_count():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    items = _inputs()
    q = _queue(len(items), True)
    with Passthrough():
        got = _count(q, items)
    assert q.inputs_counted == {"fused": 0, "four ops": len(items)}
    assert got[0] == [module_count(x, a) for x, a in items]
