"""Forward passes that leave a model as they found it: mode, grad mode, autocast, RNG, buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

__all__ = ["frozen_forward", "reshard_fsdp"]


def reshard_fsdp(model: nn.Module) -> None:
    """Reshard every FSDP2 module of ``model`` (no collective; nothing else happens without FSDP2).

    A no-grad forward leaves FSDP2's root unsharded (``reshard_after_forward=False``), and the next
    training step then runs on those no-grad parameters instead of gathering its own: measured on
    torch 2.13, its loss and updates differ from the same run without the extra forward. satmon's
    own forwards (probe, gating trace) reshard afterwards, so training goes on as it would have.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


@contextlib.contextmanager
def frozen_forward(
    model: nn.Module,
    device: torch.device,
    *,
    train_mode: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> Iterator[Callable[[], None]]:
    """Run forwards without gradients, in eval mode (or train mode), optionally under autocast.

    On exit, also on error, every module's own ``training`` flag, the grad mode, the RNG state (CPU,
    and ``device`` when it is CUDA) and, with ``train_mode``, every buffer (e.g. BatchNorm
    statistics) are back to what they were. Parameters are never written. Yields ``rewind()``, which
    puts the RNG and buffers back to their state at entry: a second pass over the same batches then
    computes exactly what the first did (the same dropout masks in train mode).

    Args:
        model: the model to run.
        device: where the forwards run (its RNG is saved when it is a CUDA device).
        train_mode: run in train mode instead of eval mode.
        autocast_dtype: run under ``torch.autocast(device.type, dtype=autocast_dtype)``.

    Example:
        >>> m = torch.nn.Dropout(0.5)
        >>> with frozen_forward(m, torch.device("cpu"), train_mode=True) as rewind:
        ...     a = m(torch.ones(8)); rewind(); b = m(torch.ones(8))
        >>> torch.equal(a, b), m.training, torch.is_grad_enabled()
        (True, True, True)
    """
    modes = [(m, m.training) for m in model.modules()]
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()] if train_mode else []
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    cpu_rng = torch.get_rng_state()
    cuda_rng = [torch.cuda.get_rng_state(i) for i in cuda]

    def rewind() -> None:
        torch.set_rng_state(cpu_rng)
        for i, state in zip(cuda, cuda_rng):
            torch.cuda.set_rng_state(state, i)
        with torch.no_grad():
            for b, saved in saved_buffers:
                b.copy_(saved)

    autocast = (
        torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    )
    try:
        model.train(train_mode)
        with torch.no_grad(), autocast:
            yield rewind
    finally:
        for m, was_training in modes:
            m.training = was_training
        rewind()
        reshard_fsdp(model)
