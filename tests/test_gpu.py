"""GPU-only checks (skipped without CUDA): FSDP, bf16 autocast, and no host sync in the hot path.

Lightning's FSDP strategy needs a GPU accelerator, so FSDP cannot be tested on the CPU-only CI;
these run wherever a GPU is present (``python -m pytest tests/test_gpu.py``).
"""

import pytest
import torch

from helpers import InputRecorder, tiny_lit, token_loader, trainer
from satmon import SaturationMonitor
from satmon.discovery import find_dyt_layers

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_counts_on_gpu_match_float64_reference(tmp_path, strategy):
    lit = tiny_lit(alpha_init=50.0)
    names = [l.name for l in find_dyt_layers(lit)]
    rec = InputRecorder(lit, names)
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=0)
    trainer(tmp_path, accelerator="cuda", devices=1, strategy=strategy, max_steps=3, callbacks=[monitor]).fit(lit, token_loader(3))
    ref = rec.counts()
    sat = sum(s for s, _ in ref.values())
    tot = sum(t for _, t in ref.values())
    assert monitor.verdict.saturation == pytest.approx(sat / tot, abs=0)


@cuda
def test_bf16_autocast_counts_exact(tmp_path):
    lit = tiny_lit(alpha_init=50.0)
    names = [l.name for l in find_dyt_layers(lit)]
    rec = InputRecorder(lit, names)
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=0)
    trainer(tmp_path, accelerator="cuda", devices=1, precision="bf16-mixed", max_steps=3, callbacks=[monitor]).fit(lit, token_loader(3))
    ref = rec.counts()
    assert monitor.verdict.saturation == pytest.approx(sum(s for s, _ in ref.values()) / sum(t for _, t in ref.values()), abs=0)


@cuda
def test_hot_path_has_no_host_sync():
    from satmon.core.saturation_hooks import SaturationCounter, SaturationHooks

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
    hooks.counter.flush()
    assert int(hooks.counter.total.sum()) > 0
