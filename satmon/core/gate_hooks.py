"""Collapse watch for DyT feeding gated (SwiGLU/GeGLU) MLPs: gate-statistics hooks and a
device-side loss history. Counting only; the callback decides and the writers log.

Gate statistics, per gated block (the DyT feeding it is named by the block's key):

- ``flat_fraction``: share of gate pre-activations ``g`` in the activation's flat negative tail
  (``g < t`` with ``|act'| < 0.05`` below ``t``: SiLU ``t = -4.08``; see :mod:`satmon.functional.gate`):
  gates that pass nothing and no gradient.
- ``mean_abs_hidden``: mean ``|act(g) * up(h)|``, read as the input of the ``down`` projection.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from torchmetrics import Metric

from satmon.functional.gate import flat_count, flat_threshold, split_gate_up
from satmon.core.gated_mlp import GatingReport
from satmon.core.hookset import HookSet

__all__ = ["GateCounter", "GateHooks", "LossHistory"]


class GateCounter(Metric):
    """Per gated block: flat gate count, gate element count, sum and count of ``|down input|`` (summed over ranks)."""

    full_state_update = False
    n_flat: Tensor
    n_gate: Tensor
    sum_hidden: Tensor
    n_hidden: Tensor

    def __init__(self, num_blocks: int, **kwargs) -> None:
        super().__init__(**kwargs)
        for name, dtype in (("n_flat", torch.int64), ("n_gate", torch.int64), ("sum_hidden", torch.float64), ("n_hidden", torch.int64)):
            self.add_state(name, default=torch.zeros(num_blocks, dtype=dtype), dist_reduce_fx="sum")

    def update(self, *args) -> None:  # hooks write the states directly
        raise NotImplementedError("GateCounter is fed by GateHooks.")

    def compute(self) -> dict[str, Tensor]:
        return {"n_flat": self.n_flat, "n_gate": self.n_gate, "sum_hidden": self.sum_hidden, "n_hidden": self.n_hidden}


class GateHooks(HookSet):
    """Hooks on each gated block's gate (or fused gate-up) projection and on its ``down`` input.

    Args:
        model: the model holding the modules.
        gating: the :class:`~satmon.core.gated_mlp.GatingReport` (its pairings name the modules).
        counter: a :class:`GateCounter` with one slot per pairing, in ``gating.pairings`` order.
    """

    def __init__(self, model: nn.Module, gating: GatingReport, counter: GateCounter) -> None:
        from satmon.discovery import strip_wrappers

        modules = {strip_wrappers(n): m for n, m in model.named_modules()}
        super().__init__()
        self.blocks = list(gating.pairings)
        self.counter = counter
        self._targets = []
        for i, (norm, p) in enumerate(gating.pairings.items()):
            act = p.activation if p.activation in ("silu", "gelu", "gelu_tanh") else "silu"
            self._targets.append((i, modules[p.gate], modules[p.down], p.fused, flat_threshold(act)))

    def _register(self) -> list[RemovableHandle]:
        handles = []
        for i, gate, down, fused, t in self._targets:
            handles.append(gate.register_forward_hook(self._gate_hook(i, fused, t)))
            handles.append(down.register_forward_pre_hook(self._down_hook(i)))
        return handles

    def _gate_hook(self, i: int, fused: bool, t: float):
        def hook(mod: nn.Module, args: tuple, out: Tensor) -> None:
            if not self.enabled:
                return
            with torch.no_grad():
                g = split_gate_up(out)[0] if fused else out
                self.counter.n_flat.select(0, i).add_(flat_count(g, t))  # only the count: no act(g), no sum
                self.counter.n_gate.select(0, i).add_(g.numel())

        return hook

    def _down_hook(self, i: int):
        def hook(mod: nn.Module, args: tuple) -> None:
            if not self.enabled or not args:
                return
            with torch.no_grad():
                h = args[0].detach()
                self.counter.sum_hidden.select(0, i).add_(h.abs().sum(dtype=torch.float64))
                self.counter.n_hidden.select(0, i).add_(h.numel())

        return hook

    def readings(self) -> dict[str, dict[str, float]]:
        """Per gated block: ``flat_fraction`` and ``mean_abs_hidden`` (syncs ranks and the host)."""
        with self.counter.sync_context(should_sync=True, should_unsync=True):
            packed = torch.stack([getattr(self.counter, k).to(torch.float64) for k in ("n_flat", "n_gate", "sum_hidden", "n_hidden")])
            n_flat, n_gate, s_hidden, n_hidden = packed.cpu().tolist()  # one transfer
        return {
            b: {"flat_fraction": f / g if g else 0.0, "mean_abs_hidden": s / h if h else 0.0}
            for b, f, g, s, h in zip(self.blocks, n_flat, n_gate, s_hidden, n_hidden)
        }


class LossHistory:
    """Training losses kept in a device ring buffer (no host sync per step), read at checks.

    Args:
        capacity: how many recent losses are kept (baseline + recent).
        device: where the buffer lives (the loss's device).
    """

    def __init__(self, capacity: int, device: torch.device | str = "cpu") -> None:
        self.buffer = torch.full((capacity,), float("nan"), dtype=torch.float32, device=device)
        self.capacity = capacity
        self.written = 0  # host counter of pushes
        self.last_read = 0

    def push(self, loss: Tensor) -> None:
        self.buffer[self.written % self.capacity] = loss.detach().to(torch.float32).reshape(())
        self.written += 1

    def read(self) -> tuple[list[float], list[float]]:
        """``(baseline, recent)``: losses before the last read and since it, oldest first (one host transfer)."""
        n = min(self.written, self.capacity)
        values = self.buffer.cpu().tolist()
        start = self.written - n
        ordered = [values[i % self.capacity] for i in range(start, self.written)]
        k = min(self.written - self.last_read, n)
        self.last_read = self.written
        return ordered[: n - k], ordered[n - k :]
