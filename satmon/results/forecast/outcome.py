"""DyT's effect forecast from a run's planned passes over its unique data: the rule, read from the known cells.

The rule states only what the known cells show, and is read from them, never written in (:func:`forecast_from`
states it in full). Every count is in configurations (:func:`~satmon.results.forecast.cells.configurations`: recipe
x size x passes, seeds averaged). **At a measured budget** only the configurations at that budget bear; **between two
measured budgets** the configurations at each bear, each budget on its own: a confident answer needs both to be
confident and to agree, and is never surer than the weaker of the two (nothing was measured between them: the
answer there can only be what holds at both ends). The run must lie in their domain: its model family (read from
what its blocks compute), DyT's alpha_init, its optimizer and its final norm (the norm before the head, read from
the forward's module order) as the cells recorded them, inside the convex hull of the bearing configurations and
near one of them, with their steps, warm-up and learning-rate shape. Else "uncertain", saying why.

Example:
    >>> cells = [KnownCell(f"c{i}", params=1e5, passes=2.0, delta=0.1, group=f"g{i}", source="mine") for i in range(5)]
    >>> f = forecast_from(cells, params=1e5, unique_tokens=1_000_000, planned_tokens=2_000_000)
    >>> f.outcome, f.passes, f.agreeing, f.configurations  # no cell says its tokens per parameter: outside
    ('uncertain', 2.0, 5, 5)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any, Literal

from satmon.functional.significance import ALPHA, binomial_tail
from satmon.results.forecast.cells import (
    BUDGET_TOLERANCE,
    FAMILIES,
    Configuration,
    KnownCell,
    configurations,
    final_norm_of,
    known_cells,
)
from satmon.results.forecast.domain import (
    HULL_TOLERANCE,
    NEAREST_LIMIT,
    UNKNOWN_SCHEDULE,
    WARMUP_TOLERANCE,
    alpha_differs,
    clopper_pearson,
    final_norm_differs,
    hull_distance,
)
from satmon.results.scale import si

__all__ = [
    "CODE",
    "OUTCOMES",
    "Forecast",
    "Outcome",
    "checkpoint_sentence",
    "forecast",
    "forecast_from",
    "passes_text",
    "run_forecast",
    "unknown_forecast",
    "with_model",
]

Outcome = Literal["hurts", "helps", "uncertain"]
#: What :attr:`Forecast.outcome` can say.
OUTCOMES: tuple[str, ...] = ("hurts", "helps", "uncertain")
#: The scalar each outcome is logged as (``satmon/forecast``): 1 helps, -1 hurts, 0 uncertain (passes unknown too).
CODE = {"helps": 1.0, "hurts": -1.0, "uncertain": 0.0}


@dataclass(frozen=True)
class Forecast:
    """DyT's effect on the final held-out loss against the reference norm, forecast from the run's planned passes.

    Attributes:
        outcome: ``"hurts"``, ``"helps"`` or ``"uncertain"`` (:data:`OUTCOMES`).
        passes: planned tokens over unique training tokens (``None``: not known).
        tokens_per_param: unique training tokens per parameter (``None``: not known).
        evidence: the configurations it rests on, counted, in one sentence (or why it is uncertain).
        checkpoint_selection: what the known cells show about DyT's best checkpoint against the reference's best.
        params, unique_tokens, planned_tokens: the run's scale, as data (``None``: not known).
        cells: the known cells that bear on the run. agreeing: the configurations that agree with a confident
            outcome (for "uncertain": those in the commoner direction). configurations: the bearing configurations.
        p_value: the one-sided exact binomial test's against a coin (between budgets: the larger of the two
            budgets'); ``None`` when no test was made.
        steps, warmup_steps, lr_schedule, family, alpha_init, optimizer: what the run gave or the monitor read.
        rests_on: the bearing configurations by name (``d64L2 at 3.3 passes (recipe)``).
        final_norm: the run's norm before the head, ``"dyt"`` or ``"norm"`` (LayerNorm or RMSNorm), as given or read
            from the model's forward (``None``: not known; a record older than the field).
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
    steps: float | None = None
    warmup_steps: float | None = None
    lr_schedule: str | None = None
    family: str | None = None
    alpha_init: float | tuple[float, float] | None = None
    optimizer: str | None = None
    rests_on: tuple[str, ...] = ()
    final_norm: str | None = None

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
        word = {
            "hurts": "DyT's final loss expected above LayerNorm's",
            "helps": "DyT's final loss expected below LayerNorm's",
            "uncertain": "uncertain",
        }[self.outcome]
        return (
            f"Forecast from the planned passes ({passes_text(self.passes)} over the unique data, "
            f"{self.tokens_per_param:.3g} tokens per parameter): **{self.outcome}**"
            + (f", {word}" if self.outcome != "uncertain" else "")
            + f": {self.evidence} {self.checkpoint_selection}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Forecast:
        """A forecast from :meth:`to_dict` (or from JSON, where the names are a list; older records lack fields).

        Example:
            >>> f = unknown_forecast(10, "no data")
            >>> Forecast.from_dict(f.to_dict()) == f
            True
        """
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["rests_on"] = tuple(known.get("rests_on") or ())
        if isinstance(known.get("alpha_init"), list):
            known["alpha_init"] = tuple(known["alpha_init"])
        return cls(**known)


def _positive(name: str, value: Any) -> float:
    """A count as a float: any real number type (int, float, numpy scalars, a torch 0-d tensor, Decimal, Fraction)."""
    if not isinstance(value, bool) and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy scalar, torch 0-d tensor
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise ValueError(
            f"Expected {name} as a positive number, got {value!r}: pass the count (e.g. {name}=1_000_000)."
        )
    infinite = (isinstance(value, float) and math.isinf(value)) or (isinstance(value, Decimal) and value.is_infinite())
    try:
        x = float(value)
    except OverflowError:  # an exact number beyond a float's range (an int of 400 digits)
        x = math.inf
    except ValueError:  # Decimal's signalling NaN
        x = math.nan
    if math.isinf(x) and not infinite:  # finite, but no float holds it (Decimal('1e400') gives inf silently)
        raise ValueError(
            f"Expected {name} as a positive number a float can hold (below 1.8e308), got one too large "
            f"({str(value)[:12]}... with {len(str(value))} digits)."
        )
    if not math.isfinite(x) or x <= 0:
        raise ValueError(
            f"Expected {name} as a positive number, got {value!r}: pass a finite count (e.g. {name}=1_000_000)."
        )
    return x


def checkpoint_sentence(cells: Sequence[KnownCell]) -> str:
    """What the known cells that recorded each arm's best held-out loss show about checkpoint selection.

    Example:
        >>> a = KnownCell("a", 1e5, 164, -0.2, "s", "g", best_delta=0.01)
        >>> cells = [a, KnownCell("b", 1e5, 3, 0.1, "s", "g", best_delta=0.1)]
        >>> print(checkpoint_sentence(cells))  # doctest: +NORMALIZE_WHITESPACE
        Checkpoint selection: in the 2 known cells that recorded each arm's best held-out loss (2 from g), DyT's best
        checkpoint beat LayerNorm's best in 0; where DyT's final loss won (1), LayerNorm's final loss was above its
        own best.
    """
    best = [c for c in cells if c.best_delta is not None]
    if not best:
        return "Checkpoint selection: no known cell recorded each arm's best held-out loss."
    won_best = sum(c.best_delta < 0 for c in best)  # type: ignore[operator]
    won_final_only = [c for c in best if c.delta < 0 and c.best_delta >= 0]  # type: ignore[operator]
    text = (
        f"Checkpoint selection: in the {len(best)} known cells that recorded each arm's best held-out loss "
        f"({_sources(best)}), DyT's best checkpoint beat LayerNorm's best in {won_best}"
    )
    if won_final_only:
        # delta < 0 <= best_delta: LN best <= DyT best <= DyT final < LN final, so LayerNorm's final is above its best
        text += f"; where DyT's final loss won ({len(won_final_only)}), LayerNorm's final loss was above its own best"
    return text + "."


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


def unknown_forecast(params: float | None, why: str) -> Forecast:
    """The forecast of a run whose planned passes are not known: ``"uncertain"``, saying why and how to give them."""
    return Forecast(
        "uncertain",
        None,
        None,
        why
        + (
            ": give them as planned_tokens= (the tokens training will process: "
            "optimizer steps x global batch x sequence length) and unique_tokens= "
            "(the unique tokens of the training data), options of "
            "SaturationMonitor, the Hugging Face callback, Screen and Settings."
        ),
        "",
        params=params,
    )


def _describe(c: KnownCell) -> str:
    tpp = "?" if c.tokens_per_param is None else f"{c.tokens_per_param:.3g}"
    steps = (
        "unknown schedule"
        if c.steps is None or c.lr_schedule is None
        else (f"{c.steps:,.0f} steps, {c.warmup_steps or 0:,.0f} warm-up, {c.lr_schedule}")
    )
    return f"{c.name} ({si(c.params)} parameters, {tpp} tokens/parameter, {passes_text(c.passes)}, {steps})"


def _near(budget: float, p: float) -> bool:
    return abs(math.log(budget / p)) <= math.log(BUDGET_TOLERANCE)


@dataclass(frozen=True)
class _Side:
    """The configurations at one measured budget, and what they say on their own."""

    budget: float
    configs: tuple[Configuration, ...]

    @property
    def n(self) -> int:
        return len(self.configs)

    def votes(self, outcome: str) -> int:
        return sum(c.outcome == outcome for c in self.configs)

    @property
    def direction(self) -> str:
        return "hurts" if self.votes("hurts") >= self.votes("helps") else "helps"

    @property
    def agreeing(self) -> int:
        return self.votes(self.direction)

    @property
    def p_value(self) -> float | None:
        """The one-sided exact binomial p of all ``n`` agreeing against a coin; ``None`` when they do not all agree."""
        return binomial_tail(self.n, self.n, 0.5) if self.agreeing == self.n else None

    def text(self) -> str:
        worse = "worse" if self.direction == "hurts" else "better"
        cells = [c for cfg in self.configs for c in cfg.cells]
        return (
            f"DyT's final loss was {worse} than LayerNorm's in {self.agreeing} of the {self.n} configurations at "
            f"{passes_text(self.budget)} ({len(cells)} cells: {_sources(cells)}; configuration = recipe x size x "
            f"passes, seeds averaged)"
        )


def _sides(configs: Sequence[Configuration], p: float) -> list[_Side]:
    """The measured budget at ``p`` (one side), else the two either side of it."""
    at = [c for c in configs if _near(c.passes, p)]
    if at:
        budget = math.exp(sum(math.log(c.passes) for c in at) / len(at))
        return [_Side(budget, tuple(at))]
    lower = max(c.passes for c in configs if c.passes < p)
    upper = min(c.passes for c in configs if c.passes > p)
    return [_Side(b, tuple(c for c in configs if _near(c.passes, b))) for b in (lower, upper)]


def _positive_or_none(name: str, value: Any) -> float | None:
    return None if value is None else _positive(name, value)


def _alpha_range(value: Any) -> tuple[float, float] | None:
    """DyT's initial alpha as ``(lowest, highest)`` over the layers: a number, a pair, or ``None`` (unknown)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = _positive("alpha_init", value[0]), _positive("alpha_init", value[1])
        return min(lo, hi), max(lo, hi)
    a = _positive("alpha_init", value)
    return a, a


def forecast_from(
    cells: Sequence[KnownCell],
    *,
    params: float,
    unique_tokens: float,
    planned_tokens: float,
    steps: float | None = None,
    warmup_steps: float | None = None,
    lr_schedule: str | None = None,
    family: str | None = None,
    alpha_init: float | tuple[float, float] | None = None,
    optimizer: str | None = None,
    final_norm: str | None = None,
) -> Forecast:
    """DyT's effect on the final held-out loss of a run, read from known ``cells``: the rule below.

    * **Counted per configuration** (recipe x size x passes, seeds averaged: a configuration's outcome is the sign of
      the mean of its seeds' deltas).
    * **At a measured budget** (passes within :data:`~satmon.results.forecast.cells.BUDGET_TOLERANCE` of one) only
      the configurations at that budget bear: confident when every one agrees and their number beats a coin by the
      one-sided exact binomial test (``2**-n < 0.05``: at least 5). Cells at other budgets do not bear: the passes
      at which the sign flips depend on size.
    * **Between two measured budgets** the configurations at each bear, each budget tested on its own: confident only
      when both are confident in the same direction, with the larger of the two p (never surer than the weaker end:
      nothing was measured between them).
    * **Domain**: the run's ``family`` (``"gpt"`` or ``"llama"``, by what its blocks compute) must be given and only
      cells of that family bear; its DyT ``alpha_init`` (lowest, highest) inside one interval of the union of the
      cells' ranges, each widened by a factor 1.1 (:func:`~satmon.results.forecast.domain.alpha_differs`), and its
      ``optimizer`` one of theirs where they record them; its ``final_norm`` known and equal to every one the bearing
      cells record (cells that record none do not bar a confident answer on their own:
      :func:`~satmon.results.forecast.domain.final_norm_differs`); inside the convex hull of the bearing
      configurations in (log10 parameters, log10 unique tokens per parameter), up to
      :data:`~satmon.results.forecast.domain.HULL_TOLERANCE`, and within
      :data:`~satmon.results.forecast.domain.NEAREST_LIMIT` decades of the nearest; its optimizer ``steps``
      within the budget tolerance of theirs, its warm-up share within
      :data:`~satmon.results.forecast.domain.WARMUP_TOLERANCE` and its ``lr_schedule`` one of theirs.
    * Else **"uncertain"**, with the rate and its Clopper-Pearson 95% interval, or what differs and the nearest cells.

    Raises:
        ValueError: a count that is not a positive number a float can hold, a family not in ``("gpt", "llama")``, or
            a final norm not in ``("dyt", "norm", "layernorm", "rmsnorm")``.

    Example:
        >>> cells = [KnownCell(f"c{i}", params=10 ** (5 + i % 2), passes=2.0, delta=0.1, group=f"g{i}", source="m",
        ...                    unique_tokens=10 ** (6 + i // 2), steps=5000, warmup_steps=2000,
        ...                    lr_schedule="linear-warmup-constant", family="gpt", alpha_init=2.0) for i in range(6)]
        >>> run = dict(params=2e5, unique_tokens=2e6, planned_tokens=4e6, steps=5000, warmup_steps=2000,
        ...            lr_schedule="linear-warmup-constant", alpha_init=2.0)
        >>> forecast_from(cells, **run).outcome  # the family not given
        'uncertain'
        >>> f = forecast_from(cells, **run, family="gpt")
        >>> f.outcome, f.configurations, f.p_value
        ('hurts', 6, 0.015625)
        >>> forecast_from(cells, **run, family="llama").evidence
        'no known cell of the llama family (a gated MLP): nothing was measured there.'
        >>> dyt = [KnownCell(**{**vars(c), "final_norm": "dyt"}) for c in cells]  # DyT before the head, recorded
        >>> [forecast_from(dyt, **run, family="gpt", final_norm=k).outcome for k in ("dyt", "layernorm", None)]
        ['hurts', 'uncertain', 'uncertain']
    """
    params, unique, planned = (
        _positive("params", params),
        _positive("unique_tokens", unique_tokens),
        _positive("planned_tokens", planned_tokens),
    )
    run_steps = _positive_or_none("steps", steps)
    run_warmup = (
        None
        if warmup_steps is None
        else (
            0.0 if not isinstance(warmup_steps, bool) and warmup_steps == 0 else _positive("warmup_steps", warmup_steps)
        )
    )
    run_alpha, final = _alpha_range(alpha_init), final_norm_of(final_norm)
    if lr_schedule is not None and (not isinstance(lr_schedule, str) or not lr_schedule.strip()):
        raise ValueError(
            f"Expected lr_schedule as the learning rate's shape, a str such as 'linear-warmup-constant' "
            f"(the study's), got {lr_schedule!r}."
        )
    if family is not None and family not in FAMILIES:
        raise ValueError(
            f"Expected family as one of {', '.join(FAMILIES)} (gpt: a plain MLP after the norm; llama: a "
            f"gated, SwiGLU-style MLP), got {family!r}: pass None where it is not known."
        )
    if optimizer is not None and (not isinstance(optimizer, str) or not optimizer.strip()):
        raise ValueError(f"Expected optimizer as its name, a str such as 'adamw', got {optimizer!r}.")
    schedule = None if lr_schedule in (None, UNKNOWN_SCHEDULE) else lr_schedule.strip()
    opt = None if optimizer is None else optimizer.strip().lower()
    p, tpp = planned / unique, unique / params
    known = [c for c in cells if math.isfinite(c.passes) and c.passes > 0 and math.isfinite(c.delta) and c.params > 0]
    inputs = dict(
        steps=run_steps,
        warmup_steps=run_warmup,
        lr_schedule=schedule,
        family=family,
        alpha_init=None if run_alpha is None else run_alpha[0] if run_alpha[0] == run_alpha[1] else run_alpha,
        optimizer=opt,
        final_norm=final,
    )

    def out(
        outcome: str,
        evidence: str,
        region: Sequence[Configuration] = (),
        agreeing: int = 0,
        p_value: float | None = None,
    ) -> Forecast:
        return Forecast(
            outcome,
            p,
            tpp,
            evidence,
            checkpoint_sentence(known),
            params,
            unique,
            planned,
            sum(c.seeds for c in region),
            agreeing,
            len(region),
            p_value,
            **inputs,  # type: ignore[arg-type]
            rests_on=tuple(c.name for c in region),
        )

    if family is not None:  # a cell of unknown family may be of this one: it bears, and bars a confident answer
        known = [c for c in known if c.family in (family, None)]
        if not any(c.family == family for c in known):
            return out(
                "uncertain",
                f"no known cell of the {family} family ({'a gated' if family == 'llama' else 'a plain'}"
                " MLP): nothing was measured there.",
            )
    if not known:
        return out("uncertain", "no known cell to forecast from.")
    configs = configurations(known)
    lo, hi = min(c.passes for c in configs), max(c.passes for c in configs)
    if p < lo / BUDGET_TOLERANCE:
        return out(
            "uncertain",
            f"{passes_text(p)} is fewer than any known cell measured (the fewest: {lo:.3g}): nothing is known there.",
        )
    if p > hi * BUDGET_TOLERANCE:
        return out(
            "uncertain",
            f"{passes_text(p)} is more than any known cell measured (the most: {hi:.3g}): nothing is known there.",
        )
    sides = _sides(configs, p)
    region = [c for s in sides for c in s.configs]
    if len(sides) == 1:
        side = sides[0]
        counted = side.text()
        k, n = side.agreeing, side.n
        if k < n:
            low, high = clopper_pearson(k, n)
            return out(
                "uncertain",
                f"{counted}, 95% interval {low:.0%}-{high:.0%}: the configurations disagree, so no confident outcome.",
                region,
                k,
            )
        p_value = side.p_value
        if p_value is None or p_value >= ALPHA:
            return out(
                "uncertain",
                f"{counted}, p = {p_value:.2g} against a coin: too few configurations for the "
                f"binomial test (p >= {ALPHA:g}), so no confident outcome.",
                region,
                k,
                p_value,
            )
        outcome = side.direction
        counted += f", p = {p_value:.2g} against a coin (one-sided exact binomial)"
    else:
        a, b = sides
        counted = (
            f"{passes_text(p)} lies between the measured {a.budget:.3g} and {b.budget:.3g} passes, each read on "
            f"its own and the answer never surer than the weaker: {a.text()}; {b.text()}"
        )
        ps = [s.p_value for s in sides]
        k = min(s.agreeing for s in sides)
        if a.p_value is not None and b.p_value is not None and a.direction != b.direction:
            return out(
                "uncertain",
                f"{counted}: DyT {a.direction} at {a.budget:.3g} and {b.direction} at {b.budget:.3g} "
                "passes, so the sign changes between them: no confident outcome.",
                region,
                k,
            )
        weak = [s for s in sides if s.p_value is None or s.p_value >= ALPHA]
        if weak:
            why = "; ".join(
                f"at {s.budget:.3g} passes "
                + (
                    f"the configurations disagree ({s.agreeing} of {s.n})"
                    if s.p_value is None
                    else f"too few configurations (p = {s.p_value:.2g})"
                )
                for s in weak
            )
            return out("uncertain", f"{counted}: {why}, so no confident outcome.", region, k)
        p_value = max(ps)  # type: ignore[type-var]
        outcome = a.direction
        counted += (
            f"; both {outcome}, p = {p_value:.2g} (the larger of the two; one-sided exact binomial against a coin)"
        )
    run = (run_steps, run_warmup, schedule, family, run_alpha, opt, final)
    return _domain(out, outcome, counted, region, k, p_value, params, tpp, run)


def _domain(
    out: Any,
    outcome: str,
    counted: str,
    region: Sequence[Configuration],
    k: int,
    p_value: float | None,
    params: float,
    tpp: float,
    run: tuple[Any, ...],
) -> Forecast:
    """The confident ``outcome`` where the run lies in the bearing configurations' domain, else "uncertain". ``run``:
    its steps, warm-up steps, LR shape, family, alpha_init range, optimizer and final norm."""
    run_steps, run_warmup, schedule, family, run_alpha, opt, final = run
    here = (math.log10(params), math.log10(tpp))
    placed = [c for c in region if c.point is not None]
    cells = [cell for c in region for cell in c.cells]
    by_distance = sorted(placed, key=lambda c: math.dist(here, c.point))  # type: ignore[arg-type]
    nearest = [
        min(c.cells, key=lambda x: math.dist(here, (math.log10(x.params), math.log10(x.tokens_per_param or tpp))))
        for c in by_distance[:2]
    ] or list(cells[:2])
    near = "; nearest measured: " + ", ".join(_describe(c) for c in nearest)
    gap = hull_distance(here, [c.point for c in placed])  # type: ignore[misc]
    if gap > HULL_TOLERANCE:
        return out(
            "uncertain",
            f"{counted}, but this run ({si(params)} parameters, {tpp:.3g} unique tokens per "
            f"parameter) lies {gap:.2g} decades outside what those configurations surround in size "
            f"and tokens per parameter together{near}.",
            region,
            k,
            p_value,
        )
    closest = math.dist(here, by_distance[0].point)  # type: ignore[arg-type]
    if closest > NEAREST_LIMIT:
        return out(
            "uncertain",
            f"{counted}, but this run ({si(params)} parameters, {tpp:.3g} unique tokens per "
            f"parameter) lies {closest:.2g} decades from the nearest of them (more than "
            f"{NEAREST_LIMIT:g}): inside what they surround, but where no cell was measured{near}.",
            region,
            k,
            p_value,
        )
    differs = []
    if family is None:
        differs.append(
            "its model family is not given (family='gpt' for a plain MLP, 'llama' for a gated one; the "
            "monitors read it from the model)"
        )
    if any(c.family is None for c in cells):
        differs.append(f"{sum(c.family is None for c in cells)} of the cells did not record their model family")
    differs += [d for d in (alpha_differs(cells, run_alpha), final_norm_differs(cells, final)) if d is not None]
    optimizers = sorted({c.optimizer for c in cells if c.optimizer is not None})
    if opt is not None and optimizers and opt not in optimizers:
        differs.append(f"its optimizer is {opt}, theirs {', '.join(optimizers)}")
    timed = [c for c in cells if c.steps is not None and c.lr_schedule is not None]
    if run_steps is None:
        differs.append(
            "its optimizer steps are not given (steps= in satmon.forecast, planned_steps= in a monitor or Screen)"
        )
    if schedule is None:
        differs.append("its learning-rate schedule is unknown (lr_schedule=, e.g. 'linear-warmup-constant')")
    if len(timed) < len(cells):
        differs.append(f"{len(cells) - len(timed)} of the cells did not record their schedule")
    if timed and run_steps is not None:
        slo, shi = min(c.steps for c in timed), max(c.steps for c in timed)  # type: ignore[type-var]
        if not slo / BUDGET_TOLERANCE <= run_steps <= shi * BUDGET_TOLERANCE:  # type: ignore[operator]
            differs.append(f"it trains {run_steps:,.0f} optimizer steps, they {slo:,.0f}-{shi:,.0f}")
        shares = [c.warmup_share or 0.0 for c in timed]
        share = None if run_warmup is None else run_warmup / run_steps
        if share is None:
            differs.append("its warm-up is not given (warmup_steps=)")
        elif not min(shares) - WARMUP_TOLERANCE <= share <= max(shares) + WARMUP_TOLERANCE:
            differs.append(f"its warm-up is {share:.0%} of its steps, theirs {min(shares):.0%}-{max(shares):.0%}")
        shapes = sorted({c.lr_schedule for c in timed})  # type: ignore[type-var]
        if schedule is not None and schedule not in shapes:
            differs.append(f"its learning rate is {schedule}, theirs {', '.join(shapes)}")  # type: ignore[arg-type]
    if differs:
        return out("uncertain", f"{counted}, but " + "; ".join(differs) + f"{near}.", region, k, p_value)
    unchecked = (
        "" if opt is not None or not optimizers else f" (its optimizer not given: theirs {', '.join(optimizers)})"
    )
    silent = sum(c.final_norm is None for c in cells)  # some record the run's final norm, these do not say
    if 0 < silent < len(cells):
        unchecked += f" (its final norm checked against {len(cells) - silent} of the {len(cells)} cells; the rest did "
        unchecked += "not record theirs)"
    return out(outcome, counted + unchecked + ".", region, k, p_value)


def forecast(
    *,
    params: float,
    unique_tokens: float,
    planned_tokens: float,
    steps: float | None = None,
    warmup_steps: float | None = None,
    lr_schedule: str | None = None,
    family: str | None = None,
    alpha_init: float | tuple[float, float] | None = None,
    optimizer: str | None = None,
    cells: Sequence[KnownCell] | None = None,
    final_norm: str | None = None,
) -> Forecast:
    """Forecast DyT's effect on a run's final held-out loss against LayerNorm from its planned passes over the data.

    The outcome is read from the known cells (:func:`~satmon.results.forecast.cells.known_cells`: the study's and
    satmon's grids of the study's protocol) by :func:`forecast_from`'s rule: ``"hurts"`` or ``"helps"`` only where
    the configurations at the run's budget (or at both measured budgets either side of it) agree and beat a coin by a
    one-sided exact binomial test (p < 0.05), and the run lies in their domain; else ``"uncertain"``, with the counts
    and why. It knows nothing of the model's saturation; the 0.43 decision is separate (:data:`satmon.study.MEANING`).

    Args:
        params: the model's parameters.
        unique_tokens: the unique tokens of the training data.
        planned_tokens: the tokens training will process: optimizer steps x global batch (sequences, gradient
            accumulation and data-parallel ranks counted) x sequence length.
        steps: the run's optimizer steps (``None``: unknown, no confident outcome).
        warmup_steps: its linear warm-up steps (0: none).
        lr_schedule: the learning rate's shape: ``"linear-warmup-constant"`` (the study's), ``"linear-warmup-cosine"``,
            ``"constant"``...; ``None`` or ``"unknown"``: no confident outcome.
        family: ``"gpt"`` (a plain MLP after the norm) or ``"llama"`` (a gated, SwiGLU-style MLP); ``None``: unknown,
            no confident outcome. The monitors read it from what the model computes.
        alpha_init: DyT's initial alpha, or ``(lowest, highest)`` over its layers (``None``: unknown, no confident
            outcome where the cells record theirs).
        optimizer: the optimizer's name (``"adamw"``); checked against the cells' where given.
        cells: the known cells to read (default: every shipped one).
        final_norm: the norm before the head: ``"dyt"`` or ``"norm"`` (LayerNorm or RMSNorm; ``"layernorm"`` and
            ``"rmsnorm"`` are read as ``"norm"``); ``None``: unknown, no confident outcome where the bearing cells
            record theirs (satmon's grids: ``"dyt"``). A Screen reads it from the model's forward.

    Returns:
        A frozen :class:`Forecast`: ``outcome``, ``passes``, ``tokens_per_param``, ``evidence`` (the configurations
        it rests on, counted, named in ``rests_on``) and ``checkpoint_selection``.

    Raises:
        ValueError: a count that is not a positive number, a family that is not ``"gpt"`` or ``"llama"``, or a final
            norm that is not one of ``"dyt"``, ``"norm"``, ``"layernorm"``, ``"rmsnorm"``.

    Example:
        >>> import satmon
        >>> schedule = dict(steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")
        >>> study = dict(**schedule, family="gpt", alpha_init=2.0)
        >>> f = satmon.forecast(params=115_013, unique_tokens=1_551_515, planned_tokens=5000 * 16 * 64, **study)
        >>> f.outcome, round(f.passes, 2), f.agreeing == f.configurations  # the grids' d64L2 at 3.3 passes
        ('uncertain', 3.3, True)
        >>> satmon.forecast(params=64e6, unique_tokens=1e6, planned_tokens=5000 * 64 * 512, **study).outcome
        'uncertain'
        >>> satmon.forecast(params=25_000, unique_tokens=1_000, planned_tokens=3_000).outcome  # far outside the cells
        'uncertain'
    """
    return forecast_from(
        known_cells() if cells is None else cells,
        params=params,
        unique_tokens=unique_tokens,
        planned_tokens=planned_tokens,
        steps=steps,
        warmup_steps=warmup_steps,
        lr_schedule=lr_schedule,
        family=family,
        alpha_init=alpha_init,
        optimizer=optimizer,
        final_norm=final_norm,
    )


def run_forecast(
    params: float,
    unique_tokens: float | None,
    planned_tokens: float | None,
    unique_how: str = "",
    planned_how: str = "",
    steps: float | None = None,
    warmup_steps: float | None = None,
    lr_schedule: str | None = None,
    family: str | None = None,
    alpha_init: float | tuple[float, float] | None = None,
    optimizer: str | None = None,
    final_norm: str | None = None,
) -> Forecast:
    """The forecast a monitor's card shows (every driver and the Screen call this one): :func:`forecast` when both
    token counts are known, else ``"uncertain"`` saying which count is missing, why (``unique_how``,
    ``planned_how``) and how to give it. Never raises.

    Example:
        >>> run_forecast(120_000, None, 512_000, "an IterableDataset has no length").evidence.split(":")[0]
        'the unique training tokens are unknown (an IterableDataset has no length)'
    """
    missing = []
    if unique_tokens is None:
        missing.append(f"the unique training tokens are unknown ({unique_how or 'not counted'})")
    if planned_tokens is None:
        missing.append(f"the planned tokens are unknown ({planned_how or 'not counted'})")
    if missing:
        return unknown_forecast(params, "; ".join(missing))
    try:
        cells = known_cells()
    except Exception as e:  # a shipped file that cannot be read: say so, never stop training
        return unknown_forecast(params, f"the known cells could not be read ({type(e).__name__}: {str(e)[:120]})")
    try:
        return forecast(
            params=params,
            unique_tokens=unique_tokens,
            planned_tokens=planned_tokens,
            steps=steps,  # type: ignore[arg-type]
            warmup_steps=warmup_steps,
            lr_schedule=lr_schedule,
            family=family,
            alpha_init=alpha_init,
            optimizer=optimizer,
            cells=cells,
            final_norm=final_norm,
        )
    except ValueError as e:  # a bad count: blamed on the count, never stop training
        return unknown_forecast(params, f"a count is not usable ({str(e)[:160]})")
    except Exception as e:  # a shipped file that cannot be read: say so, never stop training
        return unknown_forecast(params, f"the known cells could not be read ({type(e).__name__}: {str(e)[:120]})")


def with_model(
    f: Forecast,
    family: str | None,
    alpha_init: float | tuple[float, float] | None,
    final_norm: str | None = None,
) -> Forecast:
    """``f`` asked again with the model's family, DyT's initial alpha and its final norm's kind (``"dyt"``,
    ``"norm"``, ``"layernorm"``, ``"rmsnorm"``), read once the model has run (the Screen does at its verdict); ``f``
    itself when its passes are unknown or nothing new is given.

    Example:
        >>> u = unknown_forecast(10, "no data")
        >>> with_model(u, "gpt", 2.0, "dyt") is u
        True
    """
    if f.passes is None or f.unique_tokens is None:
        return f
    final_norm = f.final_norm if final_norm is None else final_norm_of(final_norm)
    if family == f.family and alpha_init == f.alpha_init and final_norm == f.final_norm:
        return f
    return run_forecast(
        f.params,
        f.unique_tokens,
        f.planned_tokens,
        steps=f.steps,  # type: ignore[arg-type]
        warmup_steps=f.warmup_steps,
        lr_schedule=f.lr_schedule,
        family=family if family is not None else f.family,
        alpha_init=alpha_init if alpha_init is not None else f.alpha_init,
        optimizer=f.optimizer,
        final_norm=final_norm,
    )
