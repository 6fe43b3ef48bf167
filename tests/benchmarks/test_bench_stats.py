"""benchmarks/stats.py against hand-computed values and numpy's quantile."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from stats import (  # noqa: E402
    bootstrap_interval,
    neighbour_ratios,
    paired_estimate,
    paired_estimates,
    paired_lines,
    pool_runs,
    quantile,
    summarise,
)


def test_quantile_hand_values_and_numpy():
    assert quantile([5.0, 1.0, 4.0, 2.0, 3.0], 0.2) == pytest.approx(1.8)  # position 0.8 between 1 and 2
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([7.0], 0.3) == 7.0
    assert math.isnan(quantile([], 0.5))
    rng = random.Random(0)
    for n in (2, 5, 17, 100):
        xs = [rng.random() for _ in range(n)]
        for q in (0.0, 0.2, 0.5, 0.9, 1.0):
            assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-12, abs=1e-15)


def test_neighbour_ratios_pick_the_counted_steps():
    run = [1.0, 3.0, 1.0, 2.0, 2.0]  # steps first .. first + 4
    assert neighbour_ratios(run, first=0) == pytest.approx([1.0 / 2.5])  # step 2: 1 / mean(3, 2)
    assert neighbour_ratios(run, first=1) == pytest.approx([3.0 / 1.0, 2.0 / 1.5])  # steps 2, 4 at i = 1, 3
    long = [1.0, 1.0, 1.0, 1.0, 1.4, 1.0, 1.0, 1.0, 1.2, 1.0]
    # i = 4, 8; i = 0 has no left neighbour
    assert neighbour_ratios(long, first=0, every=4) == pytest.approx([1.4, 1.2])


def test_paired_estimate_hand_computed():
    # counted (even) steps of the paired run: 1.2, 1.1, 1.3 x their neighbours (median 1.2); the
    # control run alternates 2, 1: its even steps take 2 x their neighbours, so the ratio is 1.2 / 2
    runs = {"paired": [[1.0, 1.0, 1.2, 1.0, 1.1, 1.0, 1.3, 1.0]], "off": [[2.0, 1.0] * 4]}
    pe = paired_estimate(runs, first=0)
    assert pe["counted_vs_neighbours"] == pytest.approx(1.2)
    assert pe["control_even_vs_odd"] == pytest.approx(2.0)
    assert pe["ratio"] == pytest.approx(0.6)
    assert 1.1 / 2 - 1e-12 <= pe["ratio_lo"] <= pe["ratio"] <= pe["ratio_hi"] <= 1.3 / 2 + 1e-12
    assert "sampled_step_ratio" not in pe
    assert paired_estimate({"off": runs["off"]}, first=0) is None


def test_paired_estimate_sampled_is_per_step():
    flat = [1.0] * 10
    runs = {"paired": [flat], "off": [flat], "sampled": [[1.0, 1.0, 1.0, 1.0, 1.4, 1.0, 1.0, 1.0, 1.2, 1.0]]}
    pe = paired_estimate(runs, first=0)
    assert pe["ratio"] == 1.0 and pe["ratio_lo"] == pe["ratio_hi"] == 1.0  # every resample of equal values
    assert pe["sampled_counted_vs_neighbours"] == pytest.approx(1.3)  # median of 1.4, 1.2
    assert pe["sampled_control"] == 1.0
    assert pe["sampled_step_ratio"] == pytest.approx(1 + 0.3 / 4)  # one step in four pays 1.3
    assert 1 + 0.2 / 4 - 1e-12 <= pe["sampled_step_lo"] <= pe["sampled_step_hi"] <= 1 + 0.4 / 4 + 1e-12
    # the phase follows `first`: started at step 2, the slow steps (4, 8 above) are steps 6, 10: not counted
    shifted = paired_estimate(runs, first=2)
    assert shifted["sampled_counted_vs_neighbours"] == 1.0


def test_bootstrap_interval_degenerate_and_seeded():
    assert bootstrap_interval([2.0, 2.0, 2.0], [4.0, 4.0]) == (0.5, 0.5)
    assert all(math.isnan(v) for v in bootstrap_interval([1.0], [1.0, 2.0]))
    counted, control = [1.0, 1.1, 1.2, 1.3, 1.5], [1.0, 0.9, 1.1, 1.0]
    lo, hi = bootstrap_interval(counted, control)
    assert (lo, hi) == bootstrap_interval(counted, control)  # seeded: the same every call
    # resampled medians lie within the samples' ranges
    assert min(counted) / max(control) <= lo <= hi <= max(counted) / min(control)
    lo50, hi50 = bootstrap_interval(counted, control, level=0.5)
    assert lo <= lo50 <= hi50 <= hi  # a lower level, a narrower interval (same draws)


def test_summarise_ratios_to_off():
    s = summarise({"off": [5.0, 1.0, 4.0, 2.0, 3.0], "x": [2.0, 4.0, 6.0, 8.0, 10.0]}, q=0.2)
    assert s["off"] == {"q": pytest.approx(1.8), "median": 3.0, "ratio_q": 1.0, "ratio_median": 1.0, "n": 5}
    assert s["x"]["q"] == pytest.approx(3.6) and s["x"]["median"] == 6.0
    assert s["x"]["ratio_q"] == pytest.approx(2.0) and s["x"]["ratio_median"] == 2.0


def _saved(warmup_arg: int, model_warmup: int | None, off: list, paired: list) -> dict:
    r = {"runs": {"off": off, "paired": paired, "window": [[9.0]]}}
    if model_warmup is not None:
        r["warmup"] = model_warmup
    return {"args": {"warmup": warmup_arg}, "results": {"wide": r}}


def test_pool_runs_concatenates_and_checks_the_first_step():
    a = _saved(12, None, off=[[1.0, 2.0]], paired=[[3.0]])
    b = _saved(12, None, off=[[4.0]], paired=[[5.0], [6.0]])
    pooled = pool_runs([("a.json", a), ("b.json", b)])
    assert pooled["wide"]["files"] == 2 and pooled["wide"]["warmup"] == 12
    assert pooled["wide"]["runs"] == {
        "off": [[1.0, 2.0], [4.0]],
        "paired": [[3.0], [5.0], [6.0]],
        "sampled": [],
        "paired-eager": [],
        "paired-fused": [],
    }
    smoke = _saved(12, 6, off=[[1.0]], paired=[[1.0]])  # a --smoke file: its model's warmup wins over --warmup
    assert pool_runs([("s.json", smoke)])["wide"]["warmup"] == 6
    with pytest.raises(ValueError, match=r"Expected one --warmup in every pooled file, got 12 and 6 \(s.json\)"):
        pool_runs([("a.json", a), ("s.json", smoke)])


def test_pooling_a_run_with_itself_keeps_the_point_estimate():
    runs = {"paired": [[1.0, 1.0, 1.2, 1.0, 1.1, 1.0, 1.3, 1.0]], "off": [[1.0, 1.1, 1.0, 0.9, 1.0, 1.0, 1.05, 1.0]]}
    saved = {"args": {"warmup": 0}, "results": {"m": {"runs": runs}}}
    pooled = pool_runs([("x", saved), ("x", saved)])["m"]
    one, two = paired_estimate(runs, 0), paired_estimate(pooled["runs"], pooled["warmup"])
    assert two["ratio"] == one["ratio"]  # every ratio twice: the medians do not move


def test_paired_lines_read_as_percentages():
    pe = {
        "counted_vs_neighbours": 1.0069,
        "control_even_vs_odd": 1.0,
        "ratio": 1.0069,
        "ratio_lo": 1.0046,
        "ratio_hi": 1.0092,
        "sampled_counted_vs_neighbours": 1.0048,
        "sampled_control": 1.0,
        "sampled_step_ratio": 1.0012,
        "sampled_step_lo": 1.0006,
        "sampled_step_hi": 1.0020,
    }
    lines = paired_lines({"wide": {"paired": pe}, "demo": {"paired": None}})
    assert len(lines) == 2 and lines[0].startswith("\nPaired estimate, wide:")
    assert "window hot-path overhead +0.69% (90% bootstrap interval +0.46% to +0.92%)" in lines[0]
    assert "overhead +0.12% per step (90% interval +0.06% to +0.20%)" in lines[1]


def test_paired_estimates_of_each_count_path_share_one_control():
    """Forced count paths are estimated like ``paired``, against the same ``off`` runs; width and pairs come along."""
    off = [[2.0, 1.0] * 4]
    runs = {
        "off": off,
        "paired-eager": [[1.0, 1.0, 1.2, 1.0, 1.1, 1.0, 1.3, 1.0]],
        "paired-fused": [[1.0, 1.0, 1.05, 1.0, 1.0, 1.0, 1.1, 1.0]],
    }
    est = paired_estimates(runs, first=0)
    assert set(est) == {"paired-eager", "paired-fused"}  # no "paired" runs: no estimate for it
    assert est["paired-eager"]["ratio"] == pytest.approx(1.2 / 2) and est["paired-fused"]["ratio"] == pytest.approx(
        1.05 / 2
    )
    for pe in est.values():
        assert pe["control_even_vs_odd"] == pytest.approx(2.0) and pe["pairs"] == 3
        assert pe["width"] == pytest.approx(pe["ratio_hi"] - pe["ratio_lo"]) and pe["width"] >= 0
    assert est["paired-eager"] == paired_estimate(runs, 0, config="paired-eager")
    lines = paired_lines({"d512b8": {"paired": None, "paths": est}})
    assert [line.split(":")[0] for line in lines] == [
        "\nPaired estimate, d512b8, paired-eager",
        "\nPaired estimate, d512b8, paired-fused",
    ]
    assert "four-op count (forced) -40.00%" in lines[0] and "3 counted steps" in lines[0]
