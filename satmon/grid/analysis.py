"""The grid's answer: the analysis docs/plans/grid_plan.md registered, DyT's measured effect, and the forecast's record.

The statistics moved from ``examples/regime_grid.py`` (0.4's faithful grid; reproducible from a grid JSON's
cells alone): per reading the AUC, the study's midpoint fit in-sample, held-out accuracy leave-one-size-out
and leave-one-seed-out, and the plan's family-wise permutation test over the window readings. Added for
``satmon grid``: :func:`effect_table` (DyT's effect per size and budget, final and best checkpoint),
:func:`forecast_check` (what ``satmon.forecast`` would have said of each cell, where it is installed) and
:func:`answer_text` (what the command prints at the end). Pure functions of the cells' records, except
:func:`plot` (matplotlib, the ``report`` extra).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from satmon.study import THRESHOLD as STUDY_THRESHOLD  # 0.43

__all__ = [
    "READINGS",
    "WINDOW_READINGS",
    "analyze",
    "answer_text",
    "cell_line",
    "diverged_counts",
    "effect_table",
    "forecast_check",
    "held_out",
    "json_safe",
    "outcome",
    "phase_rows",
    "plot",
    "report_markdown",
    "spearman",
]

#: The window readings the plan tests (docs/plans/grid_plan.md), in its order; each predicts GO when high.
WINDOW_READINGS = (
    "window_saturation",
    "window_first_block",
    "window_last_block",
    "window_final_norm",
    "window_centered",
    "window_late",
)
#: The final checkpoint's readings by the study's protocol (does the study's own claim hold here?).
FINAL_READINGS = ("final_saturation", "final_first_block", "final_last_block", "final_final_norm", "final_centered")
#: Known before training: log10(parameters / unique training tokens), high = over-parameterised (GO expected).
PRIOR_READINGS = ("log_params_per_token",)
READINGS = WINDOW_READINGS + FINAL_READINGS + PRIOR_READINGS
#: The plan's bar (docs/plans/grid_plan.md): family-wise permutation p-value and AUC a window reading must reach.
P_BAR, AUC_BAR = 0.05, 0.75


def json_safe(o: Any) -> Any:
    """``o`` with NaN/inf floats as ``None`` (an AUC over one class is undefined, not a number)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v: Sequence[float]) -> list[float]:
        first: dict[float, int] = {}
        last: dict[float, int] = {}
        for i, x in enumerate(sorted(v)):
            first.setdefault(x, i)
            last[x] = i
        return [(first[x] + last[x]) / 2 for x in v]  # tied values share the mean of their positions

    return pearson(ranks(a), ranks(b))


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else math.nan


def held_out(
    scores: Sequence[float], helps: Sequence[bool], groups: Sequence[Any], rule: str = "midpoint"
) -> dict[str, Any]:
    """Leave-one-group-out accuracy of ``score >= t -> GO``, ``t`` refit on the other groups (the study's rule)."""
    from satmon.functional.threshold_fit import leave_one_group_out

    cv = leave_one_group_out(scores, helps, [str(g) for g in groups], rule)
    return {
        "accuracy": cv.accuracy,
        "correct": cv.correct,
        "n": cv.n,
        "balanced": cv.balanced_accuracy,
        "folds": [{"held_out": f.group, "threshold": f.threshold, "correct": f.correct, "n": f.n} for f in cv.folds],
    }


def outcome(cell: dict[str, Any]) -> bool | None:
    """Whether DyT helped in ``cell``: ``delta < 0`` where both final losses are finite; where an arm diverged, the
    record's ``helps`` (the arm that did not diverge did better); ``None`` where there is no outcome (both arms
    diverged, or a record without a finite ``delta``).

    Example:
        >>> outcome({"delta": -0.02}), outcome({"delta": None, "helps": False, "diverged": {"dyt": 40}})
        (True, False)
        >>> outcome({"delta": None, "helps": None, "diverged": {"dyt": 40, "layernorm": 9}}) is None
        True
    """
    d = cell.get("delta")
    if isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d):
        return d < 0
    h = cell.get("helps")
    return h if isinstance(h, bool) and cell.get("diverged") else None


def no_outcome_why(cell: dict[str, Any]) -> str:
    """Why ``cell`` has no outcome (:func:`outcome` is ``None``), in words."""
    div = cell.get("diverged") or {}
    if div:
        return "; ".join(f"the {a} arm diverged at step {n}" for a, n in div.items())
    return (cell.get("missing") or {}).get("delta", "no finite delta")


def diverged_counts(cells: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many cells each arm diverged in (its loss not finite), over ``cells``; ``{}``: none diverged.

    Example:
        >>> diverged_counts([{"diverged": {"dyt": 12}}, {"diverged": {}}, {"diverged": {"dyt": 3, "layernorm": 5}}])
        {'dyt': 2, 'layernorm': 1}
    """
    counts: dict[str, int] = {}
    for c in cells:
        for a in c.get("diverged") or {}:
            counts[a] = counts.get(a, 0) + 1
    return dict(sorted(counts.items()))


def family_statistic(cells: list[dict[str, Any]], helps: Sequence[bool], names: Sequence[str]) -> float:
    """The plan's test statistic: the best, over the window readings, of the worse of its two held-out
    accuracies (leave-one-size-out, leave-one-seed-out)."""
    sizes, seeds = [c["group"] for c in cells], [c["seed"] for c in cells]
    best = -1.0
    for r in names:
        x = [c.get(r) for c in cells]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in x):
            continue  # a reading some cell lacks is reported missing, never tested
        best = max(best, min(held_out(x, helps, sizes)["accuracy"], held_out(x, helps, seeds)["accuracy"]))
    return best


def analyze(cells: list[dict[str, Any]], permutations: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """The analysis docs/plans/grid_plan.md registered, from the cells alone (reproducible from the JSON).

    Per reading: AUC, the study's midpoint fit in-sample, held-out accuracy leave-one-size-out and
    leave-one-seed-out, the study's fixed 0.43 where it applies; for the window family a permutation
    p-value of the best held-out accuracy over all window readings (outcomes shuffled across cells),
    and the plan's decision: does a window reading predict?
    """
    from satmon.functional.threshold_fit import accuracy, auc, fit_threshold

    excluded = [{"name": c.get("name"), "why": no_outcome_why(c)} for c in cells if outcome(c) is None]
    diverged = diverged_counts(cells)
    cells = [c for c in cells if outcome(c) is not None]  # a diverged arm is an outcome; both diverged is none
    extra: dict[str, Any] = {"diverged": diverged} if diverged else {}
    if excluded:
        extra["excluded"] = excluded
    if not cells:
        return {
            "n": 0,
            **extra,
            "readings": {},
            "decision": {"predicts": None, "why": "no cell with an outcome (both arms diverged in every cell)"},
        }
    helps = [bool(outcome(c)) for c in cells]
    sizes, seeds = [c["group"] for c in cells], [c["seed"] for c in cells]
    n, k = len(cells), sum(helps)
    baselines = {"always_no_go": (n - k) / n, "always_go": k / n}
    bar = max(baselines.values())
    out: dict[str, Any] = {
        "n": n,
        "helps": k,
        "groups": sorted(set(sizes)),
        "seeds": sorted(set(seeds)),
        "baselines": baselines,
        # a recipe that cannot say its unigram level records None: counted as not known, never as learnt
        "learns": {
            "dyt": sum(c.get("learns_dyt") is True for c in cells),
            "layernorm": sum(c.get("learns_layernorm") is True for c in cells),
            "both": sum(c.get("learns_dyt") is True and c.get("learns_layernorm") is True for c in cells),
            "known": sum(c.get("unigram_loss") is not None for c in cells),
        },
        **extra,
        "readings": {},
    }
    two_protocols = len(set(sizes)) >= 2 and len(set(seeds)) >= 2
    for r in READINGS:
        x = [c.get(r) for c in cells]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in x):
            out["readings"][r] = {"missing": True}
            continue
        fit = fit_threshold(x, helps, "midpoint")
        row: dict[str, Any] = {
            "family": "window" if r in WINDOW_READINGS else "final" if r in FINAL_READINGS else "prior",
            "min": min(x),
            "max": max(x),
            "auc": auc(x, helps),
            "in_sample": {"threshold": fit.threshold, "accuracy": fit.accuracy, "outside": fit.threshold_outside},
        }
        if two_protocols:
            row["loso"], row["loseedo"] = held_out(x, helps, sizes), held_out(x, helps, seeds)
            row["held_out_min"] = min(row["loso"]["accuracy"], row["loseedo"]["accuracy"])
        if r in ("window_saturation", "final_saturation"):
            row["study_043"] = accuracy(x, helps, STUDY_THRESHOLD)
        out["readings"][r] = row
    if not two_protocols:
        out["decision"] = {"predicts": None, "why": "fewer than 2 sizes or 2 seeds: no held-out protocol"}
        return out
    observed = family_statistic(cells, helps, WINDOW_READINGS)
    rng = random.Random(seed)
    shuffled, exceed = list(helps), 0
    for _ in range(permutations):
        rng.shuffle(shuffled)
        exceed += family_statistic(cells, shuffled, WINDOW_READINGS) >= observed
    p = (1 + exceed) / (1 + permutations)
    qualifying = [
        r
        for r in WINDOW_READINGS
        if not out["readings"][r].get("missing")
        and out["readings"][r]["loso"]["accuracy"] > bar
        and out["readings"][r]["loseedo"]["accuracy"] > bar
        and out["readings"][r]["auc"] >= AUC_BAR
    ]
    predicts = p < P_BAR and bool(qualifying)
    best = (
        max(qualifying, key=lambda r: (out["readings"][r]["held_out_min"], -WINDOW_READINGS.index(r)))
        if qualifying
        else None
    )
    prior = out["readings"][PRIOR_READINGS[0]]
    out["decision"] = {
        "statistic": observed,
        "permutations": permutations,
        "candidates": len(WINDOW_READINGS),
        "p_value": p,
        "baseline_bar": bar,
        "qualifying": qualifying,
        "predicts": predicts,
        "reading": best if predicts else None,
        "adds_to_prior": (predicts and out["readings"][best]["held_out_min"] > prior["held_out_min"])
        if best
        else False,
    }
    return out


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _num(v: Any, spec: str = ".3f", scale: float = 1.0, sign: str = "") -> str:
    """A record's number as text, ``-`` where it is null (a reading not computable, an arm that diverged)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return "-"
    return f"{v * scale:{sign}{spec}}"


def report_markdown(analysis: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    """The analysis as markdown tables (what docs/science/grids.md quotes); a null field reads ``-``, a
    diverged arm is named in its cell's row."""
    a, n = analysis, analysis.get("n", 0)
    if n:
        head = (
            f"{n} cells ({', '.join(a['groups'])}; seeds {', '.join(map(str, a['seeds']))}); DyT below the unigram "
            f"level in {a['learns']['dyt']}/{n}, LayerNorm in {a['learns']['layernorm']}/{n}; DyT helped in "
            f"{a['helps']}, hurt in {n - a['helps']}; always NO-GO {pct(a['baselines']['always_no_go'])}, "
            f"always GO "
            f"{pct(a['baselines']['always_go'])}."
        )
    else:
        head = "no cell with an outcome."
    if a.get("diverged"):
        head += " Diverged (a loss not finite): " + ", ".join(f"{arm} in {k}" for arm, k in a["diverged"].items()) + "."
    if a.get("excluded"):
        head += " Without an outcome: " + "; ".join(f"{e['name']} ({e['why']})" for e in a["excluded"]) + "."
    lines = [
        head,
        "",
        (
            "| cell | epochs | tokens/param | unigram | val LN | val DyT | DyT vs LN | window "
            "sat. | window first block | "
            "window centered | final sat. | final first block |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        mark = lambda ok: " (above unigram)" if ok is False else ""
        div = c.get("diverged") or {}
        effect = _num(c.get("delta"), ".1f", 100, "+") + ("%" if isinstance(c.get("delta"), (int, float)) else "")
        if div:
            effect += " (" + ", ".join(f"{arm} diverged at step {k}" for arm, k in div.items()) + ")"
        lines.append(
            f"| {c['name']} | {_num(c.get('epochs'), '.1f')} | {_num(c.get('tokens_per_param'), '.2f')} | "
            f"{_num(c.get('unigram_loss'))} | "
            f"{_num(c.get('val_loss_layernorm'))}{mark(c.get('learns_layernorm'))} | "
            f"{_num(c.get('val_loss_dyt'))}{mark(c.get('learns_dyt'))} | {effect} | "
            f"{_num(c.get('window_saturation'))} | {_num(c.get('window_first_block'))} | "
            f"{_num(c.get('window_centered'))} | {_num(c.get('final_saturation'))} | "
            f"{_num(c.get('final_first_block'))} |"
        )
    lines += [
        "",
        (
            "| reading | family | range | AUC | in-sample (midpoint t) | leave-one-size-out | leave-one-seed-out | "
            "0.43's accuracy |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, s in a["readings"].items():
        if s.get("missing"):
            lines.append(f"| {r} | | missing | | | | | |")
            continue
        ho = lambda key, s=s: f"{s[key]['correct']}/{s[key]['n']} = {pct(s[key]['accuracy'])}" if key in s else "-"
        study = pct(s["study_043"]) if "study_043" in s else ""
        lines.append(
            f"| {r} | {s['family']} | {s['min']:.3f}-{s['max']:.3f} | {_num(s['auc'], '.2f')} | "
            f"{pct(s['in_sample']['accuracy'])} ({_num(s['in_sample']['threshold'], '.4f')}) | {ho('loso')} | "
            f"{ho('loseedo')} | {study} |"
        )
    d = a.get("decision", {})
    if d.get("predicts") is not None:
        lines += [
            "",
            (
                f"Family-wise test (the plan): best over the {d['candidates']} window readings of the worse held-out "
                f"accuracy = {pct(d['statistic'])}; permutation p = {d['p_value']:.4f} ({d['permutations']:,} "
                f"shuffles of the outcomes); bar to beat in both protocols: {pct(d['baseline_bar'])} (the better "
                f"trivial rule); readings over the bar with AUC >= {AUC_BAR}: {', '.join(d['qualifying']) or 'none'}. "
                + (
                    f"**The window predicts** ({d['reading']})"
                    if d["predicts"]
                    else "**No window reading predicts by the plan's standard**"
                )
                + "."
            ),
        ]
    return "\n".join(lines)


def plot(
    analysis: dict[str, Any],
    cells: list[dict[str, Any]],
    path: Path,
    title: str = "faithful grid (the study's protocol at CPU scale): does the 500-step window predict DyT's effect?",
) -> None:
    """Four panels: the window's pooled saturation over its 50-step segments per cell; DyT's effect
    against the window's pooled and first-block readings; against unique tokens per parameter."""
    from matplotlib.figure import Figure

    cells = [c for c in cells if _num(c.get("delta")) != "-"]  # a diverged cell has no point on these axes
    fig = Figure(figsize=(11, 8.5), dpi=110, layout="constrained")
    axes = list(fig.subplots(2, 2).flat)
    groups = sorted({c["group"] for c in cells}, key=lambda g: next(c["params"] for c in cells if c["group"] == g))
    markers = dict(zip(groups, "osD^vP"))
    color = lambda c: "tab:green" if c["delta"] < 0 else "tab:red"
    ax = axes[0]
    for c in cells:
        s = c["window_series"]
        ax.plot(
            [e["step"] for e in s],
            [e["saturation"] for e in s],
            color=color(c),
            lw=0.8,
            marker=markers[c["group"]],
            ms=3,
            alpha=0.8,
        )
    ax.axhline(STUDY_THRESHOLD, color="gray", lw=0.8, ls="--")
    ax.set(
        xlabel="step (window)",
        ylabel="pooled saturation of each 50-step segment",
        title="the window's series (green: DyT helped at the end; red: hurt)",
    )
    for ax, (r, label) in zip(
        axes[1:3],
        (("window_saturation", "window pooled saturation"), ("window_first_block", "window first-block saturation")),
    ):
        for c in cells:
            ax.scatter(
                c[r], 100 * c["delta"], marker=markers[c["group"]], color=color(c), s=40, edgecolor="black", lw=0.5
            )
        s = analysis["readings"][r]
        ax.axhline(0, color="gray", lw=0.8)
        if r == "window_saturation":
            ax.axvline(STUDY_THRESHOLD, color="gray", lw=0.8, ls="--", label="study 0.43")
        held = (
            f"; held out {pct(s['loso']['accuracy'])} by size, {pct(s['loseedo']['accuracy'])} by seed"
            if "loso" in s
            else ""
        )
        ax.set(xlabel=label, ylabel="DyT vs LayerNorm, final held-out loss (%)", title=f"AUC {s['auc']:.2f}{held}")
    ax = axes[3]
    for c in cells:
        ax.scatter(
            c["tokens_per_param"],
            100 * c["delta"],
            marker=markers[c["group"]],
            color=color(c),
            s=40,
            edgecolor="black",
            lw=0.5,
        )
    for g in groups:
        ax.scatter([], [], marker=markers[g], color="white", edgecolor="black", label=g)
    ax.set_xscale("log")
    ax.axhline(0, color="gray", lw=0.8)
    ax.legend(fontsize=7)
    ax.set(
        xlabel="unique training tokens per parameter (known before training)",
        ylabel="DyT vs LayerNorm, final held-out loss (%)",
        title="the budget alone",
    )
    fig.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


# ------------------------------------------------------------------------------------------- the answer
def effect_table(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """DyT's effect per configuration (size, budget and the ``--vary`` values), averaged over its seeds only: final
    and best checkpoint, and how many seeds agree.

    Example:
        >>> cells = [{"group": "s", "budget": "16ep", "epochs": 16.0, "params": 10, "seed": i, "delta": d,
        ...           "delta_best": d + 0.01} for i, d in enumerate((-0.02, 0.01))]
        >>> row = effect_table(cells)[0]
        >>> row["size"], row["seeds"], row["helps"], round(row["delta"], 3)
        ('s', 2, 1, -0.005)
        >>> varied = [dict(cells[0], vary={"lr": 0.01}), dict(cells[1], vary={"lr": 0.03})]
        >>> [(r["size"], r["seeds"]) for r in effect_table(varied)]
        [('s lr=0.01', 1), ('s lr=0.03', 1)]
    """
    groups: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[dict[str, Any]]] = {}
    for c in cells:  # a --vary configuration is its own row: only seeds are averaged
        varied = tuple(sorted((str(k), str(v)) for k, v in (c.get("vary") or {}).items()))
        groups.setdefault((c["group"], c["budget"], varied), []).append(c)
    rows = []
    for (size, budget, varied), cs in groups.items():
        best = [c["delta_best"] for c in cs if _num(c.get("delta_best")) != "-"]
        finite = [c["delta"] for c in cs if _num(c.get("delta")) != "-"]
        label = size + ("" if not varied else " " + ",".join(f"{k}={v}" for k, v in varied))
        rows.append(
            {
                "size": label,
                "budget": budget,
                "passes": cs[0]["epochs"],
                "params": cs[0]["params"],
                "seeds": len(cs),
                "delta": sum(finite) / len(finite) if finite else None,
                "helps": sum(outcome(c) is True for c in cs),
                "judged": sum(outcome(c) is not None for c in cs),
                "measured": len(finite),
                "diverged": diverged_counts(cs),
                "delta_best": sum(best) / len(best) if best else None,
                "helps_best": sum(d < 0 for d in best),
                "measured_best": len(best),
            }
        )
    return sorted(rows, key=lambda r: (r["params"], r["passes"]))


def forecast_check(cells: Sequence[dict[str, Any]], planned_tokens: int) -> dict[str, Any]:
    """What ``satmon.forecast(params=, unique_tokens=, planned_tokens=)`` says of each cell beside what it measured.

    A confident ``"hurts"`` or ``"helps"`` is right when the final held-out loss moved that way; ``"uncertain"``
    is counted apart (neither right nor wrong).

    Example:
        >>> forecast_check([], 1000)["cells"]
        []
    """
    import satmon

    fn = satmon.forecast
    rows, right, wrong, unsure = [], 0, 0, 0
    for c in cells:
        try:
            f = fn(params=int(c["params"]), unique_tokens=int(c["train_tokens"]), planned_tokens=int(planned_tokens))
        except Exception as e:  # a forecast that cannot place the cell says so; the grid's answer stands
            rows.append({"name": c["name"], "outcome": None, "why": f"{type(e).__name__}: {e}"})
            continue
        said = getattr(f, "outcome", None)
        helped = outcome(c)
        if helped is None:  # both arms diverged: nothing measured to score the forecast against
            rows.append({"name": c["name"], "outcome": said, "measured": None, "right": None, "why": no_outcome_why(c)})
            continue
        measured = "helps" if helped else "hurts"
        verdict = None if said not in ("helps", "hurts") else said == measured
        right, wrong, unsure = right + (verdict is True), wrong + (verdict is False), unsure + (verdict is None)
        rows.append(
            {
                "name": c["name"],
                "outcome": said,
                "measured": measured,
                "right": verdict,
                "evidence": str(getattr(f, "evidence", ""))[:300],
            }
        )
    return {"available": True, "right": right, "wrong": wrong, "uncertain": unsure, "cells": rows}


def cell_line(cell: dict[str, Any]) -> str:
    """A finished cell in one line: both final losses, DyT's effect (final and best), the window's reading, its CPU
    time; an arm that diverged is said so.

    Example:
        >>> cell_line({"name": "c", "val_loss_layernorm": None, "val_loss_dyt": 5.1, "delta": None, "delta_best": None,
        ...            "window_saturation": 0.4, "cpu_seconds": 3.0, "diverged": {"layernorm": 5}})
        'c: LN - DyT 5.100 (- final, - best) window 0.400 [3 s CPU]; layernorm diverged at step 5'
    """
    pct_of = lambda v: _num(v, ".1f", 100, "+") + ("%" if _num(v) != "-" else "")
    line = (
        f"{cell['name']}: LN {_num(cell.get('val_loss_layernorm'))} DyT {_num(cell.get('val_loss_dyt'))} "
        f"({pct_of(cell.get('delta'))} final, {pct_of(cell.get('delta_best'))} best) window "
        f"{_num(cell.get('window_saturation'))} [{_num(cell.get('cpu_seconds'), '.0f')} s CPU]"
    )
    div = cell.get("diverged") or {}
    return line + ("; " + ", ".join(f"{a} diverged at step {n}" for a, n in div.items()) if div else "")


def phase_rows(cells: Sequence[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """The cells as rows of a phase-diagram file (``satmon/io/phase_diagram.py``'s columns), seeds apart."""
    return [
        {
            "name": c["name"],
            "params": c["params"],
            "train_tokens": c["train_tokens"],
            "delta": c["delta"],
            "group": c["group"],
            "source": source,
        }
        for c in cells
    ]


def answer_text(
    recipe: str,
    cells: Sequence[dict[str, Any]],
    analysis: dict[str, Any],
    forecast: dict[str, Any],
    not_done: Sequence[Any] = (),
) -> str:
    """What ``satmon grid`` prints at the end: DyT's effect per size and budget (final and best checkpoint), the
    plan's held-out test of the window readings, the forecast's record on these cells, and the cells missing."""
    lines = [
        f"DyT vs LayerNorm on {recipe}: {len(cells)} cells" + (f" ({len(not_done)} not complete)" if not_done else "")
    ]
    if not cells:
        lines.append("no complete cell: nothing measured yet")
    else:
        lines.append("size | budget | passes | seeds | final (DyT helped in) | best checkpoint (DyT helped in)")
        for r in effect_table(cells):
            best = (
                "-"
                if r["delta_best"] is None
                else f"{100 * r['delta_best']:+.2f}% ({r['helps_best']}/{r['measured_best']})"
            )
            final = ("-" if r["delta"] is None else f"{100 * r['delta']:+.2f}%") + f" ({r['helps']}/{r['judged']})"
            if r["diverged"]:  # an outcome, counted: the arm's loss stopped being a number
                final += "; " + ", ".join(f"{arm} diverged in {k}/{r['seeds']}" for arm, k in r["diverged"].items())
            lines.append(f"{r['size']} | {r['budget']} | {r['passes']:.3g} | {r['seeds']} | {final} | {best}")
        div = [c for c in cells if c.get("diverged")]
        if div:
            lines.append(
                f"diverged in {len(div)} of {len(cells)} cells (a loss not finite; the arm that kept a finite "
                "loss counts as the better one): "
                + "; ".join(
                    f"{c['name']}: " + ", ".join(f"{a} at step {n}" for a, n in c["diverged"].items()) for c in div[:8]
                )
                + (f"; {len(div) - 8} more in grid.json" if len(div) > 8 else "")
            )
        d = analysis.get("decision", {})
        if d.get("predicts") is None:
            lines.append(
                f"window readings held out: not tested ({d.get('why', 'no analysis')}); the plan's test needs "
                "2 sizes and 2 seeds"
            )
        else:
            lines.append(
                f"window readings held out (docs/plans/grid_plan.md): best worse-of-two held-out accuracy "
                f"{pct(d['statistic'])}, permutation p = {d['p_value']:.4f}, bar {pct(d['baseline_bar'])}: "
                + (
                    f"{d['reading']} predicted DyT's effect"
                    if d["predicts"]
                    else "no window reading predicted DyT's effect by the plan's standard"
                )
            )
    if not forecast.get("available"):
        lines.append(f"satmon.forecast: not compared ({forecast.get('why', 'unavailable')})")
    elif cells:
        wrong = [r["name"] for r in forecast["cells"] if r.get("right") is False]
        lines.append(
            f"satmon.forecast on these cells: right {forecast['right']}, wrong {forecast['wrong']}, uncertain "
            f"{forecast['uncertain']}" + (f"; wrong on {', '.join(wrong[:8])}" if wrong else "")
        )
    for s in list(not_done)[:12]:
        lines.append(
            f"not complete: {s.name}: {s.state}"
            + (f", {s.why}" if s.why else "")
            + (f" (log {s.log})" if s.log and s.log not in (s.why or "") else "")
        )
    return "\n".join(lines)
