"""What architecture detection found about gated MLPs: one frozen representation, :class:`GatingInfo`.

Made by :func:`satmon.model.gating.detect_gating` (and the model map), read by the verdict, the
screen's gate hooks, the probe report and the writers. Nothing changes it after it is made: a
variant is a :func:`dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from satmon.results.frozen import FrozenMap

__all__ = ["GatedPairing", "GatingInfo"]


@dataclass(frozen=True)
class GatedPairing:
    """One norm feeding one gated MLP ``down(act(gate(h)) * up(h))``; all fields are module names.

    ``up`` is ``None`` when ``fused`` (``gate`` then names the fused gate-up projection; ``gate_first``
    says which half gates). ``activation`` is ``"silu"``, ``"gelu"``, ``"gelu_tanh"`` or what the
    trace or the module called it (``"unknown"`` when nothing said). ``source`` is the rule that
    paired them: ``"mapping"``, ``"trace"`` or ``"names"``. ``also_feeds`` lists further gated MLPs
    fed by the same norm (MoE experts). ``gate_stats`` is False when the gate pre-activations are
    not a module's output (experts computed inside one module): no gate statistics then.

    Example:
        >>> p = GatedPairing("ln", "mlp", "mlp.w1", "mlp.w3", "mlp.w2", False, "silu", "trace")
        >>> p.to_dict()["also_feeds"], p.gate_stats
        ([], True)
    """

    norm: str
    mlp: str
    gate: str
    up: str | None
    down: str
    fused: bool
    activation: str
    source: str
    also_feeds: tuple[str, ...] = ()
    gate_first: bool = True
    gate_stats: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["also_feeds"] = list(self.also_feeds)
        return d


@dataclass(frozen=True)
class GatingInfo:
    """Whether the watched DyT layers feed gated MLPs: the one representation of gating in satmon.

    Made by :func:`satmon.model.gating.detect_gating`; the verdict reads ``gated``, ``gated_layers`` and
    ``message``, the gate hooks ``pairings``, a :class:`~satmon.results.probe_report.ProbeReport` keeps the
    whole finding (its JSON ``gating`` record). Frozen down to its fields (tuples, read-only maps).

    Attributes:
        gated: ``True`` when a watched layer feeds a gated MLP directly (its gate and value
            projections read the layer's output, through views, casts, dropout or a permute; never
            through an addition with another stream), ``False`` when none does, ``None`` (unknown)
            when satmon could not tell: ``message`` then names the layer and the option that resolves it.
        gated_layers: the watched layers that feed a gated MLP (the keys of ``pairings``).
        message: the finding in words.
        pairings: layer name -> :class:`GatedPairing`.
        unpaired_gated_mlps: gated MLPs that no watched layer feeds directly (fed by other layers,
            through an addition, or not paired by names).
        unclassified: layer -> why its answer is unknown.

    Example:
        >>> info = GatingInfo(False, message="gated MLP after DyT: no (a traced forward shows no gated MLP)")
        >>> info.to_dict()["gated"], info.gated_layers, GatingInfo.from_dict(info.to_dict()) == info
        (False, (), True)
        >>> list(info.record())
        ['gated', 'pairings', 'unpaired_gated_mlps', 'message', 'unclassified']
    """

    gated: bool | None
    gated_layers: tuple[str, ...] = ()
    message: str = ""
    pairings: Mapping[str, GatedPairing] = FrozenMap()
    unpaired_gated_mlps: tuple[str, ...] = ()
    unclassified: Mapping[str, str] = FrozenMap()

    def __post_init__(self) -> None:
        if self.gated not in (True, False, None):
            raise ValueError(f"Expected `gated` to be True, False or None (unknown), got {self.gated!r}.")
        bad = [k for k, p in dict(self.pairings).items() if not isinstance(p, GatedPairing)]
        if bad:
            raise TypeError(
                f"Expected GatingInfo.pairings to hold GatedPairing values, got {type(self.pairings[bad[0]]).__name__} "
                f"for {bad[0]!r}. Read a dict back with GatingInfo.from_dict."
            )
        object.__setattr__(self, "gated_layers", tuple(self.gated_layers or tuple(self.pairings)))
        object.__setattr__(self, "pairings", FrozenMap(self.pairings))
        object.__setattr__(self, "unpaired_gated_mlps", tuple(self.unpaired_gated_mlps))
        object.__setattr__(self, "unclassified", FrozenMap(self.unclassified))

    @classmethod
    def of(cls, found: GatingInfo | None) -> GatingInfo | None:
        """``found`` itself (``None`` stays ``None``): what the verdict's callers pass on."""
        if found is not None and not isinstance(found, GatingInfo):
            raise TypeError(f"Expected a GatingInfo or None, got {type(found).__name__}.")
        return found

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain values (``dict``, ``list``)."""
        return {
            "gated": self.gated,
            "gated_layers": list(self.gated_layers),
            "message": self.message,
            "pairings": {k: p.to_dict() for k, p in self.pairings.items()},
            "unpaired_gated_mlps": list(self.unpaired_gated_mlps),
            "unclassified": dict(self.unclassified),
        }

    def record(self) -> dict[str, Any]:
        """The ``gating`` record of a probe report / replay JSON (the keys 0.2 wrote, in its order; the
        report adds the gate readings, ``risk``)."""
        d = self.to_dict()
        return {k: d[k] for k in ("gated", "pairings", "unpaired_gated_mlps", "message", "unclassified")}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GatingInfo:
        """Read back :meth:`to_dict` (or :meth:`record`)."""
        pairings = {
            k: GatedPairing(**{**p, "also_feeds": tuple(p.get("also_feeds", ()))})
            for k, p in d.get("pairings", {}).items()
        }
        return cls(
            d.get("gated"),
            tuple(d.get("gated_layers", pairings)),
            d.get("message", ""),
            pairings,
            tuple(d.get("unpaired_gated_mlps", ())),
            d.get("unclassified", {}),
        )
