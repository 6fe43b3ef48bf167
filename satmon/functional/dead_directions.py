r"""Dead directions of normalisation layers: covariance kernel, alignment, sigma_min, norm type.

Pure math in float64: no hooks, no Lightning, no files. The science: docs/science/science.md ("Dead
directions"; Shirodkar, Narayanan, 2026, "Algebraic Dead Directions in LayerNorm Transformers");
the readings and their tolerances: docs/science/dead_directions.md.

LayerNorm ``y = gamma * (x - mean(x)) / std(x) + beta``: the normalised part sums to zero over
channels, so ``sum_i y_i / gamma_i`` is the same for every token and

.. math::

    v^* = \gamma^{-1} / \lVert \gamma^{-1} \rVert

is an exact kernel vector of the centred covariance ``C`` of ``y``. RMSNorm has no mean
subtraction and no such kernel. A channel with ``gamma_i = 0`` (or ~1e-30) is constant and is
a kernel vector ``e_i`` of its own; with ``k >= 1`` of them the kernel is their span (dim ``k``)
and ``v*`` (its limit) lies inside it.

Tolerances (module constants, each the default of a keyword argument):

- ``NULL_RTOL = 1e-10``: an eigenvalue of ``C`` is null when ``<= NULL_RTOL * max eigenvalue``.
  A float32 LayerNorm forward leaves its kernel at ~1e-14 of the top eigenvalue (rounding of
  the outputs), a float64 one at the float64 floor (<= ~1e-15); float64 ``eigh`` resolves
  ~``d * 2.2e-16`` (< 1e-11 for ``d <= 4e4``); RMSNorm layers sit at 1e-4 and above. bf16
  outputs lift the LayerNorm kernel to ~1e-6: measure with a float32 (or wider) forward, and take
  gamma as the forward used it (a bf16-rounded gamma is the one whose ``v*`` is the kernel).
- ``DEGENERATE_EPS_REL = 1e-5 = sqrt(NULL_RTOL)``: ``|gamma_i| <= 1e-5 * max|gamma|`` marks a
  degenerate (dead) channel; its variance is ~``(1e-5)^2`` of its peers', at the null tolerance.
- ``LAYERNORM_MAX_DEPTH = 1e-9``, ``RMSNORM_MIN_DEPTH = 1e-3``: the norm-type rule, see
  :func:`classify_norm_type`.
- ``INIT_GAP_FLOOR = 1e-12``: the floor of :func:`init_gap`.

Host syncs: :class:`CovarianceAccumulator` updates never sync; the readouts (``alignment``,
``null_space``'s ``dim``, ``sigma_min``...) read small results back to the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

__all__ = [
    "DEGENERATE_EPS_REL",
    "INIT_GAP_FLOOR",
    "LAYERNORM_MAX_DEPTH",
    "NULL_RTOL",
    "RMSNORM_MIN_DEPTH",
    "Alignment",
    "CovarianceAccumulator",
    "CovarianceState",
    "GramSpectrum",
    "InitGap",
    "NormType",
    "NullSpace",
    "SigmaMinProfile",
    "alignment",
    "classify_model_norm_type",
    "classify_norm_type",
    "degenerate_coordinates",
    "gram_spectrum",
    "init_gap",
    "null_space",
    "sigma_min",
    "sigma_min_profile",
    "v_star",
]

NULL_RTOL = 1e-10
DEGENERATE_EPS_REL = 1e-5
LAYERNORM_MAX_DEPTH = 1e-9
RMSNORM_MIN_DEPTH = 1e-3
INIT_GAP_FLOOR = 1e-12

_F64 = torch.float64
_EPS64 = torch.finfo(_F64).eps
_TINY64 = torch.finfo(_F64).tiny

NormType = Literal["layernorm-like", "rmsnorm-like", "undetermined"]


# ----------------------------------------------------------------------------- accumulator


class CovarianceState(NamedTuple):
    """The four tensors of a :class:`CovarianceAccumulator`; each one sums over batches and ranks."""

    count: Tensor  # () int64, finite rows
    total: Tensor  # (d,) float64, sum of rows
    outer: Tensor  # (d, d) float64, sum of outer products = X^T X
    nonfinite_rows: Tensor  # () int64, rows skipped


class CovarianceAccumulator:
    r"""Streaming, mergeable, exact centred covariance of ``(..., d)`` activations, in float64.

    State (all on one device, create it on the activations' device to avoid copies): the count
    ``n`` of finite rows, their sum ``s = sum_t x_t`` ``(d,)`` and the sum of outer products
    ``S = sum_t x_t x_t^T = X^T X`` ``(d, d)``, plus the count of skipped rows. Then

    .. math::

        \mu = s / n, \qquad C = S / n - \mu \mu^T \quad \text{(population covariance, divides by n)}.

    Batched updates, merges and an all_reduce of the state all add the same sums, so they equal
    one update over the concatenation up to float64 rounding. The sums are raw (not shifted), so
    the absolute rounding floor of ``C`` is ~``2.2e-16 * (mu_i^2 + var_i)``: far below
    :data:`NULL_RTOL` unless ``|mu| > ~1e2 * std``.

    A row (token) with any non-finite entry is skipped and counted in :attr:`nonfinite_rows`;
    no NaN reaches the state. :meth:`update` never syncs with the host.

    Args:
        dim: the channel count ``d``.
        device: where the state lives (default CPU).

    Example:
        >>> import torch
        >>> acc = CovarianceAccumulator(2)
        >>> _ = acc.update(torch.tensor([[1.0, 0.0], [3.0, 2.0], [float("nan"), 1.0]]))
        >>> acc.count, acc.nonfinite_rows
        (2, 1)
        >>> acc.mean().tolist(), acc.covariance().tolist()
        ([2.0, 1.0], [[1.0, 1.0], [1.0, 1.0]])
    """

    def __init__(self, dim: int, device: torch.device | str | None = None) -> None:
        if int(dim) <= 0:
            raise ValueError(f"Expected `dim` > 0, got {dim}. Pass the channel count d of the activations.")
        self.dim = int(dim)
        self._count = torch.zeros((), dtype=torch.int64, device=device)
        self._nonfinite = torch.zeros((), dtype=torch.int64, device=device)
        self.total = torch.zeros(self.dim, dtype=_F64, device=device)
        self.outer = torch.zeros(self.dim, self.dim, dtype=_F64, device=device)

    @property
    def count(self) -> int:
        """Finite rows seen so far (host sync)."""
        return int(self._count)

    @property
    def nonfinite_rows(self) -> int:
        """Rows skipped because they held a NaN or inf (host sync)."""
        return int(self._nonfinite)

    @torch.no_grad()
    def update(self, x: Tensor) -> CovarianceAccumulator:
        """Add the rows of ``x`` (``(..., d)``, any real dtype; leading dims are tokens). Returns ``self``."""
        if x.dim() == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"Expected a (..., {self.dim}) tensor, got shape {tuple(x.shape)}."
                " Pass activations with the channels last, or build the accumulator with the right `dim`."
            )
        if x.is_complex():
            raise ValueError(f"Expected a real tensor, got dtype {x.dtype}. Pass the real activations.")
        rows = x.detach().reshape(-1, self.dim).to(device=self.total.device, dtype=_F64)  # (N, d)
        finite = torch.isfinite(rows).all(dim=1)  # (N,)
        # zero the bad rows instead of indexing them out: a zero row adds nothing, and no host sync
        rows = torch.where(finite[:, None], rows, torch.zeros((), dtype=_F64, device=rows.device))
        n_ok = finite.sum()
        self._count += n_ok
        self._nonfinite += finite.numel() - n_ok
        self.total += rows.sum(dim=0)
        self.outer.addmm_(rows.T, rows)  # += X^T X, (d, d)
        return self

    def merge(self, other: CovarianceAccumulator) -> CovarianceAccumulator:
        """Add ``other``'s state into this one (batches, ranks). Returns ``self``."""
        if not isinstance(other, CovarianceAccumulator):
            raise TypeError(f"Expected a CovarianceAccumulator, got {type(other).__name__}.")
        if other.dim != self.dim:
            raise ValueError(f"Expected an accumulator with dim {self.dim}, got dim {other.dim}. Merge like with like.")
        dev = self.total.device
        self._count += other._count.to(dev)
        self._nonfinite += other._nonfinite.to(dev)
        self.total += other.total.to(dev)
        self.outer += other.outer.to(dev)
        return self

    def state_tensors(self) -> CovarianceState:
        """The live state tensors (not copies): an in-place SUM ``all_reduce`` of each makes the state global."""
        return CovarianceState(self._count, self.total, self.outer, self._nonfinite)

    @classmethod
    def from_state(cls, state: CovarianceState | Sequence[Tensor]) -> CovarianceAccumulator:
        """Rebuild an accumulator from ``(count, total, outer, nonfinite_rows)`` (copies them)."""
        count, total, outer, nonfinite = state
        if total.dim() != 1 or tuple(outer.shape) != (total.shape[0], total.shape[0]):
            raise ValueError(
                f"Expected total (d,) and outer (d, d), got {tuple(total.shape)} and {tuple(outer.shape)}."
                " Pass the tuple that state_tensors() returned."
            )
        acc = cls(total.shape[0], device=total.device)
        acc._count += torch.as_tensor(count, device=total.device).to(torch.int64)
        acc._nonfinite += torch.as_tensor(nonfinite, device=total.device).to(torch.int64)
        acc.total += total.to(_F64)
        acc.outer += outer.to(device=total.device, dtype=_F64)
        return acc

    def mean(self) -> Tensor:
        """``(d,)`` float64 mean of the finite rows; zeros before any row."""
        return self.total / self._count.clamp(min=1).to(_F64)

    def covariance(self) -> Tensor:
        """``(d, d)`` float64 centred population covariance ``S/n - mu mu^T``; zeros before any row."""
        n = self._count.clamp(min=1).to(_F64)
        mu = self.total / n  # (d,)
        cov = self.outer / n - torch.outer(mu, mu)  # (d, d)
        return (cov + cov.T) / 2

    def gram(self) -> Tensor:
        """``(d, d)`` float64 uncentred Gram matrix ``X^T X`` of the finite rows (a copy)."""
        return self.outer.clone()


# ----------------------------------------------------------------------------- v*


def _weight_float64(weight: Tensor) -> Tensor:
    w = weight.detach().to(_F64)
    if w.dim() != 1 or w.numel() == 0:
        raise ValueError(f"Expected a non-empty 1-D weight (gamma) of shape (d,), got shape {tuple(weight.shape)}.")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("Expected a finite weight (gamma), got NaN or inf entries. Check the checkpoint.")
    return w


def degenerate_coordinates(weight: Tensor, eps_rel: float = DEGENERATE_EPS_REL) -> Tensor:
    """Indices ``i`` with ``|gamma_i| <= eps_rel * max|gamma|`` (dead channels), int64, ascending.

    Example:
        >>> import torch
        >>> degenerate_coordinates(torch.tensor([1.0, 1e-30, 2.0, 0.0])).tolist()
        [1, 3]
    """
    a = _weight_float64(weight).abs()
    return torch.nonzero(a <= eps_rel * a.max()).reshape(-1)


@torch.no_grad()
def v_star(weight: Tensor, eps_rel: float = DEGENERATE_EPS_REL) -> Tensor:
    r"""The LayerNorm kernel direction ``gamma^-1 / ||gamma^-1||``, float64, never NaN or inf.

    Computed as ``sign(gamma_i) * (m / |gamma_i|)`` renormalised, with ``m`` the smallest
    ``|gamma_i|`` in play, so no entry exceeds 1 before normalising (no overflow, even for
    subnormal gamma). Degenerate channels (:func:`degenerate_coordinates`): the limit of
    ``gamma^-1 / ||gamma^-1||`` is carried by them alone, so

    - if some ``gamma_i == 0`` exactly: equal weight on the exact zeros, 0 elsewhere;
    - else if some ``|gamma_i| <= eps_rel * max|gamma|``: ``sign(gamma_i)/|gamma_i|`` on those
      channels, 0 elsewhere, renormalised;
    - else: ``gamma^-1 / ||gamma^-1||`` itself.

    An all-zero gamma gives the uniform vector ``1/sqrt(d)``.

    Args:
        weight: gamma, shape ``(d,)``, any real dtype and device (the result stays on it).
        eps_rel: degenerate threshold relative to ``max|gamma|``.

    Returns:
        A unit ``(d,)`` float64 tensor.

    Example:
        >>> import torch
        >>> [round(v, 4) for v in v_star(torch.tensor([1.0, 2.0, 2.0])).tolist()]
        [0.8165, 0.4082, 0.4082]
        >>> [round(v, 4) for v in v_star(torch.tensor([1.0, 0.0, -2.0, 0.0])).tolist()]
        [0.0, 0.7071, 0.0, 0.7071]
    """
    g = _weight_float64(weight)
    a = g.abs()
    zero = a == 0
    if bool(zero.any()):
        v = zero.to(_F64)
    else:
        support = a <= eps_rel * a.max()
        if not bool(support.any()):
            support = torch.ones_like(support)
        m = a[support].min()
        v = torch.where(support, torch.sign(g) * (m / a), torch.zeros((), dtype=_F64, device=g.device))
    return v / v.norm()


# ----------------------------------------------------------------------------- spectrum


class NullSpace(NamedTuple):
    """Numerical null space of a covariance."""

    basis: Tensor  # (d, k) float64, orthonormal columns
    dim: int  # k
    eigenvalues: Tensor  # (d,) float64, ascending, in the covariance's units


def _symmetric_float64(cov: Tensor) -> Tensor:
    if cov.dim() != 2 or cov.shape[0] != cov.shape[1] or cov.shape[0] == 0:
        raise ValueError(
            f"Expected a square (d, d) covariance, got shape {tuple(cov.shape)}."
            " Use CovarianceAccumulator.covariance()."
        )
    c = cov.detach().to(_F64)
    if not bool(torch.isfinite(c).all()):
        raise ValueError(
            "Expected a finite covariance, got NaN or inf entries."
            " Build it with CovarianceAccumulator, which skips non-finite rows."
        )
    return (c + c.T) / 2


def _scaled_eigh(c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``eigh`` of ``c / max|c|`` (scale-free tolerances, no under/overflow); returns (evals, evecs, scale)."""
    scale = c.abs().max().clamp(min=_TINY64)
    evals, evecs = torch.linalg.eigh(c / scale)  # ascending
    return evals, evecs, scale


def _null_dim(evals: Tensor, rtol: float) -> int:
    if not 0.0 <= rtol < 1.0:
        raise ValueError(f"Expected 0 <= rtol < 1, got {rtol}. The default is NULL_RTOL = {NULL_RTOL}.")
    return int((evals <= rtol * evals.abs().max()).sum())


@torch.no_grad()
def null_space(cov: Tensor, rtol: float = NULL_RTOL) -> NullSpace:
    r"""Numerical null space of a symmetric PSD matrix: eigenvectors with ``lambda <= rtol * lambda_max``.

    ``torch.linalg.eigh`` in float64. Default ``rtol = NULL_RTOL = 1e-10``: a float32 LayerNorm
    forward leaves its kernel at ~1e-14 of ``lambda_max`` (<= ~1e-15 in float64), ``eigh``'s own floor
    is ~``d * 2.2e-16``, and RMSNorm covariances bottom out at 1e-4 and above. A zero matrix is
    all null (``k = d``).

    Returns:
        ``NullSpace(basis (d, k), dim k, eigenvalues (d,) ascending)``.

    Example:
        >>> import torch
        >>> ns = null_space(torch.diag(torch.tensor([2.0, 0.0, 1.0])))
        >>> ns.dim, ns.basis.abs().reshape(-1).tolist(), ns.eigenvalues.tolist()
        (1, [0.0, 1.0, 0.0], [0.0, 1.0, 2.0])
    """
    c = _symmetric_float64(cov)
    evals, evecs, scale = _scaled_eigh(c)
    k = _null_dim(evals, rtol)
    return NullSpace(evecs[:, :k], k, evals * scale)


@dataclass(frozen=True)
class Alignment:
    """Dead-direction readings of one normalisation layer (all finite floats).

    Attributes:
        cosine: ``|cos(v*, u_min)|``, ``u_min`` the bottom eigenvector of ``C``. Arbitrary when
            the bottom eigenvalue is repeated (``null_dim >= 2``): read ``null_projection`` then.
        null_projection: ``||P_null v*||``, length of ``v*``'s projection on the numerical null
            space (0 when it is empty).
        null_dim: dimension ``k`` of the numerical null space (:func:`null_space`).
        depth: ``v*^T C v* / (trace(C)/d)``, the variance along ``v*`` over the mean eigenvalue.
        depth_diag: ``v*^T C v* / sum_i v*_i^2 C_ii``, the variance along ``v*`` over what it
            would be with uncorrelated channels. For RMSNorm it does not depend on the weight
            (a Rayleigh quotient of the correlation matrix), so a small weight does not fake a
            kernel; :func:`classify_norm_type` reads it.
        lambda_min_rel: smallest eigenvalue over the mean eigenvalue.
        dim: ``d``.
        n_degenerate: count of degenerate gamma channels (:func:`degenerate_coordinates`).
    """

    cosine: float
    null_projection: float
    null_dim: int
    depth: float
    depth_diag: float
    lambda_min_rel: float
    dim: int
    n_degenerate: int


@torch.no_grad()
def alignment(cov: Tensor, weight: Tensor, rtol: float = NULL_RTOL, eps_rel: float = DEGENERATE_EPS_REL) -> Alignment:
    r"""How well ``v* = gamma^-1/||gamma^-1||`` explains the bottom of the covariance ``C`` of a norm's output.

    Negative rounding residues are clamped to 0 (``depth``, ``depth_diag``, ``lambda_min_rel``).
    Defined answers where a ratio has no denominator:

    - no measurable variance (``trace(C)/d <= 2.2e-16 * max|C|``, e.g. an all-zero ``C``): every
      direction is null, so ``cosine = null_projection = 1.0``, ``null_dim = d``, ``depth =
      depth_diag = lambda_min_rel = 0.0``;
    - ``v*`` sees no per-channel variance (``sum_i v*_i^2 C_ii <= 2.2e-16 * trace(C)/d``, e.g. it
      sits on constant dead channels): ``depth_diag = 0.0``.

    Args:
        cov: ``(d, d)`` centred covariance of the layer output (:class:`CovarianceAccumulator`).
        weight: the layer's gamma ``(d,)``.
        rtol: null-space tolerance (:func:`null_space`).
        eps_rel: degenerate-channel threshold (:func:`v_star`).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> ln = torch.nn.LayerNorm(8)
        >>> with torch.no_grad():
        ...     y = ln(torch.randn(500, 8))
        >>> r = alignment(CovarianceAccumulator(8).update(y).covariance(), ln.weight)
        >>> r.null_dim, r.cosine > 0.9999, r.depth_diag < 1e-12
        (1, True, True)
    """
    c = _symmetric_float64(cov)
    d = c.shape[0]
    if weight.dim() != 1 or weight.shape[0] != d:
        raise ValueError(
            f"Expected a weight of shape ({d},) to match the covariance, got {tuple(weight.shape)}."
            " Pass the gamma of the layer whose output the covariance was taken of."
        )
    v = v_star(weight, eps_rel).to(c.device)  # (d,)
    n_deg = int(degenerate_coordinates(weight, eps_rel).numel())
    evals, evecs, scale = _scaled_eigh(c)
    cs = c / scale  # the scale cancels in every ratio below
    k = _null_dim(evals, rtol)
    mean_eig = float(cs.diagonal().sum()) / d
    if mean_eig <= _EPS64:
        return Alignment(1.0, 1.0, d, 0.0, 0.0, 0.0, d, n_deg)
    cosine = min(abs(float(v @ evecs[:, 0])), 1.0)
    null_projection = min(float((evecs[:, :k].T @ v).norm()), 1.0)
    along = max(float(v @ cs @ v), 0.0)  # variance along v*
    diag = float((v * v * cs.diagonal().clamp(min=0)).sum())
    depth_diag = along / diag if diag > _EPS64 * mean_eig else 0.0
    return Alignment(
        cosine=cosine,
        null_projection=null_projection,
        null_dim=k,
        depth=along / mean_eig,
        depth_diag=depth_diag,
        lambda_min_rel=max(float(evals[0]), 0.0) / mean_eig,
        dim=d,
        n_degenerate=n_deg,
    )


# ----------------------------------------------------------------------------- norm type


def classify_norm_type(
    reading: Alignment, layernorm_max: float = LAYERNORM_MAX_DEPTH, rmsnorm_min: float = RMSNORM_MIN_DEPTH
) -> NormType:
    """Per-layer norm type from the depth of the covariance along ``v*`` (not from the cosine).

    Rule, in order:

    1. ``"undetermined"`` if the layer has degenerate gamma channels (``n_degenerate > 0``: then
       ``v*`` sits on dead channels, a kernel for any norm type) or nothing was measured
       (``null_dim == dim``);
    2. ``"layernorm-like"`` if ``depth_diag <= layernorm_max`` (1e-9): an exact kernel along
       ``v*`` (a float32 LayerNorm forward reads ~1e-14, a float64 one <= ~1e-15);
    3. ``"rmsnorm-like"`` if ``depth_diag >= rmsnorm_min`` (1e-3): RMSNorm reads ~0.1-1;
    4. ``"undetermined"`` in between (e.g. a bf16 forward, which lifts LayerNorm to ~1e-6..1e-4).

    ``depth_diag`` rather than ``depth``: an RMSNorm channel with a tiny (not degenerate) weight,
    e.g. 1e-5, pulls ``v*`` onto itself and ``depth`` to ~1e-9, while ``depth_diag`` stays ~1. The
    cosine is not used: at d=64 and ~2k tokens an RMSNorm cosine can reach 0.4-0.6 by chance.

    Example:
        >>> r = Alignment(cosine=1.0, null_projection=1.0, null_dim=1, depth=2e-14, depth_diag=2e-14,
        ...               lambda_min_rel=1e-14, dim=64, n_degenerate=0)
        >>> classify_norm_type(r)
        'layernorm-like'
    """
    if reading.n_degenerate > 0 or reading.null_dim >= reading.dim:
        return "undetermined"
    if reading.depth_diag <= layernorm_max:
        return "layernorm-like"
    if reading.depth_diag >= rmsnorm_min:
        return "rmsnorm-like"
    return "undetermined"


def classify_model_norm_type(readings: Sequence[Alignment], **thresholds: float) -> NormType:
    """Model-level norm type: the label of a strict majority of layers, if no layer has the opposite label.

    Each layer is classified by :func:`classify_norm_type` (``thresholds`` pass through). The model
    is ``"layernorm-like"`` when more than half of its layers are and none is ``"rmsnorm-like"``
    (and vice versa); otherwise ``"undetermined"`` (mixed or mostly undetermined layers: read the
    per-layer labels).

    Example:
        >>> ln = Alignment(1.0, 1.0, 1, 1e-14, 1e-14, 1e-14, 64, 0)
        >>> dead = Alignment(1.0, 1.0, 2, 0.0, 0.0, 0.0, 64, 2)
        >>> classify_model_norm_type([ln, ln, dead]), classify_model_norm_type([ln, dead])
        ('layernorm-like', 'undetermined')
    """
    labels = [classify_norm_type(r, **thresholds) for r in readings]
    if not labels:
        raise ValueError("Expected at least one layer reading, got none. Pass one Alignment per norm layer.")
    for label, other in (("layernorm-like", "rmsnorm-like"), ("rmsnorm-like", "layernorm-like")):
        if 2 * labels.count(label) > len(labels) and other not in labels:
            return label  # type: ignore[return-value]
    return "undetermined"


# ----------------------------------------------------------------------------- init gap


@dataclass(frozen=True)
class InitGap:
    """satmon init-gap of one layer (log10 decades; > 0 means the trained layer is deeper)."""

    depth_deepening: float
    lambda_min_deepening: float


def init_gap(
    trained: Alignment | Sequence[Alignment], init: Alignment | Sequence[Alignment], floor: float = INIT_GAP_FLOOR
) -> list[InitGap]:
    r"""satmon init-gap: how much deeper a trained layer's covariance is than its random-init twin's.

    satmon's own readout (the paper's "Schur ratio" formula was not available; this is not it).
    Per layer, with ``f(z) = max(z, floor)``:

    .. math::

        \text{depth\_deepening} = \log_{10} \frac{f(\text{depth}_{init})}{f(\text{depth}_{trained})},
        \qquad
        \text{lambda\_min\_deepening} = \log_{10}
            \frac{f(\text{lambda\_min\_rel}_{init})}{f(\text{lambda\_min\_rel}_{trained})},

    ``depth`` and ``lambda_min_rel`` as in :class:`Alignment` (relative to the mean eigenvalue).
    ``floor = 1e-12`` sits above the float32 rounding floor (a LayerNorm kernel reads ~1e-14),
    so two kernel readings give 0 instead of rounding noise, and the gap is never inf
    (it lies within ``+-log10(d / floor)``). ``init`` must be the same architecture at random
    init, layer for layer.

    Args:
        trained: readings of the trained checkpoint, one per layer (or one reading).
        init: readings of the random-init twin, same layers in the same order.
        floor: the floor of both quantities.

    Example:
        >>> import torch
        >>> v = torch.full((4,), 0.5)
        >>> cov = lambda a: torch.eye(4, dtype=torch.float64) - (1 - a) * torch.outer(v, v).double()
        >>> init, trained = alignment(cov(1e-3), torch.ones(4)), alignment(cov(1e-6), torch.ones(4))
        >>> gap = init_gap(trained, init)[0]
        >>> round(gap.depth_deepening, 2), round(gap.lambda_min_deepening, 2)
        (3.0, 3.0)
    """
    tr = [trained] if isinstance(trained, Alignment) else list(trained)
    it = [init] if isinstance(init, Alignment) else list(init)
    if len(tr) != len(it):
        raise ValueError(
            f"Expected as many init readings as trained ones, got {len(it)} and {len(tr)}."
            " Measure the random-init twin on the same layers."
        )
    if not floor > 0:
        raise ValueError(f"Expected floor > 0, got {floor}. The default is INIT_GAP_FLOOR = {INIT_GAP_FLOOR}.")
    gaps = []
    for t, i in zip(tr, it):
        if t.dim != i.dim:
            raise ValueError(f"Expected the init twin to have the same width, got d={i.dim} vs trained d={t.dim}.")
        gaps.append(
            InitGap(
                depth_deepening=math.log10(max(i.depth, floor) / max(t.depth, floor)),
                lambda_min_deepening=math.log10(max(i.lambda_min_rel, floor) / max(t.lambda_min_rel, floor)),
            )
        )
    return gaps


# ----------------------------------------------------------------------------- sigma_min


def _gram_source(x: Tensor | CovarianceAccumulator) -> CovarianceAccumulator:
    if isinstance(x, CovarianceAccumulator):
        return x
    if x.dim() != 2:
        raise ValueError(
            f"Expected a (tokens, d) matrix or a CovarianceAccumulator, got shape {tuple(x.shape)}."
            " Flatten batch and time into tokens first."
        )
    return CovarianceAccumulator(x.shape[1], device=x.device).update(x)


class GramSpectrum(NamedTuple):
    """What ``sigma_min`` needs of one stream's ``X^T X``: its finite rows, width and extreme eigenvalues."""

    tokens: int
    dim: int
    lambda_min: float
    lambda_max: float


@torch.no_grad()
def gram_spectrum(x: Tensor | CovarianceAccumulator) -> GramSpectrum:
    """The :class:`GramSpectrum` of a ``(tokens, d)`` matrix or an accumulator fed with its rows.

    :func:`sigma_min_profile` accepts these in place of the streams, so the ``d x d`` matrices can
    be read (and freed) one at a time.

    Example:
        >>> gram_spectrum(torch.tensor([[3.0, 0.0], [0.0, 2.0], [0.0, 0.0]]))
        GramSpectrum(tokens=3, dim=2, lambda_min=4.0, lambda_max=9.0)
    """
    acc = _gram_source(x)
    evals, _, scale = _scaled_eigh((acc.outer + acc.outer.T) / 2)
    return GramSpectrum(acc.count, acc.dim, float(evals[0] * scale), float(evals[-1] * scale))


def _sigma_min_of(s: GramSpectrum) -> float:
    """``sqrt(lambda_min)``, or exactly 0.0 with fewer tokens than channels (rank < d)."""
    return 0.0 if s.tokens < s.dim else math.sqrt(max(s.lambda_min, 0.0))


@torch.no_grad()
def sigma_min(x: Tensor | CovarianceAccumulator) -> float:
    r"""Smallest singular value of a ``(tokens, d)`` matrix: ``sqrt(lambda_min(X^T X))`` in float64.

    ``x`` is the matrix itself or a :class:`CovarianceAccumulator` fed with its rows (its sum of
    outer products is ``X^T X``, so streams and ranks merge). Non-finite rows are skipped. With
    fewer finite tokens than ``d`` the rank is below ``d`` and the answer is exactly 0.0. Through
    the Gram matrix the relative error is ~``2.2e-16 * (sigma_max / sigma_min)^2``.

    Example:
        >>> import torch
        >>> sigma_min(torch.tensor([[3.0, 0.0], [0.0, 2.0], [0.0, 0.0]]))
        2.0
    """
    return _sigma_min_of(gram_spectrum(x))


@dataclass(frozen=True)
class SigmaMinProfile:
    """``sigma_min`` along the residual stream and its ratio to the embedding output's.

    Attributes:
        values: ``sigma_min(X_l)`` per stream, ``X_0`` first.
        ratios: ``sigma_min(X_l) / sigma_min(X_0)`` (``ratios[0] == 1.0``) when ``valid``;
            all 0.0 otherwise (never NaN or inf; check ``valid`` before reading ``< 1`` as a drop).
        valid: whether the ratios are meaningful.
        reason: why not, empty when valid.
    """

    values: list[float]
    ratios: list[float]
    valid: bool
    reason: str


@torch.no_grad()
def sigma_min_profile(
    streams: Sequence[Tensor | CovarianceAccumulator | GramSpectrum], rtol: float = NULL_RTOL
) -> SigmaMinProfile:
    r"""Residual-stream depth readout: ``sigma_min(X_l) / sigma_min(X_0)`` for every stream ``l``.

    ``streams[0]`` is the embedding output ``X_0``, then the stream after each block (matrices or
    accumulators of the same tokens, or their :func:`gram_spectrum`). The paper's invariance: the ratio stays ``>= 1``
    while no block's update anti-aligns with the stream; a ratio below 1 flags one that does.

    The ratios are only defined with a full-rank ``X_0``. ``valid`` is False, and every ratio
    0.0, when some stream has fewer finite tokens than channels (rank < d, so ``sigma_min = 0``
    for every layer: feed at least ``d`` tokens, ideally several times more), or when ``X_0`` is
    numerically singular (``lambda_min(X_0^T X_0) <= rtol * lambda_max``).

    Example:
        >>> import torch
        >>> x0 = torch.tensor([[3.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
        >>> p = sigma_min_profile([x0, x0 - 0.9 * x0])    # a block with f(x) = -0.9 x
        >>> p.valid, [round(r, 6) for r in p.ratios]
        (True, [1.0, 0.1])
    """
    if len(streams) == 0:
        raise ValueError("Expected at least one stream, got none. Pass [X_0, X_1, ...] with X_0 the embedding output.")
    spectra = [s if isinstance(s, GramSpectrum) else gram_spectrum(s) for s in streams]
    values = [_sigma_min_of(s) for s in spectra]
    short = [l for l, s in enumerate(spectra) if s.tokens < s.dim]
    _, _, lo0, hi0 = spectra[0]
    reason = ""
    if short:
        reason = (
            f"streams {short} have fewer finite tokens than channels "
            f"(d={spectra[short[0]].dim}): sigma_min is 0 by rank;"
            " feed at least d tokens"
        )
    elif lo0 <= rtol * abs(hi0):
        reason = f"X_0 is numerically singular (lambda_min/lambda_max <= {rtol:g})"
    if reason:
        return SigmaMinProfile(values, [0.0] * len(values), False, reason)
    return SigmaMinProfile(values, [v / values[0] for v in values], True, "")
