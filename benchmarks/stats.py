"""The statistics of satmon's step-time benchmarks: quantiles, the paired estimate, its bootstrap
interval, between-run summaries, and pooling of saved runs. Pure Python (numpy for the bootstrap).

A *run* is the list of per-step times (seconds) of one training run, its first element being the
step ``first`` (the first measured optimizer step); ``runs`` maps a configuration name (``"off"``,
``"paired"``, ``"sampled"``, ...) to its runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "PAIRED_CONFIGS",
    "SAMPLED_EVERY",
    "bootstrap_interval",
    "neighbour_ratios",
    "paired_estimate",
    "paired_lines",
    "pool_runs",
    "paired_estimates",
    "quantile",
    "summarise",
]

SAMPLED_EVERY = 4  # the ``sampled`` configuration's ``sample_every``
#: the ``sample_every=2`` configurations a paired estimate is made of: satmon's own count path, then each path forced
PAIRED_CONFIGS = ("paired", "paired-eager", "paired-fused")


def quantile(xs: Iterable[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), no numpy needed; NaN for no data.

    Example:
        >>> quantile([4.0, 1.0, 3.0, 2.0], 0.5), quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.2)
        (2.5, 1.8)
    """
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def neighbour_ratios(run: list[float], first: int, every: int = 2) -> list[float]:
    """For every step ``g`` of one run with ``g % every == 0``: ``t_g / mean(t_{g-1}, t_{g+1})`` (its two neighbours).

    ``run[i]`` is the time of step ``first + i``; the run's first and last steps have one neighbour
    only and are left out.

    Example:
        >>> neighbour_ratios([1.0, 3.0, 1.0, 2.0, 2.0], first=0)  # steps 2 (3 / 2) only; 0 and 4 are ends
        [0.4]
    """
    return [run[i] / ((run[i - 1] + run[i + 1]) / 2) for i in range(1, len(run) - 1) if (first + i) % every == 0]


def bootstrap_interval(
    counted: list[float], control: list[float], level: float = 0.9, n: int = 2000
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``median(counted) / median(control)``, both resampled (seeded).

    How far the paired estimate could move by the luck of which steps were measured: a target is
    met with confidence only when the interval's upper end is below it. ``(nan, nan)`` when either
    sample has fewer than two values.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = np.asarray(counted), np.asarray(control)
    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    ra = np.median(a[rng.integers(0, len(a), (n, len(a)))], axis=1)
    rb = np.median(b[rng.integers(0, len(b), (n, len(b)))], axis=1)
    lo, hi = np.quantile(ra / rb, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired_estimate(
    runs: Mapping[str, list[list[float]]], first: int, sampled_every: int = SAMPLED_EVERY, config: str = "paired"
) -> dict[str, float] | None:
    """Median neighbour ratio of the counted steps over that of the same steps of the ``off`` runs (control).

    From the ``config`` runs (``sample_every=2``; ``"paired"`` by default, or one of the forced count
    paths of :data:`PAIRED_CONFIGS`): the window's cost per counted step. With ``config="paired"``,
    from the ``sampled`` runs (``sample_every=sampled_every``) when present: the same, measured again,
    and divided by ``sampled_every`` (one step in that many is counted; the others run idle hooks only)
    as that setting's overhead per step. ``None`` without ``config`` runs.

    Also returned: ``pairs`` (counted steps measured) and ``width`` (the 90% interval's width, in ratio units).
    """
    if config not in runs or not runs[config]:
        return None

    def ratios(config: str, every: int) -> list[float]:
        return [r for run in runs[config] for r in neighbour_ratios(run, first, every)]

    counted2, control2 = ratios(config, 2), ratios("off", 2)
    counted, control = quantile(counted2, 0.5), quantile(control2, 0.5)
    lo, hi = bootstrap_interval(counted2, control2)
    out = {
        "counted_vs_neighbours": counted,
        "control_even_vs_odd": control,
        "ratio": counted / control,
        "ratio_lo": lo,
        "ratio_hi": hi,
        "width": hi - lo,
        "pairs": len(counted2),
    }
    if config == "paired" and runs.get("sampled"):
        counted4, control4 = ratios("sampled", sampled_every), ratios("off", sampled_every)
        c4, k4 = quantile(counted4, 0.5), quantile(control4, 0.5)
        lo4, hi4 = bootstrap_interval(counted4, control4)

        def per_step(r: float) -> float:
            return 1 + (r - 1) / sampled_every

        out.update(
            {
                "sampled_counted_vs_neighbours": c4,
                "sampled_control": k4,
                "sampled_step_ratio": per_step(c4 / k4),
                "sampled_step_lo": per_step(lo4),
                "sampled_step_hi": per_step(hi4),
            }
        )
    return out


def summarise(times: Mapping[str, list[float]], q: float) -> dict[str, dict[str, float]]:
    """Per configuration: the ``q`` quantile and the median of its pooled step times, and both as
    ratios to the ``off`` configuration's (between runs: exposed to load drifting between them)."""
    ref = times["off"]
    ref_q, ref_m = quantile(ref, q), quantile(ref, 0.5)
    out = {}
    for c, ts in times.items():
        tq, tm = quantile(ts, q), quantile(ts, 0.5)
        out[c] = {"q": tq, "median": tm, "ratio_q": tq / ref_q, "ratio_median": tm / ref_m, "n": len(ts)}
    return out


def paired_estimates(runs: Mapping[str, list[list[float]]], first: int) -> dict[str, dict[str, float]]:
    """:func:`paired_estimate` of every paired configuration in ``runs``, by configuration."""
    out = {}
    for c in PAIRED_CONFIGS:
        pe = paired_estimate(runs, first, config=c)
        if pe is not None:
            out[c] = pe
    return out


def pool_runs(
    saved: Iterable[tuple[str, Mapping[str, Any]]], configs: tuple[str, ...] = ("off", "sampled", *PAIRED_CONFIGS)
) -> dict[str, dict[str, Any]]:
    """Pool the runs of earlier benchmark results (``(path, loaded --json file)`` pairs), per model.

    Returns model -> ``{"runs": {config: runs}, "warmup": int, "files": int}``. Runs of the same
    code on a noisy machine each give a wide interval; pooled, the interval narrows. Every file
    must have measured from the same first step (its model's ``"warmup"``, else ``--warmup``):
    which steps were counted, so the neighbour ratios, depend on it.
    """
    results: dict[str, dict[str, Any]] = {}
    for path, data in saved:
        for m, r in data["results"].items():
            warmup = r.get("warmup", data["args"]["warmup"])  # per model since the split (--smoke overrides --warmup)
            into = results.setdefault(m, {"runs": {}, "warmup": warmup, "files": 0})
            if into["warmup"] != warmup:
                raise ValueError(
                    f"Expected one --warmup in every pooled file, got {into['warmup']} and {warmup} ({path})."
                )
            into["files"] += 1
            for c in configs:
                into["runs"].setdefault(c, []).extend(r["runs"].get(c, []))
    return results


#: how each paired configuration is named in words
PATH_WORDS = {
    "paired": "window hot-path overhead",
    "paired-eager": "four-op count (forced)",
    "paired-fused": "fused count (forced)",
}


def paired_lines(results: Mapping[str, Mapping[str, Any]], sampled_every: int = SAMPLED_EVERY) -> list[str]:
    """The paired estimates of ``results`` (model -> ``{"paired": paired_estimate(...)}``, and optionally
    ``"paths"``: :func:`paired_estimates`) in words: satmon's own path first, then each forced path."""
    lines = []
    for m, r in results.items():
        estimates = dict(r.get("paths") or {})
        if r.get("paired"):
            estimates["paired"] = r["paired"]
        for config in PAIRED_CONFIGS:
            pe = estimates.get(config)
            if not pe:
                continue
            label = m if config == "paired" else f"{m}, {config}"
            lines.append(
                f"\nPaired estimate, {label}: a counted window step takes {pe['counted_vs_neighbours']:.4f} x its two "
                "uncounted neighbours (median; control, no monitor, even vs odd steps: "
                f"{pe['control_even_vs_odd']:.4f}): "
                f"{PATH_WORDS[config]} {100 * (pe['ratio'] - 1):+.2f}% "
                f"(90% bootstrap interval {100 * (pe['ratio_lo'] - 1):+.2f}% to {100 * (pe['ratio_hi'] - 1):+.2f}%"
                + (f", {100 * pe['width']:.2f} points wide, {pe['pairs']} counted steps)." if "width" in pe else ").")
            )
            if config == "paired" and "sampled_step_ratio" in pe:
                lines.append(
                    f"Paired estimate, {m}, sample_every={sampled_every}: a counted step takes "
                    f"{pe['sampled_counted_vs_neighbours']:.4f} x its neighbours (control "
                    f"{pe['sampled_control']:.4f}); "
                    f"one step in {sampled_every} counted: overhead "
                    f"{100 * (pe['sampled_step_ratio'] - 1):+.2f}% per step "
                    f"(90% interval {100 * (pe['sampled_step_lo'] - 1):+.2f}% to "
                    f"{100 * (pe['sampled_step_hi'] - 1):+.2f}%)."
                )
    return lines
