"""The LLaMA demo's final-norm trap, trained for real (about 15 s): with DyT before the head the model saturates
that norm on an offset and no gradient reaches below the head; LlamaLM's default (RMSNorm there) learns."""

from __future__ import annotations

import pytest
import torch

from satmon.cli.demo import heldout_loss, unigram_loss
from satmon.demos.corpus import CorpusDataModule
from satmon.demos.lit import LitLM

STEPS, FROM = 120, 60  # the trap closes by step ~45 at this size; its readings are checked from step 60


@pytest.fixture(scope="module")
def runs() -> dict:
    """Both final norms from the same seed on the same batches (the demo's optimizer, a 20-step warm-up), and the
    byte-unigram level on the same held-out targets."""
    dm = CorpusDataModule(seq_len=32, batch_size=8, train_tokens=100_000, val_tokens=8_000, seed=0)
    dm.setup("fit")
    out = {"unigram": unigram_loss(dm, 16)}
    for final in ("default", "dyt"):
        torch.manual_seed(0)
        kw = {} if final == "default" else {"final_norm": "dyt"}
        lit = LitLM(arch="llama", d_model=64, n_layers=2, n_heads=4, seq_len=32, lr=3e-3, warmup=20, **kw)
        model, opt = lit.model, lit.configure_optimizers()
        seen: dict[str, torch.Tensor] = {}
        model.norm_f.register_forward_hook(lambda m, i, o, seen=seen: seen.__setitem__("x", i[0].detach()))
        below, at_one, step = {}, {}, 0
        while step < STEPS:
            for batch in dm.train_dataloader():
                step += 1
                loss = lit._loss(batch)
                opt["optimizer"].zero_grad(set_to_none=True)
                loss.backward()
                if step >= FROM:
                    below[step] = max(
                        float(p.grad.abs().max())
                        for n, p in model.named_parameters()
                        if n.startswith(("tok_emb.", "blocks."))
                    )
                    if final == "dyt":
                        at_one[step] = float(
                            (torch.tanh(model.norm_f.alpha.detach() * seen["x"]).abs() == 1).float().mean()
                        )
                opt["optimizer"].step()
                opt["lr_scheduler"]["scheduler"].step()
                if step == STEPS:
                    break
        out[final] = {"model": model, "loss": heldout_loss(model, dm, 16), "below": below, "at_one": at_one}
    return out


def test_the_default_final_norm_learns_well_below_the_trapped_model(runs):
    default, trapped, unigram = runs["default"]["loss"], runs["dyt"]["loss"], runs["unigram"]
    assert type(runs["default"]["model"].norm_f).__name__ == "RMSNorm"
    assert trapped > unigram - 0.1  # the trapped model has learnt no more than the byte frequencies
    assert default < unigram - 0.5 and default < trapped - 0.5, (default, trapped, unigram)
    assert min(runs["default"]["below"].values()) > 1e-4  # gradient reaches the embedding and the blocks throughout


def test_a_dyt_final_norm_saturates_and_no_gradient_reaches_below_the_head(runs):
    below, at_one = runs["dyt"]["below"], runs["dyt"]["at_one"]
    # tanh exactly +-1 in float32 on every element on most steps from step 60, and on 99% of them on every step
    assert sum(v == 1.0 for v in at_one.values()) >= 0.8 * len(at_one) and min(at_one.values()) > 0.99, at_one
    # wherever it is fully saturated the gradient to the embedding and every block is exactly 0 (an element left
    # unsaturated, on the other steps, lets some through: the late escapes of longer runs)
    assert all(below[s] == 0.0 for s, v in at_one.items() if v == 1.0)
    assert sum(v == 0.0 for v in below.values()) >= 0.8 * len(below), below
