"""Fitting a GO threshold to outcomes: pure math on (score, DyT helped, group) triples.

The rule being fitted is the verdict's: ``score >= threshold`` predicts that DyT helps (GO); "DyT
helps" means its final validation loss is below LayerNorm's (a negative delta). The study's code
writes ``score > threshold``: no candidate equals a score, so both give the same fits. Two
fitting rules, both over the same candidates (the midpoints between sorted distinct scores, plus
one point 0.01 below the lowest and 0.01 above the highest), both keeping the *first* (lowest)
candidate among equals:

- ``"midpoint"``: best accuracy. The regime study's own validation code
  (``analysis/predictor_validation.py`` of lucky-verma/dyt-composition-study) does exactly this; on
  its 12 cells it gives 0.43985 (paper: 0.43), 9/12 right.
- ``"balanced"``: best balanced accuracy (mean of the recall on "helps" and on "hurts": Youden's J
  on the ROC). Accuracy rewards predicting the majority class: on a grid where DyT mostly hurts it
  can settle on "always NO-GO", a threshold that says nothing; balanced accuracy does not depend on
  the class proportions, so it picks the cut that separates the classes best.

:func:`leave_one_group_out` refits on all groups but one and scores the held-out group, pooling the
held-out predictions (the study's leave-one-scale-out). :func:`auc` is the Mann-Whitney AUC of the
score (ties count half). Nothing here touches tensors, files or modules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

__all__ = [
    "RULES",
    "GroupCV",
    "GroupFold",
    "ThresholdFit",
    "accuracy",
    "auc",
    "balanced_accuracy",
    "candidate_thresholds",
    "fit_threshold",
    "leave_one_group_out",
    "predict",
]

Rule = Literal["midpoint", "balanced"]
RULES: tuple[str, ...] = ("midpoint", "balanced")
#: How far below the lowest / above the highest score the two outer candidates sit (the study's 0.01).
EDGE = 0.01


class ThresholdFit(NamedTuple):
    """A fitted threshold and how it scores on the cells it was fitted on."""

    threshold: float
    rule: str
    accuracy: float
    balanced_accuracy: float
    correct: int
    n: int
    #: the threshold lies below or above every score: it predicts the same class for every cell
    threshold_outside: bool = False


class GroupFold(NamedTuple):
    """One leave-one-group-out fold: the held-out group, the threshold fitted without it, its score on it."""

    group: str
    threshold: float
    train_accuracy: float
    correct: int
    n: int


class GroupCV(NamedTuple):
    """Leave-one-group-out result: held-out predictions pooled over every fold."""

    accuracy: float
    balanced_accuracy: float
    correct: int
    n: int
    folds: tuple[GroupFold, ...]


def _check(scores: Sequence[float], helps: Sequence[bool]) -> None:
    if len(scores) != len(helps):
        raise ValueError(f"Expected as many outcomes as scores, got {len(helps)} outcomes for {len(scores)} scores.")
    if not scores:
        raise ValueError("Expected at least one (score, outcome) pair, got none.")
    bad = [s for s in scores if not (isinstance(s, (int, float)) and math.isfinite(s))]
    if bad:
        raise ValueError(f"Expected finite scores, got {bad[:3]}: drop the cells without a reading.")


def candidate_thresholds(scores: Sequence[float]) -> list[float]:
    """The thresholds tried, in increasing order: 0.01 below the lowest score, the midpoints between
    consecutive distinct scores, 0.01 above the highest.

    Example:
        >>> [round(t, 4) for t in candidate_thresholds([0.3, 0.1, 0.3, 0.2])]
        [0.09, 0.15, 0.25, 0.31]
    """
    distinct = sorted(set(float(s) for s in scores))
    if not distinct:
        raise ValueError("Expected at least one score, got none.")
    mids = [(a + b) / 2 for a, b in zip(distinct, distinct[1:])]
    return [distinct[0] - EDGE, *mids, distinct[-1] + EDGE]


def predict(scores: Sequence[float], threshold: float) -> list[bool]:
    """``score >= threshold``: the verdict's GO rule (DyT predicted to help).

    Example:
        >>> predict([0.2, 0.43, 0.5], 0.43)
        [False, True, True]
    """
    return [s >= threshold for s in scores]


def _counts(preds: Sequence[bool], truths: Sequence[bool]) -> tuple[int, int, int, int]:
    """``(tp, fn, fp, tn)`` with "DyT helps" as the positive class."""
    tp = sum(p and t for p, t in zip(preds, truths))
    fn = sum(not p and t for p, t in zip(preds, truths))
    fp = sum(p and not t for p, t in zip(preds, truths))
    return tp, fn, fp, len(truths) - tp - fn - fp


def _balanced(tp: int, fn: int, fp: int, tn: int) -> float:
    recalls = ([tp / (tp + fn)] if tp + fn else []) + ([tn / (tn + fp)] if tn + fp else [])
    return sum(recalls) / len(recalls)


def _confusion(scores: Sequence[float], helps: Sequence[bool], threshold: float) -> tuple[int, int, int, int]:
    return _counts(predict(scores, threshold), helps)


def accuracy(scores: Sequence[float], helps: Sequence[bool], threshold: float) -> float:
    """Share of cells the rule ``score >= threshold -> helps`` gets right.

    Example:
        >>> accuracy([0.1, 0.2, 0.6, 0.7], [False, True, True, False], 0.5)
        0.5
    """
    _check(scores, helps)
    tp, _, _, tn = _confusion(scores, helps, threshold)
    return (tp + tn) / len(scores)


def balanced_accuracy(scores: Sequence[float], helps: Sequence[bool], threshold: float) -> float:
    """Mean of the recall on each class present (with one class: plain accuracy).

    Example:
        >>> balanced_accuracy([0.1, 0.2, 0.3, 0.6], [False, False, False, True], 0.5)
        1.0
        >>> balanced_accuracy([0.1, 0.2, 0.3, 0.6], [False, False, False, True], 0.7)
        0.5
    """
    _check(scores, helps)
    return _balanced(*_confusion(scores, helps, threshold))


def fit_threshold(scores: Sequence[float], helps: Sequence[bool], rule: Rule = "midpoint") -> ThresholdFit:
    """Fit ``score >= threshold -> DyT helps`` to the cells by ``rule`` (see the module docstring).

    Args:
        scores: one reading per cell (e.g. pooled saturation).
        helps: per cell, whether DyT beat LayerNorm (final validation loss lower).
        rule: ``"midpoint"`` (best accuracy: the study's) or ``"balanced"`` (best balanced accuracy).

    Returns:
        The first (lowest) best candidate and its in-sample scores. ``threshold_outside`` is set when it
        lies below or above every score (the same prediction for every cell).

    Example:
        >>> fit = fit_threshold([0.1, 0.2, 0.3, 0.4], [False, False, True, True])
        >>> round(fit.threshold, 10), fit.accuracy, fit.correct
        (0.25, 1.0, 4)
    """
    _check(scores, helps)
    if rule not in RULES:
        raise ValueError(f"Expected rule to be one of {RULES}, got {rule!r}.")
    score = accuracy if rule == "midpoint" else balanced_accuracy
    best, best_value = math.nan, -1.0
    for t in candidate_thresholds(scores):
        value = score(scores, helps, t)
        if value > best_value:  # strict: the first best is kept (the study's tie rule)
            best, best_value = t, value
    tp, fn, fp, tn = _confusion(scores, helps, best)
    outside = best < min(scores) or best > max(scores)
    return ThresholdFit(best, rule, (tp + tn) / len(scores), _balanced(tp, fn, fp, tn), tp + tn, len(scores), outside)


def leave_one_group_out(
    scores: Sequence[float], helps: Sequence[bool], groups: Sequence[str], rule: Rule = "midpoint"
) -> GroupCV:
    """Refit on every group but one, predict the held-out group; pool the held-out predictions.

    Example:
        >>> cv = leave_one_group_out([0.1, 0.9, 0.2, 0.8], [False, True, False, True], ["a", "a", "b", "b"])
        >>> cv.accuracy, [round(f.threshold, 10) for f in cv.folds]
        (1.0, [0.5, 0.5])
    """
    _check(scores, helps)
    if len(groups) != len(scores):
        raise ValueError(f"Expected one group per score, got {len(groups)} groups for {len(scores)} scores.")
    names = sorted(set(map(str, groups)))
    if len(names) < 2:
        raise ValueError(f"Expected at least 2 groups for leave-one-group-out, got {len(names)} ({names}).")
    folds = []
    preds: list[bool] = []
    truths: list[bool] = []
    for g in names:
        train = [i for i, x in enumerate(groups) if str(x) != g]
        test = [i for i, x in enumerate(groups) if str(x) == g]
        fit = fit_threshold([scores[i] for i in train], [helps[i] for i in train], rule)
        held = predict([scores[i] for i in test], fit.threshold)
        right = sum(p == bool(helps[i]) for p, i in zip(held, test))
        folds.append(GroupFold(g, fit.threshold, fit.accuracy, right, len(test)))
        preds += held
        truths += [bool(helps[i]) for i in test]
    correct = sum(f.correct for f in folds)
    return GroupCV(correct / len(scores), _balanced(*_counts(preds, truths)), correct, len(scores), tuple(folds))


def auc(scores: Sequence[float], helps: Sequence[bool]) -> float:
    """Probability that a random "helps" cell scores above a random "hurts" cell (ties count half).

    NaN when only one class is present. Below 0.5: the score reads the wrong way round.

    Example:
        >>> auc([0.1, 0.2, 0.3, 0.4], [False, True, False, True])
        0.75
        >>> auc([0.5, 0.5], [False, True])
        0.5
    """
    _check(scores, helps)
    pos = [s for s, h in zip(scores, helps) if h]
    neg = [s for s, h in zip(scores, helps) if not h]
    if not pos or not neg:
        return math.nan
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))
