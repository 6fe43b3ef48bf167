"""2-process DDP (gloo, CPU): a collapse watch that starts in the window (``watch_from``) checks at the same steps on
both ranks, reads the gated DyT's saturation summed over the ranks (each rank trains on its own batches), and stops
both ranks at the same step inside the window. No rank waits for another: the run has a timeout, so a collective one
rank skips fails the test instead of hanging it."""

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
    sys.path[:0] = [{tests!r}, {tests!r} + "/screen"]
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from reference import InputRecorder, counts_of
    from satmon import Screen
    from screen.test_watch_from import Gated


    def main(rank, out):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{{out}}/store", rank=rank, world_size=2)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Gated())
        screen = Screen(window=10, watch_every_n_steps=3, watch_from=2, abort_on="collapse", patience=2,
                        product="exact", info=lambda s: None, warn=lambda s: None)
        screen.attach(model, example_input=torch.randn(2, 4))
        recorder = InputRecorder(model.module, ["block.norm"])
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(rank)  # each rank its own batches (rank 1's five times as large)
        trained = 0
        for i in range(14):
            loss = model(torch.randn(5, 4, generator=g) * (1 + 4 * rank)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            trained += 1
            if screen.step(loss):
                break
        own = [counts_of([item]) for item in recorder.inputs["block.norm"]]
        with open(f"{{out}}/rank{{rank}}.json", "w") as f:
            json.dump({{"log": screen.watch.log, "stop": screen.stop.step, "trained": trained, "own": own}}, f)
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


def test_both_ranks_check_in_the_window_at_the_same_steps_and_stop_together(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    run_ranks([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=clean_env(), timeout=240)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["log"] == ranks[1]["log"] and [c["step"] for c in ranks[0]["log"]] == [4, 7]
    assert ranks[0]["stop"] == ranks[1]["stop"] == ranks[0]["trained"] == ranks[1]["trained"] == 7
    for check in ranks[0]["log"]:  # the gated saturation of the checked step, summed over both ranks (float64)
        i = check["step"] - 1
        sat = sum(r["own"][i][0] for r in ranks)
        total = sum(r["own"][i][1] for r in ranks)
        assert check["gated_saturation"] == sat / total
    assert ranks[0]["own"][3] != ranks[1]["own"][3]  # the ranks saw different data: the sum is a real reduction
