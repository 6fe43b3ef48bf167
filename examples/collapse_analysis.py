"""Scoring of the collapse grid (docs/plans/collapse_plan.md, Amendment 1), frozen before any scored cell exists.

Reads the cells of ``satmon grid llama`` (``OUT/grid.json`` or ``OUT/cells/*.json``) and scores every flag the code
computes against three outcomes of each DyT arm, defined from its held-out loss: **never learned**, **learned then
lost**, **healthy** (``outcome``). Seeds count once: a configuration (size, the ``--vary`` values, the arm) takes the
outcome its seeds agree on, else ``split``; it is flagged when more than half of its seeds are (``configurations``).
Per flag and outcome: hits, misses, false stops on healthy configurations, with exact (Clopper-Pearson) 95% intervals
(``clopper_pearson``), Fisher's exact one-sided p (``fisher_one_sided``), the lead time over the loss rule
(``loss_rule_step``: the step at which watching the training loss would have said the same), and the compute a stop at
the flag would have saved or wasted. The other signals are held out across sizes (``held_out``): a level chosen on
one size's configurations, scored on the other's, both ways.

    python examples/collapse_analysis.py OUT/collapse_a OUT/collapse_b --out report.json
    python examples/collapse_analysis.py --power          # the plan's power table
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

#: The plan's constants (Amendment 1): a configuration is "learned" below LEARNED x unigram, "never learned" when its
#: best stays at or above NEVER x unigram; "lost" when the loss at the run length gave back at least LOST_SHARE of
#: what it had learned (``final - best >= LOST_SHARE x (unigram - best)``) or went non-finite after learning.
LEARNED, NEVER, LOST_SHARE = 0.9, 0.95, 0.25
#: A learned arm that is not lost "fell behind" when its loss at the run length is above BEHIND x the reference arm's.
BEHIND = 1.1
#: The loss rule's level part reads the training loss from this step on (the plan's stated step).
LOSS_RULE_FROM = 300
NEVER_LEARNED, LOST, HEALTHY, MARGINAL, EXCLUDED = (
    "never learned",
    "learned then lost",
    "healthy",
    "marginal",
    "excluded",
)
BEHIND_LABEL = "fell behind"
FAILURES = (NEVER_LEARNED, LOST)


# ---------------------------------------------------------------------------------------------------------- outcomes
def _upto(curve: Sequence[Sequence[Any]], length: int | None) -> list[tuple[int, float | None]]:
    return [(int(s), v) for s, v in curve if length is None or s <= length]


def _bad(v: Any) -> bool:
    return v is None or not math.isfinite(float(v))


def outcome(
    curve: Sequence[Sequence[Any]],
    unigram: float,
    reference_best: float,
    length: int | None = None,
    reference_last: float | None = None,
) -> str:
    """The DyT arm's outcome from its held-out ``curve`` [(step, loss or None)] up to ``length`` (``None``: all).

    ``excluded``: the reference arm's best held-out loss is not below ``LEARNED x unigram`` (a recipe that cannot
    learn). ``never learned``: the arm's best finite loss is at or above ``NEVER x unigram`` (or no finite loss).
    ``learned then lost``: best below ``LEARNED x unigram``, then a non-finite loss, or a loss at the run length that
    gave back at least ``LOST_SHARE`` of what was learned (``last - best >= LOST_SHARE x (unigram - best)``).
    ``healthy``: best below ``LEARNED x unigram``, nothing lost, and (given ``reference_last``, the reference arm's loss
    at the run length) a last loss at most ``BEHIND x reference_last``; above it the arm **fell behind** (learned, not
    lost, stuck well above the reference: listed and scored in its own rows). ``marginal``: best between the two levels.

    Example:
        >>> outcome([(50, 3.0), (100, 2.0), (150, 2.6)], 3.0, 1.5)
        'learned then lost'
        >>> outcome([(50, 3.0), (100, 2.0), (150, 2.1)], 3.0, 1.5), outcome([(50, 2.9), (100, 2.95)], 3.0, 1.5)
        ('healthy', 'never learned')
    """
    if not reference_best < LEARNED * unigram:
        return EXCLUDED
    pts = _upto(curve, length)
    finite = [(s, float(v)) for s, v in pts if not _bad(v)]
    if not finite:
        return NEVER_LEARNED
    b_step, best = min(finite, key=lambda sv: (sv[1], sv[0]))
    if best >= NEVER * unigram:
        return NEVER_LEARNED
    if best >= LEARNED * unigram:
        return MARGINAL
    if any(_bad(v) for s, v in pts if s > b_step):
        return LOST
    last = float(pts[-1][1])
    if last - best >= LOST_SHARE * (unigram - best):
        return LOST
    return BEHIND_LABEL if reference_last is not None and last > BEHIND * reference_last else HEALTHY


def evident_step(curve: Sequence[Sequence[Any]], unigram: float, label: str, length: int | None = None) -> int | None:
    """The first held-out evaluation at which ``label`` is evident from the held-out loss: never learned, the first at
    or after ``LOSS_RULE_FROM`` still at or above ``NEVER x unigram``; lost, the first after the best so far (below
    ``LEARNED x unigram``) where the loss gave back ``LOST_SHARE`` of it or is non-finite. ``None`` otherwise."""
    return _rule(_upto(curve, length), unigram, label)


def _rule(pts: Sequence[tuple[int, Any]], unigram: float, label: str | None) -> int | None:
    best = math.inf
    for s, v in pts:
        if (
            label in (None, LOST)
            and best < LEARNED * unigram
            and (_bad(v) or float(v) - best >= LOST_SHARE * (unigram - best))
        ):
            return s
        if label in (None, NEVER_LEARNED) and s >= LOSS_RULE_FROM and (_bad(v) or float(v) >= NEVER * unigram):
            return s
        if not _bad(v):
            best = min(best, float(v))
    return None


def loss_rule_step(train_curve: Sequence[Sequence[Any]], unigram: float, length: int | None = None) -> int | None:
    """The loss rule (the baseline every flag is measured against: watching the training loss, as llm-foundry's
    ``loss_cap`` does): the first point of the training-loss curve (means of ``series_every`` steps) that is
    non-finite, at or above ``NEVER x unigram`` from step ``LOSS_RULE_FROM`` on, or, once the best so far is below
    ``LEARNED x unigram``, has given back ``LOST_SHARE`` of it. ``None``: it never fires.

    Example:
        >>> loss_rule_step([(100, 3.0), (200, 2.9), (300, 2.95)], 3.0), loss_rule_step([(100, 2.0), (200, 2.3)], 3.0)
        (300, 200)
    """
    return _rule(_upto(train_curve, length), unigram, None)


# ------------------------------------------------------------------------------------------------------ statistics
def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in float64."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def _bisect(f: Callable[[float], float], lo: float, hi: float) -> float:
    for _ in range(200):  # f increasing on [lo, hi], root within
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial rate ``k / n`` (``(0, 1)`` when ``n == 0``).

    The lower bound solves ``P(X >= k | p) = a/2``, the upper ``P(X <= k | p) = a/2`` (``a = 1 - level``), by bisection.

    Example:
        >>> [round(x, 4) for x in clopper_pearson(0, 5)], [round(x, 4) for x in clopper_pearson(4, 4)]
        ([0.0, 0.5218], [0.3976, 1.0])
    """
    if n == 0:
        return 0.0, 1.0
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else _bisect(lambda p: (1 - _binom_cdf(k - 1, n, p)) - a, 0.0, 1.0)
    hi = 1.0 if k == n else _bisect(lambda p: a - _binom_cdf(k, n, p), 0.0, 1.0)
    return lo, hi


def fisher_one_sided(hits: int, misses: int, false_stops: int, quiet: int) -> Fraction:
    """Fisher's exact one-sided p (as an exact fraction) that the flag is associated with the outcome: the
    hypergeometric probability of ``hits`` or more, given the margins of the 2 x 2 table
    ``[[hits, misses], [false_stops, quiet]]`` (rows: failed, healthy; columns: flagged, not).

    Example:
        >>> float(round(fisher_one_sided(8, 0, 2, 2), 3)), fisher_one_sided(4, 0, 0, 5)
        (0.091, Fraction(1, 126))
    """
    failed, flagged, n = hits + misses, hits + false_stops, hits + misses + false_stops + quiet
    total = math.comb(n, flagged)
    top = min(failed, flagged)
    return Fraction(sum(math.comb(failed, x) * math.comb(n - failed, flagged - x) for x in range(hits, top + 1)), total)


def minimal_designs(alpha: float = 0.05, most: int = 30) -> list[tuple[int, int]]:
    """Every (failed, healthy) count of configurations at which a flag separating them perfectly reaches Fisher's
    one-sided p < ``alpha`` (p = 1 / C(F + H, F), compared exactly) and neither count can be lowered.

    Example:
        >>> minimal_designs()
        [(1, 20), (2, 5), (3, 4), (4, 3), (5, 2), (20, 1)]
    """
    a = Fraction(str(alpha))  # exactly 1/20 for 0.05 (the float 0.05 is a hair above it)
    ok = {(f, h) for f in range(1, most + 1) for h in range(1, most + 1) if fisher_one_sided(f, 0, 0, h) < a}
    return sorted((f, h) for f, h in ok if (f - 1, h) not in ok and (f, h - 1) not in ok)


def expected_p(failed: int, healthy: int, hit_rate: float, false_rate: float) -> Fraction:
    """Fisher's one-sided p at the expected table: ``round(hit_rate x failed)`` hits, ``round(false_rate x healthy)``
    false stops (the power table's rows: a design at a realistic balance and imperfect rates).

    Example:
        >>> float(round(expected_p(8, 4, 1.0, 0.5), 3))
        0.091
    """
    h, f = round(hit_rate * failed), round(false_rate * healthy)
    return fisher_one_sided(h, failed - h, f, healthy - f)


def power(failed: int, healthy: int, hit_rate: float, false_rate: float, alpha: float = 0.05) -> float:
    """The probability that Fisher's one-sided p < ``alpha`` when each failed configuration is flagged with
    ``hit_rate`` and each healthy one with ``false_rate``, independently (exact sum over the binomial tables).

    Example:
        >>> power(5, 5, 1.0, 0.0), round(power(2, 2, 1.0, 0.0), 3)
        (1.0, 0.0)
    """
    total, a = 0.0, Fraction(str(alpha))
    for h in range(failed + 1):
        ph = math.comb(failed, h) * hit_rate**h * (1 - hit_rate) ** (failed - h)
        for f in range(healthy + 1):
            pf = math.comb(healthy, f) * false_rate**f * (1 - false_rate) ** (healthy - f)
            if ph * pf and fisher_one_sided(h, failed - h, f, healthy - f) < a:
                total += ph * pf
    return total


# ----------------------------------------------------------------------------------------------------------- flags
def _first(checks: Iterable[Mapping[str, Any]], key: str, level: float, below: bool = False) -> int | None:
    for c in checks:
        v = c.get(key)
        if v is not None and math.isfinite(float(v)) and (float(v) <= level if below else float(v) >= level):
            return int(c["step"])
    return None


def flags(arm: Mapping[str, Any], window: int) -> dict[str, int | None]:
    """The step at which each flag the code computes fired on this DyT arm (``None``: never):

    - ``window``: the window's verdict said collapse risk (``Rule.decide``: the model feeds a gated MLP and the
      pooled saturation of every DyT layer the screen counts, over the window's steps, >= ``collapse_threshold``):
      the window's end;
    - ``watch``: the collapse watch's first flag (the gated DyT layers' saturation on a check step >=
      ``collapse_threshold``, ``patience`` checks in a row), after the window;
    - ``watch500``: the collapse watch as shipped, starting after a 500-step window (:func:`watch_after`);
    - ``shipped``: ``abort_on="collapse"``'s stop (``would_stop_at``: the window's end on a collapse-risk verdict,
      else the watch's first flag);
    - ``trap``: the trap watch named the run trapped (its first ``trapped`` check).
    """
    w = arm.get("watch") or {}
    trap = w.get("trap") or {}
    return {
        "window": window if w.get("window_collapse_risk") else None,
        "watch": w.get("first_flag_step"),
        "watch500": watch_after(w, SHIPPED_WINDOW),
        "shipped": w.get("would_stop_at"),
        "trap": trap.get("first_trapped_step"),
    }


#: The shipped window: the watch as shipped starts after it.
SHIPPED_WINDOW = 500


def watch_after(watch: Mapping[str, Any], start: int) -> int | None:
    """The collapse watch as if it had started after step ``start``: its recorded checks after ``start``, the gated
    saturation >= its ``collapse_threshold`` for ``patience`` checks in a row (the streak counted from ``start``).

    Example:
        >>> w = {"collapse_threshold": 0.5, "patience": 2, "checks": [{"step": s, "gated_saturation": v} for s, v in
        ...      [(450, 0.9), (501, 0.9), (551, 0.4), (601, 0.6), (651, 0.7)]]}
        >>> watch_after(w, 500), watch_after({**w, "patience": 1}, 500)
        (651, 501)
    """
    level, patience, streak = watch.get("collapse_threshold", 0.5), watch.get("patience", 1), 0
    for c in watch.get("checks", []):
        if c["step"] <= start:
            continue
        v = c.get("gated_saturation")
        streak = streak + 1 if v is not None and v >= level else 0
        if streak >= patience:
            return int(c["step"])
    return None


#: The other signals scored held out across sizes: name -> (reader of the arm's checks, key, direction).
SIGNALS: dict[str, tuple[str, str, bool]] = {
    "gated_saturation": ("watch", "gated_saturation", False),
    "flat_fraction": ("watch", "flat_fraction", False),
    "mean_abs_hidden": ("watch", "mean_abs_hidden", True),
    "loss_z": ("watch", "loss_z", False),
}
LEVELS: dict[str, list[float]] = {
    "gated_saturation": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
    "flat_fraction": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
    "mean_abs_hidden": [0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
    "loss_z": [2.0, 4.0, 8.0, 16.0],
}


def signal_step(arm: Mapping[str, Any], name: str, level: float, length: int | None = None) -> int | None:
    """The first watch check (at or before ``length``) at which signal ``name`` crosses ``level``."""
    _, key, below = SIGNALS[name]
    checks = [c for c in (arm.get("watch") or {}).get("checks", []) if length is None or c["step"] <= length]
    return _first(checks, key, level, below)


# ------------------------------------------------------------------------------------------------ arms and configs
def arms_of(cells: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every DyT arm of every cell, with what scoring needs: its configuration (size, the ``--vary`` values, the arm),
    seed, curves, the reference's best, the unigram level, the window and the run length."""
    out = []
    for c in cells:
        ref = c["arms"][c["reference_arm"]]
        for name, arm in c["arms"].items():
            if not name.startswith("dyt"):
                continue
            vary = tuple(sorted((k, str(v)) for k, v in (c.get("vary") or {}).items()))
            out.append(
                {
                    "config": (c["group"], vary, name),
                    "size": c["group"],
                    "arm": name,
                    "seed": c["seed"],
                    "val_curve": arm["val_curve"],
                    "train_curve": arm["train_curve"],
                    "record": arm,
                    "unigram": c["unigram_loss"],
                    "reference_curve": ref["val_curve"],
                    "window": c["window"],
                    "steps": c["steps"],
                }
            )
    return out


def label_arm(a: Mapping[str, Any], length: int | None = None) -> dict[str, Any]:
    """One arm's outcome, its evident step, the loss rule's step and each flag's step, at run length ``length``."""
    n = length or a["steps"]
    ref = [float(v) for _, v in _upto(a["reference_curve"], n) if not _bad(v)]
    lab = outcome(a["val_curve"], a["unigram"], min(ref) if ref else math.inf, n, ref[-1] if ref else None)
    fl = {k: (v if v is not None and v <= n else None) for k, v in flags(a["record"], a["window"]).items()}
    return {
        "outcome": lab,
        "evident": evident_step(a["val_curve"], a["unigram"], lab, n) if lab in FAILURES else None,
        "loss_rule": loss_rule_step(a["train_curve"], a["unigram"], n),
        "flags": fl,
        "length": n,
    }


def configurations(
    arms: Sequence[Mapping[str, Any]],
    length: int | None = None,
    flag_of: Callable[[Mapping[str, Any], Mapping[str, Any]], int | None] | None = None,
    flag: str = "shipped",
) -> list[dict[str, Any]]:
    """Per configuration (seeds count once): the outcome its seeds agree on (else ``split``), flagged when more than
    half of its seeds are (``flag_of(arm, label)`` or the named flag), the mean flag step over its flagged seeds, the
    mean loss-rule step, the mean lead time (loss rule minus flag, over seeds where both fired) and the share of the
    run a stop at the flag would have saved (failed) or spent (healthy), averaged over its seeds."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for a in arms:
        groups.setdefault(a["config"], []).append(a)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        labs = [label_arm(a, length) for a in members]
        outcomes = {lab["outcome"] for lab in labs}
        steps = [(flag_of(a, lab) if flag_of else lab["flags"][flag]) for a, lab in zip(members, labs)]
        fired = [s for s in steps if s is not None]
        leads = [lab["loss_rule"] - s for lab, s in zip(labs, steps) if s is not None and lab["loss_rule"] is not None]
        n = labs[0]["length"]
        share = [((n - s) / n if s is not None else 0.0) for s in steps]
        out.append(
            {
                "config": key,
                "size": members[0]["size"],
                "arm": members[0]["arm"],
                "seeds": len(members),
                "outcome": outcomes.pop() if len(outcomes) == 1 else "split",
                "seed_outcomes": [lab["outcome"] for lab in labs],
                "flagged": 2 * len(fired) > len(members),
                "flag_step": sum(fired) / len(fired) if fired else None,
                "loss_rule": _mean([lab["loss_rule"] for lab in labs]),
                "lead": _mean(leads),
                "unrun_share": sum(share) / len(share),
            }
        )
    return out


def _mean(xs: Sequence[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def score(configs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per failed outcome (and pooled: a configuration counts in a pooled row when every seed's outcome is in it, so
    one seed lost and one fallen behind is "failed or behind") against the healthy configurations: hits, misses, false
    stops, the rates with Clopper-Pearson 95% intervals, Fisher's one-sided p, the mean lead over the loss rule, the
    share of the runs a stop at the flag saves (failed) and wastes (healthy, the run itself lost too)."""
    healthy = [c for c in configs if c["outcome"] == HEALTHY]
    fs = sum(c["flagged"] for c in healthy)
    out: dict[str, Any] = {}
    for name, kinds in (
        (NEVER_LEARNED, (NEVER_LEARNED,)),
        (LOST, (LOST,)),
        ("failed", FAILURES),
        (BEHIND_LABEL, (BEHIND_LABEL,)),
        ("failed or behind", (*FAILURES, BEHIND_LABEL)),
    ):
        failed = [c for c in configs if all(o in kinds for o in c["seed_outcomes"])]  # pooled rows: seeds may differ
        hits = sum(c["flagged"] for c in failed)
        out[name] = {
            "configurations": len(failed),
            "healthy": len(healthy),
            "hits": hits,
            "misses": len(failed) - hits,
            "false_stops": fs,
            "hit_rate": hits / len(failed) if failed else None,
            "hit_ci": clopper_pearson(hits, len(failed)),
            "false_stop_rate": fs / len(healthy) if healthy else None,
            "false_stop_ci": clopper_pearson(fs, len(healthy)),
            "fisher_p": float(fisher_one_sided(hits, len(failed) - hits, fs, len(healthy) - fs))
            if failed and healthy
            else None,
            "lead": _mean([c["lead"] for c in failed if c["flagged"]]),
            "saved": sum(c["unrun_share"] for c in failed),
            "wasted": sum(1 - c["unrun_share"] for c in healthy if c["flagged"]),
        }
    out["listed"] = {
        k: [str(c["config"]) for c in configs if c["outcome"] == k] for k in ("split", MARGINAL, EXCLUDED, BEHIND_LABEL)
    }
    return out


def held_out(
    arms: Sequence[Mapping[str, Any]], name: str, kinds: Sequence[str] = FAILURES, length: int | None = None
) -> list[dict[str, Any]]:
    """Signal ``name`` held out across sizes: on each size, the level (of ``LEVELS[name]``) that maximises hit rate
    minus false-stop rate over that size's configurations (ties: the first level, i.e. the most sensitive), scored on
    every other size's configurations. One row per (chosen on, scored on)."""
    sizes = sorted({a["size"] for a in arms})
    rows = []
    for fit in sizes:
        best, best_j = None, -math.inf
        for level in LEVELS[name]:
            cf = configurations(
                [a for a in arms if a["size"] == fit],
                length,
                flag_of=lambda a, lab, lv=level: _cap(signal_step(a["record"], name, lv), lab["length"]),
            )
            s = _youden(cf, kinds)
            if s is not None and s > best_j:
                best, best_j = level, s
        for other in sizes:
            if other == fit or best is None:
                continue
            cf = configurations(
                [a for a in arms if a["size"] == other],
                length,
                flag_of=lambda a, lab, lv=best: _cap(signal_step(a["record"], name, lv), lab["length"]),
            )
            rows.append(
                {
                    "signal": name,
                    "chosen_on": fit,
                    "level": best,
                    "scored_on": other,
                    "score": score(cf)["failed" if tuple(kinds) == FAILURES else kinds[0]],
                }
            )
    return rows


def _cap(step: int | None, n: int) -> int | None:
    return step if step is not None and step <= n else None


def _youden(configs: Sequence[Mapping[str, Any]], kinds: Sequence[str]) -> float | None:
    failed = [c for c in configs if all(o in kinds for o in c["seed_outcomes"])]
    healthy = [c for c in configs if c["outcome"] == HEALTHY]
    if not failed or not healthy:
        return None
    return sum(c["flagged"] for c in failed) / len(failed) - sum(c["flagged"] for c in healthy) / len(healthy)


# --------------------------------------------------------------------------------------------------------- reading
def load_cells(path: str | Path) -> list[dict[str, Any]]:
    """The complete cells of a grid: ``OUT/grid.json``'s ``cells``, or every ``OUT/cells/*.json`` of a folder."""
    p = Path(path)
    if p.is_dir():
        files = sorted(
            f for f in (p / "cells").glob("*.json") if not f.name.endswith((".attempt.json", ".failed.json"))
        )
        return [json.loads(f.read_text()) for f in files]
    data = json.loads(p.read_text())
    if "cells" not in data:
        raise SystemExit(
            f"Expected a satmon grid's grid.json (with 'cells') or its folder, got {path} without 'cells'."
        )
    return list(data["cells"])


def report(cells: Sequence[Mapping[str, Any]], lengths: Sequence[int | None] = (None,)) -> dict[str, Any]:
    """The plan's whole scoring: per run length, per flag, per arm kind (gated ``dyt``, control ``dyt-gelu``)."""
    arms = arms_of(cells)
    out: dict[str, Any] = {
        "constants": {
            "learned": LEARNED,
            "never": NEVER,
            "lost_share": LOST_SHARE,
            "behind": BEHIND,
            "loss_rule_from": LOSS_RULE_FROM,
        },
        "lengths": {},
    }
    for n in lengths:
        by_len: dict[str, Any] = {}
        for kind in sorted({a["arm"] for a in arms}):
            sub = [a for a in arms if a["arm"] == kind]
            rows = {
                f: score(configurations(sub, n, flag=f)) for f in ("window", "watch", "watch500", "shipped", "trap")
            }
            rows["never flag"] = score(configurations(sub, n, flag_of=lambda a, lab: None))
            rows["loss rule"] = score(configurations(sub, n, flag_of=lambda a, lab: lab["loss_rule"]))
            by_len[kind] = {
                "configurations": [{**c, "config": str(c["config"])} for c in configurations(sub, n)],
                "flags": rows,
                "held_out": [r for s in SIGNALS for r in held_out(sub, s, length=n)],
            }
        out["lengths"][str(n or "full")] = by_len
    return out


def pilot_rows(pilot: Mapping[str, Any], lengths: Sequence[int] = (300, 600)) -> list[dict[str, Any]]:
    """The second pilot's arms (``data/collapse_pilot2.json``, not scored) read by this scoring: per DyT arm its
    reference's and its own best and last held-out loss, the outcome at each of ``lengths``, the loss rule's step, the
    window's verdict, the watch's first flag, the trap's first named step and the last gated saturation read."""
    u = pilot["unigram_loss"]
    rows = []
    for a in pilot["arms"].values():
        if a["arm"] == "rmsnorm":
            continue
        ref = pilot["arms"][f"{a['size']}|lr{a['lr']:g}|rmsnorm|final_-|alpha_-"]
        labels = {}
        for n in lengths:
            rc = [float(v) for _, v in _upto(ref["val_curve"], n) if not _bad(v)]
            labels[n] = outcome(a["val_curve"], u, min(rc), n, rc[-1])
        own = [float(v) for _, v in a["val_curve"] if not _bad(v)]
        w = a.get("watch") or {}
        gated = [c["gated_saturation"] for c in w.get("checks", []) if c.get("gated_saturation") is not None]
        rows.append(
            {
                "size": a["size"],
                "lr": a["lr"],
                "arm": a["arm"],
                "final_norm": a["final_norm"],
                "alpha_init": a["alpha_init"],
                "reference_best": min(float(v) for _, v in ref["val_curve"] if not _bad(v)),
                "best": min(own) if own else None,
                "last": own[-1] if own else None,
                "best_x_unigram": min(own) / u if own else None,
                "outcomes": labels,
                "loss_rule": loss_rule_step(a["train_curve"], u),
                "window_collapse_risk": w.get("window_collapse_risk"),
                "watch": w.get("first_flag_step"),
                "trap": (w.get("trap") or {}).get("first_trapped_step"),
                "gated_last": gated[-1] if gated else None,
            }
        )
    return rows


def pilot_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The pilot's rows as the plan's table (docs/plans/collapse_plan.md, Amendment 1; a test holds the two equal)."""

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = [
        (
            "| size | final norm | alpha_init | peak lr | arm | reference best | best | last | "
            "best / U | at 300 | at 600 "
            "| risk | flag | trapped | loss rule |"
        ),
        "|" + "---|" * 15,
    ]
    for r in sorted(rows, key=lambda r: (r["final_norm"] != "rmsnorm", r["arm"], r["size"], r["alpha_init"], r["lr"])):
        o = r["outcomes"]
        lines.append(
            "| "
            + " | ".join(
                [
                    r["size"],
                    r["final_norm"],
                    r["alpha_init"],
                    f"{r['lr']:g}",
                    r["arm"],
                    f(r["reference_best"]),
                    f(r["best"]),
                    f(r["last"]),
                    f(r["best_x_unigram"]),
                    *(str(o[k]) for k in sorted(o, key=int)),
                    "yes" if r["window_collapse_risk"] else "no",
                    f(r["watch"]),
                    f(r["trap"]),
                    f(r["loss_rule"]),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def power_table(failed: int, healthy: int, rates: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    """The power table of the plan: per (hit rate, false-stop rate), the p at the expected table and the power."""
    return [
        {
            "failed": failed,
            "healthy": healthy,
            "hit_rate": h,
            "false_stop_rate": f,
            "p_at_expected": float(expected_p(failed, healthy, h, f)),
            "power": power(failed, healthy, h, f),
        }
        for h, f in rates
    ]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", nargs="*", help="OUT/grid.json or the grid's folder (several: their cells together)")
    ap.add_argument("--lengths", default="600,full", help="run lengths to label at (default 600,full: Amendment 1's)")
    ap.add_argument("--out", help="write the report's JSON here")
    ap.add_argument("--power", action="store_true", help="print the plan's power table")
    ap.add_argument("--pilot", help="read the second pilot's JSON (data/collapse_pilot2.json) instead of a grid")
    args = ap.parse_args(argv)
    if args.power:
        print(
            json.dumps(
                {
                    "minimal_designs": minimal_designs(),
                    "tables": [
                        power_table(f, h, [(1.0, 0.0), (1.0, 0.5), (0.8, 0.2), (0.75, 0.25)])
                        for f, h in ((8, 4), (6, 6), (8, 8), (10, 6))
                    ],
                },
                indent=1,
            )
        )
        return
    if args.pilot:
        print(pilot_markdown(pilot_rows(json.loads(Path(args.pilot).read_text()))))
        return
    if not args.grid:
        raise SystemExit(
            "Expected a grid (OUT/grid.json or its folder), got none: python examples/collapse_analysis.py OUT"
        )
    lengths = [None if x == "full" else int(x) for x in args.lengths.split(",")]
    rep = report([c for g in args.grid for c in load_cells(g)], lengths)
    text = json.dumps(rep, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
