"""The LLaMA demo's final norm: does the DyT model learn, against the all-RMSNorm model and the byte-unigram level?

Trains :class:`satmon.demos.llama.LlamaLM` as ``satmon demo --arch llama`` does (``satmon.cli.demo.LLAMA``: d64,
4 blocks, 4 heads, DyT inits 0.8 / 0.2 / 0.2; LitLM's AdamW at 3e-3 with its linear warm-up over 100 steps; the
demo's byte corpus: ``CorpusDataModule`` with 400,000 training bytes, 64-byte sequences, 16 per batch, shuffled by
the seed) in a plain loop, one configuration ("arm") at a time:

- ``dyt``: DyT block norms, RMSNorm before the head (LlamaLM's default, the demo's);
- ``rmsnorm``: RMSNorm everywhere (the reference);
- ``dyt-final``: DyT before the head too (``final_norm="dyt"``, alpha 0.2: the DyT paper's layout, the trap);
- ``dyt-final-a<X>``: the same with the final DyT's alpha at X (does a larger final alpha avoid the trap?);
- ``dyt-gelu``, ``dyt-final-gelu``: ``dyt`` and ``dyt-final`` with a non-gated GELU MLP (is the trap the gate's?).

Every ``--eval-every`` steps it records the held-out loss over the whole 40,000-byte held-out split, and on the
step's own batch: the fraction of the final DyT's tanh at exactly +-1 in float32 (a DyT final norm) and the largest
gradient entry of the token embedding and of the blocks (0.0: no gradient reaches below the head). The byte-unigram
level (add-one byte frequencies of the training split) is scored on the same held-out targets. The JSON holds the
settings, the seeds, the commit and the environment (``satmon.grid.cell.environment``).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/llama_final_norm.py --seeds 11,6 --out data/llama_final_norm.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from satmon.cli.demo import LLAMA, VAL_TOKENS, heldout_loss, unigram_loss
from satmon.demos.corpus import CorpusDataModule
from satmon.demos.lit import LitLM

ARMS = ("dyt", "rmsnorm", "dyt-final")


def arm_config(arm: str) -> dict:
    """The LlamaLM keyword arguments of an arm (on top of the demo's size and inits)."""
    if arm == "dyt":
        return {"norm": "dyt"}
    if arm == "rmsnorm":
        return {"norm": "rmsnorm"}
    if arm == "dyt-final":
        return {"norm": "dyt", "final_norm": "dyt"}
    if arm in ("dyt-gelu", "dyt-final-gelu"):
        return {**arm_config(arm[: -len("-gelu")]), "mlp": "gelu"}
    if arm.startswith("dyt-final-a"):
        return {"norm": "dyt", "final_norm": "dyt", "alpha_init_final": float(arm[len("dyt-final-a") :])}
    raise ValueError(
        f"Expected an arm among {', '.join(ARMS)}, dyt-gelu, dyt-final-gelu or dyt-final-a<alpha>, got {arm!r}."
    )


def run(arm: str, seed: int, steps: int, eval_every: int, data: CorpusDataModule, val_batches: int) -> dict:
    torch.manual_seed(seed)
    lit = LitLM(arch="llama", **{**LLAMA["model"], **arm_config(arm)}, **LLAMA["optim"])
    model = lit.model
    opt_cfg = lit.configure_optimizers()
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    data.seed = seed
    curve, trace = [[0, heldout_loss(model, data, val_batches)]], []
    step, t0 = 0, time.perf_counter()
    loader = data.train_dataloader()  # one loader, its shuffle continuing from epoch to epoch (as Lightning's)
    while step < steps:
        for x, y in loader:
            step += 1
            out = {}
            hook = model.norm_f.register_forward_hook(lambda m, i, o, out=out: out.__setitem__("x", i[0].detach()))
            loss = lit._loss((x, y))  # LitLM.training_step less its self.log (no Trainer here)
            hook.remove()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if step % eval_every == 0 or step == steps:
                below = [
                    p.grad
                    for n, p in model.named_parameters()
                    if n.startswith(("tok_emb", "blocks")) and p.grad is not None
                ]
                trace.append(
                    {
                        "step": step,
                        "train_loss": float(loss.detach()),
                        "final_tanh_at_pm1": float(
                            (torch.tanh(model.norm_f.alpha.detach() * out["x"]).abs() == 1).float().mean()
                        )
                        if model.config.final_norm == "dyt"
                        else None,
                        "max_grad_embedding": float(model.tok_emb.weight.grad.abs().max()),
                        "max_grad_blocks": float(max(g.abs().max() for g in below)),
                    }
                )
            opt.step()
            sched.step()
            if step % eval_every == 0 or step == steps:
                curve.append([step, heldout_loss(model, data, val_batches)])
            if step == steps:
                break
    return {
        "arm": arm,
        "config": arm_config(arm),
        "seed": seed,
        "val_curve": curve,
        "trace": trace,
        "final_val_loss": curve[-1][1],
        "best_val_loss": min(v for _, v in curve),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="11,6")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--eval-every", type=int, default=50)
    args = ap.parse_args()
    from satmon.grid.cell import environment

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    data = CorpusDataModule(**LLAMA["data"], val_tokens=VAL_TOKENS)
    data.setup("fit")
    val_batches = len(data.val_set) // data.batch_size  # the whole held-out split
    out = {
        "what": __doc__.split("\n\n")[0],
        "script": "benchmarks/llama_final_norm.py",
        "settings": {
            **LLAMA,
            "steps": args.steps,
            "eval_every": args.eval_every,
            "val_tokens": VAL_TOKENS,
            "val_sequences": val_batches * data.batch_size,
        },
        "environment": environment(threads, 1),
        "unigram_loss": unigram_loss(data, val_batches),
        "runs": [],
    }
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in args.arms.split(","):
            r = run(arm, seed, args.steps, args.eval_every, data, val_batches)
            out["runs"].append(r)
            print(
                f"{arm:>16} seed {seed}: held-out {r['final_val_loss']:.4f} at step {args.steps} (best "
                f"{r['best_val_loss']:.4f}; unigram {out['unigram_loss']:.4f}) {r['seconds']:.0f} s",
                flush=True,
            )
            with open(args.out + ".tmp", "w") as fh:
                json.dump(out, fh, indent=1)
            os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
