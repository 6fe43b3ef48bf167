"""The collapse grid's report: the frozen scoring of ``examples/collapse_analysis.py`` over the committed cells
(``data/collapse/a``, ``data/collapse/b``), written as the markdown block of docs/science/abort_policy.md and one
figure per outcome. It adds no scoring: every number comes from ``collapse_analysis.report`` (the plan's scoring,
docs/plans/collapse_plan.md, Amendments 1 and 2) or is a count over its configurations.

    python examples/collapse_report.py data/collapse                 # what is in, what is missing
    python examples/collapse_report.py data/collapse --markdown      # the report's block
    python examples/collapse_report.py data/collapse --update-docs --figures docs/img
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from satmon.io.atomic import atomic_write

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("collapse_analysis", _HERE / "collapse_analysis.py")
ca = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules.setdefault("collapse_analysis", ca)
_spec.loader.exec_module(ca)  # type: ignore[union-attr]

#: The commit the plan's Amendment 2 says the scored cells run from; a cell that records another is listed, not scored.
SCORED_CODE = "eb45f04978ab09af26bef15ffa91581f50b2a3d4"
#: The plan's two grids: folder -> (sizes, seeds, the ``--vary`` values).
PLANNED = {
    "a": (
        ("d64L2", "d64L4"),
        (21, 22),
        {"final_norm": ("rmsnorm",), "alpha_init": ("2", "4", "8"), "lr": ("0.003", "0.01", "0.03")},
    ),
    "b": (("d64L2", "d64L4"), (21, 22), {"final_norm": ("dyt",), "alpha_init": ("2", "8"), "lr": ("0.003", "0.01")}),
}
MARKERS = ("<!-- collapse-report -->", "<!-- /collapse-report -->")
#: The run lengths of the plan: the full 1,200 steps (the main table) and the curve cut at 600.
LENGTHS = (None, 600)
FLAG_NAMES = {
    "window": "(a) window verdict (100 steps)",
    "watch": "(b) watch from step 101",
    "watch500": "(b500) watch after a 500-step window",
    "shipped": '(c) `abort_on="collapse"` stop',
    "trap": "(d) trap reading",
    "loss rule": "loss rule",
    "never flag": "never flag",
}
ROWS = (ca.NEVER_LEARNED, ca.LOST, ca.BEHIND_LABEL, "failed", "failed or behind")
FIGURE_OUTCOMES = (ca.NEVER_LEARNED, ca.LOST, ca.BEHIND_LABEL, ca.HEALTHY)
_CELL_NAME = re.compile(r"^[A-Za-z0-9_.=-]+\.[0-9a-f]{12}\.json$")


# ------------------------------------------------------------------------------------------------------------ cells
def read_cells(root: str | Path) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The complete cells of each grid folder under ``root`` (``a``, ``b``), and why any cell is not scored."""
    scored: dict[str, list[dict[str, Any]]] = {}
    refused: list[str] = []
    for part in PLANNED:
        scored[part] = []
        for f in sorted((Path(root) / part).glob("*.json")):
            if not _CELL_NAME.match(f.name) or f.name.endswith(".attempt.json"):
                continue
            try:
                cell = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
                refused.append(f"{part}/{f.name}: not a readable cell ({type(err).__name__}: {err})")
                continue
            if not isinstance(cell, dict) or not isinstance(cell.get("arms"), dict):
                refused.append(f"{part}/{f.name}: not a grid cell (expected a JSON object with 'arms')")
                continue
            if cell.get("code") != SCORED_CODE:
                refused.append(f"{part}/{f.name}: ran from {cell.get('code')}, not the plan's {SCORED_CODE[:7]}")
                continue
            scored[part].append(cell)
    return scored, refused


def planned_names(part: str) -> list[tuple[str, int, tuple[tuple[str, str], ...]]]:
    sizes, seeds, vary = PLANNED[part]
    out = []
    for size in sizes:
        for seed in seeds:
            for fn in vary["final_norm"]:
                for a in vary["alpha_init"]:
                    for lr in vary["lr"]:
                        out.append((size, seed, (("alpha_init", a), ("final_norm", fn), ("lr", lr))))
    return out


def missing(scored: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """The planned cells not in yet, as ``part: size seed vary``."""
    left = []
    for part in PLANNED:
        have = {(c["group"], c["seed"], _vary(c)) for c in scored[part]}
        left += [f"{part}: {s} s{seed} {dict(v)}" for s, seed, v in planned_names(part) if (s, seed, v) not in have]
    return left


def _vary(cell: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in (cell.get("vary") or {}).items()))


# ------------------------------------------------------------------------------------------------------ formatting
def _f(v: Any, digits: int = 3) -> str:
    """A number for a table: ``-`` for none, ``digits`` decimals without trailing zeros (0: a whole number)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if not isinstance(v, float):
        return str(v)
    if digits == 0:
        return f"{v:.0f}"
    if v and abs(v) < 0.01:
        return f"{v:.{digits}g}"
    text = f"{v:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _ci(ci: Sequence[float]) -> str:
    return f"{ci[0]:.2f}-{ci[1]:.2f}"


def _p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.2g}" if p < 0.01 else f"{p:.3f}")


def _config_parts(key: str) -> dict[str, str]:
    """``str(config)`` of collapse_analysis -> its size, arm and ``--vary`` values."""
    size, vary, arm = eval(key, {"__builtins__": {}})  # noqa: S307 - our own repr of a tuple of str, no names
    return {"size": size, "arm": arm, **dict(vary)}


def _short(outcome: str) -> str:
    return {
        ca.NEVER_LEARNED: "never learned",
        ca.LOST: "lost",
        ca.BEHIND_LABEL: "behind",
        ca.HEALTHY: "healthy",
        ca.MARGINAL: "marginal",
        ca.EXCLUDED: "excluded",
    }.get(outcome, outcome)


# --------------------------------------------------------------------------------------------------------- the report
def scored_report(scored: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """``collapse_analysis.report`` over every scored cell, at the plan's two run lengths."""
    return ca.report([c for part in PLANNED for c in scored[part]], LENGTHS)


def _configs(rep: Mapping[str, Any], length: int | None, arm: str) -> list[dict[str, Any]]:
    return rep["lengths"][str(length or "full")].get(arm, {}).get("configurations", [])


def _flag_rows(rep: Mapping[str, Any], length: int | None, arm: str) -> dict[str, Any]:
    return rep["lengths"][str(length or "full")].get(arm, {}).get("flags", {})


def silent_loss_rule(
    cells: Sequence[Mapping[str, Any]], length: int | None, flag: str, kinds: Sequence[str]
) -> tuple[int, int]:
    """(flagged failed configurations where the loss rule never fired, flagged failed configurations) of the ``dyt``
    arm: where a flag came earlier than watching the loss by more than any lead can say."""
    failed = [c for c in _flagged(cells, flag, length) if all(o in kinds for o in c["seed_outcomes"]) and c["flagged"]]
    return sum(c["loss_rule"] is None for c in failed), len(failed)


def remedy(configs: Sequence[Mapping[str, Any]], flagged_by: Mapping[str, bool]) -> list[dict[str, Any]]:
    """For each flagged failed-or-behind ``dyt`` configuration, its neighbours that differ in one varied setting (the
    same size and every other setting): per change (``final_norm`` dyt -> rmsnorm, ``alpha_init`` lower, ``lr``
    lower, ...), in how many of the flagged configurations that have such a neighbour the neighbour is healthy.

    ``flagged_by``: configuration key -> whether the flag fired on it (the same configurations as ``configs``)."""
    by_key = {c["config"]: c for c in configs}
    parts = {k: _config_parts(k) for k in by_key}
    failing = set(ca.FAILURES) | {ca.BEHIND_LABEL}
    tally: dict[tuple[str, str], list[int]] = {}
    for k, c in by_key.items():
        if not (flagged_by.get(k) and all(o in failing for o in c["seed_outcomes"])):
            continue
        me = parts[k]
        seen: dict[tuple[str, str], bool] = {}
        for k2, c2 in by_key.items():
            other = parts[k2]
            diff = [x for x in ("final_norm", "alpha_init", "lr") if other.get(x) != me.get(x)]
            if other["size"] != me["size"] or len(diff) != 1:
                continue
            x = diff[0]
            if x == "final_norm":
                change = f"final norm {me[x]} -> {other[x]}"
            else:
                change = f"{x} {'lower' if float(other[x]) < float(me[x]) else 'higher'}"
            seen[(x, change)] = seen.get((x, change), False) or c2["outcome"] == ca.HEALTHY
        for key, healthy in seen.items():
            t = tally.setdefault(key, [0, 0])
            t[0] += healthy
            t[1] += 1
    return [{"setting": x, "change": ch, "healthy": h, "of": n} for (x, ch), (h, n) in sorted(tally.items())]


#: The remedy's changes as satmon.study words them: ``remedy``'s change -> the words.
REMEDY_WORDS = {
    "lr lower": "a lower peak learning rate",
    "final norm dyt -> rmsnorm": "an RMSNorm final norm",
    "alpha_init lower": "a lower alpha_init",
}


def record(scored: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The counts ``satmon.study`` states of the grid (``tests/examples/test_example_collapse_report.py`` holds them
    equal): the gated arm's configurations at 1,200 steps; per flag ``(hits, failing configurations, false stops,
    healthy configurations, mean lead over the loss rule in whole steps)``, for the window's verdict (its window 100
    steps), the watch from the warm-up's end, the
    watch after a 500-step window and the loss rule over the configurations that failed or fell behind, and for the
    trap reading over those that never learned, and how many healthy configurations had a DyT final norm (the only
    place the trap reading can fire, so the only healthy runs that measure its false stops); the remedy of the watch's
    and of the trap's flagged configurations (:data:`REMEDY_WORDS`' changes: ``(words, healthy, of)``); the GELU
    control's configurations and how many any flag fired on."""
    cells = [c for part in PLANNED for c in scored[part]]
    rep = scored_report(scored)
    rows = _flag_rows(rep, None, "dyt")
    full = _configs(rep, None, "dyt")

    def five(flag: str, row: str) -> tuple[int, int, int, int, int | None]:
        s = rows[flag][row]
        lead = None if s["lead"] is None else round(s["lead"])
        return s["hits"], s["configurations"], s["false_stops"], s["healthy"], lead

    def cure(flag: str) -> tuple[tuple[str, int, int], ...]:
        got = remedy(full, {c["config"]: c["flagged"] for c in _flagged(cells, flag, None)})
        found = {r["change"]: (r["healthy"], r["of"]) for r in got}
        return tuple((w, *found[k]) for k, w in REMEDY_WORDS.items() if k in found)

    gelu = _configs(rep, None, "dyt-gelu")
    fired = {
        c["config"]
        for f in ("window", "watch", "shipped", "trap")
        for c in _flagged(cells, f, None, "dyt-gelu")
        if c["flagged"]
    }
    return {
        "configurations": len(full),
        "window": five("window", "failed or behind"),
        "watch": five("watch", "failed or behind"),
        "watch_late": five("watch500", "failed or behind"),
        "loss_rule": five("loss rule", "failed or behind"),
        "trap": five("trap", ca.NEVER_LEARNED),
        "trap_loss_rule": five("loss rule", ca.NEVER_LEARNED),
        "trap_healthy": sum(
            c["outcome"] == ca.HEALTHY and _config_parts(c["config"])["final_norm"] == "dyt" for c in full
        ),
        "remedy_watch": cure("watch"),
        "remedy_trap": cure("trap"),
        "gelu": (len(gelu), len(fired)),
    }


def markdown(scored: Mapping[str, Sequence[Mapping[str, Any]]], refused: Sequence[str]) -> str:
    """The report's block for docs/science/abort_policy.md (a test holds the two equal)."""
    cells = [c for part in PLANNED for c in scored[part]]
    rep = scored_report(scored)
    n = {p: len(scored[p]) for p in PLANNED}
    planned = {p: len(planned_names(p)) for p in PLANNED}
    out = [
        f"_Written by `python examples/collapse_report.py data/collapse --update-docs --figures docs/img` from the "
        f"cells in `data/collapse/` (grid A: {n['a']} of {planned['a']} cells, grid B: {n['b']} of {planned['b']}), "
        f"every one run from {SCORED_CODE[:7]} (the plan's Amendment 2), scored by the frozen "
        "`examples/collapse_analysis.py`. A test recomputes this block from the cells._",
        "",
    ]
    left = missing(scored)
    if left:
        out += [
            f"**Interim: {len(left)} planned cells are not in yet** ({'; '.join(left[:6])}"
            f"{' ...' if len(left) > 6 else ''}).",
            "",
        ]
    if refused:
        out += ["Not scored: " + "; ".join(refused) + ".", ""]
    # the configurations
    full, short = _configs(rep, None, "dyt"), {c["config"]: c for c in _configs(rep, 600, "dyt")}
    flagsets = {
        f: {c["config"]: c for c in _flagged(cells, f, None)}
        for f in ("window", "watch", "watch500", "trap", "loss rule")
    }
    out += [
        "#### The configurations of the gated arm (`dyt`: DyT blocks feeding SwiGLU)",
        "",
        "Outcome per seed (21, 22) at 1,200 steps and at 600; the step each flag fired (mean over the flagged seeds; "
        "`-`: not flagged by more than half of the seeds).",
        "",
        "| grid | size | final norm | alpha_init | peak lr | seeds at 1,200 | outcome | at 600 | window | watch | "
        "watch after 500 | trap | loss rule |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(full, key=lambda c: _sort_key(c["config"])):
        p = _config_parts(c["config"])
        steps = []
        for f in ("window", "watch", "watch500", "trap", "loss rule"):
            fc = flagsets[f][c["config"]]
            steps.append(_f(fc["flag_step"], 0) if fc["flagged"] else "-")
        out.append(
            "| "
            + " | ".join(
                [
                    "B" if p["final_norm"] == "dyt" else "A",
                    p["size"],
                    p["final_norm"],
                    p["alpha_init"],
                    p["lr"],
                    ", ".join(_short(o) for o in c["seed_outcomes"]),
                    f"**{_short(c['outcome'])}**",
                    _short(short[c["config"]]["outcome"]),
                    *steps,
                ]
            )
            + " |"
        )
    tally = _tally(full)
    out += [
        "",
        "Configurations by outcome at 1,200 steps: " + ", ".join(f"{k} {v}" for k, v in tally.items()) + ".",
        "",
    ]
    # the flags, per outcome, per length
    for length in LENGTHS:
        rows = _flag_rows(rep, length, "dyt")
        label = "1,200 steps (the main table)" if length is None else f"{length} steps"
        out += [
            f"#### The flags against each outcome, at {label}",
            "",
            "Per configuration (seeds count once), against the healthy configurations of the same arm. Lead: the loss "
            "rule's step minus the flag's, averaged over the flagged configurations where both fired (positive: the "
            "flag came first); loss silent: flagged failures where the loss rule never fired. Saved: run-shares a stop "
            "at the flag saves over the failed configurations; wasted: run-shares of healthy configurations it stops.",
            "",
            "| outcome | flag | hits | hit rate (95%) | false stops | false-stop rate (95%) | Fisher p | "
            "lead (steps) | loss silent | saved | wasted |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in ROWS:
            kinds = _kinds(row)
            for f in ("window", "watch", "watch500", "shipped", "trap", "loss rule", "never flag"):
                s = rows[f][row]
                if not s["configurations"]:
                    continue
                silent, _ = silent_loss_rule(cells, length, f, kinds)
                out.append(
                    "| "
                    + " | ".join(
                        [
                            row,
                            FLAG_NAMES[f],
                            f"{s['hits']} of {s['configurations']}",
                            f"{_f(s['hit_rate'], 2)} ({_ci(s['hit_ci'])})",
                            f"{s['false_stops']} of {s['healthy']}",
                            f"{_f(s['false_stop_rate'], 2)} ({_ci(s['false_stop_ci'])})",
                            _p(s["fisher_p"]),
                            _f(s["lead"], 0),
                            str(silent) if f != "loss rule" else "-",
                            _f(s["saved"], 2),
                            _f(s["wasted"], 2),
                        ]
                    )
                    + " |"
                )
        out.append("")
    # held out across sizes
    sub = [a for a in ca.arms_of(cells) if a["arm"] == "dyt"]
    at_half = {
        size: ca.score(ca.configurations([a for a in sub if a["size"] == size], None, flag="watch"))["failed"]
        for size in sorted({a["size"] for a in sub})
    }
    out += [
        "#### The other signals, held out across sizes (1,200 steps; failed = never learned or lost)",
        "",
        "Each signal's level is chosen on one size's configurations (hit rate minus false-stop rate, ties to the most "
        "sensitive) and scored on the other's; beside it, the watch as shipped (gated saturation >= 0.5) on the same "
        "configurations. A signal beats the shipped rule only if it does better on both sizes.",
        "",
        "| signal | level chosen on | level | scored on | hits | false stops | lead | the watch at 0.5 there |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["lengths"]["full"]["dyt"]["held_out"]:
        s, w = r["score"], at_half[r["scored_on"]]
        out.append(
            f"| {r['signal']} | {r['chosen_on']} | {_f(r['level'], 2)} | {r['scored_on']} | {s['hits']} of "
            f"{s['configurations']} | {s['false_stops']} of {s['healthy']} | {_f(s['lead'], 0)} | {w['hits']} of "
            f"{w['configurations']}, {w['false_stops']} of {w['healthy']} false |"
        )
    # the GELU control
    gelu = _configs(rep, None, "dyt-gelu")
    if gelu:
        grows = _flag_rows(rep, None, "dyt-gelu")
        fired = {
            f: sum(c["flagged"] for c in _flagged(cells, f, None, "dyt-gelu"))
            for f in ("window", "watch", "shipped", "trap")
        }
        out += [
            "",
            "#### The GELU control (`dyt-gelu`: the same DyT blocks, a GELU MLP, no gate)",
            "",
            f"{len(gelu)} configurations at 1,200 steps: "
            + ", ".join(f"{k} {v}" for k, v in _tally(gelu).items())
            + ". Flags fired (configurations): "
            + ", ".join(f"{FLAG_NAMES[f]} {v}" for f, v in fired.items())
            + f"; the loss rule caught {grows['loss rule']['failed or behind']['hits']} of "
            f"{grows['loss rule']['failed or behind']['configurations']} failed or behind.",
            "",
            "| size | alpha_init | peak lr | seeds at 1,200 | outcome | at 600 | the gated arm's outcome | loss rule |",
            "|---|---|---|---|---|---|---|---|",
        ]
        gshort = {c["config"]: c for c in _configs(rep, 600, "dyt-gelu")}
        glr = {c["config"]: c for c in _flagged(cells, "loss rule", None, "dyt-gelu")}
        gated = {str(_config_parts(c["config"]) | {"arm": "-"}): c for c in full}
        for c in sorted(gelu, key=lambda c: _sort_key(c["config"])):
            p = _config_parts(c["config"])
            twin = gated.get(str(p | {"arm": "-"}))
            out.append(
                f"| {p['size']} | {p['alpha_init']} | {p['lr']} | "
                f"{', '.join(_short(o) for o in c['seed_outcomes'])} | **{_short(c['outcome'])}** | "
                f"{_short(gshort[c['config']]['outcome'])} | {_short(twin['outcome']) if twin else '-'} | "
                f"{_f(glr[c['config']]['flag_step'], 0) if glr[c['config']]['flagged'] else '-'} |"
            )
    # the remedy
    rem = remedy(full, {k: v["flagged"] for k, v in flagsets["watch"].items()})
    out += [
        "",
        "#### What changed a flagged configuration's outcome (the remedy, counted)",
        "",
        "For each `dyt` configuration that failed or fell behind and that the watch flagged: its neighbours in the "
        "grid that differ in one setting (same size). Warm-up (100 steps everywhere) was not varied.",
        "",
        "| change | the neighbour was healthy |",
        "|---|---|",
    ]
    for r in rem:
        out.append(f"| {r['change']} | {r['healthy']} of {r['of']} |")
    out += [
        "",
        "#### The watch's settings, read again from the same checks (not pre-registered)",
        "",
        "The collapse watch at 0.5 recomputed from each arm's recorded checks (every 50 steps from step 101) with "
        "another `patience`, another cadence (every 2nd or 4th recorded check) or another start, over the `dyt` "
        "configurations that failed or fell behind and the healthy ones at 1,200 steps; the first row is the watch "
        "as the grid ran it. Exploratory: chosen after the cells were in, so it can say where a setting made no "
        "difference, not which setting is best.",
        "",
        "| start | cadence (steps) | patience | hits | false stops | lead (steps) | wasted |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in watch_settings(cells):
        out.append(
            f"| {r['start']} | {r['every']} | {r['patience']} | {r['hits']} of {r['configurations']} | "
            f"{r['false_stops']} of {r['healthy']} | {_f(r['lead'], 0)} | {_f(r['wasted'], 2)} |"
        )
    return "\n".join(out)


#: The watch settings :func:`watch_settings` reads again: (first checked step, cadence, patience).
WATCH_SETTINGS = (
    (101, 50, 1),
    (101, 50, 2),
    (101, 50, 3),
    (101, 100, 1),
    (101, 200, 1),
    (501, 50, 1),
    (501, 50, 2),
)


def watch_step(watch: Mapping[str, Any], start: int, every: int, patience: int, level: float = 0.5) -> int | None:
    """The collapse watch recomputed from its recorded checks: the checks at ``start``, ``start + every``, ... (the
    recorded ones are every 50 steps), the gated saturation >= ``level`` for ``patience`` of them in a row: the frozen
    ``collapse_analysis.watch_after`` over those checks.

    Example:
        >>> w = {"checks": [{"step": s, "gated_saturation": v} for s, v in [(101, 0.6), (151, 0.4), (201, 0.7),
        ...      (251, 0.8), (301, 0.9)]]}
        >>> watch_step(w, 101, 50, 1), watch_step(w, 101, 50, 2), watch_step(w, 101, 100, 2), watch_step(w, 151, 50, 1)
        (101, 251, 201, 201)
    """
    checks = [c for c in watch.get("checks", []) if c["step"] >= start and (c["step"] - start) % every == 0]
    return ca.watch_after({"collapse_threshold": level, "patience": patience, "checks": checks}, start - 1)


def watch_settings(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per :data:`WATCH_SETTINGS` row, the ``dyt`` arm's "failed or behind" row at 1,200 steps as
    ``collapse_analysis.score`` counts it, with the watch recomputed by :func:`watch_step`."""
    sub = [a for a in ca.arms_of(cells) if a["arm"] == "dyt"]
    rows = []
    for start, every, patience in WATCH_SETTINGS:

        def flag_of(a: Mapping[str, Any], lab: Mapping[str, Any], s=start, e=every, p=patience) -> int | None:
            return watch_step(a["record"].get("watch") or {}, s, e, p)

        row = ca.score(ca.configurations(sub, None, flag_of=flag_of))["failed or behind"]
        rows.append({"start": start, "every": every, "patience": patience, **row})
    return rows


def _kinds(row: str) -> tuple[str, ...]:
    return {
        "failed": ca.FAILURES,
        "failed or behind": (*ca.FAILURES, ca.BEHIND_LABEL),
    }.get(row, (row,))


def _flagged(
    cells: Sequence[Mapping[str, Any]], flag: str, length: int | None, arm: str = "dyt"
) -> list[dict[str, Any]]:
    """The configurations of ``arm`` as ``collapse_analysis.configurations`` gives them for ``flag`` (a flag the code
    computes, ``loss rule`` or ``never flag``), their keys as strings."""
    sub = [a for a in ca.arms_of(cells) if a["arm"] == arm]
    if flag == "loss rule":
        got = ca.configurations(sub, length, flag_of=lambda a, lab: lab["loss_rule"])
    elif flag == "never flag":
        got = ca.configurations(sub, length, flag_of=lambda a, lab: None)
    else:
        got = ca.configurations(sub, length, flag=flag)
    return [{**c, "config": str(c["config"])} for c in got]


def _tally(configs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in configs:
        out[_short(c["outcome"])] = out.get(_short(c["outcome"]), 0) + 1
    return dict(sorted(out.items()))


def _sort_key(key: str) -> tuple:
    p = _config_parts(key)
    return (p["final_norm"] == "dyt", p["size"], float(p["alpha_init"]), float(p["lr"]))


# --------------------------------------------------------------------------------------------------------- figures
def figures(scored: Mapping[str, Sequence[Mapping[str, Any]]], folder: str | Path) -> list[Path]:
    """One figure per outcome (never learned, learned then lost, fell behind, healthy): the first configuration of
    that outcome at 1,200 steps (in the report's order), its first seed of that outcome, else (no configuration's
    seeds agree on it) the first seed of that outcome in a split configuration, said in the title: the held-out loss
    of every arm with the unigram level, and the gated DyT saturation at the watch's checks, with each flag's step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for part in PLANNED for c in scored[part]]
    rep = scored_report(scored)
    full = sorted(_configs(rep, None, "dyt"), key=lambda c: _sort_key(c["config"]))
    written = []

    def cells_of(conf: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        p = _config_parts(conf["config"])
        return sorted(
            (
                c
                for c in cells
                if c["group"] == p["size"]
                and {k: str(v) for k, v in (c.get("vary") or {}).items()}
                == {k: p[k] for k in ("final_norm", "alpha_init", "lr")}
            ),
            key=lambda c: c["seed"],
        )

    def pick(outcome: str) -> tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]] | None:
        # a configuration whose seeds agree first; else the first seed of that outcome in a split configuration
        for agree in (True, False):
            for conf in full:
                if agree and conf["outcome"] != outcome:
                    continue
                for cell in cells_of(conf):
                    lab = ca.label_arm(next(a for a in ca.arms_of([cell]) if a["arm"] == "dyt"))
                    if lab["outcome"] == outcome:
                        return conf, cell, lab
        return None

    for outcome in FIGURE_OUTCOMES:
        got = pick(outcome)
        if got is None:
            continue
        pick_conf, cell, lab = got
        p = _config_parts(pick_conf["config"])
        others = "" if pick_conf["outcome"] == outcome else f" (its configuration: {_short(pick_conf['outcome'])})"
        arm = cell["arms"]["dyt"]
        u = cell["unigram_loss"]
        fig, (ax, bx) = plt.subplots(2, 1, figsize=(7, 5.4), sharex=True, height_ratios=(3, 2))
        for name, style in (("rmsnorm", "-"), ("dyt", "-"), ("dyt-gelu", "--")):
            if name in cell["arms"]:
                xs, ys = zip(*[(s, v) for s, v in cell["arms"][name]["val_curve"] if v is not None])
                ax.plot(xs, ys, style, label=f"{name} (held-out)")
        ax.axhline(u, color="grey", lw=0.8, ls=":", label="unigram level U")
        ax.axhline(ca.LEARNED * u, color="grey", lw=0.6, ls="-.", label="0.9 x U")
        marks = {
            "watch": (lab["flags"]["watch"], "tab:red"),
            "window risk": (lab["flags"]["window"], "tab:purple"),
            "trap": (lab["flags"]["trap"], "tab:brown"),
            "loss rule": (lab["loss_rule"], "black"),
        }
        for name, (step, color) in marks.items():
            if step is not None:
                for axis in (ax, bx):
                    axis.axvline(step, color=color, lw=1, ls="--", label=f"{name} at {step}" if axis is ax else None)
        ax.set_ylabel("loss (nats/byte)")
        ax.set_title(
            f"{outcome}: {p['size']}, final norm {p['final_norm']}, alpha_init {p['alpha_init']}, lr {p['lr']}, "
            f"seed {cell['seed']}{others}",
            fontsize=9,
        )
        ax.legend(fontsize=7, ncol=2)
        checks = arm["watch"]["checks"]
        xs = [c["step"] for c in checks if c.get("gated_saturation") is not None]
        bx.plot(
            xs,
            [c["gated_saturation"] for c in checks if c.get("gated_saturation") is not None],
            "o-",
            ms=3,
            label="gated DyT saturation (watch checks)",
        )
        bx.axhline(arm["watch"]["collapse_threshold"], color="tab:red", lw=0.8, ls=":", label="collapse_threshold")
        bx.set_ylim(-0.02, 1.02)
        bx.set_xlabel("optimizer step")
        bx.set_ylabel("saturation")
        bx.legend(fontsize=7)
        fig.tight_layout()
        path = Path(folder) / f"collapse_{outcome.replace(' ', '_')}.png"
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="data/collapse (its a/ and b/ folders)")
    ap.add_argument("--markdown", action="store_true", help="print the report's block")
    ap.add_argument("--update-docs", action="store_true", help="write the block into docs/science/abort_policy.md")
    ap.add_argument("--record", action="store_true", help="print the counts satmon.study states of the grid")
    ap.add_argument("--figures", type=Path, help="write one figure per outcome into this folder")
    args = ap.parse_args(argv)
    if not args.root.is_dir():
        raise SystemExit(f"Expected the collapse grid's folder (with a/ and b/), got {args.root}: not a folder.")
    scored, refused = read_cells(args.root)
    if (args.markdown or args.update_docs or args.record or args.figures) and not any(scored.values()):
        raise SystemExit(
            f"Expected scored cells in {args.root}/a and {args.root}/b, got none"
            + (f" ({len(refused)} not scored: {'; '.join(refused[:3])})" if refused else "")
            + ": run the plan's commands (docs/plans/collapse_plan.md) and copy their cells/*.json there."
        )
    if args.markdown or args.update_docs:
        block = "\n".join((MARKERS[0], markdown(scored, refused), MARKERS[1]))
        if args.markdown:
            print(block)
        if args.update_docs:
            docs = _HERE.parent / "docs" / "science" / "abort_policy.md"
            text = docs.read_text(encoding="utf-8")
            start, end = text.index(MARKERS[0]), text.index(MARKERS[1]) + len(MARKERS[1])
            atomic_write(docs, text[:start] + block + text[end:])  # the docs are replaced only by a complete file
            print(f"wrote the block into {docs}")
    if args.record:
        print(json.dumps(record(scored)))
    if args.figures:
        for path in figures(scored, args.figures):
            print(f"wrote {path}")
    if not (args.markdown or args.update_docs or args.figures or args.record):
        for why in refused:
            print(f"not scored: {why}")
        left = missing(scored)
        print(f"{sum(map(len, scored.values()))} cells scored; {len(left)} planned cells not in yet")
        for x in left:
            print(f"  not in yet: {x}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
