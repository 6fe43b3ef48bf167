"""What checking a checkpoint's CRC-32s costs in a replay: the check against the rest of one checkpoint's turn.

``satmon replay`` checks every zip record it reads against the CRC-32 the zip directory records (the pickle at
inspection, each tensor as it is copied: :mod:`satmon.replaying.formats.torch_file`). This program writes one realistic
Lightning checkpoint (the demo GPT at GPT-2-small width and depth, d_model 768, 12 blocks, 85 M parameters; with the
Adam state Lightning saves beside the weights, which replay leaves unread), then, in each round, times

- ``read``: plain reads of exactly the bytes replay checks (every record but the optimizer's tensors), from the
  page cache, as replay copies them;
- ``crc``: ``zlib.crc32`` over those bytes;
- ``inspect``: :func:`~satmon.replaying.checkpoints.inspect_checkpoint` (the pickle read once, its records checked);
- ``replay``: one checkpoint's whole turn in :func:`~satmon.replaying.loop.checkpoint_records` (the weights copied
  and checked, the model built, the probe and its random-init twin on the calibration batches);

and prints the medians side by side with the CRC's share of the checkpoint's turn.

Usage::

    python benchmarks/checkpoint_crc.py                       # 3 rounds, 2 calibration batches of 1 x 128 tokens
    python benchmarks/checkpoint_crc.py --rounds 5 --batches 4 --seq-len 256 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
import zipfile
import zlib
from pathlib import Path

import torch

CONFIG = {
    "arch": "gpt",
    "d_model": 768,
    "n_layers": 12,
    "n_heads": 12,
    "seq_len": 1024,
    "alpha_init": 2.0,
    "lr": 3e-4,
    "warmup": 1,
}


def write_checkpoint(path: Path) -> int:
    """A Lightning-shaped checkpoint of the model (weights, Adam's two moments, step, hyper-parameters); its size."""
    from satmon.demos.lit import LitLM

    torch.manual_seed(0)
    lit = LitLM(**CONFIG)
    weights = lit.state_dict()
    adam = {
        i: {"step": torch.tensor(100.0), "exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v)}
        for i, v in enumerate(weights.values())
        if v.is_floating_point()
    }
    torch.save(
        {
            "state_dict": weights,
            "global_step": 100,
            "epoch": 0,
            "pytorch-lightning_version": "2.6.6",
            "hyper_parameters": CONFIG,
            "optimizer_states": [{"state": adam, "param_groups": [{"lr": 3e-4}]}],
            "lr_schedulers": [],
        },
        path,
    )
    return path.stat().st_size


def checked_bytes(path: Path) -> tuple[list[bytes], int]:
    """The records replay reads and checks (everything but the optimizer's tensors), as bytes, and their total
    (the time it takes is the ``read`` part)."""
    from satmon.replaying.checkpoints import inspect_checkpoint
    from satmon.replaying.formats.torch_file import meta_tensors

    info = inspect_checkpoint(path)
    offsets = {
        t.untyped_storage()._checkpoint_offset for t in meta_tensors(info.checkpoint, skip=("optimizer_states",))
    }
    out = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for rec in z.infolist():
            if "/data/" not in rec.filename:
                out.append(z.read(rec))
                continue
            f.seek(rec.header_offset + 26)
            name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
            start = rec.header_offset + 30 + name_len + extra_len
            if start in offsets:
                f.seek(start)
                out.append(f.read(rec.file_size))
    return out, sum(map(len, out))


def one_round(path: Path, blobs: list[bytes], batches: list[torch.Tensor]) -> dict[str, float]:
    from satmon.demos.lit import LitLM
    from satmon.replaying.checkpoints import inspect_checkpoint
    from satmon.replaying.loop import ModelLoader, checkpoint_records

    t0 = time.perf_counter()
    checked_bytes(path)
    read = time.perf_counter() - t0
    t0 = time.perf_counter()
    for b in blobs:
        zlib.crc32(b)
    crc = time.perf_counter() - t0
    t0 = time.perf_counter()
    info = inspect_checkpoint(path)
    inspect = time.perf_counter() - t0
    t0 = time.perf_counter()
    (record,) = list(checkpoint_records([info], ModelLoader(LitLM, None, device=torch.device("cpu")), batches))
    took = time.perf_counter() - t0
    assert record.error is None and record.report is not None, record.error
    return {"read": read, "crc": crc, "inspect": inspect, "replay": took}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=2, help="calibration batches (replay's --batches)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step=100.ckpt"
        size = write_checkpoint(path)
        blobs, checked = checked_bytes(path)
        g = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, 256, (args.batch_size, args.seq_len), generator=g) for _ in range(args.batches)]
        rounds = [one_round(path, blobs, batches) for _ in range(args.rounds)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    turn = med["inspect"] + med["replay"]
    print(
        f"checkpoint: {size / 1e6:,.0f} MB ({checked / 1e6:,.0f} MB read and CRC-checked by replay; the optimizer's "
        f"state is not read); {args.batches} calibration batch(es) of {args.batch_size} x {args.seq_len} tokens; "
        f"{torch.get_num_threads()} thread(s); median of {args.rounds} rounds"
    )
    print(f"{'part':<38}{'seconds':>10}{'share of the turn':>20}")
    for label, key in (
        ("read the bytes replay reads", "read"),
        ("CRC-32 of those bytes", "crc"),
        ("inspect (pickle read once)", "inspect"),
        ("replay (read + build + probe + twin)", "replay"),
    ):
        share = f"{med[key] / turn:>19.1%}" if key != "read" else f"{'(in replay)':>19}"
        print(f"{label:<38}{med[key]:>10.3f}{share}")
    print(
        f"CRC / read: {med['crc'] / med['read']:.2f}; CRC throughput {checked / med['crc'] / 1e9:.2f} GB/s, read "
        f"{checked / med['read'] / 1e9:.2f} GB/s; the checkpoint's turn with the check / without it: "
        f"{turn / (turn - med['crc']):.3f}"
    )


if __name__ == "__main__":
    main()
