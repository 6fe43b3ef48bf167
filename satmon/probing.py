r"""``satmon.probe(model, batches)``: one no-grad pass over a few batches, every satmon reading at once.

Forward hooks, attached for the call and removed afterwards, feed satmon's float64 math:

- **DyT** layers: saturation ``|alpha * x| > level`` of their inputs, counted by the same
  :class:`~satmon.core.saturation_hooks.SaturationHooks` / :class:`~satmon.core.saturation_hooks.SaturationCounter` the
  live monitor uses, then the GO / NO-GO rule (:func:`satmon.verdict.decide`). When a DyT feeds a
  gated MLP (:func:`satmon.core.gated_mlp.detect_gating`), the collapse watch's
  :class:`~satmon.core.gate_hooks.GateHooks` take gate statistics in the same forward and the verdict is
  ``gated`` (as the live monitor decides it: the model has a gated MLP).
- **LayerNorm / RMSNorm** layers: a :class:`~satmon.functional.dead_directions.CovarianceAccumulator` of the
  layer OUTPUT, then :func:`~satmon.functional.dead_directions.alignment` with the layer's weight (gamma):
  ``|cos(v*, u_min)|``, the projection of ``v*`` on the numerical null space, its dimension, and
  the per-layer and model norm type (SCIENCE.md section 3).
- **Residual stream**: ``X_0`` (the input of the first block, i.e. the embedding output) and
  every block output feed uncentred Gram matrices ``X^T X``, then
  :func:`~satmon.functional.dead_directions.sigma_min_profile`: ``sigma_min(X_l) / sigma_min(X_0)``.

The live callback (:class:`satmon.live_probe.LiveProbe`) and ``satmon replay`` call this same
function, so a checkpoint replayed and the live reading at that step agree.

Cost. Memory: one ``d x d`` float64 matrix per monitored LayerNorm/RMSNorm layer and per residual
stream (``8 d^2`` bytes: 32 KiB at d=64, 512 MiB at d=8192), on the activations' device; layers
wider than ``max_dim`` are skipped with a warning; choose layers with ``layers=`` and blocks with
``blocks=``. Compute: per token ``d^2`` float64 multiply-adds per matrix, one ``eigh`` per matrix at
the end. Nothing is kept from one call to the next.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from satmon.discovery import NormKind, NormLayer, Selector, find_blocks, find_norm_layers
from satmon.functional.dead_directions import (
    Alignment,
    CovarianceAccumulator,
    InitGap,
    NormType,
    alignment,
    classify_model_norm_type,
    classify_norm_type,
    init_gap,
    sigma_min_profile,
)
from satmon.core.gate_hooks import GateCounter, GateHooks
from satmon.core.gated_mlp import detect_gating
from satmon.core.saturation_hooks import SaturationCounter, SaturationHooks
from satmon.verdict import GatingInfo, LayerCounts, Source, Verdict, build_verdict
from satmon.writers.tensorboard import TAG

__all__ = ["EMBEDDING", "LayerReading", "Report", "SigmaMinReading", "feed_first", "probe"]

#: Name of the embedding output ``X_0`` (the first block's input) in :attr:`SigmaMinReading.blocks`.
EMBEDDING = "embedding"

ForwardFn = Callable[[nn.Module, Any], Any]


# ------------------------------------------------------------------------------------ results
@dataclass
class LayerReading:
    """One norm layer's readings; the fields of the other kinds are ``None``.

    Attributes:
        name: module name (wrapper prefixes of compile/DDP/FSDP removed).
        kind: ``"dyt"``, ``"layernorm"`` or ``"rmsnorm"`` (discovery's rule, by class).
        dim: channel count ``d``.
        tokens: rows seen (for DyT: input elements / ``d``).
        saturation: DyT: fraction of input elements with ``|alpha * x| > level``.
        alpha: DyT: ``|alpha|`` (mean over channels for a per-channel alpha).
        alignment: LayerNorm/RMSNorm: ``|cos(v*, u_min)|`` (:class:`~satmon.functional.dead_directions.Alignment`).
        null_projection: ``||P_null v*||``, the reading that stays meaningful when ``null_dim >= 2``.
        null_dim: dimension of the numerical null space of the output covariance.
        depth, depth_diag, lambda_min_rel, n_degenerate: as in :class:`~satmon.functional.dead_directions.Alignment`.
        norm_type: this layer's label by :func:`~satmon.functional.dead_directions.classify_norm_type`.
        nonfinite: skipped rows (LayerNorm/RMSNorm) or non-finite input elements (DyT).
        init_gap: satmon's init-gap against the random-init twin (``probe(..., twin=...)``).
    """

    name: str
    kind: NormKind
    dim: int
    tokens: int = 0
    saturation: float | None = None
    alpha: float | None = None
    alignment: float | None = None
    null_projection: float | None = None
    null_dim: int | None = None
    depth: float | None = None
    depth_diag: float | None = None
    lambda_min_rel: float | None = None
    n_degenerate: int | None = None
    norm_type: NormType | None = None
    nonfinite: int = 0
    init_gap: InitGap | None = None

    def reading(self) -> Alignment | None:
        """The :class:`~satmon.functional.dead_directions.Alignment` behind a LayerNorm/RMSNorm reading (``None`` otherwise)."""
        if self.alignment is None:
            return None
        return Alignment(self.alignment, self.null_projection, self.null_dim, self.depth, self.depth_diag,
                         self.lambda_min_rel, self.dim, self.n_degenerate)  # fmt: skip

    def kernel_alignment(self) -> float | None:
        """``max(alignment, null_projection)``: how well ``v*`` sits in the output's kernel, whatever
        the null dimension (the cosine alone is arbitrary when ``null_dim >= 2``, the projection is 0
        when ``null_dim == 0``; with ``null_dim == 1`` the two are equal)."""
        if self.alignment is None:
            return None
        return max(self.alignment, self.null_projection or 0.0)

    def to_dict(self) -> dict[str, Any]:
        keys = ("saturation", "alpha") if self.kind == "dyt" else (
            "alignment", "null_projection", "null_dim", "depth", "depth_diag", "lambda_min_rel", "n_degenerate", "norm_type")
        out = {"kind": self.kind, "dim": self.dim, "tokens": self.tokens, **{k: getattr(self, k) for k in keys}}
        out["nonfinite"] = self.nonfinite
        if self.init_gap is not None:
            out["init_gap"] = {"depth_deepening": self.init_gap.depth_deepening,
                               "lambda_min_deepening": self.init_gap.lambda_min_deepening}
        return out


@dataclass
class SigmaMinReading:
    """The residual-stream profile. ``blocks[0] == EMBEDDING`` (``X_0``); ``values``, ``ratios`` align with ``blocks``.

    Attributes:
        blocks: stream names, ``X_0`` first, then each block's output.
        values: ``sigma_min(X_l)`` (float64 through ``X^T X``).
        ratios: ``sigma_min(X_l) / sigma_min(X_0)``, all ``None`` when not ``valid``.
        valid: the ratios are meaningful (enough tokens, ``X_0`` of full rank, every stream seen).
        reason: why not, empty when valid.
        min_ratio: the smallest ratio over the blocks (``X_0``'s own 1.0 excluded); ``None`` when not valid.
        argmin: the block that has it.
    """

    blocks: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    ratios: list[float | None] = field(default_factory=list)
    valid: bool = False
    reason: str = ""
    min_ratio: float | None = None
    argmin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("blocks", "values", "ratios", "valid", "reason", "min_ratio", "argmin")}


@dataclass
class Report:
    """What :func:`probe` measured.

    Attributes:
        layers: layer name -> :class:`LayerReading`, in registration order.
        sigma_min: the residual-stream profile (:class:`SigmaMinReading`).
        norm_type: the model's norm type from its LayerNorm/RMSNorm layers
            (:func:`~satmon.functional.dead_directions.classify_model_norm_type`: ``"layernorm-like"``,
            ``"rmsnorm-like"``, ``"undetermined"``), or ``"dyt"`` when the only norm layers are DyT
            (no kernel to test: DyT has no mean subtraction and no normalisation).
        norm_type_note: how ``norm_type`` was reached, in words.
        saturation: pooled DyT saturation (``None`` without DyT layers).
        verdict: the GO / NO-GO :class:`~satmon.verdict.Verdict` on the pooled saturation (``None``
            without DyT); ``step`` and ``window`` are 0 (a probe has no window).
        gating: ``{"gated", "pairings", "unpaired_gated_mlps", "message", "risk"}``; empty without DyT.
        init_gap: layer -> satmon's :class:`~satmon.functional.dead_directions.InitGap` when a twin was given.
        tokens: rows of ``X_0`` (batch x sequence) when blocks were found, else the most rows any
            monitored layer saw.
        batches: forward passes run.
        elapsed_s: wall time of the call (twin included).
        skipped: layer or stream -> why it has no reading.
    """

    layers: dict[str, LayerReading]
    sigma_min: SigmaMinReading
    norm_type: str
    norm_type_note: str = ""
    saturation: float | None = None
    verdict: Verdict | None = None
    gating: dict[str, Any] = field(default_factory=dict)
    init_gap: dict[str, InitGap] | None = None
    tokens: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (no NaN or inf: those become ``None``); ``satmon replay`` and the CLI use its keys."""
        out = {
            "layers": {n: l.to_dict() for n, l in self.layers.items()},
            "sigma_min": self.sigma_min.to_dict(),
            "norm_type": self.norm_type,
            "norm_type_note": self.norm_type_note,
            "saturation": self.saturation,
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "gating": self.gating,
            "init_gap": None if self.init_gap is None else {
                n: {"depth_deepening": g.depth_deepening, "lambda_min_deepening": g.lambda_min_deepening}
                for n, g in self.init_gap.items()},
            "tokens": self.tokens,
            "batches": self.batches,
            "elapsed_s": self.elapsed_s,
            "skipped": dict(self.skipped),
        }  # fmt: skip
        return _json_safe(out)

    def scalars(self, saturation: bool = True) -> dict[str, float]:
        """The readings under the live callback's TensorBoard tags (:class:`~satmon.writers.tensorboard.TAG`).

        ``satmon/saturation``, ``satmon/saturation/<layer>``, ``satmon/alpha/<layer>`` (DyT; left out
        with ``saturation=False``), ``satmon/deadir/<layer>/{alignment,null_dim,null_projection}``
        (LayerNorm/RMSNorm), ``satmon/sigma_min/ratio/<block>`` and ``satmon/sigma_min/min_ratio``
        (when the profile is valid), ``satmon/init_gap/<layer>`` (the twin's ``depth_deepening``).
        """
        out: dict[str, float] = {}
        if saturation and self.saturation is not None:
            out[TAG.saturation] = self.saturation
        for name, l in self.layers.items():
            if l.kind == "dyt":
                if saturation and l.saturation is not None:
                    out[TAG.layer_saturation(name)] = l.saturation
                    out[TAG.alpha(name)] = float(l.alpha)
            elif l.alignment is not None:
                out[TAG.deadir_alignment(name)] = l.alignment
                out[TAG.deadir_null_dim(name)] = float(l.null_dim)
                out[TAG.deadir_null_projection(name)] = l.null_projection
            if l.init_gap is not None:
                out[TAG.init_gap(name)] = l.init_gap.depth_deepening
        s = self.sigma_min
        if s.valid:
            out.update({TAG.sigma_min_ratio(b): r for b, r in zip(s.blocks[1:], s.ratios[1:])})
            if s.min_ratio is not None:
                out[TAG.sigma_min_min_ratio] = s.min_ratio
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}

    def summary(self) -> str:
        """One line: norm type, the weakest LayerNorm alignment, the sigma_min minimum, the saturation."""
        parts = [f"satmon probe: norm type {self.norm_type}"]
        aligns = [(l.kernel_alignment(), n) for n, l in self.layers.items() if l.kind == "layernorm" and l.alignment is not None]
        if aligns:
            a, n = min(aligns)
            parts.append(f"min LayerNorm alignment {a:.6f} ({n})")
        if self.sigma_min.valid:
            parts.append(f"min sigma_min ratio {self.sigma_min.min_ratio:.4f} ({self.sigma_min.argmin})")
        if self.saturation is not None:
            parts.append(f"DyT saturation {self.saturation:.4f}")
        return "; ".join(parts) + f" [{self.batches} batches, {self.tokens} tokens, {self.elapsed_s:.2f}s]"


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------ batches
def feed_first(model: nn.Module, batch: Any) -> Any:
    """A ``forward_fn`` for ``(inputs, targets)`` batches: ``model(batch[0])`` for a tuple/list,
    the default rule otherwise. The live probe's default.

    Example:
        >>> import torch
        >>> feed_first(torch.nn.Identity(), (torch.ones(2), torch.zeros(2))).tolist()
        [1.0, 1.0]
    """
    if isinstance(batch, (tuple, list)) and len(batch) > 0:
        return model(batch[0])
    return _feed(model, batch)


def _feed(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_to_device(v, device) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _batch_list(batches: Any) -> Iterable[Any]:
    if isinstance(batches, (Tensor, Mapping)):
        return [batches]
    if isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(
            f"Expected `batches` to be a tensor, a dict, or an iterable of batches, got {type(batches).__name__}."
            " Wrap a single (inputs, targets) batch in a list: probe(model, [batch])."
        )
    return batches


def _first_tensor(obj: Any) -> Tensor | None:
    """The tensor a module returned: itself, or the first tensor of a tuple/list/dict (HF blocks return tuples)."""
    if isinstance(obj, Tensor):
        return obj
    values = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (tuple, list)) else ()
    for v in values:
        t = _first_tensor(v)
        if t is not None:
            return t
    return None


# ---------------------------------------------------------------------------------------- hooks
class _Tap:
    """Streams one module's output (or input) rows ``(..., d)`` into a float64 accumulator, made on first use."""

    def __init__(self, max_dim: int, dim: int | None = None) -> None:
        self.max_dim, self.dim = max_dim, dim
        self.acc: CovarianceAccumulator | None = None
        self.skipped = ""

    def add(self, out: Any) -> None:
        x = _first_tensor(out)
        if self.skipped:
            return
        if x is None or not x.is_floating_point() or x.dim() == 0:
            self.skipped = "no floating-point tensor output"
            return
        d = x.shape[-1]
        if self.acc is None:
            if self.dim is not None and d != self.dim:
                self.skipped = f"its output has {d} channels last, its weight {self.dim}"
                return
            if d > self.max_dim:
                self.skipped = f"d={d} > max_dim={self.max_dim}"
                return
            self.acc = CovarianceAccumulator(d, device=x.device)
        elif d != self.acc.dim:
            self.skipped = f"width changed between calls ({self.acc.dim} -> {d})"
            return
        self.acc.update(x)

    def ready(self) -> CovarianceAccumulator | None:
        if self.skipped:
            return None
        if self.acc is None or self.acc.count == 0:
            self.skipped = self.skipped or "not called during the forward passes (or only non-finite rows)"
            return None
        return self.acc


def _layer_dim(module: nn.Module) -> int | None:
    w = getattr(module, "weight", None)
    if isinstance(w, Tensor) and w.dim() == 1:
        return w.numel()
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, (tuple, list, torch.Size)) and len(shape) >= 1:
        return int(shape[-1])
    return int(shape) if isinstance(shape, int) else None


def _gamma(module: nn.Module, d: int, device: torch.device) -> Tensor:
    """The weight the forward used; ones when the layer has none (``elementwise_affine=False``)."""
    w = getattr(module, "weight", None)
    return w.detach() if isinstance(w, Tensor) and w.dim() == 1 and w.numel() == d else torch.ones(d, device=device)


# -------------------------------------------------------------------------------------- selection
def _select_layers(
    model: nn.Module, layers: list[str] | Selector, include: Selector, exclude: Selector, block_names: list[str]
) -> list[NormLayer]:
    found = find_norm_layers(model, include=include, exclude=exclude)
    if layers is None:
        return found
    by_name = {l.name: l for l in found}
    if isinstance(layers, (list, tuple)):
        unknown = [n for n in layers if n not in by_name]
        if unknown:
            raise ValueError(f"Expected `layers` to name discovered norm layers, got unknown {unknown}. Available: {list(by_name)}.")
        chosen = set(layers)
    elif isinstance(layers, str):
        chosen = {n for n in by_name if re.search(layers, n)}
    elif callable(layers):
        chosen = {l.name for l in found if layers(l.name, l.module)}
    else:
        raise TypeError(f"Expected `layers` to be a list of names, a regex or a predicate (name, module) -> bool, got {type(layers).__name__}.")
    # the final norm (the last one outside every block) is always read
    outside = [l for l in found if not any(l.name == b or l.name.startswith(b + ".") for b in block_names)]
    if outside:
        chosen.add(outside[-1].name)
    return [l for l in found if l.name in chosen]


def _check_args(level: float, threshold: float, collapse_threshold: float, max_dim: int, max_batches: int | None,
                autocast_dtype: Any, forward_fn: Any) -> None:  # fmt: skip
    if not (isinstance(level, (int, float)) and math.isfinite(level) and level > 0):
        raise ValueError(f"Expected `level` > 0 (the |alpha * x| cut-off; the study's is 2.0), got {level!r}.")
    for name, v in (("threshold", threshold), ("collapse_threshold", collapse_threshold)):
        if not (isinstance(v, (int, float)) and 0.0 < v < 1.0):
            raise ValueError(f"Expected `{name}` in (0, 1) (a saturation fraction), got {v!r}.")
    if isinstance(max_dim, bool) or not isinstance(max_dim, int) or max_dim < 1:
        raise ValueError(f"Expected `max_dim` to be a positive int (widest layer to read), got {max_dim!r}.")
    if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"Expected `max_batches` to be a positive int or None, got {max_batches!r}.")
    if autocast_dtype is not None and not isinstance(autocast_dtype, torch.dtype):
        raise TypeError(f"Expected `autocast_dtype` to be a torch.dtype (e.g. torch.bfloat16) or None, got {autocast_dtype!r}.")
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError(f"Expected `forward_fn` to be a callable (model, batch) -> Any, got {type(forward_fn).__name__}.")


def _model_device(model: nn.Module) -> torch.device:
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------ probe
@torch.no_grad()
def probe(
    model: nn.Module,
    batches: Any,
    *,
    forward_fn: ForwardFn | None = None,
    layers: list[str] | Selector = None,
    include: Selector = None,
    exclude: Selector = None,
    blocks: list[str] | None = None,
    level: float = 2.0,
    threshold: float = 0.43,
    collapse_threshold: float = 0.5,
    gating_mapping: dict[str, str] | None = None,
    device: torch.device | str | None = None,
    autocast_dtype: torch.dtype | None = None,
    max_batches: int | None = None,
    twin: nn.Module | None = None,
    max_dim: int = 8192,
    train_mode: bool = False,
) -> Report:
    r"""Run ``model`` over ``batches`` without gradients and read every satmon diagnostic from that pass.

    Batches. ``batches`` is one batch (a tensor or a dict) or an iterable of batches (a list, a
    ``DataLoader``, a generator). Each batch is moved to ``device`` and fed by ``forward_fn(model,
    batch)`` when given, else by this rule: a tensor as ``model(batch)``, a tuple/list as
    ``model(*batch)`` (positional inputs), a dict as ``model(**batch)``. A dataloader's
    ``(inputs, targets)`` pair would feed the targets as a second input: pass
    ``forward_fn=feed_first`` (``model(batch[0])``), as the live probe does. The output is discarded.

    Mode and state. The forward runs in eval mode by default (dropout off, as the study measured;
    ``train_mode=True`` runs in train mode and restores the buffers, e.g. BatchNorm statistics,
    afterwards). Every module's own ``training`` flag is restored afterwards (mixed train/eval
    models come back as they were), parameters are never written, the RNG state is restored, and
    every hook is removed, also on error. Hooks of other code (e.g. a running
    :class:`~satmon.SaturationMonitor`) see these forward passes: disable them around the call.

    Readings (see :class:`Report`): DyT saturation and a verdict (gated when a DyT feeds a gated
    MLP); LayerNorm/RMSNorm alignment of ``v* = gamma^-1/||gamma^-1||`` with the bottom of the output
    covariance, the null space, and the norm type; the residual stream's ``sigma_min`` ratios;
    with ``twin``, satmon's init-gap per layer. Statistics are float64 whatever the forward's dtype;
    a bf16 forward (or bf16 weights) lifts a LayerNorm kernel to ~1e-6 and makes its norm type
    ``"undetermined"``: read it from a float32 forward.

    Args:
        model: any ``nn.Module`` (a LightningModule too); it is not moved.
        batches: see above.
        forward_fn: ``forward_fn(model, batch)`` runs one batch.
        layers: which discovered norm layers to read: a list of names, a regex or a predicate
            ``(name, module) -> bool``; default all. The final norm (the last norm outside the
            blocks) is always read.
        include, exclude: widen/narrow discovery itself (:func:`satmon.discovery.find_norm_layers`).
        blocks: names of the residual blocks, when :func:`satmon.discovery.find_blocks` finds none or
            the wrong ones. ``X_0`` is the first block's input.
        level, threshold, collapse_threshold: the saturation rule (:func:`satmon.verdict.decide`).
        gating_mapping: ``{dyt_name: mlp_name}`` when the names rule of
            :func:`satmon.core.gated_mlp.detect_gating` cannot pair a DyT with its gated MLP.
        device: where batches go; default the device of the model's first parameter.
        autocast_dtype: run the forward under ``torch.autocast(device.type, dtype)``, e.g.
            ``torch.bfloat16``.
        max_batches: stop after this many batches.
        twin: a random-init instance of the same architecture (same layer names): probed on the same
            batches, then :func:`satmon.functional.dead_directions.init_gap` per LayerNorm/RMSNorm layer.
        max_dim: LayerNorm/RMSNorm layers and streams wider than this are skipped, with a warning.
        train_mode: run the forward in train mode instead of eval mode.

    Returns:
        A :class:`Report`.

    Example:
        >>> import torch
        >>> from satmon.demos.gpt import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> model = GPT(GPTConfig(norm="layernorm", n_layers=2))
        >>> report = probe(model, torch.randint(0, 256, (16, 64)))
        >>> report.norm_type, report.layers["ln_f"].null_dim, report.layers["ln_f"].alignment > 0.9999
        ('layernorm-like', 1, True)
        >>> report.sigma_min.blocks, report.sigma_min.valid
        (['embedding', 'blocks.0', 'blocks.1'], True)
    """
    t0 = time.perf_counter()
    _check_args(level, threshold, collapse_threshold, max_dim, max_batches, autocast_dtype, forward_fn)
    device = torch.device(device) if device is not None else _model_device(model)
    block_list = find_blocks(model, names=blocks)
    block_names = [n for n, _ in block_list]
    chosen = _select_layers(model, layers, include, exclude, block_names)
    if not chosen and not block_list:
        raise ValueError(
            f"Expected a model with DyT, LayerNorm or RMSNorm layers or residual blocks, found none in {type(model).__name__}."
            " Point satmon at them with `include='regex on module names'` and `blocks=[...]`."
        )
    batch_iter: Iterable[Any] = _batch_list(batches)
    if max_batches is not None:
        batch_iter = itertools.islice(batch_iter, max_batches)
    if twin is not None:
        batch_iter = list(batch_iter)  # both models see the same batches

    dyt = [l for l in chosen if l.kind == "dyt"]
    norms = [l for l in chosen if l.kind != "dyt"]
    skipped: dict[str, str] = {}
    taps: dict[str, _Tap] = {}
    for l in norms:
        d = _layer_dim(l.module)
        if d is not None and d > max_dim:
            skipped[l.name] = f"d={d} > max_dim={max_dim}"
        else:
            taps[l.name] = _Tap(max_dim, d)
    streams = {name: _Tap(max_dim) for name in [EMBEDDING, *block_names]} if block_list else {}

    counter = hooks = None
    if dyt:
        counter = SaturationCounter(len(dyt), level=level).to(dyt[0].module.alpha.device)
        hooks = SaturationHooks(dyt, counter)
    gating, gate_hooks = _gating_setup(model, dyt, gating_mapping)

    handles = []
    modes = [(m, m.training) for m in model.modules()]
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()] if train_mode else []
    rng_devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    n_batches = 0
    try:
        for l in norms:
            if l.name in taps:
                handles.append(l.module.register_forward_hook(lambda _m, _a, out, tap=taps[l.name]: tap.add(out)))
        if block_list:
            handles.append(block_list[0][1].register_forward_pre_hook(_stream_input_hook(streams[EMBEDDING]), with_kwargs=True))
            for name, module in block_list:
                handles.append(module.register_forward_hook(lambda _m, _a, out, tap=streams[name]: tap.add(out)))
        for h in (hooks, gate_hooks):
            if h is not None:
                h.attach()
        model.train(train_mode)
        autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
        with torch.random.fork_rng(devices=rng_devices), autocast:
            for batch in batch_iter:
                batch = _to_device(batch, device)
                forward_fn(model, batch) if forward_fn is not None else _feed(model, batch)
                n_batches += 1
    finally:
        for h in (hooks, gate_hooks):
            if h is not None:
                h.detach()
        for h in handles:
            h.remove()
        for m, was_training in modes:
            m.training = was_training
        for b, saved in saved_buffers:
            b.copy_(saved)
    if n_batches == 0:
        raise ValueError("Expected at least one batch, got none. Pass a tensor, a dict, or a non-empty iterable of batches.")

    readings = {l.name: LayerReading(l.name, l.kind, _layer_dim(l.module) or 0) for l in chosen}
    for l in norms:
        tap = taps.get(l.name)
        acc = tap.ready() if tap is not None else None
        if acc is None:
            skipped.setdefault(l.name, tap.skipped if tap is not None else "")
            continue
        r = alignment(acc.covariance(), _gamma(l.module, acc.dim, acc.total.device))
        readings[l.name] = LayerReading(
            l.name, l.kind, acc.dim, tokens=acc.count, alignment=r.cosine, null_projection=r.null_projection,
            null_dim=r.null_dim, depth=r.depth, depth_diag=r.depth_diag, lambda_min_rel=r.lambda_min_rel,
            n_degenerate=r.n_degenerate, norm_type=classify_norm_type(r), nonfinite=acc.nonfinite_rows,
        )
    pooled, verdict = _saturation_readout(readings, dyt, counter, hooks, gating, gate_hooks, level, threshold, collapse_threshold)
    sigma = _sigma_readout(streams, skipped)
    norm_type, note = _norm_type(readings)
    tokens = streams[EMBEDDING].acc.count if block_list and streams[EMBEDDING].acc is not None else max(
        (l.tokens for l in readings.values()), default=0)  # fmt: skip
    if skipped:
        warnings.warn(
            "satmon probe: no reading for " + "; ".join(f"{n} ({why})" for n, why in skipped.items())
            + ". Raise `max_dim` or choose layers with `layers=` / blocks with `blocks=`.",
            stacklevel=2,
        )
    report = Report(
        layers=readings, sigma_min=sigma, norm_type=norm_type, norm_type_note=note, saturation=pooled, verdict=verdict,
        gating=gating, tokens=tokens, batches=n_batches, skipped=skipped,
    )
    if twin is not None:
        _attach_init_gap(report, probe(
            twin, batch_iter, forward_fn=forward_fn, layers=list(readings), blocks=block_names or None, level=level,
            threshold=threshold, collapse_threshold=collapse_threshold, autocast_dtype=autocast_dtype, max_dim=max_dim,
            train_mode=train_mode, include=include, exclude=exclude,
        ))  # fmt: skip
    report.elapsed_s = time.perf_counter() - t0
    return report


def _stream_input_hook(tap: _Tap):
    """Forward pre-hook: ``X_0`` is the first block's hidden-state input (positional, or HF's ``hidden_states=``)."""

    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        if args:
            tap.add(args[0])
        else:
            tap.add(kwargs["hidden_states"] if "hidden_states" in kwargs else _first_tensor(kwargs))

    return hook


# ---------------------------------------------------------------------------------------- readouts
def _local_only() -> bool:
    return False  # the probe's counters never sync ranks: a probe on one rank must not wait for the others


def _gating_setup(model: nn.Module, dyt: list[NormLayer], mapping: dict[str, str] | None) -> tuple[dict[str, Any], GateHooks | None]:
    """Gated MLPs fed by a monitored DyT (names rule, or ``mapping``), and the collapse watch's gate hooks on them."""
    if not dyt:
        return {}, None
    report = detect_gating(model, norm_names=[l.name for l in dyt], mapping=mapping)
    gating = {**report.to_dict(), "risk": {}}
    if not report.pairings:
        return gating, None
    counter = GateCounter(len(report.pairings), distributed_available_fn=_local_only).to(dyt[0].module.alpha.device)
    return gating, GateHooks(model, report, counter)


def _saturation_readout(
    readings: dict[str, LayerReading], dyt: list[NormLayer], counter: SaturationCounter | None,
    hooks: SaturationHooks | None, gating: dict[str, Any], gate_hooks: GateHooks | None,
    level: float, threshold: float, collapse_threshold: float,
) -> tuple[float | None, Verdict | None]:  # fmt: skip
    """Per-layer and pooled DyT saturation (this process only: no collective), then the verdict."""
    if counter is None or hooks is None:
        return None, None
    sat, total, bad, alphas = hooks.host_counts(sync=False)  # local: a probe on one rank never waits for others
    per_layer = {}
    for l, s, t, b, a in zip(dyt, sat, total, bad, alphas):
        r = readings[l.name]
        r.saturation, r.alpha, r.nonfinite = (s / t if t else None), a, b
        r.tokens = t // r.dim if r.dim else 0
        if t:
            per_layer[l.name] = s / t
    if not sum(total):
        return None, None
    pooled = sum(sat) / sum(total)
    pairings = gating.get("pairings", {})
    stats = gate_hooks.readings() if gate_hooks is not None else {}
    risk = {p["mlp"]: {"dyt_saturation": per_layer.get(norm, math.nan), **stats.get(norm, {})} for norm, p in pairings.items()}
    gating["risk"] = risk
    info = GatingInfo(bool(gating.get("gated")), tuple(pairings), gating.get("message", ""))
    counts = {l.name: LayerCounts(s, t, b) for l, s, t, b in zip(dyt, sat, total, bad)}
    verdict = build_verdict(counts, step=0, source=Source.PROBE, threshold=threshold, level=level, gating=info,
                            collapse_threshold=collapse_threshold, risk=risk)
    return pooled, verdict


def _sigma_readout(streams: dict[str, _Tap], skipped: dict[str, str]) -> SigmaMinReading:
    if not streams:
        return SigmaMinReading(reason="no residual blocks found: pass blocks=[...] (module names of the blocks)")
    names = list(streams)
    accs = [streams[n].ready() for n in names]
    missing = [n for n, a in zip(names, accs) if a is None]
    if missing:
        skipped.update({n: streams[n].skipped for n in missing})
        return SigmaMinReading(blocks=names, values=[], ratios=[], reason=f"no reading for streams {missing}")
    prof = sigma_min_profile(accs)
    if not prof.valid:
        return SigmaMinReading(names, prof.values, [None] * len(names), False, prof.reason)
    block_ratios = prof.ratios[1:]
    k = min(range(len(block_ratios)), key=block_ratios.__getitem__)
    return SigmaMinReading(names, prof.values, list(prof.ratios), True, "", block_ratios[k], names[k + 1])


def _norm_type(readings: dict[str, LayerReading]) -> tuple[str, str]:
    measured = [r.reading() for r in readings.values() if r.kind != "dyt" and r.alignment is not None]
    if measured:
        label = classify_model_norm_type(measured)
        counts = {t: sum(r.norm_type == t for r in readings.values()) for t in ("layernorm-like", "rmsnorm-like", "undetermined")}
        return label, f"{len(measured)} LayerNorm/RMSNorm layer(s) read: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    if any(r.kind == "dyt" for r in readings.values()):
        return "dyt", "only DyT layers: no normalisation, so no gamma^-1 kernel to test"
    return "undetermined", "no LayerNorm/RMSNorm layer was read"


def _attach_init_gap(report: Report, twin: Report) -> None:
    gaps: dict[str, InitGap] = {}
    for name, r in report.layers.items():
        mine = r.reading()
        if mine is None:
            continue
        other = twin.layers.get(name)
        if other is None or other.reading() is None:
            raise ValueError(
                f"Expected the twin to have a reading for {name!r}, got {'none' if other is None else 'a skipped layer'}."
                " Pass a random-init instance of the same architecture."
            )
        r.init_gap = gaps[name] = init_gap(mine, other.reading())[0]
    report.init_gap = gaps
