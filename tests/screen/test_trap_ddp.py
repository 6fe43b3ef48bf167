"""2-process DDP (gloo, CPU): the trap watch reads at the same steps on both ranks and both take the same decision
from the same reduced numbers, though each rank trains on its own batches; no rank waits for another (the run has a
timeout: a collective one rank skips fails the test instead of hanging it)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers import clean_env, run_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

TESTS = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent(
    """
    import gc, json, sys, weakref
    sys.path.insert(0, {tests!r})
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from satmon import Screen
    from screen.test_trap import Toy, V, _batch


    def main(rank, out):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{{out}}/store", rank=rank, world_size=2)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Toy("dyt"))
        screen = Screen(window=4, trap_every_n_steps=2, trap_patience=2, info=lambda s: None,
                        warn=lambda s: None).attach(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for i in range(7):
            x, y = _batch(10 * rank + i)  # each rank its own batches
            loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            screen.step(loss)
        with open(f"{{out}}/rank{{rank}}.json", "w") as f:
            json.dump({{"log": screen.trap.log, "state": screen.trap.state}}, f)
        ddp = weakref.ref(model)
        del model
        gc.collect()
        # the screen, still held, does not keep the DDP model alive: it is freed before its group ends, so freeing it
        # after destroy_process_group (a deadlock in PyTorch, docs/reference/distributed.md) cannot happen
        assert ddp() is None, "the screen kept the DDP model alive"
        dist.barrier()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(main, args=(sys.argv[1],), nprocs=2)
    """
)


def test_both_ranks_read_the_trap_at_the_same_steps_and_agree(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    run_ranks([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=clean_env(), timeout=240)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    assert [c["step"] for c in ranks[0]["log"]] == [1, 3, 5, 7] and ranks[0]["state"] == "trapped"
    assert [c["trapped"] for c in ranks[0]["log"]] == [False, True, True, True]
