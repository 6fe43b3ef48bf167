"""Grid 3's scoring as its plan's amendment 1 states it (docs/plans/grid3_plan.md), written before its cells are in.

Every count is in configurations (recipe x size x passes; a configuration's outcome is the sign of the mean of its
seeds' deltas; the seeds' agreement beside it), through ``satmon.results.forecast.configurations``, the definition the
forecast and the docs use. A one-class hypothesis passes when ``k`` of its ``n`` configurations go the predicted way
with the exact one-sided binomial p against p0 = 0.5 below 0.05; ``k``, ``n``, p and the Clopper-Pearson 95% interval
are reported whether it passes or not. A cell is scored only if it records ``environment`` and its
``environment.satmon_commit`` is the amendment's commit (``--commit``); the others are listed, never scored.

    python examples/grid3_analysis.py --commit e6ab0de data/grid3            # the table (nothing is scored until
                                                                               # every cell of (a) and (c) is in)
    python examples/grid3_analysis.py --commit e6ab0de --forecast data/grid3  # the forecast held out, per configuration
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from satmon.functional.significance import binomial_tail
from satmon.results.forecast import Configuration, KnownCell, clopper_pearson, configurations, forecast

#: The amendment's parts: (folder under data/grid3, recipe, sizes, passes); (b) waits for a later amendment.
PARTS = {
    "gap": ("satmon-faithful-gpt", ("d48L2", "d64L2"), (4.5, 6.5, 9.0, 12.0)),
    "subpass": ("satmon-faithful-gpt/corpus=torch", ("d48L2", "d64L2"), (0.25, 0.5, 1.0)),
}
SEEDS = (4, 5)
#: (hypothesis, the parts it covers, the outcome it reads, the direction it predicts)
HYPOTHESES = (
    ("H5 (hurts at 4.5-12 passes)", ("gap",), "final", "hurts"),
    ("H8 (hurts below one pass)", ("subpass",), "final", "hurts"),
    ("H7 (DyT's best not below the reference's best)", ("gap", "subpass"), "best", "hurts"),
)
ALPHA = 0.05


def read_cells(root: Path, commit: str) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The scored cells of each part, and why each other cell under ``root`` is not scored."""
    scored: dict[str, list[dict[str, Any]]] = {p: [] for p in PARTS}
    refused = []
    for part in PARTS:
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


def known(part: str, cells: Sequence[dict[str, Any]]) -> list[KnownCell]:
    """A part's cells as the forecast's :class:`KnownCell` (its recipe, the configuration's first axis)."""
    recipe = PARTS[part][0]
    return [
        KnownCell(
            c["name"],
            float(c["params"]),
            float(c["epochs"]),
            float(c["delta"]),
            c["group"],
            f"grid 3 {part}",
            unique_tokens=float(c["train_tokens"]),
            best_delta=float(c["delta_best"]) if c.get("delta_best") is not None else None,
            steps=float(c["steps"]),
            warmup_steps=float(c["warmup"]),
            lr_schedule="linear-warmup-constant",
            recipe=recipe,
            family="gpt",
            alpha_init=float(c["config"]["alpha_init"]),
            optimizer="adamw",
        )
        for c in cells
    ]


def outcome(cfg: Configuration, which: str) -> str:
    d = cfg.delta if which == "final" else cfg.best_delta
    return "tie" if d is None or d == 0 else "helps" if d < 0 else "hurts"


def missing(scored: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The planned cells of (a) and (c) not yet in."""
    have = {(p, c["group"], round(float(c["epochs"]), 2), int(c["seed"])) for p, cs in scored.items() for c in cs}
    return [
        f"{p} {size} {passes:g} passes seed {s}"
        for p, (_, sizes, budgets) in PARTS.items()
        for size in sizes
        for passes in budgets
        for s in SEEDS
        if (p, size, round(passes, 2), s) not in have
    ]


def score(scored: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each hypothesis's k of n, p against p0 = 0.5, interval and whether it passes (the plan's test)."""
    out = []
    for name, parts, which, predicted in HYPOTHESES:
        cfgs = configurations([k for p in parts for k in known(p, scored[p])])
        k, n = sum(outcome(c, which) == predicted for c in cfgs), len(cfgs)
        p = binomial_tail(k, n, 0.5) if n else None
        out.append(
            {
                "hypothesis": name,
                "k": k,
                "n": n,
                "p": p,
                "interval": clopper_pearson(k, n) if n else None,
                "passes": p is not None and p < ALPHA,
                "configurations": [
                    {
                        "name": c.name,
                        "delta": c.delta,
                        "best_delta": c.best_delta,
                        "seeds": c.seeds,
                        "seeds_agree": c.seeds_agree,
                    }
                    for c in cfgs
                ],
            }
        )
    return out


def held_out_forecast(scored: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What satmon.forecast (the shipped cells only: grid 3 left out) says of each new configuration, and whether a
    confident answer was wrong (the worst outcome)."""
    rows = []
    for part, cells in scored.items():
        for cfg in configurations(known(part, cells)):
            c = cfg.cells[0]
            f = forecast(
                params=c.params,
                unique_tokens=c.unique_tokens,
                planned_tokens=c.unique_tokens * c.passes,  # type: ignore[operator]
                steps=c.steps,
                warmup_steps=c.warmup_steps,
                lr_schedule=c.lr_schedule,
                family=c.family,
                alpha_init=c.alpha_init,
                optimizer=c.optimizer,
            )
            rows.append(
                {
                    "configuration": cfg.name,
                    "forecast": f.outcome,
                    "measured": cfg.outcome,
                    "confident_wrong": f.outcome in ("hurts", "helps") and f.outcome != cfg.outcome,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="data/grid3 (its gap/ and subpass/ folders)")
    ap.add_argument("--commit", required=True, help="the amendment's commit (its first characters)")
    ap.add_argument("--forecast", action="store_true", help="the forecast held out, per configuration")
    args = ap.parse_args(argv)
    scored, refused = read_cells(args.root, args.commit)
    for why in refused:
        print(f"not scored: {why}")
    left = missing(scored)
    print(f"{sum(map(len, scored.values()))} cells scored-eligible; {len(left)} of (a) and (c) not in yet")
    if args.forecast:
        for r in held_out_forecast(scored):
            print(
                f"{r['configuration']}: forecast {r['forecast']}, measured {r['measured']}"
                + ("  CONFIDENT AND WRONG" if r["confident_wrong"] else "")
            )
    if left:
        print(
            "nothing is scored until every cell of (a) and (c) is in (the plan): "
            + "; ".join(left[:6])
            + (" ..." if len(left) > 6 else "")
        )
        return 0
    for h in score(scored):
        lo, hi = h["interval"]
        print(
            f"{h['hypothesis']}: {h['k']} of {h['n']} configurations, p = {h['p']:.3g} against p0 = 0.5, 95% "
            f"interval {lo:.0%}-{hi:.0%}: {'passes' if h['passes'] else 'does not pass'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
