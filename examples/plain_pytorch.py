"""satmon without Lightning: a plain PyTorch training loop (nanoGPT-style) screened by ``satmon.Screen``.

The public core only: ``Screen(...).attach(model)``, ``screen.step(loss)`` after each optimizer
step, ``screen.paused()`` around validation, ``screen.finish()`` and ``screen.detach()`` at the end,
``screen.verdict`` for the decision. TensorBoard files go to ``--logdir``.

    python examples/plain_pytorch.py                  # 500-step window, then 100 more steps
    python examples/plain_pytorch.py --window 20 --steps 30 --abort-on no-go
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import satmon
from satmon.demos.corpus import WindowDataset, corpus_tokens
from satmon.demos.gpt import GPT, GPTConfig


def lm_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def fit(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    screen: satmon.Screen,
    steps: int,
    lr: float,
    validate=None,
    every: int = 100,
) -> int:
    """Train ``model`` for up to ``steps`` optimizer steps, screened; returns the steps run.

    ``screen`` is attached to ``model`` already; it counts every forward between two ``step`` calls
    except those under ``screen.paused()`` (validation here).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    step = 0
    for step, (x, y) in enumerate(itertools.islice(batches, steps), start=1):
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        stop = screen.step(loss)  # once per optimizer step, after it; True: the abort policy fired
        if validate is not None and (step % every == 0 or step == steps or stop):
            with screen.paused():  # validation forwards are not training forwards
                print(f"step {step}: train loss {loss.item():.3f}, val loss {validate(model):.3f}")
        if stop:
            print(f"satmon stopped training at step {step}: {screen.stop.message}")
            break
    screen.finish()  # a window cut short still gets a (partial) verdict
    screen.detach()
    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", type=int, default=500, help="screening window, optimizer steps (default 500)")
    p.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    p.add_argument("--threshold", type=float, default=None, help="GO threshold (default: the study's rule)")
    p.add_argument("--abort-on", default="never", choices=["never", "no-go", "collapse", "any"])
    p.add_argument("--logdir", default=None, help="TensorBoard directory for the verdict card and scalars")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=64, n_layers=2, n_heads=4, seq_len=64, norm="dyt", alpha_init=2.0))
    tokens = corpus_tokens(440_000)
    train = torch.utils.data.DataLoader(
        WindowDataset(tokens[:400_000], 64), batch_size=16, shuffle=True, drop_last=True
    )
    val = torch.utils.data.DataLoader(WindowDataset(tokens[400_000:], 64), batch_size=16)

    def validate(m: nn.Module) -> float:
        m.eval()
        with torch.no_grad():
            losses = [lm_loss(m, vx, vy).item() for vx, vy in itertools.islice(val, 8)]
        m.train()
        return sum(losses) / len(losses)

    # verbose=True: the whole card prints when the window closes (by default, one line)
    screen = satmon.Screen(
        window=args.window, threshold=args.threshold, abort_on=args.abort_on, logdir=args.logdir, verbose=True
    )
    # forward hooks on every DyT layer; one batch for the gated-MLP trace
    screen.attach(model, example_input=next(iter(val))[0])
    fit(model, itertools.cycle(train), screen, args.steps, lr=3e-3, validate=validate)
    if screen.verdict is None:
        print(f"no verdict: {screen.status}")
        return 1
    print(screen.verdict.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
