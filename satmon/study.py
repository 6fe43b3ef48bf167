"""The regime study's numbers, stated once: every default and every caveat in satmon reads them here.

Verma (2026), "When Does Removing LayerNorm Help? Activation Bounding as a Regime-Dependent Implicit
Regularizer" (public code: lucky-verma/dyt-composition-study, MIT). ``docs/science.md`` gives the
definitions and where each number comes from.

Example:
    >>> from satmon import study
    >>> study.LEVEL, study.THRESHOLD < study.COLLAPSE_THRESHOLD
    (2.0, True)
"""

from __future__ import annotations

__all__ = ["CAVEAT", "COLLAPSE_THRESHOLD", "FIT_THRESHOLD", "INCONCLUSIVE_BAND", "LEVEL", "PROVENANCE", "THRESHOLD"]

#: The GO threshold on pooled DyT saturation (the paper's rounding of :data:`FIT_THRESHOLD`).
THRESHOLD = 0.43
#: What the study's own validation code fits on its 12 cells: the midpoint between 0.4135 and 0.4662.
FIT_THRESHOLD = 0.43985
#: An element is saturated when ``|alpha * x| > LEVEL`` (strict).
LEVEL = 2.0
#: In a model whose DyT feeds a gated MLP, pooled saturation at or above this is a collapse risk
#: (4/4 collapses flagged, 0/5 false alarms over the study's 9 LLaMA-style ablation runs).
COLLAPSE_THRESHOLD = 0.5
#: ``|margin|`` below this is reported as inconclusive (the decision is still given): the study's
#: boundary sits between cells 0.4135 (DyT hurt, +5.9%) and 0.4662 (DyT helped, -9.6%), where seeds
#: and scales disagree, so satmon flags +-0.02.
INCONCLUSIVE_BAND = 0.02
#: Where the threshold comes from, in one line.
PROVENANCE = ("Verma (2026), 12 calibration cells (64M-1.3B GPT-2-style, 1M-118M tokens): 75% in-sample, "
              "50% leave-one-scale-out, AUC 0.75; fit on ~5k-step checkpoints with alpha_init 2.0")
#: The verdict card's last line when the study's threshold is used.
CAVEAT = (f"Caveat: {THRESHOLD:g} was fit on 12 cells of one study (75% in-sample, 50% leave-one-scale-out) on ~5k-step "
          "checkpoints, alpha_init 2.0; on satmon's CPU grid the 500-step reading predicted DyT's effect no better "
          "than chance (docs/calibration.md).")
