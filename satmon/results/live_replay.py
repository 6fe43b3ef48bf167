"""A replay beside the live window of the run it reads: which run, what each read, and why they can differ.

The live window (:class:`satmon.SaturationMonitor`) and a replay (``satmon replay``) read DyT
saturation in two different ways, and can reach different decisions on the same run:

* the live window counts the training forwards of every step in the window, in train mode (dropout on),
  while the weights change from one step to the next, and pools the counts of all those steps;
* a replay reads one saved checkpoint, in eval mode, on a few calibration batches.

The study's 0.43 was fit on the second kind of reading (end-of-training checkpoints, eval mode), at the
end of training rather than at step 500. :class:`ReplaySource` names the run a replay reads and, when
satmon found it, that run's live verdict (:class:`LiveReading`); :func:`comparison_markdown` is the
section a replayed checkpoint's card carries, :func:`comparison_rows` the same numbers for a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from satmon.study import THRESHOLD

if TYPE_CHECKING:
    from satmon.results.verdict import Verdict

__all__ = [
    "WHY",
    "LiveReading",
    "ReplaySource",
    "agreement",
    "comparison_markdown",
    "comparison_rows",
    "decision_text",
    "with_section",
]

#: Why a live window and a replay can disagree, in one line (the card's, the console's, the report's).
WHY = (
    "the live window averages every training step of the window, in train mode, while the weights move; a replay "
    f"reads one checkpoint, in eval mode, on calibration batches. The study's {THRESHOLD:g} was fit on the second "
    "kind of reading (end-of-training checkpoints, eval mode)."
)


def decision_text(decision: str, trust: str | None = None) -> str:
    """A decision as the tables show it: ``GO``, ``NO-GO``, ``NON-FINITE``, with a trust that is not ``ok`` in brackets.

    Example:
        >>> decision_text("go", "flagged"), decision_text("no-go", "ok"), decision_text("no-go")
        ('GO (flagged)', 'NO-GO', 'NO-GO')
    """
    return decision.upper() + (f" ({trust})" if trust not in (None, "ok") else "")


@dataclass(frozen=True)
class LiveReading:
    """A run's live verdict, as satmon found it for a replay.

    Attributes:
        decision: ``"go"``, ``"no-go"`` or ``"non-finite"``.
        saturation: the window's pooled saturation.
        threshold: the threshold the live verdict used.
        step: the optimizer step the verdict was taken at.
        window: the training steps the window counted (``None`` when not known).
        trust: the verdict's trust (``None`` when not known).
        found: where satmon read it, in words (a checkpoint's ``SaturationMonitor`` state, TensorBoard events).

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> live = LiveReading.from_verdict(build_verdict({"ln_f": (1, 4)}, step=500, window=500), found="x.ckpt")
        >>> live.decision, live.step, live.window, live.trust
        ('no-go', 500, 500, 'unproven')
    """

    decision: str
    saturation: float
    threshold: float
    step: int
    window: int | None = None
    trust: str | None = None
    found: str = ""

    @classmethod
    def from_verdict(cls, verdict: Verdict, found: str = "") -> LiveReading:
        """The reading of a live window's :class:`~satmon.results.verdict.Verdict`."""
        return cls(
            decision=verdict.decision,
            saturation=float(verdict.saturation),
            threshold=float(verdict.threshold),
            step=int(verdict.step),
            window=int(verdict.window),
            trust=verdict.trust,
            found=found,
        )

    def steps_read(self) -> str:
        """Which steps the live window read, in words."""
        if self.window:
            return f"the {self.window} training steps up to step {self.step}, train mode"
        return f"the training steps of the window, verdict at step {self.step}, train mode"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LiveReading:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class ReplaySource:
    """The run a replay reads, and its live verdict when satmon found one.

    Attributes:
        run: the run's folder (the one that holds ``checkpoints/`` in Lightning's layout), or the folder of the
            checkpoints when they lie elsewhere.
        live: the run's live verdict; ``None`` when none was found.
        missing: why no live verdict was found, and how to give one (empty when ``live`` is set).

    Example:
        >>> source = ReplaySource("logs/demo/version_0", missing="no SaturationMonitor state in the checkpoints")
        >>> print(source.headline())
        Replay of `logs/demo/version_0`; its live verdict was not found: no SaturationMonitor state in the checkpoints.
    """

    run: str
    live: LiveReading | None = None
    missing: str = ""

    def headline(self) -> str:
        """One markdown line: whose checkpoints these are, and where the live verdict came from (or why none)."""
        if self.live is None:
            return f"Replay of `{self.run}`; its live verdict was not found: {self.missing}."
        return f"Replay of `{self.run}`; its live verdict read from {self.live.found}."

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "live": None if self.live is None else self.live.to_dict()}
        if self.missing:
            out["missing"] = self.missing
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplaySource:
        return cls(
            run=str(d["run"]),
            live=LiveReading.from_dict(d["live"]) if d.get("live") else None,
            missing=str(d.get("missing") or ""),
        )


def comparison_rows(live: LiveReading, replays: list[tuple[Verdict, str, int | None]]) -> list[list[str]]:
    """Table rows: the live window, then each replayed ``(verdict, checkpoint name, step)``:
    ``[reading, decision, pooled saturation, what was read]``.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> v = build_verdict({"ln_f": (3, 4)}, step=500, source="replay")
        >>> live = LiveReading("no-go", 0.248, 0.43, 500, window=500)
        >>> [row[:3] for row in comparison_rows(live, [(v, "s500.ckpt", 500)])]
        [['live window', 'NO-GO', '0.2480'], ['replay', 'GO (unproven)', '0.7500']]
    """
    rows = [["live window", decision_text(live.decision, live.trust), f"{live.saturation:.4f}", live.steps_read()]]
    for verdict, name, step in replays:
        rows.append(
            [
                "replay",
                decision_text(verdict.decision, verdict.trust),
                f"{verdict.saturation:.4f}",
                f"checkpoint {name} at step {step}, eval mode, calibration batches",
            ]
        )
    return rows


def agreement(live: LiveReading, verdicts: list[Verdict]) -> str:
    """``"They agree (NO-GO)."`` when every replayed decision is the live one, else ``"They disagree."``.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> replayed = build_verdict({"ln_f": (3, 4)}, step=500, source="replay")
        >>> agreement(LiveReading("no-go", 0.25, 0.43, 500), [replayed])
        'They disagree.'
    """
    if all(v.decision == live.decision for v in verdicts):
        return f"They agree ({live.decision.upper()})."
    return "They disagree."


def comparison_markdown(source: ReplaySource, verdict: Verdict, checkpoint: str, step: int | None) -> str:
    """The section a replayed checkpoint's card carries: whose checkpoint it is, the live verdict beside this one
    (which step each read), and why they can differ; only the headline when no live verdict was found."""
    lines = [source.headline()]
    if source.live is not None:
        rows = comparison_rows(source.live, [(verdict, f"`{checkpoint}`", step)])
        lines += ["", "| reading | decision | pooled saturation | what was read |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", f"{agreement(source.live, [verdict])} Why they can differ: {WHY}"]
    return "\n".join(lines)


def with_section(card: str, section: str) -> str:
    """``section`` placed in ``card`` right under its title (the first line), where a reader meets it first.

    Example:
        >>> print(with_section("### title\\n\\nbody", "section"))
        ### title
        <BLANKLINE>
        section
        <BLANKLINE>
        body
    """
    title, _, rest = card.partition("\n")
    return f"{title}\n\n{section}\n\n{rest.lstrip(chr(10))}" if rest else f"{title}\n\n{section}"
