"""Gate-statistics hooks on the gated (SwiGLU/GeGLU) MLPs a DyT feeds. Counting only; the
collapse watch decides and the writers log.

Gate statistics, per gated block (the DyT feeding it is named by the block's key):

- ``flat_fraction``: share of gate pre-activations ``g`` in the activation's flat negative tail
  (``g < t`` with ``|act'| < 0.05`` below ``t``: SiLU ``t = -4.08``; see :mod:`satmon.functional.gate`):
  gates that pass nothing and no gradient.
- ``mean_abs_hidden``: mean ``|act(g) * up(h)|``, read as the input of the ``down`` projection.

Both are NaN for a block that saw no data, as :func:`satmon.functional.gate.gate_stats_finalize` says.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from satmon.functional.gate import ACTIVATIONS, abs_sum, flat_count, flat_threshold, gate_stats_finalize, split_gate_up
from satmon.model.discovery import modules_by_name
from satmon.observe.hookset import HookSet, recomputing
from satmon.observe.states import SumStates
from satmon.results.gating import GatingInfo

__all__ = ["GateCounter", "GateHooks"]


class GateCounter(SumStates):
    """Per gated block: flat gate count, gate element count, sum and count of ``|down input|`` (summed over ranks).

    The two updates are :mod:`satmon.functional.gate`'s sums (:func:`~satmon.functional.gate.flat_count`,
    :func:`~satmon.functional.gate.abs_sum`) and :meth:`compute` its
    :func:`~satmon.functional.gate.gate_stats_finalize`: the same formulas as the one-shot
    :func:`~satmon.functional.gate.gate_stats`.

    Example:
        >>> c = GateCounter(1)
        >>> c.update_gate(0, torch.tensor([-6.0, 0.0, 2.0, -5.0]), threshold=-4.0826)
        >>> c.update_hidden(0, torch.tensor([1.0, -3.0]))
        >>> c.compute()
        [{'flat_fraction': 0.5, 'mean_abs_hidden': 2.0}]
    """

    n_flat: Tensor
    n_gate: Tensor
    sum_hidden: Tensor
    n_hidden: Tensor

    def __init__(self, num_blocks: int) -> None:
        super().__init__()
        for name, dtype in (
            ("n_flat", torch.int64),
            ("n_gate", torch.int64),
            ("sum_hidden", torch.float64),
            ("n_hidden", torch.int64),
        ):
            self.add_state(name, torch.zeros(num_blocks, dtype=dtype))

    def update_gate(self, index: int, gate: Tensor, threshold: float) -> None:
        """Add block ``index``'s gate pre-activations (the count of ``g < threshold`` only: no ``act(g)``, no sum)."""
        self.n_flat.select(0, index).add_(flat_count(gate, threshold))
        self.n_gate.select(0, index).add_(gate.numel())

    def update_hidden(self, index: int, hidden: Tensor) -> None:
        """Add block ``index``'s ``down`` input ``act(g) * up(h)`` (float64 sum of its magnitudes)."""
        self.sum_hidden.select(0, index).add_(abs_sum(hidden))
        self.n_hidden.select(0, index).add_(hidden.numel())

    def compute(self, sync: bool = False) -> list[dict[str, float]]:
        """Per block: ``flat_fraction`` and ``mean_abs_hidden`` (NaN without data), in one transfer; ``sync``
        sums over ranks first (every rank at the same point)."""
        s = self.synced(sync)
        packed = torch.stack([s[k].to(torch.float64) for k in ("n_flat", "n_gate", "sum_hidden", "n_hidden")])
        rows = packed.cpu().tolist()  # one transfer (counts exact below 2**53)
        return [
            {
                "flat_fraction": gate_stats_finalize(int(f), int(g), 0.0)["flat_fraction"],
                "mean_abs_hidden": gate_stats_finalize(0, int(h), sh)["mean_abs_hidden"],
            }
            for f, g, sh, h in zip(*rows)
        ]


class GateHooks(HookSet):
    """Hooks on each gated block's gate (or fused gate-up) projection and on its ``down`` input.

    The statistics are :mod:`satmon.functional.gate`'s: the hooks count with :func:`flat_count`
    and :func:`split_gate_up`, and :meth:`readings` divides with :func:`gate_stats_finalize`, so a
    block that saw no data reads NaN (never 0.0). A gate whose activation has no known flat region
    (ReLU, sigmoid, ...) or a pairing without hookable modules also reads NaN.

    Args:
        model: the model holding the modules.
        gating: the :class:`~satmon.results.gating.GatingInfo` (its pairings name the modules).
        counter: a :class:`GateCounter` with one slot per pairing, in ``gating.pairings`` order.

    Example:
        >>> from satmon.model.gating import detect_gating
        >>> from satmon.demos.llama import LlamaLM
        >>> model = LlamaLM(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
        >>> report = detect_gating(model, example_input=torch.zeros(1, 8, dtype=torch.long))  # gating from a forward
        >>> hooks = GateHooks(model, report, GateCounter(len(report.pairings)))
        >>> hooks.readings()  # nothing seen yet: NaN, not 0.0
        {'blocks.0.mlp_norm': {'flat_fraction': nan, 'mean_abs_hidden': nan}}
    """

    def __init__(self, model: nn.Module, gating: GatingInfo, counter: GateCounter) -> None:
        modules = modules_by_name(model)
        super().__init__()
        self.blocks = list(gating.pairings)
        self.counter = counter
        self._targets: list[tuple[int, nn.Module | None, nn.Module | None, bool, bool, float | None]] = []
        for i, p in enumerate(gating.pairings.values()):
            hookable = p.gate_stats
            gate = modules.get(p.gate) if hookable else None
            down = modules.get(p.down) if hookable and p.down else None
            t = flat_threshold(p.activation) if p.activation in ACTIVATIONS else None  # no flat tail known: NaN
            self._targets.append((i, gate, down, p.fused, p.gate_first, t))

    def _register(self) -> list[RemovableHandle]:
        handles = []
        for i, gate, down, fused, gate_first, t in self._targets:
            if gate is not None and t is not None:
                handles.append(gate.register_forward_hook(self._gate_hook(i, fused, gate_first, t)))
            if down is not None:
                handles.append(down.register_forward_pre_hook(self._down_hook(i)))
        return handles

    def _gate_hook(self, i: int, fused: bool, gate_first: bool, t: float):
        def hook(mod: nn.Module, args: tuple, out: Tensor) -> None:
            if not self.enabled or not isinstance(out, Tensor) or recomputing():
                return
            with torch.no_grad():
                self.counter.update_gate(i, split_gate_up(out, gate_first=gate_first)[0] if fused else out, t)

        return hook

    def _down_hook(self, i: int):
        def hook(mod: nn.Module, args: tuple) -> None:
            if not self.enabled or not args or not isinstance(args[0], Tensor) or recomputing():
                return
            with torch.no_grad():
                self.counter.update_hidden(i, args[0])

        return hook

    def readings(self, sync: bool = True) -> dict[str, dict[str, float]]:
        """Per gated block: ``flat_fraction`` and ``mean_abs_hidden``, NaN without data (a host transfer; with
        ``sync`` the sums over ranks first, a collective every rank must reach; the probe reads its own only)."""
        return dict(zip(self.blocks, self.counter.compute(sync=sync)))
