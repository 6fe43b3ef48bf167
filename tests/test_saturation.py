"""Counting through the hooks and the counter against an independent float64 re-computation.

The pure functions (thresholds, per-element rules, broadcasting) are tested in
tests/functional/test_saturation_math.py."""

import pytest
import torch

from satmon.core.saturation_hooks import SaturationCounter


def reference(x: torch.Tensor, alpha: torch.Tensor, level: float) -> tuple[int, int]:
    x64, a64 = x.to(torch.float64), alpha.to(torch.float64)
    return int(((a64 * x64).abs() > level).sum()), int((~torch.isfinite(x64)).sum())


def test_cached_threshold_follows_alpha_changes():
    from satmon import DyT
    from satmon.discovery import find_dyt_layers
    from satmon.core.saturation_hooks import SaturationHooks

    norm = DyT(64, alpha_init=2.0)
    layers = find_dyt_layers(torch.nn.Sequential(norm))
    hooks = SaturationHooks(layers, SaturationCounter(1)).attach()
    g = torch.Generator().manual_seed(4)
    expected = 0
    for alpha in (2.0, 2.0, 0.7, 3.1):
        with torch.no_grad():
            norm.alpha.fill_(alpha)  # in place, as an optimizer step: bumps the version counter
        x = torch.randn(8, 64, generator=g) * 2
        norm(x)
        expected += reference(x, torch.tensor([alpha]), 2.0)[0]
        hooks.counter.flush()  # the hooks queue their sums; reading the state tensors directly needs the fold
        assert hooks.counter.saturated.item() == expected


def test_counter_batched_equals_one_shot():
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(5, 7, 8, generator=g) * 2 for _ in range(4)]
    a = torch.tensor([1.3])
    batched, one = SaturationCounter(1), SaturationCounter(1)
    for x in xs:
        batched.update(0, x, a)
    one.update(0, torch.cat(xs), a)
    assert torch.equal(batched.saturated, one.saturated) and torch.equal(batched.total, one.total)
    out = batched.compute()
    assert out["pooled"].item() == pytest.approx(reference(torch.cat(xs), a, 2.0)[0] / torch.cat(xs).numel(), abs=0)


def test_counts_stay_on_device_dtype_int64():
    c = SaturationCounter(2)
    c.update(1, torch.randn(3, 4), torch.tensor([2.0]))
    assert c.saturated.dtype == torch.int64 and c.saturated[0].item() == 0 and c.total.tolist() == [0, 12]


# ---------------------------------------------------------------- deferred fold, kept inputs
class _Twice(torch.nn.Module):
    """Odd call patterns for the deferred fold: a layer run twice per forward, layers out of order, two shapes."""

    def __init__(self):
        super().__init__()
        from satmon import DyT

        self.a, self.b, self.c = DyT(16, alpha_init=0.9), DyT(16, alpha_init=1.7), DyT(16, alpha_init=0.4)

    def forward(self, x):
        y = self.c(x) + self.a(x)
        return self.a(y).sum() + self.b(x[:, :3]).sum()


@pytest.mark.parametrize("keep_inputs", [False, True])
def test_deferred_fold_equals_float64_reference_with_odd_call_patterns(keep_inputs):
    from satmon.discovery import find_dyt_layers
    from satmon.core.saturation_hooks import SaturationHooks

    model = _Twice()
    layers = find_dyt_layers(model)
    names = [l.name for l in layers]
    hooks = SaturationHooks(layers, SaturationCounter(len(layers), keep_inputs=keep_inputs)).attach()
    g = torch.Generator().manual_seed(8)
    want = {n: [0, 0, 0] for n in names}
    seen: dict[str, list] = {n: [] for n in names}
    for n, mod in zip(names, (l.module for l in layers)):
        mod.register_forward_hook(lambda m, args, out, n=n: seen[n].append((args[0].detach().clone(), m.alpha.detach().clone())))
    for step in range(3):
        x = torch.randn(4, 6, 16, generator=g) * 3
        if step == 1:
            x[0, 0, 0] = float("nan")  # one non-finite input: flagged once per call it reaches
        with torch.no_grad():
            model(x)
            if keep_inputs:
                hooks.counter.count_inputs()  # the contract: after the forward, before alpha changes
            for mod in (model.a, model.b, model.c):
                mod.alpha.mul_(1.1)  # thresholds must follow alpha
        for n in names:
            for xi, a in seen[n]:
                s, bad = reference(xi, a, 2.0)
                want[n][0] += s
                want[n][1] += xi.numel()
                want[n][2] += int(bad > 0)
            seen[n].clear()
        out = hooks.counter.compute()  # flushes; a second compute must see new counts (no stale cache)
        assert out["saturated"].tolist() == [want[n][0] for n in names]
        assert out["total"].tolist() == [want[n][1] for n in names]
        assert out["nonfinite"].tolist() == [want[n][2] for n in names]
    hooks.detach()


def test_flush_is_needed_only_for_direct_state_reads():
    from satmon import DyT
    from satmon.discovery import find_dyt_layers
    from satmon.core.saturation_hooks import SaturationHooks

    layers = find_dyt_layers(torch.nn.Sequential(DyT(4, alpha_init=2.0)))
    hooks = SaturationHooks(layers, SaturationCounter(1)).attach()
    layers[0].module(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
    assert hooks.counter.saturated.tolist() == [0]  # queued, not folded yet
    assert hooks.counter.per_layer().tolist() == [0.5]  # reading methods fold first
    assert hooks.counter.saturated.tolist() == [2] and hooks.counter.total.tolist() == [4]
    layers[0].module(torch.tensor([[9.0, 0.0, 0.0, 0.0]]))
    hooks.counter.reset()  # reset drops queued calls too
    hooks.counter.flush()
    assert hooks.counter.saturated.tolist() == [0] and hooks.counter.total.tolist() == [0]


def _kept_setup():
    from satmon import DyT
    from satmon.discovery import find_dyt_layers
    from satmon.core.saturation_hooks import SaturationHooks

    layers = find_dyt_layers(torch.nn.Sequential(DyT(4, alpha_init=2.0)))
    return layers[0].module, SaturationHooks(layers, SaturationCounter(1, keep_inputs=True)).attach()


def test_kept_inputs_are_counted_after_the_forward_and_released():
    import weakref

    dyt, hooks = _kept_setup()
    dyt(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
    kept = weakref.ref(hooks.counter._inputs[0][1])  # the hook keeps a reference, nothing counted yet
    assert hooks.counter.total.tolist() == [0] and kept() is not None
    hooks.counter.count_inputs()
    assert kept() is None  # counted: the reference is gone
    hooks.counter.flush()
    assert hooks.counter.saturated.tolist() == [2] and hooks.counter.total.tolist() == [4]
    dyt(torch.tensor([[9.0, 0.0, 0.0, 0.0]]))
    dyt(torch.tensor([[9.0, 9.0, 0.0, 0.0]]))  # the layer again: its kept input is counted first
    assert len(hooks.counter._inputs) == 1
    assert hooks.counter.per_layer().tolist() == [5 / 12]  # a read counts what is kept
    dyt(torch.tensor([[9.0, 0.0, 0.0, 0.0]]))
    hooks.counter.reset()  # reset drops kept inputs too
    hooks.counter.flush()
    assert hooks.counter.total.tolist() == [0] and hooks.counter.saturated.tolist() == [0]


def test_kept_input_modified_in_place_is_skipped_with_a_warning_then_counted_in_the_hook():
    dyt, hooks = _kept_setup()
    x = torch.tensor([[0.5, 1.5, -3.0, 0.1]])
    dyt(x)
    x.mul_(100.0)  # the model changed the layer's input after the forward: what is kept is not what it saw
    with pytest.warns(RuntimeWarning, match="changed in place"):
        hooks.counter.count_inputs()
    assert not hooks.counter.keep_inputs  # counting moved back into the hooks for good
    hooks.counter.flush()
    assert hooks.counter.total.tolist() == [0]  # skipped, not miscounted
    y = torch.tensor([[0.5, 1.5, -3.0, 0.1]])
    dyt(y)
    y.mul_(100.0)  # from now on counted in the hook, so this no longer matters
    assert not hooks.counter._inputs
    assert hooks.counter.saturated.tolist() == [0]
    assert hooks.counter.per_layer().tolist() == [0.5]


def test_compute_on_kept_inputs_counts_them_without_warning():
    import warnings

    dyt, hooks = _kept_setup()
    dyt(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torchmetrics warns when compute() runs before any update
        out = hooks.counter.compute()
    assert int(out["saturated"]) == 2 and int(out["total"]) == 4  # (one layer: torchmetrics squeezes to 0-dim)
    assert hooks.counter.update_count == 1
    hooks.counter.keep_inputs = False
    dyt(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))  # queued, not folded: counted once before and after the fold
    assert hooks.counter.update_count == 2
    hooks.counter.flush()
    assert hooks.counter.update_count == 2
    hooks.counter.reset()
    assert hooks.counter.update_count == 0 and not hooks.counter.update_called


def test_inference_tensors_are_counted_at_once():
    dyt, hooks = _kept_setup()
    with torch.inference_mode():  # inference tensors have no version counter to check: never kept
        dyt(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
    assert not hooks.counter._inputs
    assert hooks.counter.per_layer().tolist() == [0.5]


def test_kept_input_counted_after_alpha_changed_is_skipped_with_a_warning():
    dyt, hooks = _kept_setup()
    dyt(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
    hooks.counter.count_inputs()  # in time: counted with the forward's alpha
    dyt(torch.tensor([[0.5, 1.5, -3.0, 0.1]]))
    with torch.no_grad():
        dyt.alpha.mul_(10.0)  # an optimizer step before the count: the forward's threshold is gone
    with pytest.warns(RuntimeWarning, match="before the optimizer step"):
        dyt(torch.tensor([[0.5, 0.05, 0.0, 0.0]]))  # the layer again: the kept input is counted first
    assert hooks.counter.saturated.tolist() == [0]
    hooks.counter.flush()
    # the first input (2 of 4 with alpha 2) and the third, counted in its hook (alpha 20: 0.5 only)
    assert hooks.counter.saturated.tolist() == [3] and hooks.counter.total.tolist() == [8]


def test_kept_inputs_with_activation_checkpointing_counted_before_the_optimizer_step():
    """Checkpointing re-runs the forward inside the backward: counting before and after the backward
    (what the callback does) keeps every input's alpha, so nothing is skipped and nothing warns."""
    import warnings

    from torch.utils.checkpoint import checkpoint

    from satmon import DyT
    from satmon.discovery import find_dyt_layers
    from satmon.core.saturation_hooks import SaturationHooks

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), DyT(8, alpha_init=1.5), torch.nn.Linear(8, 1))
    layers = find_dyt_layers(model)
    hooks = SaturationHooks(layers, SaturationCounter(1, keep_inputs=True)).attach()
    seen: list[torch.Tensor] = []
    model[1].register_forward_hook(lambda m, a, o: seen.append((a[0].detach().double() * m.alpha.detach().double()).abs()))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped input would warn
        for _ in range(3):
            out = checkpoint(model, torch.randn(16, 8, generator=g) * 2, use_reentrant=False)
            hooks.counter.count_inputs()  # on_before_backward
            out.square().mean().backward()  # re-runs the forward: the hook keeps the recomputed input
            hooks.counter.count_inputs()  # on_after_backward
            opt.step()
            opt.zero_grad()
    assert len(seen) == 6  # three forwards, each run twice
    hooks.counter.flush()
    assert hooks.counter.saturated.tolist() == [int(sum((s > 2.0).sum() for s in seen))]
    assert hooks.counter.total.tolist() == [6 * 16 * 8]
