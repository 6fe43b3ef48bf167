"""How fast ``satmon replay`` goes through many checkpoints of a tiny model: its start, and the time per checkpoint.

N checkpoints of a tiny Lightning model (``satmon.demos.lit.LitLM``, d=32, 2 blocks, seq 16; one
checkpoint per optimizer step, the datamodule's hyper-parameters saved in them) are written to a
temporary folder, then ``satmon replay DIR --model satmon.demos.lit:LitLM --datamodule
satmon.demos.corpus:CorpusDataModule`` runs on them as a fresh process, as a user types it. The time
each progress line (``[i/N] ...``) reaches this script is recorded:

- per checkpoint: ``(t[N] - t[1]) / (N - 1)``, the steady rate (the first checkpoint pays for the
  first model build, the meta check and the gating trace);
- start: ``t[1]`` minus one per-checkpoint time (imports, the checkpoint index, the data);
- total: until the process exits (the JSON, the TensorBoard run and the summary written).

``--before SRC`` (a satmon source tree, e.g. ``git archive`` of an older commit unpacked) runs the same
command with that tree on ``PYTHONPATH``, interleaved with this checkout's (the order alternates each
round), so both sides see the same machine load; medians over ``--repeats`` rounds are printed side
by side.

Usage::

    python benchmarks/replay_throughput.py                      # 100 checkpoints, 3 rounds, this checkout
    python benchmarks/replay_throughput.py -n 100 --repeats 3 --before /tmp/satmon_before --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = {
    "arch": "gpt",
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 2,
    "seq_len": 16,
    "alpha_init": 2.0,
    "lr": 3e-2,
    "warmup": 1,
}
DATA = {"seq_len": 16, "batch_size": 4, "train_tokens": 20_000, "val_tokens": 2_000, "seed": 0}


def make_checkpoints(folder: Path, n: int, arch: str, norm: str) -> list[Path]:
    """``n`` Lightning checkpoints of one tiny training run, one per optimizer step."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from satmon.demos.corpus import CorpusDataModule
    from satmon.demos.lit import LitLM

    pl.seed_everything(0, verbose=False)
    ckpt = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=-1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        pl.Trainer(
            max_steps=n,
            accelerator="cpu",
            devices=1,
            logger=False,
            callbacks=[ckpt],
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        ).fit(LitLM(**{**MODEL, "arch": arch, "norm": norm}), CorpusDataModule(**DATA))
    return sorted(folder.glob("*.ckpt"))


def satmon_command() -> list[str]:
    return [sys.executable, "-c", "import sys; from satmon.cli.main import main; sys.exit(main())"]


def replay_once(src: Path, folder: Path, out: Path, n: int, threads: int | None) -> dict[str, float]:
    """One ``satmon replay`` process with ``src`` on PYTHONPATH: start, per-checkpoint and total seconds."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONWARNINGS": "ignore"}
    cmd = [
        *satmon_command(),
        "replay",
        str(folder),
        "--model",
        "satmon.demos.lit:LitLM",
        "--datamodule",
        "satmon.demos.corpus:CorpusDataModule",
        "--logdir",
        str(out / "tb"),
        "--json",
        str(out / "records.json"),
        *(["--threads", str(threads)] if threads else []),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    arrivals: list[float] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("["):
            arrivals.append(time.perf_counter() - t0)
    err = proc.stderr.read() if proc.stderr else ""
    rc = proc.wait()
    total = time.perf_counter() - t0
    if rc != 0 or len(arrivals) != n:
        raise SystemExit(
            f"satmon replay (PYTHONPATH={src}) exited {rc} with {len(arrivals)} of {n} progress lines:\n{err[-2000:]}"
        )
    per = (arrivals[-1] - arrivals[0]) / max(1, n - 1)
    records = json.loads((out / "records.json").read_text())
    return {
        "start_s": arrivals[0] - per,
        "per_checkpoint_s": per,
        "total_s": total,
        "probe_s_median": statistics.median(r["seconds"] for r in records if r.get("seconds") is not None),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--checkpoints", type=int, default=100, help="checkpoints to make and replay (default 100)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; medians reported (default 3)")
    p.add_argument(
        "--arch", choices=["gpt", "llama"], default="gpt", help="the tiny model (llama: a gated MLP, traced)"
    )
    p.add_argument(
        "--norm",
        choices=["dyt", "layernorm"],
        default="dyt",
        help="the tiny model's norms (layernorm: the random-init twin is probed too)",
    )
    p.add_argument("--before", metavar="SRC", default=None, help="a satmon source tree to compare with, side by side")
    p.add_argument("--threads", type=int, default=None, help="satmon replay --threads")
    p.add_argument("--json", default=None, help="write every round's numbers to this JSON file")
    args = p.parse_args(argv)
    if args.checkpoints < 2:
        p.error(
            f"expected --checkpoints >= 2 (the rate is read between the first and the last), got {args.checkpoints}"
        )
    sides = {"this checkout": ROOT}
    if args.before:
        before = Path(args.before).resolve()
        if not (before / "satmon" / "__init__.py").is_file():
            p.error(f"expected --before to be a folder holding satmon/__init__.py, got {before}")
        sides = {"before": before, **sides}
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory(prefix="satmon_replay_bench_") as tmp:
        t = time.perf_counter()
        ckpts = make_checkpoints(Path(tmp) / "ckpts", args.checkpoints, args.arch, args.norm)
        print(
            f"{len(ckpts)} checkpoints of LitLM({MODEL | {'arch': args.arch, 'norm': args.norm}}) made in "
            f"{time.perf_counter() - t:.1f} s"
        )
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                out = Path(tmp) / f"out_{r}_{name.replace(' ', '_')}"
                got = replay_once(sides[name], Path(tmp) / "ckpts", out, len(ckpts), args.threads)
                rounds[name].append(got)
                print(
                    f"round {r + 1} {name}: start {got['start_s']:.2f} s, "
                    f"{got['per_checkpoint_s']:.3f} s a checkpoint, "
                    f"total {got['total_s']:.1f} s",
                    flush=True,
                )
    print(f"\nCommand: python benchmarks/replay_throughput.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(
        f"\n| code | start (s) | per checkpoint (s) | total for {len(ckpts)} (s) | probe() per checkpoint (s, record) |"
    )
    print("|---|---|---|---|---|")
    for name, rs in rounds.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(
            f"| {name} | {med['start_s']:.2f} | {med['per_checkpoint_s']:.3f} | {med['total_s']:.1f} | "
            f"{med['probe_s_median']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
