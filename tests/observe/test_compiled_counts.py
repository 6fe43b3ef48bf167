"""A compiled model with satmon attached: no graph break at the DyT layers, and the counts of an eager run.

Dynamo's own counters (``torch._dynamo.utils.counters``) count the breaks. The ``aot_eager`` back end
runs the same ATen kernels as eager, so the two runs train the same weights and must count the same
elements; the hooks' count is traced into the model's graph (one reduction per input that a compiler
fuses), adding into the counter's states there.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from satmon import Screen
from satmon.demos.gpt import GPT, GPTConfig
from satmon.demos.llama import LlamaLM

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

WINDOW, STEPS = 6, 8


def _compile_works() -> str | None:
    try:
        torch.compile(lambda x: x * 2, backend="aot_eager")(torch.ones(2))
    except Exception as exc:
        return f"torch.compile is unsupported here: {type(exc).__name__}: {exc}"
    finally:
        dynamo.reset()
    return None


def _run(make, compiled: bool, **settings):
    torch.manual_seed(0)
    model = make()
    trained = torch.compile(model, backend="aot_eager") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    screen = Screen(window=WINDOW, verbose=False, log_every_n_steps=10**6, **settings).attach(trained)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randint(0, 64, (4, 17), generator=g)
        loss = nn.functional.cross_entropy(trained(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        screen.step(loss.detach())
    return screen


MODELS = {
    "gpt": lambda: GPT(GPTConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, seq_len=16, emb_std=1.0)),
    "llama": lambda: LlamaLM(vocab_size=64, d_model=32, n_layers=2, n_heads=2, seq_len=16),
}


# Every step counted (the default) and every other step (the hooks flip on and off: two graph variants). Sampled, the
# counted steps run the always-on graph too, so Llama (its gate statistics traced into the graph as well) runs sampled
# only; GPT runs both.
@pytest.mark.parametrize(("arch", "sample_every"), [("gpt", 1), ("gpt", 2), ("llama", 2)])
def test_no_graph_break_and_the_eager_counts(arch, sample_every):
    reason = _compile_works()
    if reason:
        pytest.skip(reason)
    eager = _run(MODELS[arch], compiled=False, sample_every=sample_every)
    dynamo.reset()
    counters.clear()
    try:
        compiled = _run(MODELS[arch], compiled=True, sample_every=sample_every)
        breaks = dict(counters["graph_break"])
        graphs = counters["stats"]["unique_graphs"]
    finally:
        dynamo.reset()
    assert breaks == {}, breaks
    assert graphs <= 4, f"{graphs} graphs compiled"  # sampled steps flip the hooks on and off: two variants
    assert compiled.verdict is not None and eager.verdict is not None
    assert compiled.verdict.elements == eager.verdict.elements > 0
    assert compiled.verdict.per_layer == eager.verdict.per_layer
    assert compiled.verdict.saturation == eager.verdict.saturation
    if arch == "gpt":
        # embeddings at std 1: a real mix of saturated and unsaturated elements
        assert 0.0 < eager.verdict.saturation < 1.0
