"""The second grid's pre-registered analysis (docs/plans/grid2_plan.md): frozen hypotheses, a within-size window test
with a power analysis, and the 0.4 protocol beside it.

The first grid (data/faithful_grid.json) could not have found a window reading that predicts: five of its six
window readings are separated by model size, so leave-one-size-out always fits its threshold on one size's levels
and applies it to another's. This file holds the analysis that the plan commits before the second grid runs:

- ``hypotheses``: H1-H4, frozen from the first 16 cells (and the study's), scored on the new cells;
- ``within_size``: the redesigned window test. A reading's *stratified AUC* compares only cells of one size (the
  share of (helped, hurt) pairs of the same size where the helped cell reads higher; ties count half), so a level
  set by model size cannot decide it. The family statistic is the best stratified AUC over the six window readings;
  its p-value is the share of 10,000 shuffles of the outcomes *within each size* (the number of helped cells per
  size kept) whose statistic is at least the observed one;
- ``power``: for each reading and each design, the share of the outcome labelings that the reading orders
  perfectly within each size (every helped cell of a size reads above every hurt cell of that size: the labelings
  under which the reading is a perfect within-size predictor) under which the test would pass. A design whose share
  is 0 cannot pass whatever the outcomes: it is redesigned before the run. Power uses the readings only, never the
  outcomes, so it is computed on the pilot (the first grid's 16 cells) before the run and again on the new cells.

    python examples/grid2_analysis.py --power data/faithful_grid.json     # the plan's power table (the pilot)
    python examples/grid2_analysis.py --report OUT/faithful_grid.json     # the full analysis of a finished grid
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regime_grid as rg  # noqa: E402  (the 0.4 protocol's analysis: rg.analyze)

WINDOW = rg.WINDOW_READINGS
#: The frozen hypotheses' constants (docs/plans/grid2_plan.md: where each comes from).
H1_PASSES = 51.0  # DyT helps iff passes >= 51 (between the first grid's 16 and 164: the geometric middle, rounded)
H2_TOKENS_PER_PARAM = 0.49  # DyT helps iff unique tokens per parameter <= 0.49
H3_PASSES = 3.3  # DyT hurts at <= 3.3 passes
ALPHA = 0.05
AUC_BAR = 0.75
PERMUTATIONS = 10_000
POWER_SHUFFLES = 2_000


# ------------------------------------------------------------------------------------------------ outcomes
def passes(c: dict[str, Any]) -> float:
    return float(c.get("passes", c["epochs"]))


def helps_final(c: dict[str, Any]) -> bool:
    return bool(c["delta"] < 0)


def helps_best(c: dict[str, Any]) -> bool:
    return bool(c["best_val_loss_dyt"] < c["best_val_loss_layernorm"])


def binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): the one-sided exact test of k successes against the rate p."""
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided interval for a binomial proportion (bisection on the binomial tails)."""
    a = (1 - level) / 2

    def solve(f, lo=0.0, hi=1.0) -> float:
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: binom_tail(k, n, p) < a)
    high = 1.0 if k == n else solve(lambda p: 1 - binom_tail(k + 1, n, p) >= a)
    return low, high


def score_rule(predicted: Sequence[bool], actual: Sequence[bool]) -> dict[str, Any]:
    """Accuracy of a fixed rule, its exact interval, and the one-sided binomial test against the better trivial rule."""
    n = len(actual)
    correct = sum(p == a for p, a in zip(predicted, actual))
    trivial = max(sum(actual), n - sum(actual)) / n if n else math.nan
    return {
        "correct": correct,
        "n": n,
        "accuracy": correct / n if n else math.nan,
        "interval95": clopper_pearson(correct, n) if n else None,
        "trivial": trivial,
        "p_vs_trivial": binom_tail(correct, n, trivial) if n else None,
        "beats_trivial": bool(n and binom_tail(correct, n, trivial) < ALPHA),
    }


def hypotheses(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """H1-H4 as frozen in the plan, on the final and the best-checkpoint outcome."""
    out: dict[str, Any] = {}
    for outcome, f in (("final", helps_final), ("best", helps_best)):
        actual = [f(c) for c in cells]
        low = [c for c in cells if passes(c) <= H3_PASSES * 1.001]  # 3.3 passes is 1,551,515 bytes: 3.3000003
        out[outcome] = {
            "H1": score_rule([passes(c) >= H1_PASSES for c in cells], actual),
            "H2": score_rule([c["tokens_per_param"] <= H2_TOKENS_PER_PARAM for c in cells], actual),
            "H3": {
                "cells": len(low),
                "hurt": sum(not f(c) for c in low),
                "holds": all(not f(c) for c in low) and bool(low),
                "exceptions": [c["name"] for c in low if f(c)],
            },
        }
    wins = [c["name"] for c in cells if helps_best(c)]
    out["H4"] = {
        "cells": len(cells),
        "dyt_best_not_below": len(cells) - len(wins),
        "holds": not wins,
        "exceptions": wins,
    }
    return out


# ------------------------------------------------------------------------------------------ within size
def _groups(cells: list[dict[str, Any]]) -> list[list[int]]:
    by: dict[str, list[int]] = {}
    for i, c in enumerate(cells):
        by.setdefault(c["group"], []).append(i)
    return [by[g] for g in sorted(by)]


def _cmp(x: np.ndarray) -> np.ndarray:
    """``cmp[i, j]`` = 1 if x_i > x_j, 0.5 if equal, 0 if below."""
    return (x[:, None] > x[None, :]) + 0.5 * (x[:, None] == x[None, :])


class Stratified:
    """Stratified AUCs of several readings over many labelings at once (the sizes are the strata)."""

    def __init__(self, readings: dict[str, Sequence[float]], groups: list[list[int]]) -> None:
        self.names = list(readings)
        self.groups = groups
        # per size: (R, n_g, n_g) comparison matrices
        self.cmps = [
            np.stack([_cmp(np.asarray([readings[r][i] for i in g], dtype=float)) for r in self.names]) for g in groups
        ]

    def aucs(self, labels: np.ndarray) -> np.ndarray:
        """``labels`` (S, n) booleans -> (S, R) stratified AUCs (NaN where no size holds both outcomes)."""
        num = np.zeros((labels.shape[0], len(self.names)))
        den = np.zeros(labels.shape[0])
        for g, cmp in zip(self.groups, self.cmps):
            lg = labels[:, g].astype(float)  # (S, n_g)
            num += np.einsum("si,rij,sj->sr", lg, cmp, 1.0 - lg)
            den += lg.sum(1) * (1.0 - lg).sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return num / den[:, None]


def _shuffles(labels: np.ndarray, groups: list[list[int]], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` copies of ``labels`` shuffled within each size: (n, len(labels))."""
    out = np.repeat(labels[None, :], n, axis=0)
    for g in groups:
        idx = np.asarray(g)
        perm = np.argsort(rng.random((n, len(g))), axis=1)
        out[:, idx] = labels[idx][perm]
    return out


def within_size(
    cells: list[dict[str, Any]],
    outcome=helps_final,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
    names: Sequence[str] = WINDOW,
) -> dict[str, Any]:
    """The plan's within-size test of the window family on one outcome."""
    groups = _groups(cells)
    labels = np.asarray([outcome(c) for c in cells])
    readings = {r: [float(c[r]) for c in cells] for r in names}
    extra = {r: [float(c[r]) for c in cells] for r in ("log_params_per_token",) + rg.FINAL_READINGS if r in cells[0]}
    st = Stratified(readings, groups)
    observed = st.aucs(labels[None, :])[0]
    mixed = [g for g in groups if 0 < labels[g].sum() < len(g)]
    out: dict[str, Any] = {
        "helps": int(labels.sum()),
        "n": len(cells),
        "mixed_sizes": len(mixed),
        "stratified_auc": dict(zip(names, map(float, observed))),
    }
    ex = Stratified(extra, groups).aucs(labels[None, :])[0] if extra else []
    out["stratified_auc_outside_family"] = dict(zip(extra, map(float, ex)))
    if not mixed:
        out["decision"] = {"predicts": None, "why": "no size holds both outcomes: the within-size test is undefined"}
        return out
    stat = float(np.nanmax(observed))
    rng = np.random.default_rng(seed)
    null = np.nanmax(st.aucs(_shuffles(labels, groups, permutations, rng)), axis=1)
    p = (1 + int((null >= stat - 1e-12).sum())) / (1 + permutations)
    best = next(r for r, a in zip(names, observed) if a >= stat - 1e-12)
    predicts = p < ALPHA and stat >= AUC_BAR
    out["decision"] = {
        "statistic": stat,
        "reading": best if predicts else None,
        "best_reading": best,
        "p_value": p,
        "permutations": permutations,
        "predicts": bool(predicts),
        "adds_to_budget": bool(
            predicts and stat > out["stratified_auc_outside_family"].get("log_params_per_token", -1.0)
        ),
    }
    out["leave_one_seed_out_centered"] = _centered_loseedo(cells, labels, names)
    return out


def _centered_loseedo(cells: list[dict[str, Any]], labels: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Held-out check of the within-size test: each reading minus its size's median, leave-one-seed-out."""
    out = {}
    seeds = [c["seed"] for c in cells]
    if len(set(seeds)) < 2:
        return out
    for r in names:
        med: dict[str, float] = {}
        for g in {c["group"] for c in cells}:
            med[g] = float(np.median([c[r] for c in cells if c["group"] == g]))
        x = [c[r] - med[c["group"]] for c in cells]
        out[r] = rg.held_out(x, [bool(v) for v in labels], seeds)["accuracy"]
    return out


# -------------------------------------------------------------------------------------------------- power
def monotone_labelings(x: Sequence[float], groups: list[list[int]]) -> list[np.ndarray]:
    """Every labeling that ``x`` orders perfectly within each size: in each size g, the cells reading at or above
    a threshold helped (the thresholds: each distinct value of the size, or none helped), chosen per size, with at
    least one size holding both outcomes. Tied readings share their label, so a reading constant within every
    size has no such labeling (it cannot order any outcome)."""
    n = len(x)
    options = []
    for g in groups:
        levels = sorted({x[i] for i in g}, reverse=True)
        opts = [np.zeros(n, dtype=bool)]
        for t in levels:
            lab = np.zeros(n, dtype=bool)
            lab[[i for i in g if x[i] >= t]] = True
            opts.append(lab)
        options.append(opts)
    out = []
    for combo in itertools.product(*options):
        lab = np.logical_or.reduce(combo)
        if any(0 < lab[g].sum() < len(g) for g in groups):
            out.append(lab)
    return out


def power(
    cells: list[dict[str, Any]],
    shuffles: int = POWER_SHUFFLES,
    seed: int = 0,
    protocol_04: bool = True,
    names: Sequence[str] = WINDOW,
) -> dict[str, Any]:
    """For each window reading: the share of its within-size monotone labelings under which each design passes.

    Within-size design: the family's best stratified AUC >= 0.75 and its within-size permutation p < 0.05 (the
    null distribution depends only on the number of helped cells per size, so it is computed once per count
    vector, ``shuffles`` shuffles). The 0.4 protocol (``protocol_04``): held-out accuracy above the better trivial
    rule under both leave-one-size-out and leave-one-seed-out and AUC >= 0.75 (its permutation criterion not
    applied: an upper bound on its power)."""
    groups = _groups(cells)
    readings = {r: [float(c[r]) for c in cells] for r in names}
    st = Stratified(readings, groups)
    rng = np.random.default_rng(seed)
    nulls: dict[tuple[int, ...], np.ndarray] = {}
    sizes, seeds = [c["group"] for c in cells], [c["seed"] for c in cells]
    protocol_04 = protocol_04 and len(set(sizes)) >= 2 and len(set(seeds)) >= 2  # its two held-out protocols need both
    from satmon.functional.threshold_fit import auc

    out: dict[str, Any] = {}
    for r in names:
        labs = monotone_labelings(readings[r], groups)
        ws = o4 = 0
        by_k: dict[int, list[int]] = {}
        for lab in labs:
            ks = tuple(int(lab[g].sum()) for g in groups)
            if ks not in nulls:
                nulls[ks] = np.nanmax(st.aucs(_shuffles(lab, groups, shuffles, rng)), axis=1)
            obs = st.aucs(lab[None, :])[0]
            stat = float(np.nanmax(obs))
            p = (1 + int((nulls[ks] >= stat - 1e-12).sum())) / (1 + shuffles)
            passed = bool(p < ALPHA and stat >= AUC_BAR)
            ws += passed
            by_k.setdefault(int(lab.sum()), [0, 0])
            by_k[int(lab.sum())][0] += passed
            by_k[int(lab.sum())][1] += 1
            if protocol_04:
                helps = [bool(v) for v in lab]
                bar = max(sum(helps), len(helps) - sum(helps)) / len(helps)
                x = readings[r]
                ok = (
                    rg.held_out(x, helps, sizes)["accuracy"] > bar
                    and rg.held_out(x, helps, seeds)["accuracy"] > bar
                    and auc(x, helps) >= AUC_BAR
                )
                o4 += ok
        out[r] = {
            "labelings": len(labs),
            "within_size": ws / len(labs) if labs else math.nan,
            "within_size_by_helped": {k: v[0] / v[1] for k, v in sorted(by_k.items())},
            **({"protocol_04": o4 / len(labs) if labs else math.nan} if protocol_04 else {}),
        }
    return out


# ------------------------------------------------------------------------------------------------- report
def analyze2(cells: list[dict[str, Any]], permutations: int = PERMUTATIONS) -> dict[str, Any]:
    """Everything the plan registers, from the cells alone."""
    return {
        "hypotheses": hypotheses(cells),
        "within_size": {
            "final": within_size(cells, helps_final, permutations),
            "best": within_size(cells, helps_best, permutations),
        },
        "protocol_04": rg.analyze(cells, permutations),
        "power": power(cells),
        "study_043": {
            "accuracy": sum((c["window_saturation"] >= rg.STUDY_THRESHOLD) == helps_final(c) for c in cells)
            / len(cells)
        },
    }


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def power_markdown(pw: dict[str, Any]) -> str:
    lines = [
        "| reading | monotone labelings | passes the within-size test | with 2-4 / 5-8 / 9+ helped cells | "
        "passes the 0.4 protocol (upper bound) |",
        "|---|---|---|---|---|",
    ]
    for r, v in pw.items():
        if not v["labelings"]:
            lines.append(f"| {r} | 0 (constant within every size: orders no outcome) | - | - | - |")
            continue
        bk = v["within_size_by_helped"]

        def band(lo: int, hi: int, bk: dict = bk) -> str:  # this row's counts, bound now
            vals = [bk[k] for k in bk if lo <= k <= hi]
            return _pct(sum(vals) / len(vals)) if vals else "-"

        lines.append(
            f"| {r} | {v['labelings']} | {_pct(v['within_size'])} | {band(2, 4)} / {band(5, 8)} / {band(9, 10**6)} | "
            f"{_pct(v.get('protocol_04', math.nan))} |"
        )
    return "\n".join(lines)


def report_markdown2(a: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    h = a["hypotheses"]
    lines = [
        rg.report_markdown(a["protocol_04"], cells),
        "",
        "### Frozen hypotheses (docs/plans/grid2_plan.md)",
        "",
        "| hypothesis | outcome | result | exact 95% interval | trivial rate | one-sided p vs trivial |",
        "|---|---|---|---|---|---|",
    ]
    for outcome in ("final", "best"):
        for k in ("H1", "H2"):
            s = h[outcome][k]
            lo, hi = s["interval95"]
            lines.append(
                f"| {k} | {outcome} | {s['correct']}/{s['n']} = {_pct(s['accuracy'])} | {_pct(lo)}-{_pct(hi)} | "
                f"{_pct(s['trivial'])} | {s['p_vs_trivial']:.4f} |"
            )
        s = h[outcome]["H3"]
        lines.append(f"| H3 | {outcome} | DyT hurt in {s['hurt']}/{s['cells']} cells at <= {H3_PASSES} passes | | | |")
    s = h["H4"]
    lines.append(
        f"| H4 | best | DyT's best not below LayerNorm's best in {s['dyt_best_not_below']}/{s['cells']} | | | |"
    )
    lines += ["", "### Within-size window test", ""]
    for outcome in ("final", "best"):
        w = a["within_size"][outcome]
        d = w["decision"]
        aucs = ", ".join(f"{r} {v:.2f}" for r, v in w["stratified_auc"].items())
        if d.get("predicts") is None:
            lines.append(f"- {outcome}: {d['why']}.")
            continue
        lines.append(
            f"- {outcome} checkpoint ({w['helps']}/{w['n']} helped, {w['mixed_sizes']} sizes with both outcomes): "
            f"stratified AUC {aucs}; family best {d['statistic']:.2f} ({d['best_reading']}), within-size "
            f"permutation p = {d['p_value']:.4f}: "
            + ("**a window reading predicts within size**" if d["predicts"] else "**no window reading predicts**")
            + "; the budget's own stratified AUC "
            f"{w['stratified_auc_outside_family'].get('log_params_per_token', math.nan):.2f}."
        )
    lines += ["", "### Power on these cells (readings only)", "", power_markdown(a["power"])]
    return "\n".join(lines)


CSV_HEADER = (
    "name",
    "params",
    "train_tokens",
    "delta",
    "group",
    "source",
    "passes",
    "final_dyt",
    "final_layernorm",
    "best_dyt",
    "best_layernorm",
    "protocol",
)


def cells_csv(cells: list[dict[str, Any]], source: str, note: str) -> str:
    """The cells as a ``satmon/data_files/phase_grid_*.csv`` file (the format ``satmon.forecast`` and the phase
    diagram read; ``protocol`` = ``study``: trained under the study's protocol)."""
    lines = [f"# {line}".rstrip() for line in note.strip().splitlines()]
    lines.append(",".join(CSV_HEADER))
    for c in cells:
        lines.append(
            ",".join(
                [
                    c["name"],
                    str(c["params"]),
                    str(c["train_tokens"]),
                    f"{c['delta']:.6f}",
                    c["group"],
                    source,
                    f"{passes(c):.4f}",
                    f"{c['val_loss_dyt']:.6f}",
                    f"{c['val_loss_layernorm']:.6f}",
                    f"{c['best_val_loss_dyt']:.6f}",
                    f"{c['best_val_loss_layernorm']:.6f}",
                    "study",
                ]
            )
        )
    return "\n".join(lines) + "\n"


CSV_NOTE = """satmon 0.5's second CPU grid (docs/plans/grid2_plan.md, committed before its run; cells in data/grid2.json), one row per
cell: d48L2 and d64L2 at 3.3 / 16 / 32 / 64 / 100 / 164 passes over the unique data, d96L3 at 32 / 64 / 100, seeds 2
and 3, each budget drawn as 2,048-byte chunks chosen per seed; the faithful grid's protocol otherwise (5,000 steps,
window inside a 2,000-step warm-up, GPT-2 init, no cell filtered). Columns as phase_grid_faithful.csv. Written by
`python examples/grid2_analysis.py --csv data/grid2.json`."""  # noqa: E501 (phase_grid_grid2.csv's header, byte for byte)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--power", metavar="JSON", help="the power table of a grid's cells (readings only)")
    g.add_argument("--report", metavar="JSON", help="the full analysis of a finished grid")
    g.add_argument("--csv", metavar="JSON", help="write the cells as satmon/data_files/phase_grid_grid2.csv")
    p.add_argument("--permutations", type=int, default=PERMUTATIONS)
    p.add_argument("--json", help="also write the analysis as JSON here")
    args = p.parse_args(argv)
    cells = json.loads(Path(args.power or args.report or args.csv).read_text())["cells"]
    if args.csv:
        dest = Path(__file__).resolve().parents[1] / "satmon" / "data_files" / "phase_grid_grid2.csv"
        dest.write_text(cells_csv(cells, "satmon 0.5 second CPU grid", CSV_NOTE))
        print(f"wrote {dest} ({len(cells)} cells)")
        return 0
    if args.power:
        pw = power(cells)
        print(power_markdown(pw))
        result: Any = pw
    else:
        result = analyze2(cells, args.permutations)
        print(report_markdown2(result, cells))
    if args.json:
        Path(args.json).write_text(json.dumps(rg.json_safe(result), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
