"""DyT's effect forecast from a run's planned passes over its unique data: the rule, derived from known cells.

The one signal that held across the study's cells and satmon's faithful CPU grid is known before step 1: at
few passes over the unique data DyT's final held-out loss was worse than LayerNorm's in every known cell. The
rule here states only what the known cells show, and is read from them, never written in:

* a **known cell** (:class:`KnownCell`) is one trained pair (DyT and LayerNorm, same size, data and budget): its
  model size, its passes over the unique data, and DyT's effect on the final held-out loss (``delta``, negative
  when DyT helped); where recorded, the same on each arm's best held-out loss (``best_delta``);
* the run's passes ``p`` must lie within the passes the cells measured (up to :data:`BUDGET_TOLERANCE` beyond the
  fewest and the most): ``L`` is the most passes of a cell at or below ``p``, ``U`` the fewest at or above it (two
  budgets within :data:`BUDGET_TOLERANCE` of each other are one);
* **"hurts"** when every known cell at or below ``U`` passes hurt, and they are enough: their distinct
  configurations (model size x budget x source; seeds of one configuration count once) beat a coin by the
  one-sided exact binomial test (all ``n`` agreeing: ``2**-n < 0.05``, so at least 5); and the run's size and its
  tokens per parameter lie within :data:`REACH` of those cells' range. DyT's effect is read as growing with
  the passes (the cells show it hurting at few passes and helping only at many): a cell at more passes than the
  run that hurt supports "hurts" only through that reading, which is why the cells at or below ``U`` must all agree;
* **"helps"**: the mirror, every known cell at or above ``L`` passes helped, with the same test and reach;
* **"uncertain"** otherwise, with the counts on both sides and why (a cell that disagrees, too few, the run outside
  the passes or sizes the cells cover, passes between two budgets whose cells differ).

A new file of cells (another grid) changes the outcome with no change here: a cell that contradicts a confident
outcome turns it into "uncertain". Nothing here reads files (:mod:`satmon.io.known_cells` does).

Example:
    >>> cells = [KnownCell(f"c{i}", params=1e5 * (i + 1), passes=2.0, delta=0.1, group=f"g{i}", source="mine")
    ...          for i in range(5)]
    >>> f = forecast_from(cells, params=3e5, unique_tokens=1_000_000, planned_tokens=2_000_000)
    >>> f.outcome, f.passes, f.agreeing, f.cells
    ('hurts', 2.0, 5, 5)
    >>> forecast_from(cells[:4], params=3e5, unique_tokens=1_000_000, planned_tokens=2_000_000).outcome  # 4: 1/16
    'uncertain'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from satmon.functional.significance import ALPHA, beats, binomial_tail
from satmon.results.run_scale import si

__all__ = ["BUDGET_TOLERANCE", "CODE", "OUTCOMES", "REACH", "Forecast", "KnownCell", "Outcome", "checkpoint_sentence", "forecast_from", "passes_text",
           "unknown_forecast"]

Outcome = Literal["hurts", "helps", "uncertain"]
#: What :attr:`Forecast.outcome` can say.
OUTCOMES: tuple[str, ...] = ("hurts", "helps", "uncertain")
#: The scalar each outcome is logged as (``satmon/forecast``): 1 helps, -1 hurts, 0 uncertain (passes unknown too).
CODE = {"helps": 1.0, "hurts": -1.0, "uncertain": 0.0}
#: Two budgets within this factor are one (the study's 3.28 passes and the grid's 3.30), and a run's passes may lie
#: this far beyond the fewest or the most any cell measured.
BUDGET_TOLERANCE = 1.1
#: How far beyond the range of the supporting cells' sizes (and tokens per parameter) a confident outcome reaches:
#: half a decade (sqrt(10) = 3.16x). Further out nothing was measured.
REACH = math.sqrt(10.0)


@dataclass(frozen=True)
class KnownCell:
    """One trained pair, DyT and LayerNorm at the same size, data and budget.

    Attributes:
        name: the cell's name. params: the model's parameters. passes: planned tokens over unique training tokens.
        delta: (DyT - LayerNorm) / LayerNorm final held-out loss (< 0: DyT helped).
        group: its model size (cells of one size and budget from one source are one configuration).
        source: where it comes from (the study, a grid).
        train_tokens: its unique training tokens, when known.
        best_delta: the same on each arm's best held-out loss over training, when recorded.
    """

    name: str
    params: float
    passes: float
    delta: float
    group: str
    source: str
    train_tokens: float | None = None
    best_delta: float | None = None

    @property
    def outcome(self) -> str:
        """``"helps"``, ``"hurts"`` or ``"tie"`` (equal final losses: neither)."""
        return "helps" if self.delta < 0 else "hurts" if self.delta > 0 else "tie"

    @property
    def tokens_per_param(self) -> float | None:
        return None if self.train_tokens is None else self.train_tokens / self.params


@dataclass(frozen=True)
class Forecast:
    """DyT's effect on the final held-out loss against LayerNorm, forecast from the run's planned passes.

    Attributes:
        outcome: ``"hurts"``, ``"helps"`` or ``"uncertain"`` (:data:`OUTCOMES`).
        passes: planned tokens over unique training tokens (``None``: not known).
        tokens_per_param: unique training tokens per parameter (``None``: not known).
        params, unique_tokens, planned_tokens: what the forecast was asked about (``None``: not known).
        evidence: the known cells it rests on, counted, in one sentence (or why it is uncertain).
        checkpoint_selection: what the known cells show about DyT's best checkpoint against LayerNorm's best.
        cells: the known cells in the region the outcome was read from. agreeing: how many of them agree with a
            confident outcome (for "uncertain": those that hurt). configurations: their distinct size x budget x
            source configurations. p_value: the binomial test's (all configurations agreeing, against a coin);
            ``None`` when no test was made.
    """

    outcome: str
    passes: float | None
    tokens_per_param: float | None
    evidence: str
    checkpoint_selection: str
    params: float | None = None
    unique_tokens: float | None = None
    planned_tokens: float | None = None
    cells: int = 0
    agreeing: int = 0
    configurations: int = 0
    p_value: float | None = None

    @property
    def code(self) -> float:
        """The logged scalar (:data:`CODE`)."""
        return CODE[self.outcome]

    def line(self) -> str:
        """The card's line: the outcome, the passes and what it rests on.

        Example:
            >>> print(unknown_forecast(1000, "the planned tokens are unknown").line())  # doctest: +ELLIPSIS
            Forecast from the planned passes: uncertain: the planned tokens are unknown...
        """
        if self.passes is None:
            return f"Forecast from the planned passes: uncertain: {self.evidence}"
        word = {"hurts": "DyT's final loss expected above LayerNorm's", "helps": "DyT's final loss expected below LayerNorm's",
                "uncertain": "uncertain"}[self.outcome]
        return (f"Forecast from the planned passes ({passes_text(self.passes)} over the unique data, "
                f"{self.tokens_per_param:.3g} tokens per parameter): **{self.outcome}**"
                + (f", {word}" if self.outcome != "uncertain" else "") + f": {self.evidence} {self.checkpoint_selection}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"Expected {name} as a positive number, got {value!r}: pass the count (e.g. {name}=1_000_000).")
    return float(value)


def _config(c: KnownCell) -> tuple[str, str, float]:
    return c.source, c.group, float(f"{c.passes:.3g}")


def passes_text(p: float) -> str:
    """``p`` passes in words (three figures; "1 pass").

    Example:
        >>> passes_text(1.0), passes_text(3.2768)
        ('1 pass', '3.28 passes')
    """
    return f"{p:.3g} pass" + ("" if f"{p:.3g}" == "1" else "es")


def _sources(cells: Sequence[KnownCell]) -> str:
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.source] = counts.get(c.source, 0) + 1
    return ", ".join(f"{n} from {s}" for s, n in counts.items())


def _span(values: Sequence[float]) -> tuple[float, float]:
    return min(values), max(values)


def _within(x: float, values: Sequence[float]) -> bool:
    lo, hi = _span(values)
    return lo / REACH <= x <= hi * REACH


def checkpoint_sentence(cells: Sequence[KnownCell]) -> str:
    """What the known cells that recorded each arm's best held-out loss show about checkpoint selection.

    Example:
        >>> cells = [KnownCell("a", 1e5, 164, -0.2, "s", "g", best_delta=0.01), KnownCell("b", 1e5, 3, 0.1, "s", "g", best_delta=0.1)]
        >>> print(checkpoint_sentence(cells))  # doctest: +NORMALIZE_WHITESPACE
        Checkpoint selection: in the 2 known cells that recorded each arm's best held-out loss (2 from g), DyT's best
        checkpoint beat LayerNorm's best in 0; where DyT's final loss won (1), LayerNorm's final loss was above its own best.
    """
    best = [c for c in cells if c.best_delta is not None]
    if not best:
        return "Checkpoint selection: no known cell recorded each arm's best held-out loss."
    won_best = sum(c.best_delta < 0 for c in best)  # type: ignore[operator]
    won_final_only = [c for c in best if c.delta < 0 and c.best_delta >= 0]  # type: ignore[operator]
    text = (f"Checkpoint selection: in the {len(best)} known cells that recorded each arm's best held-out loss "
            f"({_sources(best)}), DyT's best checkpoint beat LayerNorm's best in {won_best}")
    if won_final_only:
        # delta < 0 <= best_delta: LN best <= DyT best <= DyT final < LN final, so LayerNorm's final is above its best
        text += (f"; where DyT's final loss won ({len(won_final_only)}), LayerNorm's final loss was above its own best")
    return text + "."


def unknown_forecast(params: float | None, why: str) -> Forecast:
    """The forecast of a run whose planned passes are not known: ``"uncertain"``, saying why and how to give them."""
    return Forecast("uncertain", None, None, why + (": give them as planned_tokens= (the tokens training will process: "
                                                    "optimizer steps x global batch x sequence length) and train_tokens= "
                                                    "(the unique tokens of the training data), options of "
                                                    "SaturationMonitor, the Hugging Face callback, Screen and Settings."),
                    "", params=params)


def forecast_from(cells: Sequence[KnownCell], *, params: float, unique_tokens: float, planned_tokens: float) -> Forecast:
    """DyT's effect on the final held-out loss of a run, read from known ``cells`` (module docstring: the rule).

    Args:
        cells: the known cells (:func:`satmon.io.known_cells.known_cells` reads the shipped ones).
        params: the run's parameters.
        unique_tokens: the unique tokens of its training data.
        planned_tokens: the tokens training will process (steps x global batch x sequence length).

    Raises:
        ValueError: a count that is not a positive number.

    Example:
        >>> mixed = [KnownCell(f"c{i}", 1e5, 100.0, (-1) ** i * 0.1, f"g{i}", "mine") for i in range(8)]
        >>> f = forecast_from(mixed, params=1e5, unique_tokens=1e6, planned_tokens=1e8)
        >>> f.outcome, f.agreeing, f.cells
        ('uncertain', 4, 8)
    """
    params, unique, planned = (_positive("params", params), _positive("unique_tokens", unique_tokens),
                               _positive("planned_tokens", planned_tokens))
    p, tpp = planned / unique, unique / params
    known = [c for c in cells if math.isfinite(c.passes) and c.passes > 0 and math.isfinite(c.delta) and c.params > 0]
    checkpoint = checkpoint_sentence(known)

    def out(outcome: str, evidence: str, region: Sequence[KnownCell] = (), agreeing: int = 0,
            p_value: float | None = None) -> Forecast:
        return Forecast(outcome, p, tpp, evidence, checkpoint, params, unique, planned, len(region), agreeing,
                        len({_config(c) for c in region}), p_value)

    if not known:
        return out("uncertain", "no known cell to forecast from.")
    lo, hi = _span([c.passes for c in known])
    if p < lo / BUDGET_TOLERANCE:
        return out("uncertain", f"{passes_text(p)} is fewer than any known cell measured (the fewest: {lo:.3g}, in "
                                f"{sum(c.passes <= lo * BUDGET_TOLERANCE for c in known)} cells): nothing is known there.")
    if p > hi * BUDGET_TOLERANCE:
        return out("uncertain", f"{passes_text(p)} is more than any known cell measured (the most: {hi:.3g}): nothing is "
                                "known there.")
    upper = min(c.passes for c in known if c.passes >= p / BUDGET_TOLERANCE)
    lower = max(c.passes for c in known if c.passes <= p * BUDGET_TOLERANCE)
    below = [c for c in known if c.passes <= upper * BUDGET_TOLERANCE]
    above = [c for c in known if c.passes >= lower / BUDGET_TOLERANCE]
    sizes = ""
    for outcome, region, where in (("hurts", below, f"at or below {max(c.passes for c in below):.3g} passes"),
                                   ("helps", above, f"at or above {min(c.passes for c in above):.3g} passes")):
        agree = sum(c.outcome == outcome for c in region)
        if agree != len(region):
            continue
        n = len({_config(c) for c in region})
        p_value = binomial_tail(n, n, 0.5)
        plo, phi = _span([c.params for c in region])
        worse = "worse" if outcome == "hurts" else "better"
        counted = (f"DyT's final loss was {worse} than LayerNorm's in {agree}/{len(region)} known cells {where} "
                   f"({_sources(region)}; {n} configurations of size and budget, p = {p_value:.2g} against a coin), from "
                   f"{si(plo)} to {si(phi)} parameters")
        if not beats(n, n, 0.5, ALPHA):
            sizes = f"{counted}: too few configurations for the binomial test (p >= {ALPHA:g}), so no confident outcome."
            continue
        if not _within(params, [c.params for c in region]):
            sizes = (f"{counted}, but this run's {si(params)} parameters lie more than {REACH:.2g}x outside that range: "
                     "nothing was measured at its size.")
            continue
        ratios = [c.tokens_per_param for c in region if c.tokens_per_param is not None]
        if ratios and not _within(tpp, ratios):
            sizes = (f"{counted}, but this run's {tpp:.3g} unique tokens per parameter lie more than {REACH:.2g}x outside "
                     f"their {min(ratios):.2g}-{max(ratios):.2g}: nothing was measured there.")
            continue
        return out(outcome, counted + ".", region, agree, p_value)
    hurt_below = sum(c.outcome == "hurts" for c in below)
    helped_above = sum(c.outcome == "helps" for c in above)
    bracket = (f"at {passes_text(p)} (between the known budgets {lower:.3g} and {upper:.3g})"
               if upper > lower * BUDGET_TOLERANCE else f"at {passes_text(p)}")
    text = (f"{bracket}, DyT's final loss was worse in {hurt_below}/{len(below)} known cells at or below "
            f"{max(c.passes for c in below):.3g} passes and better in {helped_above}/{len(above)} at or above "
            f"{min(c.passes for c in above):.3g}")
    if sizes:
        return out("uncertain", sizes, below, hurt_below)
    return out("uncertain", text + ": the cells disagree, so no confident outcome.", below, hurt_below)
