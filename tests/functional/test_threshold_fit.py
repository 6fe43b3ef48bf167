"""satmon.functional.threshold_fit against hand-computed cases, a brute-force reference, and the
regime study's own validation figures on its 12 cells (0.43985, 9/12, leave-one-scale-out 0.50, AUC 0.75)."""

from __future__ import annotations

import math
import random

import pytest

from satmon.functional.threshold_fit import (
    accuracy,
    auc,
    balanced_accuracy,
    candidate_thresholds,
    fit_threshold,
    leave_one_group_out,
    predict,
)

# The 12 calibration cells as SCIENCE.md lists them: (scale, saturation, delta %); negative delta = DyT helps.
STUDY = [
    ("64M", 0.4931, -27.3),
    ("64M", 0.4135, 5.9),
    ("64M", 0.2368, 19.7),
    ("64M", 0.2343, 18.8),
    ("124M", 0.4662, -9.6),
    ("124M", 0.2925, -12.3),
    ("124M", 0.1931, 12.8),
    ("354M", 0.4902, 4.3),
    ("354M", 0.3688, -24.1),
    ("354M", 0.3271, 13.4),
    ("1.3B", 0.3934, 2.1),
    ("1.3B", 0.2376, 10.4),
]
GROUPS = [c[0] for c in STUDY]
SCORES = [c[1] for c in STUDY]
HELPS = [c[2] < 0 for c in STUDY]


def test_study_midpoint_threshold_in_sample_and_leave_one_scale_out():
    fit = fit_threshold(SCORES, HELPS, "midpoint")
    assert fit.threshold == (0.4135 + 0.4662) / 2  # 0.43985: between 64M/10M (hurt) and 124M/1M (helped)
    assert (fit.correct, fit.n, fit.accuracy) == (9, 12, 0.75)
    cv = leave_one_group_out(SCORES, HELPS, GROUPS, "midpoint")
    assert (cv.correct, cv.n, cv.accuracy) == (6, 12, 0.5)
    assert auc(SCORES, HELPS) == 0.75


def test_study_tie_keeps_the_first_best_midpoint():
    # 0.49165 (between 0.4902 and 0.4931) also gets 9/12: the study keeps the first, lower one
    assert accuracy(SCORES, HELPS, (0.4902 + 0.4931) / 2) == 0.75
    assert fit_threshold(SCORES, HELPS).threshold < 0.44


def test_study_folds_refit_without_the_held_out_scale():
    folds = {f.group: f for f in leave_one_group_out(SCORES, HELPS, GROUPS).folds}
    # hand-checked: without 124M the 0.4662 cell is gone and 0.49165 becomes the first best (8/9)
    assert folds["124M"].threshold == pytest.approx((0.4902 + 0.4931) / 2, abs=1e-15)
    assert (folds["124M"].correct, folds["124M"].n, folds["124M"].train_accuracy) == (1, 3, 8 / 9)
    assert folds["354M"].threshold == pytest.approx(0.43985, abs=1e-15)
    assert (folds["64M"].correct, folds["354M"].correct, folds["1.3B"].correct) == (3, 1, 1)


def test_candidates_are_midpoints_of_distinct_sorted_scores_and_edges():
    assert candidate_thresholds([0.5, 0.1, 0.5, 0.3]) == pytest.approx([0.09, 0.2, 0.4, 0.51])
    assert candidate_thresholds([0.2]) == pytest.approx([0.19, 0.21])


def test_direction_is_go_at_or_above_the_threshold():
    assert predict([0.42, 0.43, 0.44], 0.43) == [False, True, True]
    assert accuracy([0.1, 0.9], [False, True], 0.5) == 1.0
    assert accuracy([0.1, 0.9], [True, False], 0.5) == 0.0


def test_separable_cells_fit_exactly():
    fit = fit_threshold([0.1, 0.2, 0.3, 0.4], [False, False, True, True])
    assert fit.threshold == pytest.approx(0.25) and fit.accuracy == 1.0 and not fit.threshold_outside


def test_tied_scores_and_tied_accuracies():
    # scores 0.2 (helped), 0.2 (hurt), 0.5 (helped): candidates 0.19 (2/3), 0.35 (2/3), 0.51 (1/3)
    fit = fit_threshold([0.2, 0.2, 0.5], [True, False, True])
    assert fit.threshold == pytest.approx(0.19) and fit.correct == 2 and fit.threshold_outside


def test_balanced_rule_does_not_settle_on_the_majority_class():
    # one "helps" among six: accuracy's best is "always NO-GO" (5/6, above every score);
    # balanced accuracy's is 0.35 (recall 1 on helps, 3/5 on hurts: 0.8)
    scores, helps = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [False, False, False, True, False, False]
    mid, bal = fit_threshold(scores, helps, "midpoint"), fit_threshold(scores, helps, "balanced")
    assert mid.threshold == pytest.approx(0.61) and mid.correct == 5 and mid.threshold_outside
    assert mid.balanced_accuracy == 0.5
    assert bal.threshold == pytest.approx(0.35) and bal.balanced_accuracy == pytest.approx(0.8) and bal.correct == 4


def test_study_balanced_rule_by_hand():
    fit = fit_threshold(SCORES, HELPS, "balanced")
    # 0.26505: every helped cell above (recall 4/4), 4 of 8 hurt cells below: balanced 0.75, accuracy 8/12
    assert fit.threshold == pytest.approx((0.2376 + 0.2925) / 2, abs=1e-15)
    assert (fit.balanced_accuracy, fit.correct) == (0.75, 8)
    assert balanced_accuracy(SCORES, HELPS, fit.threshold) == 0.75


def _brute_force(scores, helps, score_fn):
    """Independent reference: every candidate, numpy-free, first maximum."""
    values = sorted(set(scores))
    cands = [values[0] - 0.01] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 0.01]
    best = max(score_fn(t) for t in cands)
    return next(t for t in cands if score_fn(t) == best)


@pytest.mark.parametrize("seed", range(20))
def test_fit_equals_brute_force_on_random_cells(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 15)
    scores = [round(rng.random(), 2) for _ in range(n)]  # two decimals: ties happen
    helps = [rng.random() < 0.4 for _ in range(n)]

    def acc(t):
        return sum((s >= t) == h for s, h in zip(scores, helps)) / n

    def bal(t):
        pos = [s >= t for s, h in zip(scores, helps) if h]
        neg = [s < t for s, h in zip(scores, helps) if not h]
        rec = [sum(x) / len(x) for x in (pos, neg) if x]
        return sum(rec) / len(rec)

    assert fit_threshold(scores, helps, "midpoint").threshold == _brute_force(scores, helps, acc)
    assert fit_threshold(scores, helps, "balanced").threshold == _brute_force(scores, helps, bal)


def test_leave_one_group_out_refits_per_fold_by_hand():
    # group a: 0.1 hurt, 0.9 helped; group b: 0.2 helped, 0.8 hurt.
    # held out a: fit on b -> 0.19 (first of 0.19 / 0.81, 1/2 each), a scores 2/2;
    # held out b: fit on a -> 0.5, b scores 0/2. Pooled 2/4.
    cv = leave_one_group_out([0.1, 0.9, 0.2, 0.8], [False, True, True, False], ["a", "a", "b", "b"])
    assert [(f.group, round(f.threshold, 12), f.correct) for f in cv.folds] == [("a", 0.19, 2), ("b", 0.5, 0)]
    assert (cv.correct, cv.accuracy) == (2, 0.5)
    assert cv.balanced_accuracy == 0.5  # helped: 1 of 2 right, hurt: 1 of 2


def _auc_by_average_ranks(scores, helps):
    """Mann-Whitney U from average ranks: an independent formula for the tie-aware AUC."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    pos = sum(helps)
    neg = len(helps) - pos
    return (sum(r for r, h in zip(ranks, helps) if h) - pos * (pos + 1) / 2) / (pos * neg)


def test_auc_by_hand_and_against_average_ranks():
    assert auc([0.1, 0.2, 0.3, 0.4], [False, True, False, True]) == 0.75
    assert auc([0.5, 0.5, 0.7], [False, True, True]) == 0.75  # one tie (half) + one win, of 2 pairs
    assert auc([0.9, 0.1], [False, True]) == 0.0  # reads the wrong way round
    assert math.isnan(auc([0.1, 0.2], [True, True]))
    rng = random.Random(7)
    for _ in range(20):
        scores = [rng.choice([0.1, 0.2, 0.3, 0.4]) for _ in range(12)]
        helps = [rng.random() < 0.5 for _ in range(12)]
        if 0 < sum(helps) < 12:
            assert auc(scores, helps) == pytest.approx(_auc_by_average_ranks(scores, helps), abs=1e-12)


def test_errors_say_what_was_expected():
    with pytest.raises(ValueError, match="Expected as many outcomes as scores, got 1 outcomes for 2"):
        fit_threshold([0.1, 0.2], [True])
    with pytest.raises(ValueError, match="Expected finite scores"):
        fit_threshold([0.1, math.nan], [True, False])
    with pytest.raises(ValueError, match="Expected rule to be one of"):
        fit_threshold([0.1, 0.2], [True, False], "logistic")
    with pytest.raises(ValueError, match="Expected at least 2 groups"):
        leave_one_group_out([0.1, 0.2], [True, False], ["a", "a"])
    with pytest.raises(ValueError, match="Expected at least one"):
        auc([], [])
