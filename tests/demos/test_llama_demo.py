"""The demo LlamaLM (satmon.demos.llama): forward, causal mask, options."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from satmon import DyT
from satmon.demos.gpt import RMSNorm
from satmon.demos.llama import LlamaConfig, LlamaLM

D = 16


def test_llama_forward_shape_and_causal_mask():
    torch.manual_seed(0)
    model = LlamaLM(vocab_size=32, d_model=D, n_layers=2, n_heads=2, seq_len=8).eval()
    idx = torch.randint(0, 32, (3, 8))
    logits = model(idx)
    assert logits.shape == (3, 8, 32)
    changed = idx.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 32
    other = model(changed)
    torch.testing.assert_close(other[:, :5], logits[:, :5])
    assert not torch.allclose(other[:, 5:], logits[:, 5:])
    logits.float().mean().backward()
    assert model.blocks[0].attn_norm.alpha.grad is not None
    with pytest.raises(ValueError, match=r"Expected token ids of shape \(B, T\) with T <= seq_len=8, got \(1, 9\)"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_llama_norm_options_and_alpha_inits():
    m = LlamaLM(vocab_size=32, d_model=D, n_layers=1, n_heads=2, seq_len=8)
    assert type(m.norm_f) is RMSNorm and isinstance(m.blocks[0].mlp_norm, DyT)  # the default: RMSNorm before the head
    m = LlamaLM(vocab_size=32, d_model=D, n_layers=1, n_heads=2, seq_len=8, final_norm="dyt")
    assert isinstance(m.norm_f, DyT) and m.norm_f.bias is None
    alphas = [m.blocks[0].attn_norm.alpha.item(), m.blocks[0].mlp_norm.alpha.item(), m.norm_f.alpha.item()]
    assert alphas == pytest.approx([0.8, 0.2, 0.2])
    m = LlamaLM(
        LlamaConfig(vocab_size=32, d_model=D, n_layers=1, n_heads=2, seq_len=8, alpha_init=2.0, final_norm="dyt")
    )
    assert {n: p.item() for n, p in m.named_parameters() if n.endswith("alpha")} == {
        "blocks.0.attn_norm.alpha": 2.0,
        "blocks.0.mlp_norm.alpha": 2.0,
        "norm_f.alpha": 2.0,
    }
    m = LlamaLM(vocab_size=32, d_model=D, n_layers=1, n_heads=2, seq_len=8, norm="rmsnorm")
    assert type(m.norm_f) is RMSNorm and m.norm_f.eps == 1e-6
    x = torch.randn(2, 3, D)
    torch.testing.assert_close(m.norm_f(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    m = LlamaLM(vocab_size=32, d_model=D, n_layers=1, n_heads=2, seq_len=8, norm="layernorm")
    assert type(m.blocks[0].mlp_norm) is nn.LayerNorm and type(m.norm_f) is nn.LayerNorm  # the blocks' own norm
    assert m(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 32)


def test_llama_mlp_options_have_comparable_size():
    swiglu = LlamaLM(vocab_size=32, d_model=48, n_layers=1, n_heads=2, seq_len=8, mlp="swiglu").blocks[0].mlp
    gelu = LlamaLM(vocab_size=32, d_model=48, n_layers=1, n_heads=2, seq_len=8, mlp="gelu").blocks[0].mlp
    assert {n for n, _ in gelu.named_children()} == {"fc_in", "act", "fc_out"}
    assert {n for n, _ in swiglu.named_children()} == {"gate_proj", "up_proj", "down_proj"}
    n_s, n_g = (sum(p.numel() for p in m.parameters()) for m in (swiglu, gelu))
    assert abs(n_s - n_g) / n_g < 0.05


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"norm": "batchnorm"}, "Expected `norm` in"),
        ({"mlp": "relu"}, "Expected `mlp` in"),
        ({"final_norm": "tanh"}, "Expected `final_norm` in"),
        ({"d_model": 18, "n_heads": 4}, "Expected `d_model` divisible by `n_heads`"),
    ],
)
def test_llama_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig(**kwargs)
