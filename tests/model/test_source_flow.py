"""The forward-source reader behind the names fallback: what a child's call receives, which projections a
forward multiplies, and "cannot tell" (never "no") where the source cannot be followed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lookalikes import ChunkedGLU, D, H, PostNormBlock, PreNormBlock, SwiGLU
from torch import nn

from satmon.model.source_flow import (
    argument_origin,
    called_children,
    multiplied_projections,
)


def test_what_a_call_receives_through_variables_views_dropout_and_additions():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.drop, self.mlp, self.attn = nn.LayerNorm(D), nn.Dropout(0.1), SwiGLU(), nn.Linear(D, D)

        def forward(self, hidden_states, mask=None):
            residual = hidden_states
            h = self.ln(hidden_states)
            out, _ = self.attn(h), None
            h2 = self.drop(h).to(torch.float32).view(h.shape)  # still the norm's output
            mixed = residual + out
            return self.mlp(h2) + self.mlp(mixed) + self.attn(hidden_states)

    b = Block()
    direct, mixed = argument_origin(b, "mlp")
    assert (direct.kind, direct.name, direct.part) == ("child", "ln", "")
    assert mixed.kind == "mix" and ("attn", "") in mixed.sources
    assert [o.kind for o in argument_origin(b, "attn")] == ["child", "arg"]
    assert called_children(b) == ["ln", "attn", "mlp", "mlp", "attn"]
    assert argument_origin(b, "nothing") is None


def test_post_norm_source_reads_as_an_addition_and_pre_norm_as_the_norm():
    (post,) = argument_origin(PostNormBlock(nn.LayerNorm), "mlp")
    assert post.kind == "mix" and ("norm_a", "") in post.sources  # h = x + norm_a(attn(x))
    (after,) = argument_origin(PostNormBlock(nn.LayerNorm), "norm_f")
    assert (after.kind, after.name) == ("child", "mlp")  # norm_f normalises the MLP's output
    (pre,) = argument_origin(PreNormBlock(nn.LayerNorm), "mlp")
    assert (pre.kind, pre.name) == ("child", "norm_2")


def test_which_projections_a_forward_multiplies():
    assert multiplied_projections(SwiGLU()) == ("gate_proj", "up_proj")
    assert multiplied_projections(ChunkedGLU()) == ("w_in",)  # two halves of one projection
    assert multiplied_projections(nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D))) == ()

    class WrittenOutGelu(nn.Module):  # one branch times itself: an activation, not a gate
        def __init__(self):
            super().__init__()
            self.fc, self.proj = nn.Linear(D, H), nn.Linear(H, D)

        def forward(self, x):
            h = self.fc(x)
            return self.proj(0.5 * h * (1.0 + torch.tanh(0.79788456 * (h + 0.044715 * h**3))))

    class Helper(nn.Module):  # the product happens in a function satmon cannot see into: it may be a gate
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(D, H), nn.Linear(D, H), nn.Linear(H, D)

        def forward(self, x):
            return self.c(_swiglu(self.a(x), self.b(x)))

    class Experts(nn.Module):  # experts as 3-D parameters, F.linear on a slice of each
        def __init__(self):
            super().__init__()
            self.gate_up = nn.Parameter(torch.randn(2, 2 * H, D))
            self.down = nn.Parameter(torch.randn(2, D, H))

        def forward(self, x):
            out = 0
            for e in range(2):
                g, u = F.linear(x, self.gate_up[e]).chunk(2, dim=-1)
                out = out + F.linear(F.silu(g) * u, self.down[e])
            return out

    assert multiplied_projections(WrittenOutGelu()) == ()
    assert multiplied_projections(Helper()) == ("a", "b")
    assert multiplied_projections(Experts()) == ("param:gate_up",)


def _swiglu(a, b):
    return F.silu(a) * b


def test_no_source_is_cannot_tell():
    ns: dict = {}
    exec("def forward(self, x):\n    return self.mlp(self.ln(x))\n", ns)
    sourceless = type("Sourceless", (nn.Module,), {"forward": ns["forward"]})()
    assert argument_origin(sourceless, "mlp") is None and called_children(sourceless) is None
    assert multiplied_projections(sourceless) is None
