"""DyT's effect forecast from a run's planned passes over its unique data: the rule, derived from known cells.

The rule states only what the known cells show, and is read from them, never written in (:func:`forecast_from`
states it in full): a **known cell** (:class:`KnownCell`) is one trained pair (DyT and LayerNorm, same size, data,
budget and schedule); only the cells at the run's budget (or the measured budgets either side of it) bear on it,
counted per configuration (seeds once); a confident "hurts" or "helps" needs every bearing configuration to agree,
enough of them for the one-sided exact binomial test against a coin (p < 0.05), the run inside the convex hull of
those configurations in (log parameters, log unique tokens per parameter), and its optimizer steps, warm-up share
and learning-rate shape within what they trained. Else "uncertain", with the rate and its 95% interval, or the
nearest measured cells and what differs.

A new file of cells (another grid) changes the outcome with no change here: a cell that contradicts a confident
outcome turns it into "uncertain". Nothing here reads files (:mod:`satmon.io.known_cells` does).

Example:
    >>> cells = [KnownCell(f"c{i}", params=1e5, passes=2.0, delta=0.1, group=f"g{i}", source="mine") for i in range(5)]
    >>> f = forecast_from(cells, params=1e5, unique_tokens=1_000_000, planned_tokens=2_000_000)
    >>> f.outcome, f.passes, f.agreeing, f.configurations  # no cell says its tokens per parameter: outside
    ('uncertain', 2.0, 5, 5)
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from satmon.functional.significance import ALPHA, beats, binomial_tail
from satmon.results.run_scale import si

__all__ = ["BUDGET_TOLERANCE", "CODE", "OUTCOMES", "HULL_TOLERANCE", "UNKNOWN_SCHEDULE", "WARMUP_TOLERANCE", "clopper_pearson", "hull", "hull_distance", "Forecast", "KnownCell", "Outcome", "checkpoint_sentence", "forecast_from", "passes_text",
           "unknown_forecast"]

Outcome = Literal["hurts", "helps", "uncertain"]
#: What :attr:`Forecast.outcome` can say.
OUTCOMES: tuple[str, ...] = ("hurts", "helps", "uncertain")
#: The scalar each outcome is logged as (``satmon/forecast``): 1 helps, -1 hurts, 0 uncertain (passes unknown too).
CODE = {"helps": 1.0, "hurts": -1.0, "uncertain": 0.0}
#: Two budgets within this factor are one (the study's 3.28 passes and the grid's 3.30), and a run's passes may lie
#: this far beyond the fewest or the most any cell measured.
BUDGET_TOLERANCE = 1.1


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
    steps: float | None = None
    warmup_steps: float | None = None
    lr_schedule: str | None = None

    @property
    def warmup_share(self) -> float | None:
        return None if self.steps is None or self.warmup_steps is None else self.warmup_steps / self.steps

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
    """A count as a float: any real number type (int, float, numpy scalars, a torch 0-d tensor, Decimal, Fraction)."""
    if not isinstance(value, bool) and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy scalar, torch 0-d tensor
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise ValueError(f"Expected {name} as a positive number, got {value!r}: pass the count (e.g. {name}=1_000_000).")
    infinite = (isinstance(value, float) and math.isinf(value)) or (isinstance(value, Decimal) and value.is_infinite())
    try:
        x = float(value)
    except OverflowError:  # an exact number beyond a float's range (an int of 400 digits)
        x = math.inf
    except ValueError:  # Decimal's signalling NaN
        x = math.nan
    if math.isinf(x) and not infinite:  # finite, but no float holds it (Decimal('1e400') gives inf silently)
        raise ValueError(f"Expected {name} as a positive number a float can hold (below 1.8e308), got one too large "
                         f"({str(value)[:12]}... with {len(str(value))} digits).")
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"Expected {name} as a positive number, got {value!r}: pass a finite count "
                         f"(e.g. {name}=1_000_000).")
    return x


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


#: The run's point may lie this far (in decades of log10 parameters and log10 unique tokens per parameter) outside the
#: convex hull of its supporting configurations: the grain of the measurement (the study's "64M" is a label), no more.
HULL_TOLERANCE = 0.1
#: A run's warm-up share (warm-up steps over steps) may differ this much from the supporting cells' range.
WARMUP_TOLERANCE = 0.05
#: The learning-rate shape of a run whose scheduler could not be read.
UNKNOWN_SCHEDULE = "unknown"


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def hull(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The convex hull of ``points``, counter-clockwise (Andrew's monotone chain; 1 or 2 points when degenerate).

    Example:
        >>> hull([(0, 0), (1, 0), (0, 1), (1, 1), (0.5, 0.5)])
        [(0, 0), (1, 0), (1, 1), (0, 1)]
    """
    pts = sorted(set(points))
    if len(pts) <= 2:
        return pts
    lower: list[tuple[float, float]] = []
    upper: list[tuple[float, float]] = []
    for chain, seq in ((lower, pts), (upper, pts[::-1])):
        for q in seq:
            while len(chain) >= 2 and _cross(chain[-2], chain[-1], q) <= 0:
                chain.pop()
            chain.append(q)
    return lower[:-1] + upper[:-1]


def _segment_distance(q: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    dx, dy = b[0] - a[0], b[1] - a[1]
    t = 0.0 if dx == dy == 0 else max(0.0, min(1.0, ((q[0] - a[0]) * dx + (q[1] - a[1]) * dy) / (dx * dx + dy * dy)))
    return math.hypot(q[0] - a[0] - t * dx, q[1] - a[1] - t * dy)


def hull_distance(q: tuple[float, float], points: Sequence[tuple[float, float]]) -> float:
    """How far ``q`` lies outside the convex hull of ``points`` (0 inside or on it; ``inf`` with no points).

    Example:
        >>> square = [(0, 0), (1, 0), (0, 1), (1, 1)]
        >>> hull_distance((0.5, 0.5), square), hull_distance((2, 0.5), square)
        (0.0, 1.0)
    """
    h = hull(points)
    if not h:
        return math.inf
    if len(h) >= 3 and all(_cross(h[i], h[(i + 1) % len(h)], q) >= 0 for i in range(len(h))):
        return 0.0
    edges = [(h[i], h[(i + 1) % len(h)]) for i in range(len(h))] if len(h) > 1 else [(h[0], h[0])]
    return min(_segment_distance(q, a, b) for a, b in edges)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``level`` interval of a rate seen as ``k`` of ``n``, by bisection on the binomial tail.

    Example:
        >>> [round(x, 3) for x in clopper_pearson(14, 15)]
        [0.681, 0.998]
    """
    a = (1 - level) / 2

    def solve(f: Any) -> float:  # f increasing in the rate, f(r) = a
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < a else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda r: binomial_tail(k, n, r))  # P(X >= k | r) = a
    high = 1.0 if k == n else solve(lambda r: binomial_tail(k + 1, n, r) - (1 - a) + a)  # P(X <= k | r) = a
    return low, high


def _point(params: float, tpp: float) -> tuple[float, float]:
    return math.log10(params), math.log10(tpp)


def _describe(c: KnownCell) -> str:
    tpp = "?" if c.tokens_per_param is None else f"{c.tokens_per_param:.3g}"
    steps = "unknown schedule" if c.steps is None or c.lr_schedule is None else (
        f"{c.steps:,.0f} steps, {c.warmup_steps or 0:,.0f} warm-up, {c.lr_schedule}")
    return f"{c.name} ({si(c.params)} parameters, {tpp} tokens/parameter, {passes_text(c.passes)}, {steps})"


def forecast_from(cells: Sequence[KnownCell], *, params: float, unique_tokens: float, planned_tokens: float,
                  steps: float | None = None, warmup_steps: float | None = None,
                  lr_schedule: str | None = None) -> Forecast:
    """DyT's effect on the final held-out loss of a run, read from known ``cells``: the rule below.

    * **What bears on the run**: the cells at its budget (passes within :data:`BUDGET_TOLERANCE`), else at the two
      measured budgets on either side of it. Cells at other budgets do not: the passes at which the sign flips
      depends on size (the cells show no monotone reading).
    * **Counted per configuration** (source x size x budget): seeds of one configuration count once; a
      configuration agrees only when its seeds do. A confident outcome needs every bearing configuration to agree
      and their number to beat a coin by the one-sided exact binomial test (``2**-n < 0.05``: at least 5).
    * **Domain**: the run must lie inside the convex hull of the supporting configurations in (log10 parameters,
      log10 unique tokens per parameter), up to :data:`HULL_TOLERANCE`; its optimizer ``steps`` within
      :data:`BUDGET_TOLERANCE` of the steps they trained, its warm-up share within :data:`WARMUP_TOLERANCE` of theirs
      and its ``lr_schedule`` one of theirs. A run whose steps or schedule are not given (or a cell whose are not
      recorded) does not support a confident answer.
    * Else **"uncertain"**, with the rate and its Clopper-Pearson 95% interval where the configurations agree in
      part, or the nearest measured cells and what differs.

    Raises:
        ValueError: a count that is not a positive number a float can hold.

    Example:
        >>> cells = [KnownCell(f"c{i}", params=10 ** (5 + i % 2), passes=2.0, delta=0.1, group=f"g{i}", source="m",
        ...                    train_tokens=10 ** (6 + i // 2), steps=5000, warmup_steps=2000,
        ...                    lr_schedule="linear-warmup-constant") for i in range(6)]
        >>> run = dict(params=3e5, unique_tokens=3e6 * 3, planned_tokens=2 * 9e6)
        >>> forecast_from(cells, **run).outcome  # steps and schedule not given
        'uncertain'
        >>> f = forecast_from(cells, **run, steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")
        >>> f.outcome, f.configurations, f.p_value
        ('hurts', 6, 0.015625)
    """
    params, unique, planned = (_positive("params", params), _positive("unique_tokens", unique_tokens),
                               _positive("planned_tokens", planned_tokens))
    run_steps = None if steps is None else _positive("steps", steps)
    run_warmup = None if warmup_steps is None else (
        0.0 if not isinstance(warmup_steps, bool) and warmup_steps == 0 else _positive("warmup_steps", warmup_steps))
    if lr_schedule is not None and (not isinstance(lr_schedule, str) or not lr_schedule.strip()):
        raise ValueError(f"Expected lr_schedule as the learning rate's shape, a str such as 'linear-warmup-constant' "
                         f"(the study's), got {lr_schedule!r}.")
    schedule = None if lr_schedule in (None, UNKNOWN_SCHEDULE) else lr_schedule.strip()
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
    region = [c for c in known if lower / BUDGET_TOLERANCE <= c.passes <= upper * BUDGET_TOLERANCE]
    where = (f"at {lower:.3g} passes" if upper <= lower * BUDGET_TOLERANCE
             else f"at {lower:.3g} and {upper:.3g} passes (the measured budgets either side of {passes_text(p)})")
    configs: dict[tuple[str, str, float], list[KnownCell]] = {}
    for c in region:
        configs.setdefault(_config(c), []).append(c)
    n = len(configs)
    votes = {o: sum(all(c.outcome == o for c in cs) for cs in configs.values()) for o in ("hurts", "helps")}
    outcome = max(votes, key=votes.__getitem__)
    k = votes[outcome]
    worse = "worse" if outcome == "hurts" else "better"
    p_value = binomial_tail(n, n, 0.5) if k == n else None
    counted = (f"DyT's final loss was {worse} than LayerNorm's in {k} of the {n} configurations {where} "
               f"({len(region)} cells: {_sources(region)}; seeds of one configuration counted once)")
    if k < n:
        low, high = clopper_pearson(k, n)
        return out("uncertain", f"{counted}, 95% interval {low:.0%}-{high:.0%}: the configurations disagree, so no "
                                "confident outcome.", region, k)
    if not beats(n, n, 0.5, ALPHA):
        return out("uncertain", f"{counted}, p = {p_value:.2g} against a coin: too few configurations for the binomial "
                                f"test (p >= {ALPHA:g}), so no confident outcome.", region, k, p_value)
    counted += f", p = {p_value:.2g} against a coin (one-sided exact binomial)"
    here = _point(params, tpp)
    placed = [c for c in region if c.tokens_per_param is not None]
    by_distance = sorted(placed or region, key=lambda c: math.dist(here, _point(c.params, c.tokens_per_param or tpp)))
    nearest: list[KnownCell] = []
    for c in by_distance:  # the nearest cell of each of the two nearest configurations (not two seeds of one)
        if len(nearest) < 2 and all(_config(c) != _config(n) for n in nearest):
            nearest.append(c)
    near = "; nearest measured: " + ", ".join(_describe(c) for c in nearest)
    gap = hull_distance(here, [_point(c.params, c.tokens_per_param) for c in placed])  # type: ignore[arg-type]
    if gap > HULL_TOLERANCE:
        return out("uncertain", f"{counted}, but this run ({si(params)} parameters, {tpp:.3g} unique tokens per "
                                f"parameter) lies {gap:.2g} decades outside what those configurations surround in size "
                                f"and tokens per parameter together{near}.", region, k, p_value)
    timed = [c for c in region if c.steps is not None and c.lr_schedule is not None]
    differs = []
    if run_steps is None:
        differs.append("its optimizer steps are not given (steps= in satmon.forecast, planned_steps= in a monitor or Screen)")
    if schedule is None:
        differs.append("its learning-rate schedule is unknown (lr_schedule=, e.g. 'linear-warmup-constant')")
    if len(timed) < len(region):
        differs.append(f"{len(region) - len(timed)} of the cells did not record their schedule")
    if timed and run_steps is not None:
        slo, shi = _span([c.steps for c in timed])  # type: ignore[misc]
        if not slo / BUDGET_TOLERANCE <= run_steps <= shi * BUDGET_TOLERANCE:
            differs.append(f"it trains {run_steps:,.0f} optimizer steps, they {slo:,.0f}-{shi:,.0f}")
        shares = [c.warmup_share or 0.0 for c in timed]
        share = None if run_warmup is None else run_warmup / run_steps
        if share is None:
            differs.append("its warm-up is not given (warmup_steps=)")
        elif not min(shares) - WARMUP_TOLERANCE <= share <= max(shares) + WARMUP_TOLERANCE:
            differs.append(f"its warm-up is {share:.0%} of its steps, theirs {min(shares):.0%}-{max(shares):.0%}")
        shapes = sorted({c.lr_schedule for c in timed})  # type: ignore[misc]
        if schedule is not None and schedule not in shapes:
            differs.append(f"its learning rate is {schedule}, theirs {', '.join(shapes)}")
    if differs:
        return out("uncertain", f"{counted}, but " + "; ".join(differs) + f"{near}.", region, k, p_value)
    return out(outcome, counted + ".", region, k, p_value)
