"""satmon without Lightning: a plain PyTorch training loop screened with satmon's core.

The pieces the Lightning callback is built from, used directly:
``find_dyt_layers`` (which layers to watch), ``SaturationCounter`` (device-side counts),
``SaturationHooks`` (forward hooks that feed it, no host sync per step) and ``decide`` (the rule).

    python examples/plain_pytorch.py                  # 500-step window, then 100 more steps
    python examples/plain_pytorch.py --window 20 --steps 30
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from satmon import SaturationCounter, SaturationHooks, decide, find_dyt_layers
from satmon.demos.corpus import WindowDataset, corpus_tokens
from satmon.demos.gpt import GPT, GPTConfig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", type=int, default=500, help="screening window, optimizer steps (default 500)")
    p.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    p.add_argument("--threshold", type=float, default=0.43)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=64, n_layers=2, n_heads=4, seq_len=64, norm="dyt", alpha_init=2.0))
    tokens = corpus_tokens(440_000)
    train = torch.utils.data.DataLoader(WindowDataset(tokens[:400_000], 64), batch_size=16, shuffle=True, drop_last=True)
    val = torch.utils.data.DataLoader(WindowDataset(tokens[400_000:], 64), batch_size=16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    layers = find_dyt_layers(model)  # every module owning an `alpha` with a tanh-bounded forward
    counter = SaturationCounter(len(layers), level=2.0)  # int64 counts on the model's device
    hooks = SaturationHooks(layers, counter).attach()  # count training forwards from now on
    verdict = None

    batches = itertools.cycle(train)
    for step in range(1, args.steps + 1):
        x, y = next(batches)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # (B*T, V) vs (B*T,)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == args.window:  # the only host transfer of the window
            counts = counter.compute()  # folds the hooks' queued sums into the counts first
            per_layer = dict(zip((l.name for l in layers), counts["per_layer"].tolist()))
            verdict = decide(float(counts["pooled"]), per_layer, threshold=args.threshold, step=step, window=args.window,
                             elements=int(counts["total"].sum()), nonfinite=int(counts["nonfinite"].sum()))
            hooks.detach()  # the rest of training runs no satmon code
            print(verdict.card(), end="\n\n")
        if step % 100 == 0 or step == args.steps:
            hooks.enabled = False  # validation forwards are not counted
            with torch.no_grad():
                model.eval()
                vl = [F.cross_entropy(model(vx).flatten(0, 1), vy.flatten()).item() for vx, vy in itertools.islice(val, 8)]
                model.train()
            hooks.enabled = True
            print(f"step {step}: train loss {loss.item():.3f}, val loss {sum(vl) / len(vl):.3f}")

    if verdict is None:
        print(f"no verdict: {args.steps} steps are fewer than the {args.window}-step window")
        return 1
    print(verdict.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
