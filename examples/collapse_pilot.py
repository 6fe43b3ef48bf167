"""Pilot for issue 41 (not scored): where does DyT feeding a SwiGLU gate collapse at CPU scale?

Trains ``satmon.demos.llama.LlamaLM`` (RoPE, SwiGLU, DyT in place of RMSNorm) and the RMSNorm arm from the same
initial weights on the same batches of the demo's byte corpus, over a sweep of alpha_init, peak learning rate,
depth and warm-up, and records per run the held-out loss every 100 steps, the saturation ``|alpha * x| > 2``
of the DyT layers that feed the gated MLPs (``mlp_norm``) on every step and, every 10 steps, the trap's readings
(``trap``: the largest gradient entry of the embedding and the blocks, and a DyT final norm's share of tanh at
exactly +-1; data/collapse_pilot.json predates them). Its cells are a pilot: they choose the
scored grid's configurations (docs/plans/collapse_plan.md) and are never scored.

``--final-norm`` is the DyT arm's norm before the head. ``dyt`` (the default, with ``alpha_init`` as its init) is
what data/collapse_pilot.json ran: the layout of the final-norm trap (docs/guides/faq.md), so that file's DyT
"collapses" are runs that never learned, not the gate's collapse; ``rmsnorm`` keeps an RMSNorm before the head
(``LlamaLM``'s default since the trap was found). The output records the seed, the settings, the satmon commit
and the environment (``satmon.grid.cell.environment``) in its ``pilot`` block.

    python examples/collapse_pilot.py --out /tmp/collapse_pilot.json
    python examples/collapse_pilot.py --final-norm rmsnorm --seed 7 --out /tmp/collapse_pilot_rmsnorm_final.json
    python examples/collapse_pilot.py --alphas 2,8 --lrs 3e-3 --warmups 0 --steps 200 --out /tmp/pilot_check.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from satmon.demos.corpus import corpus_tokens
from satmon.demos.llama import LlamaLM


def run(
    arm: str, cfg: dict, data: torch.Tensor, val: torch.Tensor, steps: int, seed: int, final_norm: str = "dyt"
) -> dict:
    torch.manual_seed(seed)
    norm, mlp = {"dyt": ("dyt", "swiglu"), "rmsnorm": ("rmsnorm", "swiglu"), "dyt-gelu": ("dyt", "gelu")}[arm]
    model = LlamaLM(
        d_model=cfg["d"],
        n_layers=cfg["L"],
        n_heads=4,
        seq_len=64,
        norm=norm,
        mlp=mlp,
        alpha_init=cfg["alpha"],
        final_norm=final_norm if norm == "dyt" else norm,
    )
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=cfg["lr"], betas=(0.9, 0.95)
    )
    sat = {"n": 0, "k": 0}

    def hook(mod, inp, out):
        if mod.training:
            x = inp[0].detach()
            sat["k"] += int(((mod.alpha.detach() * x).abs() > 2).sum())
            sat["n"] += x.numel()

    hooks = [b.mlp_norm.register_forward_hook(hook) for b in model.blocks] if norm == "dyt" else []
    final_in: dict[str, torch.Tensor] = {}
    final_hook = model.norm_f.register_forward_hook(lambda m, i, o: final_in.__setitem__("x", i[0].detach()))
    below = [p for n, p in model.named_parameters() if n.startswith(("tok_emb.", "blocks."))]
    g = torch.Generator().manual_seed(seed + 1000)
    curve, sat_series, trap = [], [], []
    for step in range(1, steps + 1):
        lr = cfg["lr"] * min(1.0, step / cfg["warmup"]) if cfg["warmup"] else cfg["lr"]
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, data.numel() - 65, (16,), generator=g)
        xb = torch.stack([data[i : i + 64] for i in idx.tolist()])
        yb = torch.stack([data[i + 1 : i + 65] for i in idx.tolist()])
        loss = F.cross_entropy(model(xb).reshape(-1, 256), yb.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step % 10 == 0:  # the trap's readings, before clipping: [step, max |grad| below the head, final tanh at +-1]
            alpha = getattr(model.norm_f, "alpha", None)
            trap.append(
                [
                    step,
                    max(float(p.grad.abs().max()) for p in below),
                    None
                    if alpha is None
                    else float((torch.tanh(alpha.detach() * final_in["x"]).abs() == 1).float().mean()),
                ]
            )
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if hooks and step % 10 == 0:
            sat_series.append([step, sat["k"] / max(sat["n"], 1)])
            sat.update(n=0, k=0)
        if step % 100 == 0 or step == steps:
            model.eval()
            with torch.no_grad():
                vl = F.cross_entropy(model(val[:, :-1]).reshape(-1, 256), val[:, 1:].reshape(-1)).item()
            model.train()
            curve.append([step, vl if math.isfinite(vl) else None])
    for h in [*hooks, final_hook]:
        h.remove()
    return {"arm": arm, "curve": curve, "saturation": sat_series, "trap": trap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument(
        "--seed",
        type=int,
        default=100,
        help="the models' init seed; the batches' is seed + 1000 (default 100: data/collapse_pilot.json's)",
    )
    ap.add_argument(
        "--final-norm",
        choices=("dyt", "rmsnorm"),
        default="dyt",
        help="the DyT arm's norm before the head (default dyt: data/collapse_pilot.json's, the trap's layout)",
    )
    ap.add_argument("--alphas", default="0.5,2,8", help="alpha_init values (default 0.5,2,8)")
    ap.add_argument("--lrs", default="3e-3,1e-2,3e-2", help="peak learning rates (default 3e-3,1e-2,3e-2)")
    ap.add_argument("--warmups", default="0,300", help="warm-up steps (default 0,300)")
    ap.add_argument("--depths", default="2", help="blocks at width 64 (default 2)")
    args = ap.parse_args()
    from satmon.grid.cell import environment

    torch.set_num_threads(1)
    toks = corpus_tokens(2_200_000)
    data, val = toks[:2_000_000], toks[2_000_000 : 2_000_000 + 65 * 256].view(256, 65)
    unigram = torch.bincount(data, minlength=256).double() / data.numel()
    vt = val[:, 1:].reshape(-1)
    unigram_loss = float(-(unigram[vt].clamp_min(1e-12)).log().mean())
    axes = [
        [kind(v) for v in text.split(",")]
        for kind, text in ((int, args.depths), (float, args.alphas), (float, args.lrs), (int, args.warmups))
    ]
    grid = [{"d": 64, "L": L, "alpha": a, "lr": lr, "warmup": w} for L, a, lr, w in itertools.product(*axes)]
    out = {
        "pilot": {
            "scored": False,
            "what": __doc__.split("\n\n")[0],
            "script": "examples/collapse_pilot.py",
            "seed": args.seed,
            "batch_seed": args.seed + 1000,
            "final_norm": args.final_norm,
            "settings": {
                "batch_size": 16,
                "seq_len": 64,
                "n_heads": 4,
                "optimizer": "AdamW",
                "betas": [0.9, 0.95],
                "weight_decay": "0.1 on matrices",
                "grad_clip": 1.0,
                "warmup": "linear, per config",
                "train_bytes": 2_000_000,
                "val": "256 x 65 bytes after the training bytes",
                "saturation": "|alpha * x| > 2 at every mlp_norm, every step",
            },
            "environment": environment(1, 1),
        },
        "unigram_loss": unigram_loss,
        "steps": args.steps,
        "runs": [],
    }
    for cfg in grid:
        t0 = time.time()
        arms = [
            run(a, cfg, data, val, args.steps, seed=args.seed, final_norm=args.final_norm) for a in ("rmsnorm", "dyt")
        ]
        out["runs"].append({"config": cfg, "arms": arms, "seconds": time.time() - t0})
        f = {a["arm"]: a["curve"][-1][1] for a in arms}
        print(
            json.dumps(cfg),
            {k: (round(v, 3) if v is not None else None) for k, v in f.items()},
            "sat_end",
            round(arms[1]["saturation"][-1][1], 3),
            f"{time.time() - t0:.0f}s",
            flush=True,
        )
        with open(args.out + ".tmp", "w") as fh:
            json.dump(out, fh)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
