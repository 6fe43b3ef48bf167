"""The regime study's numbers, stated once: every default and every caveat in satmon reads them here.

Verma (2026), "When Does Removing LayerNorm Help? Activation Bounding as a Regime-Dependent Implicit
Regularizer" (public code: lucky-verma/dyt-composition-study, MIT). ``docs/science/science.md`` gives the
definitions and where each number comes from. What GO and NO-GO say (:data:`MEANING`) and what they are
worth (:data:`WORTH`) are worded here once; cards, docstrings and docs take them from here or link here.

Example:
    >>> from satmon import study
    >>> study.LEVEL, study.THRESHOLD < study.COLLAPSE_THRESHOLD
    (2.0, True)
"""

from __future__ import annotations

__all__ = [
    "CAVEAT",
    "COLLAPSE_WORTH",
    "COLLAPSE_RECORD",
    "COLLAPSE_REMEDY",
    "TRAP_RECORD",
    "COLLAPSE_GRID_CONFIGURATIONS",
    "COLLAPSE_GRID_WINDOW",
    "COLLAPSE_GRID_WATCH",
    "COLLAPSE_GRID_WATCH_LATE",
    "COLLAPSE_GRID_LOSS_RULE",
    "COLLAPSE_GRID_TRAP",
    "COLLAPSE_GRID_TRAP_LOSS_RULE",
    "COLLAPSE_GRID_TRAP_HEALTHY",
    "COLLAPSE_GRID_REMEDY",
    "COLLAPSE_GRID_TRAP_REMEDY",
    "COLLAPSE_GRID_GELU",
    "GO_HELPED",
    "HELD_OUT_CELLS",
    "MEANING",
    "NO_GO_HELPED",
    "ON_SIDE",
    "STUDY_TOKENS_PROCESSED",
    "WORTH",
    "COLLAPSE_THRESHOLD",
    "FAITHFUL_GRID_FINDING",
    "FAITHFUL_GRID_HELD_OUT_ACCURACY",
    "FAITHFUL_GRID_NO_SKILL_ACCURACY",
    "CPU_GRIDS",
    "CPU_GRID_PARTS",
    "CPU_GRID_CELLS",
    "CPU_GRID_NO_GO",
    "CPU_GRID_RIGHT",
    "CPU_GRID_HELPED",
    "FIT_THRESHOLD",
    "GRID_HELD_OUT_ACCURACY",
    "GRID_NO_SKILL_ACCURACY",
    "HELD_OUT_ACCURACY",
    "HELD_OUT_PROTOCOL",
    "INCONCLUSIVE_BAND",
    "LEVEL",
    "NO_SKILL_ACCURACY",
    "PROVENANCE",
    "THRESHOLD",
]

#: The GO threshold on pooled DyT saturation (the paper's rounding of :data:`FIT_THRESHOLD`).
THRESHOLD = 0.43
#: What the study's own validation code fits on its 12 cells: the midpoint between 0.4135 and 0.4662.
FIT_THRESHOLD = 0.43985
#: An element is saturated when ``|alpha * x| > LEVEL`` (strict).
LEVEL = 2.0
#: In a model whose DyT feeds a gated MLP, pooled saturation at or above this is a collapse risk
#: (4/4 collapses flagged, 0/5 false alarms over the study's 9 LLaMA-style ablation runs).
COLLAPSE_THRESHOLD = 0.5
#: satmon's own collapse grid (docs/plans/collapse_plan.md, Amendments 1-2; docs/science/abort_policy.md; the cells in
#: data/collapse, scored by examples/collapse_analysis.py): LLaMA-style byte models of width 64 with 2 and 4 blocks,
#: 1,200 steps, warm-up 100, peak lr 3e-3 to 3e-2, alpha_init 2 to 8, the final norm RMSNorm or DyT, seeds 21 and 22.
#: The configurations of its gated arm (DyT feeding SwiGLU), seeds counted once ...
COLLAPSE_GRID_CONFIGURATIONS = 26
#: ... and per flag ``(hits, failing configurations, false stops, healthy configurations, mean steps before the loss
#: rule)``: the window's verdict (collapse risk: every DyT layer's pooled saturation >= 0.5 over a 100-step window;
#: the default 500-step window is not measured), over the configurations that never learned, learned then lost, or
#: fell behind ...
COLLAPSE_GRID_WINDOW = (6, 10, 0, 9, 308)
#: ... the collapse watch at 0.5 (patience 1, every 50 steps) started at the warm-up's end, over the configurations
#: that never learned, learned then lost, or fell behind ...
COLLAPSE_GRID_WATCH = (9, 10, 1, 9, 292)
#: ... the same watch started after a 500-step window (satmon's default before it knew the warm-up) ...
COLLAPSE_GRID_WATCH_LATE = (9, 10, 1, 9, -119)
#: ... the loss rule (what watching the training loss says: at or above 0.95 x the unigram level from step 300, or a
#: quarter of what was learned given back; lead 0 by definition) ...
COLLAPSE_GRID_LOSS_RULE = (6, 10, 0, 9, 0)
#: ... the trap reading over the configurations that never learned (its false stops: over every healthy configuration,
#: though it cannot fire with an RMSNorm final norm) ...
COLLAPSE_GRID_TRAP = (5, 5, 0, 9, 173)
#: ... the healthy configurations with a DyT final norm: the only ones where the trap reading could have stopped a
#: healthy run (0: its false stops are not measured) ...
COLLAPSE_GRID_TRAP_HEALTHY = 0
#: ... the loss rule on those ...
COLLAPSE_GRID_TRAP_LOSS_RULE = (5, 5, 0, 9, 0)
#: ... the remedy: for the failing configurations the watch flagged, ``(change, healthy, of)``: in how many of those
#: with a grid neighbour differing in that one setting the neighbour was healthy (warm-up was not varied) ...
COLLAPSE_GRID_REMEDY = (
    ("a lower peak learning rate", 3, 8),
    ("an RMSNorm final norm", 4, 5),
    ("a lower alpha_init", 2, 5),
)
#: ... the same for the configurations the trap reading named ...
COLLAPSE_GRID_TRAP_REMEDY = (
    ("a lower peak learning rate", 0, 4),
    ("an RMSNorm final norm", 5, 6),
    ("a lower alpha_init", 0, 2),
)
#: ... and the GELU control (the same DyT blocks, a GELU MLP): its configurations, and how many any flag fired on.
COLLAPSE_GRID_GELU = (18, 0)


def _of(t: tuple[int, ...]) -> str:
    return f"{t[0]} of {t[1]} configurations that failed or fell behind and {t[2]} of {t[3]} healthy ones"


def _when(lead: int | None) -> str:
    if lead is None:
        return "(no lead measured: no flagged run where the loss rule fired)"
    return f"{abs(lead)} steps {'before' if lead > 0 else 'after'}"


def _cures(rows: tuple[tuple[str, int, int], ...]) -> str:
    return ", ".join(f"{w} in {h} of {n}" for w, h, n in rows)


def _trap_false_stops() -> str:
    if COLLAPSE_GRID_TRAP_HEALTHY == 0:
        return (
            "its false stops are unmeasured (every healthy configuration had an RMSNorm final norm, where it cannot "
            "fire)"
        )
    return f"it stopped {COLLAPSE_GRID_TRAP[2]} of the {COLLAPSE_GRID_TRAP_HEALTHY} healthy ones with a DyT final norm"


#: The collapse watch's measured record, one sentence (the card's collapse-risk line, README's block, the docs).
COLLAPSE_RECORD = (
    f"the study's rule flagged 4 of its 4 collapses and 0 of its 5 other LLaMA-style runs (in-sample, final "
    f"checkpoints); on satmon's collapse grid (LLaMA-style, width 64, {COLLAPSE_GRID_CONFIGURATIONS} configurations) "
    f"the watch from the warm-up's end flagged {_of(COLLAPSE_GRID_WATCH)}, on average {_when(COLLAPSE_GRID_WATCH[4])} "
    f"watching the training loss would have (which caught {COLLAPSE_GRID_LOSS_RULE[0]} of "
    f"{COLLAPSE_GRID_LOSS_RULE[1]}); started after a 500-step window it flagged {COLLAPSE_GRID_WATCH_LATE[0]} of "
    f"{COLLAPSE_GRID_WATCH_LATE[1]}, on average {_when(COLLAPSE_GRID_WATCH_LATE[4])} the loss; the window's verdict "
    f"over a 100-step window flagged {_of(COLLAPSE_GRID_WINDOW)}, on average {_when(COLLAPSE_GRID_WINDOW[4])} the loss "
    "(the default 500-step window is unmeasured)"
)
#: What changed a flagged configuration's outcome in that grid (the card says it beside the flag).
COLLAPSE_REMEDY = (
    "in satmon's collapse grid, of the flagged configurations that failed or fell behind, a neighbour with one change "
    "was healthy: "
    f"{_cures(COLLAPSE_GRID_REMEDY)} (warm-up not varied)"
)
#: The trap reading's measured record and what changed its configurations' outcome (the trap line says it).
TRAP_RECORD = (
    f"on satmon's collapse grid the trap reading named {COLLAPSE_GRID_TRAP[0]} of the {COLLAPSE_GRID_TRAP[1]} "
    f"configurations that never learned, on average {_when(COLLAPSE_GRID_TRAP[4])} watching the training loss "
    f"would have (which caught {COLLAPSE_GRID_TRAP_LOSS_RULE[0]} of {COLLAPSE_GRID_TRAP_LOSS_RULE[1]}): "
    f"{'earlier' if COLLAPSE_GRID_TRAP[4] > 0 else 'not earlier'}, "
    f"{'surer' if COLLAPSE_GRID_TRAP[0] > COLLAPSE_GRID_TRAP_LOSS_RULE[0] else 'not surer'}; "
    f"{_trap_false_stops()}; "
    "of the configurations it named, a neighbour with one change was healthy: "
    f"{_cures(COLLAPSE_GRID_TRAP_REMEDY)}"
)
#: What the collapse rule is worth, stated once (README's block, the docs).
COLLAPSE_WORTH = (
    "in a model whose DyT feeds a SwiGLU gate, the study's rule flagged 4 of its 4 collapses and 0 of its 5 other "
    "runs (in-sample); on satmon's collapse grid (LLaMA-style, width 64, "
    f"{COLLAPSE_GRID_CONFIGURATIONS} configurations) the watch from the warm-up's end flagged "
    f"{_of(COLLAPSE_GRID_WATCH)}, on average {_when(COLLAPSE_GRID_WATCH[4])} watching the training loss would have "
    f"(which caught {COLLAPSE_GRID_LOSS_RULE[0]} of {COLLAPSE_GRID_LOSS_RULE[1]}). That record holds inside the "
    'grid\'s region only; `abort_on` stays "never" by default (docs/science/abort_policy.md says why)'
)
#: ``|margin|`` below this is reported as inconclusive (the decision is still given): the study's
#: boundary sits between cells 0.4135 (DyT hurt, +5.9%) and 0.4662 (DyT helped, -9.6%), where seeds
#: and scales disagree, so satmon flags +-0.02.
INCONCLUSIVE_BAND = 0.02
#: How well the rule was shown to predict: the study's threshold refit with each of its 4 model scales held out in
#: turn, then scored on the held-out scale's cells: 6 of 12 right (``satmon calibrate --study`` reproduces it).
HELD_OUT_ACCURACY = 6 / 12
#: The cells :data:`HELD_OUT_ACCURACY` was scored on (each held out once): what its significance test counts.
HELD_OUT_CELLS = 12
#: What :data:`HELD_OUT_ACCURACY` measured, in words (the verdict's headline and trust text quote it).
HELD_OUT_PROTOCOL = "leave-one-scale-out"
#: Guessing the commoner outcome on the same 12 cells (DyT hurt in 8): what a rule must beat to forecast anything.
NO_SKILL_ACCURACY = 8 / 12
#: satmon 0.3's CPU grid (not a miniature of the study's protocol: docs/science/grids_superseded.md): the 500-step
#: window's pooled reading under the 0.43 rule, each model size held out: 9 of 18 cells, as always saying NO-GO.
GRID_HELD_OUT_ACCURACY = 9 / 18
#: Always NO-GO on 0.3's grid: 9 of 18.
GRID_NO_SKILL_ACCURACY = 9 / 18
#: The faithful CPU grid (the study's protocol at CPU scale: docs/plans/grid_plan.md, data/faithful_grid.json): the rule
#: satmon ships (the study's 0.43 on the window's pooled reading, fit on none of the grid's cells, so every cell is
#: held out) was right in 12 of 16 cells, saying NO-GO in all 16 (the window read 0.13-0.29)...
FAITHFUL_GRID_HELD_OUT_ACCURACY: float | None = 12 / 16
#: ... exactly as always saying NO-GO (DyT helped in 4 of 16 cells).
FAITHFUL_GRID_NO_SKILL_ACCURACY: float | None = 12 / 16
#: What the faithful grid found, in one sentence (the caveat and the card's trust text add it): by the pre-registered
#: plan, no window reading (6 tried) beat always NO-GO held out (best: 75% = 75%; permutation p = 0.87).
FAITHFUL_GRID_FINDING = (
    "On satmon's faithful CPU grid (the study's protocol), no 500-step reading beat guessing the "
    "commoner outcome held out (docs/science/grids.md)."
)
#: satmon's CPU grids of the study's protocol whose cells record the window's reading (the data files the counts below
#: are recomputed from by ``tests/test_claims.py``): the faithful grid, the second grid and the third (a folder of
#: parts, a JSON per cell: the GPT gap, the GPT below one pass, the LLaMA family; its unscored interim cells left out).
CPU_GRIDS = ("data/faithful_grid.json", "data/grid2.json", "data/grid3")
#: The third grid's parts, its folders under ``data/grid3``.
CPU_GRID_PARTS = ("gap", "subpass", "llama")
#: Their cells (each a reading of one run: the decision is scored per cell) ...
CPU_GRID_CELLS = 84
#: ... those where the window's pooled reading under the study's 0.43 said NO-GO ...
CPU_GRID_NO_GO = 84
#: ... the cells where the 0.43 rule was right (NO-GO where DyT's final loss was above LayerNorm's, GO where below) ...
CPU_GRID_RIGHT = 58
#: ... and those where DyT helped (its final held-out loss below LayerNorm's).
CPU_GRID_HELPED = 26
#: Where the threshold comes from, in one line.
PROVENANCE = (
    "Verma (2026), 12 calibration cells (64M-1.3B GPT-2-style, 1M-118M tokens): 75% in-sample, "
    "50% leave-one-scale-out, AUC 0.75; fit on ~5k-step checkpoints with alpha_init 2.0"
)
#: The verdict card's last line when the study's threshold is used.
CAVEAT = (
    f"Caveat: {THRESHOLD:g} was fit on 12 cells of one study (75% in-sample, "
    f"{HELD_OUT_ACCURACY:.0%} leave-one-scale-out "
    f"vs {NO_SKILL_ACCURACY:.0%} for guessing the commoner outcome) on ~5k-step checkpoints, alpha_init 2.0."
    + (f" {FAITHFUL_GRID_FINDING}" if FAITHFUL_GRID_FINDING else "")
)
#: Tokens every one of the study's runs processed, whatever its budget: 5,000 steps x 64 sequences x 512 tokens
#: (docs/science/science.md, "The study's protocol"): passes over the unique data = this / the cell's unique tokens.
STUDY_TOKENS_PROCESSED = 5_000 * 64 * 512
#: The study's cells at or above 0.43 (saturation of the final checkpoint) and how many of them DyT helped (its final
#: validation loss below LayerNorm's): 2 of 3 (64M/1M and 124M/1M helped; 354M/1M hurt, +4.3%).
GO_HELPED = (2, 3)
#: The study's cells below 0.43 and how many of them DyT helped: 2 of 9 (124M/10M and 354M/10M).
NO_GO_HELPED = (2, 9)
#: What GO and NO-GO say, stated once: every card, console line, docstring and doc takes it from here or links here.
#: A decision says where the run's pooled saturation sits against the threshold, and what the study's cells on that
#: side did; nothing more.
#: What the study's cells on each side of the threshold did (the verdict's reason line ends on it).
ON_SIDE = {
    "go": (
        f"of the study's cells at or above {THRESHOLD:g}, DyT's final loss was below LayerNorm's in {GO_HELPED[0]} of "
        f"{GO_HELPED[1]}"
    ),
    "no-go": (
        f"of the study's cells below {THRESHOLD:g}, DyT's final loss was below LayerNorm's in {NO_GO_HELPED[0]} of "
        f"{NO_GO_HELPED[1]}"
    ),
}
MEANING = {
    "go": f"pooled DyT saturation at or above {THRESHOLD:g}; {ON_SIDE['go']}",
    "no-go": f"pooled DyT saturation below {THRESHOLD:g}; {ON_SIDE['no-go']}",
}
#: What a GO / NO-GO is worth: the rule's measured accuracy, stated once (the card's trust text, the docs).
WORTH = (
    f"the {THRESHOLD:g} rule was right on 9 of the study's 12 cells in-sample and on {HELD_OUT_ACCURACY:.0%} of them "
    f"when each model scale was held out ({HELD_OUT_PROTOCOL}), below the {NO_SKILL_ACCURACY:.0%} of guessing the "
    f"commoner outcome (DyT hurts); on satmon's three CPU grids of the study's protocol ({CPU_GRID_CELLS} cells) the "
    f"window's reading under it said NO-GO {CPU_GRID_NO_GO} times, right in {CPU_GRID_RIGHT}, exactly as always "
    f"saying NO-GO, and the {CPU_GRID_HELPED} cells where DyT helped all read NO-GO. So a decision is a measurement "
    "of saturation, not a forecast of DyT's effect"
)
