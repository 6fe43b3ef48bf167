"""Grid 3's scoring as its plan's amendments state it (docs/plans/grid3_plan.md), written before its cells are in.

Every count is in configurations (recipe x size x passes; a configuration's outcome is the sign of the mean of its
seeds' deltas; the seeds' agreement beside it), through ``satmon.results.forecast.configurations``, the definition the
forecast and the docs use. A one-class hypothesis passes when ``k`` of its ``n`` configurations go the predicted way
with the exact one-sided binomial p against p0 = 0.5 below 0.05; ``k``, ``n``, p and the Clopper-Pearson 95% interval
are reported whether it passes or not. H6 (both classes) is tested against its trivial rate, exploratory. A cell is
scored only if it records ``environment`` and its ``environment.satmon_commit`` is its part's commit as the plan
names it (:data:`COMMITS`: Amendment 1's for (a) and (c), Amendment 2's for (b)); the others are listed, never scored.
A hypothesis is scored once every cell of the parts it covers is in.

    python examples/grid3_analysis.py data/grid3             # the table
    python examples/grid3_analysis.py --forecast data/grid3  # and the forecast held out, per configuration
    python examples/grid3_analysis.py --csv data/grid3       # write satmon/data_files/phase_grid_grid3.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from satmon.functional.significance import binomial_tail
from satmon.io.atomic import atomic_write
from satmon.results.forecast import (
    Configuration,
    KnownCell,
    clopper_pearson,
    configurations,
    forecast,
    known_cells,
)

#: The parts: folder under data/grid3 -> (recipe, sizes, passes, model family).
PARTS = {
    "gap": ("satmon-faithful-gpt", ("d48L2", "d64L2"), (4.5, 6.5, 9.0, 12.0), "gpt"),
    "subpass": ("satmon-faithful-gpt/corpus=torch", ("d48L2", "d64L2"), (0.25, 0.5, 1.0), "gpt"),
    "llama": ("satmon-llama", ("d64L2",), (1.5, 3.3, 16.0, 64.0, 164.0), "llama"),
}
#: The commit each part's cells must record (``environment.satmon_commit``), as the plan's amendments name them.
COMMITS = {"gap": "e6ab0de", "subpass": "e6ab0de", "llama": "28967fa"}
SEEDS = (4, 5)
#: The DyT paper's LLaMA inits (``alpha_init="paper"``): 0.8 before attention, 0.2 before the MLP.
PAPER_ALPHA = (0.2, 0.8)
#: (hypothesis, the parts and passes it covers (None: every budget of the part), the outcome it reads, the direction
#: it predicts: a class, or a function of passes for a two-class hypothesis)
HYPOTHESES: tuple[tuple[str, tuple[tuple[str, tuple[float, ...] | None], ...], str, Any], ...] = (
    ("H5 (hurts at 4.5-12 passes)", (("gap", None),), "final", "hurts"),
    ("H8 (hurts below one pass)", (("subpass", None),), "final", "hurts"),
    ("H7 (DyT's best not below the reference's best)", (("gap", None), ("subpass", None)), "best", "hurts"),
    ("H3' (hurts at <= 3.6 passes, both families)", (("llama", (1.5, 3.3)), ("subpass", None)), "final", "hurts"),
    ("H7, second family", (("llama", None),), "best", "hurts"),
    (
        "H6 (the second family flips as the first at width 64)",
        (("llama", None),),
        "final",
        lambda passes: "hurts" if passes <= 16 * 1.1 else "helps",
    ),
)
ALPHA = 0.05
#: The cells' ``source`` in the data file (how the forecast's evidence names them).
SOURCE = "satmon's third CPU grid"
#: The report's block in docs/science/grids.md, between these markers (``--markdown`` writes it; a test compares).
MARKERS = ("<!-- grid3-report -->", "<!-- /grid3-report -->")


def read_cells(
    root: Path, commits: str | Mapping[str, str] = COMMITS
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The scored cells of each part, and why each other cell under ``root`` is not scored.

    ``commits``: each part's commit (:data:`COMMITS`), or one commit for every part.
    """
    scored: dict[str, list[dict[str, Any]]] = {p: [] for p in PARTS}
    refused = []
    for part in PARTS:
        commit = commits if isinstance(commits, str) else commits[part]
        for path in sorted((root / part).glob("*.json")):
            c = json.loads(path.read_text())
            env = c.get("environment")
            if not isinstance(env, dict):
                refused.append(f"{part}/{path.name}: no environment recorded")
            elif not str(env.get("satmon_commit", "")).startswith(commit):
                refused.append(f"{part}/{path.name}: ran from {env.get('satmon_commit')}, not the amendment's {commit}")
            else:
                scored[part].append(c)
    return scored, refused


def alpha_range(cell: Mapping[str, Any]) -> tuple[float, float]:
    """DyT's initial alpha over the cell's DyT layers, (lowest, highest): ``"paper"`` is the LLaMA inits."""
    a = cell["config"]["alpha_init"]
    return PAPER_ALPHA if a == "paper" else (float(a), float(a))


def final_norm(part: str, cell: Mapping[str, Any]) -> str:
    """The DyT arm's norm before the head: ``"dyt"`` (the GPT builtin replaces every norm, ``ln_f`` too) or
    ``"norm"`` (the LLaMA recipe's ``final_norm=rmsnorm``)."""
    if PARTS[part][3] == "gpt":
        return "dyt"
    return "dyt" if cell["config"].get("final_norm") == "dyt" else "norm"


def known(part: str, cells: Sequence[dict[str, Any]]) -> list[KnownCell]:
    """A part's cells as the forecast's :class:`KnownCell` (its recipe, the configuration's first axis)."""
    recipe, family = PARTS[part][0], PARTS[part][3]
    return [
        KnownCell(
            c["name"],
            float(c["params"]),
            float(c["epochs"]),
            float(c["delta"]) if c.get("delta") is not None else float("nan"),
            c["group"],
            f"grid 3 {part}",
            unique_tokens=float(c["train_tokens"]),
            best_delta=float(c["delta_best"]) if c.get("delta_best") is not None else None,
            steps=float(c["steps"]),
            warmup_steps=float(c["warmup"]),
            lr_schedule="linear-warmup-constant",
            recipe=recipe,
            family=family,
            alpha_init=alpha_range(c)[0],
            alpha_init_max=alpha_range(c)[1],
            optimizer="adamw",
            final_norm=final_norm(part, c),
        )
        for c in cells
    ]


def outcome(cfg: Configuration, which: str) -> str:
    d = cfg.delta if which == "final" else cfg.best_delta
    return "tie" if d is None or d != d or d == 0 else "helps" if d < 0 else "hurts"


def missing(scored: Mapping[str, Sequence[dict[str, Any]]], parts: Sequence[str] = tuple(PARTS)) -> list[str]:
    """The planned cells of ``parts`` not yet in."""
    have = {(p, c["group"], round(float(c["epochs"]), 2), int(c["seed"])) for p, cs in scored.items() for c in cs}
    return [
        f"{p} {size} {passes:g} passes seed {s}"
        for p in parts
        for size in PARTS[p][1]
        for passes in PARTS[p][2]
        for s in SEEDS
        if (p, size, round(passes, 2), s) not in have
    ]


def _covered(cells: Sequence[dict[str, Any]], budgets: tuple[float, ...] | None) -> list[dict[str, Any]]:
    if budgets is None:
        return list(cells)
    return [c for c in cells if any(abs(float(c["epochs"]) / b - 1) < 0.05 for b in budgets)]


def unlearned(part: str, cells: Sequence[dict[str, Any]]) -> list[str]:
    """The configurations of ``part`` in which a seed's DyT arm did not learn (its final held-out loss not below the
    byte-unigram level: the cell's ``learns_dyt``), by configuration name (Amendment 2, item 3)."""
    bad = {c["name"] for c in cells if c.get("learns_dyt") is not True}
    return sorted(cfg.name for cfg in configurations(known(part, cells)) if any(k.name in bad for k in cfg.cells))


def _test(cfgs: Sequence[Configuration], which: str, predicted: Any) -> dict[str, Any]:
    """k of n configurations the predicted way; a one-class prediction against a coin, a two-class one against the
    trivial rate (the better of always-helps and always-hurts on the same configurations)."""
    want = [predicted(c.passes) if callable(predicted) else predicted for c in cfgs]
    got = [outcome(c, which) for c in cfgs]
    k, n = sum(w == g for w, g in zip(want, got)), len(cfgs)
    if callable(predicted):
        null = max(got.count("helps"), got.count("hurts")) / n if n else 0.5
    else:
        null = 0.5
    p = binomial_tail(k, n, null) if n else None
    return {
        "k": k,
        "n": n,
        "null": null,
        "p": p,
        "interval": clopper_pearson(k, n) if n else None,
        "passes": p is not None and p < ALPHA,
    }


def score(scored: Mapping[str, Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each hypothesis whose parts are all in: k of n, p against its null, interval and whether it passes (the plan's
    test); and, where a covered configuration's DyT arm did not learn, the count with those left out beside it."""
    out = []
    for name, cover, which, predicted in HYPOTHESES:
        parts = tuple(p for p, _ in cover)
        if missing(scored, parts):
            continue
        cfgs = configurations([k for p, budgets in cover for k in known(p, _covered(scored[p], budgets))])
        result = {"hypothesis": name, "outcome": which, **_test(cfgs, which, predicted)}
        dropped = sorted({n for p, budgets in cover for n in unlearned(p, _covered(scored[p], budgets))})
        result["unlearned"] = dropped
        if dropped:
            result["without_unlearned"] = _test([c for c in cfgs if c.name not in dropped], which, predicted)
        result["configurations"] = [
            {
                "name": c.name,
                "passes": c.passes,
                "delta": c.delta,
                "best_delta": c.best_delta,
                "seeds": c.seeds,
                "seeds_agree": c.seeds_agree,
            }
            for c in cfgs
        ]
        out.append(result)
    return out


def held_out_forecast(scored: Mapping[str, Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What satmon.forecast (the shipped cells only: grid 3 left out) says of each new configuration, and whether a
    confident answer was wrong (the worst outcome)."""
    shipped = [c for c in known_cells() if c.source != SOURCE]  # grid 3 left out, once its file ships too
    rows = []
    for part, cells in scored.items():
        for cfg in configurations(known(part, cells)):
            c = cfg.cells[0]
            raw = next(r for r in cells if r["name"] == c.name)
            f = forecast(
                params=c.params,
                unique_tokens=c.unique_tokens,
                planned_tokens=c.unique_tokens * c.passes,  # type: ignore[operator]
                steps=c.steps,
                warmup_steps=c.warmup_steps,
                lr_schedule=c.lr_schedule,
                family=c.family,
                alpha_init=alpha_range(raw),
                optimizer=c.optimizer,
                final_norm=c.final_norm,
                cells=shipped,
            )
            rows.append(
                {
                    "configuration": cfg.name,
                    "part": part,
                    "forecast": f.outcome,
                    "evidence": f.evidence,
                    "measured": cfg.outcome,
                    "confident_wrong": f.outcome in ("hurts", "helps") and f.outcome != cfg.outcome,
                }
            )
    return rows


CSV_HEADER = (
    "name", "params", "train_tokens", "delta", "group", "source", "passes", "final_dyt", "final_layernorm", "best_dyt",
    "best_layernorm", "protocol", "steps", "warmup_steps", "lr_schedule", "recipe", "family", "alpha_init",
    "alpha_init_max", "final_norm", "optimizer",
)  # fmt: skip
CSV_NOTE = """satmon's third CPU grid (docs/plans/grid3_plan.md and its amendments, committed before the cells
they score; cells in data/grid3/), one row per cell, seeds 4 and 5: (a) GPT d48L2 and d64L2 at 4.5 / 6.5 / 9 / 12
passes over the stdlib bytes; (c) the same sizes at 0.25 / 0.5 / 1 pass over the pinned torch's own .py sources
(recipe satmon-faithful-gpt/corpus=torch); (b) satmon-llama (RoPE, SwiGLU, DyT blocks at the paper's 0.8 / 0.2,
RMSNorm before the head) d64L2 at 1.5 / 3.3 / 16 / 64 / 164 passes. Grid 2's protocol (5,000 steps, warm-up 2,000
then 3e-3, per-seed 2,048-byte chunks). Columns as phase_grid_grid2.csv; alpha_init / alpha_init_max: DyT's lowest
and highest initial alpha; final_norm: the DyT arm's norm before the head (dyt, or norm: RMSNorm). Written by
`python examples/grid3_analysis.py --csv data/grid3`."""


def cells_csv(scored: Mapping[str, Sequence[dict[str, Any]]]) -> str:
    """Every scored cell as a row of ``satmon/data_files/phase_grid_grid3.csv`` (``protocol`` = ``study``)."""
    lines = [f"# {line}".rstrip() for line in CSV_NOTE.splitlines()]
    lines.append(",".join(CSV_HEADER))
    for part, cells in scored.items():
        recipe, family = PARTS[part][0], PARTS[part][3]
        for c in sorted(cells, key=lambda c: c["name"]):
            lo, hi = alpha_range(c)
            row = [
                c["name"],
                str(c["params"]),
                str(c["train_tokens"]),
                f"{c['delta']:.6f}",
                c["group"],
                "satmon's third CPU grid",
                f"{float(c['epochs']):.4f}",
                f"{c['val_loss_dyt']:.6f}",
                f"{c['val_loss_layernorm']:.6f}",
                f"{c['best_val_loss_dyt']:.6f}",
                f"{c['best_val_loss_layernorm']:.6f}",
                "study",
                str(c["steps"]),
                str(c["warmup"]),
                "linear-warmup-constant",
                recipe,
                family,
                f"{lo:g}",
                f"{hi:g}",
                final_norm(part, c),
                "adamw",
            ]
            lines.append(",".join(row))
    return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:+.1f}%"


def interim(root: Path, scored: Mapping[str, Sequence[dict[str, Any]]]) -> list[tuple[str, float, float | None]]:
    """The 5 cells run before amendment 1 (``interim_e6ee690/gap``) beside their reruns: (name, old delta, new)."""
    new = {c["name"]: c["delta"] for c in scored.get("gap", ())}
    old = [json.loads(p.read_text()) for p in sorted((root / "interim_e6ee690" / "gap").glob("*.json"))]
    return [(c["name"], c["delta"], new.get(c["name"])) for c in old]


def markdown(root: Path, scored: Mapping[str, Sequence[dict[str, Any]]], refused: Sequence[str]) -> str:
    """The report's numbers as markdown, every one computed here from the cells (docs/science/grids.md's block)."""
    cells = [c for cs in scored.values() for c in cs]
    envs = sorted(
        {(c["environment"]["satmon_commit"][:7], c["environment"]["torch"], c["environment"]["cpu"]) for c in cells}
    )
    out = [
        f"{len(cells)} cells scored of the plan's {sum(len(v[1]) * len(v[2]) * len(SEEDS) for v in PARTS.values())}"
        f" ({len(refused)} not scored); code and environment: "
        + "; ".join(f"{c} (torch {t}, {cpu})" for c, t, cpu in envs)
        + ".",
        "",
    ]
    left = missing(scored)
    if left:
        out += [f"Not in yet: {len(left)} cells ({'; '.join(left)}).", ""]
    out += [
        "| part | configuration | seeds' final deltas | mean | best (mean) | DyT learned | window (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, cs in scored.items():
        for cfg in configurations(known(part, cs)):
            raw = [next(r for r in cs if r["name"] == k.name) for k in cfg.cells]
            seeds = ", ".join(f"{_pct(r['delta'])} (s{r['seed']})" for r in sorted(raw, key=lambda r: r["seed"]))
            learned = f"{sum(r.get('learns_dyt') is True for r in raw)}/{len(raw)}"
            window = sum(r["window_saturation"] for r in raw) / len(raw)
            out.append(
                f"| {part} | {cfg.name} | {seeds} | {_pct(cfg.delta)} | {_pct(cfg.best_delta)} | {learned} | "
                f"{window:.3f} |"
            )
    out += [
        "",
        "| hypothesis | reads | k of n | null | p | 95% interval | by the plan |",
        "|---|---|---|---|---|---|---|",
    ]
    for h in score(scored):
        lo, hi = h["interval"]
        verdict = "passes" if h["passes"] else "does not pass"
        if h["unlearned"]:
            w = h["without_unlearned"]
            verdict += (
                (f"; without {', '.join(h['unlearned'])} (DyT did not learn): {w['k']} of {w['n']}, p = {w['p']:.3g}")
                if w["n"]
                else "; DyT learned in none"
            )
        out.append(
            f"| {h['hypothesis']} | {h['outcome']} | {h['k']} of {h['n']} | {h['null']:.2g} | {h['p']:.3g} | "
            f"{lo:.0%}-{hi:.0%} | {verdict} |"
        )
    rows = held_out_forecast(scored)
    wrong = [r for r in rows if r["confident_wrong"]]
    out += [
        "",
        f"The forecast held out (the shipped cells without grid 3): {len(rows)} configurations, "
        + ", ".join(f"{sum(r['forecast'] == o for r in rows)} {o}" for o in ("hurts", "helps", "uncertain"))
        + f"; confident and wrong in {len(wrong)}"
        + (": " + "; ".join(r["configuration"] for r in wrong) if wrong else "")
        + ".",
    ]
    old = interim(root, scored)
    if old:
        out += [
            "",
            "The 5 cells run before amendment 1 (from e6ee690, not scored) beside their reruns: "
            + "; ".join(f"{n} {_pct(a)} then {_pct(b)}" for n, a, b in old)
            + ".",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="data/grid3 (its gap/, subpass/ and llama/ folders)")
    ap.add_argument("--forecast", action="store_true", help="the forecast held out, per configuration")
    ap.add_argument("--csv", action="store_true", help="write satmon/data_files/phase_grid_grid3.csv (every part in)")
    ap.add_argument("--json", type=Path, help="also write the scores as JSON here")
    ap.add_argument("--markdown", action="store_true", help="print the report's block for docs/science/grids.md")
    ap.add_argument("--update-docs", action="store_true", help="write that block into docs/science/grids.md")
    args = ap.parse_args(argv)
    scored, refused = read_cells(args.root)
    if args.markdown or args.update_docs:
        block = "\n".join((MARKERS[0], markdown(args.root, scored, refused), MARKERS[1]))
        if args.markdown:
            print(block)
        if args.update_docs:
            docs = Path(__file__).resolve().parents[1] / "docs" / "science" / "grids.md"
            text = docs.read_text(encoding="utf-8")
            start, end = text.index(MARKERS[0]), text.index(MARKERS[1]) + len(MARKERS[1])
            atomic_write(docs, text[:start] + block + text[end:])  # the docs are replaced only by a complete file
            print(f"wrote the block into {docs}")
        return 0
    for why in refused:
        print(f"not scored: {why}")
    left = missing(scored)
    print(f"{sum(map(len, scored.values()))} cells scored-eligible; {len(left)} planned cells not in yet")
    if left:
        print("not in yet: " + "; ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else ""))
    if args.forecast:
        for r in held_out_forecast(scored):
            print(
                f"{r['configuration']}: forecast {r['forecast']}, measured {r['measured']}"
                + ("  CONFIDENT AND WRONG" if r["confident_wrong"] else "")
            )
    scores = score(scored)
    for h in scores:
        lo, hi = h["interval"]
        line = (
            f"{h['hypothesis']}: {h['k']} of {h['n']} configurations, p = {h['p']:.3g} against "
            f"{h['null']:.2g}, 95% interval {lo:.0%}-{hi:.0%}: {'passes' if h['passes'] else 'does not pass'}"
        )
        if h["unlearned"]:
            w = h["without_unlearned"]
            line += (
                f"; without the {len(h['unlearned'])} where DyT did not learn ({', '.join(h['unlearned'])}): "
                f"{w['k']} of {w['n']}, p = {w['p']:.3g}"
                if w["n"]
                else "; every configuration's DyT arm failed"
            )
        print(line)
    if not scores:
        print("no hypothesis scored yet: each is scored once every cell of its parts is in (the plan)")
    if args.json:
        args.json.write_text(json.dumps({"scores": scores, "refused": refused, "missing": left}, indent=1) + "\n")
    if args.csv:
        if left:
            print("not written: phase_grid_grid3.csv holds the whole grid, and some cells are not in", file=sys.stderr)
            return 1
        dest = Path(__file__).resolve().parents[1] / "satmon" / "data_files" / "phase_grid_grid3.csv"
        tmp = dest.with_suffix(".csv.tmp")
        tmp.write_text(cells_csv(scored))
        tmp.replace(dest)
        print(f"wrote {dest} ({sum(map(len, scored.values()))} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
