"""Dynamic Tanh (DyT), the normalization-free drop-in for LayerNorm.

Zhu, Chen, He, LeCun, Liu, "Transformers without Normalization" (2025):

    DyT(x) = weight * tanh(alpha * x) + bias        alpha: one learnable scalar
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["DyT"]


class DyT(nn.Module):
    r"""Dynamic Tanh: ``weight * tanh(alpha * x) + bias`` with a scalar learnable ``alpha``.

    Args:
        normalized_shape: number of channels ``C`` (an int, or a 1-tuple as ``nn.LayerNorm`` takes it).
        alpha_init: initial value of the scalar ``alpha``. The DyT paper's default is 0.5; the
            regime study that calibrated satmon's 0.43 threshold used 2.0.
        bias: learn an additive ``bias`` (GPT-2 style). LLaMA-style models drop it.
        channels_last: ``True`` for ``(..., C)`` inputs (transformers), ``False`` for
            channels-first ``(B, C, H, W)`` inputs. Only the broadcast of ``weight``/``bias`` changes;
            saturation is elementwise either way.

    Example:
        >>> import torch
        >>> from satmon import DyT
        >>> norm = DyT(4, alpha_init=2.0)
        >>> y = norm(torch.zeros(2, 3, 4))   # (B, T, C)
        >>> tuple(y.shape), float(norm.alpha)
        ((2, 3, 4), 2.0)
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int],
        alpha_init: float = 0.5,
        bias: bool = True,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, (tuple, list, torch.Size)):
            if len(normalized_shape) != 1:
                raise ValueError(
                    f"Expected `normalized_shape` to be an int or a 1-tuple (channels), got {tuple(normalized_shape)}."
                    " DyT normalizes over one channel dimension; pass the channel count."
                )
            normalized_shape = int(normalized_shape[0])
        if int(normalized_shape) <= 0:
            raise ValueError(f"Expected `normalized_shape` > 0, got {normalized_shape}.")
        self.normalized_shape = (int(normalized_shape),)
        if not math.isfinite(float(alpha_init)):
            raise ValueError(f"Expected a finite `alpha_init`, got {alpha_init!r}: the DyT paper's default is 0.5.")
        self.alpha_init = float(alpha_init)
        self.channels_last = channels_last
        self.alpha = nn.Parameter(torch.empty(1))
        self.weight = nn.Parameter(torch.empty(self.normalized_shape))
        self.bias = nn.Parameter(torch.empty(self.normalized_shape)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``alpha`` to ``alpha_init``, ``weight`` to ones, ``bias`` to zeros: the init, again.

        A model made on the meta device and materialised with ``to_empty()`` holds whatever was in memory until
        this runs (PyTorch's and FSDP2's idiom calls ``reset_parameters()`` on every module that has one).

        Example:
            >>> norm = DyT(3, alpha_init=0.8)
            >>> _ = norm.alpha.data.fill_(float("nan"))
            >>> norm.reset_parameters()
            >>> float(norm.alpha), norm.weight.tolist(), norm.bias.tolist()
            (0.800000011920929, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
        """
        self.alpha.fill_(self.alpha_init)
        self.weight.fill_(1.0)
        if self.bias is not None:
            self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        x = torch.tanh(self.alpha * x)
        if self.channels_last:
            x = x * self.weight
            return x + self.bias if self.bias is not None else x
        shape = (-1,) + (1,) * (x.dim() - 2)  # (C, 1, 1) for (B, C, H, W)
        x = x * self.weight.view(shape)
        return x + self.bias.view(shape) if self.bias is not None else x

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape[0]}, alpha_init={self.alpha_init}, bias={self.bias is not None}, "
            f"channels_last={self.channels_last}"
        )
