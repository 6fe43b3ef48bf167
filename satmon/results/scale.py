"""Where a run sits on the study's phase diagram: its parameter count and the unique tokens it trains on.

The study's regimes are cells of model size x unique training tokens (64M-1.3B parameters x 1M-118M
tokens): DyT helped where few tokens met many parameters (the over-parameterised corner) and hurt where
data was plentiful. :class:`RunScale` is a run's point on that plane, built once by the driver
(:func:`satmon.drivers.counting.run_scale`), with how the tokens were counted, or why they could not
be. :meth:`RunScale.note` is the line the verdict card carries (among its notes, so it reaches every
place the card goes). The card's line is prose for people: the scale travels as data with the verdict
(``Verdict.planned_forecast``'s ``params``, ``unique_tokens`` and ``planned_tokens``, and the hparams
``satmon/params``, ``satmon/unique_tokens``, ``satmon/planned_tokens``), which ``satmon report --plot`` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NOTE_PREFIX", "RunScale", "si"]

#: How the card's line starts (a resumed driver replaces its own line by it: :meth:`RunScale.is_note`).
NOTE_PREFIX = "Phase diagram:"


def si(n: float) -> str:
    """A count in the study's style: ``64M``, ``1.3B``, ``121k``.

    Example:
        >>> si(64e6), si(1.3e9), si(120581), si(118e6), si(950)
        ('64M', '1.3B', '121k', '118M', '950')
    """
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.2g}{suffix}" if n < 10 * size else f"{n / size:.0f}{suffix}"
    return f"{n:.0f}"


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


@dataclass(frozen=True)
class RunScale:
    """A run's point on the study's phase diagram.

    Attributes:
        params: the model's parameters (each shared tensor once).
        unique_tokens: the unique tokens the run trains on; ``None`` when satmon could not count them.
        counted: how ``unique_tokens`` was found, in words (``"given: unique_tokens="``, a dataset's length x tokens
            per sample...).
        missing: why the tokens could not be counted (empty when they were).

    Example:
        >>> s = RunScale(120_000, 400_000, counted="6,250 samples x 64 tokens")
        >>> round(s.tokens_per_param, 3)
        3.333
    """

    params: int
    unique_tokens: int | None = None
    counted: str = ""
    missing: str = ""

    @property
    def tokens_per_param(self) -> float | None:
        """Unique training tokens per parameter (the study's axis), ``None`` when the tokens are unknown."""
        return None if self.unique_tokens is None or self.params <= 0 else self.unique_tokens / self.params

    def note(self, cells: Sequence[tuple[float, float]] = ()) -> str:
        """The card's line: parameters, unique tokens and tokens per parameter, how they were counted, and where
        the run lies against ``cells`` (the study's ``(params, unique_tokens)``); or how to give the tokens.

        Example:
            >>> scale = RunScale(120_000, missing="an IterableDataset has no length")
            >>> print(scale.note())  # doctest: +NORMALIZE_WHITESPACE
            Phase diagram: 120,000 parameters; unique training tokens unknown (an IterableDataset has no length): pass
            SaturationMonitor(unique_tokens=N), N the unique tokens the run trains on, to place it on the study's phase
            diagram (`satmon report --plot`).
        """
        head = f"{NOTE_PREFIX} {self.params:,} parameters"
        if self.unique_tokens is None:
            return (
                f"{head}; unique training tokens unknown ({self.missing}): pass "
                "SaturationMonitor(unique_tokens=N), N the "
                "unique tokens the run trains on, to place it on the study's phase diagram (`satmon report --plot`)."
            )
        line = (
            f"{head}, {self.unique_tokens:,} unique training tokens ({self.counted}): "
            f"{self.tokens_per_param:.3g} tokens "
            "per parameter."
        )
        if cells:
            line += " " + self.against(cells)
        return line + " `satmon report --plot` draws it among the study's cells."

    def against(self, cells: Sequence[tuple[float, float]]) -> str:
        """Where the run lies against cells ``(params, train_tokens)``: inside or outside their ranges, on both axes.

        Example:
            >>> corners = [(64e6, 1e6), (64e6, 118e6), (1.3e9, 1e6), (1.3e9, 118e6)]
            >>> print(RunScale(120_000, 400_000).against(corners))  # doctest: +NORMALIZE_WHITESPACE
            The study's cells span 64M-1.3B parameters and 0.00077-1.8 tokens per parameter: this run has 533x fewer
            parameters than the smallest, and more tokens per parameter than any.
        """
        params = [p for p, _ in cells]
        ratios = [t / p for p, t in cells]
        span = (
            f"The study's cells span {si(min(params))}-{si(max(params))} parameters and "
            f"{min(ratios):.2g}-{max(ratios):.2g} "
            "tokens per parameter: "
        )
        where = []
        if self.params < min(params):
            where.append(f"this run has {_times(min(params) / self.params)} fewer parameters than the smallest")
        elif self.params > max(params):
            where.append(f"this run has {_times(self.params / max(params))} more parameters than the largest")
        else:
            where.append("this run's size lies within them")
        tpp = self.tokens_per_param or 0.0
        where.append(
            "fewer tokens per parameter than any"
            if tpp < min(ratios)
            else "more tokens per parameter than any"
            if tpp > max(ratios)
            else "tokens per parameter within their range"
        )
        return span + ", and ".join(where) + "."

    @property
    def train_tokens(self) -> int | None:
        """Deprecated: :attr:`unique_tokens` (the old name works until satmon 0.6)."""
        import warnings

        from satmon._compat import SatmonDeprecationWarning

        warnings.warn(
            "RunScale.train_tokens is deprecated since satmon 0.5: use RunScale.unique_tokens (the old name "
            "works until satmon 0.6).",
            SatmonDeprecationWarning,
            stacklevel=2,
        )
        return self.unique_tokens

    @staticmethod
    def is_note(text: str) -> bool:
        """Whether ``text`` is a :meth:`note` line (the driver replaces its own on a resume)."""
        return text.startswith(NOTE_PREFIX)
