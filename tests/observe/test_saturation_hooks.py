"""SaturationHooks and CountQueue (satmon.observe.saturation): counts through the hooks against an
independent re-count, and the kept-input schedule. Layers that cannot be counted: test_saturation_hooks_refused.py.

The per-element rule itself (thresholds, rounding, broadcasting) is tested in
tests/functional/test_saturation_math.py.
"""

from __future__ import annotations

import warnings
import weakref

import pytest
import torch
from torch import nn

from helpers import hooked
from reference import exact_count, module_count, reference
from satmon import DyT, find_dyt_layers
from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import HookReadings, SaturationHooks

X4 = [[0.5, 1.5, -3.0, 0.1]]  # with alpha 2: |1.0|, |3.0|, |-6.0|, |0.2| -> 2 of 4 above 2


# ----------------------------------------------------------------------------- counts and reads
def test_cached_threshold_follows_alpha_changes():
    norm = DyT(64, alpha_init=2.0)
    hooks = hooked(nn.Sequential(norm))
    g = torch.Generator().manual_seed(4)
    expected = 0
    for alpha in (2.0, 2.0, 0.7, 3.1):
        with torch.no_grad():
            norm.alpha.fill_(alpha)  # in place, as an optimizer step: bumps the version counter
        x = torch.randn(8, 64, generator=g) * 2
        norm(x)
        expected += reference(x, norm.alpha)
        hooks.flush()  # the hooks queue their sums; reading the state tensors directly needs the fold
        assert hooks.counter.saturated.tolist() == [expected]


def test_a_four_op_count_on_an_accelerator_uses_the_batched_threshold_of_its_step():
    # refresh_thresholds makes one batched threshold per step for scalar accelerator alphas (meta here: no
    # data, the same path); the four-op count (fused off) must find it, not compute its own per layer
    from satmon.functional.saturation import saturation_threshold
    from satmon.observe.saturation import CountQueue

    q = CountQueue(SaturationCounter(2), 2.0)
    alphas = [torch.tensor([0.5], device="meta"), torch.tensor([1.5], device="meta")]
    q.refresh_thresholds(alphas)
    batched = [q._thresholds[i][1] for i in range(2)]
    for tensor in (False, True):  # the four ops ask without tensor=, the fused count with it
        got = [q.threshold(i, a, torch.float32, tensor=tensor) for i, a in enumerate(alphas)]
        assert all(t is b for t, b in zip(got, batched))
    # a CPU scalar alpha's host float and tensor thresholds stay apart
    a = torch.tensor([0.8])
    host, tensor_t = q.threshold(0, a), q.threshold(0, a, tensor=True)
    assert isinstance(host, float) and isinstance(tensor_t, torch.Tensor)
    assert tensor_t.item() == host == saturation_threshold(a, 2.0).item()


def test_flush_is_needed_only_for_direct_state_reads_and_reset_drops_the_queue():
    hooks = hooked(nn.Sequential(DyT(4, alpha_init=2.0)))
    dyt = hooks.layers[0].module
    dyt(torch.tensor(X4))
    assert hooks.counter.saturated.tolist() == [0]  # queued, not folded yet
    r = hooks.read(sync=False)  # a read folds first
    assert (r.saturated, r.total, r.nonfinite) == ([2], [4], [0])
    assert hooks.counter.saturated.tolist() == [2] and hooks.counter.total.tolist() == [4]
    dyt(torch.tensor([[9.0, 0.0, 0.0, 0.0]]))
    hooks.reset()  # reset drops queued calls too
    hooks.flush()
    assert hooks.counter.saturated.tolist() == [0] and hooks.counter.total.tolist() == [0]


def test_read_returns_counts_and_mean_abs_alpha_per_layer():
    model = nn.Sequential(DyT(3, alpha_init=-1.5), nn.Identity(), DyT(3, alpha_init=2.0))
    with torch.no_grad():  # a per-channel alpha (its mean |alpha| is what the reading reports)
        model[2].alpha = nn.Parameter(torch.tensor([1.0, -2.0, 4.0]))
    x = torch.tensor([[1.0, 2.0, -0.4], [0.1, -1.2, 0.6]])
    mid = model[0](x).detach()  # the second layer's input (computed before the hooks: not counted)
    hooks = hooked(model)
    model(x)
    r = hooks.read(sync=False)
    assert isinstance(r, HookReadings)
    assert r.saturated == [reference(x, model[0].alpha), reference(mid, model[2].alpha)]
    assert r.total == [6, 6] and r.nonfinite == [0, 0]
    assert r.alphas == [1.5, 7 / 3]


def test_float64_inputs_compare_the_float64_product():
    model = nn.Sequential(DyT(16, alpha_init=0.3)).double()
    hooks = hooked(model)
    x = torch.randn(6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 9
    x[0, 0] = 2.0 / 0.3  # near the level: the float64 product is what counts
    model(x)
    assert hooks.read(sync=False).saturated == [exact_count(x, model[0].alpha)]


@pytest.mark.parametrize("product", ["module", "exact"])
@pytest.mark.parametrize("keep_inputs", [False, True])
def test_the_counters_product_rule_reaches_the_hooks_on_the_boundary(product, keep_inputs):
    """A bf16 model: products just above 2 round to 2.0 in the forward (module) but exceed 2 (exact)."""
    model = nn.Sequential(DyT(64, alpha_init=1.5)).to(torch.bfloat16)
    alpha = model[0].alpha
    grid = torch.linspace(1.32, 1.35, 64).to(torch.bfloat16)  # |x| around 2 / 1.5, on the bf16 grid
    x = torch.stack([grid, -grid])  # (2, 64)
    assert module_count(x, alpha) != exact_count(x, alpha)  # the data do sit on the boundary
    hooks = hooked(model, keep_inputs=keep_inputs, product=product)
    with torch.no_grad():  # kept inputs must be counted before alpha changes; here nothing changes
        model(x)
    want = module_count(x, alpha) if product == "module" else exact_count(x, alpha)
    assert hooks.read(sync=False).saturated == [want]


def test_channels_first_alpha_counts_along_the_channel_dimension():
    """An alpha stored in the shape its forward uses, (C, 1, 1), broadcasts over (B, C, H, W) as the product does."""

    class ConvDyT(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.alpha = nn.Parameter(torch.tensor([0.5, 1.0, 3.0]).reshape(c, 1, 1))
            self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

        def forward(self, x):  # (B, C, H, W)
            return self.weight.view(-1, 1, 1) * torch.tanh(self.alpha * x) + self.bias.view(-1, 1, 1)

    model = nn.Sequential(ConvDyT(3))
    hooks = hooked(model)
    scale = torch.tensor([0.5, 4.0, 1.0]).reshape(3, 1, 1)  # channels differ: the axis alpha acts on matters
    x = torch.randn(2, 3, 5, 3, generator=torch.Generator().manual_seed(9)) * scale  # W == C: a wrong axis runs too
    model(x)
    want = reference(x, model[0].alpha)
    assert want != reference(x, model[0].alpha.reshape(3))  # alpha on the last dimension would count otherwise
    assert hooks.read(sync=False).saturated == [want]
    assert not hooks.refused


def test_mismatched_counter_is_refused():
    layers = find_dyt_layers(nn.Sequential(DyT(4), DyT(4)))
    with pytest.raises(ValueError, match="Expected a counter with 2 layers, got 1"):
        SaturationHooks(layers, SaturationCounter(1))


# ----------------------------------------------------------------------------- deferred fold, kept inputs
class _Twice(nn.Module):
    """Odd call patterns for the deferred fold: a layer run twice per forward, layers out of order, two shapes."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = DyT(16, alpha_init=0.9), DyT(16, alpha_init=1.7), DyT(16, alpha_init=0.4)

    def forward(self, x):
        y = self.c(x) + self.a(x)
        return self.a(y).sum() + self.b(x[:, :3]).sum()


@pytest.mark.parametrize("keep_inputs", [False, True])
def test_deferred_fold_equals_the_reference_with_odd_call_patterns(keep_inputs):
    model = _Twice()
    hooks = hooked(model, keep_inputs=keep_inputs)
    names = [l.name for l in hooks.layers]
    g = torch.Generator().manual_seed(8)
    want = {n: [0, 0, 0] for n in names}
    seen: dict[str, list] = {n: [] for n in names}
    for n, layer in zip(names, hooks.layers):
        layer.module.register_forward_hook(
            lambda m, args, out, n=n: seen[n].append((args[0].detach().clone(), m.alpha.detach().clone()))
        )
    for step in range(3):
        x = torch.randn(4, 6, 16, generator=g) * 3
        if step == 1:
            x[0, 0, 0] = float("nan")  # one non-finite input: flagged once per call it reaches
        with torch.no_grad():
            model(x)
            if keep_inputs:
                hooks.count_kept()  # the contract: after the forward, before alpha changes
            for layer in hooks.layers:
                layer.module.alpha.mul_(1.1)  # thresholds must follow alpha
        for n in names:
            for xi, a in seen[n]:
                finite = torch.nan_to_num(xi, nan=0.0)  # nan is never saturated
                want[n][0] += reference(finite, a)
                want[n][1] += xi.numel()
                want[n][2] += int(not torch.isfinite(xi).all())
            seen[n].clear()
        r = hooks.read(sync=False)  # every step: a second read must see the new counts
        assert r.saturated == [want[n][0] for n in names]
        assert r.total == [want[n][1] for n in names]
        assert r.nonfinite == [want[n][2] for n in names]
    assert r.nonfinite == [2, 1, 1]  # a: both of its calls see the nan; b (its slice holds it) and c: once
    hooks.detach()


def _kept() -> tuple[nn.Module, SaturationHooks]:
    hooks = hooked(nn.Sequential(DyT(4, alpha_init=2.0)), keep_inputs=True)
    return hooks.layers[0].module, hooks


def test_kept_inputs_are_counted_after_the_forward_and_released():
    dyt, hooks = _kept()
    x = torch.tensor(X4)
    kept = weakref.ref(x)
    dyt(x)
    del x
    assert kept() is not None and hooks.counter.total.tolist() == [0]  # the hook keeps a reference, counts nothing
    hooks.count_kept()
    assert kept() is None  # counted: the reference is gone
    hooks.flush()
    assert hooks.counter.saturated.tolist() == [2] and hooks.counter.total.tolist() == [4]
    first = torch.tensor([[9.0, 0.0, 0.0, 0.0]])
    kept = weakref.ref(first)
    dyt(first)
    del first
    dyt(torch.tensor([[9.0, 9.0, 0.0, 0.0]]))  # the layer again: its kept input is counted first
    assert kept() is None  # at most one forward's inputs are held
    r = hooks.read(sync=False)  # a read counts what is kept
    assert (r.saturated, r.total) == ([5], [12])
    x = torch.tensor([[9.0, 0.0, 0.0, 0.0]])
    kept = weakref.ref(x)
    dyt(x)
    del x
    hooks.reset()  # reset drops kept inputs too
    assert kept() is None
    hooks.flush()
    assert hooks.counter.total.tolist() == [0] and hooks.counter.saturated.tolist() == [0]


def test_kept_input_modified_in_place_is_skipped_with_a_warning_then_counted_in_the_hook():
    dyt, hooks = _kept()
    x = torch.tensor(X4)
    dyt(x)
    x.mul_(100.0)  # the model changed the layer's input after the forward: what is kept is not what it saw
    with pytest.warns(RuntimeWarning, match="changed in place"):
        hooks.count_kept()
    assert not hooks.queue.keep_inputs  # counting moved back into the hooks for good
    hooks.flush()
    assert hooks.counter.total.tolist() == [0]  # skipped, not miscounted
    y = torch.tensor(X4)
    dyt(y)
    y.mul_(100.0)  # counted in the hook already, so this no longer matters
    r = hooks.read(sync=False)
    assert (r.saturated, r.total) == ([2], [4])


def test_kept_input_counted_after_alpha_changed_is_skipped_with_a_warning():
    dyt, hooks = _kept()
    dyt(torch.tensor(X4))
    hooks.count_kept()  # in time: counted with the forward's alpha
    dyt(torch.tensor(X4))
    with torch.no_grad():
        dyt.alpha.mul_(10.0)  # an optimizer step before the count: the forward's threshold is gone
    with pytest.warns(RuntimeWarning, match="before the optimizer step"):
        dyt(torch.tensor([[0.5, 0.05, 0.0, 0.0]]))  # the layer again: the kept input is counted first
    assert hooks.counter.saturated.tolist() == [0]
    hooks.flush()
    # the first input (2 of 4 with alpha 2) and the third, counted in its hook (alpha 20: 0.5 only)
    assert hooks.counter.saturated.tolist() == [3] and hooks.counter.total.tolist() == [8]


def test_a_read_folds_with_one_update_and_no_host_copy_once_the_pattern_is_known(monkeypatch):
    """Three calls, one fold; the fold's layer indices and element totals are made once per call pattern."""
    dyt, hooks = _kept()
    folds, made = [], []
    update = hooks.counter.update
    monkeypatch.setattr(hooks.counter, "update", lambda *a, **k: (folds.append(a), update(*a, **k)))
    real_tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: (made.append(a), real_tensor(*a, **k))[1])
    for _ in range(3):
        dyt(torch.tensor(X4))  # each forward counts the previous kept input first
    made.clear()
    r = hooks.read(sync=False)
    assert (r.saturated, r.total) == ([6], [12])
    assert len(folds) == 1 and len(made) == 1  # one fold; its index and totals made on the host once
    for _ in range(3):
        dyt(torch.tensor(X4))
    made.clear()
    hooks.flush()
    assert len(folds) == 2 and made == []  # the same pattern again: nothing made on the host
    hooks.flush()  # nothing queued: no empty update
    assert len(folds) == 2
    assert hooks.read(sync=False).saturated == [12]


def test_inference_tensors_are_counted_at_once():
    dyt, hooks = _kept()
    with torch.inference_mode():  # inference tensors have no version counter to check: never kept
        x = torch.tensor(X4)
        kept = weakref.ref(x)
        dyt(x)
        del x
    assert kept() is None
    r = hooks.read(sync=False)
    assert (r.saturated, r.total) == ([2], [4])


def test_kept_inputs_with_activation_checkpointing_counted_before_the_optimizer_step():
    """Checkpointing re-runs the forward inside the backward: the hooks skip that re-run, so each training
    forward is counted once (0.1 counted it twice), and nothing warns."""
    from torch.utils.checkpoint import checkpoint

    model = nn.Sequential(nn.Linear(8, 8), DyT(8, alpha_init=1.5), nn.Linear(8, 1))
    hooks = hooked(model, keep_inputs=True)
    seen: list[int] = []
    model[1].register_forward_hook(lambda m, a, o: seen.append(reference(a[0], m.alpha)))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped input would warn
        for _ in range(3):
            out = checkpoint(model, torch.randn(16, 8, generator=g) * 2, use_reentrant=False)
            hooks.count_kept()  # on_before_backward
            out.square().mean().backward()  # re-runs the forward: the hook keeps the recomputed input
            hooks.count_kept()  # on_after_backward
            opt.step()
            opt.zero_grad()
    assert len(seen) == 6 and seen[0::2] == seen[1::2]  # three forwards, each run twice on the same input
    r = hooks.read(sync=False)
    assert r.saturated == [sum(seen[0::2])] and r.total == [3 * 16 * 8]


# ----------------------------------------------------------------------------- the fused (compiled) count
@pytest.mark.parametrize("keep_inputs", [False, True])
def test_the_fused_count_through_the_hooks_equals_the_reference_and_falls_back_when_compiling_fails(keep_inputs):
    """The fused path forced on the CPU through the hooks (odd call patterns: a layer run twice, two shapes), the
    traced graph run uncompiled; then a compiler that fails: one warning, the four ops from then on, exact as well.
    Inductor's own kernels, and the path's other cases: test_fused_counts.py."""
    import satmon.observe.saturation as sat

    model = _Twice()
    hooks = hooked(model, keep_inputs=keep_inputs)
    hooks.queue.fused, hooks.queue.fused_backend = True, lambda gm, example: gm
    g = torch.Generator().manual_seed(6)
    seen = {l.name: [] for l in hooks.layers}
    for l in hooks.layers:
        l.module.register_forward_hook(
            lambda m, a, o, n=l.name: seen[n].append((a[0].detach().clone(), m.alpha.detach().clone()))
        )
    failed = dict(sat._FAILED)
    sat._FAILED.clear()
    try:
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(4, 6, 16, generator=g) * 3)
                hooks.count_kept()
        want = [sum(reference(x, a) for x, a in seen[l.name]) for l in hooks.layers]
        r = hooks.read(sync=False)
        assert r.saturated == want and hooks.queue.inputs_counted["four ops"] == 0 and not hooks.queue._sums
        assert r.total == [sum(x.numel() for x, _ in seen[l.name]) for l in hooks.layers]

        def broken(gm, example_inputs):
            raise RuntimeError("no compiler here")

        hooks.reset()
        for v in seen.values():
            v.clear()
        sat._COMPILED.clear()
        hooks.queue.fused_backend = broken
        with pytest.warns(RuntimeWarning, match="compiling the fused saturation count failed"), torch.no_grad():
            model(torch.randn(4, 6, 16, generator=g) * 3)
            hooks.count_kept()
        assert sat._FAILED == {"cpu": "RuntimeError: no compiler here"}  # the four ops from now on, exact as well
        assert hooks.read(sync=False).saturated == [sum(reference(x, a) for x, a in seen[l.name]) for l in hooks.layers]
    finally:
        sat._FAILED.clear()
        sat._FAILED.update(failed)
