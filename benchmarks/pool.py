"""Pool earlier ``overhead.py --json`` runs and print the paired estimates of the pool.

Runs of the same code on a noisy machine each give a wide bootstrap interval; pooled, the
interval narrows. Only the configurations the paired estimates need (``off``, ``sampled`` and the
paired ones: ``paired``, ``paired-eager``, ``paired-fused``) are pooled, per model; every file must
share one ``--warmup``.

Usage::

    python benchmarks/pool.py a.json b.json c.json
    python benchmarks/overhead.py --pool a.json b.json c.json   # the same
"""

from __future__ import annotations

import argparse
import json
import sys

from stats import paired_estimate, paired_estimates, paired_lines, pool_runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/pool.py", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", metavar="JSON", help="files written by benchmarks/overhead.py --json")
    args = p.parse_args(argv)
    saved = []
    for path in args.files:
        with open(path) as f:
            saved.append((path, json.load(f)))
    try:
        pooled = pool_runs(saved)
    except ValueError as e:
        print(f"benchmarks/pool.py: {e}", file=sys.stderr)
        return 2
    print(f"# pooled paired estimates over {len(args.files)} file(s): {', '.join(args.files)}")
    for m, r in pooled.items():
        paired = ", ".join(
            f"{len(r['runs'][c])} {c} runs" for c in ("paired", "paired-eager", "paired-fused") if r["runs"][c]
        )
        print(f"- {m}: {r['files']} file(s), {paired or 'no paired runs'}, {len(r['runs']['off'])} reference runs")
    for line in paired_lines(
        {
            m: {"paired": paired_estimate(r["runs"], r["warmup"]), "paths": paired_estimates(r["runs"], r["warmup"])}
            for m, r in pooled.items()
        }
    ):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
