"""Review of 0.3's faults and bad input (round 3): faults and inputs beyond the fault matrix's cases."""

from __future__ import annotations

import pytest
import torch

from satmon.dyt import DyT
from satmon.replay.checkpoints import inspect_checkpoint, order_checkpoints
from satmon.replay.loop import ModelLoader, replay


class _Stateful(torch.nn.Module):
    """A model whose forward leaves state outside its state_dict: a non-persistent buffer it updates, or a cache of a
    weight filled at the first forward (a merged projection, a rotary table): a reused model would read stale state."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.d, self.b, self.n = torch.nn.Linear(6, 8), DyT(8), torch.nn.Linear(8, 6), torch.nn.LayerNorm(6)
        self.register_buffer("scale", torch.ones(8), persistent=False)
        self._cache: torch.Tensor | None = None
        self.seen: dict[int, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.a.weight
        if self.how == "buffer":
            self.scale.mul_(2.0)
        elif self.how == "cache":
            if self._cache is None:
                self._cache = self.a.weight.detach().clone()
            w = self._cache
        elif self.how == "dict":
            w = self.seen.setdefault(0, self.a.weight.detach().clone())
        return self.n(self.b(self.d(torch.nn.functional.linear(x, w, self.a.bias) * self.scale)))


@pytest.mark.parametrize("how", ["buffer", "cache", "dict", "none"])
def test_state_a_forward_leaves_outside_the_state_dict_never_reaches_the_next_checkpoint(tmp_path, how):
    """Each record equals replaying its checkpoint alone (fresh model, fresh twin), whatever the forward left behind."""
    paths = []
    for i in range(3):
        torch.manual_seed(10 + i)
        net = _Stateful(how)
        with torch.no_grad():
            net.d.alpha.fill_(0.5 + i)
        paths.append(tmp_path / f"w{i}.pt")
        torch.save({"model": net.state_dict(), "iter_num": i}, paths[-1])
    batches = [torch.randn(16, 6, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    built = []

    def factory():
        built.append(1)
        return _Stateful(how)

    def readings(record):
        assert record.error is None, record.error
        d = record.report.to_dict()
        d.pop("elapsed_s", None)
        return d

    together = [readings(r) for r in replay(order_checkpoints([inspect_checkpoint(p) for p in paths]),
                                            ModelLoader(factory=factory), batches)]
    n_together = len(built)
    alone = [readings(next(iter(replay([inspect_checkpoint(p)], ModelLoader(factory=factory), batches))))
             for p in paths]
    assert together == alone
    assert len({d["verdict"]["saturation"] for d in together}) == 3
    if how == "none":  # nothing left behind: still one model and one twin for the three (and the meta check)
        assert n_together == 3
