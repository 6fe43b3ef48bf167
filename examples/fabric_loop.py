"""satmon in a Lightning Fabric loop: ``satmon.Screen`` driven by hand, ranks agreeing through ``torch.distributed``.

Fabric's DDP strategy initialises ``torch.distributed`` (gloo on CPU, NCCL on GPUs), so the screen's
default agreement (``TorchDistributed``) and its counters' cross-rank sums work as they are: every
rank gets the same verdict, and ``screen.step(loss)`` returns True on every rank at the same step
when the abort policy fires. Call ``screen.step`` on every rank at every step (it is a collective at
the window's end, at running readings and at watch checks).

    python examples/fabric_loop.py                          # one CPU process
    python examples/fabric_loop.py --devices 2              # two CPU processes (Fabric starts the second)
    python examples/fabric_loop.py --devices 2 --window 4 --steps 6 --abort-on no-go --json out/
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import satmon
from satmon.demos.gpt import GPT, GPTConfig

SEQ_LEN = 16


def build_model() -> nn.Module:
    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=SEQ_LEN, alpha_init=8.0))


def token_data(n: int, vocab: int = 256) -> TensorDataset:
    """``n`` fixed random token windows as ``(input, next tokens)`` pairs."""
    x = torch.randint(0, vocab, (n, SEQ_LEN + 1), generator=torch.Generator().manual_seed(0))
    return TensorDataset(x[:, :-1], x[:, 1:])


def lm_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=1, help="CPU processes (default 1)")
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threshold", type=float, default=None, help="GO threshold (default: the study's rule)")
    p.add_argument("--abort-on", default="never", choices=["never", "no-go", "collapse", "any"])
    p.add_argument("--batch-size", type=int, default=4, help="per process")
    p.add_argument("--logdir", default=None, help="TensorBoard directory (written by rank zero)")
    p.add_argument("--json", default=None, help="folder for one JSON file per rank: verdict, stop, steps run")
    args = p.parse_args(argv)

    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto")
    fabric.launch()  # with 2 devices: starts the second process, which runs this script again
    fabric.seed_everything(0)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
    model, opt = fabric.setup(model, opt)
    # each rank reads its share of every global batch (Fabric adds a DistributedSampler; shuffle off)
    data = token_data(args.steps * args.batch_size * fabric.world_size)
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=args.batch_size, shuffle=False))

    screen = satmon.Screen(
        window=args.window,
        threshold=args.threshold,
        abort_on=args.abort_on,
        logdir=args.logdir if fabric.is_global_zero else None,
    )
    # after fabric.setup (the hooks go on the layers the wrapped model runs); one input for the gated-MLP trace
    screen.attach(model, example_input=fabric.to_device(data[0][0][None]))
    step = 0
    for step, (x, y) in enumerate(itertools.islice(loader, args.steps), start=1):
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        fabric.backward(loss)
        opt.step()
        if screen.step(loss):  # the same answer on every rank
            fabric.print(f"satmon stopped training at step {step}: {screen.stop.message}")
            break
    screen.finish()
    screen.detach()
    fabric.print(screen.verdict.summary() if screen.verdict else f"no verdict: {screen.status}")
    if args.json:
        Path(args.json).mkdir(parents=True, exist_ok=True)
        record = {
            "rank": fabric.global_rank,
            "world_size": fabric.world_size,
            "steps": step,
            "verdict": screen.verdict.to_dict() if screen.verdict else None,
            "stop": screen.stop.to_dict() if screen.stop else None,
        }
        (Path(args.json) / f"rank{fabric.global_rank}.json").write_text(json.dumps(record))
    return 0


def shutdown() -> None:
    """Every rank done, then a clean shutdown of the process group (gloo can abort at exit without it)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    code = main()
    shutdown()
    raise SystemExit(code)
