"""The regime study's central claim at CPU scale: does DyT help with few tokens and hurt with many?

Verma (2026) trained the same GPT-2-style model with LayerNorm and with DyT (alpha_init 2.0) on 1M
tokens (over-parameterised: DyT lowered validation loss by 27%) and on 118M tokens (data-rich: DyT
raised it by 19%), and proposed pooled DyT saturation >= 0.43 as the sign of the helpful regime.

This script runs the same experiment on a model and a corpus a CPU can handle: satmon's GPT-2-style
model with LayerNorm and with DyT (embeddings x sqrt(d_model) in both: with GPT-2's std-0.02
embeddings the DyT model stalls at the unigram level at this scale, see docs/science/regime_flip.md;
``--emb-scale 1`` restores them), trained for the same number of steps on a few tokens (repeated
for many epochs) and on many tokens (about one pass), all evaluated on one held-out split of the
embedded corpus (Python's standard library, byte-level). For the DyT runs ``SaturationMonitor``
screens the first ``min(500, steps)`` steps and gives its verdict; the end-of-training saturation
(the study's threshold was fit on end-of-training checkpoints) is measured too, by
``satmon.probe`` (the same counters), on training-split batches in eval mode.

    python examples/regime_flip.py --quick            # < 15 min on 2 cores
    python examples/regime_flip.py                    # full: longer, 3 seeds
    python examples/regime_flip.py --smoke            # seconds, for the test suite
    python examples/regime_flip.py --grid             # 18 small cells on one core: a calibration grid

Writes ``OUT/regime_flip.md`` (the table), ``OUT/regime_flip.json`` (every number) and
``OUT/regime_flip.png`` (validation loss, LayerNorm vs DyT per regime, annotated with the saturation
and the verdict; validation curves beside).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

VAL_OFFSET = 4_400_000  # the held-out split starts here in the corpus (after every training split)


@dataclass(frozen=True)
class Setup:
    """One mode's sizes (every run of a mode shares them; only the norm, the regime and the seed vary)."""

    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch_size: int
    steps: int
    few_tokens: int
    many_tokens: int
    val_tokens: int
    val_offset: int
    seeds: tuple[int, ...]
    lr: float = 3e-3
    alpha_init: float = 2.0  # the study's "canonical" DyT init
    emb_scale: float | None = None  # embedding multiplier, both norms; None: sqrt(d_model) (1.0 is GPT-2's, DyT stalls)
    weight_decay: float = 0.1
    warmup: int = 50
    evals: int = 8  # validation passes during training (the curves); the last one is at the final step
    end_batches: int = 8  # training-split batches for the end-of-training saturation


MODES = {
    "smoke": Setup(
        d_model=32,
        n_layers=1,
        n_heads=2,
        seq_len=32,
        batch_size=4,
        steps=6,
        few_tokens=2_000,
        many_tokens=20_000,
        val_tokens=2_000,
        val_offset=40_000,
        seeds=(0,),
        warmup=2,
        evals=2,
        end_batches=2,
    ),
    "quick": Setup(
        d_model=128,
        n_layers=4,
        n_heads=4,
        seq_len=128,
        batch_size=16,
        steps=800,
        few_tokens=32_768,
        many_tokens=2_000_000,
        val_tokens=65_536,
        val_offset=VAL_OFFSET,
        seeds=(0,),
    ),
    "full": Setup(
        d_model=128,
        n_layers=4,
        n_heads=4,
        seq_len=128,
        batch_size=16,
        steps=2_500,
        few_tokens=32_768,
        many_tokens=4_000_000,
        val_tokens=131_072,
        val_offset=VAL_OFFSET,
        seeds=(0, 1, 2),
        evals=10,
    ),
}
REGIMES = ("few", "many")
NORMS = ("layernorm", "dyt")


def _quiet() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    logging.getLogger("satmon").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", ".*val_check_interval.*")
    warnings.filterwarnings("ignore", ".*smaller than the logging interval.*")


def train_one(
    setup: Setup, regime: str, norm: str, seed: int, out: str, threads: int, on_end: Any = None, name: str | None = None
) -> dict[str, Any]:
    """Train one cell; return its validation losses and, for DyT, satmon's verdict and saturation.

    ``on_end(model, train_set) -> dict`` adds readings taken after training (the grid's); ``name``
    names the TensorBoard run (default ``{regime}_{norm}_s{seed}``).
    """
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader

    from satmon import SaturationMonitor, probe
    from satmon.demos.corpus import WindowDataset, corpus_tokens
    from satmon.demos.lit import LitLM

    _quiet()
    torch.set_num_threads(threads)
    pl.seed_everything(seed, verbose=False)
    n_train = setup.few_tokens if regime == "few" else setup.many_tokens
    tokens = corpus_tokens(setup.val_offset + setup.val_tokens)
    train_set = WindowDataset(tokens[:n_train], setup.seq_len)
    val_set = WindowDataset(tokens[setup.val_offset :], setup.seq_len)  # the same held-out split for every cell
    g = torch.Generator().manual_seed(seed)
    train = DataLoader(train_set, batch_size=setup.batch_size, shuffle=True, drop_last=True, generator=g)
    val = DataLoader(val_set, batch_size=64)

    model = LitLM(
        arch="gpt",
        d_model=setup.d_model,
        n_layers=setup.n_layers,
        n_heads=setup.n_heads,
        seq_len=setup.seq_len,
        norm=norm,
        alpha_init=setup.alpha_init,
        emb_scale=emb_scale(setup),
        lr=setup.lr,
        weight_decay=setup.weight_decay,
        warmup=setup.warmup,
    )

    class History(Callback):
        def __init__(self) -> None:
            self.val: list[tuple[int, float]] = []

        def on_validation_end(self, trainer, pl_module) -> None:
            if not trainer.sanity_checking:
                self.val.append((trainer.global_step, float(trainer.callback_metrics["val/loss"])))

    history = History()
    callbacks: list[Callback] = [history]
    monitor = None
    if norm == "dyt":
        monitor = SaturationMonitor(window=min(500, setup.steps), verbose=False, watch_every_n_steps=0)
        callbacks.append(monitor)
    every = max(1, setup.steps // setup.evals)
    trainer = pl.Trainer(
        max_steps=setup.steps,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=every,
        check_val_every_n_epoch=None,
        log_every_n_steps=min(50, setup.steps),
        logger=TensorBoardLogger(str(Path(out) / "tb"), name=name or f"{regime}_{norm}_s{seed}"),
    )
    t0 = time.perf_counter()
    trainer.fit(model, train, val)
    if not history.val or history.val[-1][0] != trainer.global_step:  # the final validation loss, at the last step
        trainer.validate(model, val, verbose=False)
        history.val.append((trainer.global_step, float(trainer.callback_metrics["val/loss"])))
    result: dict[str, Any] = {
        "regime": regime,
        "norm": norm,
        "seed": seed,
        "train_tokens": n_train,
        "epochs": setup.steps * setup.batch_size / len(train_set),
        "val_loss": history.val[-1][1],
        "val_loss_best": min(v for _, v in history.val),
        "val_curve": history.val,
        "seconds": time.perf_counter() - t0,
    }
    if monitor is not None and monitor.verdict is not None:
        v = monitor.verdict
        result.update(
            saturation=v.saturation, decision=v.decision, margin=v.margin, window=v.window, per_layer=v.per_layer
        )
        # End-of-training saturation (study protocol: training split, eval mode) by satmon.probe, the
        # live window's counters; only the inputs of each (input, target) batch are fed.
        loader = DataLoader(train_set, batch_size=setup.batch_size)
        result["saturation_end"] = probe(model, [x for _, (x, _) in zip(range(setup.end_batches), loader)]).saturation
    if on_end is not None:
        result.update(on_end(model, train_set))
    return result


def _run_all(setup: Setup, out: str, jobs: int) -> list[dict[str, Any]]:
    cells = [(r, n, s) for s in setup.seeds for r in REGIMES for n in NORMS]
    cores = os.cpu_count() or 1
    if jobs <= 1:
        results = []
        for r, n, s in cells:
            results.append(train_one(setup, r, n, s, out, max(1, cores)))
            _progress(results[-1])
        return results
    threads = max(1, cores // jobs)
    # the many-token runs are slower per step (data); start the slow ones first
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(train_one, setup, r, n, s, out, threads) for r, n, s in cells]
        results = []
        for f in futures:
            results.append(f.result())
            _progress(results[-1])
    return results


def _progress(r: dict[str, Any]) -> None:
    sat = f", saturation {r['saturation']:.3f} ({r['decision'].upper()})" if "saturation" in r else ""
    print(
        f"  {r['regime']:>4} {r['norm']:<9} seed {r['seed']}: val loss "
        f"{r['val_loss']:.4f}{sat}  [{r['seconds']:.0f} s]",
        file=sys.stderr,
        flush=True,
    )


def unigram_loss(setup: Setup, n_train: int) -> float:
    """Validation loss of a unigram model (add-one byte frequencies of the training split): the level
    a model reaches when it ignores the context; a run stuck there has learnt nothing else."""
    import torch

    from satmon.demos.corpus import corpus_tokens

    tokens = corpus_tokens(setup.val_offset + setup.val_tokens)
    p = torch.bincount(tokens[:n_train], minlength=256).double() + 1.0
    return float(-(p / p.sum()).log()[tokens[setup.val_offset :]].mean())


def summarise(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per regime: mean val loss of each norm over seeds, DyT's relative change, saturation, verdicts."""
    out: dict[str, dict[str, Any]] = {}
    for regime in REGIMES:
        cell = {n: [r for r in results if r["regime"] == regime and r["norm"] == n] for n in NORMS}
        mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
        ln, dyt = mean(cell["layernorm"], "val_loss"), mean(cell["dyt"], "val_loss")
        decisions = [r.get("decision", "n/a") for r in cell["dyt"]]
        out[regime] = {
            "train_tokens": cell["dyt"][0]["train_tokens"],
            "epochs": cell["dyt"][0]["epochs"],
            "seeds": len(cell["dyt"]),
            "ln": ln,
            "dyt": dyt,
            "ln_best": mean(cell["layernorm"], "val_loss_best"),
            "dyt_best": mean(cell["dyt"], "val_loss_best"),
            "change": (dyt - ln) / ln,
            "per_seed_change": [
                (d["val_loss"] - l["val_loss"]) / l["val_loss"] for l, d in zip(cell["layernorm"], cell["dyt"])
            ],
            "saturation": mean(cell["dyt"], "saturation")
            if all("saturation" in r for r in cell["dyt"])
            else float("nan"),
            "saturation_end": mean(cell["dyt"], "saturation_end")
            if all("saturation_end" in r for r in cell["dyt"])
            else float("nan"),
            "decisions": decisions,
            "decision": max(set(decisions), key=decisions.count),
        }
        s = out[regime]
        s["dyt_helped"] = s["change"] < 0
        s["verdict_right"] = (s["decision"] == "go") == s["dyt_helped"]
    return out


def emb_scale(setup: Setup) -> float:
    """The embedding multiplier of every run of ``setup`` (LayerNorm and DyT alike)."""
    return math.sqrt(setup.d_model) if setup.emb_scale is None else setup.emb_scale


def markdown(summary: dict[str, dict[str, Any]], setup: Setup, mode: str, command: str) -> str:
    lines = [
        f"Mode `{mode}`: GPT-2-style d={setup.d_model}, {setup.n_layers} blocks, seq {setup.seq_len}, batch "
        f"{setup.batch_size}, {setup.steps} steps, AdamW lr {setup.lr:g} (warm-up {setup.warmup}), weight decay "
        f"{setup.weight_decay:g}, DyT alpha_init {setup.alpha_init:g}, embeddings x {emb_scale(setup):g}, seeds "
        f"{list(setup.seeds)}; validation: the same "
        f"{setup.val_tokens:,} held-out tokens for every run. Command: `{command}`",
        "",
        "| regime | train tokens | epochs | val loss LN | val loss DyT | DyT vs LN | best val LN / DyT | "
        "satmon saturation (window) | verdict | saturation (end) | verdict called it |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for regime, s in summary.items():
        name = "few tokens (over-parameterised)" if regime == "few" else "many tokens (data-rich)"
        lines.append(
            f"| {name} | {s['train_tokens']:,} | {s['epochs']:.1f} | {s['ln']:.4f} | {s['dyt']:.4f} | "
            f"{s['change'] * 100:+.1f}% | "
            f"{s['ln_best']:.4f} / {s['dyt_best']:.4f} | {s['saturation']:.4f} | {s['decision'].upper()} | "
            f"{s['saturation_end']:.4f} | {'yes' if s['verdict_right'] else 'no'} |"
        )
    few, many = summary["few"], summary["many"]
    flips = few["dyt_helped"] and not many["dyt_helped"]
    lines += [
        "",
        f"Reference: a unigram model (byte frequencies of the training split, no context) scores "
        f"{few.get('unigram', float('nan')):.4f} (few) / {many.get('unigram', float('nan')):.4f} (many) on "
        "the same validation split.",
        "",
        f"Sign flip (DyT better with few tokens, worse with many): **{'yes' if flips else 'no'}** "
        f"(few: {few['change'] * 100:+.1f}%, many: {many['change'] * 100:+.1f}%; study at 64M "
        "parameters: -27.3% / +18.8%).",
        f"Verdict direction right in {sum(s['verdict_right'] for s in summary.values())} of {len(summary)} regimes "
        f"(GO should mean DyT helped). Saturation ordering few > many: "
        f"**{'yes' if few['saturation'] > many['saturation'] else 'no'}** "
        f"({few['saturation']:.4f} vs {many['saturation']:.4f}; study: 0.4931 vs 0.2343).",
    ]
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.3]})
    width = 0.36
    colors = {"layernorm": "#4c72b0", "dyt": "#dd8452"}
    for i, regime in enumerate(REGIMES):
        s = summary[regime]
        for j, (norm, key) in enumerate((("layernorm", "ln"), ("dyt", "dyt"))):
            x = i + (j - 0.5) * width
            ax.bar(
                x,
                s[key],
                width,
                color=colors[norm],
                label=("LayerNorm" if norm == "layernorm" else "DyT") if i == 0 else None,
            )
            ax.text(x, s[key], f"{s[key]:.3f}", ha="center", va="bottom", fontsize=8)
        ax.annotate(
            f"DyT {s['change'] * 100:+.1f}%\nsat {s['saturation']:.3f} -> {s['decision'].upper()}\n"
            f"({'right' if s['verdict_right'] else 'wrong'} direction)",
            xy=(i, max(s["ln"], s["dyt"])),
            xytext=(0, 22),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    lo = min(min(s["ln"], s["dyt"]) for s in summary.values())
    hi = max(max(s["ln"], s["dyt"]) for s in summary.values())
    ax.set_ylim(max(0.0, lo - 0.35 * (hi - lo + 0.1)), hi + 0.6 * (hi - lo + 0.1))
    ax.set_xticks(
        range(len(REGIMES)),
        [f"few tokens\n{summary['few']['train_tokens']:,}", f"many tokens\n{summary['many']['train_tokens']:,}"],
    )
    ax.set_ylabel("final validation loss (held-out, nats/byte)")
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    ax.set_title("LayerNorm vs DyT per regime", fontsize=10)
    for r in results:
        steps, vals = zip(*r["val_curve"])
        ls = "-" if r["regime"] == "few" else "--"
        ax2.plot(
            steps,
            vals,
            ls,
            color=colors[r["norm"]],
            alpha=0.85,
            label=f"{r['regime']} / {'LN' if r['norm'] == 'layernorm' else 'DyT'}"
            if r["seed"] == results[0]["seed"]
            else None,
        )
    if "unigram" in summary["many"]:
        ax2.axhline(summary["many"]["unigram"], color="gray", ls=":", lw=1, label="unigram model (no context)")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("validation loss")
    ax2.set_title("validation curves (solid: few tokens, dashed: many)", fontsize=10)
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="one seed, 800 steps: under 15 minutes on 2 cores")
    mode.add_argument("--smoke", action="store_true", help="a few steps on tiny sizes: the test suite's check")
    p.add_argument(
        "--grid",
        action="store_true",
        help="the calibration grid (3 widths x 3 token budgets x 2 seeds, one thread; see regime_flip_grid.py); "
        "with --smoke: a tiny one",
    )
    p.add_argument("--out", default="regime_flip_out", help="output directory (default ./regime_flip_out)")
    p.add_argument("--steps", type=int, default=None, help="override the mode's step count")
    p.add_argument("--seeds", default=None, help="override the mode's seeds, e.g. 0,1,2")
    p.add_argument("--few-tokens", type=int, default=None, help="override the few-token training split size")
    p.add_argument("--lr", type=float, default=None, help="override the learning rate (default 3e-3)")
    p.add_argument(
        "--alpha-init", type=float, default=None, help="override DyT's alpha_init (default 2.0, the study's)"
    )
    p.add_argument(
        "--emb-scale",
        type=float,
        default=None,
        help="multiply token + position embeddings by this, both norms (default sqrt(d_model); 1 is GPT-2's)",
    )
    p.add_argument(
        "--jobs", type=int, default=None, help="parallel training processes (default: 2 when >= 2 cores; smoke: 1)"
    )
    args = p.parse_args(argv)
    _quiet()
    if args.grid:
        if args.quick:
            p.error("--grid takes --smoke (a tiny grid) or nothing, not --quick")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import regime_flip_grid  # beside this file

        command = "python examples/regime_flip.py " + " ".join(argv if argv is not None else sys.argv[1:])
        return regime_flip_grid.main(sys.modules[__name__], args.smoke, Path(args.out), command)
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    setup = MODES[name]
    if args.steps:
        setup = replace(setup, steps=args.steps)
    if args.seeds:
        setup = replace(setup, seeds=tuple(int(s) for s in args.seeds.split(",")))
    if args.few_tokens:
        setup = replace(setup, few_tokens=args.few_tokens)
    if args.lr:
        setup = replace(setup, lr=args.lr)
    if args.alpha_init:
        setup = replace(setup, alpha_init=args.alpha_init)
    if args.emb_scale is not None:
        if not args.emb_scale > 0:
            p.error(f"expected --emb-scale > 0, got {args.emb_scale}")
        setup = replace(setup, emb_scale=args.emb_scale)
    jobs = args.jobs or (1 if args.smoke else min(2, os.cpu_count() or 1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python examples/regime_flip.py " + " ".join(argv if argv is not None else sys.argv[1:])
    runs = len(setup.seeds) * len(REGIMES) * len(NORMS)
    print(
        f"regime_flip ({name}): {runs} runs of {setup.steps} steps, {jobs} at a time ...", file=sys.stderr, flush=True
    )
    t0 = time.perf_counter()
    results = _run_all(setup, str(out), jobs)
    summary = summarise(results)
    for regime in REGIMES:
        summary[regime]["unigram"] = unigram_loss(setup, summary[regime]["train_tokens"])
    table = markdown(summary, setup, name, command)
    took = time.perf_counter() - t0
    print(table)
    print(
        f"\n{runs} runs in {took / 60:.1f} min. Outputs: {out / 'regime_flip.md'}, {out / 'regime_flip.png'}, "
        f"{out / 'regime_flip.json'}; TensorBoard: tensorboard --logdir {out / 'tb'}"
    )
    (out / "regime_flip.md").write_text(table + "\n")
    (out / "regime_flip.json").write_text(
        json.dumps(
            {
                "mode": name,
                "setup": asdict(setup),
                "command": command,
                "minutes": took / 60,
                "summary": summary,
                "runs": results,
            },
            indent=1,
        )
    )
    plot(
        summary,
        results,
        out / "regime_flip.png",
        f"regime_flip ({name}): d={setup.d_model}, {setup.n_layers} blocks, {setup.steps} steps, "
        f"{len(setup.seeds)} seed(s); satmon window {min(500, setup.steps)} steps, threshold 0.43",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
