"""``satmon demo``: train a small GPT-2-style DyT model on the embedded corpus for the screening window,
on CPU, and print the verdict card beside the validation loss at the start and the end, so that the
verdict is read next to whether the run learned.

The default model draws its token embedding (tied with the output head) at std d_model ** -0.5 and
trains. ``--stalled`` keeps GPT-2's std 0.02: that model stalls near the byte-frequency level while
its deep DyT layers saturate on a constant offset, and the study's rule still says GO (docs/guides/faq.md).

``--arch llama`` trains satmon's LLaMA-style model (RoPE, SwiGLU: DyT feeds gated MLPs) with DyT block
norms and RMSNorm before the head (:data:`LLAMA`), past the window so the collapse watch checks it.
``--final-norm dyt`` puts DyT before the head too (the DyT paper's layout): that model is trapped at the
byte-frequency level (the final DyT saturates on an offset and no gradient reaches below the head;
docs/guides/faq.md).

Every flag is checked before anything is built or trained (exit 2, one usage line and one error line);
the help text is :data:`DESCRIPTION` and :data:`EPILOG` (plain text)."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from typing import Any

from satmon import study
from satmon.cli.main import EXIT_USAGE, command, fraction, integer, usage_exit
from satmon.cli.progress import say

__all__ = ["EXIT_NO_VERDICT", "EXIT_OK", "EXIT_USAGE", "main", "run_demo"]

EXIT_OK, EXIT_NO_VERDICT = 0, 1
#: held-out batches scored at the start and at the end (the same ones Lightning's validation reads)
VAL_BATCHES = 8
#: the demo model's attention heads (d_model must be a multiple) and held-out split (tokens after the training split)
N_HEADS, VAL_TOKENS = 4, 40_000
#: ``satmon demo --arch llama``'s model, optimizer and data (benchmarks/llama_final_norm.py measures this recipe)
LLAMA: dict[str, dict[str, Any]] = {
    "model": {"d_model": 64, "n_layers": 4, "n_heads": N_HEADS, "seq_len": 64, "mlp": "swiglu"},
    "optim": {"lr": 3e-3, "warmup": 100},
    "data": {"seq_len": 64, "batch_size": 16, "train_tokens": 400_000},
}
#: the LLaMA demo's steps after the window by default: the collapse watch measures the step after every 50th
#: (551 and 601 after a 500-step window, and 501 right after the verdict)
LLAMA_WATCH_STEPS = 101
#: --checkpoint-every's default: five checkpoints over the 500-step window, for satmon replay
CHECKPOINT_EVERY = 100

DESCRIPTION = """\
Train a small GPT-2-style DyT model on the embedded corpus (Python's standard library) for the
screening window, on CPU, and print the verdict card beside the validation loss at the start and the
end, so that the verdict is read next to whether the run learned.

The default model draws its token embedding (tied with the output head) at std d_model ** -0.5 and
trains. --stalled keeps GPT-2's std 0.02: that model stalls near the byte-frequency level while its
deep DyT layers saturate on a constant offset, and the study's rule still says GO (docs/guides/faq.md).

--arch llama trains a LLaMA-style model (RoPE, SwiGLU: DyT feeds gated MLPs; 4 blocks, DyT block
norms, RMSNorm before the head) for the window and 101 steps more, so the collapse watch checks it
(at steps 501, 551 and 601 with the default window). --final-norm dyt puts DyT before the head too
(the DyT paper's layout): that model is trapped at the byte-frequency level, its final DyT saturated
and no gradient below the head (docs/guides/faq.md)."""

EPILOG = """\
outputs: a TensorBoard run LOGDIR/demo/version_N (LOGDIR/demo_stalled/... with --stalled, LOGDIR/demo_llama/...
with --arch llama, LOGDIR/demo_llama_final_dyt/... with --arch llama --final-norm dyt); read it with
satmon report, or tensorboard --logdir LOGDIR. Its checkpoints, every --checkpoint-every steps and the
last step, all kept, are in LOGDIR/demo/version_N/checkpoints/epoch=E-step=S.ckpt: satmon replay reads
them. version_N is claimed by one mkdir: two demos into one LOGDIR get two runs.

exit codes: 0 verdict printed, 1 no verdict (training stopped before any step was counted),
2 usage error (a flag out of range, an unwritable --logdir or one with no room for the run's files
beneath it: nothing built or trained),
130 interrupted (Ctrl-C)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="satmon demo", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--window", type=integer(1), default=500, help="screening window in optimizer steps (default 500)")
    p.add_argument(
        "--steps",
        type=integer(1),
        default=None,
        help="total training steps, at least the window (default: the "
        f"window; --arch llama: the window + {LLAMA_WATCH_STEPS}, so that the collapse watch checks the run)",
    )
    p.add_argument(
        "--threshold",
        type=fraction,
        default=None,
        help=f"GO threshold on pooled saturation, in (0, 1) (default: the study's, {study.THRESHOLD:g}; a "
        "threshold given is yours, even that number)",
    )
    p.add_argument("--logdir", default="satmon_logs", help="TensorBoard root (default ./satmon_logs)")
    p.add_argument(
        "--arch",
        choices=("gpt", "llama"),
        default="gpt",
        help="gpt (default): GPT-2-style, GELU MLP; llama: RoPE, SwiGLU (DyT feeds gated MLPs), 4 blocks",
    )
    p.add_argument(
        "--final-norm",
        choices=("rmsnorm", "dyt"),
        default=None,
        help="--arch llama only: the norm before the head (default rmsnorm: the model learns; dyt: the DyT "
        "paper's layout, trapped at the byte-frequency level, docs/guides/faq.md)",
    )
    p.add_argument(
        "--stalled",
        action="store_true",
        help="GPT-2's embedding init (std 0.02, 0.1's demo): the model "
        "stalls and saturates on a constant offset; the example of offset-driven saturation",
    )
    p.add_argument(
        "--d-model",
        type=integer(N_HEADS),
        default=64,
        help=f"model width, a multiple of {N_HEADS} (the attention heads; of {2 * N_HEADS} with --arch llama) "
        "(default 64)",
    )
    p.add_argument("--layers", type=integer(1), default=None, help="transformer blocks (default 2; --arch llama: 4)")
    p.add_argument("--batch-size", type=integer(1), default=16, help="sequences per optimizer step (default 16)")
    p.add_argument(
        "--seq-len", type=integer(1, VAL_TOKENS - 1), default=64, help="tokens (bytes) per sequence (default 64)"
    )
    p.add_argument(
        "--train-tokens",
        type=integer(2),
        default=400_000,
        help="size of the training split of the embedded corpus, in bytes (default 400000)",
    )
    p.add_argument(
        "--seed", type=integer(0, 2**32 - 1), default=0, help="random seed of the model and the data order (default 0)"
    )
    p.add_argument(
        "--checkpoint-every",
        type=integer(0),
        default=CHECKPOINT_EVERY,
        help=f"save a checkpoint every N optimizer steps and at the last step, all kept (default "
        f"{CHECKPOINT_EVERY}; 0: the last step only)",
    )
    p.add_argument(
        "--threads",
        type=integer(1, os.cpu_count() or 1),
        default=None,
        help="CPU threads, at most the machine's CPUs (default: $OMP_NUM_THREADS, else every core)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress output (the first line and the results are still printed)"
    )
    return p


def _corpus_bytes() -> int:
    """Bytes of the embedded corpus: the standard library's top-level ``*.py`` files, which
    :func:`satmon.demos.corpus.corpus_tokens` reads (sizes only: nothing is read here)."""
    return sum(f.stat().st_size for f in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What one flag's range cannot say, checked before anything is built (``p.error``: usage error, exit 2); the
    output paths last (:class:`_PathRefused`: one line, exit 2)."""
    if args.arch == "llama" and args.stalled:
        p.error(
            "expected --stalled with --arch gpt only (it sets the GPT model's embedding init), got --arch llama: "
            "for the LLaMA model's stalled run pass --final-norm dyt"
        )
    if args.arch == "gpt" and args.final_norm is not None:
        p.error(f"expected --final-norm with --arch llama only, got --final-norm {args.final_norm} with --arch gpt")
    if args.layers is None:
        args.layers = LLAMA["model"]["n_layers"] if args.arch == "llama" else 2
    if args.steps is not None and args.steps < args.window:
        p.error(f"expected --steps >= --window ({args.window}) so that the screening window ends, got {args.steps}")
    if args.d_model % N_HEADS:
        p.error(f"expected --d-model to be a multiple of {N_HEADS} (the attention heads), got {args.d_model}")
    if args.arch == "llama" and (args.d_model // N_HEADS) % 2:
        p.error(
            f"expected --d-model to be a multiple of {2 * N_HEADS} with --arch llama (RoPE rotates pairs in each of "
            f"the {N_HEADS} heads), got {args.d_model}"
        )
    windows = (args.train_tokens - 1) // args.seq_len
    if windows < args.batch_size:
        p.error(
            f"expected --train-tokens of at least {args.batch_size * args.seq_len + 1} (one batch of "
            f"{args.batch_size} x {args.seq_len}-token sequences), got {args.train_tokens}"
        )
    available = _corpus_bytes() - VAL_TOKENS
    if args.train_tokens > available:
        p.error(
            f"expected --train-tokens <= {available} (the embedded corpus less its {VAL_TOKENS}-byte held-out "
            f"split), got {args.train_tokens}"
        )
    _check_logdir(args)


class _PathRefused(ValueError):
    """An output path the demo cannot write: said in one line (no usage block: the flag's syntax is not the problem)."""


def _writes(args: argparse.Namespace) -> list[str]:
    """The deepest paths the demo writes under ``--logdir``, at their longest (``satmon.paths.check_room``): the
    version folder, TensorBoard's event file, the checkpoints, Lightning's ``hparams.yaml``, satmon's card files and
    calibration batches (each with the temporary and lock satmon writes beside it)."""
    from satmon.paths import CALIBRATION_FILE, beside, event_file

    run = Path(args.logdir) / _run_name(args)
    version = run / f"version_{'9' * max(len(str(_next_version(run))), 4)}"
    steps = args.steps or args.window
    files = [
        version / "checkpoints" / f"epoch={steps}-step={steps}.ckpt",
        *(version / n for n in ("hparams.yaml", "satmon_verdict.md", "satmon_stop.md", CALIBRATION_FILE)),
    ]
    return [event_file(version), *(w for f in files for w in (str(f), *beside(f)))]


def _check_logdir(args: argparse.Namespace) -> None:
    """``--logdir`` and what the demo writes beneath it, before anything is built (:class:`_PathRefused`)."""
    from satmon.io.atomic import OutputError, check_output_dir
    from satmon.paths import kind_phrase

    if os.path.expandvars(args.logdir) != args.logdir:  # Lightning's TensorBoardLogger would write elsewhere
        raise _PathRefused(
            f"expected --logdir without a $VARIABLE (the TensorBoard logger expands it, so the run would go "
            f"to {os.path.expandvars(args.logdir)!r}), got {args.logdir!r}: let the shell expand it "
            "(unquoted) or rename the folder"
        )
    try:
        check_output_dir(args.logdir, "--logdir", _writes(args))
        run = Path(args.logdir) / _run_name(args)
        check_output_dir(run, "--logdir's run folder")
        version = run / f"version_{_next_version(run)}"
        if os.path.lexists(version) and not version.is_dir():
            raise _PathRefused(
                f"expected {str(version)!r} to be free for the run's TensorBoard folder (the next "
                f"version_N), got {kind_phrase(version)} there: move it away or pass another --logdir"
            )
    except OutputError as e:
        raise _PathRefused(str(e)) from None


def _next_version(run: Path) -> int:
    """The ``version_N`` folder Lightning's TensorBoardLogger picks next under ``run`` (one past its highest folder)."""
    try:
        found = [
            int(e.name[8:])
            for e in os.scandir(run)
            if e.name.startswith("version_") and e.name[8:].isdigit() and e.is_dir()
        ]
    except OSError:
        return 0
    return max(found) + 1 if found else 0


def _run_name(args: argparse.Namespace) -> str:
    if args.arch == "llama":
        return "demo_llama_final_dyt" if args.final_norm == "dyt" else "demo_llama"
    return "demo_stalled" if args.stalled else "demo"


def _steps(args: argparse.Namespace) -> int:
    """Optimizer steps to train: ``--steps``, else the window (GPT) or the window and
    :data:`LLAMA_WATCH_STEPS` (LLaMA)."""
    return args.steps or args.window + (LLAMA_WATCH_STEPS if args.arch == "llama" else 0)


def _model(args: argparse.Namespace):
    """The demo's LitLM: the GPT recipe, or the LLaMA one (:data:`LLAMA`) with ``--final-norm``."""
    from satmon.demos.lit import LitLM

    if args.arch == "llama":
        config = {**LLAMA["model"], "d_model": args.d_model, "n_layers": args.layers, "seq_len": args.seq_len}
        return LitLM(arch="llama", **config, norm="dyt", final_norm=args.final_norm or "rmsnorm", **LLAMA["optim"])
    return LitLM(
        arch="gpt",
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=N_HEADS,
        seq_len=args.seq_len,
        norm="dyt",
        alpha_init=2.0,
        emb_std=_emb_std(args),
        lr=3e-3,
        warmup=50,
    )


def _emb_std(args: argparse.Namespace) -> float:
    """Init std of the tied token embedding: GPT-2's 0.02 stalls a DyT model here, d_model ** -0.5 trains."""
    return 0.02 if args.stalled else 1.0 / math.sqrt(args.d_model)


def _step_bar(window: int):
    """Progress over the optimizer steps (:class:`satmon.cli.progress.Progress`): a bar with an ETA on a terminal,
    a plain line every tenth of the run (and at least every 30 s) when the output is a pipe or a file. One bar for
    the whole run: Lightning's restarts every epoch and, with ``max_steps`` only, reads "Epoch 1/-2"."""
    from lightning.pytorch.callbacks import Callback

    from satmon.cli.progress import Progress

    class StepProgress(Callback):
        progress: Progress | None = None

        def on_train_start(self, trainer, pl_module) -> None:
            self.progress = Progress(trainer.max_steps, label=f"satmon demo: steps (window {window})", unit="step")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            # CPU: no sync cost
            self.progress.update(trainer.global_step, "" if loss is None else f"training loss {float(loss):.4f}")

        def on_train_end(self, trainer, pl_module) -> None:
            if self.progress is not None:
                self.progress.close()

        def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
            self.on_train_end(trainer, pl_module)

    return StepProgress()


def _step_checkpoints(dirpath: Path, every: int, last: int):
    """Save a checkpoint every ``every`` optimizer steps (0: none) and at step ``last``, each kept, as
    ``dirpath/epoch=E-step=S.ckpt`` (the names Lightning's ``ModelCheckpoint`` gives). A ``ModelCheckpoint``
    with ``val_check_interval`` saves after validation only (step 250 of the 500, 0.2's demo), not at the end."""
    from lightning.pytorch.callbacks import Callback

    class StepCheckpoints(Callback):
        def __init__(self) -> None:
            self.saved: dict[int, Path] = {}  # step -> file

        def on_train_batch_end(self, trainer, *_: Any) -> None:
            step = trainer.global_step
            if ((every and step % every == 0) or step == last) and step not in self.saved:
                self.saved[step] = dirpath / f"epoch={trainer.current_epoch}-step={step}.ckpt"
                trainer.save_checkpoint(self.saved[step])

    return StepCheckpoints()


def heldout_loss(model, data, batches: int = VAL_BATCHES) -> float:
    """Mean next-token loss of ``model`` on the first ``batches`` validation batches (eval mode, no grad,
    no random state touched: the training that follows is unchanged)."""
    import torch
    import torch.nn.functional as F

    n = min(len(data.val_set), batches * data.batch_size)
    x, y = (torch.stack(t) for t in zip(*(data.val_set[i] for i in range(n))))  # (n, T) each
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [
            F.cross_entropy(model(xb).flatten(0, 1).float(), yb.flatten())
            for xb, yb in zip(x.split(data.batch_size), y.split(data.batch_size))
        ]
    model.train(was_training)
    return float(torch.stack(losses).mean())


def unigram_loss(data, batches: int = VAL_BATCHES) -> float:
    """Loss of byte frequencies (add-one counts of the training split) on the same targets: a model
    that ignores the context scores this; one stuck near it has learnt little else."""
    import torch

    counts = torch.bincount(data.train_set.tokens, minlength=256).double() + 1.0
    n = min(len(data.val_set), batches * data.batch_size)
    targets = torch.cat([data.val_set[i][1] for i in range(n)])
    return float(-(counts / counts.sum()).log()[targets].mean())


def gradient_below_head(model, data) -> dict[str, float | None]:
    """On the first held-out batch (no ``.grad`` touched): the largest gradient entry of the token embedding and
    of the blocks (exactly 0: nothing below the head can learn), and, for a DyT final norm, the share of its
    tanh at exactly +-1 in float32 (``None``: another final norm)."""
    import torch
    import torch.nn.functional as F

    x, y = (torch.stack(t) for t in zip(*(data.val_set[i] for i in range(data.batch_size))))  # (B, T) each
    seen: dict[str, torch.Tensor] = {}
    hook = model.norm_f.register_forward_hook(lambda m, inp, out: seen.__setitem__("x", inp[0].detach()))
    try:
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
    finally:
        hook.remove()
    below = [(n, p) for n, p in model.named_parameters() if n.startswith(("tok_emb.", "blocks.")) and p.requires_grad]
    grads = dict(zip((n for n, _ in below), torch.autograd.grad(loss, [p for _, p in below], allow_unused=True)))
    peak = {
        k: max((float(g.abs().max()) for n, g in grads.items() if n.startswith(k) and g is not None), default=0.0)
        for k in ("tok_emb.", "blocks.")
    }
    alpha = getattr(model.norm_f, "alpha", None)
    at_one = None if alpha is None else float((torch.tanh(alpha.detach() * seen["x"]).abs() == 1).float().mean())
    return {"grad_embedding": peak["tok_emb."], "grad_blocks": peak["blocks."], "final_tanh_at_one": at_one}


def run_demo(args: argparse.Namespace) -> tuple[Any, str, dict[str, float]]:
    """Train and return ``(monitor, logger_dir, losses)``; ``losses`` holds the held-out loss at the
    start and the end and the byte-frequency (unigram) level on the same batches (and, for ``--arch llama``,
    :func:`gradient_below_head` at the end)."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    from satmon import SaturationMonitor
    from satmon.demos.corpus import CorpusDataModule

    for name in ("lightning.pytorch", "lightning.fabric"):  # their import set INFO: the demo prints its own lines
        logging.getLogger(name).setLevel(logging.WARNING)
    pl.seed_everything(args.seed, verbose=False)
    omp = os.environ.get("OMP_NUM_THREADS", "")
    # a malformed or huge $OMP_NUM_THREADS is not passed on (torch's pool crashes far past it)
    cpus = os.cpu_count() or 1
    torch.set_num_threads(args.threads or (min(int(omp), cpus) if omp.isdigit() and int(omp) > 0 else cpus))
    steps = _steps(args)
    model = _model(args)
    data = CorpusDataModule(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        train_tokens=args.train_tokens,
        val_tokens=VAL_TOKENS,
        seed=args.seed,
    )
    data.setup("fit")
    losses = {"start": heldout_loss(model, data), "unigram": unigram_loss(data)}
    monitor = SaturationMonitor(window=args.window, threshold=args.threshold, log_every_n_steps=25, verbose=False)
    # an absolute path: the logger expands a leading ~, which a literal --logdir must not get
    from satmon.io.tensorboard_replay import claim_run_folder

    # one writer per run folder: version_N is claimed by os.mkdir, which exactly one process wins (two demos into one
    # --logdir get two versions, never one folder with both runs' events and checkpoints)
    version = int(os.path.basename(claim_run_folder(os.path.abspath(args.logdir), _run_name(args)))[len("version_") :])
    # the HParams view shows satmon's verdict
    logger = TensorBoardLogger(
        os.path.abspath(args.logdir), name=_run_name(args), version=version, default_hp_metric=False
    )
    ckpt = _step_checkpoints(Path(logger.log_dir) / "checkpoints", args.checkpoint_every, steps)
    callbacks = [monitor, ckpt] + ([] if args.quiet else [_step_bar(args.window)])
    if not args.quiet:
        say(
            "demo",
            f"training {steps} steps; held-out loss at step 0: {losses['start']:.4f} nats/byte (byte-frequency "
            f"level {losses['unigram']:.4f})",
        )
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=25,
        val_check_interval=min(250, steps),
        limit_val_batches=VAL_BATCHES,
        num_sanity_val_steps=0,
    )
    sigint = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit(model, data)
    except SystemExit:  # Lightning ends a Ctrl-C'd fit with sys.exit(1) after its graceful shutdown
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores SIGINT while it shuts down, and leaves it so
    losses["end"] = heldout_loss(model, data)
    if args.arch == "llama":
        losses.update(gradient_below_head(model.model, data))
    return monitor, logger.log_dir, losses


def _loss_lines(losses: dict[str, Any], steps: int, go: bool) -> list[str]:
    """The held-out loss beside the verdict, and what it says about the run (0.1 nats from the
    byte-frequency level counts as "at" it); for the LLaMA demo, the gradient below the head at the end."""
    start, end, unigram = losses["start"], losses["end"], losses["unigram"]
    if end < unigram - 0.1:
        what = "The model learned beyond byte frequencies: the verdict reads a run that trains."
    elif end <= unigram + 0.1:
        what = "The loss is stuck near the byte-frequency level: the model has learnt little beyond byte frequencies"
        what += (
            ", so the high saturation comes from the stalled-run pattern, which the study's cells were not read "
            "for (docs/guides/faq.md: offset-driven saturation)."
            if go
            else "."
        )
    else:
        what = "The loss has not reached the byte-frequency level yet: too few steps to read the run."
    lines = [
        (
            f"Validation loss ({VAL_BATCHES} held-out batches, nats/byte): {start:.4f} at step 0 -> {end:.4f} at step "
            f"{steps} (byte-frequency level {unigram:.4f})."
        ),
        what,
    ]
    if "grad_embedding" in losses:
        emb, blocks, at_one = losses["grad_embedding"], losses["grad_blocks"], losses["final_tanh_at_one"]
        line = (
            f"Gradient below the head at step {steps} (one held-out batch): largest |grad| {emb:.3g} at the token "
            f"embedding, {blocks:.3g} in the blocks"
        )
        line += "." if at_one is None else f"; the final DyT's tanh is exactly +-1 on {at_one:.1%} of its elements."
        lines.append(line)
        if emb == 0 and blocks == 0:
            lines.append(
                "No gradient reaches the embedding or any block: only the head and the final norm's gain can "
                "learn, which is the final-norm trap (docs/guides/faq.md). With RMSNorm before the head the "
                "same model learns: " + command("satmon", "demo", "--arch", "llama")
            )
    return lines


def _watch_lines(monitor: Any) -> list[str]:
    """The collapse watch's checks (from ``settings.watch_start``; the LLaMA demo trains past the window): step and
    gated saturation."""
    log = monitor.watch_log
    if not log:
        return []
    sat = ", ".join(
        f"step {r['step']}: " + ("n/a" if r.get("gated_saturation") is None else f"{r['gated_saturation']:.4f}")
        for r in log
    )
    flagged = [str(r["step"]) for r in log if r.get("collapse-risk")]
    return [
        f"Collapse watch {monitor.settings.watch_start_text} (one step in every "
        f"{monitor.settings.watch_every_n_steps}; saturation of the "
        f"DyT layers feeding gated MLPs, collapse risk at >= {monitor.settings.collapse_threshold:g}): {sat}; "
        + (f"collapse risk at step {', '.join(flagged)}." if flagged else "no collapse risk flagged.")
    ]


def _model_line(args: argparse.Namespace) -> str:
    if args.arch == "llama":
        final = (
            "DyT before the head, alpha_init 0.2 (--final-norm dyt: the trapped layout)"
            if args.final_norm == "dyt"
            else "RMSNorm before the head"
        )
        return (
            f"LLaMA-style model (d={args.d_model}, {args.layers} blocks, RoPE, SwiGLU; DyT block norms alpha_init "
            f"0.8 / 0.2, {final})"
        )
    emb = (
        "embeddings at GPT-2's std 0.02 (--stalled)"
        if args.stalled
        else f"embeddings at std d_model^-0.5 = {_emb_std(args):.3g}"
    )
    return f"GPT-2-style model (d={args.d_model}, {args.layers} blocks, DyT alpha_init 2.0, {emb})"


def _watch_span(args: argparse.Namespace) -> str:
    steps = _steps(args)
    return f" then the collapse watch to step {steps}" if args.arch == "llama" and steps > args.window else ""


def main(argv: list[str] | None = None) -> int:
    """Run ``satmon demo``; returns the exit code (see :data:`EPILOG`)."""
    p = _parser()
    try:
        args = p.parse_args(argv)
        _check(p, args)
    except SystemExit as e:  # --help (0), or a usage error argparse has printed (2)
        return usage_exit(e)
    except _PathRefused as e:  # an output path: one line, no usage block
        from satmon.io.safe_text import printable

        print(f"satmon demo: {printable(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    print(
        f"satmon demo: {_model_line(args)} on the embedded corpus (Python's standard library), {args.window}-step "
        f"screening window{_watch_span(args)}, CPU.",
        flush=True,
    )
    if not args.quiet:
        say("demo", "loading torch and Lightning, reading the corpus")
    t0 = time.perf_counter()
    monitor, log_dir, losses = run_demo(args)
    took = time.perf_counter() - t0
    if monitor.verdict is None:
        print("satmon demo: no verdict (training stopped before any step was counted).", file=sys.stderr)
        return EXIT_NO_VERDICT
    steps = _steps(args)
    print()
    # the card in plain text (TensorBoard holds its markdown); the monitor printed its one line at the verdict
    print(monitor.verdict.text())
    print()
    watch = _watch_lines(monitor) if args.arch == "llama" else []  # the GPT demo's output as before
    print("\n".join(watch + _loss_lines(losses, steps, monitor.verdict.go)))
    print(f"Trained {steps} steps in {took:.0f} s.")
    print(f"TensorBoard logs: {Path(log_dir).resolve()}")
    print(f"Open them with:   {command('tensorboard', '--logdir', Path(args.logdir).resolve())}")
    print(f"Or, without a browser: {command('satmon', 'report', Path(log_dir).resolve())}")
    ckpts = Path(log_dir) / "checkpoints"
    steps_saved = sorted(int(f.stem.rsplit("step=", 1)[1]) for f in ckpts.glob("*-step=*.ckpt"))
    print(f"Checkpoints (steps {', '.join(map(str, steps_saved))}): {ckpts.resolve()}")
    print(
        "Replay them: "
        + command(
            "satmon",
            "replay",
            ckpts.resolve(),
            "--model",
            "satmon.demos.lit:LitLM",
            "--datamodule",
            "satmon.demos.corpus:CorpusDataModule",
        )
    )
    return EXIT_OK
