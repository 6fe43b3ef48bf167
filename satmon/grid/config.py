"""What a grid is: its axes (sizes, unique-token budgets, seeds) and the settings every cell shares.

Pure data, validated once: :class:`Budget` (passes over the unique data, or a token count),
:class:`GridSettings` (the training loop's schedule and the screen's window, the same for every cell and
both arms) and :class:`GridPlan` (the axes, optionally fewer budgets for some sizes). Nothing here imports
torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Budget", "GridPlan", "GridSettings", "parse_budgets", "parse_seeds", "parse_sizes"]

_SIZE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


@dataclass(frozen=True)
class Budget:
    """A unique-token budget: ``epochs`` passes over the unique tokens in the run, or ``tokens`` directly.

    ``"164ep"`` means: the run's processed tokens (steps x tokens per step) are 164 passes over the cell's
    unique tokens, so ``tokens = round(processed / 164)``; ``"31220"``, ``"64k"``, ``"3.5M"`` are token counts.

    Example:
        >>> Budget.parse("164ep").resolve(5_000 * 1_024)
        31220
        >>> Budget.parse("64k").resolve(10)
        64000
    """

    text: str
    epochs: float | None = None
    nbytes: int | None = None  # a token count (the faithful grid's tokens are bytes; the name is kept for its JSON)

    @classmethod
    def parse(cls, text: str) -> Budget:
        """A budget from its text (``"164ep"``, ``"31220"``, ``"64k"``, ``"3.5M"``)."""
        t = text.strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)ep", t)
        if m:
            if not float(m[1]) > 0:
                raise ValueError(f"Expected a positive number of epochs, got {text!r}.")
            return cls(t, epochs=float(m[1]))
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kM]?)", t)
        if m is None:
            raise ValueError(f"Expected a budget in epochs ('164ep') or tokens ('31220', '64k', '3.5M'), got {text!r}.")
        n = float(m[1]) * {"": 1, "k": 1_000, "M": 1_000_000}[m[2]]
        if n != int(n) or n < 1:
            raise ValueError(f"Expected a whole, positive number of tokens, got {text!r}.")
        return cls(t, nbytes=int(n))

    def resolve(self, processed: int) -> int:
        """Unique tokens, given the tokens one arm processes (steps x tokens per step)."""
        return self.nbytes if self.nbytes is not None else round(processed / self.epochs)


def _split(text: str | Sequence[Any]) -> list[Any]:
    return [t.strip() for t in text.split(",") if t.strip()] if isinstance(text, str) else list(text)


def parse_sizes(text: str | Sequence[str]) -> tuple[str, ...]:
    """Size names (``"d64L2,d96L3"``): the recipe says what a name means; here only their spelling is checked.

    Example:
        >>> parse_sizes("d64L2, d96L3")
        ('d64L2', 'd96L3')
    """
    sizes = tuple(str(s) for s in _split(text))
    for s in sizes:
        if not _SIZE.fullmatch(s):
            raise ValueError(f"Expected size names of letters, digits and ._+- (they name files), got {s!r}.")
    return sizes


def parse_budgets(text: str | Sequence[str | Budget]) -> tuple[Budget, ...]:
    """Budgets (``"164ep,1.4ep"`` or ``"31220,3.5M"``).

    Example:
        >>> [b.text for b in parse_budgets("164ep,64k")]
        ['164ep', '64k']
    """
    return tuple(b if isinstance(b, Budget) else Budget.parse(str(b)) for b in _split(text))


def parse_seeds(text: str | Sequence[int | str]) -> tuple[int, ...]:
    """Seeds (``"0,1"``): non-negative integers.

    Example:
        >>> parse_seeds("0, 1")
        (0, 1)
    """
    out = []
    for s in _split(text):
        if isinstance(s, bool) or not re.fullmatch(r"\d+", str(s).strip()):
            raise ValueError(f"Expected seeds as non-negative integers, got {s!r}.")
        out.append(int(s))
    return tuple(out)


def default_warmup(steps: int) -> int:
    """The default warm-up: the study's 2,000 steps at its 5,000, 40% of a shorter run (never beyond ``--steps``).

    Example:
        >>> default_warmup(5_000), default_warmup(600), default_warmup(20_000)
        (2000, 240, 2000)
    """
    return min(2_000, int(steps * 0.4))


@dataclass(frozen=True)
class GridSettings:
    """What every cell and both arms share: the loop, the optimizer, the schedule, the window, the readings' cadence.

    The schedule is the regime study's ``train.py``: a linear warm-up to ``lr`` over ``warmup`` steps
    (``lr * (i + 1) / (warmup + 1)`` at update ``i``), then constant; ``warmup=None`` (the default) is
    :func:`default_warmup`: ``min(2000, 0.4 * steps)``, the study's 2,000 at its 5,000 steps. AdamW with ``betas``,
    weight decay on matrices only (nanoGPT's ``configure_optimizers``), gradient clipping at ``grad_clip``. The held-out
    loss every ``eval_every`` steps (and at the window's end and the last step), the training loss averaged over each
    ``series_every`` steps, the window's series read every ``series_every`` steps, the screen's sampled offset
    statistics every ``offset_every`` steps. ``device``: where the model and batches go (``"cpu"``, ``"cuda"``).

    Example:
        >>> GridSettings(steps=8, window=4, warmup=3).check()
        >>> GridSettings(steps=8, window=8, warmup=3).check()
        Traceback (most recent call last):
        ...
        ValueError: Expected --window < --steps (a final checkpoint after the window), got window=8, steps=8.
    """

    steps: int = 5_000
    window: int = 500
    warmup: int | None = None  # None: min(2000, 40% of steps), the study's 2,000 of 5,000 at any length
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    series_every: int = 50
    offset_every: int = 10
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.warmup is None and isinstance(self.steps, int):
            object.__setattr__(self, "warmup", default_warmup(self.steps))

    def check(self) -> None:
        """Refuse settings that cannot answer the question, naming the option."""
        for name in ("steps", "window", "eval_every", "series_every", "offset_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Expected --{name.replace('_', '-')} >= 1, got {getattr(self, name)!r}.")
        if not 0 <= self.warmup <= self.steps:
            raise ValueError(f"Expected 0 <= --warmup <= --steps, got warmup={self.warmup}, steps={self.steps}.")
        if self.window >= self.steps:
            raise ValueError(
                f"Expected --window < --steps (a final checkpoint after the window), got window="
                f"{self.window}, steps={self.steps}."
            )
        for name, low, value in (
            ("lr", "> 0", self.lr),
            ("grad_clip", "> 0", self.grad_clip),
            ("weight_decay", ">= 0", self.weight_decay),
        ):
            ok = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and (value > 0 if low == "> 0" else value >= 0)
            )
            if not ok:  # nan and inf are refused here, before any work: no cell trains on them
                raise ValueError(f"Expected --{name.replace('_', '-')} a finite number {low}, got {value!r}.")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else ()
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and math.isfinite(b) and 0 <= b < 1 for b in betas):
            raise ValueError(f"Expected betas two finite numbers in [0, 1), got {self.betas!r}.")

    def shared(self) -> dict[str, Any]:
        """The settings as plain JSON values (part of every cell's key). ``device`` is left out on the CPU (the
        faithful grid's cells were keyed before it existed)."""
        d = json.loads(json.dumps(asdict(self)))
        if self.device == "cpu":
            d.pop("device")
        return d


@dataclass(frozen=True)
class GridPlan:
    """The grid's axes. ``size_budgets``: the budgets of the sizes that run fewer than ``budgets``.

    Example:
        >>> plan = GridPlan(("a", "b"), parse_budgets("16ep,64ep"), (0,), (("b", parse_budgets("64ep")),))
        >>> [(s, b.text, seed) for s, b, seed in plan.cells()]
        [('a', '16ep', 0), ('a', '64ep', 0), ('b', '64ep', 0)]
    """

    sizes: tuple[str, ...]
    budgets: tuple[Budget, ...]
    seeds: tuple[int, ...]
    size_budgets: tuple[tuple[str, tuple[Budget, ...]], ...] = field(default=())

    def budgets_of(self, size: str) -> tuple[Budget, ...]:
        """The budgets ``size`` runs."""
        return dict(self.size_budgets).get(size, self.budgets)

    def cells(self) -> list[tuple[str, Budget, int]]:
        """Every ``(size, budget, seed)`` of the grid, in axis order."""
        return [(s, b, seed) for s in self.sizes for b in self.budgets_of(s) for seed in self.seeds]

    def check(self, processed: int) -> None:
        """Distinct, non-empty axes; distinct budgets once resolved at ``processed`` tokens per arm."""
        if not (self.sizes and self.budgets and self.seeds):
            raise ValueError("Expected at least one size, one budget and one seed (--sizes, --budgets, --seeds).")
        for axis, keys in (
            ("sizes", list(self.sizes)),
            ("budgets", [b.text for b in self.budgets]),
            ("seeds", list(self.seeds)),
        ):
            if len(set(keys)) != len(keys):
                raise ValueError(f"Expected distinct --{axis}, got {keys}.")
        tokens = [b.resolve(processed) for b in self.budgets]
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"Expected distinct budgets, got {tokens} tokens for {[b.text for b in self.budgets]}.")
        for name, budgets in self.size_budgets:
            if name not in self.sizes:
                raise ValueError(f"Expected size_budgets to name sizes of the grid {list(self.sizes)}, got {name!r}.")
            if {b.text for b in budgets} - {b.text for b in self.budgets}:
                raise ValueError(
                    f"Expected the budgets of {name} among the grid's budgets, got {[b.text for b in budgets]}."
                )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sizes": list(self.sizes),
            "budgets": [b.text for b in self.budgets],
            "seeds": list(self.seeds),
        }
        if self.size_budgets:
            out["size_budgets"] = {n: [b.text for b in bs] for n, bs in self.size_budgets}
        return out


def options_json(options: Mapping[str, Any]) -> dict[str, Any]:
    """A recipe's options as plain JSON values (tuples become lists), or a ValueError naming the one that is not."""
    try:
        return json.loads(json.dumps(dict(options), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"Expected the recipe's options to be JSON values (numbers, strings, lists), got {e}."
        ) from None
