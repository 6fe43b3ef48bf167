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
#: What the collapse rule is worth, stated once (README's block, the docs): the study's record, read on final
#: checkpoints, and what satmon has not measured.
COLLAPSE_WORTH = (
    f"in a model whose DyT feeds a SwiGLU gate, pooled saturation at or above {COLLAPSE_THRESHOLD:g} flagged "
    "4 of the study's 4 collapses with no false alarm in its 5 other LLaMA-style runs, read on final "
    "checkpoints; satmon has measured no collapse of its own (its pilot's "
    "runs that never learned had its LLaMA demo's trapped layout, a DyT final norm), and the watch after "
    "the window is unmeasured"
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
