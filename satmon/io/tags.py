"""Every tag name satmon writes, for every sink: TensorBoard, a Trainer's loggers, W&B, MLflow.

The writers (:mod:`satmon.io.tensorboard`, :mod:`satmon.io.lightning`, :mod:`satmon.io.trackers`) and the readers
(:mod:`satmon.io.tensorboard_reader`, ``satmon report``, the replay's live reading) name what they write and read
here, and only here: :class:`TAG` (scalars, texts, hparams keys) and :data:`VERDICT_VALUES` (the decision's scalar).
A new sink writes under these names; a run written by any of them opens beside the others and lines up.

Example:
    >>> TAG.verdict, VERDICT_VALUES["no-go"], TAG.read_name("satmon/verdict")  # 0.2's name of the decision
    ('Satmon/decision', 0.0, 'Satmon/decision')
"""

from __future__ import annotations

from enum import Enum

from satmon.results.rule import Decision

__all__ = ["TAG", "V02_TEXT_SUFFIX", "VERDICT_VALUES"]


class TAG:
    """Every tag satmon writes (a namespace, not an enum, so ``TAG.layer_saturation("ln_f")`` reads well).

    TensorBoard groups a run's curves by the tag's prefix before the first ``/`` and orders the groups
    by name (upper case before lower case, so before Lightning's ``epoch``, ``train/...``), and the
    charts of a group by name. satmon's curves use that: the group ``Satmon`` opens first and its first
    chart is the decision (``Satmon/decision``: 1 GO, 0 NO-GO, -1 non-finite, its trust in the chart's
    description), then the margin, the non-finite count, the pooled saturation and a stop; the per-layer
    families and the collapse watch (with the verdict's collapse risk) each have a group of their own,
    ``satmon_<family>`` (docs/guides/tensorboard.md). The texts are the Text tab's group ``satmon``: the
    verdict card first (``satmon/verdict``), a replay's checkpoint names after it
    (``satmon/verdict_checkpoint``: TensorBoard lists a group's tags by name, so no list of paths comes
    before a run's card). A text and a scalar never share a tag: TensorBoard keeps one kind of data per
    tag and run.

    satmon 0.2 wrote every scalar under ``satmon/`` and every text under ``<tag>/text_summary``, and 0.3
    the decision as ``Satmon/verdict``, the collapse risk as ``Satmon/collapse_risk`` and a replay's
    texts under ``satmon/replay/``: :meth:`read_name` names an older tag the way 0.4 writes it, so readers
    take runs of every version.

    Example:
        >>> TAG.verdict, TAG.verdict_text, TAG.layer_saturation("ln_f"), TAG.collapse_breach("loss-spike")
        ('Satmon/decision', 'satmon/verdict', 'satmon_saturation/ln_f', 'satmon_collapse/breach/loss-spike')
    """

    summary = "Satmon"  #: the Scalars group that opens first
    # the screening window and the verdict (scalars: the summary group; charts sort by name, the decision first)
    verdict = "Satmon/decision"
    #: the forecast from the planned passes (satmon.forecast): 1 helps, -1 hurts, 0 uncertain
    forecast = "Satmon/forecast"
    margin = "Satmon/margin"
    nonfinite = "Satmon/nonfinite"
    saturation = "Satmon/saturation"
    stop = "Satmon/stop"
    #: the verdict's collapse risk (1 / 0, gated models only), with the collapse watch
    collapse_risk = "satmon_collapse/risk"
    # texts (the Text tab's group "satmon")
    verdict_text = "satmon/verdict"
    stop_text = "satmon/stop"
    replay_checkpoint = "satmon/verdict_checkpoint"
    replay_error = "satmon/verdict_skipped"
    # the collapse watch after the window
    collapse_nonfinite = "satmon_collapse/nonfinite"
    collapse_saturation = "satmon_collapse/saturation"
    collapse_loss_z = "satmon_collapse/loss_z"
    # the trap reading, from step 1 (satmon.screen.trap): 1 trapped / 0, the gradient reach below the final norm
    # (its norm over the head's), the final norm's saturation, its centered saturation and offset ratio
    trap = "satmon_trap/trapped"
    trap_reach = "satmon_trap/reach"
    trap_final_saturation = "satmon_trap/final_saturation"
    trap_final_centered = "satmon_trap/final_centered"
    trap_final_offset_ratio = "satmon_trap/final_offset_ratio"
    trap_text = "satmon/trap"
    #: the collapse watch's first flag of a run, with satmon's measured record of what changed a flagged run's outcome
    collapse_text = "satmon/collapse"
    hp_trap = "satmon/trap"
    # the hparams view: hyper-parameter keys (and satmon 0.3's sub-run of the session: read, never written)
    hp_window = "satmon/window"
    hp_saturation = "satmon/saturation"  # the Hugging Face log_history entry's numbers
    hp_margin = "satmon/margin"
    hp_threshold = "satmon/threshold"
    hp_level = "satmon/level"
    hp_decision = "satmon/decision"
    hp_trust = "satmon/trust"
    hp_source = "satmon/source"
    hp_partial = "satmon/partial"
    hp_forecast = "satmon/forecast"
    #: the run's scale, as data (``satmon report --plot`` places the run from these, never from the card's text)
    hp_params = "satmon/params"
    hp_unique_tokens = "satmon/unique_tokens"
    hp_planned_tokens = "satmon/planned_tokens"
    hparams_run = "satmon_hparams"
    #: v0.1 wrote the pooled saturation under this name for the hparams view, in the run itself; read, never written
    legacy_verdict_saturation = "satmon/verdict_saturation"
    # dead directions and the residual stream (satmon.probe, the live probe, replay)
    sigma_min_min_ratio = "satmon_sigma_min/min_ratio"
    #: the per-layer (and per-block, per-MLP) families: each is a Scalars group of its own
    families = (
        "satmon_saturation",
        "satmon_alpha",
        "satmon_offset",
        "satmon_collapse",
        "satmon_deadir",
        "satmon_sigma_min",
        "satmon_init_gap",
        "satmon_trap",
    )

    @staticmethod
    def trap_reach_group(group: str) -> str:
        """The gradient reach of one parameter group below the final norm (its norm over the head's); not under
        ``satmon_trap/reach/``: a file-backed logger (MLflow) keeps that tag as a file, not a folder."""
        return f"satmon_trap/group_reach/{group}"

    @staticmethod
    def layer_saturation(layer: str) -> str:
        return f"satmon_saturation/{layer}"

    @staticmethod
    def alpha(layer: str) -> str:
        return f"satmon_alpha/{layer}"

    @staticmethod
    def collapse_gate(stat: str, mlp: str) -> str:
        """A gate statistic of one gated MLP during the watch (``stat`` from :mod:`satmon.functional.gate`)."""
        return f"satmon_collapse/{stat}/{mlp}"

    @staticmethod
    def collapse_breach(reason: str | Enum) -> str:
        """1.0 when the watch check found ``reason`` (a :class:`satmon.results.stop.StopReason` or its value)."""
        return f"satmon_collapse/breach/{reason.value if isinstance(reason, Enum) else reason}"

    @staticmethod
    def deadir_alignment(layer: str) -> str:
        return f"satmon_deadir/{layer}/alignment"

    @staticmethod
    def deadir_null_dim(layer: str) -> str:
        return f"satmon_deadir/{layer}/null_dim"

    @staticmethod
    def deadir_null_projection(layer: str) -> str:
        return f"satmon_deadir/{layer}/null_projection"

    @staticmethod
    def sigma_min_ratio(block: str) -> str:
        return f"satmon_sigma_min/ratio/{block}"

    @staticmethod
    def offset_centered(layer: str) -> str:
        return f"satmon_offset/centered/{layer}"

    @staticmethod
    def offset_ratio(layer: str) -> str:
        return f"satmon_offset/ratio/{layer}"

    @staticmethod
    def init_gap(layer: str) -> str:
        return f"satmon_init_gap/{layer}"

    @staticmethod
    def is_satmon(tag: str) -> bool:
        """Whether satmon 0.3 or later writes ``tag`` (a scalar or a text; the hparams keys are not tags).

        Example:
            >>> TAG.is_satmon("Satmon/margin"), TAG.is_satmon("satmon_alpha/ln_f"), TAG.is_satmon("satmon_logs/x")
            (True, True, False)
        """
        group = tag.split("/", 1)[0]
        return "/" in tag and (group in (TAG.summary, "satmon") or group in TAG.families)

    @staticmethod
    def from_v02(tag: str) -> str | None:
        """The name satmon writes today of a tag satmon 0.2 wrote (its scalars under ``satmon/``, its texts under
        ``<tag>/text_summary``), or ``None`` when 0.2 wrote no such tag.

        Example:
            >>> [TAG.from_v02(t) for t in ("satmon/verdict", "satmon/collapse/risk", "satmon/alpha/ln_f",
            ...                            "satmon/collapse/loss_z", "satmon/verdict/text_summary", "epoch")]
            ... # doctest: +NORMALIZE_WHITESPACE
            ['Satmon/decision', 'satmon_collapse/risk', 'satmon_alpha/ln_f', 'satmon_collapse/loss_z', 'satmon/verdict',
             None]
        """
        if tag.endswith(V02_TEXT_SUFFIX):
            text = tag[: -len(V02_TEXT_SUFFIX)]
            text = _V03.get(text, text)
            return text if text in _TEXTS else None
        if tag in _V02_SUMMARY:
            return _V02_SUMMARY[tag]
        for family in TAG.families:
            old = "satmon/" + family.removeprefix("satmon_") + "/"
            if tag.startswith(old) and len(tag) > len(old):
                return f"{family}/{tag[len(old) :]}"
        return None

    @staticmethod
    def read_name(tag: str, text: bool = False) -> str | None:
        """The name a tag read back from a run has in this table: 0.3's tags as they are, 0.2's by
        :meth:`from_v02`; ``None`` for a tag satmon did not write (and v0.1's ``satmon/verdict_saturation``).

        Example:
            >>> TAG.read_name("satmon/margin"), TAG.read_name("Satmon/margin")
            ('Satmon/margin', 'Satmon/margin')
            >>> TAG.read_name("satmon/verdict", text=True)
            'satmon/verdict'
            >>> TAG.read_name("Satmon/verdict"), TAG.read_name("satmon/replay/checkpoint", text=True)  # 0.3's names
            ('Satmon/decision', 'satmon/verdict_checkpoint')
        """
        if tag in _V03:
            return _V03[tag]
        if text:
            return TAG.from_v02(tag) if tag.endswith(V02_TEXT_SUFFIX) else (tag if tag in _TEXTS else None)
        if tag.startswith("satmon/"):  # texts only there since 0.3: a 0.2 scalar
            return TAG.from_v02(tag)
        return tag if TAG.is_satmon(tag) else None


#: satmon 0.2's scalars of the summary group, by their 0.3 names
_V02_SUMMARY = {
    "satmon/saturation": TAG.saturation,
    "satmon/nonfinite": TAG.nonfinite,
    "satmon/verdict": TAG.verdict,
    "satmon/margin": TAG.margin,
    "satmon/collapse/risk": TAG.collapse_risk,
    "satmon/stop": TAG.stop,
}
#: torch's ``SummaryWriter.add_text(tag, ...)`` writes under ``tag + "/text_summary"`` (satmon 0.2 did)
V02_TEXT_SUFFIX = "/text_summary"
_TEXTS = (TAG.verdict_text, TAG.stop_text, TAG.replay_checkpoint, TAG.replay_error, TAG.trap_text)
#: satmon 0.3's names of the tags 0.4 renamed (the decision first in its group, the collapse risk with the watch,
#: a replay's texts after the card); 0.2's ``satmon/replay/...`` texts map through :meth:`TAG.from_v02` to these
_V03 = {
    "Satmon/verdict": TAG.verdict,
    "Satmon/collapse_risk": TAG.collapse_risk,
    "satmon/replay/checkpoint": TAG.replay_checkpoint,
    "satmon/replay/error": TAG.replay_error,
}


#: The ``Satmon/decision`` scalar of each decision. A non-finite verdict is -1, not NaN: NaN reads as
#: "no reading" and cannot be sorted or compared across runs; -1 sorts below NO-GO (docs/guides/tensorboard.md).
VERDICT_VALUES: dict[str, float] = {Decision.GO: 1.0, Decision.NO_GO: 0.0, Decision.NON_FINITE: -1.0}
