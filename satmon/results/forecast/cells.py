"""The known cells the forecast reads, and the unit it counts them in: the configuration.

A **known cell** (:class:`KnownCell`) is one trained pair, DyT and the reference norm at the same size, data, budget
and schedule. The cells ship as data files (``satmon/data_files/``): a cell is read when its file says it was trained
under the study's protocol (a ``protocol`` column whose value is ``study``): the study's 12 calibration cells
(``study_cells.csv``) and every grid file ``phase_*.csv`` that carries the column (a new grid file dropped beside them
changes the forecast with no code change). satmon 0.3's grid (``phase_grid_v03.csv``) has no such column and is left
out: 1,500 steps with a cosine schedule, embeddings scaled by sqrt(width) and budgets filtered where LayerNorm
overfit, so its cells are not the study's experiment.

A **configuration** (:class:`Configuration`, :func:`configurations`) is (recipe, size, passes): the recipe is the
model family with its corpus and protocol, the size its width and depth (the ``group`` column), two budgets within
:data:`BUDGET_TOLERANCE` are one. Its outcome is the sign of the **mean of its seeds' deltas**; whether its seeds
agree is reported beside it and never changes the count. The grid plans (``docs/plans/grid3_plan.md``), this
forecast and the docs count by this one definition.

The columns (a file's others are ignored): ``name``, ``params`` (or the study's ``group``, a size such as ``64M``),
``passes`` (planned tokens over unique training tokens), ``delta`` ((DyT - reference) / reference final held-out loss)
or ``final_dyt`` and ``final_layernorm``, ``group``, ``source``, ``protocol``; optional ``train_tokens`` (the unique
training tokens), ``best_dyt`` with ``best_layernorm``, ``steps``, ``warmup_steps``, ``lr_schedule``, and the domain's
``recipe``, ``family`` (``gpt``: a plain MLP; ``llama``: a gated MLP), ``alpha_init`` (DyT's initial alpha; with
``alpha_init_max``, the lowest and the highest over the layers: LLaMA-style models init the norm before attention and
the one before the MLP differently), ``optimizer`` and ``final_norm`` (:data:`FINAL_NORMS`: the DyT arm's norm before
the head, ``dyt`` or ``norm`` for LayerNorm or RMSNorm). A blank is "not recorded": an unrecorded family or alpha_init
bars a confident forecast, an unrecorded final norm does not (the study's cells do not say whether the study's final
norm was DyT); what a recorded final norm requires of a run is :func:`~satmon.results.forecast.outcome.forecast_from`'s
rule.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

__all__ = [
    "BUDGET_TOLERANCE",
    "FAMILIES",
    "FINAL_NORMS",
    "GRID_FILES",
    "PROTOCOL",
    "STUDY_FILE",
    "STUDY_LABEL",
    "Configuration",
    "KnownCell",
    "configurations",
    "family_of",
    "final_norm_of",
    "known_cells",
    "parse_count",
    "read_known_cells",
]

#: Two budgets within this factor are one (the study's 3.28 passes and the grid's 3.30).
BUDGET_TOLERANCE = 1.1
#: The ``protocol`` value of a cell trained under the study's protocol: only such cells are read.
PROTOCOL = "study"
#: The study's cells among the package data.
STUDY_FILE = "study_cells.csv"
#: How the forecast's evidence names the study's cells.
STUDY_LABEL = "the study (Verma 2026)"
#: Grid files among the package data.
GRID_FILES = re.compile(r"^phase_.+\.csv$")
#: The model families a cell or a run can be, by what its blocks compute: ``gpt`` (a plain MLP after the norm),
#: ``llama`` (a gated MLP: SwiGLU-style).
FAMILIES = ("gpt", "llama")
#: The kinds of the DyT arm's final norm (before the head) a cell or a run can record: ``dyt`` (DyT, or another
#: point-wise norm satmon counts) or ``norm`` (LayerNorm or RMSNorm).
FINAL_NORMS = ("dyt", "norm")
_FINAL_KINDS = {"dyt": "dyt", "norm": "norm", "layernorm": "norm", "rmsnorm": "norm"}
_SUFFIX = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}


def family_of(gated: bool | None) -> str | None:
    """The family of a model by what its blocks compute: ``"llama"`` where DyT feeds a gated MLP (a traced
    :class:`~satmon.results.gating.GatingInfo` says ``gated``), ``"gpt"`` where it feeds none, ``None`` when that is
    unknown (untraced).

    Example:
        >>> family_of(True), family_of(False), family_of(None)
        ('llama', 'gpt', None)
    """
    return None if gated is None else "llama" if gated else "gpt"


def final_norm_of(kind: str | None) -> str | None:
    """The final norm's kind as the forecast records it (:data:`FINAL_NORMS`): ``"dyt"``, or ``"norm"`` for
    ``"norm"``, ``"layernorm"`` and ``"rmsnorm"`` (the kinds satmon reads from a model), any case; ``None`` stays
    ``None``: not known.

    Raises:
        ValueError: any other value.

    Example:
        >>> final_norm_of("DyT"), final_norm_of("rmsnorm"), final_norm_of(None)
        ('dyt', 'norm', None)
        >>> final_norm_of("batchnorm")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Expected final_norm as 'dyt' (DyT before the head) or 'norm' (...), got 'batchnorm'...
    """
    if kind is None:
        return None
    got = _FINAL_KINDS.get(kind.strip().lower()) if isinstance(kind, str) else None
    if got is None:
        raise ValueError(
            "Expected final_norm as 'dyt' (DyT before the head) or 'norm' (LayerNorm or RMSNorm; 'layernorm' and "
            f"'rmsnorm' read as 'norm'), got {kind!r}: pass None where it is not known."
        )
    return got


def parse_count(text: str) -> float:
    """A count as the study writes it (``"64M"``, ``"1.3B"``, ``"118M"``) or a plain number.

    Example:
        >>> parse_count("1.3B"), parse_count("64M"), parse_count("32768")
        (1300000000.0, 64000000.0, 32768.0)
        >>> parse_count("lots")
        Traceback (most recent call last):
        ...
        ValueError: Expected a positive count such as 64M, 1.3B or 32768, got 'lots'.
    """
    t = str(text).strip()
    scale = _SUFFIX.get(t[-1:], 1.0)
    try:
        value = float(t[:-1] if scale != 1.0 else t) * scale
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"Expected a positive count such as 64M, 1.3B or 32768, got {text!r}.")
    return value


@dataclass(frozen=True)
class KnownCell:
    """One trained pair, DyT and the reference norm at the same size, data and budget.

    Attributes:
        name: the cell's name. params: the model's parameters. passes: planned tokens over unique training tokens.
        delta: (DyT - reference) / reference final held-out loss (< 0: DyT helped).
        group: its model size. source: where it comes from (the study, a grid).
        unique_tokens: its unique training tokens, when known.
        best_delta: the same on each arm's best held-out loss over training, when recorded.
        steps, warmup_steps, lr_schedule: its optimizer steps, linear warm-up and learning rate's shape.
        recipe: the model family with its corpus and protocol (default: its source).
        family: ``"gpt"`` or ``"llama"`` (:data:`FAMILIES`), ``None`` when not recorded.
        alpha_init: DyT's initial alpha (the lowest over the layers when ``alpha_init_max`` is set), optimizer: its
            optimizer (``"adamw"``), when recorded.
        final_norm: the DyT arm's norm before the head, ``"dyt"`` or ``"norm"`` (:data:`FINAL_NORMS`), ``None`` when
            not recorded.
        alpha_init_max: the highest initial alpha over the layers, ``None``: one value (``alpha_init``).

    Example:
        >>> c = KnownCell("a", params=1e5, passes=3.3, delta=0.1, group="d64L2", source="mine", unique_tokens=1.5e6)
        >>> c.outcome, c.tokens_per_param, c.recipe, c.alpha_range
        ('hurts', 15.0, 'mine', None)
        >>> KnownCell("b", 1e5, 3.3, 0.1, "d64L2", "mine", alpha_init=0.2, alpha_init_max=0.8).alpha_range
        (0.2, 0.8)
    """

    name: str
    params: float
    passes: float
    delta: float
    group: str
    source: str
    unique_tokens: float | None = None
    best_delta: float | None = None
    steps: float | None = None
    warmup_steps: float | None = None
    lr_schedule: str | None = None
    recipe: str = ""
    family: str | None = None
    alpha_init: float | None = None
    optimizer: str | None = None
    final_norm: str | None = None
    alpha_init_max: float | None = None

    def __post_init__(self) -> None:
        if not self.recipe:
            object.__setattr__(self, "recipe", self.source)
        object.__setattr__(self, "final_norm", final_norm_of(self.final_norm))
        if self.alpha_init_max is not None and not (
            self.alpha_init is not None and self.alpha_init <= self.alpha_init_max < math.inf
        ):
            raise ValueError(
                f"Expected alpha_init_max (the highest initial alpha) at least alpha_init {self.alpha_init!r}, got "
                f"{self.alpha_init_max!r} (cell {self.name!r}): give the lowest as alpha_init, or leave both blank."
            )

    @property
    def alpha_range(self) -> tuple[float, float] | None:
        """DyT's initial alpha as ``(lowest, highest)`` over the layers; ``None`` when not recorded."""
        if self.alpha_init is None:
            return None
        return self.alpha_init, self.alpha_init if self.alpha_init_max is None else self.alpha_init_max

    @property
    def warmup_share(self) -> float | None:
        return None if self.steps is None or self.warmup_steps is None else self.warmup_steps / self.steps

    @property
    def outcome(self) -> str:
        """``"helps"``, ``"hurts"`` or ``"tie"`` (equal final losses: neither)."""
        return _sign(self.delta)

    @property
    def tokens_per_param(self) -> float | None:
        return None if self.unique_tokens is None else self.unique_tokens / self.params

    @property
    def train_tokens(self) -> float | None:
        """Deprecated: :attr:`unique_tokens` (the old name works until satmon 0.6)."""
        import warnings

        from satmon._compat import SatmonDeprecationWarning

        warnings.warn(
            "KnownCell.train_tokens is deprecated since satmon 0.5: use KnownCell.unique_tokens (the old name "
            "works until satmon 0.6).",
            SatmonDeprecationWarning,
            stacklevel=2,
        )
        return self.unique_tokens


def _sign(delta: float) -> str:
    return "helps" if delta < 0 else "hurts" if delta > 0 else "tie"


@dataclass(frozen=True)
class Configuration:
    """One configuration (recipe, size, passes) and its seeds: the unit every count of the forecast is in.

    Example:
        >>> deltas = (0.1, -0.02)
        >>> seeds = [KnownCell(f"s{i}", 1e5, 3.3, d, "d64L2", "g", unique_tokens=1.5e6) for i, d in enumerate(deltas)]
        >>> (c,) = configurations(seeds)
        >>> c.outcome, round(c.delta, 3), c.seeds, c.seeds_agree
        ('hurts', 0.04, 2, False)
    """

    recipe: str
    group: str
    cells: tuple[KnownCell, ...]

    @property
    def passes(self) -> float:
        return math.exp(sum(math.log(c.passes) for c in self.cells) / len(self.cells))

    @property
    def params(self) -> float:
        return math.exp(sum(math.log(c.params) for c in self.cells) / len(self.cells))

    @property
    def delta(self) -> float:
        """The mean of its seeds' deltas."""
        return sum(c.delta for c in self.cells) / len(self.cells)

    @property
    def best_delta(self) -> float | None:
        best = [c.best_delta for c in self.cells if c.best_delta is not None]
        return sum(best) / len(best) if best else None

    @property
    def outcome(self) -> str:
        """The sign of :attr:`delta`: ``"helps"``, ``"hurts"`` or ``"tie"``."""
        return _sign(self.delta)

    @property
    def seeds(self) -> int:
        return len(self.cells)

    @property
    def seeds_agree(self) -> bool:
        return len({c.outcome for c in self.cells}) == 1

    @property
    def point(self) -> tuple[float, float] | None:
        """(log10 parameters, log10 unique tokens per parameter), the mean of its cells'; ``None`` when a cell does
        not record its unique tokens."""
        if any(c.tokens_per_param is None for c in self.cells):
            return None
        n = len(self.cells)
        return (
            sum(math.log10(c.params) for c in self.cells) / n,
            sum(math.log10(c.tokens_per_param) for c in self.cells) / n,
        )  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        p = f"{self.passes:.3g}"
        return f"{self.group} at {p} pass{'' if p == '1' else 'es'} ({self.recipe})"


def configurations(cells: Sequence[KnownCell]) -> list[Configuration]:
    """The cells grouped into configurations: one recipe, one size, passes within :data:`BUDGET_TOLERANCE` of the
    configuration's fewest. Sorted by recipe, size and passes.

    Example:
        >>> cells = [KnownCell(f"c{p}_{s}", 1e5, p, 0.1, "d64L2", "g") for p in (3.28, 3.3, 16.0) for s in (0, 1)]
        >>> [(c.seeds, round(c.passes, 1)) for c in configurations(cells)]
        [(4, 3.3), (2, 16.0)]
    """
    by_size: dict[tuple[str, str], list[KnownCell]] = {}
    for c in cells:
        by_size.setdefault((c.recipe, c.group), []).append(c)
    out: list[Configuration] = []
    for (recipe, group), cs in sorted(by_size.items()):
        run: list[KnownCell] = []
        for c in sorted(cs, key=lambda c: c.passes):
            if run and c.passes > run[0].passes * BUDGET_TOLERANCE:
                out.append(Configuration(recipe, group, tuple(run)))
                run = []
            run.append(c)
        out.append(Configuration(recipe, group, tuple(run)))
    return out


def _float(row: dict[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return math.nan


def read_known_cells(name: str, text: str) -> list[KnownCell]:
    """The cells of one file's ``text`` that a forecast reads (rows whose ``protocol`` is ``study``; none when the
    file has no ``protocol`` column).

    Raises:
        ValueError: a study-protocol row without its passes, size or DyT effect, or with a value that is not a
            positive (for ``delta``: finite) number, a family not in :data:`FAMILIES`, a final norm not ``dyt``,
            ``norm``, ``layernorm`` or ``rmsnorm``, or an ``alpha_init_max`` that is not a number at least the row's
            ``alpha_init``; the message names the file, the row and the column.

    Example:
        >>> rows = "name,params,passes,delta,group,source,protocol,family\\na,1000,2.5,0.1,small,my grid,study,gpt\\n"
        >>> read_known_cells("mine.csv", rows)[0].outcome
        'hurts'
        >>> read_known_cells("old.csv", "name,params,train_tokens,delta,group,source\\na,1,2,0.1,g,old\\n")
        []
    """
    body = "\n".join(line for line in text.lstrip("\ufeff").splitlines() if not line.lstrip().startswith("#"))
    reader = csv.DictReader(io.StringIO(body))
    if "protocol" not in (reader.fieldnames or []):
        return []
    cells = []
    for i, row in enumerate(reader, start=1):
        if (row.get("protocol") or "").strip() != PROTOCOL:
            continue
        where = f"{name} row {i}"
        cell_name = (row.get("name") or "").strip() or where
        size = _float(row, "params") if (row.get("params") or "").strip() else None
        if size is None:
            try:
                size = parse_count(row.get("group") or "")
            except ValueError:
                size = None
        passes = _float(row, "passes")
        delta = _float(row, "delta")
        if delta is None:
            dyt, ln = _float(row, "final_dyt"), _float(row, "final_layernorm")
            delta = None if dyt is None or ln is None or not ln > 0 else (dyt - ln) / ln
        for key, value in (("params", size), ("passes", passes)):
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"Expected a positive number for {key} in {where} (cell {cell_name!r}), got "
                    f"{row.get(key)!r}: a cell the forecast reads needs its size and its passes."
                )
        if delta is None or not math.isfinite(delta):
            raise ValueError(
                f"Expected a finite delta (or final_dyt and final_layernorm) in {where} (cell {cell_name!r}), "
                f"got {row.get('delta')!r}: a cell the forecast reads needs DyT's measured effect."
            )
        family = (row.get("family") or "").strip().lower() or None
        if family is not None and family not in FAMILIES:
            raise ValueError(
                f"Expected family as one of {', '.join(FAMILIES)} in {where} (cell {cell_name!r}), got "
                f"{row.get('family')!r}: leave it blank where the family is not known."
            )
        best_dyt, best_ln = _float(row, "best_dyt"), _float(row, "best_layernorm")
        best = (best_dyt - best_ln) / best_ln if best_dyt is not None and best_ln is not None and best_ln > 0 else None
        tokens_text = (row.get("train_tokens") or "").strip()
        try:
            tokens = parse_count(tokens_text) if tokens_text else None
        except ValueError:
            tokens = None
        source = (row.get("source") or "").strip() or (STUDY_LABEL if name == STUDY_FILE else name)
        steps, warmup, alpha = _float(row, "steps"), _float(row, "warmup_steps"), _float(row, "alpha_init")
        if steps is not None and not (math.isfinite(steps) and steps > 0):
            steps = None
        if warmup is not None and not (math.isfinite(warmup) and warmup >= 0):
            warmup = None
        if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
            alpha = None
        final_text = (row.get("final_norm") or "").strip()
        if final_text and final_text.lower() not in _FINAL_KINDS:
            raise ValueError(
                f"Expected final_norm as dyt or norm (LayerNorm or RMSNorm) in {where} (cell {cell_name!r}), got "
                f"{row.get('final_norm')!r}: leave it blank where the final norm is not known."
            )
        alpha_max = _float(row, "alpha_init_max")
        if alpha_max is not None and not (alpha is not None and alpha <= alpha_max < math.inf):
            raise ValueError(
                f"Expected alpha_init_max as a number at least alpha_init ({row.get('alpha_init')!r}) in {where} (cell "
                f"{cell_name!r}), got {row.get('alpha_init_max')!r}: alpha_init is the lowest initial alpha over the "
                "layers, alpha_init_max the highest; leave alpha_init_max blank for one value."
            )
        cells.append(
            KnownCell(
                cell_name,
                float(size),
                float(passes),
                float(delta),
                (row.get("group") or "").strip(),  # type: ignore[arg-type]
                source,
                tokens,
                best,
                steps,
                warmup,
                (row.get("lr_schedule") or "").strip() or None,
                (row.get("recipe") or "").strip(),
                family,
                alpha,
                (row.get("optimizer") or "").strip().lower() or None,
                final_text or None,
                alpha_max,
            )
        )
    return cells


def _files(folder: Path | Traversable | None) -> list[tuple[str, str]]:
    where = resources.files("satmon").joinpath("data_files") if folder is None else folder
    entries = sorted(where.iterdir(), key=lambda e: (e.name != STUDY_FILE, e.name))  # the study's first
    return [
        (e.name, e.read_text(encoding="utf-8")) for e in entries if e.name == STUDY_FILE or GRID_FILES.match(e.name)
    ]


def known_cells(folder: str | Path | None = None) -> list[KnownCell]:
    """Every known cell of the study's protocol: the study's 12, then each grid file's, file by file in name order.

    Args:
        folder: where the files are (default: the package data, ``satmon/data_files/``).

    Example:
        >>> cells = known_cells()
        >>> sum(c.source == STUDY_LABEL for c in cells), round(cells[0].passes, 2), cells[0].outcome, cells[0].family
        (12, 163.84, 'helps', 'gpt')
    """
    cells: list[KnownCell] = []
    for name, text in _files(None if folder is None else Path(folder)):
        cells += read_known_cells(name, text)
    return cells
