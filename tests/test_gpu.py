"""GPU-only checks (skipped without CUDA): FSDP, bf16 autocast, and no host sync in the hot path.

Lightning's FSDP strategy needs a GPU accelerator, so FSDP cannot be tested on the CPU-only CI;
these run wherever a GPU is present (``python -m pytest tests/test_gpu.py``).
"""

import pytest
import torch

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder
from satmon import SaturationMonitor, find_dyt_layers

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _ModuleProductRecorder:
    """Each training forward's DyT input and alpha as the forward saw them (their own dtypes, on the GPU)."""

    def __init__(self, model: torch.nn.Module, names: list[str]) -> None:
        modules = dict(model.named_modules())
        self.inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for n in names:
            modules[n].register_forward_hook(self._hook)

    def _hook(self, mod, args, out):
        if mod.training:
            self.inputs.append((args[0].detach().clone(), mod.alpha.detach().clone()))

    def fraction(self, level: float = 2.0) -> float:
        """``|alpha * x| > level`` with torch's own product, in ``torch.result_type(alpha, x)`` (the module rule)."""
        sat = sum(int(((a * x).abs() > level).sum()) for x, a in self.inputs)
        return sat / sum(x.numel() for x, _ in self.inputs)


@cuda
@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_counts_on_gpu_match_a_module_product_recount(tmp_path, strategy):
    lit = tiny_lit(alpha_init=50.0)
    rec = _ModuleProductRecorder(lit, [l.name for l in find_dyt_layers(lit)])
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=0)
    trainer(tmp_path, accelerator="cuda", devices=1, strategy=strategy, max_steps=3, callbacks=[monitor]).fit(
        lit, token_loader(3)
    )
    assert monitor.verdict.saturation == pytest.approx(rec.fraction(), abs=0)


@cuda
@pytest.mark.parametrize("product", ["module", "exact"])
def test_bf16_autocast_counts_equal_the_rule_they_name(tmp_path, product):
    """``"module"``: the product as the forward rounds it; ``"exact"``: the float64 product. Under bf16 autocast
    the two may differ on products within one rounding of the level, so each is checked against its own re-count."""
    lit = tiny_lit(alpha_init=50.0)
    names = [l.name for l in find_dyt_layers(lit)]
    exact, module = InputRecorder(lit, names), _ModuleProductRecorder(lit, names)
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=0, product=product)
    trainer(tmp_path, accelerator="cuda", devices=1, precision="bf16-mixed", max_steps=3, callbacks=[monitor]).fit(
        lit, token_loader(3)
    )
    if product == "exact":
        ref = exact.counts()
        want = sum(s for s, _ in ref.values()) / sum(t for _, t in ref.values())
    else:
        want = module.fraction()
    assert monitor.verdict.saturation == pytest.approx(want, abs=0)


@cuda
def test_hot_path_has_no_host_sync():
    from satmon.observe.counters import SaturationCounter
    from satmon.observe.saturation import SaturationHooks

    model = tiny_lit(alpha_init=50.0).cuda()
    layers = find_dyt_layers(model)
    hooks = SaturationHooks(layers, SaturationCounter(len(layers)).cuda()).attach()
    x = torch.randint(0, 256, (4, 16), device="cuda")
    model(x)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            model(x).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    hooks.flush()  # fold the queued sums into the counter's states
    assert int(hooks.counter.total.sum()) > 0
