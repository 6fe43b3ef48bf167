"""Pilot 2 for the collapse grid (issue 49; not scored): which LLaMA configurations never learn, learn then lose it, or
stay healthy, so that the scored grid samples each outcome in several configurations.

Runs ``satmon grid llama``'s own code (the recipe :data:`satmon.grid.builtin_llama.RECIPE`, the grid's loop
:func:`satmon.grid.train.train_arm`: AdamW, linear warm-up then constant, clipping 1.0, the DyT arm screened by
``satmon.Screen`` with the shipped watch defaults, every watch check recorded) on short runs. Unlike the grid, the
RMSNorm reference arm is trained once per (size, peak lr) and shared by every DyT arm of that size and lr (it does
not depend on ``alpha_init`` or the DyT arm's final norm: same seed, same batches, same weights), to halve the cost
on a loaded 2-core machine. Every 10 steps, after the optimizer step, it also records the largest gradient entry
below the head (the embedding and every block: exactly 0 in the final-norm trap).

Each arm is written to ``--out`` as soon as it finishes (atomically: the file is replaced only by a complete one);
a rerun with the same ``--out`` skips the arms already there, so a stopped pilot resumes. The file's ``pilot`` block
records that it is a pilot (never scored), the seed and the settings, and per start of the script (``runs``) the
commit and the environment; each arm's ``run`` says which start made it.

    python examples/collapse_pilot2.py --out data/collapse_pilot2.json
    python examples/collapse_pilot2.py --sizes d16L1 --lrs 1e-2 --alphas 8 --final-norms rmsnorm --steps 12 \\
        --window 4 --warmup 3 --out /tmp/pilot2_check.json --tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

#: The pilot's sizes: the issue's trial (d64L4) and the smallest.
SIZES = ("d64L2", "d64L4")


def default_plan(sizes: list[str], lrs: list[float]) -> list[tuple[str, float, str, str, str]]:
    """The pilot's arms in the order they run, the most informative first (a pilot stopped early has them; every arm
    costs minutes on the loaded machine): the issue's learned-then-lost candidate (RMSNorm before the head,
    alpha_init 8) at the first two lrs on both sizes; alpha_init 2 on the larger size, the trap's layout (DyT before
    the head, alpha_init 2) on the smaller, the GELU control (alpha_init 8) on the larger, at the first lr; alpha_init 8
    at the third lr; then the rest (alpha_init 4, 2 and the paper's inits, both sizes, every lr)."""
    small, big = sizes[0], sizes[-1]
    first = [(small, lrs[0], "dyt", "rmsnorm", "8"), (big, lrs[0], "dyt", "rmsnorm", "8")]
    first += [(size, lr, "dyt", "rmsnorm", "8") for lr in lrs[1:2] for size in sizes]
    first += [
        (big, lrs[0], "dyt", "rmsnorm", "2"),
        (small, lrs[0], "dyt", "dyt", "2"),
        (big, lrs[0], "dyt-gelu", "rmsnorm", "8"),
    ]
    first += [(size, lr, "dyt", "rmsnorm", "8") for lr in lrs[2:] for size in sizes]
    rest = [
        (size, lr, arm, fn, a)
        for lr in lrs
        for size in sizes
        for arm, fn, a in (
            ("dyt", "rmsnorm", "4"),
            ("dyt", "rmsnorm", "2"),
            ("dyt", "dyt", "2"),
            ("dyt-gelu", "rmsnorm", "8"),
            ("dyt", "rmsnorm", "paper"),
        )
    ]
    return first + [r for r in rest if r not in first]


def arm_key(size: str, lr: float, arm: str, final_norm: str, alpha: str) -> str:
    """The arm's key in the output file (reference arms: ``arm="rmsnorm"``, final norm and alpha ``-``)."""
    return f"{size}|lr{lr:g}|{arm}|final_{final_norm}|alpha_{alpha}"


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _save(path: str, out: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh)
    os.replace(tmp, path)


def _finite(v: Any) -> Any:
    return v if not isinstance(v, float) or math.isfinite(v) else None


def run_arm(settings: Any, spec: Any, data: Any, arm: str, same_start: Any = None) -> dict[str, Any]:
    """One arm through the grid's loop; its record (curves, the window's verdict, the
    watch, the reach below the head)."""
    import torch

    from satmon.grid.builtin_llama import RECIPE
    from satmon.grid.train import train_arm

    reach: list[list[Any]] = []

    def on_step(step: int, model: Any) -> None:
        if step % 10 == 0:  # grads of this step (after clipping: a common scale; exactly 0 stays 0)
            below = [
                p.grad
                for n, p in model.named_parameters()
                if n.startswith(("tok_emb.", "blocks.")) and p.grad is not None
            ]
            head = model.lm_head.weight.grad
            reach.append(
                [
                    step,
                    max(float(g.abs().max()) for g in below) if below else None,
                    None if head is None else float(head.abs().max()),
                ]
            )

    t0 = time.time()
    with torch.random.fork_rng():
        r = train_arm(settings, RECIPE, spec, data, arm, on_step=on_step, same_start=same_start, reference="rmsnorm")
    rec: dict[str, Any] = {
        "val_curve": [[s, _finite(v)] for s, v in r["val_curve"]],
        "train_curve": [[s, _finite(v)] for s, v in r["train_curve"]],
        "reach": reach,
        "seconds": time.time() - t0,
    }
    if "watch" in r:
        v = r["verdict"]
        rec["watch"] = r["watch"]
        rec["window"] = {
            "decision": str(getattr(v, "decision", None)),
            "saturation": _finite(float(v.saturation)),
            "collapse_risk": bool(getattr(v, "collapse_risk", False)),
        }
        rec["final_alpha"] = {k: _finite(a) for k, a in r["alpha_curve"][-1][1].items()} if r["alpha_curve"] else {}
    return {"record": rec, "start": r["start"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--lrs", default="1e-2,3e-2,3e-3", help="peak learning rates (default 1e-2,3e-2,3e-3)")
    ap.add_argument("--alphas", default=None, help="only these alpha_init values (default: the plan's)")
    ap.add_argument("--final-norms", default=None, help="only these final norms (default: the plan's)")
    ap.add_argument("--seed", type=int, default=31, help="the cell's seed (default 31: used by no grid)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--tiny", action="store_true", help="the recipe's smoke options (a check of this script)")
    args = ap.parse_args()

    import torch

    from satmon.grid.builtin_llama import PRESETS, RECIPE
    from satmon.grid.cell import code_version, environment, make_spec
    from satmon.grid.config import GridSettings, parse_budgets

    torch.set_num_threads(1)
    lrs = [float(x) for x in args.lrs.split(",")]
    plan = default_plan(args.sizes.split(","), lrs)
    if args.alphas:
        plan = [p for p in plan if p[4] in args.alphas.split(",")]
    if args.final_norms:
        plan = [p for p in plan if p[3] in args.final_norms.split(",")]
    out = _load(args.out) or {}
    base_opts = dict(PRESETS["smoke"]["options"]) if args.tiny else {}
    pilot = {
        "scored": False,
        "what": __doc__.split("\n\n")[0],
        "script": "examples/collapse_pilot2.py",
        "recipe": f"{RECIPE.name} version {RECIPE.version}",
        "seed": args.seed,
        "budget": "1ep",
        "settings": {
            "steps": args.steps,
            "window": args.window,
            "warmup": args.warmup,
            "eval_every": args.eval_every,
            "lrs": lrs,
            "options": {**RECIPE.options, **base_opts},
        },
        "reference_shared": "the RMSNorm arm is trained once per (size, lr) and shared by the DyT arms",
        "reach": "[step, max |grad| over tok_emb and blocks, max |grad| of lm_head], after clipping, every 10 steps",
    }
    if out.get("pilot", {}).get("settings") not in (None, pilot["settings"]) or out.get("pilot", {}).get(
        "seed"
    ) not in (None, args.seed):
        raise SystemExit(f"Expected {args.out} to hold this pilot's settings, got other ones: use another --out.")
    out.setdefault("pilot", pilot)
    out["pilot"].setdefault("runs", [])
    out["pilot"]["runs"].append(
        {
            "commit": code_version(),
            "environment": environment(1, 1),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    out.setdefault("arms", {})
    for size, lr, arm, final_norm, alpha in plan:
        key = arm_key(size, lr, arm, final_norm, alpha)
        if key in out["arms"]:
            continue
        settings = GridSettings(
            steps=args.steps,
            window=args.window,
            warmup=args.warmup,
            lr=lr,
            eval_every=args.eval_every,
            series_every=10,
            offset_every=10,
        )
        opts = RECIPE.options_with({**base_opts, "alpha_init": alpha, "final_norm": final_norm})
        if args.tiny:
            opts["n_heads"] = 2
        spec = make_spec(RECIPE, settings, opts, size, parse_budgets("1ep")[0], args.seed)
        data = RECIPE.data(spec)
        out.setdefault("unigram_loss", data.unigram_loss)
        ref_key = arm_key(size, lr, "rmsnorm", "-", "-")
        if ref_key not in out["arms"]:
            ref = run_arm(settings, spec, data, "rmsnorm")
            out["arms"][ref_key] = {
                "size": size,
                "lr": lr,
                "arm": "rmsnorm",
                "final_norm": "-",
                "alpha_init": "-",
                "run": len(out["pilot"]["runs"]) - 1,
                **ref["record"],
            }
            _save(args.out, out)
        start = {k: v.detach().clone() for k, v in RECIPE.model(spec, "rmsnorm").state_dict().items()}
        r = run_arm(settings, spec, data, arm, same_start=start)
        out["arms"][key] = {
            "size": size,
            "lr": lr,
            "arm": arm,
            "final_norm": final_norm,
            "alpha_init": alpha,
            "run": len(out["pilot"]["runs"]) - 1,
            **r["record"],
        }
        _save(args.out, out)
        c = [v for _, v in r["record"]["val_curve"] if v is not None]
        print(
            key,
            "best",
            round(min(c), 3) if c else None,
            "last",
            c[-1] if c else None,
            "x_unigram",
            round(min(c) / out["unigram_loss"], 3) if c else None,
            "flag",
            r["record"].get("watch", {}).get("first_flag_step"),
            f"{r['record']['seconds']:.0f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
