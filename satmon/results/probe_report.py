"""Typed results of :func:`satmon.probe`: one reading per norm layer, the residual-stream profile, the report.

Plain data: no hooks, no files, no writers. Frozen, down to the fields (tuples and read-only
mappings, :mod:`satmon.results.frozen`); :func:`satmon.probe` builds each once, and a variant is
made with :func:`dataclasses.replace` (:meth:`ProbeReport.with_init_gap`). :meth:`ProbeReport.to_dict`
returns plain Python values (NaN stays NaN); whoever writes JSON sanitises it with
:func:`satmon.io.json_records.to_json`, and the TensorBoard tags come from
:func:`satmon.io.tensorboard.probe_scalars`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from satmon.functional.dead_directions import (
    Alignment,
    GramSpectrum,
    InitGap,
    NormType,
    classify_model_norm_type,
    init_gap,
    sigma_min_profile,
)
from satmon.results.frozen import FrozenMap, freeze, thaw
from satmon.results.gating import GatingInfo
from satmon.results.plan import MemoryPlan
from satmon.results.reading import Reading
from satmon.results.verdict import Verdict

__all__ = ["EMBEDDING", "LayerReading", "NormKind", "ProbeReport", "SigmaMinReading", "init_gaps", "model_norm_type"]

#: Name of the embedding output ``X_0`` (the first block's input) in :attr:`SigmaMinReading.blocks`.
EMBEDDING = "embedding"
#: The kinds of norm layer satmon reads (:func:`satmon.model.discovery.norm_kind` says which a module is).
NormKind = Literal["dyt", "layernorm", "rmsnorm"]


@dataclass(frozen=True)
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
        note: why ``norm_type`` is ``"undetermined"`` when the reading itself says so (too few tokens), else ``""``.

    Example:
        >>> r = LayerReading("ln_f", "layernorm", 64, alignment=0.99, null_projection=1.0, null_dim=1)
        >>> r.kernel_alignment()
        1.0
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
    note: str = ""

    def reading(self) -> Alignment | None:
        """The :class:`~satmon.functional.dead_directions.Alignment` behind a LayerNorm/RMSNorm
        reading (``None`` otherwise)."""
        if self.alignment is None:
            return None
        return Alignment(
            self.alignment,
            self.null_projection,
            self.null_dim,
            self.depth,
            self.depth_diag,
            self.lambda_min_rel,
            self.dim,
            self.n_degenerate,
        )

    def kernel_alignment(self) -> float | None:
        """``max(alignment, null_projection)``: how well ``v*`` sits in the output's kernel, whatever
        the null dimension (the cosine alone is arbitrary when ``null_dim >= 2``, the projection is 0
        when ``null_dim == 0``; with ``null_dim == 1`` the two are equal)."""
        if self.alignment is None:
            return None
        return max(self.alignment, self.null_projection or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The readings of this layer's kind, plain values (NaN kept)."""
        keys = (
            ("saturation", "alpha")
            if self.kind == "dyt"
            else (
                "alignment",
                "null_projection",
                "null_dim",
                "depth",
                "depth_diag",
                "lambda_min_rel",
                "n_degenerate",
                "norm_type",
            )
        )
        out = {"kind": self.kind, "dim": self.dim, "tokens": self.tokens, **{k: getattr(self, k) for k in keys}}
        out["nonfinite"] = self.nonfinite
        if self.note:
            out["note"] = self.note
        if self.init_gap is not None:
            out["init_gap"] = _gap_dict(self.init_gap)
        return out


@dataclass(frozen=True)
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

    Example:
        >>> SigmaMinReading(reason="no residual blocks found").to_dict()["valid"]
        False
    """

    blocks: tuple[str, ...] = ()
    values: tuple[float, ...] = ()
    ratios: tuple[float | None, ...] = ()
    valid: bool = False
    reason: str = ""
    min_ratio: float | None = None
    argmin: str | None = None

    def __post_init__(self) -> None:
        for name in ("blocks", "values", "ratios"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @classmethod
    def from_spectra(cls, streams: list[str], spectra: Mapping[str, GramSpectrum]) -> SigmaMinReading:
        """The profile over ``streams`` (``X_0`` first) from each one's
        :class:`~satmon.functional.dead_directions.GramSpectrum`
        (:func:`~satmon.functional.dead_directions.sigma_min_profile`); a stream without one makes it invalid.

        Example:
            >>> import torch
            >>> from satmon.functional.dead_directions import gram_spectrum
            >>> x0 = torch.tensor([[3.0, 0.0], [0.0, 2.0]])
            >>> spectra = {"embedding": gram_spectrum(x0), "b0": gram_spectrum(x0 / 4)}
            >>> s = SigmaMinReading.from_spectra(["embedding", "b0"], spectra)
            >>> s.ratios, s.min_ratio, s.argmin
            ((1.0, 0.25), 0.25, 'b0')
        """
        if not streams:
            return cls(reason="no residual blocks found: pass blocks=[...] (module names of the blocks)")
        missing = [n for n in streams if n not in spectra]
        if missing:
            return cls(blocks=tuple(streams), reason=f"no reading for streams {missing}")
        prof = sigma_min_profile([spectra[n] for n in streams])
        if not prof.valid:
            return cls(tuple(streams), tuple(prof.values), (None,) * len(streams), False, prof.reason)
        block_ratios = prof.ratios[1:]
        k = min(range(len(block_ratios)), key=block_ratios.__getitem__)
        return cls(tuple(streams), tuple(prof.values), tuple(prof.ratios), True, "", block_ratios[k], streams[k + 1])

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain values (lists)."""
        return {
            "blocks": list(self.blocks),
            "values": list(self.values),
            "ratios": list(self.ratios),
            "valid": self.valid,
            "reason": self.reason,
            "min_ratio": self.min_ratio,
            "argmin": self.argmin,
        }


@dataclass(frozen=True)
class ProbeReport:
    """What :func:`satmon.probe` measured.

    Attributes:
        layers: layer name -> :class:`LayerReading`, in registration order (read-only).
        sigma_min: the residual-stream profile (:class:`SigmaMinReading`).
        norm_type: the model's norm type from its LayerNorm/RMSNorm layers
            (:func:`~satmon.functional.dead_directions.classify_model_norm_type`: ``"layernorm-like"``,
            ``"rmsnorm-like"``, ``"undetermined"``), or ``"dyt"`` when the only norm layers are DyT
            (no kernel to test: DyT has no mean subtraction and no normalisation).
        norm_type_note: how ``norm_type`` was reached, in words.
        saturation: pooled DyT saturation (``None`` without DyT layers).
        verdict: the GO / NO-GO :class:`~satmon.results.verdict.Verdict` on the pooled saturation (``None``
            without DyT); its ``source`` is ``"probe"`` (or ``"replay"``), its ``window`` 0. The
            per-gated-MLP readings (DyT saturation, gate statistics) are its ``risk``.
        gating: what gated-MLP detection found (:class:`~satmon.results.verdict.GatingInfo`); ``None``
            without DyT (nothing to pair).
        init_gap: layer -> satmon's :class:`~satmon.functional.dead_directions.InitGap` when a twin was given.
        tokens: rows of ``X_0`` (batch x sequence) when blocks were found, else the most rows any
            monitored layer saw.
        batches: batches in the calibration set (each pass of a multi-pass plan runs all of them).
        elapsed_s: wall time of the call (twin included).
        skipped: layer or stream -> why it has no reading (read-only).
        plan: how the covariance matrices were grouped into passes (:class:`~satmon.results.plan.MemoryPlan`);
            not part of :meth:`to_dict`.
        reading: the DyT layers' :class:`~satmon.results.reading.Reading` the verdict was made from (the live
            window's kind of reading); ``None`` without DyT; not part of :meth:`to_dict` (the verdict holds it).

    Example:
        >>> r = ProbeReport(layers={}, sigma_min=SigmaMinReading(), norm_type="undetermined")
        >>> sorted(r.to_dict())[:3], r.gating is None
        (['batches', 'elapsed_s', 'gating'], True)
    """

    layers: Mapping[str, LayerReading]
    sigma_min: SigmaMinReading
    norm_type: str
    norm_type_note: str = ""
    saturation: float | None = None
    verdict: Verdict | None = None
    gating: GatingInfo | None = None
    init_gap: Mapping[str, InitGap] | None = None
    tokens: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    skipped: Mapping[str, str] = FrozenMap()
    plan: MemoryPlan | None = None
    reading: Reading | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", FrozenMap(self.layers))
        object.__setattr__(self, "skipped", freeze(self.skipped))
        if self.init_gap is not None:
            object.__setattr__(self, "init_gap", FrozenMap(self.init_gap))
        if isinstance(self.gating, Mapping):
            raise TypeError(
                f"Expected `gating` to be a satmon.results.verdict.GatingInfo or None, got a "
                f"{type(self.gating).__name__}. Build it with GatingInfo.of(detect_gating(...))."
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain values under the keys ``satmon replay`` writes; NaN and inf are kept, so write JSON
        through :func:`satmon.io.json_records.to_json` (NaN/inf -> ``null``). ``gating`` holds the
        detection's record and the verdict's per-gated-MLP ``risk`` (``{}`` without DyT)."""
        gating: dict[str, Any] = {}
        if self.gating is not None:  # the detection's record and the readings
            gating = {**self.gating.record(), "risk": thaw(self.verdict.risk) if self.verdict else {}}
        return {
            "layers": {n: l.to_dict() for n, l in self.layers.items()},
            "sigma_min": self.sigma_min.to_dict(),
            "norm_type": self.norm_type,
            "norm_type_note": self.norm_type_note,
            "saturation": self.saturation,
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "gating": gating,
            "init_gap": None if self.init_gap is None else {n: _gap_dict(g) for n, g in self.init_gap.items()},
            "tokens": self.tokens,
            "batches": self.batches,
            "elapsed_s": self.elapsed_s,
            "skipped": dict(self.skipped),
        }

    def with_init_gap(self, twin: ProbeReport) -> ProbeReport:
        """This report with :attr:`init_gap` (and each layer's) read against the probe of a random-init
        ``twin`` of the same model (:func:`init_gaps`); a new report, this one is unchanged.

        Raises:
            ValueError: the twin has no reading for a layer this report read.
        """
        gaps = init_gaps(self.layers, twin.layers)
        layers = {n: replace(r, init_gap=gaps[n]) if n in gaps else r for n, r in self.layers.items()}
        return replace(self, layers=layers, init_gap=gaps)

    def summary(self) -> str:
        """One line: norm type, the weakest LayerNorm alignment, the sigma_min minimum, the saturation."""
        parts = [f"satmon probe: norm type {self.norm_type}"]
        aligns = [
            (l.kernel_alignment(), n)
            for n, l in self.layers.items()
            if l.kind == "layernorm" and l.alignment is not None
        ]
        if aligns:
            a, n = min(aligns)
            parts.append(f"min LayerNorm alignment {a:.6f} ({n})")
        if self.sigma_min.valid:
            parts.append(f"min sigma_min ratio {self.sigma_min.min_ratio:.4f} ({self.sigma_min.argmin})")
        if self.saturation is not None:
            parts.append(f"DyT saturation {self.saturation:.4f}")
        return "; ".join(parts) + f" [{self.batches} batches, {self.tokens} tokens, {self.elapsed_s:.2f}s]"


def init_gaps(trained: Mapping[str, LayerReading], twin: Mapping[str, LayerReading]) -> dict[str, InitGap]:
    """Per LayerNorm/RMSNorm reading of ``trained``: satmon's init-gap against the same layer of ``twin``
    (:func:`~satmon.functional.dead_directions.init_gap`).

    Raises:
        ValueError: the twin has no reading for a layer ``trained`` read.

    Example:
        >>> deep = LayerReading("ln", "layernorm", 8, alignment=1.0, null_projection=1.0, null_dim=1, depth=1e-10,
        ...                     depth_diag=1e-10, lambda_min_rel=1e-10, n_degenerate=0)
        >>> shallow = replace(deep, depth=1e-3, depth_diag=1e-3, lambda_min_rel=1e-3)
        >>> round(init_gaps({"ln": deep}, {"ln": shallow})["ln"].depth_deepening, 6)
        7.0
    """
    gaps: dict[str, InitGap] = {}
    for name, r in trained.items():
        mine = r.reading()
        if mine is None:
            continue
        other = twin.get(name)
        if other is None or other.reading() is None:
            raise ValueError(
                f"Expected the twin to have a reading for {name!r}, got "
                f"{'none' if other is None else 'a skipped layer'}."
                " Pass a random-init instance of the same architecture."
            )
        gaps[name] = init_gap(mine, other.reading())[0]
    return gaps


def model_norm_type(readings: Mapping[str, LayerReading]) -> tuple[str, str]:
    """The model's norm type from its layers' readings, and how it was reached, in words.

    Example:
        >>> model_norm_type({"ln_f": LayerReading("ln_f", "dyt", 4)})
        ('dyt', 'only DyT layers: no normalisation, so no gamma^-1 kernel to test')
    """
    measured = [r.reading() for r in readings.values() if r.kind != "dyt" and r.alignment is not None]
    if measured:
        label = classify_model_norm_type(measured)
        counts = {
            t: sum(r.norm_type == t for r in readings.values())
            for t in ("layernorm-like", "rmsnorm-like", "undetermined")
        }
        return label, f"{len(measured)} LayerNorm/RMSNorm layer(s) read: " + ", ".join(
            f"{v} {k}" for k, v in counts.items() if v
        )
    if any(r.kind == "dyt" for r in readings.values()):
        return "dyt", "only DyT layers: no normalisation, so no gamma^-1 kernel to test"
    return "undetermined", "no LayerNorm/RMSNorm layer was read"


def _gap_dict(gap: InitGap) -> dict[str, float]:
    return {"depth_deepening": gap.depth_deepening, "lambda_min_deepening": gap.lambda_min_deepening}
